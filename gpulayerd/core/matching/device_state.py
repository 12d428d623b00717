"""Device states and use in reasons (pure): a device that is never granted as it is (excluded by the
daemon, lost, unusable after a fault or in compute mode Prohibited, a GPU in MIG mode) and one that
qualifies but is busy (granted, a foreign process, memory in use by processes not visible here)."""

from __future__ import annotations

from collections.abc import Callable

from gpulayerd.core.types import (
    EXCLUSIVE_COMPUTE_MODES,
    GB,
    UNKNOWN_PROCESSES_IDLE_MAX_BYTES,
    Accelerator,
    DeviceKind,
    DeviceSnapshot,
    DeviceState,
    JobRequest,
)
from gpulayerd.core.verdict import Rejection, RejectionCode

__all__ = ["Rej", "busy_rejection", "cc_text", "device_label", "gb_text", "gb_wanted", "state_rejections"]

Rej = Callable[[RejectionCode, str, str, str, str], None]
"""Records one rejection: (code, requirement, wanted, found, message)."""


def gb_text(n_bytes: int) -> str:
    """A device's memory in reasons and the table: ``51.5 GB`` (10^9 bytes, one decimal)."""
    return f"{n_bytes / GB:.1f} GB"


def gb_wanted(n_bytes: int) -> str:
    """A job's memory request as written: ``40 GB`` (10^9 bytes, no trailing zeros)."""
    return f"{n_bytes / GB:g} GB"


def cc_text(cc: tuple[int, int]) -> str:
    """A compute capability: ``8.6``."""
    return f"{cc[0]}.{cc[1]}"


def device_label(d: DeviceSnapshot) -> str:
    """How reasons name a device: ``GPU 0``, ``MIG 1g.10gb (MIG-...)``, ``Apple GPU``."""
    if d.kind is DeviceKind.MIG:
        return f"MIG {d.mig_profile or '?'} ({d.uuid})"
    return f"GPU {d.index}" if d.accelerator is not Accelerator.MPS else "Apple GPU"


def state_rejections(job: JobRequest, d: DeviceSnapshot, label: str, rej: Rej) -> bool:
    """Call ``rej`` for a device never granted as it is (excluded, lost, unusable: needs a reset or compute
    mode Prohibited), a whole GPU in MIG mode, or a MIG instance for a multi-device job; True if rejected."""
    if d.state is DeviceState.EXCLUDED and d.state_reason == "virtual machine":
        rej(RejectionCode.EXECUTION_UNSUPPORTED, "device state", "ok", "virtual machine",
            f"{label} is the GPU of a macOS virtual machine: it is not scheduled for mps unless the admin sets "
            "allow_virtual_mps = true")
        return True
    if d.state is DeviceState.EXCLUDED:
        why = "by exclude_gpus in the daemon's config" if d.state_reason == "config" else (
            f"by the daemon's {d.state_reason or 'CUDA_VISIBLE_DEVICES'}")
        rej(RejectionCode.EXECUTION_UNSUPPORTED, "device state", "ok", "excluded",
            f"{label} is excluded {why}: it is never granted")
        return True
    if d.state is DeviceState.LOST:
        rej(RejectionCode.PROBE_UNHEALTHY, "device state", "ok", "lost",
            f"{label}{f' ({d.pci_bus_id})' if d.pci_bus_id else ''} is lost: nvidia-smi said "
            f"{d.state_reason or 'nothing more'!r}; it is never granted")
        return True
    if d.state is DeviceState.UNUSABLE:
        if d.state_reason == "compute mode Prohibited":
            rej(RejectionCode.EXECUTION_UNSUPPORTED, "compute mode", "Default or Exclusive_Process", "Prohibited",
                f"{label} is in compute mode Prohibited: no CUDA process may use it; it is never granted "
                "(an admin changes it with nvidia-smi -c DEFAULT)")
        else:
            rej(RejectionCode.PROBE_UNHEALTHY, "device state", "ok", "unusable",
                f"{label} is unusable: nvidia-smi reads {d.state_reason or 'a fault'!r}; it is never granted "
                "until it is reset (nvidia-smi -r, or a reboot)")
        return True
    if d.kind is DeviceKind.GPU and d.mig_enabled:
        rej(RejectionCode.EXECUTION_UNSUPPORTED, "mig", "whole GPU", "MIG mode",
            f"{label} is in MIG mode: only its MIG instances are granted, never the whole GPU")
        return True
    if d.kind is DeviceKind.MIG and job.gpu_count > 1:
        rej(RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", str(job.gpu_count), "MIG instance",
            f"{label} is a MIG instance: a process can use only one, so a job asking for "
            f"gpu_count {job.gpu_count} needs whole GPUs")
        return True
    return False


def busy_rejection(d: DeviceSnapshot, worker: str) -> Rejection:
    """Why a qualifying device ``d`` of ``worker`` (node id) is not free now: granted to a job, a foreign
    process, memory in use that no listed process accounts for, or an unknown process list."""
    label = device_label(d)
    if d.granted_to is not None:
        return Rejection(RejectionCode.RESERVED, "free devices", "free", f"granted to {d.granted_to}", worker,
                         f"{label} is granted to job {d.granted_to}", device=d.index)
    if d.hidden_use:
        used = f"{(d.memory_used_bytes or 0) / 2**20:.0f} MiB"
        return Rejection(RejectionCode.FOREIGN_PROCESS, "free devices", "free", "memory in use", worker,
                         f"{label} is in use: memory in use by processes not visible here (memory.used "
                         f"{used}, no process listed; free only at <= "
                         f"{UNKNOWN_PROCESSES_IDLE_MAX_BYTES // 2**20} MiB)", device=d.index)
    if not d.foreign_pids and d.unknown_use:
        used = "unknown" if d.memory_used_bytes is None else f"{d.memory_used_bytes / 2**20:.0f} MiB"
        return Rejection(RejectionCode.FOREIGN_PROCESS, "free devices", "free", "processes unknown", worker,
                         f"{label} may be in use: its process list could not be read and its memory.used is "
                         f"{used} (free only at <= {UNKNOWN_PROCESSES_IDLE_MAX_BYTES // 2**20} MiB)",
                         device=d.index)
    pids = ", ".join(str(p) for p in d.foreign_pids)
    exclusive = (f"; it is in compute mode {d.compute_mode}, so a second process would get 'all CUDA-capable "
                 "devices are busy or unavailable'") if d.compute_mode in EXCLUSIVE_COMPUTE_MODES else ""
    return Rejection(RejectionCode.FOREIGN_PROCESS, "free devices", "free", f"pids {pids}", worker,
                     f"{label} is busy with processes gpulayer did not start (pid {pids}){exclusive}",
                     device=d.index)
