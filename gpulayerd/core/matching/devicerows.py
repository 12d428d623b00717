"""The explain table's per-device requirement rows (pure): one row per requirement a device must
meet on its own (memory kind, memory, compute capability, float64), ticked only when enough devices
that can be granted at all meet it, and, where the requirements are met by different devices (GPU 0
has the memory, GPU 1 the compute capability), a devices × requirements table instead of independent
ticks. Memory in messages is in GB of 10^9 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayerd.core.matching.device_state import cc_text, device_label, gb_text, gb_wanted
from gpulayerd.core.types import DeviceSnapshot, JobRequest, MemoryKind
from gpulayerd.core.verdict import Check, Rejection

__all__ = ["GATES", "MAX_TABLE_DEVICES", "device_rows"]

GATES = frozenset({"accelerator", "device state", "mig", "compute mode", "gpu_count"})
"""Requirement names of the per-device rejections that keep a device from being granted at all."""

_NONE: frozenset[str] = frozenset()

MAX_TABLE_DEVICES = 16
"""The most device rows of a devices × requirements table (more are counted in one line)."""


def _wanted_rows(job: JobRequest) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if job.gpu_memory_kind is not None:
        rows.append(("gpu_memory_kind", job.gpu_memory_kind.value))
    if job.gpu_memory_bytes is not None:
        rows.append(("gpu_memory_gb", f">= {gb_wanted(job.gpu_memory_bytes)}"))
    if job.min_cuda_compute_capability is not None:
        rows.append(("min_cuda_compute_capability", f">= {cc_text(job.min_cuda_compute_capability)}"))
    if job.requires_float64:
        rows.append(("requires_float64", "yes"))
    return rows


def device_rows(
    job: JobRequest, per_dev: Sequence[tuple[DeviceSnapshot, list[Rejection]]], checks: list[Check]
) -> None:
    """Append the per-device requirement rows of ``job`` against ``per_dev`` (each device with its
    rejections) to ``checks``.

    A requirement row is ✓ only when at least ``job.gpu_count`` devices that can be granted at all
    (not lost, excluded, unusable, in MIG mode, detection-only) meet it. When two or more rows
    would each be ✓ but fewer than ``job.gpu_count`` devices meet them all together, those rows are
    left unticked (ok None, "not on the same device") and one row per device follows (requirement
    ``GPU i``, wanted "all of the above", found each requirement's value with ✓/✗), then a row
    counting the devices that meet them all (✗).
    """
    rows = _wanted_rows(job)
    if not rows:
        return
    names = [name for name, _ in rows]
    failed = [{r.requirement for r in rs} if rs else _NONE for _, rs in per_dev]
    n_ok = dict.fromkeys(names, 0)
    together = 0
    for f in failed:  # one pass: what each grantable device meets, and whether it meets them all
        if not f:
            together += 1
            for name in names:
                n_ok[name] += 1
        elif f.isdisjoint(GATES):
            missed = False
            for name in names:
                if name in f:
                    missed = True
                else:
                    n_ok[name] += 1
            together += not missed
    count = job.gpu_count
    apart = together < count and sum(n >= count for n in n_ok.values()) >= 2
    labels = [device_label(d) for d, _ in per_dev]
    for name, wanted in rows:
        found = ", ".join([f"{label}: {_device_value(name, d)}" for label, (d, _) in zip(labels, per_dev, strict=True)])
        n = n_ok[name]
        if apart and n >= count:
            checks.append(Check(name, wanted, f"{n} of {len(per_dev)} device(s) meet it, not on the same device as "
                                              f"the rest: {found}", None))
        else:
            checks.append(Check(name, wanted, f"{n} of {len(per_dev)} device(s) meet it: {found}", n >= count))
    if not apart:
        return
    for (d, _), label, f in list(zip(per_dev, labels, failed, strict=True))[:MAX_TABLE_DEVICES]:
        cells = [f"{'✗' if name in f else '✓'} {_short(name)} {_device_value(name, d)}" for name in names]
        gated = not f.isdisjoint(GATES)
        if gated:
            cells.append("✗ cannot be granted")
        checks.append(Check(label, "all of the above", ", ".join(cells), not gated and f.isdisjoint(names)))
    if len(failed) > MAX_TABLE_DEVICES:
        checks.append(Check(f"{len(failed) - MAX_TABLE_DEVICES} more device(s)", "all of the above", "not listed",
                            None))
    checks.append(Check("device requirements together", f"on >= {job.gpu_count} device(s)",
                        f"{together} of {len(per_dev)} device(s) meet them all", False))


_SHORT = {"gpu_memory_kind": "memory kind", "gpu_memory_gb": "memory", "min_cuda_compute_capability": "cc",
          "requires_float64": "float64"}


def _short(requirement: str) -> str:
    return _SHORT.get(requirement, requirement)


_KIND_AFTER: dict[MemoryKind | None, str] = {None: "", **{k: f" {k.value}" for k in MemoryKind}}
"""What follows a memory size: " dedicated", " unified" (enum ``.value`` is slow in a hot loop)."""


def _device_value(requirement: str, d: DeviceSnapshot) -> str:
    if requirement == "gpu_memory_gb":
        if d.memory_total_bytes is None:
            return "unknown"
        return f"{gb_text(d.memory_total_bytes)}{_KIND_AFTER[d.memory_kind]}"
    if requirement == "gpu_memory_kind":
        return _KIND_AFTER[d.memory_kind][1:] or "unknown"
    if requirement == "min_cuda_compute_capability":
        return cc_text(d.compute_capability) if d.compute_capability is not None else "unknown"
    if requirement == "requires_float64":
        return "unknown" if d.float64 is None else ("yes" if d.float64 else "no")
    return "—"
