"""The second half of an nvidia-smi probe: MIG mode and instances, lost GPUs, unknown processes.

:class:`~gpulayerd.gpu.nvidia.query.NvidiaSmi` calls :func:`mig_topology` after its ``--query-gpu``
and :func:`finish_devices` on the devices it built. Parsing is in
:mod:`gpulayerd.gpu.nvidia.mig`; this module runs the extra commands (``-L`` and
``-q -d MEMORY,PIDS`` only when a GPU is in MIG mode) and never raises for a tool's failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpulayerd.core.types import PROHIBITED_COMPUTE_MODE, Accelerator, DeviceKind, DeviceSnapshot, DeviceState
from gpulayerd.gpu.command import CommandRunner, decisive_line
from gpulayerd.gpu.nvidia.mig import (
    MIG_MODE_FIELDS,
    GpuTopology,
    LostGpu,
    lost_device,
    lost_gpus,
    mig_devices,
    parse_list_gpus,
    parse_mig_modes,
    parse_query,
)
from gpulayerd.gpu.nvidia.parse import classify_nvidia_failure, fault_state, parse_nvidia_csv

__all__ = ["LIST_ARGS", "MIG_MODE_ARGS", "QUERY_ARGS", "finish_devices", "mig_topology"]

_FORMAT = "--format=csv,noheader,nounits"
MIG_MODE_ARGS: tuple[str, ...] = (f"--query-gpu={','.join(MIG_MODE_FIELDS)}", _FORMAT)
"""Arguments of the MIG-mode and bus-id query (run on every probe)."""
LIST_ARGS: tuple[str, ...] = ("-L",)
"""Arguments listing GPUs and MIG devices with their uuids (only when a GPU is in MIG mode)."""
QUERY_ARGS: tuple[str, ...] = ("-q", "-d", "MEMORY,PIDS")
"""Arguments giving MIG devices' memory and GPU/compute instance ids of processes (MIG mode only)."""


def mig_topology(path: str, runner: CommandRunner, timeout_s: float, notes: list[str]) -> dict[int, GpuTopology]:
    """Each GPU's bus id, MIG mode, compute mode and live-field faults, by index; rows of a failed
    answer are kept.

    A GPU missing from the answer has MIG mode unknown, treated as disabled (said in ``notes``):
    drivers before MIG (R450) reject the field; the query is then asked once more without the
    fields the tool rejected, so the compute mode and the live field are still read.
    """
    fields = MIG_MODE_FIELDS
    result = runner([path, *MIG_MODE_ARGS], timeout_s)
    parsed = parse_nvidia_csv(result.stdout, fields)
    if not parsed.rows and not result.timed_out and not result.not_found:
        failure = classify_nvidia_failure(result.stdout, result.stderr, result.returncode, False)
        rejected = set(failure.unsupported_fields) - {"index"}
        if rejected & set(fields):
            fields = tuple(f for f in fields if f not in rejected)
            dropped = ", ".join(sorted(rejected & set(MIG_MODE_FIELDS)))
            notes.append(f"nvidia-smi rejected --query-gpu field(s) {dropped}; asked again without them")
            result = runner([path, f"--query-gpu={','.join(fields)}", _FORMAT], timeout_s)
            parsed = parse_nvidia_csv(result.stdout, fields)
    found = parse_mig_modes(parsed.rows, parsed.faults)
    if result.timed_out or result.not_found or result.returncode != 0 or not found:
        words = decisive_line([*parsed.diagnostics, *result.stderr.splitlines()]) or (
            "timed out" if result.timed_out else f"exit status {result.returncode}")
        notes.append(f"MIG mode, compute mode and live state unknown for GPUs not listed by nvidia-smi "
                     f"--query-gpu=...mig.mode.current ({words}); treated as MIG disabled, compute mode Default")
    return found


def finish_devices(
    devices: Sequence[DeviceSnapshot],
    stdout: str,
    topology: dict[int, GpuTopology],
    apps: tuple[Mapping[str, tuple[int, ...]] | None, Mapping[str, tuple[int, ...]]] | None,
    path: str,
    runner: CommandRunner,
    timeout_s: float,
    notes: list[str],
) -> tuple[tuple[DeviceSnapshot, ...], tuple[LostGpu, ...]]:
    """Complete the CUDA devices of one probe.

    - bus id and MIG mode from ``topology``; a GPU in MIG mode is followed by its MIG devices;
    ``apps`` is the process query's (pids by uuid or None when it failed, valid rows of a failed
    query), None when it was not asked.

    - with a failed process query, a GPU's processes are unknown (``processes_known`` False)
      unless the query still printed rows for it (those pids are kept);
    - a GPU named in a diagnostic line of ``stdout`` (the ``--query-gpu`` answer) becomes a
      ``lost`` device (or marks the listed device with that index or bus id lost).

    Returns:
        (devices, the lost GPUs' diagnostics).
    """
    failed = apps is not None and apps[0] is None
    known_pids = dict(apps[0] if apps[0] is not None else apps[1]) if apps is not None else {}
    out: list[DeviceSnapshot] = []
    mig_parents: list[DeviceSnapshot] = []
    for dev in devices:
        d = dev
        topo = topology.get(d.index)
        if topo is not None and (topo.uuid is None or d.uuid is None or topo.uuid == d.uuid):
            d = _with_topology(d, topo)
        if failed:
            rows = known_pids.get(d.uuid or "")
            d = replace(d, foreign_pids=rows) if rows else replace(d, processes_known=False)
        out.append(d)
        if d.mig_enabled:
            mig_parents.append(d)
    if mig_parents:
        out = _with_migs(out, mig_parents, known_pids, failed, path, runner, timeout_s, notes)
    lost = lost_gpus(stdout)
    for gpu in lost:
        out = _mark_lost(out, gpu, topology)
    return tuple(out), lost


def _with_topology(d: DeviceSnapshot, topo: GpuTopology) -> DeviceSnapshot:
    """Bus id, MIG mode and compute mode from the second query; a fault it read (``pstate`` reads
    ``[GPU requires reset]``) or compute mode Prohibited makes the GPU ``unusable``."""
    d = replace(d, pci_bus_id=topo.bus_id, mig_enabled=topo.mig_enabled, compute_mode=topo.compute_mode)
    if d.state is not DeviceState.OK:
        return d
    if topo.fault:
        state, reason = fault_state(topo.fault)
        return replace(d, state=state, state_reason=reason)
    if topo.compute_mode == PROHIBITED_COMPUTE_MODE:
        return replace(d, state=DeviceState.UNUSABLE, state_reason="compute mode Prohibited")
    return d


def _with_migs(
    devices: list[DeviceSnapshot],
    parents: list[DeviceSnapshot],
    pids: dict[str, tuple[int, ...]],
    apps_failed: bool,
    path: str,
    runner: CommandRunner,
    timeout_s: float,
    notes: list[str],
) -> list[DeviceSnapshot]:
    listing = runner([path, *LIST_ARGS], timeout_s)
    listed = parse_list_gpus(listing.stdout)
    if listing.returncode != 0 or not listed:
        words = decisive_line([*listing.stdout.splitlines(), *listing.stderr.splitlines()])
        notes.append(f"nvidia-smi -L failed ({words or f'exit status {listing.returncode}'}): MIG devices unknown")
    query = runner([path, *QUERY_ARGS], timeout_s)
    queried = parse_query(query.stdout) if query.returncode == 0 else {}
    if not queried:
        words = decisive_line([*query.stdout.splitlines(), *query.stderr.splitlines()])
        notes.append(f"nvidia-smi -q -d MEMORY,PIDS failed ({words or f'exit status {query.returncode}'}): "
                     "MIG devices' processes unknown, so they are not free")
    out: list[DeviceSnapshot] = []
    for d in devices:
        out.append(d)
        if d not in parents:
            continue
        block = queried.get(d.pci_bus_id or "") if queried else None
        if queried and block is None:
            notes.append(f"GPU {d.index}: no block for bus id {d.pci_bus_id} in nvidia-smi -q")
        migs = mig_devices(d, listed.get(d.uuid or ""), block, pids, notes)
        if apps_failed:
            # Processes by GPU instance come from -q; without the compute-apps list they are still known.
            migs = tuple(replace(m, processes_known=m.processes_known and block is not None) for m in migs)
        out.extend(migs)
    return out


def _mark_lost(devices: list[DeviceSnapshot], gpu: LostGpu, topology: dict[int, GpuTopology]) -> list[DeviceSnapshot]:
    by_bus = {t.bus_id: t for t in topology.values() if t.bus_id}
    topo = by_bus.get(gpu.bus_id) if gpu.bus_id else None
    index = topo.index if topo is not None else gpu.index
    whole = [d for d in devices if d.kind is DeviceKind.GPU]
    for i, d in enumerate(devices):
        same = (gpu.bus_id is not None and d.pci_bus_id == gpu.bus_id) or (
            gpu.bus_id is None and d.kind is DeviceKind.GPU and d.index == index)
        if same:
            devices[i] = replace(d, state=DeviceState.LOST, state_reason=gpu.line)
            return devices
    taken = {d.index for d in whole}
    if index is None or index in taken:
        index = max(taken, default=-1) + 1
    template = whole[0] if whole else DeviceSnapshot(accelerator=Accelerator.CUDA, index=0)
    devices.append(lost_device(gpu, index, topo.uuid if topo is not None else None, template))
    return devices
