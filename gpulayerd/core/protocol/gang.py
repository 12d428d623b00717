"""Gang attempts of multi-host jobs (the owner's side): events in, actions out.

Pure like :mod:`gpulayerd.core.protocol.claims`: no I/O, no clock (``now`` comes with every call,
in seconds of the owner's monotonic clock). The owner's gang coordinator carries out the
actions and feeds what happened back as events. How a gang is placed (holds in node-id
order, backoff, commit) is :mod:`gpulayerd.core.protocol.holds`.

**The attempt** (:class:`GangAttempt`): members report started, renewals, their exit
(code) or their loss; a lease tick declares lost a member that sent nothing for
``lease_s + grace_s``. The verdict, given exactly once:

- every member exited 0: ``succeeded``;
- a member was lost before the first non-zero exit of any rank, or within the window
  after it: ``lost``, naming that member (the job then retries as its policy says).
  The window is ``lease_s + grace_s``, not the bare ``lease_s``: a member that died
  just before the first failure (which its death usually causes: the other ranks'
  collectives break) is only *declared* lost ``lease_s + grace_s`` after its last
  renewal, and that renewal came before the failure. A loss by a missed lease counts
  as happening when the lease (plus grace) ran out, not when a tick noticed it;
- otherwise the first non-zero exit is the job's own failure: ``failed`` with that
  rank's exit code, the reason naming that rank's host.

On the first non-zero exit every other member is killed at once; the verdict waits
until the window closes or every member is accounted for (exited, or lost). A member
whose exit our kill caused exited: it is not lost. A loss a member reports itself (its
watchdog is gone, or its commit failed) counts as a loss like a missed lease.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "AbortRequested", "AttemptAction", "AttemptEvent", "EndAttempt", "Exit", "ExtendGangLease", "Failure",
    "GangAttempt", "KillMembers", "LeaseTick", "Loss", "MarkStarted", "MemberExited", "MemberLost",
    "MemberRenewed", "MemberStarted", "PersistGang", "ReplyStale", "Verdict", "handle", "recovered",
]


@dataclass(frozen=True, slots=True)
class Exit:
    """A member's exit: its code (None: unknown), when (owner-monotonic s), and whether our kill caused it."""

    code: int | None
    at: float
    reason: str = ""
    killed: bool = False


@dataclass(frozen=True, slots=True)
class Loss:
    """A member declared lost at ``at`` (owner-monotonic s; a missed lease: when it ran out)."""

    at: float
    reason: str


@dataclass(frozen=True, slots=True)
class Failure:
    """The first non-zero exit of any rank."""

    member: str
    code: int | None
    at: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """How the attempt ended: ``succeeded``, ``failed`` (the job's own failure) or ``lost``.

    Attributes:
        member: the member the verdict names (the dead one, or the first to fail); None on success.
        exit_code: the failing rank's exit code (``failed`` only).
    """

    status: str
    reason: str
    member: str | None = None
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class GangAttempt:
    """The owner's view of one running gang attempt (treat the mappings as read-only).

    Attributes:
        members: node ids in rank order (rank 0 first).
        master: rank 0's ``address:port``.
        lease_s, grace_s: a member that sends nothing for ``lease_s + grace_s`` is lost.
        renewed_at: each member's last word (owner-monotonic s). Not persisted: a
            restarted owner counts every lease as renewed at its restart.
        killed: the other members were told to stop (after the first failure or a loss).
        verdict: set once, when the attempt ends.
    """

    job_id: str
    attempt: int
    hold_id: str
    members: tuple[str, ...]
    master: str
    lease_s: float
    grace_s: float
    renewed_at: Mapping[str, float] = field(default_factory=dict)
    started: frozenset[str] = frozenset()
    exits: Mapping[str, Exit] = field(default_factory=dict)
    lost: Mapping[str, Loss] = field(default_factory=dict)
    first_failure: Failure | None = None
    killed: bool = False
    verdict: Verdict | None = None

    @property
    def window_s(self) -> float:
        """How long after the first failure a loss still makes the attempt ``lost``."""
        return self.lease_s + self.grace_s

    def rank(self, member: str) -> int:
        """``member``'s rank. Raises ValueError if it is not a member."""
        return self.members.index(member)

    def durable(self) -> tuple[object, ...]:
        """What is persisted (everything but the renewal times); a change means a write."""
        return (self.attempt, self.hold_id, self.members, self.master, self.lease_s, self.started,
                tuple(sorted(self.exits.items())), tuple(sorted(self.lost.items())), self.first_failure,
                self.killed, self.verdict)


@dataclass(frozen=True, slots=True)
class MemberStarted:
    """``member`` started its rank of ``attempt``."""

    member: str
    attempt: int


@dataclass(frozen=True, slots=True)
class MemberRenewed:
    """``member`` renewed its lease on ``attempt``."""

    member: str
    attempt: int


@dataclass(frozen=True, slots=True)
class MemberExited:
    """``member``'s rank of ``attempt`` exited with ``exit_code`` (None: unknown)."""

    member: str
    attempt: int
    exit_code: int | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class MemberLost:
    """``member``'s rank of ``attempt`` is gone without an exit status (or its commit failed)."""

    member: str
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class LeaseTick:
    """Periodic check: members silent for ``lease_s + grace_s`` are lost; the failure window may close."""


@dataclass(frozen=True, slots=True)
class AbortRequested:
    """Stop every member (a cancel): their exits then end the attempt as usual."""

    reason: str


AttemptEvent = MemberStarted | MemberRenewed | MemberExited | MemberLost | LeaseTick | AbortRequested


@dataclass(frozen=True, slots=True)
class PersistGang:
    """Write the attempt's durable state (see :meth:`GangAttempt.durable`) before anything else."""

    gang: GangAttempt


@dataclass(frozen=True, slots=True)
class MarkStarted:
    """The first member started: the job is running (on ``member`` first)."""

    member: str


@dataclass(frozen=True, slots=True)
class ExtendGangLease:
    """The attempt is alive: the job's lease now ends at ``expires_at`` (owner-monotonic s)."""

    expires_at: float


@dataclass(frozen=True, slots=True)
class KillMembers:
    """Stop the ranks of the attempt on ``members`` (the rest of the gang is done for)."""

    members: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class EndAttempt:
    """The attempt is over: apply ``verdict`` to the job (exactly once per attempt)."""

    verdict: Verdict


@dataclass(frozen=True, slots=True)
class ReplyStale:
    """The report named another attempt than ``current_attempt``: its rank must die."""

    member: str
    attempt: int
    current_attempt: int


AttemptAction = PersistGang | MarkStarted | ExtendGangLease | KillMembers | EndAttempt | ReplyStale


def handle(g: GangAttempt, event: AttemptEvent, now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    """What ``event`` does to the attempt at owner-monotonic ``now``.

    Returns:
        The new attempt and the actions to carry out in order; a :class:`PersistGang` comes
        first whenever the durable state changed. An ended attempt changes no more (a late
        report yields nothing; a report on another attempt yields :class:`ReplyStale`).
    """
    if not isinstance(event, (LeaseTick, AbortRequested)):
        if event.attempt != g.attempt:
            return g, [ReplyStale(event.member, event.attempt, g.attempt)]
        if event.member not in g.members or g.verdict is not None:
            return g, []
    if g.verdict is not None:
        return g, []
    new, actions = _step(g, event, now)
    if new.durable() != g.durable():
        actions.insert(0, PersistGang(new))
    return new, actions


def _step(g: GangAttempt, event: AttemptEvent, now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    if isinstance(event, LeaseTick):
        return _tick(g, now)
    if isinstance(event, AbortRequested):
        if g.killed:
            return g, []
        others = tuple(x for x in g.members if x not in g.exits and x not in g.lost)
        return replace(g, killed=True), [KillMembers(others, event.reason)] if others else []
    m = event.member
    if m in g.exits or m in g.lost:
        return g, []  # a member that is accounted for says no more
    g = replace(g, renewed_at={**g.renewed_at, m: now})
    if isinstance(event, MemberRenewed):
        return g, []
    if isinstance(event, MemberStarted):
        if m in g.started:
            return g, []
        first = not g.started
        g = replace(g, started=g.started | {m})
        return g, [MarkStarted(m)] if first else []
    if isinstance(event, MemberLost):
        return _lose(g, [(m, Loss(now, event.reason))], now)
    return _exit(g, m, event.exit_code, event.reason, now)


def _exit(g: GangAttempt, m: str, code: int | None, reason: str, now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    g = replace(g, exits={**g.exits, m: Exit(code, now, reason, killed=g.killed)})
    actions: list[AttemptAction] = []
    if code != 0 and g.first_failure is None:
        g = replace(g, first_failure=Failure(m, code, now, reason), killed=True)
        others = tuple(x for x in g.members if x not in g.exits)
        if others:
            actions.append(KillMembers(others, f"gang abort: rank {g.rank(m)} on {m} exited {_code(code)}"))
    g, end = _conclude(g, now)
    return g, actions + end


def _lose(g: GangAttempt, losses: list[tuple[str, Loss]], now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    """Record losses (in order); the first that counts ends the attempt ``lost``."""
    lost = dict(g.lost)
    for m, loss in losses:
        lost[m] = loss
    g = replace(g, lost=lost)
    ff = g.first_failure
    for m, loss in losses:
        if ff is None or loss.at <= ff.at + g.window_s:
            reason = f"attempt {g.attempt} lost: {m} (rank {g.rank(m)}) was lost: {loss.reason}"
            if ff is not None:
                reason += f" (rank {g.rank(ff.member)} on {ff.member} had exited {_code(ff.code)})"
            actions: list[AttemptAction] = []
            if not g.killed:
                others = tuple(x for x in g.members if x not in g.exits and x != m)
                g = replace(g, killed=True)
                if others:
                    actions.append(KillMembers(others, f"gang abort: {m} was lost"))
            v = Verdict("lost", reason, member=m)
            return replace(g, verdict=v), [*actions, EndAttempt(v)]
    return _conclude(g, now)


def _tick(g: GangAttempt, now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    limit = g.lease_s + g.grace_s
    late = sorted(
        (g.renewed_at.get(m, now) + limit, g.rank(m), m) for m in g.members
         if m not in g.exits and m not in g.lost and now - g.renewed_at.get(m, now) > limit)
    if late:
        g, actions = _lose(g, [(m, Loss(at, f"no lease renewal for {g.lease_s:g} s + {g.grace_s:g} s grace"))
                               for at, _r, m in late], now)
    else:
        g, actions = _conclude(g, now)
    if g.verdict is None:
        actions.append(ExtendGangLease(now + g.lease_s))
    return g, actions


def _conclude(g: GangAttempt, now: float) -> tuple[GangAttempt, list[AttemptAction]]:
    """End the attempt if its verdict is known (a loss that counts is handled by :func:`_lose`)."""
    if g.verdict is not None:
        return g, []
    ff = g.first_failure
    accounted = all(m in g.exits or m in g.lost for m in g.members)
    if ff is None:
        if accounted and not g.lost:
            v = Verdict("succeeded", "every member exited 0")
            return replace(g, verdict=v), [EndAttempt(v)]
        return g, []
    if accounted or now > ff.at + g.window_s:
        reason = f"rank {g.rank(ff.member)} on {ff.member} exited {_code(ff.code)}"
        if ff.reason:
            reason += f": {ff.reason}"
        v = Verdict("failed", reason, member=ff.member, exit_code=ff.code)
        return replace(g, verdict=v), [EndAttempt(v)]
    return g, []


def _code(code: int | None) -> str:
    if code is None:
        return "with an unknown status"
    return f"by signal {-code}" if code < 0 else str(code)


def recovered(g: GangAttempt, now: float) -> GangAttempt:
    """The attempt as a restarted owner resumes it at ``now``: every lease counts as renewed
    now, and a pending failure's window starts again now (the old monotonic times mean
    nothing after a restart)."""
    ff = g.first_failure
    return replace(
        g, renewed_at={m: now for m in g.members},
        first_failure=None if ff is None else replace(ff, at=now),
        exits={m: replace(e, at=now) for m, e in g.exits.items()},
        lost={m: replace(loss, at=now) for m, loss in g.lost.items()})
