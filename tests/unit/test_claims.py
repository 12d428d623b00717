"""The owner's claim/lease state machine: events in, actions out, checked against invariants.

A small in-test owner holds one :class:`JobRecord`, feeds events through :func:`handle`, and
plays the store: a :class:`PersistJob` is applied only if the stored record still has its
``expect_status``, ``expect_attempt`` and ``expect_cancel_requested`` (the compare-and-set); when it is refused, nothing else
returned for that event is carried out. Every owner a test makes is checked by ``validate()`` at
teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayerd.core.protocol.claims import (
    ACTIVE,
    TERMINAL,
    Action,
    CancelRequested,
    ClaimRequested,
    DenyClaim,
    Event,
    ExtendLease,
    GrantClaim,
    JobRecord,
    JobStatus,
    KillRun,
    LeaseChecked,
    LeaseRenewed,
    PersistJob,
    ReplyStale,
    RunExited,
    RunLost,
    RunStarted,
    handle,
)

Q, C, R = JobStatus.QUEUED, JobStatus.CLAIMED, JobStatus.RUNNING
LEASE = 30.0

# Every status change the state machine may make; anything else is a bug.
ALLOWED_MOVES = {
    (Q, C),
    (Q, JobStatus.CANCELLED),
    (C, R),
    (C, Q),
    *((s, t) for s in ACTIVE for t in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.LOST)),
    (R, Q),
}

# ------------------------------------------------------------------ event helpers


def job(**kw: object) -> JobRecord:
    """A fresh queued job, lease 30 s, no retries unless given."""
    return replace(JobRecord("j1", Q, lease_s=LEASE), **kw)


def claim(worker: str = "w1") -> ClaimRequested:
    return ClaimRequested(worker, stimulus_id=f"claim-{worker}")


def started(attempt: int = 1, worker: str = "w1") -> RunStarted:
    return RunStarted(attempt, worker)


def renewed(attempt: int = 1, worker: str = "w1") -> LeaseRenewed:
    return LeaseRenewed(attempt, worker)


def exited(attempt: int = 1, code: int | None = 0, reason: str = "", worker: str = "w1") -> RunExited:
    return RunExited(attempt, worker, code, reason)


def lost(attempt: int = 1, reason: str = "worker reports processes gone", never_started: bool = False,
         worker: str = "w1") -> RunLost:
    return RunLost(attempt, worker, reason, never_started)


def cancel(reason: str = "cancelled by user") -> CancelRequested:
    return CancelRequested(reason)


def check(grace_s: float = 0.0) -> LeaseChecked:
    return LeaseChecked(grace_s)


# ------------------------------------------------------------------ owner harness


@dataclass
class Step:
    """One event as the owner saw it."""

    event: Event
    now: float
    seen: JobRecord  # the record handle() was given
    returned: list[Action]
    stored: JobRecord | None  # the record written by this step's PersistJob, if the store took it
    refused: bool  # a PersistJob came back and the store's compare-and-set refused it


@dataclass
class Owner:
    """Plays the daemon and the store around :func:`handle` for one job."""

    record: JobRecord
    now: float = 0.0
    history: list[JobRecord] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    outbox: list[Action] = field(default_factory=list)  # non-persist actions actually carried out

    def __post_init__(self) -> None:
        self.history.append(self.record)

    def feed(self, event: Event, now: float | None = None, *, snapshot: JobRecord | None = None) -> list[Action]:
        """Handle ``event`` at ``now`` (default: the last time) and return what handle() returned.

        With ``snapshot``, handle() sees that (possibly outdated) record instead of the stored one,
        as a concurrent handler that read the row earlier would.
        """
        if now is not None:
            assert now >= self.now, "the owner's clock is monotonic"
            self.now = now
        seen = self.record if snapshot is None else snapshot
        actions = handle(seen, event, self.now)
        persists = [a for a in actions if isinstance(a, PersistJob)]
        assert len(persists) <= 1, actions
        assert not persists or actions[0] is persists[0], "a PersistJob comes first"
        stored: JobRecord | None = None
        refused = False
        rest = actions
        if persists:
            p = persists[0]
            rest = actions[1:]
            if (p.expect_status, p.expect_attempt, p.expect_cancel_requested) == (
                self.record.status, self.record.attempt, self.record.cancel_requested
            ):
                stored = self.record = p.record
                self.history.append(p.record)
            else:
                refused = True
                rest = []
        for a in rest:
            if isinstance(a, ExtendLease):
                # As the daemon does: a renewal moves the in-memory lease, nothing is stored.
                assert a.attempt == self.record.attempt and self.record.status in ACTIVE, (a, self.record)
                self.record = replace(self.record, lease_expires_at=a.expires_at)
        self.outbox.extend(rest)
        self.steps.append(Step(event, self.now, seen, actions, stored, refused))
        return actions

    def run(self, *timed: tuple[float, Event]) -> list[list[Action]]:
        return [self.feed(ev, t) for t, ev in timed]

    # -------------------------------------------------------------- invariants

    def validate(self) -> None:
        for rec in self.history:
            assert rec.job_id == self.history[0].job_id
            assert rec.lease_s == self.history[0].lease_s
            assert (rec.holder is not None) == (rec.status in ACTIVE), rec
            assert (rec.lease_expires_at is not None) == (rec.status in ACTIVE), rec
            assert rec.retries_left >= 0, rec
        for old, new in pairwise(self.history):
            assert old.status not in TERMINAL, f"terminal {old.status} was overwritten by {new}"
            assert new.attempt >= old.attempt, (old, new)
            if new.attempt != old.attempt:
                assert (old.status, new.status, new.attempt) == (Q, C, old.attempt + 1), (old, new)
            if new.status != old.status:
                assert (old.status, new.status) in ALLOWED_MOVES, (old, new)
            assert new.retries_left <= old.retries_left, (old, new)
            assert not (old.cancel_requested and not new.cancel_requested), (old, new)

        granted: dict[int, str] = {}  # attempt -> the worker it was persisted for
        first = self.history[0]
        if first.status in ACTIVE and first.holder is not None:  # granted before this owner started
            granted[first.attempt] = first.holder
        for step in self.steps:
            attempt = getattr(step.event, "attempt", None)
            if attempt is not None and attempt != step.seen.attempt:
                assert step.stored is None and not step.refused, f"stale attempt changed the job: {step}"
            if attempt is not None and getattr(step.event, "worker", None) != step.seen.holder:
                # Only the holder speaks for an attempt: anyone else's start, renewal, exit or loss
                # stores nothing, extends nothing, kills nothing, and is answered stale (or not at all).
                assert step.stored is None and not step.refused, f"a non-holder changed the job: {step}"
                assert all(isinstance(a, ReplyStale) for a in step.returned), step
            if step.stored is not None and (step.seen.status, step.stored.status) == (R, Q):
                # A recorded start may still be running somewhere: re-queueing it uses a retry.
                assert step.stored.retries_left == step.seen.retries_left - 1, step
            if step.refused:
                continue
            for action in step.returned:
                if isinstance(action, GrantClaim):
                    fresh = (
                        step.stored is not None
                        and step.stored.status is C
                        and step.stored.attempt == action.attempt
                        and step.stored.holder == action.worker
                    )
                    if fresh:
                        assert action.attempt not in granted, f"attempt {action.attempt} granted twice"
                        granted[action.attempt] = action.worker
                    else:
                        # Only a re-send of a grant already persisted for this very worker.
                        assert granted.get(action.attempt) == action.worker, (step, granted)
                    assert action.lease_s == self.history[0].lease_s
                elif isinstance(action, KillRun):
                    assert granted.get(action.attempt) == action.worker, (step, granted)
                elif isinstance(action, PersistJob):
                    assert action.reason, f"every stored change has a reason: {step}"
                elif isinstance(action, ExtendLease):
                    # Only the holder's renewal of the current attempt extends its lease.
                    assert isinstance(step.event, LeaseRenewed), step
                    assert granted.get(action.attempt) == step.event.worker, (step, granted)


@pytest.fixture
def make_owner() -> Iterator[Callable[..., Owner]]:
    owners: list[Owner] = []

    def make(record: JobRecord | None = None, now: float = 0.0) -> Owner:
        owner = Owner(record if record is not None else job(), now)
        owners.append(owner)
        return owner

    yield make
    for owner in owners:
        owner.validate()


@pytest.fixture
def owner(make_owner: Callable[..., Owner]) -> Owner:
    return make_owner(now=100.0)


@pytest.fixture
def retrying_owner(make_owner: Callable[..., Owner]) -> Owner:
    return make_owner(job(retries_left=1), now=100.0)


def running(owner: Owner, worker: str = "w1") -> JobRecord:
    """Claim at the current time and start one second later; return the running record."""
    owner.feed(claim(worker))
    owner.feed(started(owner.record.attempt, worker), owner.now + 1)
    assert owner.record.status is R
    return owner.record


# ------------------------------------------------------------------ claims


def test_first_claim_is_granted_attempt_1_with_a_lease(owner: Owner) -> None:
    acts = owner.feed(claim("w1"))
    rec = replace(job(), status=C, attempt=1, holder="w1", lease_expires_at=100.0 + LEASE)
    assert acts == [
        PersistJob(rec, Q, 0, "claimed by w1 (attempt 1)", "claim-w1"),
        GrantClaim("w1", 1, LEASE),
    ]
    assert owner.record == rec


def test_a_second_workers_claim_is_denied(owner: Owner) -> None:
    owner.feed(claim("w1"))
    before = owner.record
    assert owner.feed(claim("w2")) == [DenyClaim("w2", "job is claimed")]
    assert owner.record == before


def test_concurrent_claims_only_the_first_compare_and_set_wins(owner: Owner) -> None:
    snapshot = owner.record
    first = owner.feed(claim("w1"), snapshot=snapshot)
    second = owner.feed(claim("w2"), snapshot=snapshot)  # read the row before w1's write landed
    assert isinstance(first[0], PersistJob) and isinstance(second[0], PersistJob)
    assert owner.steps[-1].refused
    assert owner.record.holder == "w1"
    assert owner.outbox == [GrantClaim("w1", 1, LEASE)]  # w2's grant was never sent
    # The daemon re-reads the row and handles w2 again: a plain denial.
    assert owner.feed(claim("w2")) == [DenyClaim("w2", "job is claimed")]


@pytest.mark.parametrize("start_first", [False, True])
def test_duplicate_claim_from_the_holder_gets_the_same_grant(owner: Owner, start_first: bool) -> None:
    owner.feed(claim("w1"))
    if start_first:
        owner.feed(started(1, "w1"), 101.0)
    before = owner.record
    assert owner.feed(claim("w1"), 102.0) == [GrantClaim("w1", 1, LEASE)]
    assert owner.record == before


def test_claim_of_a_finished_job_is_denied(owner: Owner) -> None:
    running(owner)
    owner.feed(exited(1, 0))
    assert owner.feed(claim("w1")) == [DenyClaim("w1", "job is succeeded")]


# ------------------------------------------------------------------ start, renew


def test_run_started_moves_to_running_and_restarts_the_lease(owner: Owner) -> None:
    owner.feed(claim("w1"))
    claimed = owner.record
    acts = owner.feed(started(1, "w1"), 110.0)
    rec = replace(claimed, status=R, lease_expires_at=110.0 + LEASE)
    assert acts == [PersistJob(rec, C, 1, "running on w1")]
    assert owner.record == rec


def test_duplicate_start_is_ignored(owner: Owner) -> None:
    rec = running(owner)
    assert owner.feed(started(1, "w1"), 120.0) == []
    assert owner.record == rec


def test_renewal_extends_the_lease_without_storing_anything(owner: Owner) -> None:
    rec = running(owner)
    acts = owner.feed(renewed(1, "w1"), 120.0)
    assert acts == [ExtendLease(1, 120.0 + LEASE)]
    assert owner.record == replace(rec, lease_expires_at=120.0 + LEASE)


def test_renewal_while_claimed_keeps_it_claimed(owner: Owner) -> None:
    owner.feed(claim("w1"))
    rec = owner.record
    assert owner.feed(renewed(1, "w1"), 105.0) == [ExtendLease(1, 135.0)]
    assert owner.record == replace(rec, lease_expires_at=135.0)


def _requeued_and_reclaimed(owner: Owner) -> JobRecord:
    """w1 holds attempt 1, loses it to a lease expiry, w2 claims attempt 2 and starts it."""
    assert owner.record.retries_left == 1
    running(owner, "w1")  # lease until 131
    owner.feed(check(), 132.0)
    owner.feed(claim("w2"), 133.0)
    owner.feed(started(2, "w2"), 134.0)
    assert (owner.record.status, owner.record.attempt, owner.record.holder) == (R, 2, "w2")
    return owner.record


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (started(1, "w1"), [ReplyStale("w1", 1, 2)]),
        (renewed(1, "w1"), [ReplyStale("w1", 1, 2)]),
        (started(2, "w1"), [ReplyStale("w1", 2, 2)]),  # right attempt, wrong worker
        (renewed(2, "w1"), [ReplyStale("w1", 2, 2)]),
        (renewed(3, "w2"), [ReplyStale("w2", 3, 2)]),  # an attempt that was never granted
        (exited(1, 0), []),
        (exited(1, None), []),
        (exited(3, 1), []),
        (lost(1), []),
        (lost(1, never_started=True), []),
        (exited(2, 0, worker="w1"), [ReplyStale("w1", 2, 2)]),  # right attempt, wrong worker
        (exited(2, 1, worker="w3"), [ReplyStale("w3", 2, 2)]),
        (lost(2, worker="w1"), [ReplyStale("w1", 2, 2)]),
        (lost(2, never_started=True, worker="w3"), [ReplyStale("w3", 2, 2)]),
    ],
    ids=lambda v: repr(v) if not isinstance(v, list) else "",
)
def test_messages_about_another_attempt_never_change_the_job(
    retrying_owner: Owner, event: Event, expected: list[Action]
) -> None:
    rec = _requeued_and_reclaimed(retrying_owner)
    assert retrying_owner.feed(event, 135.0) == expected
    assert retrying_owner.record == rec


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (started(1, "w1"), [ReplyStale("w1", 1, 1)]),
        (renewed(1, "w1"), [ReplyStale("w1", 1, 1)]),
        (exited(1, 0), []),
        (lost(1), []),
        (check(), []),
    ],
    ids=lambda v: repr(v) if not isinstance(v, list) else "",
)
def test_messages_after_the_end_change_nothing(owner: Owner, event: Event, expected: list[Action]) -> None:
    running(owner)
    owner.feed(exited(1, 2), 110.0)
    rec = owner.record
    assert owner.feed(event, 1000.0) == expected
    assert owner.record == rec


# ------------------------------------------------------------------ exits


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        (0, JobStatus.SUCCEEDED, "exited 0"),
        (3, JobStatus.FAILED, "exited 3"),
        (-9, JobStatus.FAILED, "exited by signal 9"),
        (None, JobStatus.FAILED, "exit status unknown"),
    ],
)
def test_exit_ends_the_job(owner: Owner, code: int | None, status: JobStatus, reason: str) -> None:
    rec = running(owner)
    acts = owner.feed(exited(1, code), 110.0)
    done = replace(rec, status=status, holder=None, lease_expires_at=None)
    assert acts == [PersistJob(done, R, 1, reason)]
    assert owner.record == done


def test_a_failure_reason_from_the_worker_is_kept(owner: Owner) -> None:
    running(owner)
    acts = owner.feed(exited(1, 137, reason="out of memory"), 110.0)
    assert isinstance(acts[0], PersistJob) and acts[0].reason == "out of memory"
    assert owner.record.status is JobStatus.FAILED


def test_exit_before_the_start_was_seen_still_counts(owner: Owner) -> None:
    owner.feed(claim("w1"))
    acts = owner.feed(exited(1, 1), 101.0)
    assert acts == [PersistJob(replace(job(), attempt=1, status=JobStatus.FAILED), C, 1, "exited 1")]


def test_duplicate_exit_is_ignored(owner: Owner) -> None:
    running(owner)
    owner.feed(exited(1, 0), 110.0)
    assert owner.feed(exited(1, 0), 111.0) == []
    assert owner.feed(exited(1, 1), 112.0) == []
    assert owner.record.status is JobStatus.SUCCEEDED


# ------------------------------------------------------------------ cancel


def test_cancel_while_queued_cancels_directly(owner: Owner) -> None:
    acts = owner.feed(cancel())
    assert acts == [PersistJob(replace(job(), status=JobStatus.CANCELLED), Q, 0, "cancelled by user")]
    assert owner.outbox == []
    assert owner.feed(claim("w1")) == [DenyClaim("w1", "job is cancelled")]


def test_cancel_while_running_kills_then_the_exit_cancels(owner: Owner) -> None:
    rec = running(owner)
    acts = owner.feed(cancel(), 110.0)
    asked = replace(rec, cancel_requested=True)
    assert acts == [
        PersistJob(asked, R, 1, "cancel requested; stopping attempt 1 on w1"),
        KillRun("w1", 1, "cancelled by user"),
    ]
    assert owner.record == asked
    acts = owner.feed(exited(1, -15), 112.0)
    done = replace(asked, status=JobStatus.CANCELLED, holder=None, lease_expires_at=None)
    assert acts == [PersistJob(done, R, 1, "cancelled by user (exit by signal 15)", expect_cancel_requested=True)]
    assert isinstance(acts[0], PersistJob)
    assert "exit" in acts[0].reason and "signal 15" in acts[0].reason


def test_cancel_while_claimed_kills_again_once_the_run_starts(owner: Owner) -> None:
    owner.feed(claim("w1"))
    owner.feed(cancel(), 101.0)
    acts = owner.feed(started(1, "w1"), 102.0)
    assert acts[1:] == [KillRun("w1", 1, "cancelled by user")]
    assert owner.record.status is R and owner.record.cancel_requested
    # While the kill is pending, another worker still cannot take the job.
    assert owner.feed(claim("w2"), 103.0) == [DenyClaim("w2", "job is running")]
    owner.feed(exited(1, None), 104.0)
    assert owner.record.status is JobStatus.CANCELLED
    assert owner.steps[-1].returned[0] == PersistJob(
        replace(owner.history[-2], status=JobStatus.CANCELLED, holder=None, lease_expires_at=None),
        R,
        1,
        "cancelled by user",
        expect_cancel_requested=True,
    )


def test_cancel_twice_is_a_no_op(owner: Owner) -> None:
    running(owner)
    owner.feed(cancel(), 110.0)
    rec = owner.record
    assert owner.feed(cancel(), 111.0) == []
    assert owner.record == rec
    assert owner.outbox.count(KillRun("w1", 1, "cancelled by user")) == 1


def test_cancel_with_an_expired_lease_ends_cancelled_not_lost(owner: Owner) -> None:
    running(owner)  # lease until 131
    owner.feed(cancel(), 110.0)
    owner.feed(check(), 200.0)
    assert owner.record.status is JobStatus.CANCELLED


@pytest.mark.parametrize(
    "finish",
    [
        pytest.param([exited(1, 0)], id="succeeded"),
        pytest.param([exited(1, 1)], id="failed"),
        pytest.param([check()], id="lost"),
        pytest.param([cancel(), exited(1, -15)], id="cancelled"),
    ],
)
def test_cancel_after_the_end_is_a_no_op(owner: Owner, finish: list[Event]) -> None:
    running(owner)
    for ev in finish:
        owner.feed(ev, 500.0)
    rec = owner.record
    assert rec.status in TERMINAL
    assert owner.feed(cancel(), 501.0) == []
    assert owner.record == rec


def test_cancel_of_a_rejected_job_is_a_no_op(make_owner: Callable[..., Owner]) -> None:
    o = make_owner(job(status=JobStatus.REJECTED))
    assert o.feed(cancel()) == []
    assert o.feed(claim("w1")) == [DenyClaim("w1", "job is rejected")]


# ------------------------------------------------------------------ leases and loss


def test_lease_check_before_expiry_plus_grace_does_nothing(owner: Owner) -> None:
    rec = running(owner)  # started at 101: lease until 131
    for t in (101.0, 131.0, 136.0):
        assert owner.feed(check(grace_s=5.0), t) == []
    assert owner.record == rec


def test_lease_expiry_without_retries_is_lost_and_killed(owner: Owner) -> None:
    rec = running(owner)
    acts = owner.feed(check(grace_s=5.0), 136.5)
    reason = "attempt 1 lost: no lease renewal from w1 for 30 s + 5 s grace; lost"
    gone = replace(rec, status=JobStatus.LOST, holder=None, lease_expires_at=None)
    assert acts == [PersistJob(gone, R, 1, reason), KillRun("w1", 1, reason)]
    assert "w1" in reason and "30 s" in reason


def test_lease_expiry_with_a_retry_requeues_and_fences_the_old_attempt(retrying_owner: Owner) -> None:
    owner = retrying_owner
    rec = running(owner)
    acts = owner.feed(check(), 131.5)
    again = replace(rec, status=Q, holder=None, lease_expires_at=None, retries_left=0)
    reason = "attempt 1 lost: no lease renewal from w1 for 30 s + 0 s grace; re-queued"
    assert acts == [PersistJob(again, R, 1, reason), KillRun("w1", 1, reason)]

    acts = owner.feed(claim("w2"), 140.0)
    assert acts[1:] == [GrantClaim("w2", 2, LEASE)]
    assert owner.record == replace(again, status=C, attempt=2, holder="w2", lease_expires_at=170.0)

    before = owner.record
    assert owner.feed(exited(1, 0), 141.0) == []  # the late exit of attempt 1
    assert owner.record == before
    owner.feed(exited(2, 0, worker="w2"), 150.0)
    assert owner.record.status is JobStatus.SUCCEEDED


def test_run_lost_before_start_requeues_without_using_a_retry(retrying_owner: Owner) -> None:
    owner = retrying_owner
    owner.feed(claim("w1"))
    acts = owner.feed(lost(1, "launch failed: no such workdir", never_started=True), 101.0)
    again = replace(job(retries_left=1), attempt=1)
    assert acts == [PersistJob(again, C, 1, "launch failed: no such workdir")]
    assert owner.feed(claim("w2"), 102.0)[1:] == [GrantClaim("w2", 2, LEASE)]


def test_run_lost_after_start_without_retries_is_lost(owner: Owner) -> None:
    rec = running(owner)
    acts = owner.feed(lost(1, "processes vanished"), 110.0)
    assert acts == [
        PersistJob(
            replace(rec, status=JobStatus.LOST, holder=None, lease_expires_at=None),
            R,
            1,
            "processes vanished",
        )
    ]


def test_run_lost_after_start_with_a_retry_uses_it(make_owner: Callable[..., Owner]) -> None:
    owner = make_owner(job(retries_left=2), now=100.0)
    running(owner)
    owner.feed(lost(1, "processes vanished"), 110.0)
    assert (owner.record.status, owner.record.retries_left) == (Q, 1)


def test_paused_worker_wakes_to_a_stale_reply(make_owner: Callable[..., Owner]) -> None:
    owner = make_owner(job(retries_left=1))
    owner.run((0.0, claim("w1")), (1.0, started(1, "w1")), (10.0, renewed(1, "w1")))  # lease until 40
    # w1 is paused (SIGSTOP, a suspended laptop): no more renewals.
    assert owner.feed(check(), 40.0) == []
    owner.feed(check(), 40.5)
    assert (owner.record.status, owner.record.retries_left) == (Q, 0)
    acts = owner.feed(claim("w2"), 41.0)
    assert acts[1:] == [GrantClaim("w2", 2, LEASE)]
    owner.feed(started(2, "w2"), 42.0)
    rec = owner.record
    # w1 wakes up and carries on as if nothing happened.
    assert owner.feed(renewed(1, "w1"), 50.0) == [ReplyStale("w1", 1, 2)]
    assert owner.feed(exited(1, 0), 51.0) == []
    assert owner.feed(claim("w1"), 52.0) == [DenyClaim("w1", "job is running")]
    assert owner.record == rec
    assert [a for a in owner.outbox if isinstance(a, GrantClaim)] == [
        GrantClaim("w1", 1, LEASE),
        GrantClaim("w2", 2, LEASE),
    ]


@pytest.mark.parametrize("old_expiry", [50.0, 1e9])  # the old monotonic clock means nothing now
def test_owner_restart_counts_persisted_leases_as_renewed(make_owner: Callable[..., Owner], old_expiry: float) -> None:
    persisted = replace(job(), status=R, attempt=1, holder="w1", lease_expires_at=old_expiry)
    restart_now = 7.0
    rebuilt = replace(persisted, lease_expires_at=restart_now + persisted.lease_s)
    o = make_owner(rebuilt, now=restart_now)
    for t in (restart_now, restart_now + 10, restart_now + LEASE):
        assert o.feed(check(), t) == []
    assert o.record == rebuilt
    o.feed(check(), restart_now + LEASE + 0.01)
    assert o.record.status is JobStatus.LOST


def test_owner_restart_then_the_holder_renews_and_finishes(make_owner: Callable[..., Owner]) -> None:
    persisted = replace(job(), status=R, attempt=1, holder="w1", lease_expires_at=12345.0)
    o = make_owner(replace(persisted, lease_expires_at=3.0 + LEASE), now=3.0)
    o.feed(renewed(1, "w1"), 20.0)
    assert o.feed(check(), 20.0 + LEASE) == []
    o.feed(exited(1, 0), 55.0)
    assert o.record.status is JobStatus.SUCCEEDED


# ------------------------------------------------------------------ only the holder speaks for an attempt


@pytest.mark.parametrize("claimed_only", [False, True], ids=["running", "claimed"])
@pytest.mark.parametrize(
    "forged",
    [
        exited(1, 0, worker="w2"),
        exited(1, 1, reason="boom", worker="w2"),
        exited(1, None, worker="w2"),
        RunExited(1, "w2", 143, "time limit 10 s reached", "", True),  # a forged timeout (issue 33)
        lost(1, worker="w2"),
        lost(1, never_started=True, worker="w2"),
        renewed(1, "w2"),
        started(1, "w2"),
    ],
    ids=lambda v: f"{type(v).__name__}-{getattr(v, 'exit_code', '')}-{getattr(v, 'never_started', '')}"
                  f"{'-timed_out' if getattr(v, 'timed_out', False) else ''}",
)
def test_a_non_holder_can_neither_end_nor_renew_nor_start_the_current_attempt(
    make_owner: Callable[..., Owner], forged: Event, claimed_only: bool
) -> None:
    """Issue 12: a member that does not hold the job (w2) reports on the attempt w1 runs."""
    owner = make_owner(job(retries_left=1), now=100.0)
    owner.feed(claim("w1"))
    if not claimed_only:
        owner.feed(started(1, "w1"), 101.0)
    before = owner.record
    acts = owner.feed(forged, 102.0)
    assert acts == [ReplyStale("w2", 1, 1)]
    assert owner.record == before  # nothing stored, the lease not moved, no retry used
    # The lease still runs out on the holder's silence alone, and the holder still ends it.
    assert owner.feed(check(), before.lease_expires_at) == []
    owner.feed(exited(1, 0, worker="w1"))
    assert (owner.record.status, owner.record.attempt, owner.record.retries_left) == (JobStatus.SUCCEEDED, 1, 1)


def test_a_forged_loss_does_not_start_a_second_copy(make_owner: Callable[..., Owner]) -> None:
    """Issue 12: with retries left, a forged "lost" re-queued the job while attempt 1 still ran."""
    owner = make_owner(job(retries_left=1), now=100.0)
    rec = running(owner, "w1")
    assert owner.feed(lost(1, "forged", worker="w2"), 110.0) == [ReplyStale("w2", 1, 1)]
    assert owner.feed(claim("w2"), 111.0) == [DenyClaim("w2", "job is running")]
    assert owner.record == rec
    assert [a for a in owner.outbox if isinstance(a, GrantClaim)] == [GrantClaim("w1", 1, LEASE)]


def test_a_non_holders_report_after_the_end_or_while_queued_changes_nothing(
    make_owner: Callable[..., Owner],
) -> None:
    owner = make_owner(job(retries_left=1), now=100.0)
    assert owner.feed(exited(1, 0, worker="w2"), 100.0) == []  # queued: attempt 1 was never granted
    assert owner.feed(lost(0, worker="w2"), 100.0) == []
    running(owner, "w1")
    owner.feed(exited(1, 3, worker="w1"), 110.0)
    end = owner.record
    assert end.status is JobStatus.FAILED
    for ev in (exited(1, 0, worker="w2"), lost(1, worker="w2"), renewed(1, "w2"), started(1, "w2")):
        assert all(isinstance(a, ReplyStale) for a in owner.feed(ev, 111.0))
    assert owner.record == end


def test_a_non_holder_cannot_end_a_cancelled_attempt_early(make_owner: Callable[..., Owner]) -> None:
    owner = make_owner(now=100.0)
    running(owner, "w1")
    owner.feed(cancel(), 105.0)
    rec = owner.record
    assert owner.feed(exited(1, -15, worker="w2"), 106.0) == [ReplyStale("w2", 1, 1)]
    assert owner.record == rec and rec.cancel_requested and rec.status is R
    owner.feed(exited(1, -15, worker="w1"), 107.0)
    assert owner.record.status is JobStatus.CANCELLED


# ------------------------------------------------------------------ replays

SCRIPT: list[tuple[float, Event]] = [
    (0.0, claim("w1")),
    (0.0, claim("w2")),
    (1.0, started(1, "w1")),
    (1.5, started(1, "w1")),
    (10.0, renewed(1, "w1")),
    (45.0, check(grace_s=2.0)),
    (46.0, claim("w3")),
    (47.0, renewed(1, "w1")),
    (48.0, started(2, "w3")),
    (60.0, cancel()),
    (61.0, cancel()),
    (62.0, exited(1, 0)),
    (63.0, exited(2, -15, worker="w3")),
]


def test_same_events_from_the_same_record_give_the_same_actions(make_owner: Callable[..., Owner]) -> None:
    a = make_owner(job(retries_left=1))
    b = make_owner(job(retries_left=1))
    assert a.run(*SCRIPT) == b.run(*SCRIPT)
    assert a.history == b.history
    assert a.record.status is JobStatus.CANCELLED


def test_replaying_everything_after_the_end_stores_and_grants_nothing(
    make_owner: Callable[..., Owner],
) -> None:
    o = make_owner(job(retries_left=1))
    o.run(*SCRIPT)
    end, sent = o.record, len(o.outbox)
    replayed = o.run(*((t + 100.0, ev) for t, ev in SCRIPT))
    assert o.record == end
    flat = [a for acts in replayed for a in acts]
    assert not any(isinstance(a, (PersistJob, GrantClaim, KillRun)) for a in flat)
    assert all(isinstance(a, (DenyClaim, ReplyStale)) for a in o.outbox[sent:])


# ------------------------------------------------------------------ found bugs


def test_never_started_loss_after_a_recorded_start_uses_a_retry() -> None:
    o = Owner(job(retries_left=0))
    running(o)
    o.feed(lost(1, "watchdog gone", never_started=True), 110.0)
    assert o.record.status is JobStatus.LOST


def test_a_concurrent_start_does_not_undo_a_cancel() -> None:
    o = Owner(job(), now=100.0)
    o.feed(claim("w1"))
    snapshot = o.record  # the start handler reads the claimed row ...
    o.feed(cancel(), 101.0)  # ... a cancel lands (KillRun sent while the worker is still launching) ...
    o.feed(started(1, "w1"), 102.0, snapshot=snapshot)  # ... and the start's write is accepted
    assert o.record.cancel_requested
    o.validate()


# ------------------------------------------------------------------ property

# Weighted so that runs get started, renewed and checked more often than they get cancelled.
KINDS = ["claim"] * 3 + ["started"] * 3 + ["renewed"] * 4 + ["exited"] * 2 + ["lost", "cancel"] + ["check"] * 3
# One random step: (seconds since the previous one, kind, attempt relative to the current one,
# worker ("holder": the current or last holder), exit code / never_started / grace, and for a claim
# how many stored versions back the record it was handled against is).
STEP = st.tuples(
    st.sampled_from([0, 1, 2, 3, 5, 8, 12, 20, 35, 70]),
    st.sampled_from(KINDS),
    st.sampled_from([0, 0, 0, -1, 1, -2]),
    st.sampled_from(["holder", "holder", "w1", "w2", "w3"]),
    st.sampled_from([0, 1, 3, -9, -15, None]),
    st.integers(0, 3),
)


def build(o: Owner, kind: str, offset: int, who: str, extra: int | None) -> Event:
    holders = [r.holder for r in o.history if r.holder is not None]
    worker = (holders[-1] if holders else "w1") if who == "holder" else who
    attempt = o.record.attempt + offset
    if kind == "claim":
        return ClaimRequested(worker)
    if kind == "started":
        return RunStarted(attempt, worker)
    if kind == "renewed":
        return LeaseRenewed(attempt, worker)
    if kind == "exited":
        return RunExited(attempt, worker, extra)
    if kind == "lost":
        return RunLost(attempt, worker, "gone", never_started=extra == 0)
    if kind == "cancel":
        return CancelRequested()
    return LeaseChecked(grace_s=5.0 if extra == 0 else 0.0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    retries=st.integers(0, 2),
    lease_s=st.sampled_from([10.0, 30.0]),
    steps=st.lists(STEP, min_size=10, max_size=60),
)
@pytest.mark.slow
def test_random_event_sequences_keep_the_invariants(retries: int, lease_s: float, steps: list) -> None:
    o = Owner(job(retries_left=retries, lease_s=lease_s))
    for dt, kind, offset, who, extra, back in steps:
        event = build(o, kind, offset, who, extra)
        # Claims may race: one handled on an older stored version must lose the compare-and-set.
        snapshot = o.history[-1 - min(back, len(o.history) - 1)] if kind == "claim" else None
        o.feed(event, o.now + dt, snapshot=snapshot)
        o.validate()
    grants = [a for a in o.outbox if isinstance(a, GrantClaim)]
    assert len({(g.attempt, g.worker) for g in grants}) == len({g.attempt for g in grants})


def test_report_event_is_the_one_mapping_of_a_workers_reports() -> None:
    from gpulayerd.core.protocol.claims import LeaseRenewed, RunExited, RunLost, RunStarted, report_event

    assert report_event("started", 2, "w1", stimulus_id="m") == RunStarted(2, "w1", "m")
    assert report_event("renew", 2, "w1", stimulus_id="m") == LeaseRenewed(2, "w1", "m")
    assert report_event("exited", 2, "w1", exit_code=0, reason="ignored for 0") == RunExited(2, "w1", 0, "", "")
    assert report_event("exited", 2, "w1", exit_code=3, reason="oom") == RunExited(2, "w1", 3, "oom", "")
    assert report_event("lost", 2, "w1" * 10, never_started=True) == RunLost(2, "w1" * 10, "lost on w1w1w1w1w1w1",
                                                                            True, "")
    with pytest.raises(ValueError, match="unknown report kind 'done'"):
        report_event("done", 1, "w1")
