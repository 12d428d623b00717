"""The worker's bookkeeping (gpulayerd.core.protocol.worker): examples, then a hypothesis state machine.

A small in-test worker feeds events to :func:`handle` and records every step; at teardown
``validate()`` checks the invariants over the whole history: a device is never in two of
(a claim in flight, a hold, a run); an attempt ends once; an end report is owed until its
owner acknowledges it and never sent after; a deadline moves only forward, and only on an
answered renewal; one claim in flight per offer; one renewal round in flight per owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpulayerd.core.protocol.worker import (
    OFFER_KEPT_S,
    Action,
    ClaimAnswered,
    ConsiderOffer,
    DropHold,
    DropOffer,
    Event,
    ExtendDeadline,
    HoldCommitted,
    HoldPlaced,
    HoldReleased,
    HoldsChecked,
    KeepHold,
    KillAsked,
    KillRun,
    OfferFits,
    OfferReceived,
    OfferRejected,
    OffersReviewed,
    OwedReport,
    RecordEnd,
    RefuseCommit,
    RefuseHold,
    RefuseKill,
    RenewalAnswered,
    ReportAnswered,
    ReportOwed,
    RoundEnded,
    RunEnded,
    RunStarted,
    SendClaim,
    SendRenewals,
    SendReport,
    StartRun,
    Tick,
    WorkerState,
    handle,
)

A, B = "owner-a", "owner-b"
G0, G1 = frozenset({"GPU-0"}), frozenset({"GPU-1"})


@dataclass
class Step:
    event: Event
    now: float
    before: WorkerState
    after: WorkerState
    actions: list[Action]


@dataclass
class Worker:
    """Feeds events to handle() and keeps every step."""

    state: WorkerState = field(default_factory=WorkerState)
    now: float = 100.0
    steps: list[Step] = field(default_factory=list)

    def feed(self, event: Event, now: float | None = None) -> list[Action]:
        if now is not None:
            assert now >= self.now
            self.now = now
        before = self.state
        after, actions = handle(before, event, self.now)
        assert before == self.steps[-1].after if self.steps else True
        self.state = after
        self.steps.append(Step(event, self.now, before, after, actions))
        return actions

    def validate(self) -> None:
        ended: set[tuple[str, int]] = set()
        acked: set[tuple[str, int]] = set()
        for s in self.steps:
            _disjoint_devices(s.after)
            # An attempt ends once: RecordEnd at most once per key, and an ended key never runs again.
            for a in s.actions:
                if isinstance(a, RecordEnd):
                    assert a.key not in ended, f"attempt {a.key} ended twice"
                    ended.add(a.key)
            assert not (set(s.after.runs) & ended), s
            # Reports: owed until acknowledged, never sent after.
            for key in s.before.owed:
                if key not in s.after.owed:
                    assert s.event == ReportAnswered(key, True), f"report {key} left without an ack: {s.event}"
                    acked.add(key)
            sent = [a.key for a in s.actions if isinstance(a, SendReport)]
            sent += [k for a in s.actions if isinstance(a, SendRenewals) for k in a.reports]
            assert not (set(sent) & acked), f"acknowledged report sent again: {s}"
            assert len(sent) == len(set(sent)), s
            for k in sent:
                assert not s.before.owed.get(k, OwedReport("", "exited", None, "")).sending, "two sends in flight"
                assert s.after.owed[k].sending
            # Deadlines move only forward, only on an answered renewal of that run.
            for key, run in s.after.runs.items():
                old = s.before.runs.get(key)
                if old is not None and old.running and run.deadline != old.deadline:
                    assert run.deadline > old.deadline, s
                    assert isinstance(s.event, RenewalAnswered) and s.event.key == key and s.event.answer == "ok", s
                    assert ExtendDeadline(key, run.deadline) in s.actions
            # One claim in flight per offer; one round in flight per owner.
            for a in s.actions:
                if isinstance(a, SendClaim):
                    assert s.before.offers[(a.owner, a.job_id)].claiming is None, s
                if isinstance(a, SendRenewals):
                    assert a.owner not in s.before.rounds, s


def _disjoint_devices(state: WorkerState) -> None:
    seen: dict[str, str] = {}
    holders = [(f"claim {k}", o.claiming or frozenset()) for k, o in state.offers.items()]
    holders += [(f"hold {k}", h.devices) for k, h in state.holds.items()]
    holders += [(f"run {k}", r.devices) for k, r in state.runs.items()]
    for who, devices in holders:
        for d in devices:
            assert d not in seen, f"{d} held by {seen[d]} and {who}"
            seen[d] = who


@pytest.fixture
def make_worker() -> Iterator[Callable[[], Worker]]:
    workers: list[Worker] = []

    def make() -> Worker:
        workers.append(Worker())
        return workers[-1]

    yield make
    for w in workers:
        w.validate()


@pytest.fixture
def w(make_worker: Callable[[], Worker]) -> Worker:
    return make_worker()


def granted_run(w: Worker, owner: str = A, job: str = "j1", attempt: int = 1, devices: frozenset[str] = G0) -> None:
    w.feed(OfferReceived(owner, job))
    assert w.feed(OfferFits(owner, job, devices)) == [SendClaim(owner, job, devices)]
    acts = w.feed(ClaimAnswered(owner, job, "granted", attempt, 30.0))
    assert acts == [DropOffer(owner, job, "claim granted"), StartRun((job, attempt), owner, 30.0)]
    w.feed(RunStarted((job, attempt), owner, 30.0))


# ------------------------------------------------------------------ offers and claims


def test_offers_are_reviewed_oldest_first_and_dropped_after_they_are_kept_too_long(w: Worker) -> None:
    w.feed(OfferReceived(A, "j1"))
    w.feed(OfferReceived(B, "j2"), 110.0)
    assert w.feed(OffersReviewed(), 150.0) == [ConsiderOffer(A, "j1"), ConsiderOffer(B, "j2")]
    acts = w.feed(OffersReviewed(), 100.0 + OFFER_KEPT_S + 1)
    assert acts == [DropOffer(A, "j1", "not claimed in time"), ConsiderOffer(B, "j2")]
    assert list(w.state.offers) == [(B, "j2")]


def test_one_claim_in_flight_per_offer(w: Worker) -> None:
    w.feed(OfferReceived(A, "j1"))
    assert w.feed(OfferFits(A, "j1", G0)) == [SendClaim(A, "j1", G0)]
    w.feed(OfferReceived(A, "j1"), 101.0)  # the owner offers again meanwhile
    assert w.feed(OffersReviewed()) == []
    assert w.feed(OfferFits(A, "j1", G0)) == []
    assert w.state.offers[(A, "j1")].claiming == G0


@pytest.mark.parametrize("outcome", ["denied", "failed"])
def test_a_claim_not_granted_drops_the_offer(w: Worker, outcome: str) -> None:
    w.feed(OfferReceived(A, "j1"))
    w.feed(OfferFits(A, "j1", G0))
    assert w.feed(ClaimAnswered(A, "j1", outcome)) == [DropOffer(A, "j1", f"claim {outcome}")]  # type: ignore[arg-type]
    assert w.state == WorkerState()


def test_an_offer_of_a_job_running_here_is_acknowledged_not_claimed(w: Worker) -> None:
    granted_run(w)
    assert w.feed(OfferReceived(A, "j1")) == [DropOffer(A, "j1", "already running it")]
    assert w.state.offers == {}


def test_a_duplicate_grant_starts_nothing(w: Worker) -> None:
    granted_run(w)
    w.feed(OfferReceived(B, "j1"))  # another owner, same job id: kept
    w.feed(OfferFits(B, "j1", G1))
    acts = w.feed(ClaimAnswered(B, "j1", "granted", 1, 30.0))
    assert acts == [DropOffer(B, "j1", "claim granted")]


def test_a_claim_for_a_device_in_use_waits(w: Worker) -> None:
    granted_run(w)
    w.feed(OfferReceived(B, "j2"))
    assert w.feed(OfferFits(B, "j2", G0)) == []
    assert (B, "j2") in w.state.offers


def test_a_bad_offer_is_dropped(w: Worker) -> None:
    w.feed(OfferReceived(A, "j1"))
    assert w.feed(OfferRejected(A, "j1")) == [DropOffer(A, "j1", "bad offer")]


# ------------------------------------------------------------------ this node's own jobs


ME = "owner-me"  # this worker's own node id: a job owned here is offered, claimed and renewed as a peer's


def test_an_own_jobs_claim_for_a_held_device_waits_as_a_peers_does(w: Worker) -> None:
    w.feed(HoldPlaced("h1", A, "g1", G0, 10.0))
    w.feed(OfferReceived(ME, "j9"))
    assert w.feed(OfferFits(ME, "j9", G0)) == []  # kept: claimed when the device is free here
    assert w.feed(OfferFits(ME, "j9", G1)) == [SendClaim(ME, "j9", G1)]


def test_runs_renew_in_one_round_per_owner_this_node_included(w: Worker) -> None:
    granted_run(w, ME, "loc", devices=G1)
    granted_run(w, A, "j1")
    granted_run(w, A, "j2", devices=frozenset())
    granted_run(w, B, "j3", devices=frozenset())
    acts = w.feed(Tick(), 101.0)
    assert acts == [SendRenewals(A, (("j1", 1), ("j2", 1)), ()), SendRenewals(B, (("j3", 1),), ()),
                    SendRenewals(ME, (("loc", 1),), ())]
    # A is frozen: its round stays in flight; B and this node answer and get their next round.
    w.feed(RenewalAnswered(("j3", 1), "ok", 101.0), 102.0)
    w.feed(RoundEnded(B))
    w.feed(RoundEnded(ME))
    assert w.feed(Tick(), 103.0) == [SendRenewals(B, (("j3", 1),), ()), SendRenewals(ME, (("loc", 1),), ())]
    assert w.state.runs[("j3", 1)].deadline == 131.0
    assert w.state.runs[("j1", 1)].deadline == 130.0  # unanswered: it stays


def test_an_answered_renewal_moves_the_deadline_forward_only(w: Worker) -> None:
    granted_run(w)
    assert w.feed(RenewalAnswered(("j1", 1), "ok", 105.0), 106.0) == [ExtendDeadline(("j1", 1), 135.0)]
    assert w.feed(RenewalAnswered(("j1", 1), "ok", 104.0), 107.0) == []  # an older round answered late
    assert w.feed(RenewalAnswered(("j1", 1), "none", 107.0)) == []
    assert w.state.runs[("j1", 1)].deadline == 135.0


def test_a_stale_renewal_kills_the_run(w: Worker) -> None:
    granted_run(w)
    assert w.feed(RenewalAnswered(("j1", 1), "stale", 101.0)) == [KillRun(("j1", 1), "stale at its owner")]


# ------------------------------------------------------------------ reports


def test_an_end_is_reported_until_acknowledged_then_never_again(w: Worker) -> None:
    granted_run(w)
    owed = OwedReport(A, "exited", 3, "exited 3", sending=True)
    assert w.feed(RunEnded(("j1", 1), A, "exited", 3, "exited 3")) == [RecordEnd(("j1", 1), A),
                                                                       SendReport(("j1", 1), owed)]
    assert w.feed(Tick(), 101.0) == []  # its send is in flight
    w.feed(ReportAnswered(("j1", 1), False))
    assert w.feed(Tick(), 102.0) == [SendRenewals(A, (), (("j1", 1),))]
    w.feed(RoundEnded(A))  # timed out: retried at the next tick
    assert w.feed(Tick(), 103.0) == [SendRenewals(A, (), (("j1", 1),))]
    w.feed(ReportAnswered(("j1", 1), True))
    w.feed(RoundEnded(A))
    assert w.feed(Tick(), 104.0) == []
    # Found again in the store before the acknowledgement was written: still not owed.
    assert w.feed(ReportOwed(("j1", 1), owed)) == []
    assert w.feed(Tick(), 105.0) == []


def test_an_attempt_ends_once(w: Worker) -> None:
    granted_run(w)
    w.feed(RunEnded(("j1", 1), A, "exited", 0))
    assert w.feed(RunEnded(("j1", 1), A, "lost")) == []
    assert w.feed(RunStarted(("j1", 1), A, 30.0)) == []
    assert w.state.runs == {}


def test_reports_left_by_a_previous_life_are_sent(w: Worker) -> None:
    w.feed(ReportOwed(("old", 2), OwedReport(B, "lost", None, "gone")))
    assert w.feed(Tick()) == [SendRenewals(B, (), (("old", 2),))]


# ------------------------------------------------------------------ holds, kills


def test_holds_are_kept_released_committed_or_expire(w: Worker) -> None:
    assert w.feed(HoldPlaced("h1", A, "g1", G0, 10.0)) == [KeepHold("h1", 110.0)]
    assert w.feed(HoldPlaced("h2", B, "g2", G0, 10.0)) == [RefuseHold("h2", "a device is in use here")]
    assert w.feed(HoldReleased("h1", B)) == []  # not B's
    assert w.feed(HoldReleased("h1", A)) == [DropHold("h1", "released")]
    w.feed(HoldPlaced("h3", A, "g1", G0, 10.0))
    assert w.feed(HoldCommitted("h3", B, ("g1", 1), 30.0)) == [RefuseCommit("h3", "no such hold (expired?)")]
    assert w.feed(HoldCommitted("h3", A, ("g1", 1), 30.0)) == [StartRun(("g1", 1), A, 30.0, "h3")]
    assert w.state.runs[("g1", 1)].devices == G0
    w.feed(HoldPlaced("h4", A, "g2", G1, 5.0))
    assert w.feed(HoldsChecked(), 105.0) == []
    assert w.feed(HoldsChecked(), 105.5) == [DropHold("h4", "expired")]


def test_only_the_owner_may_kill_a_running_attempt(w: Worker) -> None:
    granted_run(w)
    assert w.feed(KillAsked(("j1", 1), B)) == [RefuseKill(("j1", 1), "no such attempt here")]
    assert w.feed(KillAsked(("j1", 1), A, "cancel")) == [KillRun(("j1", 1), "cancel")]


# ------------------------------------------------------------------ state machine

OWNERS = st.sampled_from([A, B, ME])
JOBS = st.sampled_from(["j1", "j2", "j3"])
DEVICES = st.frozensets(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), max_size=2)


class WorkerMachine(RuleBasedStateMachine):
    """Random interleavings of everything the services feed; invariants after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.w = Worker()
        self.attempts = 0
        self.sent_at: dict[tuple[str, int], float] = {}

    def teardown(self) -> None:
        self.w.validate()

    def _feed(self, event: Event) -> list[Action]:
        return self.w.feed(event)

    @rule(dt=st.floats(0, 40))
    def time_passes(self, dt: float) -> None:
        self.w.now += dt

    @rule(owner=OWNERS, job=JOBS)
    def offer(self, owner: str, job: str) -> None:
        self._feed(OfferReceived(owner, job))

    @rule(what=st.sampled_from(["review", "expire", "ask"]))
    def periodic(self, what: str) -> None:
        if what == "review":
            self._feed(OffersReviewed())
        elif what == "expire":
            self._feed(HoldsChecked())
        else:  # the offers most likely to be claimed next: those kept now
            for (owner, job), o in sorted(self.w.state.offers.items()):
                if o.claiming is None:
                    self._feed(OfferFits(owner, job, frozenset()))
                    break

    @rule(owner=OWNERS, job=JOBS)
    def reject(self, owner: str, job: str) -> None:
        self._feed(OfferRejected(owner, job))

    @rule(owner=OWNERS, job=JOBS, devices=DEVICES)
    def fits(self, owner: str, job: str, devices: frozenset[str]) -> None:
        self._feed(OfferFits(owner, job, devices))

    @rule(owner=OWNERS, job=JOBS, outcome=st.sampled_from(["granted", "denied", "failed"]), dup=st.booleans())
    def answer_claim(self, owner: str, job: str, outcome: str, dup: bool) -> None:
        if not dup:
            self.attempts += 1
        self._feed(ClaimAnswered(owner, job, outcome, max(self.attempts, 1), 30.0))  # type: ignore[arg-type]

    @precondition(lambda self: any(not r.running for r in self.w.state.runs.values()))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, r in self.w.state.runs.items() if not r.running)))
        self._feed(RunStarted(key, self.w.state.runs[key].owner, self.w.state.runs[key].lease_s))

    @rule(owner=OWNERS)
    def adopt(self, owner: str) -> None:
        self.attempts += 1
        self._feed(RunStarted((f"adopted{self.attempts}", 1), owner, 30.0))

    @precondition(lambda self: bool(self.w.state.runs) or bool(self.w.state.ended))
    @rule(data=st.data(), kind=st.sampled_from(["exited", "lost"]), report=st.booleans())
    def end(self, data: st.DataObject, kind: str, report: bool) -> None:
        key = data.draw(st.sampled_from(sorted({*self.w.state.runs, *self.w.state.ended})))
        run = self.w.state.runs.get(key)
        self._feed(RunEnded(key, run.owner if run else A, kind, 1, "x", report=report))  # type: ignore[arg-type]

    @rule(owner=OWNERS)
    def found_owed(self, owner: str) -> None:
        self.attempts += 1
        self._feed(ReportOwed((f"old{self.attempts}", 1), OwedReport(owner, "exited", 0, "")))

    @precondition(lambda self: bool(self.w.state.owed) or bool(self.w.state.ended))
    @rule(data=st.data(), acked=st.booleans())
    def report_answered(self, data: st.DataObject, acked: bool) -> None:
        key = data.draw(st.sampled_from(sorted({*self.w.state.owed, *self.w.state.ended})))
        self._feed(ReportAnswered(key, acked))

    @rule(times=st.integers(1, 2))
    def tick(self, times: int) -> None:
        for a in self._feed(Tick()):
            if isinstance(a, SendRenewals):
                for k in a.runs:
                    self.sent_at[k] = self.w.now

    @precondition(lambda self: bool(self.sent_at))
    @rule(data=st.data(), answer=st.sampled_from(["ok", "stale", "none"]))
    def renewal_answered(self, data: st.DataObject, answer: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.sent_at)))
        self._feed(RenewalAnswered(key, answer, self.sent_at[key]))  # type: ignore[arg-type]

    @rule(owner=OWNERS)
    def round_ended(self, owner: str) -> None:
        self._feed(RoundEnded(owner))

    @rule(hold=st.sampled_from(["h1", "h2", "h3"]), owner=OWNERS, job=JOBS, devices=DEVICES,
          ttl=st.floats(1, 30))
    def hold(self, hold: str, owner: str, job: str, devices: frozenset[str], ttl: float) -> None:
        self._feed(HoldPlaced(hold, owner, job, devices, ttl))

    @rule(hold=st.sampled_from(["h1", "h2", "h3"]), owner=OWNERS)
    def release(self, hold: str, owner: str) -> None:
        self._feed(HoldReleased(hold, owner))

    @rule(hold=st.sampled_from(["h1", "h2", "h3"]), owner=OWNERS, dup=st.booleans())
    def commit(self, hold: str, owner: str, dup: bool) -> None:
        if not dup:
            self.attempts += 1
        self._feed(HoldCommitted(hold, owner, (f"g{hold}", max(self.attempts, 1)), 30.0))

    @rule(data=st.data(), owner=OWNERS)
    def kill(self, data: st.DataObject, owner: str) -> None:
        keys = sorted(self.w.state.runs) or [("none", 1)]
        self._feed(KillAsked(data.draw(st.sampled_from(keys)), owner))

    @invariant()
    def devices_are_never_shared(self) -> None:
        _disjoint_devices(self.w.state)


TestWorkerMachine = WorkerMachine.TestCase
TestWorkerMachine.pytestmark = [pytest.mark.slow]  # (hypothesis: 400 sequences, ~6 s)
TestWorkerMachine.settings = settings(max_examples=400, stateful_step_count=50, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


def test_an_owner_that_floods_offers_fills_only_its_own_share() -> None:
    from gpulayerd.core.protocol.worker import MAX_OFFERS_PER_OWNER, TOO_MANY_OFFERS, OfferReceived, WorkerState, handle

    state = WorkerState()
    for n in range(MAX_OFFERS_PER_OWNER):
        state, actions = handle(state, OfferReceived("flooder", f"j{n}"), 1.0)
        assert actions == []
    state, actions = handle(state, OfferReceived("flooder", "one-more"), 1.0)
    assert [(a.job_id, a.reason) for a in actions] == [("one-more", TOO_MANY_OFFERS)]  # type: ignore[attr-defined]
    assert ("flooder", "one-more") not in state.offers and len(state.offers) == MAX_OFFERS_PER_OWNER
    state, actions = handle(state, OfferReceived("flooder", "j7"), 2.0)  # a repeated offer is refreshed
    assert actions == [] and state.offers[("flooder", "j7")].received_at == 2.0
    state, actions = handle(state, OfferReceived("another-owner", "k1"), 2.0)  # others are not crowded out
    assert actions == [] and ("another-owner", "k1") in state.offers
