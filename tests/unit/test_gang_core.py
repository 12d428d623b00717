"""Gang placement (core.protocol.holds) and gang attempts (core.protocol.gang): events in, actions out.

Worked cases first (the crash case of issue 10 among them), then two hypothesis state
machines checked at teardown: a hold round commits on all its members or on none and
releases every hold it took otherwise; an attempt ends exactly once, ``lost`` if and only
if a member was lost before (or within ``lease_s + grace_s`` after) the first non-zero
exit, naming a dead member, else ``failed`` naming the first failing rank.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpulayerd.core.protocol import gang, holds
from gpulayerd.core.protocol.gang import (
    AbortRequested,
    EndAttempt,
    ExtendGangLease,
    GangAttempt,
    KillMembers,
    LeaseTick,
    MarkStarted,
    MemberExited,
    MemberLost,
    MemberRenewed,
    MemberStarted,
    PersistGang,
    ReplyStale,
    Verdict,
)

A, B, C = "node-a", "node-b", "node-c"
LEASE, GRACE = 4.0, 2.0


def attempt(members: tuple[str, ...] = (A, B), now: float = 0.0) -> GangAttempt:
    return GangAttempt(job_id="j1", attempt=1, hold_id="h1", members=members, master="10.0.0.1:29500",
                       lease_s=LEASE, grace_s=GRACE, renewed_at={m: now for m in members})


def step(g: GangAttempt, ev: gang.AttemptEvent, now: float) -> tuple[GangAttempt, list[gang.AttemptAction]]:
    return gang.handle(g, ev, now)


def kinds(actions: list[gang.AttemptAction]) -> list[str]:
    return [type(a).__name__ for a in actions]


def ended(actions: list[gang.AttemptAction]) -> Verdict | None:
    return next((a.verdict for a in actions if isinstance(a, EndAttempt)), None)


# ------------------------------------------------------------------ backoff and the hold round


@pytest.mark.parametrize(("k", "u", "delay"), [(0, 0.0, 0.25), (0, 0.5, 0.5), (1, 0.5, 1.0), (3, 0.0, 2.0),
                                               (6, 0.0, 15.0), (7, 0.5, 30.0), (40, 0.999, 30.0 * 1.499)])
def test_backoff_doubles_to_30_s_with_jitter(k: int, u: float, delay: float) -> None:
    assert holds.backoff_delay(k, u) == pytest.approx(delay)


def test_hold_round_holds_in_node_id_order_then_claims_then_commits_all() -> None:
    r, actions = holds.begin_round("j1", "h1", [C, A, B], 2)
    assert r.members == (A, B) and actions == [holds.SendHold(A)]
    r, actions = holds.advance_round(r, holds.HoldGranted(A, "10.0.0.1", 29500), 1.0, 0.3)
    assert actions == [holds.SendHold(B)]
    r, actions = holds.advance_round(r, holds.HoldGranted(B, "10.0.0.2", 29600), 1.0, 0.3)
    assert r.phase is holds.RoundPhase.CLAIMING
    assert actions == [holds.ClaimJob("h1", (A, B), "10.0.0.1", 29500)]
    r, actions = holds.advance_round(r, holds.ClaimGranted(3, LEASE, GRACE), 2.0, 0.3)
    assert r.phase is holds.RoundPhase.COMMITTED
    begun = actions[0]
    assert isinstance(begun, holds.AttemptBegun)
    assert (begun.gang.attempt, begun.gang.members, begun.gang.master) == (3, (A, B), "10.0.0.1:29500")
    assert begun.gang.renewed_at == {A: 2.0, B: 2.0}
    assert actions[1:] == [holds.SendCommit(A, 0, 2, 3, "10.0.0.1", 29500),
                           holds.SendCommit(B, 1, 2, 3, "10.0.0.1", 29500)]


def test_a_refused_hold_releases_the_holds_taken_and_backs_off() -> None:
    r, _ = holds.begin_round("j1", "h1", [A, B, C], 3, failures=2)
    r, _ = holds.advance_round(r, holds.HoldGranted(A, "a", 1), 0.0, 0.0)
    r, _ = holds.advance_round(r, holds.HoldGranted(B, "b", 2), 0.0, 0.0)
    r, actions = holds.advance_round(r, holds.HoldFailed(C, "refused: busy"), 0.0, 0.5)
    assert r.phase is holds.RoundPhase.RELEASED
    assert actions == [holds.ReleaseHolds("h1", (A, B)),
                       holds.RetryAfter(2.0, 3, "hold on node-c failed: refused: busy")]
    # A late reply changes nothing.
    assert holds.advance_round(r, holds.HoldGranted(C, "c", 3), 0.0, 0.5) == (r, [])


def test_a_denied_claim_releases_every_hold_without_backoff() -> None:
    r, _ = holds.begin_round("j1", "h1", [A, B], 2)
    r, _ = holds.advance_round(r, holds.HoldGranted(A, "a", 1), 0.0, 0.0)
    r, _ = holds.advance_round(r, holds.HoldGranted(B, "b", 2), 0.0, 0.0)
    r, actions = holds.advance_round(r, holds.ClaimDenied("job is cancelled"), 0.0, 0.0)
    assert actions == [holds.ReleaseHolds("h1", (A, B))]


def test_begin_round_needs_enough_distinct_candidates() -> None:
    with pytest.raises(ValueError, match="gang of 3"):
        holds.begin_round("j1", "h1", [A, B, B], 3)


# ------------------------------------------------------------------ the attempt: worked cases


def test_every_member_exiting_0_succeeds_once() -> None:
    g = attempt()
    g, actions = step(g, MemberStarted(A, 1), 1.0)
    assert kinds(actions) == ["PersistGang", "MarkStarted"] and actions[1] == MarkStarted(A)
    g, actions = step(g, MemberStarted(B, 1), 1.1)
    assert kinds(actions) == ["PersistGang"]
    g, actions = step(g, MemberRenewed(A, 1), 2.0)
    assert actions == [] and g.renewed_at[A] == 2.0  # a renewal is not persisted
    g, actions = step(g, MemberExited(A, 1, 0), 5.0)
    assert ended(actions) is None
    g, actions = step(g, MemberExited(B, 1, 0), 5.5)
    assert ended(actions) == Verdict("succeeded", "every member exited 0")
    assert isinstance(actions[0], PersistGang) and actions[0].gang.verdict is not None
    assert step(g, MemberExited(B, 1, 0), 6.0) == (g, [])


def test_crash_of_a_member_ends_the_attempt_lost_naming_it_not_failed() -> None:
    """Issue 10: B's host dies; A's collective breaks and A exits 1 first; B is lost after."""
    g = attempt()
    g, _ = step(g, MemberStarted(A, 1), 0.5)
    g, _ = step(g, MemberStarted(B, 1), 0.5)
    g, _ = step(g, MemberRenewed(A, 1), 10.0)
    g, _ = step(g, MemberRenewed(B, 1), 10.0)  # B's last word; it dies at 10.2
    g, actions = step(g, MemberExited(A, 1, 1, "exited 1"), 10.5)
    assert ended(actions) is None  # the verdict waits for the window
    assert [a for a in actions if isinstance(a, KillMembers)] == [KillMembers((B,), "gang abort: rank 0 on node-a "
                                                                                     "exited 1")]
    g, actions = step(g, LeaseTick(), 15.0)
    assert ended(actions) is None and actions[-1] == ExtendGangLease(15.0 + LEASE)
    g, actions = step(g, LeaseTick(), 16.5)  # B silent for 6.5 s > 4 + 2
    v = ended(actions)
    assert v is not None and (v.status, v.member) == ("lost", B)
    assert v.reason == ("attempt 1 lost: node-b (rank 1) was lost: no lease renewal for 4 s + 2 s grace "
                        "(rank 0 on node-a had exited 1)")
    assert not any(isinstance(a, ExtendGangLease) for a in actions)
    assert step(g, LeaseTick(), 30.0) == (g, [])


def test_the_jobs_own_failure_fails_with_the_first_failing_ranks_code() -> None:
    g = attempt((A, B, C))
    g, actions = step(g, MemberExited(B, 1, 3, "Traceback ..."), 2.0)
    assert [a for a in actions if isinstance(a, KillMembers)] == [
        KillMembers((A, C), "gang abort: rank 1 on node-b exited 3")]
    g, actions = step(g, MemberExited(A, 1, -15), 2.5)  # our kill: not a failure, not a loss
    assert ended(actions) is None and g.exits[A].killed
    g, actions = step(g, MemberExited(C, 1, 1), 2.6)  # every member accounted for: no need to wait
    assert ended(actions) == Verdict("failed", "rank 1 on node-b exited 3: Traceback ...", member=B, exit_code=3)


def test_a_failure_with_a_silent_member_fails_when_the_window_closes() -> None:
    g = attempt()
    g, _ = step(g, MemberExited(A, 1, 2), 1.0)
    for t in (2.0, 4.0, 6.0):  # B keeps renewing (its kill has not landed yet)
        g, actions = step(g, MemberRenewed(B, 1), t)
        g, actions = step(g, LeaseTick(), t)
        assert ended(actions) is None
    g, actions = step(g, LeaseTick(), 1.0 + LEASE + GRACE + 0.01)
    assert ended(actions) == Verdict("failed", "rank 0 on node-a exited 2", member=A, exit_code=2)


def test_a_loss_after_the_window_does_not_make_the_attempt_lost() -> None:
    g = attempt()
    g, _ = step(g, MemberRenewed(B, 1), 3.0)
    g, _ = step(g, MemberExited(A, 1, 1), 2.0)
    # B's lease runs out at 3 + 6 = 9 > 2 + 6: the window closed first.
    g, actions = step(g, LeaseTick(), 9.5)
    v = ended(actions)
    assert v is not None and (v.status, v.member, v.exit_code) == ("failed", A, 1)


def test_a_member_lost_before_any_failure_ends_the_attempt_lost_at_once() -> None:
    g = attempt((A, B, C))
    g, _ = step(g, MemberExited(C, 1, 0), 1.0)
    g, actions = step(g, MemberLost(B, 1, "the job's watchdog is gone"), 2.0)
    assert kinds(actions) == ["PersistGang", "KillMembers", "EndAttempt"]
    assert actions[1] == KillMembers((A,), "gang abort: node-b was lost")
    v = ended(actions)
    assert v is not None and (v.status, v.member) == ("lost", B)
    assert "node-b (rank 1) was lost: the job's watchdog is gone" in v.reason


def test_reports_on_another_attempt_are_stale_and_late_ones_change_nothing() -> None:
    g = attempt()
    assert step(g, MemberRenewed(A, 0), 1.0) == (g, [ReplyStale(A, 0, 1)])
    assert step(g, MemberRenewed("stranger", 1), 1.0) == (g, [])


def test_a_cancel_kills_every_member_once() -> None:
    g = attempt()
    g, actions = step(g, AbortRequested("cancelled by user"), 1.0)
    assert actions[1:] == [KillMembers((A, B), "cancelled by user")]
    assert step(g, AbortRequested("cancelled by user"), 1.5) == (g, [])


def test_recovered_attempt_counts_leases_as_renewed_and_restarts_the_window() -> None:
    g = attempt()
    g, _ = step(g, MemberExited(A, 1, 1), 100.0)
    r = gang.recovered(replace(g, renewed_at={A: 0.0, B: 0.0}), 5.0)
    assert r.renewed_at == {A: 5.0, B: 5.0} and r.first_failure is not None and r.first_failure.at == 5.0
    r, actions = step(r, LeaseTick(), 5.0 + LEASE + GRACE + 0.5)  # B never came back: lost in the window
    v = ended(actions)
    assert v is not None and (v.status, v.member) == ("lost", B)


# ------------------------------------------------------------------ state machines

MEMBERS = (A, B, C)


class HoldRoundMachine(RuleBasedStateMachine):
    """Random replies to a hold round; the round either commits on every member or on none."""

    @initialize(n=st.integers(1, 3), failures=st.integers(0, 8))
    def start(self, n: int, failures: int) -> None:
        self.r, first = holds.begin_round("j", "h", [C, A, B], n, failures)
        self.pending: list[holds.RoundAction] = []
        self.n = n
        self.failures = failures
        self.asked: list[str] = []
        self.held: list[str] = []
        self.released: list[str] = []
        self.commits: list[holds.SendCommit] = []
        self.retries: list[holds.RetryAfter] = []
        self.claims = 0
        self.u = 0.0
        self._absorb(first)

    def _absorb(self, actions: list[holds.RoundAction]) -> None:
        self.pending.extend(actions)
        for a in actions:
            if isinstance(a, holds.SendHold):
                self.asked.append(a.member)
            elif isinstance(a, holds.ReleaseHolds):
                self.released.extend(a.members)
            elif isinstance(a, holds.SendCommit):
                self.commits.append(a)
            elif isinstance(a, holds.RetryAfter):
                self.retries.append(a)
            elif isinstance(a, holds.ClaimJob):
                self.claims += 1

    # Holds and claims are granted 3 times in 4, so rounds of 2 and 3 members do reach a commit.
    @rule(grant=st.sampled_from([True, True, True, False]), u=st.floats(0, 0.999))
    def answer_hold(self, grant: bool, u: float) -> None:
        asks = [a for a in self.pending if isinstance(a, holds.SendHold)]
        if not asks:
            return
        self.pending.remove(asks[0])
        m = asks[0].member
        ev: holds.RoundEvent = holds.HoldGranted(m, f"addr-{m}", 1000) if grant else holds.HoldFailed(m, "no")
        if grant:
            self.held.append(m)
        else:
            self.u = u
        self.r, actions = holds.advance_round(self.r, ev, 0.0, u)
        self._absorb(actions)

    @rule(granted=st.sampled_from([True, True, True, False]))
    def answer_claim(self, granted: bool) -> None:
        claims = [a for a in self.pending if isinstance(a, holds.ClaimJob)]
        if not claims:
            return
        self.pending.remove(claims[0])
        ev = holds.ClaimGranted(7, LEASE, GRACE) if granted else holds.ClaimDenied("gone")
        self.r, actions = holds.advance_round(self.r, ev, 0.0, 0.5)
        self._absorb(actions)

    @rule(m=st.sampled_from(MEMBERS))
    def stray_reply(self, m: str) -> None:
        before = self.r
        if m not in before.members or before.phase is not holds.RoundPhase.HOLDING:
            assert holds.advance_round(before, holds.HoldGranted(m, "x", 1), 0.0, 0.0) == (before, [])

    @invariant()
    def holds_go_in_node_id_order_one_at_a_time(self) -> None:
        assert self.asked == sorted(MEMBERS)[:len(self.asked)]
        assert len([a for a in self.pending if isinstance(a, holds.SendHold)]) <= 1

    def teardown(self) -> None:
        members = tuple(sorted(MEMBERS)[:self.n])
        if self.r.phase is holds.RoundPhase.COMMITTED:
            assert len(self.commits) == self.n, (self.n, self.commits)
        if self.commits:  # all or nothing: every member, each held, ranks in node-id order
            assert [(c.member, c.rank, c.nnodes) for c in self.commits] == [
                (m, i, self.n) for i, m in enumerate(members)]
            assert self.held == list(members) and self.released == [] and self.claims == 1
            assert len({(c.master_addr, c.master_port) for c in self.commits}) == 1
            assert self.commits[0].master_addr == f"addr-{members[0]}"
        if self.r.phase is holds.RoundPhase.RELEASED:  # every hold taken was given back
            assert sorted(self.released) == sorted(self.held) and self.commits == []
            if self.retries:
                assert len(self.retries) == 1 and self.retries[0].failures == self.failures + 1
                assert self.retries[0].delay_s == holds.backoff_delay(self.failures, self.u)


class AttemptMachine(RuleBasedStateMachine):
    """Random reports and ticks on a three-member attempt, with a model of who was lost when."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.g = attempt(MEMBERS)
        self.ends: list[Verdict] = []
        self.last_word = dict.fromkeys(MEMBERS, 0.0)
        self.exits: dict[str, int | None] = {}
        self.losses: dict[str, float] = {}  # member -> when it was lost (model)
        self.first_fail: tuple[str, float] | None = None
        self.end_at: float | None = None
        self.killed_after: float | None = None

    def _feed(self, ev: gang.AttemptEvent) -> list[gang.AttemptAction]:
        was_ended = self.g.verdict is not None
        self.g, actions = gang.handle(self.g, ev, self.now)
        v = ended(actions)
        if v is not None:
            assert not was_ended
            self.ends.append(v)
            self.end_at = self.now
        if was_ended:
            assert actions == [] or all(isinstance(a, ReplyStale) for a in actions)
        if any(isinstance(a, KillMembers) for a in actions) and self.killed_after is None:
            self.killed_after = self.now
        return actions

    def _open(self, m: str) -> bool:
        return self.g.verdict is None and m not in self.exits and m not in self.losses

    @rule(dt=st.floats(0.0, 5.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(m=st.sampled_from(MEMBERS), started=st.booleans())
    def member_speaks(self, m: str, started: bool) -> None:
        if self._open(m):
            self.last_word[m] = self.now
        self._feed(MemberStarted(m, 1) if started else MemberRenewed(m, 1))

    @rule(m=st.sampled_from(MEMBERS), code=st.sampled_from([0, 0, 1, -15, None]))
    def member_exits(self, m: str, code: int | None) -> None:
        if self._open(m):
            self.exits[m] = code
            if code != 0 and self.first_fail is None:
                self.first_fail = (m, self.now)
        self._feed(MemberExited(m, 1, code))

    @rule(m=st.sampled_from(MEMBERS))
    def member_reports_lost(self, m: str) -> None:
        if self._open(m):
            self.losses[m] = self.now
        self._feed(MemberLost(m, 1, "gone"))

    @rule()
    def tick(self) -> None:
        if self.g.verdict is None:
            for m in MEMBERS:
                if m not in self.exits and m not in self.losses and self.now - self.last_word[m] > LEASE + GRACE:
                    self.losses[m] = self.last_word[m] + LEASE + GRACE
        self._feed(LeaseTick())

    @rule()
    def stale_report(self) -> None:
        assert self._feed(MemberRenewed(A, 0)) == [ReplyStale(A, 0, 1)]

    @precondition(lambda self: self.g.verdict is None)
    @invariant()
    def open_attempt_has_no_counting_loss(self) -> None:
        assert not self._counting_losses()

    def _counting_losses(self) -> list[str]:
        window = LEASE + GRACE
        ff = self.first_fail
        return [m for m, at in self.losses.items() if ff is None or at <= ff[1] + window]

    def teardown(self) -> None:
        self.now += 100.0
        self.tick()  # everyone still open is silent by now: the attempt must end
        assert len(self.ends) == 1, self.ends
        v = self.ends[0]
        counting = self._counting_losses()
        if counting:
            assert v.status == "lost" and v.member in counting, (v, self.losses, self.first_fail)
            assert v.member is not None and v.member in v.reason
        elif self.first_fail is not None:
            m, at = self.first_fail
            assert (v.status, v.member, v.exit_code) == ("failed", m, self.exits[m])
            assert f"rank {MEMBERS.index(m)} on {m} exited" in v.reason
            assert self.end_at is not None
            assert self.end_at > at + LEASE + GRACE or all(x in self.exits or x in self.losses for x in MEMBERS)
        else:
            assert v.status == "succeeded" and self.exits == dict.fromkeys(MEMBERS, 0), (v, self.exits)


TestHoldRound = HoldRoundMachine.TestCase
TestHoldRound.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
TestAttempt = AttemptMachine.TestCase
TestAttempt.pytestmark = [pytest.mark.slow]  # (hypothesis: 300 sequences, ~2 s)
TestAttempt.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
