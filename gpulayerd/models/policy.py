"""``[policy]`` of a job spec (:class:`PolicyModel`): the time limit and its warning signal, the
retries and their policy, the lease length, the pre-flight check and notifications; the words of
:mod:`gpulayerd.core.job_policy` at the boundary."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayerd.core import job_policy as limits

__all__ = ["NOTIFY_EVENTS", "PolicyModel"]


NOTIFY_EVENTS = ("start", "end", "fail")
"""When a job's notify command runs: its attempt started; it ended (any end); it ended failed, timeout or lost."""


class PolicyModel(BaseModel):
    """``[policy]`` of a job spec: the time limit and its warning signal, retries, the lease length.

    ``time_limit`` is seconds (given as a duration: ``"2h30m"``, ``"90s"``, or a number of seconds);
    ``signal`` is ``NAME@SECONDS`` (the warning's name and how long before the limit; see
    :mod:`gpulayerd.core.job_policy`); ``retry_backoff_s`` seconds before the first retry of a failed
    or timed-out attempt, doubled for each next one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    retries: int = Field(default=0, ge=0, le=100)
    lease_s: float = Field(default=30.0, ge=1.0, le=86_400.0)
    time_limit: float | None = None
    signal: str | None = None
    retry_on: list[str] = Field(default_factory=lambda: ["lost"])
    retry_exit_codes: list[int] = Field(default_factory=list, max_length=256)
    retry_backoff_s: float = Field(default=10.0, ge=0.0, le=limits.MAX_BACKOFF_S)
    retry_elsewhere: bool = False
    preflight: bool = True
    """Run the pre-flight check before the command (the named frameworks import, a CUDA/MPS device
    initializes); False: ``--no-preflight``."""
    notify: list[str] = Field(default_factory=list, max_length=3)
    """When the owner runs ``notify_command`` as the job's user: ``start``, ``end``, ``fail`` (``--notify``)."""
    notify_command: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    """The user's notify command (``notify`` in their ``~/.config/gpulayer/config.toml``, read by the CLI)."""
    notify_tasks: bool = False
    """An array notifies per task too (``--notify-tasks``), not only once for the whole array."""

    @field_validator("notify", mode="before")
    @classmethod
    def _notify(cls, v: object) -> object:
        items = [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v
        if isinstance(items, list):
            bad = [x for x in items if x not in NOTIFY_EVENTS]
            if bad:
                raise ValueError(f"notify: unknown event {', '.join(map(repr, bad))}; allowed: "
                                 f"{', '.join(NOTIFY_EVENTS)} (comma-separated)")
            return list(dict.fromkeys(items))
        return v

    @model_validator(mode="after")
    def _notify_command(self) -> PolicyModel:
        if self.notify and not self.notify_command:
            raise ValueError("notify: needs the notify command (a list of strings under the key `notify` in "
                             "~/.config/gpulayer/config.toml)")
        return self

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: object) -> object:
        return None if v is None else limits.parse_time_limit(v)

    @field_validator("retry_backoff_s", mode="before")
    @classmethod
    def _backoff(cls, v: object) -> object:
        return 0.0 if v in (0, "0", "0s") else limits.parse_duration(v) if isinstance(v, str) else v

    @field_validator("retry_on", mode="before")
    @classmethod
    def _retry_on(cls, v: object) -> object:
        return list(limits.parse_retry_on(v)) if isinstance(v, (str, list, tuple)) else v

    @field_validator("retry_exit_codes", mode="before")
    @classmethod
    def _exit_codes(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = [int(c) for c in v.split(",") if c.strip()]
            except ValueError as e:
                raise ValueError(f"{v!r}: a comma-separated list of exit codes, each 0 to 255") from e
        if isinstance(v, list):
            problem = limits.exit_codes_problem(v)
            if problem is not None:
                raise ValueError(problem)
        return v

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str | None) -> str | None:
        if v is None:
            return None
        warning = limits.parse_warning(v)
        return warning.signal + ("" if warning.before_s is None else f"@{warning.before_s:g}")

    @model_validator(mode="after")
    def _warning(self) -> PolicyModel:
        if self.signal is None:
            return self
        warning = limits.parse_warning(self.signal)
        if self.time_limit is None:
            raise ValueError("signal: needs a time limit (time_limit, --time): the warning comes before it")
        try:
            limits.warning_plan(self.time_limit, warning)
        except ValueError as e:
            raise ValueError(f"signal: {e}") from e
        return self

    def warning(self) -> tuple[str, float] | None:
        """(signal name, seconds after the start) of the warning before the time limit; None: no limit."""
        if self.time_limit is None:
            return None
        return limits.warning_plan(self.time_limit, None if self.signal is None else limits.parse_warning(self.signal))

    def retry_policy(self) -> limits.RetryPolicy:
        """The core's view of the retry fields."""
        return limits.RetryPolicy(self.retries, tuple(self.retry_on), tuple(self.retry_exit_codes),
                                  self.retry_backoff_s, self.retry_elsewhere)
