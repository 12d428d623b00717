"""How many CPUs this process may really use: affinity and cgroup CPU quota, not the host's count.

``os.cpu_count()`` and ``psutil.cpu_count()`` give the host's logical CPUs even under
``taskset``, in a cpuset-limited container or under a CPU quota (recorded case bug-35),
so a daemon that sized its CPU slots from them would run more CPU jobs at once than the
CPUs it may use. :func:`usable_cpus` is the minimum of

- the affinity mask (``os.sched_getaffinity(0)``; ``os.cpu_count()`` where that call
  does not exist, as on macOS), and
- the CPU quota of this process's cgroup and of each of its ancestors: cgroup v2
  ``cpu.max`` (``"QUOTA PERIOD"``, or ``"max PERIOD"`` for no limit), cgroup v1
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota ``-1`` for no limit). A limit
  is QUOTA / PERIOD CPUs; the smallest limit on the way to the root wins, as the kernel
  throttles a cgroup by each ancestor's quota too.

The result is rounded down (1.5 CPUs of quota run one CPU-bound process without
throttling, not two) and is at least 1. :func:`cgroup_cpu_limit` takes the cgroup
mount point and the ``/proc/self/cgroup`` text as parameters, so tests give it a crafted
tree in a temporary directory. Reading the files is blocking I/O: call these from a
thread, or once at start-up (:func:`default_cpu_slots` caches its answer).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path

__all__ = ["cgroup_cpu_limit", "default_cpu_slots", "parse_cpu_max", "parse_proc_cgroup", "usable_cpus"]

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` text (``"150000 100000"`` -> 1.5); None = no limit.

    Malformed text reads as no limit.
    """
    parts = text.split()
    if len(parts) < 1 or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_proc_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """Split ``/proc/self/cgroup`` into (the v2 path, {v1 controller: path}).

    Lines are ``ID:CONTROLLERS:PATH``; cgroup v2's line is ``0::PATH``. A v1 line with
    several controllers (``cpu,cpuacct``) gives each of them the path.
    """
    unified: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
            continue
        for name in controllers.split(","):
            v1[name] = path
        v1[controllers] = path
    return unified, v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _chain(mount: Path, path: str) -> list[Path]:
    """The cgroup directory of ``path`` under ``mount`` and each ancestor up to ``mount``.

    In a container the path in ``/proc/self/cgroup`` may name the host's hierarchy while the
    container sees its own cgroup at the mount point; then the walk starts from the deepest
    directory that exists.
    """
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    dirs = [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def _v2_limit(root: Path, path: str) -> float | None:
    limits = []
    for d in _chain(root, path):
        text = _read(d / "cpu.max")
        limit = parse_cpu_max(text) if text is not None else None
        if limit is not None:
            limits.append(limit)
    return min(limits, default=None)


def _v1_limit(root: Path, v1: dict[str, str]) -> float | None:
    path = v1.get("cpu")
    if path is None:
        return None
    names = [name for name in v1 if "," in name and "cpu" in name.split(",")]
    mounts = [root / name for name in (*names, "cpu", "cpu,cpuacct", "cpuacct,cpu")]
    mount = next((m for m in mounts if m.is_dir()), None)
    if mount is None:
        return None
    limits = []
    for d in _chain(mount, path):
        quota_text, period_text = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        if quota_text is None or period_text is None:
            continue
        limit = parse_cpu_max(f"{quota_text.strip()} {period_text.strip()}")
        if limit is not None:
            limits.append(limit)
    return min(limits, default=None)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs this process's cgroup quota allows (the smallest over its ancestors); None = no quota.

    Args:
        root: where the cgroup file systems are mounted (v2 directly, v1 one directory per
            controller such as ``cpu,cpuacct``).
        proc_cgroup: the text of ``/proc/self/cgroup``; None reads it (no file, as on macOS:
            no limit).

    Returns:
        CPUs as a fraction (1.5 for a quota of 150 ms per 100 ms), or None when neither
        cgroup v2 nor v1 sets a quota.
    """
    if proc_cgroup is None:
        proc_cgroup = _read(PROC_SELF_CGROUP)
        if proc_cgroup is None:
            return None
    unified, v1 = parse_proc_cgroup(proc_cgroup)
    limits = []
    if unified is not None and (root / "cgroup.controllers").exists():
        limits.append(_v2_limit(root, unified))
    if v1:
        limits.append(_v1_limit(root, v1))
    return min((x for x in limits if x is not None), default=None)


def _affinity_count() -> int | None:
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return len(getaffinity(0)) or None
        except OSError:
            pass
    return os.cpu_count()


def usable_cpus(
    *, affinity: int | None = None, quota: float | None = None, root: Path = CGROUP_ROOT,
    proc_cgroup: str | None = None, read_system: bool = True,
) -> int:
    """The CPUs this process may use: min(affinity, cgroup quota), rounded down, at least 1.

    Args:
        affinity: CPUs in the affinity mask; None asks ``os.sched_getaffinity`` when
            ``read_system``.
        quota: CPUs allowed by the cgroup quota; None reads it (under ``root``) when
            ``read_system``.
        root: cgroup mount point (see :func:`cgroup_cpu_limit`).
        proc_cgroup: ``/proc/self/cgroup`` text; None reads the file.
        read_system: False uses only the values given (a pure computation).
    """
    if read_system:
        if affinity is None:
            affinity = _affinity_count()
        if quota is None:
            quota = cgroup_cpu_limit(root, proc_cgroup)
    limits = [float(x) for x in (affinity, quota) if x is not None]
    if not limits:
        return 1
    return max(1, math.floor(min(limits) + 1e-9))


@functools.cache
def default_cpu_slots() -> int:
    """The daemon's CPU slots when none are configured: :func:`usable_cpus` of this process.

    Cached for the life of the process (read once at start-up, from a thread).
    """
    slots = usable_cpus()
    logger.debug("CPU slots from affinity and cgroup quota: %d (host has %s)", slots, os.cpu_count())
    return slots
