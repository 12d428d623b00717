"""Per-job watchdog: starts one job attempt, enforces its deadline, records how it ended.

Run as ``python -m gpulayerd.runs.watchdog RUN_DIR`` by
:class:`gpulayerd.runs.runner.Runner`; it plays the part of Slurm's slurmstepd or
HTCondor's starter. It forks once at start and the first process exits, so the daemon
only ever waits for a short-lived child and the watchdog outlives the daemon (a daemon
killed with -9 and restarted re-adopts it).

Files in RUN_DIR (:mod:`gpulayerd.runs.layout`; JSON written atomically):

- ``launch.json`` (read): ``argv``, ``env`` (the job's full environment), ``cwd``,
  ``grace_s``, ``poll_interval_s``, ``kill_timeout_s``, ``lock_fds`` (inherited open
  file descriptors holding device locks; closed only after the job and every process
  it left behind are dead), ``user`` (the account the job runs as: ``name``, ``uid``,
  ``gid``, ``groups``, ``home``, ``shell``; null or missing runs it as the watchdog's
  own account), ``log_cap_bytes`` (the most of each output stream kept; null keeps all),
  ``exit_keep_s`` (how long an exit status that cannot be written is kept; see below),
  ``deadline`` (the first deadline, as the ``deadline`` file below; null or missing: none),
  ``time_limit_s`` (the job's time limit, seconds from its start; null: none), ``warn_signal`` and
  ``warn_at_s`` (the signal's name and when, seconds from the start, the job is warned before it).
- ``watchdog.json`` (written first, exclusively: it is the claim, and a daemon that wrote
  ``{"abandoned": true}`` there first keeps the job from starting): ``pid``,
  ``create_time`` (psutil), ``start_ticks``, ``started_at``.
- ``job.json``: ``pid``, ``pgid`` (= pid: the job leads its own session), ``create_time``,
  ``start_ticks``, ``started_at`` (wall clock), ``spawn_s`` (seconds the start took: fork,
  account switch, chdir, exec).
- ``deadline`` (read every ``poll_interval_s``): a ``time.monotonic()`` value as text, or
  ``none``; CLOCK_MONOTONIC is one clock for every process of a machine. Missing means the
  one in ``launch.json``. A renewal the daemon could not write (its disk is full) comes as
  SIGUSR1 instead: the deadline is then at least the signal's time plus ``renew_s`` (launch.json:
  the lease's length), kept in memory.
- ``cancel_signal`` (written by the daemon before it sends SIGTERM to cancel): the name of the
  signal the job gets first instead of SIGTERM (``gpulayer cancel --signal``).
- ``exit.json`` (written last): ``exit_code`` (negative N: killed by signal N, as
  ``Popen.returncode``; None if unknown), ``reason`` (``exited``, ``cancelled``,
  ``deadline``, ``timeout``, ``start_failed`` or ``error``), ``detail`` (one sentence for people),
  ``killed_by_watchdog``, ``ended_at`` (wall clock). When it cannot be written (a full
  disk), the watchdog stays alive with its device locks, retries with backoff and serves
  the record to the daemon on an abstract socket (:mod:`.exitnote`) until the file is
  written or the daemon confirms it recorded the end (or ``exit_keep_s`` passed).
- ``stdout.log`` and ``stderr.log``: the job's output (appended), copied from pipes by the
  watchdog up to ``log_cap_bytes`` each (:mod:`.logcopy`), each created with its first byte;
  ``watchdog.log``: ours (a job's normal start and end are logged at DEBUG: the truth is in
  ``job.json`` and ``exit.json``), created with its first line by a watchdog forked by the zygote
  and up front for one started with ``python -m`` (its standard streams).

With a ``user``, the watchdog (which stays root: it must signal and reap the job) checks
right before the start that the uid still names that account, then starts the job with
its supplementary groups, gid and uid (setgroups, setgid, setuid in the child) and only
then enters ``cwd``, so the working directory is entered with the user's rights (a
directory the user cannot enter fails the start, even though root could).

SIGTERM or SIGINT to the watchdog cancels the job. Stopping a job means SIGTERM to its
process group and to every other descendant, ``grace_s`` for them to exit, then SIGKILL
until none is left. The time limit is the watchdog's own (it holds across a daemon killed
with -9): at ``warn_at_s`` the warning signal goes out once the same way, and at
``time_limit_s`` the job is stopped as a cancel stops it (SIGTERM unless SIGTERM was the
warning: each signal once per process), its end ``timeout``; a job that exits after its
warning ended by its time limit too (``timeout``, its own exit code kept). Descendants
matter because a job may start processes in sessions of their own (torchrun starts every
worker with ``start_new_session=True``); on Linux the watchdog is a child subreaper, so such
processes stay its descendants even when their parent dies, and it reaps them.

Only the standard library and psutil are imported here (and through :mod:`.layout` and
:mod:`.process`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from gpulayerd.gpu.command import Popen, SubprocessError, TimeoutExpired
from gpulayerd.host import sysinfo
from gpulayerd.runs import preflight
from gpulayerd.runs.account import check_still_maps
from gpulayerd.runs.exitnote import KEEP_S, ExitNote, retry_delays, socket_name
from gpulayerd.runs.jobstart import popen, signal_number, start_failure
from gpulayerd.runs.launchfile import LaunchFile, read_deadline
from gpulayerd.runs.layout import (
    CANCEL_SIGNAL_FILE,
    DEADLINE_FILE,
    EXIT_FILE,
    JOB_FILE,
    LAUNCH_FILE,
    STDERR_LOG,
    STDOUT_LOG,
    claim_run_dir,
    write_json,
)
from gpulayerd.runs.logcopy import CappedLog
from gpulayerd.runs.process import (
    ProcessRecord,
    become_subreaper,
    direct_children,
    group_members,
    has_children,
    libc,
    record_of,
)
from gpulayerd.runs.waiting import name_process, readable

__all__ = ["main", "preload", "prepare", "supervise"]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- entry


def main(argv: Sequence[str] | None = None) -> int:
    """Detach, then supervise the job described by ``RUN_DIR/launch.json``.

    Returns:
        0 once ``exit.json`` is written or the daemon recorded the end (whatever the job
        did); 1 if neither happened within ``exit_keep_s``;
        2 for a usage error.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpulayerd.runs.watchdog RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0]).resolve()
    # The process the daemon started exits at once: the daemon reaps it within
    # milliseconds and never holds a long-lived child (no zombie, no Popen to keep),
    # and a watchdog it started looks exactly like one it re-adopts after a restart.
    if os.fork() != 0:
        os._exit(0)
    name_process("gpulayer-wd")
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO,
        format="%(asctime)s watchdog[%(process)d] %(levelname)s %(message)s",
    )
    return _Watchdog(run_dir).run()


_PREPARED: dict[int, tuple[bool, ProcessRecord | None]] = {}  # pid -> (subreaper, own record)


def preload() -> None:
    """Load once what every watchdog needs (the C library's handle, the boot time that process
    records are computed from): the zygote calls it before it forks, so no watchdog pays for it."""
    libc()
    record_of(os.getpid())


def prepare() -> None:
    """Do ahead of a start what concerns only this process: become a child subreaper and read its own
    process record. A spare watchdog (:mod:`.zygote`) calls it before it waits for its start."""
    _PREPARED[os.getpid()] = (become_subreaper(), record_of(os.getpid()))


def supervise(run_dir: Path, *, lock_fds: Sequence[int] | None = None, notify_fd: int | None = None) -> int:
    """Be the watchdog of ``run_dir`` in this (already detached) process: :mod:`.zygote`'s entry.

    Args:
        run_dir: the attempt's run directory (checked by the caller).
        lock_fds: the device lock descriptors as this process holds them (they replace
            ``launch.json``'s ``lock_fds``, the daemon's numbers); closed at the end.
        notify_fd: closed as soon as ``job.json`` or ``exit.json`` is written (or the
            watchdog gives up), so the daemon waits on it instead of polling.

    Returns:
        As :func:`main`.
    """
    return _Watchdog(run_dir, lock_fds, notify_fd).run()


# -------------------------------------------------------------------------- private


class _Watchdog:
    """One job's supervisor; all state of the watchdog process."""

    def __init__(self, run_dir: Path, lock_fds: Sequence[int] | None = None, notify_fd: int | None = None) -> None:
        self.run_dir = run_dir
        self.lock_fds = None if lock_fds is None else list(lock_fds)
        self.notify_fd = notify_fd
        self.cancel_requested = False
        self.killed = False
        self.subreaper = False
        self.proc: Popen[bytes] | None = None
        self.wake_fd = -1
        self.logs: list[CappedLog] = []
        self.keep_s = KEEP_S
        self.renewed_at: float | None = None  # SIGUSR1: the daemon renewed the lease but could not write it
        self.warned: signal.Signals | None = None  # the time limit's warning, once sent

    def run(self) -> int:
        exit_code: int | None = None
        reason, detail = "error", ""
        lock_fds: list[int] = list(self.lock_fds or [])
        claimed = False
        try:
            self._install_signals()
            prepared = _PREPARED.pop(os.getpid(), None)
            self.subreaper, me = prepared or (become_subreaper(), record_of(os.getpid()))
            if me is None:
                raise RuntimeError("cannot read the watchdog's own process record")
            if not claim_run_dir(self.run_dir, {**me.to_json(), "started_at": time.time()}):
                reason, detail = "abandoned", "the daemon gave up on this attempt before its watchdog started"
                return 0
            claimed = True
            launch = LaunchFile.load(self.run_dir / LAUNCH_FILE)
            lock_fds = launch.lock_fds if self.lock_fds is None else lock_fds
            self.keep_s = launch.exit_keep_s
            exit_code, reason, detail = self._run_job(launch)
        except BaseException as e:  # never end without exit.json, once the attempt is ours
            if not claimed:
                # The run directory is not ours (a full disk kept the claim from being written):
                # nothing was started and nothing is recorded; the daemon sees no claim and starts
                # the attempt another way, or records why it cannot.
                log.exception("watchdog failed before it claimed %s: not starting the job", self.run_dir)
                return 1
            log.exception("watchdog failed")
            reason, detail = "error", f"watchdog failed: {type(e).__name__}: {e}"
            with contextlib.suppress(BaseException):
                self._emergency_kill()
            if self.proc is not None:
                exit_code = self.proc.returncode
        finally:
            self._close_logs()
        log.log(logging.DEBUG if reason == "exited" else logging.INFO,
                "job ended: exit_code=%s reason=%s (%s)", exit_code, reason, detail)
        try:
            # The device locks are kept until the end is recorded: until then the daemon counts
            # the devices as this attempt's.
            return self._record_exit({
                "exit_code": exit_code, "reason": reason, "detail": detail,
                "killed_by_watchdog": self.killed, "ended_at": time.time(),
            })
        finally:
            self._notify()
            for fd in lock_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _notify(self) -> None:
        """Close the notify pipe (the daemon waits on it): ``job.json`` or ``exit.json`` is written."""
        fd, self.notify_fd = self.notify_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _record_exit(self, record: Mapping[str, object]) -> int:
        """Write ``exit.json``; while that fails (a full disk), keep ``record`` for the daemon.

        Retries with backoff and serves the record on an abstract socket (:mod:`.exitnote`)
        until the file is written or the daemon confirms it recorded the end (0), or
        ``exit_keep_s`` passed (1: the attempt will be seen as gone).
        """
        path = self.run_dir / EXIT_FILE
        try:
            write_json(path, record)
            return 0
        except OSError as e:
            log.warning("cannot write %s (%s): keeping the exit status until it is recorded", EXIT_FILE, e)
        finally:
            self._notify()
        me = record_of(os.getpid())
        note = ExitNote(None if me is None else socket_name(me.pid, me.start_ticks), record)
        end = time.monotonic() + self.keep_s
        try:
            for delay in retry_delays():
                note.serve(min(delay, max(end - time.monotonic(), 0.0)))
                if note.recorded:
                    log.info("the daemon recorded the job's end; %s is not written", EXIT_FILE)
                    return 0
                with contextlib.suppress(OSError):
                    write_json(path, record)
                    log.info("%s written after all", EXIT_FILE)
                    return 0
                if time.monotonic() > end:
                    log.error("%s still cannot be written after %.0f s and nobody asked for the exit status: "
                              "giving up", EXIT_FILE, self.keep_s)
                    return 1
        finally:
            note.close()
        return 1  # (retry_delays never ends)

    # ---------------------------------------------------------------- the job's life

    def _run_job(self, launch: LaunchFile) -> tuple[int | None, str, str]:
        program = launch.argv[0]
        user = launch.user
        if user is not None:
            problem = check_still_maps(user)
            if problem is None and user.uid != os.geteuid() and os.geteuid() != 0:
                problem = f"the watchdog runs as uid {os.geteuid()} and cannot start a job as {user.name!r}"
            if problem is not None:
                return None, "start_failed", problem
        if launch.preflight is not None:
            failed = self._preflight(launch, launch.preflight)
            if failed is not None:
                return failed
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.logs = [CappedLog(out_r, self.run_dir / STDOUT_LOG, launch.log_cap_bytes),
                     CappedLog(err_r, self.run_dir / STDERR_LOG, launch.log_cap_bytes)]
        spawn_start = time.monotonic()
        try:
            self.proc = popen(launch, out_w, err_w)
        except OSError as e:
            return start_failure(e, program, launch.cwd)
        except SubprocessError:  # only the chdir runs in preexec_fn
            assert user is not None
            return None, "start_failed", f"working directory not usable: {user.name} cannot enter {launch.cwd}"
        finally:
            os.close(out_w)
            os.close(err_w)
        proc = self.proc
        spawn_s = time.monotonic() - spawn_start  # fork, account switch, chdir, exec: bench/users.py reads it
        job = record_of(proc.pid)
        ticks = None if job is None else job.start_ticks
        create_time = None if job is None else job.create_time
        write_json(
            self.run_dir / JOB_FILE,
            {"pid": proc.pid, "pgid": proc.pid, "create_time": create_time, "start_ticks": ticks,
             "started_at": time.time(), "spawn_s": spawn_s},
        )
        self._notify()
        log.debug("started job pid %d: %s", proc.pid, launch.argv)
        reason, detail = self._supervise(proc, launch, spawn_start)
        if reason != "exited":
            self.killed = True
            first = self._first_signal(reason)
            log.info("%s: %s to the job, SIGKILL after %.1f s", detail, first.name if first else "no signal",
                     launch.grace_s)
            self._terminate(proc, launch.grace_s, first)
        elif self.warned is not None:  # it exited after its time limit's warning: the limit ended it
            reason, detail = "timeout", f"{detail}, after its time limit's warning ({self.warned.name})"
        elif self._targets(proc.pid):
            log.info("job exited and left processes behind: stopping them")
            self._terminate(proc, launch.grace_s)
        self._kill_leftovers(proc, launch.kill_timeout_s)
        if proc.returncode is None:
            detail += "; the job could not be reaped (uninterruptible?)"
        return proc.returncode, reason, detail

    def _preflight(self, launch: LaunchFile, check: preflight.PreflightCheck) -> tuple[int | None, str, str] | None:
        """Run the pre-flight check (meanwhile the attempt's process in ``job.json``); None: it passed."""
        try:
            self.proc = proc = preflight.begin(self.run_dir, check, launch.env, launch.user)
        except OSError as e:
            return None, "preflight_failed", f"{check.frameworks[0]}: cannot start {check.python}: {e}"
        self._notify()
        reason, detail = self._supervise(proc, dataclasses.replace(
            launch, time_limit_s=check.timeout_s, warn_at_s=check.timeout_s, warn_signal="TERM"), time.monotonic())
        self.warned = None
        if reason != "exited":
            self._terminate(proc, launch.grace_s, None if reason == "timeout" else self._first_signal(reason))
        self._kill_leftovers(proc, launch.kill_timeout_s)
        self.proc = None
        if reason == "timeout":
            return None, preflight.PREFLIGHT_STOPPED, f"{check.frameworks[0]}: the check took over {check.timeout_s:g}s"
        if reason != "exited":
            self.killed = True
            return proc.returncode, reason, f"{detail} (during the pre-flight check)"
        if proc.returncode == 0:
            return None
        why, framework, line = preflight.failure(self.run_dir / preflight.PREFLIGHT_LOG, proc.returncode, check)
        return None, why, f"{framework}: {line}"

    def _first_signal(self, reason: str) -> signal.Signals | None:
        """The first signal of a stop for ``reason``: SIGTERM, or a cancel's ``cancel_signal``;
        None when the time limit's warning was SIGTERM already (each signal once per process)."""
        if reason == "cancelled":
            with contextlib.suppress(OSError, ValueError):
                return signal_number((self.run_dir / CANCEL_SIGNAL_FILE).read_text(encoding="utf-8").strip())
        return None if reason == "timeout" and self.warned is signal.SIGTERM else signal.SIGTERM

    def _check_limit(self, proc: Popen[bytes], launch: LaunchFile, started: float, now: float) -> float | None:
        """Send the time limit's warning once it is due; the seconds until the next step of the limit
        (the warning, then the limit: 0 once it is reached), or None without a limit."""
        if launch.time_limit_s is None:
            return None
        warn_at = started + (launch.warn_at_s if launch.warn_at_s is not None else launch.time_limit_s)
        if self.warned is None and now >= warn_at:
            self.warned = signal_number(launch.warn_signal)
            log.info("job %d: %s, %.1f s before its time limit", proc.pid, self.warned.name,
                     started + launch.time_limit_s - now)
            self._signal_all(proc.pid, self.warned)
        step = started + launch.time_limit_s if self.warned is not None else warn_at
        return max(step - now, 0.0)

    def _supervise(self, proc: Popen[bytes], launch: LaunchFile, started: float) -> tuple[str, str]:
        """Wait until the job exits, is cancelled, passes its deadline or its time limit (``started``:
        its start, monotonic s); say which.

        The deadline is the ``deadline`` file's (launch.json's while there is none), moved later by a
        SIGUSR1 from the daemon: a renewal it could not write (the state disk is full) renews the
        lease from the moment the signal came, for ``renew_s``. A full disk never ends a job whose
        daemon still renews it.
        """
        deadline = launch.deadline
        while proc.poll() is None:
            self._reap_orphans(proc.pid)
            deadline = read_deadline(self.run_dir / DEADLINE_FILE, deadline, launch.deadline)
            if deadline is not None and self.renewed_at is not None and launch.renew_s is not None:
                deadline = max(deadline, self.renewed_at + launch.renew_s)
            now = time.monotonic()
            if self.cancel_requested:
                return "cancelled", "cancelled: the watchdog was asked to stop the job"
            if deadline is not None and now > deadline:
                return "deadline", "deadline passed: the owner's lease was not renewed"
            to_limit = self._check_limit(proc, launch, started, now)
            if to_limit == 0.0:
                return "timeout", f"time limit {launch.time_limit_s:g} s reached"
            wait_s = launch.poll_interval_s if to_limit is None else min(launch.poll_interval_s, to_limit + 0.001)
            if deadline is not None:
                wait_s = min(wait_s, deadline - now + 0.001)
            self._sleep(wait_s)
        code = proc.returncode
        if code < 0:  # Popen's way of saying a signal ended it: say which, as a shell would
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return "exited", f"the job was killed by signal {-code} ({name})"
        return "exited", f"the job exited with code {code}"

    def _terminate(self, proc: Popen[bytes], grace_s: float, first: signal.Signals | None = signal.SIGTERM) -> None:
        """Send ``first`` (SIGTERM; None: nothing, it was sent already) to the job's processes; wait up
        to ``grace_s`` for all of them to exit."""
        if first is not None:
            self._signal_all(proc.pid, first)
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            if proc.poll() is None:
                self._reap_orphans(proc.pid)
            else:
                self._reap_all()
                if not self._targets(proc.pid):
                    return
            self._sleep(min(0.1, max(end - time.monotonic(), 0.0)))

    def _kill_leftovers(self, proc: Popen[bytes], kill_timeout_s: float) -> None:
        """SIGKILL the job and whatever it left until nothing is left.

        "Nothing left", as a subreaper (Linux): the job is reaped and this process has no child at
        all. Every descendant whose parent dies is re-parented here, so a chain that forks and exits
        faster than any scan of ``/proc`` still ends up a child: each round kills the direct children
        (by pid: an unreaped child's pid cannot be reused) and the job's group. Elsewhere: a scan of
        the descendants finds none. After ``kill_timeout_s`` it warns and goes on trying for up to
        ten times as long, holding the device locks meanwhile.
        """
        start = time.monotonic()
        warned = False
        while True:
            if proc.poll() is not None:
                self._reap_all()
                if not self._anything_left(proc.pid):
                    return
            self._signal_all(proc.pid, signal.SIGKILL)
            for pid in direct_children():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if proc.poll() is None:
                with contextlib.suppress(TimeoutExpired):
                    proc.wait(timeout=0.05)
            else:
                self._reap_all()
            waited = time.monotonic() - start
            if waited > kill_timeout_s and not warned:
                warned = True
                log.warning("processes of job %d still alive after SIGKILL for %.1f s: %s; still trying",
                            proc.pid, waited, direct_children() or [p.pid for p in self._targets(proc.pid)])
            if waited > 10 * kill_timeout_s:
                log.error("processes of job %d outlive %.1f s of SIGKILL: giving up on %s", proc.pid, waited,
                          direct_children())
                return
            self._sleep(0.005)

    def _anything_left(self, pgid: int) -> bool:
        """Whether any process of the job is left (the job itself reaped)."""
        if self.subreaper:
            return has_children() or bool(group_members(pgid))
        return bool(self._targets(pgid))

    def _emergency_kill(self) -> None:
        """The watchdog cannot supervise any more: kill the job at once rather than leave it loose."""
        if self.proc is not None:
            self._signal_all(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutExpired):
                self.proc.wait(timeout=1.0)

    # ------------------------------------------------------------------- processes

    def _targets(self, pgid: int) -> list[sysinfo.Process]:
        """Running processes of the job: its process group and every descendant of ours."""
        found = {p.pid: p for p in group_members(pgid)}
        if not has_children():
            return list(found.values())  # no child, so no descendant: no scan of /proc
        with contextlib.suppress(sysinfo.Error):
            for child in sysinfo.Process().children(recursive=True):
                with contextlib.suppress(sysinfo.Error):
                    if child.status() != sysinfo.STATUS_ZOMBIE:
                        found[child.pid] = child
        return list(found.values())

    def _signal_all(self, pgid: int, sig: signal.Signals) -> None:
        """Send ``sig`` once to every process of the job: its process group (one ``killpg``), then
        each descendant of ours OUTSIDE that group (a process that started a session or group of its
        own, as torchrun's workers do). A process in the group never gets it twice: a job whose
        SIGTERM handler saves a checkpoint is not interrupted by a second SIGTERM."""
        outside: list[sysinfo.Process] = []
        if has_children():
            with contextlib.suppress(sysinfo.Error):
                for child in sysinfo.Process().children(recursive=True):
                    with contextlib.suppress(OSError):  # gone meanwhile: nothing to signal
                        if os.getpgid(child.pid) != pgid:
                            outside.append(child)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for child in outside:
            with contextlib.suppress(sysinfo.Error):
                child.send_signal(sig)  # (psutil checks it is still the same process)

    def _reap_orphans(self, job_pid: int) -> None:
        """Reap exited processes adopted as subreaper, leaving the job itself to Popen."""
        if not self.subreaper:
            return
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == job_pid:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def _reap_all(self) -> None:
        """Reap every exited child (only once the job has been reaped by Popen)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # --------------------------------------------------------------------- signals

    def _install_signals(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self.wake_fd = read_fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_cancel)
        signal.signal(signal.SIGINT, self._on_cancel)
        signal.signal(signal.SIGUSR1, self._on_renewed)
        # A Python-level handler makes SIGCHLD write to the wakeup fd: a job's exit wakes us.
        signal.signal(signal.SIGCHLD, _ignore_signal)

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        self.cancel_requested = True

    def _on_renewed(self, signum: int, frame: FrameType | None) -> None:
        self.renewed_at = time.monotonic()

    def _sleep(self, timeout_s: float) -> None:
        """Sleep until a signal arrives or ``timeout_s`` passes, copying the job's output meanwhile."""
        end = time.monotonic() + max(timeout_s, 0.0)
        while True:
            pipes = {c.fd: c for c in self.logs if c.open}
            ready = readable([self.wake_fd, *pipes], max(end - time.monotonic(), 0.0))
            for fd in ready:
                if fd in pipes:
                    pipes[fd].pump()
            if self.wake_fd in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_fd, 512):
                        pass
                return
            if not ready or time.monotonic() >= end:
                return

    def _close_logs(self) -> None:
        for capped in self.logs:
            with contextlib.suppress(OSError):
                capped.close()


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    return None


if __name__ == "__main__":
    sys.exit(main())
