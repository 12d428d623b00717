"""``launch.json`` as the watchdog reads it: the job's command line, environment, account, limits and
first deadline (written by :mod:`gpulayerd.runs.runner`), and the ``deadline`` file a renewal moves.

Stdlib and the run dir's own modules only: the watchdog (and the zygote that preloads it) import this.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulayerd.runs.account import JobUser
from gpulayerd.runs.exitnote import KEEP_S
from gpulayerd.runs.layout import read_json
from gpulayerd.runs.preflight import PreflightCheck

__all__ = ["LaunchFile", "read_deadline"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LaunchFile:
    """One attempt's ``launch.json``, checked: :meth:`load` raises ValueError naming the bad field."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    grace_s: float
    poll_interval_s: float
    kill_timeout_s: float
    lock_fds: list[int]
    user: JobUser | None
    log_cap_bytes: int | None
    exit_keep_s: float
    deadline: float | None
    renew_s: float | None = None
    time_limit_s: float | None = None
    """The job's time limit, seconds from its start (None: none): at it, SIGTERM, grace, SIGKILL."""
    warn_signal: str = "TERM"
    """The name of the signal the job gets ``warn_at_s`` after its start, before its time limit."""
    warn_at_s: float | None = None
    preflight: PreflightCheck | None = None
    """The pre-flight check to run before the command (:mod:`.preflight`); None: none."""

    @classmethod
    def load(cls, path: Path) -> LaunchFile:
        """Read and check ``path``.

        Raises:
            ValueError: missing, not a JSON object, or a field of the wrong type (named).
        """
        return cls.parse(read_json(path), path)

    @classmethod
    def parse(cls, data: Mapping[str, object] | None, path: Path) -> LaunchFile:
        """:meth:`load` of what ``path`` holds (``data``, None when it holds no JSON object).

        Raises:
            ValueError: as :meth:`load`.
        """
        if data is None:
            raise ValueError(f"{path} is missing or not a JSON object")
        argv, env, cwd, fds = data.get("argv"), data.get("env"), data.get("cwd"), data.get("lock_fds", [])
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"{path}: argv must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"{path}: env must map strings to strings")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{path}: cwd must be a string or null")
        if not isinstance(fds, list) or not all(isinstance(fd, int) for fd in fds):
            raise ValueError(f"{path}: lock_fds must be a list of integers")
        user, cap = data.get("user"), data.get("log_cap_bytes")
        if user is not None and not isinstance(user, dict):
            raise ValueError(f"{path}: user must be an object or null")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            raise ValueError(f"{path}: log_cap_bytes must be a non-negative integer or null, not {cap!r}")
        deadline = data.get("deadline")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int | float)):
            raise ValueError(f"{path}: deadline must be a number or null, not {deadline!r}")
        renew = data.get("renew_s")
        if renew is not None and (isinstance(renew, bool) or not isinstance(renew, int | float) or renew <= 0):
            raise ValueError(f"{path}: renew_s must be a positive number or null, not {renew!r}")
        return cls(
            argv=list(argv), env=dict(env), cwd=cwd,
            grace_s=_number(data, "grace_s", 10.0),
            poll_interval_s=max(_number(data, "poll_interval_s", 0.5), 0.01),
            kill_timeout_s=_number(data, "kill_timeout_s", 5.0), lock_fds=list(fds),
            user=None if user is None else JobUser.from_json(user), log_cap_bytes=cap,
            exit_keep_s=_number(data, "exit_keep_s", KEEP_S),
            deadline=None if deadline is None else float(deadline),
            renew_s=None if renew is None else float(renew),
            time_limit_s=_optional(data, path, "time_limit_s"),
            warn_signal=str(data.get("warn_signal") or "TERM"),
            warn_at_s=_optional(data, path, "warn_at_s"),
            preflight=_preflight(data, path),
        )



def read_deadline(path: Path, last: float | None, first: float | None) -> float | None:
    """The deadline in ``path`` (None for ``none``); ``first`` (launch.json's) if the file is
    missing; ``last`` if it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        return None if text == "none" else float(text)
    except FileNotFoundError:
        return first
    except (OSError, ValueError):
        log.warning("cannot read %s; keeping the last deadline", path)
        return last


def _preflight(data: Mapping[str, object], path: Path) -> PreflightCheck | None:
    value = data.get("preflight")
    if value is None:
        return None
    try:
        return PreflightCheck.from_json(value)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _optional(data: Mapping[str, object], path: Path, key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{path}: {key} must be a non-negative number or null, not {value!r}")
    return float(value)


def _number(data: Mapping[str, object], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{key} must be a non-negative number, not {value!r}")
    return float(value)
