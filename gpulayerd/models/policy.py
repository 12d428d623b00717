"""``[policy]`` of a job spec (:class:`PolicyModel`): the time limit and its warning signal, the
retries and their policy, the lease length; the words of :mod:`gpulayerd.core.job_policy` at the boundary."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayerd.core import job_policy as limits

__all__ = ["PolicyModel"]


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
