"""Every known machine's devices: utilisation, memory with its kind, who holds it, driver, probe health.

In the words of ``gpulayer devices`` (:mod:`gpulayerd.text`): a MIG instance is KIND
``cuda/mig`` named by its profile and GPU (``MIG 3g.40gb on GPU 4``, right under that GPU), a
lost or unusable GPU says so with the tool's words, a device granted to a job shows the job's
name and user (never only its id), a Slurm cluster as worker has a row of kind ``slurm`` first (its
partitions and GRES; ``DEGRADED (no new claims)`` with Slurm's words while Slurm does not answer), and
each machine ends with a CPU row: its cores and the
daemon's CPU slots (``8 slots (4 free)``). This machine's devices take utilisation and memory
from the live metrics (:class:`gpulayerd.models.metrics.MetricsView`) while they are polled.

Columns are as wide as their content and fit the table's width (:attr:`DevicesTable.SHRINK`):
on a narrow terminal NAME and STATE are cut and CC, DRIVER, PROBE and KIND give way, never a
sideways scroll; :func:`device_detail` has the highlighted row's every word for the line under
the table.
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
from gpulayerd.text import job_label

__all__ = ["DevicesTable", "JobLabeller", "device_detail", "device_order", "device_rows", "faults", "job_label",
           "mig_names", "probe_summary", "probe_text", "probe_texts", "slurm_summary"]

_HEALTHY = frozenset({"ok", "not_found", "no_devices"})
_FAULTS = frozenset({"lost", "unusable"})
_PROBE_OF = {"cuda": "nvidia-smi", "rocm": "rocm-smi"}
GB = 10**9

JobLabeller = Callable[[str], str | None]
"""Job id -> "name (user)" as people know the job (escaped), or None when unknown."""


def faults(caps: Capabilities) -> list[DeviceModel]:
    """The devices the probe found lost or unusable (never granted), by index."""
    return [d for d in caps.devices if d.state.value in _FAULTS]


def _fault_words(devices: Sequence[DeviceModel]) -> str:
    """"GPU 3 lost", "GPU 3 lost, GPU 5 unusable"."""
    return ", ".join(f"GPU {d.index} {d.state.value}" for d in devices)


def probe_summary(caps: Capabilities) -> str:
    """"ok" when every probe worked or found nothing to probe and no device is lost or unusable,
    else each failing probe and its status, and the lost or unusable devices."""
    bad = [f"{h.source}: {h.status.value.replace('_', ' ')}" for h in caps.health if h.status.value not in _HEALTHY]
    lost = faults(caps)
    return "; ".join(bad + ([_fault_words(lost)] if lost else [])) or "ok"


def probe_text(h: ProbeHealthModel) -> str:
    """One probe's health: "nvidia-smi ok", "rocm-smi failed (exit 9: …)"; a message that only says the
    status again ("nvidia-smi not found") is not repeated. Not escaped (the caller escapes)."""
    head = f"{h.source} {h.status.value.replace('_', ' ')}"
    message = (h.message or "").strip()
    if not message or message.lower() in head.lower() or message.lower() == h.status.value.replace("_", " "):
        return head
    return f"{head} ({message})"


def probe_texts(caps: Capabilities) -> list[str]:
    """Each probe's health (:func:`probe_text`), where a probe that answered "ok" but whose devices
    include a lost or unusable one says which instead ("nvidia-smi: GPU 3 lost"). Not escaped."""
    lost = faults(caps)
    out = []
    for h in caps.health:
        mine = [d for d in lost if _PROBE_OF.get(d.accelerator.value) == h.source]
        out.append(f"{h.source}: {_fault_words(mine)}" if mine and h.status.value == "ok" else probe_text(h))
    return out


def slurm_summary(caps: Capabilities) -> tuple[str, str | None] | None:
    """A Slurm worker's kind and partitions ("slurm: partitions gpu, debug") and, when it is degraded (Slurm
    does not answer: its ``slurm`` probe failed), Slurm's words; None for a workstation. Not escaped."""
    if caps.kind != "slurm":
        return None
    down = next(((h.message or "Slurm does not answer") for h in caps.health
                 if h.source == "slurm" and h.status.value == "error"), None)
    return f"slurm: partitions {', '.join(caps.slurm_partitions) or 'none seen'}", down


def _slurm_row(node: str, caps: Capabilities, probe: Cell) -> tuple[Cell, ...] | None:
    """A Slurm worker's own row: kind ``slurm``, its partitions and each node's GRES, DEGRADED (no new
    claims) with Slurm's words while Slurm does not answer; None for a workstation."""
    summary = slurm_summary(caps)
    if summary is None:
        return None
    what, down = summary
    state = Text("up", style="green") if down is None else Text("DEGRADED (no new claims)", style="bold red")
    words = " · ".join([what, *(f"GRES {g}" for g in caps.slurm_gres), *([down] if down is not None else [])])
    return (node, fmt.DASH, "slurm", fmt.DASH, fmt.DASH, state, fmt.escape(words), fmt.DASH, fmt.DASH, probe)


def device_order(devices: Sequence[DeviceModel]) -> list[DeviceModel]:
    """``devices`` by index, each MIG instance right after its GPU."""
    parents = {d.uuid: d.index for d in devices if d.uuid and d.kind.value != "mig"}

    def key(d: DeviceModel) -> tuple[int, int, int]:
        parent = parents.get(d.parent_uuid or "") if d.kind.value == "mig" else None
        return (d.index, 0, 0) if parent is None else (parent, 1, d.index)

    return sorted(devices, key=key)


def mig_names(peers: Sequence[PeerView]) -> dict[tuple[str, int], str]:
    """(node id, device index) -> the MIG instance's name ("MIG 3g.40gb on GPU 4") for every MIG
    instance of ``peers``: what WHERE says instead of its index."""
    out: dict[tuple[str, int], str] = {}
    for p in peers:
        if p.capabilities is None:
            continue
        parents = {d.uuid: d.index for d in p.capabilities.devices if d.uuid}
        for d in p.capabilities.devices:
            if d.kind.value == "mig":
                out[(p.node_id, d.index)] = fmt.mig_name(d.mig_profile, parents.get(d.parent_uuid or ""))
    return out


def _state(peer: PeerView, d: DeviceModel, labeller: JobLabeller | None, live: GpuMetricsView | None) -> Cell:
    if peer.state == "down" or (peer.capabilities is not None and not peer.capabilities.online):
        return Text("offline", style="red")
    if peer.state == "foreign":
        return Text("other cluster", style="magenta")
    fault = fmt.fault(d.state.value, d.state_reason)
    if fault is not None:  # lost, unusable: the tool's words; excluded by the config
        return Text(fmt.escape(fault), style="dim" if d.state.value == "excluded" else "bold red")
    if d.kind.value == "gpu" and d.mig_enabled:
        return Text("MIG mode", style="cyan")
    if d.granted_to:
        if live is not None and live.granted_to == d.granted_to and (live.granted_name or live.granted_user):
            return Text(job_label(d.granted_to, live.granted_name, live.granted_user), style="yellow")
        return Text(fmt.holder(d.granted_to, labeller), style="yellow")
    pids = [p.pid for p in live.processes] if live is not None else d.foreign_pids
    if pids:
        return Text("busy (pid " + ", ".join(str(p) for p in pids) + ")", style="red")
    if not d.execution_supported:
        return Text("detection only", style="dim")
    if d.to_core().hidden_use:
        return Text("busy (processes not visible here)", style="red")
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


def _cpu_row(node: str, caps: Capabilities, probe: Cell) -> tuple[Cell, ...]:
    """A machine's CPU: its cores and RAM, and the daemon's CPU slots (``8 slots (4 free)``)."""
    slots = fmt.cpu_slots(caps.cpu_slots_total, caps.cpu_slots_free)
    cores = f"{fmt.text(caps.cpu_count)} cores"
    name = cores if caps.devices else f"CPU only, {cores}"
    state: Cell = fmt.DASH if slots is None else Text(slots, style="green" if caps.cpu_slots_free else "yellow")
    ram = fmt.DASH if caps.memory_total_bytes is None else f"{fmt.gb(caps.memory_total_bytes)} RAM"
    return (node, fmt.DASH, "cpu", fmt.DASH, ram, state, name, fmt.DASH, fmt.DASH, probe)


def device_rows(peers: Sequence[PeerView], metrics: MetricsView | None = None,
                labeller: JobLabeller | None = None) -> dict[str, tuple[Cell, ...]]:
    """One row per device of every peer, MIG instances under their GPU, then one CPU row per peer;
    keyed ``node:index`` (``node:cpu`` for the CPU, ``node:-`` for a machine that did not report).

    Columns as :attr:`DevicesTable.COLUMNS`; every cell is whole (the table cuts to fit).
    ``metrics`` (this machine's, matched by uuid on the peer whose state is ``self``) gives
    utilisation and fresher memory, never for a lost or unusable GPU; ``labeller`` names the
    jobs holding devices.
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
        probe_cell = Text(fmt.escape(probe), style="" if probe == "ok" else "bold red")
        parents = {d.uuid: d.index for d in caps.devices if d.uuid}
        slurm = _slurm_row(node, caps, probe_cell)
        if slurm is not None:  # a Slurm cluster as worker: its kind, partitions and GRES before its GPUs
            rows[f"{peer.node_id}:slurm"] = slurm
        for d in device_order(caps.devices):
            fault = d.state.value in _FAULTS
            live = live_by_uuid.get(d.uuid) if peer.state == "self" and d.uuid and not fault else None
            mig = d.kind.value == "mig"
            name = fmt.device_name(d.name, mig=mig, mig_profile=d.mig_profile,
                                   parent_index=parents.get(d.parent_uuid or ""), lost=d.state.value == "lost",
                                   pci_bus_id=d.pci_bus_id)
            rows[f"{peer.node_id}:{d.index}"] = (
                node,
                str(d.index),
                fmt.device_kind(d.accelerator.value, mig),
                _util(live),
                _memory(d, live),
                _state(peer, d, labeller, live),
                Text(fmt.escape(fmt.text(name)), style="dim" if fault else ""),
                fmt.text(d.compute_capability),
                fmt.escape(fmt.text(d.driver_version)),
                probe_cell,
            )
        rows[f"{peer.node_id}:cpu"] = _cpu_row(node, caps, probe_cell)
    return rows


def device_detail(cells: Sequence[Cell]) -> str:
    """A row of :func:`device_rows` in words, every column whole: "lab-ws-02 cuda 0: NVIDIA RTX A6000 ·
    19.3/25.8 GB dedicated · util 87% · sweep (bob) · cc 8.6 · driver 550.54.15 · probes ok"."""
    node, index, kind, util, memory, state, name, cc, driver, probe = (
        c.plain if isinstance(c, Text) else c for c in cells)
    parts = [memory, f"util {util}" if util != fmt.DASH else "", state, f"cc {cc}" if cc != fmt.DASH else "",
             f"driver {driver}" if driver != fmt.DASH else "", f"probes {probe}" if probe != fmt.DASH else ""]
    head = f"{node} {kind}" + ("" if index == fmt.DASH else f" {index}")
    return f"{head}: {name} · " + " · ".join(p for p in parts if p and p != fmt.DASH)


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

    SHRINK: ClassVar[Sequence[tuple[str, int]]] = (
        ("probe", 16), ("name", 20), ("state", 24), ("node", 12), ("probe", 0), ("driver", 0), ("cc", 0),
        ("accelerator", 0), ("name", 16), ("memory", 16), ("state", 20), ("node", 9), ("memory", 13),
        ("name", 12), ("state", 14), ("util", 0), ("node", 6), ("name", 6), ("state", 8),
    )
    """Cut PROBE, NAME and STATE (the line under the table has them whole) before hiding PROBE,
    DRIVER, CC and KIND; then cut MEMORY, NAME, STATE and NODE further."""

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
