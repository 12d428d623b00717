"""The owner's claim/lease state machine for one job: events in, actions out.

Pure: no I/O, no clock (``now`` comes in with every call, in seconds of the owner's
monotonic clock), no randomness. The daemon runs the returned actions (a store
compare-and-set, a reply, a kill) and feeds outcomes back as new events.

States::

    queued --claim--> claimed --started--> running --exited--> succeeded | failed | timeout
      |                 |                    |                 (failed, timeout: or queued again
      |                 |                    |                  as the retry policy says)
      |                 +------ lease expired / lost -------> lost, or queued again
      |                                                        as the retry policy says
      +--cancel--> cancelled        claimed|running --cancel--> (kill) --> cancelled
    rejected (at submit, never runs)

The attempt number is the fencing token: a claim grants ``attempt + 1``; a start,
renewal or exit that names any other attempt is stale and changes nothing (a
renewal for a stale attempt is answered so that its worker kills it).

Only the attempt's holder speaks for it: every event about an attempt carries the
node id of the worker that sent it (the peer API takes it from the sender's TLS
certificate), and a start, renewal, exit or loss of the current attempt from any
other node is answered :class:`ReplyStale` and changes nothing, so a member that
does not hold a job can neither end it nor keep it alive.

Which worker an owner offers a job to when several fit it now (the best fit, then the least
loaded) is :mod:`gpulayerd.core.protocol.targets`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from gpulayerd.core.job_facts import ACTIVE_STATES, TERMINAL_STATES
from gpulayerd.core.job_policy import NO_RETRY_POLICY, RetryPolicy, backoff_s, retry_decision

__all__ = [
    "ACTIVE",
    "PREFLIGHT_HOLD_S",
    "PREFLIGHT_WORKERS",
    "TERMINAL",
    "Action",
    "CancelRequested",
    "ClaimRequested",
    "DenyClaim",
    "Event",
    "ExtendLease",
    "GrantClaim",
    "JobRecord",
    "JobStatus",
    "KillRun",
    "LeaseChecked",
    "LeaseRenewed",
    "PersistJob",
    "ReplyStale",
    "RunExited",
    "RunLost",
    "RunStarted",
    "handle",
]


class JobStatus(str, enum.Enum):
    """Where a job is in its life."""

    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"
    REJECTED = "rejected"


TERMINAL = frozenset(JobStatus(s) for s in TERMINAL_STATES)
"""States a job never leaves (:data:`gpulayerd.core.job_facts.TERMINAL_STATES` as :class:`JobStatus`)."""

ACTIVE = frozenset(JobStatus(s) for s in ACTIVE_STATES)
"""States in which an attempt holds devices on a worker."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """The owner's view of one job.

    Attributes:
        job_id: the job.
        status: current state.
        attempt: number of the current (or last) attempt; 0 before the first claim.
        holder: node id of the worker running the current attempt, if any.
        retries_left: how many more times an ended attempt may be re-queued (as ``retry`` says).
        lease_s: lease length granted to workers, seconds.
        lease_expires_at: owner-monotonic time after which the attempt is lost, or None.
        cancel_requested: a cancel arrived while an attempt was active.
        retry: the job's retry policy (which ends are retried, the backoff, elsewhere).
        retry_at: while queued for a retry: the wall-clock time (s) before which no claim is granted
            (the backoff), else None.
        avoid: while queued for a retry with ``retry.elsewhere`` (or after a failed pre-flight check): the
            worker of the last attempt, which the next attempt avoids when another worker fits.
        preflight_failed_on: the workers on which an attempt's pre-flight check failed, in order (after
            :data:`PREFLIGHT_WORKERS` of them the job is held, ``PreflightFailed``).
    """

    job_id: str
    status: JobStatus
    attempt: int = 0
    holder: str | None = None
    retries_left: int = 0
    lease_s: float = 30.0
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    retry: RetryPolicy = NO_RETRY_POLICY
    retry_at: float | None = None
    avoid: str | None = None
    preflight_failed_on: tuple[str, ...] = ()


PREFLIGHT_WORKERS = 3
"""After pre-flight failures on this many different workers a job is held (``PreflightFailed``)."""

PREFLIGHT_HOLD_S = 3600.0
"""How long such a job is held (s); then it is tried again where the environment changed (a failed
pre-flight marks the worker's environment broken for the framework until a probe shows a change)."""


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class ClaimRequested:
    """A worker asks to run the job now (late binding: it re-checked fit locally); ``wall``: the
    owner's wall-clock time (s), for a job waiting to retry (:attr:`JobRecord.retry_at`)."""

    worker: str
    stimulus_id: str = ""
    wall: float | None = None


@dataclass(frozen=True, slots=True)
class RunStarted:
    """The worker started the job's processes for ``attempt``; ``where`` names where they run when that
    is not ``worker`` alone (a gang: its members, ``h2+h3``), for the job's reason."""

    attempt: int
    worker: str
    stimulus_id: str = ""
    where: str = ""


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """The worker renews its lease for ``attempt``."""

    attempt: int
    worker: str
    stimulus_id: str = ""


@dataclass(frozen=True, slots=True)
class RunExited:
    """The job's processes of ``attempt`` ended, as ``worker`` reports.

    Attributes:
        worker: node id of the reporting worker (only the attempt's holder counts).
        exit_code: the process exit status (negative: killed by that signal); None
            if it could not be known.
        timed_out: the watchdog stopped it at its time limit (or it ended after the limit's
            warning): the job ends ``timeout`` (or is retried), whatever its exit code.
    """

    attempt: int
    worker: str
    exit_code: int | None
    reason: str = ""
    stimulus_id: str = ""
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class RunLost:
    """The attempt's processes are gone without an exit status (or never started), as ``worker`` reports.

    ``worker`` is the reporting node (only the attempt's holder counts).
    """

    attempt: int
    worker: str
    reason: str
    never_started: bool = False
    stimulus_id: str = ""
    preflight: bool = False
    """Its pre-flight check failed (``reason``: ``FRAMEWORK: error``): nothing of the job ran, the job
    is queued again for another worker without using a retry."""


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A user asked to cancel the job; ``signal``: the name of the signal its processes get first
    (``cancel --signal USR1``; "" is SIGTERM)."""

    reason: str = "cancelled by user"
    stimulus_id: str = ""
    signal: str = ""


@dataclass(frozen=True, slots=True)
class LeaseChecked:
    """Periodic check: has the current attempt's lease (plus ``grace_s``) expired?"""

    grace_s: float = 0.0
    stimulus_id: str = ""


Event = ClaimRequested | RunStarted | LeaseRenewed | RunExited | RunLost | CancelRequested | LeaseChecked


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class PersistJob:
    """Store ``record`` if the stored job still has ``expect_status``, ``expect_attempt``
    and ``expect_cancel_requested`` (so that a handler working from an outdated record
    can never undo a cancel).

    The store does this as one compare-and-set, with an event row carrying ``reason``;
    nothing else may be done for this event unless it succeeds.
    """

    record: JobRecord
    expect_status: JobStatus
    expect_attempt: int
    reason: str
    stimulus_id: str = ""
    expect_cancel_requested: bool = False
    retry_in_s: float | None = None
    """Set when the job is queued again to retry: no claim is granted for this many seconds (the
    store keeps ``record.retry_at`` as its wall clock plus this)."""


@dataclass(frozen=True, slots=True)
class ExtendLease:
    """The holder of ``attempt`` renewed: its lease now ends at ``expires_at`` (owner-monotonic s).

    Not a state change: the owner keeps leases in memory (persisted leases count as
    renewed at restart), so nothing is stored and no event row is written.
    """

    attempt: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class GrantClaim:
    """Tell ``worker`` it may run ``attempt`` under a lease of ``lease_s`` seconds."""

    worker: str
    attempt: int
    lease_s: float


@dataclass(frozen=True, slots=True)
class DenyClaim:
    """Tell ``worker`` its claim lost (someone else holds the job, or it ended)."""

    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class KillRun:
    """Stop the processes of ``attempt`` on ``worker`` (SIGTERM, or ``signal``, then grace, SIGKILL)."""

    worker: str
    attempt: int
    reason: str
    signal: str = ""


@dataclass(frozen=True, slots=True)
class ReplyStale:
    """Answer a message about a superseded attempt, or about the current one from a node that
    does not hold it: ``worker`` must kill that attempt if it runs it; nothing else changes."""

    worker: str
    attempt: int
    current_attempt: int


Action = PersistJob | ExtendLease | GrantClaim | DenyClaim | KillRun | ReplyStale


# ---------------------------------------------------------------------------- handle


def report_event(kind: str, attempt: int, worker: str, *, exit_code: int | None = None, reason: str = "",
                 never_started: bool = False, stimulus_id: str = "", timed_out: bool = False,
                 preflight: bool = False, where: str = "") -> Event:
    """The event a worker's report on ``attempt`` is (``kind``: ``started``, ``renew``, ``exited`` or
    ``lost``): the one mapping of reports to the claim machine, for a peer's and this node's alike
    (``where``: where a started attempt runs besides ``worker``, a Slurm worker's node: ``worker/node``).

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind == "started":
        return RunStarted(attempt, worker, stimulus_id, f"{worker}/{where}" if where else "")
    if kind == "renew":
        return LeaseRenewed(attempt, worker, stimulus_id)
    if kind == "exited":
        return RunExited(attempt, worker, exit_code, reason if exit_code != 0 or timed_out else "", stimulus_id,
                         timed_out)
    if kind == "lost":
        return RunLost(attempt, worker, reason or f"lost on {worker[:12]}", never_started or preflight, stimulus_id,
                       preflight)
    raise ValueError(f"unknown report kind {kind!r} (started, renew, exited, lost)")


def handle(job: JobRecord, event: Event, now: float) -> list[Action]:
    """Decide what ``event`` does to ``job`` at owner-monotonic time ``now``.

    Returns:
        Actions in order; a :class:`PersistJob`, when present, comes first and the
        rest must only be carried out if it succeeds. An event that changes nothing
        (a duplicate, a replay, a stale attempt) returns no PersistJob.
    """
    if isinstance(event, ClaimRequested):
        return _claim(job, event, now)
    if isinstance(event, RunStarted):
        return _started(job, event, now)
    if isinstance(event, LeaseRenewed):
        return _renewed(job, event, now)
    if isinstance(event, RunExited):
        return _exited(job, event)
    if isinstance(event, RunLost):
        return _lost(job, event)
    if isinstance(event, CancelRequested):
        return _cancel(job, event)
    return _lease_check(job, event, now)


def _persist(job: JobRecord, new: JobRecord, reason: str, stimulus_id: str) -> PersistJob:
    return PersistJob(new, job.status, job.attempt, reason, stimulus_id, job.cancel_requested)


def _claim(job: JobRecord, ev: ClaimRequested, now: float) -> list[Action]:
    if job.status is not JobStatus.QUEUED or job.cancel_requested:
        if job.holder == ev.worker and job.status in ACTIVE and not job.cancel_requested:
            # A duplicate claim from the holder: answer with the same grant again.
            return [GrantClaim(ev.worker, job.attempt, job.lease_s)]
        return [DenyClaim(ev.worker, f"job is {job.status.value}")]
    if job.retry_at is not None and ev.wall is not None and ev.wall < job.retry_at:
        return [DenyClaim(ev.worker, f"job waits {job.retry_at - ev.wall:.1f} s more before its retry")]
    attempt = job.attempt + 1
    new = replace(
        job, status=JobStatus.CLAIMED, attempt=attempt, holder=ev.worker, lease_expires_at=now + job.lease_s,
        retry_at=None, avoid=None,
    )
    return [
        _persist(job, new, f"claimed by {ev.worker} (attempt {attempt})", ev.stimulus_id),
        GrantClaim(ev.worker, attempt, job.lease_s),
    ]


def _stale(job: JobRecord, attempt: int, worker: str) -> bool:
    return attempt != job.attempt or worker != job.holder or job.status not in ACTIVE


def _not_holder(job: JobRecord, attempt: int, worker: str) -> bool:
    """A message about the current, active attempt from a node that does not hold it."""
    return attempt == job.attempt and job.status in ACTIVE and worker != job.holder


def _started(job: JobRecord, ev: RunStarted, now: float) -> list[Action]:
    if _stale(job, ev.attempt, ev.worker):
        if ev.attempt != job.attempt or job.holder != ev.worker:
            return [ReplyStale(ev.worker, ev.attempt, job.attempt)]
        return []
    if job.status is JobStatus.RUNNING:
        return []  # duplicate
    new = replace(job, status=JobStatus.RUNNING, lease_expires_at=now + job.lease_s)
    actions: list[Action] = [_persist(job, new, f"running on {ev.where or ev.worker}", ev.stimulus_id)]
    if job.cancel_requested:
        actions.append(KillRun(ev.worker, ev.attempt, "cancelled by user"))
    return actions


def _renewed(job: JobRecord, ev: LeaseRenewed, now: float) -> list[Action]:
    if _stale(job, ev.attempt, ev.worker):
        return [ReplyStale(ev.worker, ev.attempt, job.attempt)]
    return [ExtendLease(ev.attempt, now + job.lease_s)]


def _exited(job: JobRecord, ev: RunExited) -> list[Action]:
    if _not_holder(job, ev.attempt, ev.worker):
        return [ReplyStale(ev.worker, ev.attempt, job.attempt)]  # refused: changes nothing
    if ev.attempt != job.attempt or job.status not in ACTIVE:
        return []  # stale or duplicate: only the current attempt's exit counts
    if job.cancel_requested:
        status, reason = JobStatus.CANCELLED, "cancelled by user"
        if ev.exit_code is not None:
            reason += f" (exit {_describe_exit(ev.exit_code)})"
    elif ev.exit_code == 0 and not ev.timed_out:
        status, reason = JobStatus.SUCCEEDED, "exited 0"
    else:
        status = JobStatus.TIMEOUT if ev.timed_out else JobStatus.FAILED
        reason = ev.reason or (
            "exit status unknown" if ev.exit_code is None else f"exited {_describe_exit(ev.exit_code)}"
        )
        if retry_decision(job.retry, job.retries_left, status.value, ev.exit_code):
            return [_retry(job, status.value, reason, ev.stimulus_id)]
    new = replace(job, status=status, holder=None, lease_expires_at=None)
    return [_persist(job, new, reason, ev.stimulus_id)]


def _retry(job: JobRecord, outcome: str, why: str, stimulus_id: str) -> PersistJob:
    """The job queued again after its attempt ended as ``outcome`` (``why``: how), one retry used; it
    waits out its backoff and, with ``retry.elsewhere``, avoids the attempt's worker."""
    number = job.retry.retries - job.retries_left + 1  # this retry's number, 1 for the first
    wait_s = backoff_s(job.retry, number) if outcome != "lost" else 0.0
    new = replace(job, status=JobStatus.QUEUED, holder=None, lease_expires_at=None,
                  retries_left=job.retries_left - 1, retry_at=None,
                  avoid=job.holder if job.retry.elsewhere else None)
    of = f" of {job.retry.retries}" if job.retry.retries >= number else ""
    after = f" in {wait_s:g} s" if wait_s > 0 else ""
    elsewhere = " (preferring another worker)" if new.avoid else ""
    reason = f"attempt {job.attempt} {outcome}: {why}; retry {number}{of}{after}{elsewhere}"
    persist = _persist(job, new, reason, stimulus_id)
    return replace(persist, retry_in_s=wait_s) if wait_s > 0 else persist


def _describe_exit(code: int) -> str:
    return f"by signal {-code}" if code < 0 else str(code)


def _lost(job: JobRecord, ev: RunLost) -> list[Action]:
    if _not_holder(job, ev.attempt, ev.worker):
        return [ReplyStale(ev.worker, ev.attempt, job.attempt)]  # refused: changes nothing
    if ev.attempt != job.attempt or job.status not in ACTIVE:
        return []
    if ev.preflight and not job.cancel_requested:
        return [_preflight_failed(job, ev)]
    # "Never started" is only believed while the owner has not recorded a start.
    never_started = ev.never_started and job.status is JobStatus.CLAIMED
    return [_persist(job, _after_loss(job, never_started), ev.reason, ev.stimulus_id)]


def _preflight_failed(job: JobRecord, ev: RunLost) -> PersistJob:
    """The attempt's pre-flight check failed on ``ev.worker``: queued again (no retry used: nothing of the
    job ran), preferring another worker; after :data:`PREFLIGHT_WORKERS` different workers, held."""
    failed = tuple(dict.fromkeys((*job.preflight_failed_on, ev.worker)))
    new = replace(job, status=JobStatus.QUEUED, holder=None, lease_expires_at=None, retry_at=None,
                  avoid=ev.worker, preflight_failed_on=failed)
    if len(failed) < PREFLIGHT_WORKERS:
        why = f"attempt {job.attempt} preflight-failed on {ev.worker}: {ev.reason}; queued again for another worker"
        return _persist(job, new, why, ev.stimulus_id)
    why = (f"PreflightFailed: the pre-flight check failed on {', '.join(failed)} (last: {ev.reason}); "
           f"held {PREFLIGHT_HOLD_S / 3600:g} h, then tried where the environment changed")
    return replace(_persist(job, new, why, ev.stimulus_id), retry_in_s=PREFLIGHT_HOLD_S)


def _after_loss(job: JobRecord, never_started: bool) -> JobRecord:
    if job.cancel_requested:
        return replace(job, status=JobStatus.CANCELLED, holder=None, lease_expires_at=None)
    if never_started:
        # Nothing ran, so running it again cannot make two copies: re-queue for free.
        return replace(job, status=JobStatus.QUEUED, holder=None, lease_expires_at=None)
    if retry_decision(job.retry, job.retries_left, "lost", None):
        return replace(
            job, status=JobStatus.QUEUED, holder=None, lease_expires_at=None, retries_left=job.retries_left - 1,
            avoid=job.holder if job.retry.elsewhere else None,
        )
    return replace(job, status=JobStatus.LOST, holder=None, lease_expires_at=None)


def _cancel(job: JobRecord, ev: CancelRequested) -> list[Action]:
    if job.status in TERMINAL or job.cancel_requested:
        return []
    if job.status is JobStatus.QUEUED:
        new = replace(job, status=JobStatus.CANCELLED)
        return [_persist(job, new, ev.reason, ev.stimulus_id)]
    new = replace(job, cancel_requested=True)
    holder = job.holder or ""
    return [
        _persist(job, new, f"cancel requested; stopping attempt {job.attempt} on {holder}", ev.stimulus_id),
        KillRun(holder, job.attempt, ev.reason, ev.signal),
    ]


def _lease_check(job: JobRecord, ev: LeaseChecked, now: float) -> list[Action]:
    if job.status not in ACTIVE or job.lease_expires_at is None:
        return []
    if now <= job.lease_expires_at + ev.grace_s:
        return []
    new = _after_loss(job, never_started=False)
    what = "re-queued" if new.status is JobStatus.QUEUED else new.status.value
    reason = (
        f"attempt {job.attempt} lost: no lease renewal from {job.holder} for "
        f"{job.lease_s:g} s + {ev.grace_s:g} s grace; {what}"
    )
    return [_persist(job, new, reason, ev.stimulus_id), KillRun(job.holder or "", job.attempt, reason)]
