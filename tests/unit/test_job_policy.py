"""Time limits, warning signals and retries, decided by the pure core (issue 33): no process, no sleep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core import job_policy as jp
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobRecord, JobStatus


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("2h30m", 9000), ("1d", 86400),
                                               ("1.5h", 5400), ("45", 45), (7, 7)])
def test_durations_parse(text: object, seconds: float) -> None:
    assert jp.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "0s", "-5", "soon", "10x", "1h1h", "", "h", True, None])
def test_bad_durations_name_the_allowed_forms(text: object) -> None:
    with pytest.raises(ValueError, match="90s, 10m, 2h30m"):
        jp.parse_duration(text)


@given(st.integers(min_value=1, max_value=10 * 86400))
def test_a_formatted_duration_parses_back(seconds: int) -> None:
    assert jp.parse_duration(jp.format_duration(seconds)) == seconds


def test_warnings() -> None:
    assert jp.parse_warning("usr1@300") == jp.WarnSignal("USR1", 300.0)
    assert jp.parse_warning("SIGUSR2") == jp.WarnSignal("USR2", None)
    for bad in ("KILL", "STOP@5", "FOO", "USR1@x"):
        with pytest.raises(ValueError):
            jp.parse_warning(bad)
    assert jp.warning_plan(3600, None) == ("TERM", 3540)  # SIGTERM 60 s before
    assert jp.warning_plan(10, None) == ("TERM", 5)  # clamped: half a short limit
    assert jp.warning_plan(10, jp.WarnSignal("USR1", 5)) == ("USR1", 5)
    with pytest.raises(ValueError, match="shorter than the time limit"):
        jp.warning_plan(10, jp.WarnSignal("USR1", 10))


@given(st.floats(min_value=0.1, max_value=1e6), st.none() | st.floats(min_value=0.01, max_value=1e6))
def test_the_warning_comes_after_the_start_and_before_the_limit(limit: float, before: float | None) -> None:
    try:
        _, at = jp.warning_plan(limit, jp.WarnSignal("USR1", before))
    except ValueError:
        assert before is not None and before >= limit
        return
    assert 0 < at < limit or (at == limit / 2)


def test_retry_decisions() -> None:
    p = jp.RetryPolicy(2, ("failed",), (137, 143))
    assert jp.retry_decision(p, 2, "failed", 137)
    assert jp.retry_decision(p, 1, "failed", -15)  # killed by SIGTERM: 143
    assert not jp.retry_decision(p, 2, "failed", 1)
    assert not jp.retry_decision(p, 0, "failed", 137)
    assert not jp.retry_decision(p, 2, "lost", None)  # not asked for
    assert jp.retry_decision(jp.NO_RETRY_POLICY, 1, "lost", None)  # today's behaviour
    assert [jp.backoff_s(jp.RetryPolicy(backoff_s=10), k) for k in (1, 2, 3)] == [10, 20, 40]
    assert jp.backoff_s(jp.RetryPolicy(backoff_s=10), 40) == jp.MAX_BACKOFF_S
    with pytest.raises(ValueError, match="lost, failed, timeout"):
        jp.parse_retry_on("lost,oops")


def _running(policy: jp.RetryPolicy, left: int) -> JobRecord:
    return JobRecord("j", JobStatus.RUNNING, attempt=1, holder="w1", retries_left=left, retry=policy)


def test_a_failed_attempt_is_retried_with_backoff_elsewhere_then_ends_failed() -> None:
    policy = jp.RetryPolicy(2, ("failed",), backoff_s=5, elsewhere=True)
    [persist] = claims.handle(_running(policy, 2), claims.RunExited(1, "w1", 1), now=0.0)
    assert isinstance(persist, claims.PersistJob)
    assert persist.record.status is JobStatus.QUEUED and persist.record.retries_left == 1
    assert persist.record.avoid == "w1" and persist.retry_in_s == 5
    assert "retry 1 of 2 in 5 s" in persist.reason
    # No claim while it backs off; one after.
    queued = JobRecord("j", JobStatus.QUEUED, attempt=1, retries_left=1, retry=policy, retry_at=105.0, avoid="w1")
    assert isinstance(claims.handle(queued, claims.ClaimRequested("w2", wall=100.0), 0.0)[0], claims.DenyClaim)
    granted = claims.handle(queued, claims.ClaimRequested("w2", wall=106.0), 0.0)
    assert isinstance(granted[0], claims.PersistJob) and granted[0].record.avoid is None
    [last] = claims.handle(_running(policy, 0), claims.RunExited(1, "w1", 1), now=0.0)
    assert isinstance(last, claims.PersistJob) and last.record.status is JobStatus.FAILED


def test_a_timeout_ends_timeout_with_its_own_exit_code_or_retries() -> None:
    [p] = claims.handle(_running(jp.NO_RETRY_POLICY, 3), claims.RunExited(1, "w1", 0, "time limit", timed_out=True), 0)
    assert isinstance(p, claims.PersistJob) and p.record.status is JobStatus.TIMEOUT
    retry = jp.RetryPolicy(1, ("timeout",), backoff_s=0)
    [p] = claims.handle(_running(retry, 1), claims.RunExited(1, "w1", -9, "time limit", timed_out=True), 0)
    assert isinstance(p, claims.PersistJob) and p.record.status is JobStatus.QUEUED and p.retry_in_s is None


@given(st.lists(st.sampled_from(jp.RETRY_ON), unique=True), st.integers(0, 5), st.sampled_from(jp.RETRY_ON),
       st.none() | st.integers(-64, 255))
def test_retries_never_go_below_zero(on: list[str], left: int, outcome: str, code: int | None) -> None:
    policy = jp.RetryPolicy(5, tuple(on))
    event: claims.Event = (claims.RunLost(1, "w1", "gone") if outcome == "lost"
                           else claims.RunExited(1, "w1", 1 if code == 0 else code, timed_out=outcome == "timeout"))
    [p] = claims.handle(_running(policy, left), event, 0.0)
    assert isinstance(p, claims.PersistJob)
    assert p.record.retries_left >= 0
    if p.record.status is JobStatus.QUEUED:
        assert outcome in on and p.record.retries_left == left - 1
