"""The banner that says when the daemon cannot be reached (hidden while connected)."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from gpulayer_tui.state import Connection
from gpulayerd import text as fmt

__all__ = ["ConnectionBanner", "connection_text"]


def connection_text(c: Connection) -> str:
    """What the banner says for ``c`` ("" while connected)."""
    if c.state == "unreachable":
        since = fmt.clock(c.since, with_date=False) if c.since else fmt.DASH
        return f"daemon not reachable — retrying (since {since}): {c.message}"
    if c.state == "connecting":
        return "connecting to gpulayerd…"
    return ""


class ConnectionBanner(Static):
    """Shows :attr:`connection` unless it is ``connected``."""

    DEFAULT_CSS = """
    ConnectionBanner {
        height: auto;
        width: 1fr;
        padding: 0 1;
        display: none;
    }
    ConnectionBanner.-unreachable, ConnectionBanner.-connecting {
        display: block;
    }
    """

    connection: reactive[Connection] = reactive(Connection, init=False)
    """The link to the daemon."""

    def on_mount(self) -> None:
        self.watch_connection(self.connection)

    def watch_connection(self, c: Connection) -> None:
        self.set_class(c.state == "unreachable", "-unreachable")
        self.set_class(c.state == "connecting", "-connecting")
        self.update(connection_text(c))
