"""The hold round that places a gang (a multi-host job) on its members: events in, actions out.

Pure like :mod:`gpulayerd.core.protocol.claims`: no I/O, no clock (``now`` comes in), no randomness
(a uniform ``u`` in [0, 1) comes in where jitter is needed).

The members are the first ``nnodes`` candidates in node-id order (two owners never wait
on each other's holds); holds go out one by one in that order; any refusal or failure
releases every hold taken and backs off ``min(30, 0.5 * 2**k) * (0.5 + u)`` seconds after
the k-th failed round in a row (k from 0); with every member held, the owner claims the
job (compare-and-set) and then commits every member at once: rank i is the i-th member
in node-id order, rank 0's address and reserved port are the rendezvous. A gang commits
on all its members or on none. The attempt that follows is :mod:`gpulayerd.core.protocol.gang`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpulayerd.core.protocol.gang import GangAttempt

__all__ = [
    "MAX_BACKOFF_S", "AttemptBegun", "ClaimDenied", "ClaimGranted", "ClaimJob", "HeldMember", "HoldFailed",
    "HoldGranted", "HoldRound", "ReleaseHolds", "RetryAfter", "RoundAction", "RoundEvent", "RoundPhase",
    "SendCommit", "SendHold", "advance_round", "backoff_delay", "begin_round",
]

MAX_BACKOFF_S = 30.0
"""The longest pause between two hold rounds of one job (before jitter)."""


def backoff_delay(failures: int, u: float) -> float:
    """Seconds to wait after the ``failures``-th failed hold round in a row (0 for the first).

    ``min(30, 0.5 * 2**failures) * (0.5 + u)``, ``u`` uniform in [0, 1): the jitter keeps
    owners that collided from colliding again in step.
    """
    return min(MAX_BACKOFF_S, 0.5 * 2.0 ** min(failures, 16)) * (0.5 + u)


class RoundPhase(str, enum.Enum):
    """Where a hold round is."""

    HOLDING = "holding"  # holds going out, one at a time
    CLAIMING = "claiming"  # every member held; the job's claim (compare-and-set) is in flight
    COMMITTED = "committed"  # claimed: every member was sent its commit
    RELEASED = "released"  # given up: every hold taken was released


@dataclass(frozen=True, slots=True)
class HeldMember:
    """A member that granted its hold: where it listens for the rendezvous."""

    member: str
    address: str
    port: int


@dataclass(frozen=True, slots=True)
class HoldRound:
    """One round of holds for a job.

    Attributes:
        members: node ids in node-id order (rank order once committed).
        held: the holds granted so far, in the same order.
        failures: failed rounds in a row before this one (the backoff exponent).
    """

    job_id: str
    hold_id: str
    members: tuple[str, ...]
    held: tuple[HeldMember, ...] = ()
    phase: RoundPhase = RoundPhase.HOLDING
    failures: int = 0


@dataclass(frozen=True, slots=True)
class HoldGranted:
    """``member`` holds its resources for us; its rendezvous address and port."""

    member: str
    address: str
    port: int


@dataclass(frozen=True, slots=True)
class HoldFailed:
    """``member`` refused the hold, or could not be asked."""

    member: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClaimGranted:
    """The job's compare-and-set gave the gang ``attempt`` under a lease of ``lease_s`` seconds."""

    attempt: int
    lease_s: float
    grace_s: float


@dataclass(frozen=True, slots=True)
class ClaimDenied:
    """The job could not be claimed (it changed meanwhile)."""

    reason: str


RoundEvent = HoldGranted | HoldFailed | ClaimGranted | ClaimDenied


@dataclass(frozen=True, slots=True)
class SendHold:
    """Ask ``member`` to hold resources for the job (the round's ``hold_id``)."""

    member: str


@dataclass(frozen=True, slots=True)
class ReleaseHolds:
    """Release the holds ``members`` granted."""

    hold_id: str
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Start no new round for the job for ``delay_s`` seconds; ``failures`` rounds failed in a row."""

    delay_s: float
    failures: int
    reason: str


@dataclass(frozen=True, slots=True)
class ClaimJob:
    """Claim the job for the gang (the store's compare-and-set); answer with ClaimGranted/Denied."""

    hold_id: str
    members: tuple[str, ...]
    master_addr: str
    master_port: int


@dataclass(frozen=True, slots=True)
class AttemptBegun:
    """The attempt the gang now runs (its state machine starts here)."""

    gang: GangAttempt


@dataclass(frozen=True, slots=True)
class SendCommit:
    """Start rank ``rank`` of ``nnodes`` on ``member``, rendezvous at ``master_addr:master_port``."""

    member: str
    rank: int
    nnodes: int
    attempt: int
    master_addr: str
    master_port: int


RoundAction = SendHold | ReleaseHolds | RetryAfter | ClaimJob | AttemptBegun | SendCommit


def begin_round(job_id: str, hold_id: str, candidates: Iterable[str], nnodes: int,
                failures: int = 0) -> tuple[HoldRound, list[RoundAction]]:
    """A new hold round over the first ``nnodes`` of ``candidates`` in node-id order.

    Raises:
        ValueError: fewer than ``nnodes`` distinct candidates, or ``nnodes < 1``.
    """
    members = tuple(sorted(set(candidates))[:nnodes])
    if nnodes < 1 or len(members) < nnodes:
        raise ValueError(f"a gang of {nnodes} needs as many distinct candidates, got {len(members)}")
    r = HoldRound(job_id=job_id, hold_id=hold_id, members=members, failures=failures)
    return r, [SendHold(members[0])]


def advance_round(r: HoldRound, event: RoundEvent, now: float, u: float) -> tuple[HoldRound, list[RoundAction]]:
    """What ``event`` does to the round at owner-monotonic ``now``; ``u`` uniform in [0, 1) for jitter.

    Returns:
        The new round and the actions to carry out in order. An event that does not fit
        the round's phase (a late or duplicate reply) changes nothing.
    """
    if isinstance(event, (HoldGranted, HoldFailed)):
        if r.phase is not RoundPhase.HOLDING or event.member != r.members[len(r.held)]:
            return r, []
        if isinstance(event, HoldFailed):
            return _give_up(r, f"hold on {event.member} failed: {event.reason}", u)
        held = (*r.held, HeldMember(event.member, event.address, event.port))
        if len(held) < len(r.members):
            return replace(r, held=held), [SendHold(r.members[len(held)])]
        master = held[0]
        return (replace(r, held=held, phase=RoundPhase.CLAIMING),
                [ClaimJob(r.hold_id, r.members, master.address, master.port)])
    if r.phase is not RoundPhase.CLAIMING:
        return r, []
    if isinstance(event, ClaimDenied):
        # The job is no longer ours to place: no backoff, nothing else to retry.
        return replace(r, phase=RoundPhase.RELEASED), [ReleaseHolds(r.hold_id, r.members)]
    master = r.held[0]
    gang = GangAttempt(
        job_id=r.job_id, attempt=event.attempt, hold_id=r.hold_id, members=r.members,
        master=f"{master.address}:{master.port}", lease_s=event.lease_s, grace_s=event.grace_s,
        renewed_at={m: now for m in r.members})
    commits: list[RoundAction] = [
        SendCommit(m, rank, len(r.members), event.attempt, master.address, master.port)
        for rank, m in enumerate(r.members)
    ]
    return replace(r, phase=RoundPhase.COMMITTED), [AttemptBegun(gang), *commits]


def _give_up(r: HoldRound, reason: str, u: float) -> tuple[HoldRound, list[RoundAction]]:
    actions: list[RoundAction] = []
    if r.held:
        actions.append(ReleaseHolds(r.hold_id, tuple(h.member for h in r.held)))
    actions.append(RetryAfter(backoff_delay(r.failures, u), r.failures + 1, reason))
    return replace(r, phase=RoundPhase.RELEASED), actions


