"""The worker core's messages: the events :func:`gpulayerd.core.protocol.worker.handle` takes and the
actions it returns.

Pure value types (see :mod:`gpulayerd.core.protocol.worker`). Times are seconds of the worker's monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Action", "ClaimAnswered", "ConsiderOffer", "DropHold", "DropOffer", "EndKind", "Event", "ExtendDeadline",
    "HoldCommitted", "HoldPlaced", "HoldReleased", "HoldsChecked", "KeepHold", "KillAsked", "KillRun",
    "OfferFits", "OfferReceived", "OfferRejected", "OffersReviewed", "OwedReport", "RecordEnd",
    "RefuseCommit", "RefuseHold", "RefuseKill", "RenewalAnswered", "ReportAnswered", "ReportOwed",
    "RoundEnded", "RunEnded", "RunKey", "RunStarted", "SendClaim", "SendRenewals", "SendReport",
    "StartRun", "Tick",
]

RunKey = tuple[str, int]
"""(job id, attempt)."""

EndKind = Literal["exited", "lost"]
"""How an attempt ended: an exit status (or a start failure), or its processes are gone."""

# ---------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class OwedReport:
    """The end of an attempt run for ``owner``, not yet acknowledged. ``sending``: a send is in flight."""

    owner: str
    kind: EndKind
    exit_code: int | None
    reason: str
    never_started: bool = False
    sending: bool = False
    timed_out: bool = False
    preflight: bool = False


@dataclass(frozen=True, slots=True)
class OfferReceived:
    """An owner offers its job ``job_id``."""

    owner: str
    job_id: str


@dataclass(frozen=True, slots=True)
class OfferRejected:
    """The offer cannot be used (its spec is bad): forget it."""

    owner: str
    job_id: str


@dataclass(frozen=True, slots=True)
class OffersReviewed:
    """A scheduling pass looks at the kept offers."""


@dataclass(frozen=True, slots=True)
class OfferFits:
    """The offered job fits here now, on ``devices``; the worker holds their machine-wide locks."""

    owner: str
    job_id: str
    devices: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ClaimAnswered:
    """The owner answered (or did not: ``failed``) a claim; ``attempt``/``lease_s`` when granted."""

    owner: str
    job_id: str
    outcome: Literal["granted", "denied", "failed"]
    attempt: int = 0
    lease_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The attempt's watchdog runs (started now, or re-adopted after a restart): the deadline is now + lease."""

    key: RunKey
    owner: str
    lease_s: float
    devices: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The attempt ended (or never started). With ``report``, its end is owed to its owner."""

    key: RunKey
    owner: str
    kind: EndKind
    exit_code: int | None = None
    reason: str = ""
    never_started: bool = False
    report: bool = True
    timed_out: bool = False
    """``exited`` at its time limit: the owner ends the job ``timeout`` (or retries it)."""
    preflight: bool = False
    """``lost`` (never started) because its pre-flight check failed: the owner queues it for another worker."""


@dataclass(frozen=True, slots=True)
class ReportOwed:
    """An end found in the store not yet acknowledged (left by a previous life of the daemon)."""

    key: RunKey
    report: OwedReport


@dataclass(frozen=True, slots=True)
class ReportAnswered:
    """A send of an owed report is over: ``acknowledged`` if the owner answered."""

    key: RunKey
    acknowledged: bool


@dataclass(frozen=True, slots=True)
class Tick:
    """The lease tick: renewals due and owed reports to send again."""


@dataclass(frozen=True, slots=True)
class HoldsChecked:
    """The lease tick of the gang member: holds past their expiry are dropped."""


@dataclass(frozen=True, slots=True)
class RenewalAnswered:
    """A renewal sent at ``sent_at`` was answered ``ok``, ``stale`` (kill it), or not at all (``none``)."""

    key: RunKey
    answer: Literal["ok", "stale", "none"]
    sent_at: float


@dataclass(frozen=True, slots=True)
class RoundEnded:
    """``owner``'s renewal round is over (all answered, or its time bound passed)."""

    owner: str


@dataclass(frozen=True, slots=True)
class HoldPlaced:
    """A gang hold would reserve ``devices`` (locked by the worker) for ``ttl_s`` seconds."""

    hold_id: str
    owner: str
    job_id: str
    devices: frozenset[str]
    ttl_s: float


@dataclass(frozen=True, slots=True)
class HoldReleased:
    """The owner drops its hold."""

    hold_id: str
    owner: str


@dataclass(frozen=True, slots=True)
class HoldCommitted:
    """The owner commits its hold: start attempt ``key`` under it with a lease of ``lease_s``."""

    hold_id: str
    owner: str
    key: RunKey
    lease_s: float


@dataclass(frozen=True, slots=True)
class KillAsked:
    """An owner asks to stop attempt ``key``."""

    key: RunKey
    owner: str
    reason: str = ""


Event = (OfferReceived | OfferRejected | OffersReviewed | OfferFits | ClaimAnswered | RunStarted
         | RunEnded | ReportOwed | ReportAnswered | Tick | RenewalAnswered | RoundEnded | HoldPlaced | HoldReleased
         | HoldCommitted | HoldsChecked | KillAsked)


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class DropOffer:
    """Forget the offer (its payload too)."""

    owner: str
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class ConsiderOffer:
    """Check whether the offer fits here now (oldest first); feed :class:`OfferFits` if it does."""

    owner: str
    job_id: str


@dataclass(frozen=True, slots=True)
class SendClaim:
    """Claim the offered job at its owner for ``devices``."""

    owner: str
    job_id: str
    devices: frozenset[str]


@dataclass(frozen=True, slots=True)
class StartRun:
    """Start the watchdog of ``key`` for ``owner`` under a lease of ``lease_s`` (from a claim or a hold)."""

    key: RunKey
    owner: str
    lease_s: float
    hold_id: str = ""


@dataclass(frozen=True, slots=True)
class SendRenewals:
    """One concurrent, time-bounded round with ``owner``: renew ``runs``, send the owed ``reports``."""

    owner: str
    runs: tuple[RunKey, ...]
    reports: tuple[RunKey, ...]


@dataclass(frozen=True, slots=True)
class SendReport:
    """Send the owed end report of ``key`` now (feed :class:`ReportAnswered` when done)."""

    key: RunKey
    report: OwedReport


@dataclass(frozen=True, slots=True)
class ExtendDeadline:
    """Move the watchdog's deadline of ``key`` to ``deadline`` (monotonic s, later than before)."""

    key: RunKey
    deadline: float


@dataclass(frozen=True, slots=True)
class RecordEnd:
    """The end of ``key`` is new: record it in the store (its owner is told by a report). Once per attempt."""

    key: RunKey
    owner: str


@dataclass(frozen=True, slots=True)
class KillRun:
    """Stop the processes of ``key`` (its end comes back as a :class:`RunEnded`)."""

    key: RunKey
    reason: str


@dataclass(frozen=True, slots=True)
class RefuseKill:
    """No such attempt here for that owner."""

    key: RunKey
    reason: str


@dataclass(frozen=True, slots=True)
class KeepHold:
    """The hold is kept until ``expires_at``."""

    hold_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class RefuseHold:
    """The hold is refused (a device is in use here): unlock its devices."""

    hold_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class DropHold:
    """Forget the hold and unlock its devices."""

    hold_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class RefuseCommit:
    """The commit cannot start anything (no such hold, or the attempt is already here)."""

    hold_id: str
    reason: str


Action = (DropOffer | ConsiderOffer | SendClaim | StartRun | SendRenewals | SendReport
          | ExtendDeadline | RecordEnd | KillRun | RefuseKill | KeepHold | RefuseHold | DropHold | RefuseCommit)
