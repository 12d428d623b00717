"""The tail of a job's log, appended to as it grows."""

from __future__ import annotations

from textual.widgets import Log

__all__ = ["LogTail"]


class LogTail(Log):
    """A job's stdout or stderr; keeps the last ``max_lines`` lines and follows the end."""

    DEFAULT_CSS = """
    LogTail {
        height: 1fr;
    }
    """

    def __init__(self, *, max_lines: int = 5000, id: str | None = None) -> None:
        """A log tail.

        Args:
            max_lines: lines kept; older ones scroll away.
            id: the widget id.
        """
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id)
        self.received_text = ""
        """Everything appended since the last :meth:`reset`, up to 64 KiB from the end (for tests)."""

    def reset(self, title: str) -> None:
        """Start again (another stream or attempt), titled ``title``."""
        self.clear()
        self.received_text = ""
        self.border_title = title

    def append(self, data: str) -> None:
        """Add a chunk of text (lines may be split across chunks)."""
        if data:
            self.write(data)
            self.received_text = (self.received_text + data)[-65536:]
