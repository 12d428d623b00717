"""Running job attempts: one watchdog per attempt, watched, cancelled and re-adopted.

The daemon never runs a job itself. For each attempt it writes ``launch.json`` into
``runs_dir/JOB/ATTEMPT/`` (:mod:`gpulayerd.runs.layout`; the command line and environment
come from :mod:`gpulayerd.runs.launch`) and starts :mod:`gpulayerd.runs.watchdog`, which
starts the job in a session of its own, holds the device locks, enforces the deadline the
daemon moves on every lease renewal, and writes ``exit.json``. The watchdog outlives the
daemon, so a restarted daemon re-adopts it from the files in the run directory (pid +
start time, safe against pid reuse). With ``use_zygote`` (the daemon's choice) the watchdog
is forked by a long-lived zygote that holds its imports (:mod:`.zygote`): no Python
start-up per job; the per-job ``python -m`` start below remains the fallback.

The watchdog detaches by forking once: the process the daemon starts exits within
milliseconds and is reaped by :meth:`Runner.start`. The daemon therefore never holds a
long-lived child: no zombie when it forgets to wait, no ``Popen`` to keep (or to warn
about at exit), and a watchdog started by this daemon and one inherited from a previous
daemon are watched by exactly the same code. The price is that the watchdog's exit is
seen through ``exit.json`` and a pidfd (or polling), never through ``waitpid``. When
``exit.json`` cannot be written (a full disk), the watchdog stays alive and keeps the record
in memory; :meth:`Runner.poll` asks it over a socket that needs no disk (:mod:`.exitnote`),
and :meth:`Runner.recorded` lets it go once the daemon has stored the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpulayerd.gpu.command import DEVNULL, STDOUT, Popen, TimeoutExpired
from gpulayerd.host import sysinfo
from gpulayerd.runs import exitnote, layout
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.layout import (
    CANCEL_SIGNAL_FILE,
    DEADLINE_FILE,
    EXIT_FILE,
    JOB_FILE,
    LAUNCH_FILE,
    STDERR_LOG,
    STDOUT_LOG,
    WATCHDOG_FILE,
    WATCHDOG_LOG,
    abandon_run_dir,
    is_abandoned,
    read_json,
    write_file,
    write_json,
)
from gpulayerd.runs.preflight import PreflightCheck
from gpulayerd.runs.process import is_alive, job_processes, signal_job, signal_process
from gpulayerd.runs.status import RunHandle, RunnerError, RunState, RunStatus, exit_status, opt_int, status_of
from gpulayerd.runs.zygote import Zygote, ZygoteRefused

__all__ = ["RunHandle", "RunState", "RunStatus", "Runner", "RunnerError"]

log = logging.getLogger(__name__)

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ runner


class Runner:
    """Starts, watches, cancels and re-adopts job attempts, each under its own watchdog.

    Args:
        runs_dir: where ``JOB/ATTEMPT/`` run directories go.
        python_for_watchdog: the interpreter that runs :mod:`gpulayerd.runs.watchdog` (it
            needs only the standard library and psutil).
        grace_s: SIGTERM to SIGKILL delay when stopping a job.
        poll_interval_s: how often a watchdog re-reads its deadline.
        start_timeout_s: how long :meth:`start` waits for the watchdog to start the job.
        kill_timeout_s: how long SIGKILL is repeated until no process of a job is left.
        wait_interval_s: :meth:`async_wait`'s polling interval where no pidfd is available.
        log_cap_bytes: the most of each output stream (stdout, stderr) of one attempt kept on
            disk; the watchdog drops the rest and appends ``[gpulayer: log capped at N bytes]``.
            None keeps everything.
        use_zygote: start watchdogs by forking a long-lived zygote (:mod:`.zygote`) instead of
            a Python start-up per job (falls back to that when no zygote can be started).
    """

    def __init__(
        self,
        runs_dir: Path,
        python_for_watchdog: str = sys.executable,
        *,
        grace_s: float,
        poll_interval_s: float,
        start_timeout_s: float = 5.0,
        kill_timeout_s: float = 5.0,
        wait_interval_s: float = 0.2,
        log_cap_bytes: int | None = None,
        use_zygote: bool = False,
    ) -> None:
        self._runs_dir = Path(runs_dir)
        self._python = python_for_watchdog
        self._grace_s = grace_s
        self._poll_interval_s = poll_interval_s
        self._start_timeout_s = start_timeout_s
        self._kill_timeout_s = kill_timeout_s
        self._wait_interval_s = wait_interval_s
        self._log_cap_bytes = log_cap_bytes
        self._unwritten: set[tuple[str, int]] = set()  # attempts whose deadline could not be written (logged once)
        self._ended_at_start: dict[Path, RunStatus] = {}  # run dir -> its end, found as its start returned
        self.zygote = Zygote(self._runs_dir, self._python, self._watchdog_env()) if use_zygote else None

    def run_dir(self, job_id: str, attempt: int) -> Path:
        """``runs_dir/JOB/ATTEMPT`` (:func:`gpulayerd.runs.layout.run_dir`).

        Raises:
            ValueError: ``job_id`` is not a plain name (letters, digits, ``._-``) or
                ``attempt`` is below 1.
        """
        return layout.run_dir(self._runs_dir, job_id, attempt)

    def log_paths(self, job_id: str, attempt: int) -> tuple[Path, Path]:
        """The job's (stdout, stderr) log files."""
        run_dir = self.run_dir(job_id, attempt)
        return run_dir / STDOUT_LOG, run_dir / STDERR_LOG

    def start(
        self,
        job_id: str,
        attempt: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        deadline_monotonic: float | None = None,
        lock_fds: Sequence[int] = (),
        user: JobUser | None = None,
        renew_s: float | None = None,
        time_limit: tuple[float, str, float] | None = None,
        preflight: PreflightCheck | None = None,
    ) -> RunHandle:
        """Start a watchdog that starts the job; return once the job runs (or has run).

        Blocks up to ``start_timeout_s`` (typically a few tens of milliseconds): call it
        through ``asyncio.to_thread`` from the event loop.

        Args:
            job_id: the job (a plain name, see :meth:`run_dir`).
            attempt: the attempt number.
            argv: the command (:func:`build_argv`); ``argv[0]`` is looked up in the
                ``PATH`` of ``env``.
            env: the job's complete environment (:func:`build_env`).
            cwd: the job's working directory; None keeps the run directory.
            deadline_monotonic: ``time.monotonic()`` after which the watchdog stops the
                job unless :meth:`extend_deadline` moved it; None for no deadline.
            lock_fds: open descriptors holding device locks; the watchdog inherits them
                and closes them when the job and its leftovers are dead. The caller
                still owns its own copies and should close them after this returns or
                raises (:meth:`gpulayerd.runs.devicelock.DeviceLocks.release`).
            user: the account the job runs as (the watchdog switches to it before ``exec``
                and enters ``cwd`` as it); None runs it as this process's account.
            renew_s: how far a renewal moves the deadline (the lease's length, seconds): what
                the watchdog applies when a renewal comes as a signal (:meth:`extend_deadline`
                on a full disk); None: the time from now to ``deadline_monotonic``.
            time_limit: (the job's time limit, the warning signal's name, when the warning goes out),
                seconds from the job's start: the watchdog enforces both; None: no limit.
            preflight: the check the watchdog runs before the command (:mod:`.preflight`); None: none.

        Raises:
            RunnerError: the run directory was used before, the watchdog could not be
                started or died, or the job could not be started (``status`` then holds
                what the watchdog recorded, e.g. exit code 127 "command not found: X").
        """
        run_dir = self.run_dir(job_id, attempt)
        if not argv:
            raise RunnerError(f"job {job_id} attempt {attempt}: empty command")
        # launch.json holds the job's whole environment (tokens included): owner only.
        try:
            for directory in (run_dir.parent, run_dir):  # nothing is made or written through a link
                directory.mkdir(mode=0o700, parents=directory == run_dir.parent, exist_ok=True)
                if not stat.S_ISDIR(os.lstat(directory).st_mode):
                    raise RunnerError(f"job {job_id} attempt {attempt}: {directory} is not a directory (a symlink?)")
            if (run_dir / WATCHDOG_FILE).exists() or (run_dir / EXIT_FILE).exists():
                raise RunnerError(f"{run_dir} holds an earlier run of job {job_id} attempt {attempt}")
            write_json(
                run_dir / LAUNCH_FILE,
                {
                    "v": 1, "job_id": job_id, "attempt": attempt, "argv": list(argv), "env": dict(env),
                    "cwd": None if cwd is None else str(cwd), "grace_s": self._grace_s,
                    "poll_interval_s": self._poll_interval_s, "kill_timeout_s": self._kill_timeout_s,
                    "lock_fds": list(lock_fds), "user": None if user is None else user.to_json(),
                    "log_cap_bytes": self._log_cap_bytes, "deadline": deadline_monotonic,
                    "renew_s": renew_s if renew_s is not None else (
                        None if deadline_monotonic is None else max(deadline_monotonic - time.monotonic(), 0.1)),
                    "time_limit_s": time_limit[0] if time_limit else None,
                    "warn_signal": time_limit[1] if time_limit else None,
                    "warn_at_s": time_limit[2] if time_limit else None,
                    "preflight": preflight.to_json() if preflight is not None else None,
                },
            )
        except OSError as e:  # a full disk, say: nothing was started
            raise RunnerError(f"job {job_id} attempt {attempt}: cannot write its run directory {run_dir}: "
                              f"{e.strerror or e}") from e
        if self.zygote is not None:
            try:
                launch = self.zygote.launch(job_id, attempt, lock_fds)
            except ZygoteRefused as e:
                raise RunnerError(f"job {job_id} attempt {attempt}: the zygote refused to start it: {e}") from e
            if launch is not None:
                with launch:
                    launch.pause()  # returns as soon as job.json or exit.json is written (the notify pipe ends)
                    handle = self._await_start(job_id, attempt, run_dir, launch.poll, launch.pause, launch.lost)
                if handle is not None:
                    if (ended := exit_status(run_dir)) is not None:  # a short job ended already: async_wait
                        if len(self._ended_at_start) > 256:  # (hints only: one never asked for is dropped)
                            self._ended_at_start.clear()
                        self._ended_at_start[run_dir] = ended  # answers it without a look of its own
                    return handle
                log.warning("job %s attempt %d: no watchdog of the zygote claimed it (the zygote or its watchdog "
                            "died, or the claim could not be written); starting a watchdog", job_id, attempt)
        with open(run_dir / WATCHDOG_LOG, "ab") as watchdog_log:
            try:
                launcher = Popen(
                    [self._python, "-m", "gpulayerd.runs.watchdog", str(run_dir)],
                    env=self._watchdog_env(), cwd=run_dir, stdin=DEVNULL,
                    stdout=watchdog_log, stderr=STDOUT,
                    start_new_session=True, pass_fds=tuple(lock_fds),
                )
            except OSError as e:
                raise RunnerError(f"cannot start the watchdog with {self._python}: {e}") from e
        try:
            handle = self._await_start(job_id, attempt, run_dir, launcher.poll, lambda: time.sleep(0.005))
            assert handle is not None  # (never lost)
            return handle
        finally:
            try:
                launcher.wait(timeout=self._start_timeout_s)
            except TimeoutExpired:
                launcher.kill()
                launcher.wait()

    def poll(self, target: RunHandle | Path) -> RunStatus:
        """The attempt's state now, from its run directory and its watchdog's process record.

        A pid counts as the watchdog only if its start time matches the one recorded (a
        reused pid does not), and a zombie counts as dead.
        """
        run_dir = target.run_dir if isinstance(target, RunHandle) else Path(target)
        status = exit_status(run_dir)
        if status is not None:
            return status
        handle = target if isinstance(target, RunHandle) else self.adopt(run_dir)
        if handle is None:
            return RunStatus(RunState.GONE, reason="gone",
                             detail=f"no watchdog ever started in {run_dir}")
        if is_alive(handle.watchdog_pid, handle.watchdog_create_time, handle.watchdog_start_ticks):
            # Alive without exit.json: running, or ended on a full disk and keeping its record.
            kept = exitnote.ask(handle.watchdog_pid, handle.watchdog_start_ticks)
            return RunStatus(RunState.RUNNING) if kept is None else status_of(kept, kept=True)
        status = exit_status(run_dir)  # it may have written exit.json and exited just now
        if status is not None:
            return status
        if handle.job_pgid is None:
            job = "before it started the job"
        elif job_processes(handle):
            job = f"its job (process group {handle.job_pgid}) is still running"
        else:
            job = "its job is gone too"
        return RunStatus(RunState.GONE, reason="gone", detail=(
            f"the watchdog (pid {handle.watchdog_pid}) died without writing {EXIT_FILE}; {job}"
        ))

    async def async_wait(self, handle: RunHandle) -> RunStatus:
        """Wait, without blocking the loop, until the attempt is no longer RUNNING.

        Wakes on the watchdog's exit through a pidfd where Linux offers one (checking
        again every few seconds regardless), and polls every ``wait_interval_s``
        elsewhere. An attempt :meth:`start` found ended as it returned is answered at once.
        """
        if (ended := self._ended_at_start.pop(handle.run_dir, None)) is not None:
            return ended  # (found by start, in its thread, as it returned)
        loop = asyncio.get_running_loop()
        # Opening the pidfd and polling read /proc and the run directory: in a thread.
        pidfd, first = await asyncio.to_thread(self._open_and_poll, handle)  # one hop for both
        status: RunStatus | None = first
        try:
            while True:
                if status is None:
                    status = await asyncio.to_thread(self.poll, handle)
                if not status.running:
                    return status
                status = None
                if pidfd is None:
                    await asyncio.sleep(self._wait_interval_s)
                    continue
                exited: asyncio.Future[None] = loop.create_future()
                loop.add_reader(pidfd, _set_done, exited)
                try:
                    await asyncio.wait({exited}, timeout=5.0)
                finally:
                    loop.remove_reader(pidfd)
                    exited.cancel()
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _open_and_poll(self, handle: RunHandle) -> tuple[int | None, RunStatus]:
        """:func:`_open_pidfd`, then :meth:`poll` (in that order: an exit between them is seen)."""
        return _open_pidfd(handle), self.poll(handle)

    def recorded(self, handle: RunHandle) -> None:
        """The attempt's end is recorded in the store: a watchdog that could not write
        ``exit.json`` (a full disk) and kept it in memory may exit now (:mod:`.exitnote`).

        Blocks up to a second (call it through ``asyncio.to_thread``); does nothing when the
        watchdog keeps no record.
        """
        exitnote.ask(handle.watchdog_pid, handle.watchdog_start_ticks, ack=True)

    def give_up_if_unstarted(self, run_dir: Path) -> bool:
        """After a restart, for an attempt :meth:`adopt` finds no watchdog for: make sure it never starts.

        Returns:
            True if no watchdog had claimed the run directory (now none ever will: the
            attempt never started), or a daemon gave it up before; False if a watchdog has
            (call :meth:`adopt` again shortly).
        """
        run_dir = Path(run_dir)
        return abandon_run_dir(run_dir) or is_abandoned(run_dir)

    def adopt(self, run_dir: Path) -> RunHandle | None:
        """Rebuild the handle of an attempt from its run directory (after a daemon restart).

        Returns:
            The handle (its watchdog may have ended since; see :meth:`poll`), or None
            when ``watchdog.json`` is missing: no watchdog ever started there.
        """
        run_dir = Path(run_dir)
        watchdog = read_json(run_dir / WATCHDOG_FILE)
        if watchdog is None:
            return None
        pid, create_time = watchdog.get("pid"), watchdog.get("create_time")
        if not isinstance(pid, int) or not isinstance(create_time, int | float):
            return None
        launch = read_json(run_dir / LAUNCH_FILE) or {}
        job_id, attempt = launch.get("job_id"), launch.get("attempt")
        job = read_json(run_dir / JOB_FILE) or {}
        job_pid, job_pgid, job_ct = job.get("pid"), job.get("pgid"), job.get("create_time")
        return RunHandle(
            job_id=job_id if isinstance(job_id, str) else run_dir.parent.name,
            attempt=attempt if isinstance(attempt, int) else _int_or(run_dir.name, 0),
            run_dir=run_dir,
            watchdog_pid=pid,
            watchdog_create_time=float(create_time),
            watchdog_start_ticks=opt_int(watchdog.get("start_ticks")),
            job_pid=opt_int(job_pid),
            job_pgid=opt_int(job_pgid),
            job_create_time=float(job_ct) if isinstance(job_ct, int | float) else None,
            job_start_ticks=opt_int(job.get("start_ticks")),
        )

    def cancel(self, handle: RunHandle, first_signal: str = "") -> None:
        """Stop the job: SIGTERM to its watchdog, which stops the whole job and reports.

        ``first_signal``: the name of the signal the job gets first instead of SIGTERM (written to the
        run dir's ``cancel_signal`` for the watchdog; the fallback below sends SIGTERM).

        When the watchdog is gone (killed, or the machine's OOM killer took it), the job's
        processes are stopped from here: SIGTERM, ``grace_s``, SIGKILL; that path blocks
        (call it through ``asyncio.to_thread``). No pid is signalled unless its start time
        matches the one recorded.
        """
        if first_signal:
            with contextlib.suppress(OSError):
                write_file(handle.run_dir / CANCEL_SIGNAL_FILE, first_signal)
        if signal_process(handle.watchdog_pid, handle.watchdog_create_time,
                           handle.watchdog_start_ticks, signal.SIGTERM):
            log.info("job %s attempt %d: cancel sent to watchdog pid %d",
                     handle.job_id, handle.attempt, handle.watchdog_pid)
            return
        if (handle.run_dir / EXIT_FILE).exists():
            return
        if handle.job_pgid is None:
            # Gone before it wrote job.json: it may have spawned the job just before it died.
            self._stop_unrecorded(handle)
            return
        log.warning("job %s attempt %d: watchdog pid %d is gone; stopping the job from the daemon",
                    handle.job_id, handle.attempt, handle.watchdog_pid)
        signal_job(handle, signal.SIGTERM)
        end = time.monotonic() + self._grace_s
        while job_processes(handle) and time.monotonic() < end:
            time.sleep(0.05)
        end = time.monotonic() + self._kill_timeout_s
        while job_processes(handle):
            signal_job(handle, signal.SIGKILL)
            if time.monotonic() > end:
                log.warning("job %s attempt %d: processes survive SIGKILL", handle.job_id, handle.attempt)
                return
            time.sleep(0.02)

    def extend_deadline(self, handle: RunHandle, deadline_monotonic: float | None) -> None:
        """Move the watchdog's deadline (a ``time.monotonic()`` value; None removes it).

        A deadline that cannot be written (a full disk) goes to the watchdog as SIGUSR1 instead:
        it renews the lease from now for its ``renew_s`` (kept in memory), so a full state disk
        never ends a job its daemon still renews. Logged once per attempt, never raised.
        """
        try:
            self._write_deadline(handle.run_dir, deadline_monotonic)
            self._unwritten.discard((handle.job_id, handle.attempt))
            return
        except OSError as e:
            problem = e
        renewed = deadline_monotonic is not None and signal_process(
            handle.watchdog_pid, handle.watchdog_create_time, handle.watchdog_start_ticks, signal.SIGUSR1)
        key = (handle.job_id, handle.attempt)
        if key not in self._unwritten:
            self._unwritten.add(key)
            log.warning("job %s attempt %d: cannot write the deadline (%s)%s", handle.job_id, handle.attempt,
                        problem, "; renewed through a signal to its watchdog" if renewed else "")

    # ---------------------------------------------------------------------- private

    def close(self) -> None:
        """Stop the zygote, if any (blocking, briefly); running watchdogs go on."""
        if self.zygote is not None:
            self.zygote.close()

    def _await_start(
        self, job_id: str, attempt: int, run_dir: Path, launcher_poll: Callable[[], int | None],
        pause: Callable[[], None], lost: Callable[[], bool] = lambda: False,
    ) -> RunHandle | None:
        """Wait for the job's start; None when ``lost()`` says no watchdog started or ever will."""
        what = f"job {job_id} attempt {attempt}"
        end = time.monotonic() + self._start_timeout_s
        while True:
            if (run_dir / JOB_FILE).exists():
                handle = self.adopt(run_dir)
                if handle is not None and handle.job_pid is not None:
                    return handle
            status = exit_status(run_dir)
            if status is not None:
                raise RunnerError(f"{what} did not start: {status.detail}", status)
            handle = self.adopt(run_dir)
            if handle is not None and not is_alive(
                handle.watchdog_pid, handle.watchdog_create_time, handle.watchdog_start_ticks
            ):
                if (run_dir / JOB_FILE).exists() or (run_dir / EXIT_FILE).exists():
                    continue  # it finished everything between our two looks
                killed = self._stop_unrecorded(handle)
                raise RunnerError(f"{what}: the watchdog died before it recorded the job's start"
                                  f"{f' (the job it had spawned was killed: pids {killed})' if killed else ''}; "
                                  f"{_log_tail(run_dir / WATCHDOG_LOG)}")
            code = launcher_poll()
            if handle is None and lost():
                return None
            if handle is None and code not in (None, 0):
                raise RunnerError(f"{what}: the watchdog exited with code {code}; "
                                  f"{_log_tail(run_dir / WATCHDOG_LOG)}")
            if time.monotonic() > end:
                self._abandon(run_dir)
                raise RunnerError(f"{what}: the watchdog did not start the job within "
                                  f"{self._start_timeout_s:g} s")
            pause()

    def _stop_unrecorded(self, handle: RunHandle) -> list[int]:
        """SIGKILL what a watchdog that died before it wrote ``job.json`` may have started: the
        processes carrying the attempt's ``GPULAYER_JOB_ID``/``GPULAYER_ATTEMPT``
        (:func:`~gpulayerd.runs.process.job_processes`), until two looks 50 ms apart find none
        (a job still between fork and exec carries the watchdog's environment for an instant), at
        most ``kill_timeout_s``. Blocking (reads every process's environment). Returns the pids
        killed: an attempt recorded as never started must not run beside its retry.
        """
        killed: list[int] = []
        end = time.monotonic() + self._kill_timeout_s
        quiet = 0
        while quiet < 2 and time.monotonic() < end:
            found = job_processes(handle)
            quiet = 0 if found else quiet + 1
            for proc in found:
                with contextlib.suppress(sysinfo.Error):
                    proc.kill()
                    killed.append(proc.pid)
            time.sleep(0.05)
        if killed:
            log.warning("job %s attempt %d: its watchdog died before it recorded the start; killed the job's "
                        "processes %s", handle.job_id, handle.attempt, sorted(set(killed)))
        return sorted(set(killed))

    def _abandon(self, run_dir: Path) -> None:
        """Kill a watchdog that failed to start its job in time, and the job if it has one.

        Raises:
            RunnerError: the give-up could not be written (no inode left): a watchdog may still
                start the attempt later.
        """
        try:
            if abandon_run_dir(run_dir):
                return  # the watchdog had not started: now it never will
        except OSError as e:
            raise RunnerError(f"cannot give up on {run_dir} ({e.strerror or e}): a watchdog may still start it") from e
        handle = self.adopt(run_dir)
        if handle is None:
            return
        signal_process(handle.watchdog_pid, handle.watchdog_create_time,
                        handle.watchdog_start_ticks, signal.SIGKILL)
        handle = self.adopt(run_dir)
        if handle is not None and handle.job_pgid is not None:
            signal_job(handle, signal.SIGKILL)

    def _write_deadline(self, run_dir: Path, deadline_monotonic: float | None) -> None:
        """Write the ``deadline`` file (it overrides launch.json's first deadline; ``none``: no deadline)."""
        write_file(run_dir / DEADLINE_FILE, "none\n" if deadline_monotonic is None else f"{deadline_monotonic!r}\n")

    def _watchdog_env(self) -> dict[str, str]:
        """The daemon's environment, with this gpulayerd importable by the watchdog."""
        env = dict(os.environ)
        extra = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(_PACKAGE_ROOT) + (os.pathsep + extra if extra else "")
        return env


def _open_pidfd(handle: RunHandle) -> int | None:
    """A pidfd that becomes readable when the watchdog exits; None where unavailable."""
    if sys.platform != "linux":
        return None
    try:
        fd = os.pidfd_open(handle.watchdog_pid)
    except OSError:
        return None
    if not is_alive(handle.watchdog_pid, handle.watchdog_create_time, handle.watchdog_start_ticks):
        os.close(fd)
        return None
    return fd


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _log_tail(path: Path, limit_bytes: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit_bytes:].decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return f"{path} is empty"  # (created with its first line)
    except OSError:
        return f"{path} cannot be read"
    return f"{path}: {data}" if data else f"{path} is empty"


def _int_or(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default

