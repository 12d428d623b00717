"""Who a process is, safe against pid reuse: its record, liveness, and signals that cannot miss.

A pid counts as the process recorded only if its start time matches: clock ticks since boot
on Linux (exact, immune to wall-clock steps), else psutil's creation time. Standard library
and psutil only: the watchdog imports this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpulayerd.host import sysinfo

__all__ = [
    "JobProcesses",
    "ProcessRecord",
    "become_subreaper",
    "direct_children",
    "group_members",
    "has_children",
    "is_alive",
    "job_processes",
    "libc",
    "record_of",
    "signal_job",
    "signal_process",
]

_CREATE_TIME_TOLERANCE_S = 1.0


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """Who a process is: its pid and when it started, so a reused pid is never mistaken for it.

    Attributes:
        pid: process id.
        create_time: psutil's creation time, seconds since the epoch (follows wall-clock steps).
        start_ticks: start time in clock ticks since boot (``/proc/PID/stat`` field 22; Linux
            only, None elsewhere); immune to wall-clock steps, compared exactly when known.
        zombie: the process has exited but was not reaped yet (it is no longer running).
    """

    pid: int
    create_time: float
    start_ticks: int | None
    zombie: bool = False

    def same_process(self, create_time: float | None, start_ticks: int | None) -> bool:
        """True if this is the process recorded with ``create_time`` / ``start_ticks``."""
        if self.start_ticks is not None and start_ticks is not None:
            return self.start_ticks == start_ticks
        if create_time is None:
            return False
        return abs(self.create_time - create_time) < _CREATE_TIME_TOLERANCE_S

    def to_json(self) -> dict[str, object]:
        """The fields written to ``watchdog.json`` and ``job.json``."""
        return {"pid": self.pid, "create_time": self.create_time, "start_ticks": self.start_ticks}


def record_of(pid: int) -> ProcessRecord | None:
    """The :class:`ProcessRecord` of ``pid`` now (zombies included), or None if there is none.

    On Linux from one read of ``/proc/PID/stat`` (psutil's own formula for ``create_time``: boot
    time plus the start ticks); elsewhere through psutil.
    """
    if sys.platform.startswith("linux"):
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return None
        except OSError:
            raw = b""
        try:
            fields = raw[raw.rindex(b")") + 2 :].split()
            ticks = int(fields[19])
            return ProcessRecord(pid, _boot_time() + ticks / _CLOCK_TICKS, ticks, fields[0] == b"Z")
        except (ValueError, IndexError):
            pass  # unreadable: ask psutil
    try:
        proc = sysinfo.Process(pid)
        create_time = proc.create_time()
        zombie = proc.status() == sysinfo.STATUS_ZOMBIE
    except sysinfo.Error:
        return None
    return ProcessRecord(pid, create_time, _start_ticks(pid), zombie)


def is_alive(pid: int, create_time: float | None, start_ticks: int | None) -> bool:
    """True if ``pid`` is still the process recorded and has not exited (a zombie has)."""
    rec = record_of(pid)
    return rec is not None and not rec.zombie and rec.same_process(create_time, start_ticks)


def group_members(pgid: int) -> list[sysinfo.Process]:
    """Processes of process group ``pgid`` that are still running (zombies left out)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    out: list[sysinfo.Process] = []
    for proc in sysinfo.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != sysinfo.STATUS_ZOMBIE:
                out.append(proc)
        except (OSError, sysinfo.Error):
            continue
    return out


def signal_process(pid: int, create_time: float, start_ticks: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``pid`` if it is still the process recorded; True if sent.

    On Linux the pid is pinned with a pidfd before its identity is checked, so the
    signal cannot reach a process that took the pid over in between.
    """
    pidfd = None
    if sys.platform == "linux":
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            pidfd = None  # no pidfds here (old kernel, seccomp): plain kill below
    try:
        if not is_alive(pid, create_time, start_ticks):
            return False
        if sys.platform == "linux" and pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


class JobProcesses(Protocol):
    """What identifies a job's processes (a :class:`gpulayerd.runs.runner.RunHandle` is one)."""

    @property
    def job_id(self) -> str:
        """The job, as in its ``GPULAYER_JOB_ID``."""
        ...

    @property
    def attempt(self) -> int:
        """The attempt, as in its ``GPULAYER_ATTEMPT``."""
        ...

    @property
    def job_pid(self) -> int | None:
        """The job's first process; None if it never started."""
        ...

    @property
    def job_pgid(self) -> int | None:
        """Its process group (= ``job_pid``)."""
        ...

    @property
    def job_create_time(self) -> float | None:
        """psutil's creation time of ``job_pid``."""
        ...

    @property
    def job_start_ticks(self) -> int | None:
        """Start of ``job_pid`` in clock ticks since boot (Linux)."""
        ...


def job_processes(job: JobProcesses) -> list[sysinfo.Process]:
    """Running processes of a job whose watchdog is gone.

    Its process group (unless the pgid was reused), and processes that carry its
    ``GPULAYER_JOB_ID``/``GPULAYER_ATTEMPT`` but left the group (torchrun starts each
    worker in a session of its own): processes of any account when this process is root
    (jobs run as their users), else of this process's own user. Slow (reads every process's environment): only for the
    rare path where the watchdog cannot do this itself.
    """
    found: dict[int, sysinfo.Process] = {}
    if job.job_pgid is not None and _group_is_ours(job):
        found.update((p.pid, p) for p in group_members(job.job_pgid))
    tag = {"GPULAYER_JOB_ID": job.job_id, "GPULAYER_ATTEMPT": str(job.attempt)}
    uid = os.getuid()
    for proc in sysinfo.process_iter():
        if proc.pid in found:
            continue
        with contextlib.suppress(sysinfo.Error):
            if (uid != 0 and proc.uids().real != uid) or proc.status() == sysinfo.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            if all(env.get(k) == v for k, v in tag.items()):
                found[proc.pid] = proc
    return list(found.values())


def signal_job(job: JobProcesses, sig: signal.Signals) -> None:
    """Send ``sig`` to the job's process group (if still its) and every process of :func:`job_processes`."""
    if job.job_pgid is not None and _group_is_ours(job):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.job_pgid, sig)
    for proc in job_processes(job):
        with contextlib.suppress(sysinfo.Error):
            proc.send_signal(sig)


def _group_is_ours(job: JobProcesses) -> bool:
    """False if the job's pid now belongs to another process (then its pgid may too).

    While any process of a group lives, the kernel does not hand its id to a new
    process; so when the leader's pid is free, the group's members are the job's.
    """
    if job.job_pid is None:
        return False
    rec = record_of(job.job_pid)
    return rec is None or rec.same_process(job.job_create_time, job.job_start_ticks)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BOOT_TIME: list[float] = []


def _boot_time() -> float:
    """The boot time psutil uses (seconds since the epoch), read once per process."""
    if not _BOOT_TIME:
        _BOOT_TIME.append(sysinfo.boot_time())
    return _BOOT_TIME[0]


def _start_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
        return int(raw[raw.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None

# ------------------------------------------------------------------ this process

_PR_SET_CHILD_SUBREAPER = 36


def has_children() -> bool:
    """False when this process has no child at all, running or zombie (so no descendant either:
    an orphan is re-parented to us only while we are its ancestor); a cheap test before a scan of /proc."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WCONTINUED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except OSError:
        return True
    return True


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so none escapes or lingers as a zombie."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library's handle (loaded once per process, or inherited from the zygote)."""
    return ctypes.CDLL(None, use_errno=True)


def direct_children() -> list[int]:
    """Pids of this process's children, running or zombie (from ``/proc/self/task/*/children`` on
    Linux, one small read per thread; elsewhere psutil). A child not yet reaped keeps its pid: it can
    be signalled by pid without the risk of a reused one."""
    if sys.platform.startswith("linux"):
        pids: list[int] = []
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            tasks = []
        for tid in tasks:
            with contextlib.suppress(OSError, ValueError), open(f"/proc/self/task/{tid}/children",
                                                                 encoding="ascii") as f:
                pids.extend(int(x) for x in f.read().split())
        if tasks:
            return pids
    with contextlib.suppress(sysinfo.Error):
        return [c.pid for c in sysinfo.Process().children(recursive=False)]
    return []
