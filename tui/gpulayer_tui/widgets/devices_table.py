"""Every known machine's devices: utilisation, memory with its kind, who holds it, driver, probe health.

Columns fit 120 terminal columns (DRIVER and PROBE included): long names are cut, a device
granted to a job shows the job's name and user (never only its id), and a device that is
only detected says so in STATE. This machine's devices take utilisation and memory from the
live metrics (:class:`gpulayerd.models.metrics.MetricsView`) while they are polled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual.reactive import reactive

from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import Capabilities, DeviceModel, PeerView, ProbeHealthModel
from gpulayerd.models.metrics import GpuMetricsView, MetricsView

__all__ = ["DevicesTable", "JobLabeller", "device_rows", "job_label", "probe_summary", "probe_text"]

_HEALTHY = frozenset({"ok", "not_found", "no_devices"})
_ANOTHER_DAEMON = "(another gpulayerd on this machine)"  # gpulayerd.app.worker.machine.ANOTHER_DAEMON
NAME_CELLS = 16
"""Most cells of the NAME column."""
STATE_CELLS = 20
"""Most cells of the STATE column."""
PROBE_CELLS = 14
"""Most cells of the PROBE column (the status line under the table has every probe in full)."""
GB = 10**9

JobLabeller = Callable[[str], str | None]
"""Job id -> "name (user)" as people know the job, or None when unknown."""


def job_label(job_id: str, name: str | None, user: str | None) -> str:
    """How a job is shown where it holds a device: "name (user)", "name", "id (user)" or the id; escaped."""
    head = fmt.escape(name) if name else job_id
    return f"{head} ({fmt.escape(user)})" if user else head


def probe_summary(caps: Capabilities) -> str:
    """"ok" when every probe worked or found nothing to probe, else each failing probe and its status."""
    bad = [h for h in caps.health if h.status.value not in _HEALTHY]
    if not bad:
        return "ok"
    return "; ".join(f"{h.source}: {h.status.value.replace('_', ' ')}" for h in bad)


def probe_text(h: ProbeHealthModel) -> str:
    """One probe's health: "nvidia-smi ok", "rocm-smi failed (exit 9: …)"; a message that only says the
    status again ("nvidia-smi not found") is not repeated. Not escaped (the caller escapes)."""
    head = f"{h.source} {h.status.value.replace('_', ' ')}"
    message = (h.message or "").strip()
    if not message or message.lower() in head.lower() or message.lower() == h.status.value.replace("_", " "):
        return head
    return f"{head} ({message})"


def _holder(granted_to: str, labeller: JobLabeller | None, live: GpuMetricsView | None) -> str:
    if granted_to == _ANOTHER_DAEMON:
        return "another gpulayerd"
    job_id, held = (granted_to.removesuffix(" (held)"), granted_to.endswith(" (held)"))
    label = None
    if live is not None and live.granted_to == job_id and (live.granted_name or live.granted_user):
        label = job_label(job_id, live.granted_name, live.granted_user)
    if label is None and labeller is not None:
        label = labeller(job_id)
    label = label or fmt.escape(job_id)
    return f"{label} (held)" if held else label


def _state(peer: PeerView, d: DeviceModel, labeller: JobLabeller | None, live: GpuMetricsView | None) -> Cell:
    if peer.state == "down" or (peer.capabilities is not None and not peer.capabilities.online):
        return Text("offline", style="red")
    if peer.state == "foreign":
        return Text("other cluster", style="magenta")
    if d.state.value == "lost":  # named only in nvidia-smi's diagnostic lines: never granted
        reason = f"lost: {fmt.escape(d.state_reason)}" if d.state_reason else "lost"
        return Text(fmt.cut(reason, STATE_CELLS), style="bold red")
    if d.state.value == "unusable":  # a field reads [GPU requires reset], or compute mode Prohibited
        reason = f"unusable: {fmt.escape(d.state_reason)}" if d.state_reason else "unusable"
        return Text(fmt.cut(reason, STATE_CELLS), style="bold red")
    if d.kind.value == "gpu" and d.mig_enabled:
        return Text("MIG mode", style="cyan")
    if d.state.value == "excluded":
        return Text(fmt.cut(f"excluded ({fmt.escape(d.state_reason or 'config')})", STATE_CELLS), style="dim")
    if d.granted_to:
        return Text(fmt.cut(_holder(d.granted_to, labeller, live), STATE_CELLS), style="yellow")
    pids = [p.pid for p in live.processes] if live is not None else d.foreign_pids
    if pids:
        return Text(fmt.cut("busy (pid " + ", ".join(str(p) for p in pids) + ")", STATE_CELLS), style="red")
    if not d.execution_supported:
        return Text("detection only", style="dim")
    if d.to_core().hidden_use:
        return Text(fmt.cut("busy (processes not visible here)", STATE_CELLS), style="red")
    if not d.processes_known:
        busy = d.to_core().unknown_use
        return Text("procs unknown (busy)" if busy else "procs unknown (idle)",
                    style="red" if busy else "yellow")
    if d.compute_mode in ("Exclusive_Process", "Exclusive_Thread"):
        return Text("free (exclusive)", style="green")
    return Text("free", style="green")


def _memory(d: DeviceModel, live: GpuMetricsView | None) -> str:
    total = d.memory_total_bytes
    used = d.memory_used_bytes
    if live is not None and live.memory_total_bytes is not None and d.memory_kind is not None \
            and d.memory_kind.value == "dedicated":
        total, used = live.memory_total_bytes, live.memory_used_bytes
    kind = None if d.memory_kind is None else d.memory_kind.value
    if total is None:
        return fmt.DASH
    if kind == "unified":  # system RAM shared with the CPU: never "VRAM"
        return f"{total / GB:.1f} GB unified (RAM)"
    head = f"{total / GB:.1f} GB" if used is None else f"{used / GB:.1f}/{total / GB:.1f} GB"
    return f"{head} {kind}" if kind else head


def _util(live: GpuMetricsView | None) -> str:
    if live is None or live.utilization_pct is None:
        return fmt.DASH
    return f"{live.utilization_pct:.0f}%"


def device_rows(peers: Sequence[PeerView], metrics: MetricsView | None = None,
                labeller: JobLabeller | None = None) -> dict[str, tuple[Cell, ...]]:
    """One row per device of every peer (a CPU-only machine gets one "CPU only" row), keyed node:index.

    Columns as :attr:`DevicesTable.COLUMNS`. ``metrics`` (this machine's, matched by uuid on
    the peer whose state is ``self``) gives utilisation and fresher memory; ``labeller`` names
    the jobs holding devices.
    """
    rows: dict[str, tuple[Cell, ...]] = {}
    live_by_uuid = {g.uuid: g for g in metrics.gpus if g.uuid} if metrics is not None else {}
    for peer in peers:
        caps = peer.capabilities
        node = fmt.escape(peer.name)
        if caps is None:
            rows[f"{peer.node_id}:-"] = (node, fmt.DASH, fmt.DASH, fmt.DASH, fmt.DASH, "no report yet", fmt.DASH,
                                        fmt.DASH, fmt.DASH, fmt.DASH)
            continue
        probe = probe_summary(caps)
        probe_cell = Text(fmt.cut(probe, PROBE_CELLS), style="" if probe == "ok" else "bold red")
        if not caps.devices:
            rows[f"{peer.node_id}:-"] = (node, fmt.DASH, "cpu", fmt.DASH, fmt.DASH, "CPU only", fmt.DASH, fmt.DASH,
                                        fmt.DASH, probe_cell)
            continue
        for d in caps.devices:
            live = live_by_uuid.get(d.uuid) if peer.state == "self" and d.uuid else None
            rows[f"{peer.node_id}:{d.index}"] = (
                node,
                str(d.index),
                d.accelerator.value,
                _util(live),
                _memory(d, live),
                _state(peer, d, labeller, live),
                fmt.cut(fmt.escape(fmt.text(d.name)), NAME_CELLS),
                fmt.text(d.compute_capability),
                fmt.escape(fmt.text(d.driver_version)),
                probe_cell,
            )
    return rows


class DevicesTable(KeyedTable):
    """Devices of every peer in :attr:`peers`, this machine first."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("node", "NODE"),
        ("index", "IDX"),
        ("accelerator", "KIND"),
        ("util", "UTIL"),
        ("memory", "MEMORY used/total"),
        ("state", "STATE"),
        ("name", "NAME"),
        ("cc", "CC"),
        ("driver", "DRIVER"),
        ("probe", "PROBE"),
    )

    peers: reactive[tuple[PeerView, ...]] = reactive((), init=False, always_update=True)
    """The peers (with capabilities) whose devices are shown."""

    metrics: reactive[MetricsView | None] = reactive(None, init=False, always_update=True)
    """This machine's live metrics, while they are polled."""

    labeller: JobLabeller | None = None
    """Names the job holding a device (set by the screen: the jobs it knows)."""

    def watch_peers(self, peers: tuple[PeerView, ...]) -> None:
        self.sync_rows(device_rows(peers, self.metrics, self.labeller))

    def watch_metrics(self, metrics: MetricsView | None) -> None:
        self.sync_rows(device_rows(self.peers, metrics, self.labeller))
