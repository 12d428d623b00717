"""Notifications when jobs start or end (``--notify end,fail,start``): the owner runs the user's notify
command as the user.

The command comes with the job (the CLI reads ``notify`` from the user's own config file at submit,
:mod:`gpulayerd.cli.user_config`, into ``policy.notify_command``). It runs as the job's user (the same
account rule as the job's, :func:`gpulayerd.runs.launch.resolve_job_user`; never as root), in the
user's home, with a clean environment: ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``LANG``, the
submitter's ``PATH`` and ``GPULAYER_JOB_ID``, ``GPULAYER_JOB_NAME``, ``GPULAYER_JOB_STATE``,
``GPULAYER_EXIT_CODE`` ("" when there is none), ``GPULAYER_EVENT`` (``start``, ``end`` or ``fail``).
It is stopped after :data:`TIMEOUT_S`; at most :data:`AT_ONCE` run at once per user (at most
:data:`WAITING` more wait, the rest are dropped and logged). Its failure is logged and never
changes the job. An array notifies once, when its last task ended (its own row's end), unless
``notify_tasks``: then each task does too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping

from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.signals import Signals
from gpulayerd.core.protocol.claims import TERMINAL, JobRecord, JobStatus
from gpulayerd.models import JobSpec
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.launch import resolve_job_user
from gpulayerd.runs.status import RunnerError
from gpulayerd.store import JobRow

__all__ = ["AT_ONCE", "TIMEOUT_S", "WAITING", "Notifier", "notify_env"]

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
"""Seconds a notify command may run (then its process group is killed)."""

AT_ONCE = 4
"""Notify commands of one user running at once."""

WAITING = 64
"""Notify commands of one user waiting for a turn; more are dropped (and logged)."""

FAILED = frozenset({JobStatus.FAILED, JobStatus.TIMEOUT, JobStatus.LOST})
"""The ends ``fail`` notifies of (a cancel is the user's own doing, a rejection is answered at submit)."""

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def notify_env(row: JobRow, event: str, user: JobUser | None, path: str | None) -> dict[str, str]:
    """The notify command's whole environment (nothing of the daemon's own)."""
    env = {"LANG": "C.UTF-8", "PATH": path or SAFE_PATH, "GPULAYER_JOB_ID": row.id,
           "GPULAYER_JOB_NAME": row.name or "", "GPULAYER_JOB_STATE": row.status.value,
           "GPULAYER_EXIT_CODE": "" if row.exit_code is None else str(row.exit_code), "GPULAYER_EVENT": event}
    if user is not None:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name, SHELL=user.shell)
    return env


class Notifier:
    """Runs notify commands on a job's start or end (see the module).

    Args:
        jobs: the owner's jobs (their rows and specs).
        signals: spawns the commands as background tasks (cancelled when the daemon stops).
        mode: the daemon's mode (``personal`` or ``system``): whose account a job's user is.
        allow_root_jobs: the daemon's setting (notify commands of root never run anyway).
    """

    def __init__(self, *, jobs: OwnedJobs, signals: Signals, mode: str, allow_root_jobs: bool) -> None:
        self._jobs = jobs
        self._signals = signals
        self._mode = mode
        self._allow_root = allow_root_jobs
        self._turns: dict[str, asyncio.Semaphore] = {}
        self._waiting: dict[str, int] = {}
        self.ran = 0
        """Notify commands started (for tests and diagnostics)."""

    def persisted(self, rec: JobRecord) -> None:
        """A write of the job's state succeeded (``rec``: as written): notify if the job asks for it."""
        if rec.status is JobStatus.RUNNING:
            event = "start"
        elif rec.status in TERMINAL and rec.status is not JobStatus.REJECTED:
            event = "end"
        else:
            return
        spec = self._jobs.cached_spec(rec.job_id)
        if spec is not None and not spec.policy.notify:
            return  # the common case, decided without a read
        self._signals.spawn(self._notify(rec.job_id, rec.status, event), name=f"notify-{rec.job_id}")

    async def _notify(self, job_id: str, status: JobStatus, event: str) -> None:
        row = await self._jobs.get(job_id)
        spec = await self._jobs.spec_of(job_id) if row is not None else None
        if row is None or spec is None:
            return
        events = set(spec.policy.notify)
        if event == "end" and status in FAILED and "fail" in events:
            event = "fail"  # one notification per end, the more telling word
        if event not in events:
            return
        if spec.array_task is not None and not spec.policy.notify_tasks:
            return  # the array's own row notifies once, when its last task ended
        user_key = spec.user or ""
        if self._waiting.get(user_key, 0) >= WAITING:
            log.warning("job_id=%s: notify command of %s dropped: %d already wait", job_id, user_key or "?", WAITING)
            return
        self._waiting[user_key] = self._waiting.get(user_key, 0) + 1
        turn = self._turns.setdefault(user_key, asyncio.Semaphore(AT_ONCE))
        try:
            await turn.acquire()
        finally:
            self._waiting[user_key] -= 1
        try:
            await self._run(row, spec, event)
        finally:
            turn.release()

    async def _run(self, row: JobRow, spec: JobSpec, event: str) -> None:
        try:
            user = await asyncio.to_thread(resolve_job_user, spec.user, "system" if self._mode == "system"
                                           else "personal", self._allow_root)
        except RunnerError as e:
            log.warning("job_id=%s: notify command not run: %s", row.id, e)
            return
        uid = user.uid if user is not None else os.geteuid()
        if uid == 0:
            log.warning("job_id=%s: notify command not run: notify commands never run as root", row.id)
            return
        env = notify_env(row, event, user, spec.path)
        kwargs: Mapping[str, object] = {} if user is None or user.uid == os.geteuid() else {
            "user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
        cwd = user.home if user is not None and os.path.isdir(user.home) else "/"
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.policy.notify_command, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                **kwargs)  # type: ignore[arg-type]
        except (OSError, ValueError) as e:
            log.warning("job_id=%s: notify command %r could not start: %s", row.id, spec.policy.notify_command[0], e)
            return
        self.ran += 1
        assert proc.stderr is not None
        try:  # the first 4 KB of its standard error, for the log (more waits on a full pipe: the timeout)
            err, _ = await asyncio.wait_for(asyncio.gather(proc.stderr.read(4096), proc.wait()), TIMEOUT_S)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            log.warning("job_id=%s: notify command stopped after %g s", row.id, TIMEOUT_S)
            return
        if proc.returncode != 0:
            first = err.decode("utf-8", "replace").strip().splitlines()[:1]
            log.warning("job_id=%s: notify command exited %s%s", row.id, proc.returncode,
                        f": {first[0][:300]!r}" if first else "")
