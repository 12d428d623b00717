"""Every known machine's devices: memory with its kind, compute capability, grant state, probe health."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.reactive import reactive

from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import Capabilities, DeviceModel, PeerView

__all__ = ["DevicesTable", "device_rows", "probe_summary"]

_HEALTHY = frozenset({"ok", "not_found", "no_devices"})


def probe_summary(caps: Capabilities) -> str:
    """"ok" when every probe worked or found nothing to probe, else each failing probe and its status."""
    bad = [h for h in caps.health if h.status.value not in _HEALTHY]
    if not bad:
        return "ok"
    return "; ".join(f"{h.source}: {h.status.value.replace('_', ' ')}" for h in bad)


def _state(peer: PeerView, d: DeviceModel) -> Cell:
    if peer.state == "down" or (peer.capabilities is not None and not peer.capabilities.online):
        return Text("offline", style="red")
    if peer.state == "foreign":
        return Text("other cluster (not used)", style="magenta")
    state = fmt.device_state(d.granted_to, d.foreign_pids)
    style = "green" if state == "free" else ("yellow" if d.granted_to else "red")
    return Text(state, style=style)


def device_rows(peers: Sequence[PeerView]) -> dict[str, tuple[Cell, ...]]:
    """One row per device of every peer (a CPU-only machine gets one "CPU only" row), keyed node:index.

    Columns as :attr:`DevicesTable.COLUMNS`: what matters most comes first, to fit 80 columns.
    """
    rows: dict[str, tuple[Cell, ...]] = {}
    for peer in peers:
        caps = peer.capabilities
        if caps is None:
            rows[f"{peer.node_id}:-"] = (peer.name, fmt.DASH, fmt.DASH, fmt.DASH, "no report yet", fmt.DASH,
                                        fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH)
            continue
        probe = probe_summary(caps)
        probe_cell = Text(probe, style="" if probe == "ok" else "bold red")
        if not caps.devices:
            rows[f"{peer.node_id}:-"] = (peer.name, fmt.DASH, "cpu", fmt.DASH, fmt.DASH, fmt.DASH, "CPU only",
                                        fmt.DASH, "yes", probe_cell)
            continue
        for d in caps.devices:
            kind = None if d.memory_kind is None else d.memory_kind.value
            rows[f"{peer.node_id}:{d.index}"] = (
                peer.name,
                str(d.index),
                d.accelerator.value,
                fmt.memory(d.memory_total_bytes, d.memory_used_bytes, kind),
                _state(peer, d),
                fmt.text(d.compute_capability),
                fmt.text(d.name),
                fmt.text(d.driver_version),
                "yes" if d.execution_supported else "no (detection only)",
                probe_cell,
            )
    return rows


class DevicesTable(KeyedTable):
    """Devices of every peer in :attr:`peers`, this machine first."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("node", "NODE"),
        ("index", "IDX"),
        ("accelerator", "KIND"),
        ("memory", "MEMORY (used / total, kind)"),
        ("state", "STATE"),
        ("cc", "CC"),
        ("name", "NAME"),
        ("driver", "DRIVER"),
        ("scheduled", "SCHEDULED"),
        ("probe", "PROBE"),
    )

    peers: reactive[tuple[PeerView, ...]] = reactive((), init=False, always_update=True)
    """The peers (with capabilities) whose devices are shown."""

    def watch_peers(self, peers: tuple[PeerView, ...]) -> None:
        self.sync_rows(device_rows(peers))
