"""Every gpulayerd this one knows: trusted or foreign, addresses, version, last heartbeat, its devices.

DEVICES counts each machine's GPUs by name as ``gpulayer peers`` does (:func:`gpulayerd.text.hardware`:
a GPU split into MIG instances counts once) and adds its CPU slots; a Slurm worker's starts with its kind
and partitions (``slurm: partitions gpu DEGRADED; ...`` while Slurm does not answer). Columns fit the table's width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual.reactive import reactive

from gpulayer_tui.widgets.devices_table import slurm_summary
from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import PeerView

__all__ = ["PeersTable", "peer_rows"]

_STATE_STYLES = {"self": "bold", "up": "green", "suspect": "yellow", "down": "red", "foreign": "magenta"}


def peer_rows(peers: Sequence[PeerView], now: float) -> dict[str, tuple[Cell, ...]]:
    """One row per peer, keyed by node id.

    Args:
        peers: the peers, this daemon first.
        now: wall time (seconds since the epoch) for "last heartbeat … ago".
    """
    rows: dict[str, tuple[Cell, ...]] = {}
    for p in peers:
        addresses = ", ".join(f"{a}:{p.port}" if p.port else a for a in p.addresses) or fmt.DASH
        trust = Text("trusted", style="green") if p.trusted else Text("foreign", style="magenta")
        heartbeat = "this machine" if p.state == "self" else fmt.DASH if p.last_heartbeat_at is None else (
            f"{fmt.clock(p.last_heartbeat_at, with_date=False)} ({fmt.ago(p.last_heartbeat_at, now)})")
        caps = p.capabilities
        if caps is None:
            devices = fmt.DASH
        else:
            slots = fmt.cpu_slots(caps.cpu_slots_total, caps.cpu_slots_free)
            devices = ", ".join(part for part in (fmt.hardware((d.name, d.kind.value == "mig") for d in caps.devices)
                                                  or "cpu only", slots and f"CPU {slots}") if part)
            slurm = slurm_summary(caps)
            if slurm is not None:  # a Slurm cluster as worker: its partitions; degraded while Slurm is down
                devices = f"{slurm[0]}{' DEGRADED' if slurm[1] is not None else ''}; {devices}"
        rows[p.node_id] = (
            fmt.escape(p.name),
            p.node_id[:12],
            Text(p.state, style=_STATE_STYLES.get(p.state, "")),
            trust,
            fmt.escape(addresses),
            fmt.escape(fmt.text(p.version)),
            fmt.escape(fmt.text(p.cluster)),
            heartbeat,
            fmt.escape(devices),
        )
    return rows


class PeersTable(KeyedTable):
    """The peers in :attr:`peers`, this daemon first."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("name", "NAME"),
        ("node", "NODE"),
        ("state", "STATE"),
        ("trust", "TRUST"),
        ("addresses", "ADDRESSES"),
        ("version", "VERSION"),
        ("cluster", "CLUSTER"),
        ("heartbeat", "LAST HEARTBEAT"),
        ("devices", "DEVICES"),
    )

    SHRINK: ClassVar[Sequence[tuple[str, int]]] = (
        ("devices", 40), ("addresses", 24), ("cluster", 12), ("node", 0), ("devices", 24), ("cluster", 0),
        ("version", 0), ("trust", 0), ("devices", 20), ("addresses", 16), ("devices", 12), ("heartbeat", 8),
        ("addresses", 8),
    )
    """Cut the devices and addresses, then hide NODE, CLUSTER, VERSION and TRUST (STATE says "foreign"
    too) before cutting more."""

    peers: reactive[tuple[PeerView, ...]] = reactive((), init=False, always_update=True)
    """The peers shown."""

    def __init__(self, *, clock: Callable[[], float], id: str | None = None, classes: str | None = None) -> None:
        """A peers table.

        Args:
            clock: wall time now (seconds since the epoch).
            id: the widget id.
            classes: CSS classes.
        """
        super().__init__(id=id, classes=classes)
        self._clock = clock

    def watch_peers(self, peers: tuple[PeerView, ...]) -> None:
        self.sync_rows(peer_rows(peers, self._clock()))

    def refresh_ages(self) -> None:
        """Recompute "… ago"."""
        self.sync_rows(peer_rows(self.peers, self._clock()))
