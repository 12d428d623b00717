"""How the watchdog starts a job (:func:`popen`, as its user, in a session of its own) and what a
start that failed records (:func:`start_failure`); the signals of a time limit and a cancel
(:func:`signal_number`). Split from :mod:`.watchdog` (the standard library and psutil only)."""

from __future__ import annotations

import functools
import os
import signal

from gpulayerd.gpu.command import DEVNULL, Popen
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.launchfile import LaunchFile

__all__ = ["popen", "signal_number", "start_failure"]


def signal_number(name: str) -> signal.Signals:
    """This machine's number of the signal ``name`` (``USR1``; the numbers differ between Linux and macOS).

    Raises:
        ValueError: no such signal here.
    """
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise ValueError(f"no signal {name!r} on this machine") from None


def popen(launch: LaunchFile, out: int, err: int) -> Popen[bytes]:
    """Start the job (as ``launch.user`` when it names an account to switch to).

    CPython enters ``cwd`` before it switches ids; for a job of another account the
    directory is entered afterwards instead, in ``preexec_fn`` (the watchdog runs no
    threads, so ``preexec_fn`` is safe here), so that it is entered with the user's rights.
    """
    user = launch.user
    if user is None or (user.uid == os.geteuid() and os.geteuid() != 0) or _is_current(user):
        # Nothing to switch: ``cwd`` is entered with the same rights, and without ids to set or a
        # ``preexec_fn`` CPython starts the job with vfork (no copy of the watchdog's memory).
        return Popen(launch.argv, env=launch.env, cwd=launch.cwd, stdin=DEVNULL,
                                stdout=out, stderr=err, start_new_session=True, close_fds=True)
    cwd = launch.cwd
    return Popen(
        launch.argv, env=launch.env, stdin=DEVNULL, stdout=out, stderr=err,
        start_new_session=True, close_fds=True, user=user.uid, group=user.gid,
        extra_groups=list(user.groups),
        preexec_fn=None if cwd is None else functools.partial(os.chdir, cwd),
    )


def _is_current(user: JobUser) -> bool:
    """Whether the watchdog already runs with ``user``'s ids and groups (root's job under a root
    daemon, say): then switching would change nothing."""
    return (user.uid == os.geteuid() == os.getuid() and user.gid == os.getegid() == os.getgid()
            and set(user.groups) | {user.gid} == set(os.getgroups()) | {os.getegid()})


def start_failure(error: OSError, program: str, cwd: str | None) -> tuple[int | None, str, str]:
    """exit.json values for a job that could not be started (shell conventions: 127, 126)."""
    if cwd is not None and error.filename == cwd:
        return None, "start_failed", f"working directory not usable: {cwd} ({error.strerror})"
    if isinstance(error, FileNotFoundError):
        return 127, "start_failed", f"command not found: {program}"
    if isinstance(error, PermissionError):
        return 126, "start_failed", f"permission denied: {program}"
    return None, "start_failed", f"cannot start {program}: {error.strerror or error}"
