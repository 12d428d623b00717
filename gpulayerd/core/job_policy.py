"""A job's time limit, its warning signal and its retry policy (pure: no clock, no signal module).

- Durations (``--time``, ``time_limit``): ``90s``, ``10m``, ``2h30m``, ``1d``, ``1d12h``, or a number
  of seconds; :func:`parse_duration` -> seconds, :func:`format_duration` back.
- The warning (``--signal USR1@300``, ``signal``): a signal NAME sent to the job's processes
  OFFSET seconds before its limit (:func:`parse_warning`, :func:`warning_plan`); by default SIGTERM
  :data:`DEFAULT_WARN_BEFORE_S` before it, clamped to half the limit for a limit shorter than twice that.
  Signal names only: the watchdog maps a name to this machine's number (they differ between Linux
  and macOS).
- Retries (``--retries N --retry-on lost,failed,timeout --retry-exit-codes 137,143``):
  :func:`retry_decision` says whether an ended attempt is run again, and :func:`backoff_s` after how
  long (exponential: ``retry_backoff_s × 2^(k-1)`` before the k-th retry, at most :data:`MAX_BACKOFF_S`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_WARN_BEFORE_S",
    "MAX_BACKOFF_S",
    "MAX_TIME_LIMIT_S",
    "NO_RETRY_POLICY",
    "RETRY_ON",
    "WARN_SIGNALS",
    "RetryPolicy",
    "WarnSignal",
    "backoff_s",
    "exit_codes_problem",
    "format_duration",
    "parse_duration",
    "parse_retry_on",
    "parse_time_limit",
    "parse_warning",
    "retry_decision",
    "shell_code",
    "signal_name",
    "warning_plan",
]

DEFAULT_WARN_BEFORE_S = 60.0
"""Seconds before its time limit a job gets its warning signal (SIGTERM) when it names none."""

MAX_BACKOFF_S = 3600.0
"""The longest wait before a retry, seconds."""

WARN_SIGNALS = ("HUP", "INT", "QUIT", "ABRT", "USR1", "USR2", "ALRM", "TERM", "CONT", "URG", "XCPU", "WINCH")
"""Signal names a job may ask for as its warning (``--signal NAME@S``) or as the first signal of a
cancel (``cancel --signal NAME``): never KILL or STOP, which a job cannot catch."""

MAX_TIME_LIMIT_S = 366 * 86_400.0
"""The longest time limit a job may name (``--time 366d``): a longer one is a typo, not a limit
(``--time 99999999d`` would show as a 30-digit duration); a job that needs none names none."""

RETRY_ON = ("lost", "failed", "timeout")
"""How an attempt may end for ``--retry-on``: lost (its worker or lease was lost), failed (it exited
non-zero), timeout (it reached its time limit)."""

_UNITS = {"d": 86_400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([dhms])")
_DURATION_HELP = "a duration such as 90s, 10m, 2h30m or 1d (units d, h, m, s), or a number of seconds"


def _shown(value: object) -> str:
    """``value`` as a message quotes it: its repr, cut after 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."


def parse_duration(value: object) -> float:
    """Seconds in ``value``: ``"2h30m"`` -> 9000.0; a number is seconds.

    Raises:
        ValueError: not a duration, or not above 0 (the message names the allowed forms).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not {_DURATION_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not text or "".join(n + u for n, u in parts) != text or len({u for _, u in parts}) != len(parts):
                raise ValueError(f"{_shown(value)} is not {_DURATION_HELP}") from None
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"{_shown(value)} is not {_DURATION_HELP}")
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{_shown(value)}: must be above 0 ({_DURATION_HELP})")
    return seconds


def parse_time_limit(value: object) -> float:
    """A time limit (``--time``, ``time_limit``) in seconds: :func:`parse_duration`, at most
    :data:`MAX_TIME_LIMIT_S`.

    Raises:
        ValueError: not a duration, not above 0, or over :data:`MAX_TIME_LIMIT_S`.
    """
    seconds = parse_duration(value)
    if seconds > MAX_TIME_LIMIT_S:
        raise ValueError(f"{_shown(value)}: at most {format_duration(MAX_TIME_LIMIT_S)} ({_DURATION_HELP})")
    return seconds


def format_duration(seconds: float) -> str:
    """``9000`` -> ``"2h30m"``; whole units from days down to seconds (a fraction of a second kept)."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    left, out = round(seconds), []
    for unit, size in _UNITS.items():
        n, left = divmod(left, int(size))
        if n:
            out.append(f"{n}{unit}")
    return "".join(out) or "0s"


@dataclass(frozen=True, slots=True)
class WarnSignal:
    """The signal a job gets before its time limit: ``signal`` (a name from :data:`WARN_SIGNALS`)
    ``before_s`` seconds before it (None: the default offset, see :func:`warning_plan`)."""

    signal: str
    before_s: float | None = None


def signal_name(value: str) -> str:
    """``"usr1"``, ``"SIGUSR1"`` -> ``"USR1"``.

    Raises:
        ValueError: unknown, KILL or STOP (the message lists the allowed names).
    """
    name = value.strip().upper().removeprefix("SIG")
    if name in ("KILL", "STOP"):
        raise ValueError(f"{value!r}: SIG{name} cannot be caught, so it cannot warn a job "
                         f"(one of {', '.join(WARN_SIGNALS)})")
    if name not in WARN_SIGNALS:
        raise ValueError(f"{value!r} is not a signal name gpulayer sends (one of {', '.join(WARN_SIGNALS)})")
    return name


def parse_warning(value: str) -> WarnSignal:
    """``"USR1@300"`` -> ``WarnSignal("USR1", 300.0)``; ``"USR1"`` keeps the default offset; the
    offset is a duration (``USR1@5m``).

    Raises:
        ValueError: an unknown signal, KILL or STOP, or an offset that is not a duration.
    """
    name, at, offset = value.partition("@")
    before = None
    if at:
        try:
            before = parse_duration(offset)
        except ValueError as e:
            raise ValueError(f"{value!r}: the offset after @ must be {_DURATION_HELP}") from e
    return WarnSignal(signal_name(name), before)


def warning_plan(limit_s: float, warning: WarnSignal | None) -> tuple[str, float]:
    """(signal name, seconds after the job's start) of the warning of a job limited to ``limit_s``.

    Without a warning, or one without an offset: :data:`DEFAULT_WARN_BEFORE_S` before the limit,
    clamped to half the limit when the limit is shorter than twice that (a 10 s limit warns at 5 s).

    Raises:
        ValueError: the offset is not shorter than the limit.
    """
    name = "TERM" if warning is None else warning.signal
    before = None if warning is None else warning.before_s
    if before is None:
        before = min(DEFAULT_WARN_BEFORE_S, limit_s / 2)
    elif before >= limit_s:
        raise ValueError(f"the warning offset {format_duration(before)} must be shorter than the time limit "
                         f"{format_duration(limit_s)}")
    return name, limit_s - before


def parse_retry_on(values: str | Iterable[str]) -> tuple[str, ...]:
    """``"lost,failed"`` or ``["lost", "failed"]`` -> ``("lost", "failed")`` (in :data:`RETRY_ON` order).

    Raises:
        ValueError: an unknown or empty entry (the message lists the allowed ones).
    """
    items = values.split(",") if isinstance(values, str) else list(values)
    out: set[str] = set()
    for item in items:
        word = str(item).strip().lower()
        if word not in RETRY_ON:
            raise ValueError(f"{item!r} is not one of {', '.join(RETRY_ON)}")
        out.add(word)
    return tuple(w for w in RETRY_ON if w in out)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a job's ended attempt is run again.

    Attributes:
        retries: how many retries the job may have in all (``--retries``).
        on: how an attempt must end to be retried (:data:`RETRY_ON`; default ``lost`` only).
        exit_codes: with ``failed`` or ``timeout``, only these exit codes are retried (empty: any);
            a signal N that killed the job counts as 128+N, as a shell reports it.
        backoff_s: seconds before the first retry (doubled for each next one); 0 for none.
        elsewhere: prefer another worker than the last attempt's for the next attempt.
    """

    retries: int = 0
    on: tuple[str, ...] = ("lost",)
    exit_codes: tuple[int, ...] = ()
    backoff_s: float = 0.0
    elsewhere: bool = False


NO_RETRY_POLICY = RetryPolicy()
"""The policy of a job that names none: lost attempts are retried while ``retries`` allow."""


def retry_decision(policy: RetryPolicy, retries_left: int, outcome: str, exit_code: int | None) -> bool:
    """Whether an attempt that ended as ``outcome`` (``lost``, ``failed`` or ``timeout``) with
    ``exit_code`` (negative N: killed by signal N) is run again, ``retries_left`` retries remaining."""
    if retries_left <= 0 or outcome not in policy.on:
        return False
    if outcome == "lost" or not policy.exit_codes:
        return True
    return exit_code is not None and shell_code(exit_code) in policy.exit_codes


def shell_code(exit_code: int) -> int:
    """A process's exit status as a shell reports it: 128+N for a process killed by signal N."""
    return 128 - exit_code if exit_code < 0 else exit_code


def backoff_s(policy: RetryPolicy, retry: int) -> float:
    """Seconds before retry number ``retry`` (1 = the first): ``backoff_s × 2^(retry-1)``, at most
    :data:`MAX_BACKOFF_S`."""
    if policy.backoff_s <= 0 or retry < 1:
        return 0.0
    return min(policy.backoff_s * 2.0 ** min(retry - 1, 32), MAX_BACKOFF_S)


def exit_codes_problem(codes: Collection[int]) -> str | None:
    """Why ``codes`` are not valid ``--retry-exit-codes`` (None when they are): each 0 to 255."""
    bad = [c for c in codes if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= 255]
    if not bad:
        return None
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""  # (10,000 bad codes make no message of 50 kB)
    return f"{', '.join(str(c)[:20] for c in bad[:5])}{more}: exit codes are 0 to 255"
