"""How an attempt stands, as its run directory and its watchdog say: the states, the status of one
attempt, the handle that watches it, and the exit record (``exit.json``) read into a status.

Shared by :mod:`gpulayerd.runs.runner` (which re-exports them) and whoever reads run dirs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulayerd.runs.layout import EXIT_FILE, read_json

__all__ = ["RunHandle", "RunState", "RunStatus", "RunnerError", "exit_status", "opt_int", "status_of"]


class RunnerError(Exception):
    """A job could not be launched (or its command line cannot be built).

    Attributes:
        status: how the attempt ended when the watchdog recorded it (e.g. exit code 127
            for a command that was not found), else None.
    """

    def __init__(self, message: str, status: RunStatus | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def cause(self) -> str:
        """What went wrong, first: the watchdog's words when it recorded them ("command not found: X"),
        else the message."""
        detail = self.status.detail if self.status is not None else ""
        return detail or str(self)


class RunState(str, enum.Enum):
    """Where an attempt stands, as seen from its run directory."""

    RUNNING = "running"
    EXITED = "exited"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class RunStatus:
    """The state of one attempt.

    Attributes:
        state: RUNNING (the watchdog lives), EXITED (``exit.json``, or the record a watchdog
            keeps in memory on a full disk, says how it ended) or
            GONE (the watchdog died without writing ``exit.json``).
        exit_code: the job's exit status; negative N when killed by signal N; None while
            running, when gone, or when the job never started.
        reason: ``exited``, ``cancelled``, ``deadline``, ``timeout``, ``start_failed``, ``error`` (the
            watchdog failed) or ``gone``; empty while running.
        detail: one sentence for people, e.g. "command not found: trian.py".
        killed_by_watchdog: the watchdog signalled the job (cancel or deadline).
        ended_at: wall-clock end time (seconds since the epoch), when known.
        kept: the record came from a watchdog that keeps it in memory (it could not write
            ``exit.json``): tell it with :meth:`Runner.recorded` once the end is stored.
    """

    state: RunState
    exit_code: int | None = None
    reason: str = ""
    detail: str = ""
    killed_by_watchdog: bool = False
    ended_at: float | None = None
    kept: bool = False

    @property
    def running(self) -> bool:
        """True while the watchdog lives and has not recorded an end."""
        return self.state is RunState.RUNNING

    @property
    def timed_out(self) -> bool:
        """True when the watchdog stopped the job at its time limit (or it exited after the warning)."""
        return self.reason == "timeout"

    @property
    def gone(self) -> bool:
        """True when the watchdog died without saying how the job ended."""
        return self.state is RunState.GONE


@dataclass(frozen=True, slots=True)
class RunHandle:
    """Everything needed to watch, cancel or re-adopt one attempt.

    Attributes:
        job_id: the job.
        attempt: the attempt number (1 for the first run).
        run_dir: ``runs_dir/JOB/ATTEMPT``.
        watchdog_pid: the watchdog's pid.
        watchdog_create_time: its psutil creation time (seconds since the epoch).
        watchdog_start_ticks: its start in clock ticks since boot (Linux; else None).
        job_pid: the job's pid; None if the watchdog had not started it yet.
        job_pgid: the job's process group (= ``job_pid``).
        job_create_time: the job's psutil creation time.
        job_start_ticks: the job's start in clock ticks since boot (Linux; else None).
    """

    job_id: str
    attempt: int
    run_dir: Path
    watchdog_pid: int
    watchdog_create_time: float
    watchdog_start_ticks: int | None
    job_pid: int | None
    job_pgid: int | None
    job_create_time: float | None
    job_start_ticks: int | None


def exit_status(run_dir: Path) -> RunStatus | None:
    """The status ``run_dir``'s ``exit.json`` gives; None while there is none."""
    data = read_json(run_dir / EXIT_FILE)
    return None if data is None else status_of(data)


def status_of(data: Mapping[str, object], *, kept: bool = False) -> RunStatus:
    """The status an exit record (``exit.json``, or one a watchdog kept in memory) gives."""
    code, reason, detail, ended_at = (data.get(k) for k in ("exit_code", "reason", "detail", "ended_at"))
    return RunStatus(
        RunState.EXITED,
        exit_code=opt_int(code),
        reason=reason if isinstance(reason, str) else "error",
        detail=detail if isinstance(detail, str) else "",
        killed_by_watchdog=data.get("killed_by_watchdog") is True,
        ended_at=float(ended_at) if isinstance(ended_at, int | float) else None,
        kept=kept,
    )


def opt_int(value: object) -> int | None:
    """``value`` if it is an int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
