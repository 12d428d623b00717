"""An in-memory :class:`~gpulayerd.runs.runner.Runner`: the test decides when each run ends.

:class:`FakeRunner` stands for one machine's watchdogs. Nothing is started: a "run" is a
record keyed by (job id, attempt) and by its run directory. It ends when the test says so
(:meth:`FakeRunner.exit`), when the daemon cancels it (exit -15, ``cancelled``), when its
deadline passes on the fake clock (:meth:`FakeRunner.check_deadlines`: exit -15,
``deadline``, as the watchdog would), or when the host crashes (:meth:`FakeRunner.crash`:
the watchdog and the job are gone). Runs outlive the daemon that started them, so a
daemon rebuilt on the same machine re-adopts them by run directory, like the real one.

The services call ``start``/``poll``/``cancel``/``extend_deadline``/``adopt``/
``give_up_if_unstarted`` in worker threads (``asyncio.to_thread``): the state is guarded
by a lock and waiters are woken through the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulayerd.runs.account import JobUser
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunState, RunStatus

from .clock import FakeClock

__all__ = ["FakeRun", "FakeRunner"]

_PIDS = itertools.count(10_000_000)  # above any Linux pid_max: never a real process


@dataclass
class FakeRun:
    """One attempt started on the fake machine."""

    handle: RunHandle
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    deadline: float | None
    user: JobUser | None = None
    status: RunStatus = field(default_factory=lambda: RunStatus(RunState.RUNNING))
    deadlines: list[float | None] = field(default_factory=list)  # every deadline it was given, in order
    cancels: int = 0

    @property
    def key(self) -> tuple[str, int]:
        """(job id, attempt)."""
        return self.handle.job_id, self.handle.attempt


class FakeRunner(Runner):
    """One machine's runs, in memory. Create it on the event loop that will wait on the runs.

    Args:
        runs_dir: the daemon's runs directory (only used to name run directories).
        clock: the fake clock the deadlines are read against.
    """

    def __init__(self, runs_dir: Path, clock: FakeClock) -> None:
        super().__init__(runs_dir, grace_s=0.0, poll_interval_s=1.0)
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, int], FakeRun] = {}
        self._by_dir: dict[Path, FakeRun] = {}
        self._abandoned: set[Path] = set()
        self._waiters: dict[tuple[str, int], list[asyncio.Future[RunStatus]]] = {}
        self.start_errors: dict[str, RunnerError] = {}
        """job id -> the error the next start of that job raises (the test sets it)."""

    # ------------------------------------------------------------------ Runner interface

    def start(self, job_id: str, attempt: int, argv: Sequence[str], env: Mapping[str, str],
              cwd: str | Path | None = None, deadline_monotonic: float | None = None,
              lock_fds: Sequence[int] = (), user: JobUser | None = None,
              renew_s: float | None = None, time_limit: tuple[float, str, float] | None = None,
              preflight: object = None) -> RunHandle:
        """Record a run that is running now (see :meth:`Runner.start`; ``time_limit`` is not enforced here:
        the watchdog's, tested with real processes).

        Raises:
            RunnerError: the run directory was used before, or the test asked for it
                (:attr:`start_errors`).
        """
        run_dir = self.run_dir(job_id, attempt)
        with self._lock:
            error = self.start_errors.pop(job_id, None)
            if error is not None:
                raise error
            if run_dir in self._by_dir or run_dir in self._abandoned:
                raise RunnerError(f"{run_dir} holds an earlier run of job {job_id} attempt {attempt}")
            pid = next(_PIDS)
            handle = RunHandle(job_id=job_id, attempt=attempt, run_dir=run_dir, watchdog_pid=pid,
                               watchdog_create_time=self._clock.wall(), watchdog_start_ticks=None,
                               job_pid=pid + 1, job_pgid=pid + 1, job_create_time=self._clock.wall(),
                               job_start_ticks=None)
            run = FakeRun(handle=handle, argv=list(argv), env=dict(env), cwd=None if cwd is None else str(cwd),
                          deadline=deadline_monotonic, deadlines=[deadline_monotonic], user=user)
            self._runs[(job_id, attempt)] = run
            self._by_dir[run_dir] = run
        return handle

    def poll(self, target: RunHandle | Path) -> RunStatus:
        """The run's status; GONE for a run directory where nothing ever started."""
        run_dir = target.run_dir if isinstance(target, RunHandle) else Path(target)
        with self._lock:
            run = self._by_dir.get(run_dir)
            if run is None:
                return RunStatus(RunState.GONE, reason="gone", detail=f"no watchdog ever started in {run_dir}")
            return run.status

    async def async_wait(self, handle: RunHandle) -> RunStatus:
        """Wait until the run is no longer running (no polling: the end wakes the waiter)."""
        with self._lock:
            run = self._by_dir.get(handle.run_dir)
            if run is None:
                return RunStatus(RunState.GONE, reason="gone", detail="no such run")
            if not run.status.running:
                return run.status
            fut: asyncio.Future[RunStatus] = self._loop.create_future()
            self._waiters.setdefault(run.key, []).append(fut)
        return await fut

    def give_up_if_unstarted(self, run_dir: Path) -> bool:
        """True (and the run directory can never start) unless a run started there."""
        with self._lock:
            if Path(run_dir) in self._by_dir:
                return False
            self._abandoned.add(Path(run_dir))
            return True

    def adopt(self, run_dir: Path) -> RunHandle | None:
        """The handle of the run started in ``run_dir``; None if none started there."""
        with self._lock:
            run = self._by_dir.get(Path(run_dir))
            return None if run is None else run.handle

    def cancel(self, handle: RunHandle, first_signal: str = "") -> None:
        """Stop the run as the watchdog does on SIGTERM: exit -15, ``cancelled``."""
        with self._lock:
            run = self._by_dir.get(handle.run_dir)
            if run is not None:
                run.cancels += 1
        self._end(handle.job_id, handle.attempt, RunStatus(
            RunState.EXITED, exit_code=-15, reason="cancelled",
            detail="cancelled: the watchdog was asked to stop the job", killed_by_watchdog=True,
            ended_at=self._clock.wall()))

    def extend_deadline(self, handle: RunHandle, deadline_monotonic: float | None) -> None:
        """Move the run's deadline (fake-clock monotonic seconds)."""
        with self._lock:
            run = self._by_dir.get(handle.run_dir)
            if run is not None and run.status.running:
                run.deadline = deadline_monotonic
                run.deadlines.append(deadline_monotonic)

    # ------------------------------------------------------------------ what the test does

    def get(self, job_id: str, attempt: int) -> FakeRun | None:
        """The run of ``attempt`` of ``job_id`` on this machine, if one started."""
        with self._lock:
            return self._runs.get((job_id, attempt))

    def running(self) -> list[tuple[str, int]]:
        """(job id, attempt) of every run still running, sorted."""
        with self._lock:
            return sorted(k for k, r in self._runs.items() if r.status.running)

    def exit(self, job_id: str, attempt: int, code: int = 0, detail: str = "") -> None:
        """The job exits with ``code`` (negative: killed by that signal).

        Raises:
            KeyError: no such run. AssertionError: it ended already.
        """
        with self._lock:
            run = self._runs[(job_id, attempt)]
            assert run.status.running, f"{job_id}/{attempt} already ended: {run.status}"
        self._end(job_id, attempt, RunStatus(RunState.EXITED, exit_code=code, reason="exited", detail=detail,
                                             ended_at=self._clock.wall()))

    def check_deadlines(self) -> list[tuple[str, int]]:
        """End every run whose deadline passed on the fake clock, as its watchdog would.

        Returns:
            The runs ended now.
        """
        now = self._clock.monotonic()
        with self._lock:
            due = [r.key for r in self._runs.values()
                   if r.status.running and r.deadline is not None and now > r.deadline]
        for job_id, attempt in due:
            self._end(job_id, attempt, RunStatus(
                RunState.EXITED, exit_code=-15, reason="deadline",
                detail="deadline passed: the owner's lease was not renewed", killed_by_watchdog=True,
                ended_at=self._clock.wall()))
        return due

    def crash(self) -> list[tuple[str, int]]:
        """The host dies: every watchdog and job is killed at once, nothing is recorded.

        Returns:
            The runs that were running.
        """
        with self._lock:
            live = [r.key for r in self._runs.values() if r.status.running]
        for job_id, attempt in live:
            self._end(job_id, attempt, RunStatus(
                RunState.GONE, reason="gone",
                detail="the watchdog died without writing exit.json; its job is gone too"))
        return live

    def _end(self, job_id: str, attempt: int, status: RunStatus) -> None:
        with self._lock:
            run = self._runs.get((job_id, attempt))
            if run is None or not run.status.running:
                return
            run.status = status
            waiters = self._waiters.pop((job_id, attempt), [])
        for fut in waiters:
            self._loop.call_soon_threadsafe(_resolve, fut, status)

    def idle_futures(self) -> list[asyncio.Future[RunStatus]]:
        """Futures of waits on runs still running (a task waiting on one is idle, not busy)."""
        with self._lock:
            return [f for fs in self._waiters.values() for f in fs if not f.done()]


def _resolve(fut: asyncio.Future[RunStatus], status: RunStatus) -> None:
    if not fut.done():
        fut.set_result(status)
