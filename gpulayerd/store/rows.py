"""The rows of the store's tables as frozen dataclasses, the store's errors, and row codecs.

Fields are named after the columns. Times: ``*_at`` are wall-clock seconds since the epoch,
except ``JobRow.lease_expires_at`` (the owner's monotonic clock); ``*_s`` are seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from gpulayerd.core.job_policy import RetryPolicy
from gpulayerd.core.protocol.claims import JobRecord, JobStatus

__all__ = [
    "AmbiguousJobId",
    "AttemptRow",
    "AttemptState",
    "EventRow",
    "GrantRow",
    "JobNotFound",
    "JobRow",
    "RemoteRunRow",
    "StoreError",
    "StoreFull",
    "retry_json",
    "retry_policy",
]

AttemptState = Literal["claimed", "running", "exited", "lost", "preflight-failed"]


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption, constraint, version)."""


class StoreFull(StoreError):
    """The state disk is full (SQLite's ``SQLITE_FULL``): nothing of this write was stored."""


class JobNotFound(StoreError):
    """No job matches the given id or prefix."""


class AmbiguousJobId(StoreError):
    """A job id prefix matches more than one job."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of ``jobs``: a job this daemon owns.

    Fields are named after the columns.

    Attributes:
        seq: submission order, assigned by :meth:`JobsTable.insert_job` (None before).
        lease_expires_at: owner-monotonic seconds, or None when no lease runs.
        explanation_json: the latest ``explain`` result for a waiting job, or None.
        exit_code: exit status of the attempt that exited, or None.
        retry_json: the retry policy (:func:`retry_json`; "" retries lost attempts only).
        retry_at: wall-clock s before which a retry is not claimed (its backoff), or None.
        avoid_worker: the worker a retry avoids (``--retry-elsewhere``), or None.
        preflight_failed_on: the workers on which a pre-flight check of the job failed, space-separated.
    """

    id: str
    spec_json: str
    status: JobStatus
    lease_s: float
    submitted_at: float
    updated_at: float
    name: str | None = None
    submitted_by: str | None = None
    attempt: int = 0
    holder: str | None = None
    retries_left: int = 0
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    reason: str = ""
    explanation_json: str | None = None
    exit_code: int | None = None
    seq: int | None = None
    retry_json: str = ""
    retry_at: float | None = None
    avoid_worker: str | None = None
    preflight_failed_on: str = ""

    def record(self) -> JobRecord:
        """The core state machine's view of this job."""
        return JobRecord(
            retry=retry_policy(self.retry_json), retry_at=self.retry_at, avoid=self.avoid_worker,
            preflight_failed_on=tuple(self.preflight_failed_on.split()),
            job_id=self.id,
            status=self.status,
            attempt=self.attempt,
            holder=self.holder,
            retries_left=self.retries_left,
            lease_s=self.lease_s,
            lease_expires_at=self.lease_expires_at,
            cancel_requested=self.cancel_requested,
        )


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One row of ``attempts``: one try at running a job on a worker.

    Attributes:
        watchdog_create_time: the watchdog process's create time (psutil), to tell it
            from a reused pid when re-adopting.
        started_at: wall time the job started, or None while only claimed.
        ended_at: wall time the attempt ended, or None while active.
        place: where it ran besides the worker (a Slurm worker's node), "" for the worker itself.
    """

    job_id: str
    attempt: int
    worker: str
    placement_json: str
    state: AttemptState
    run_dir: str | None = None
    watchdog_pid: int | None = None
    watchdog_create_time: float | None = None
    job_pgid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    place: str = ""


@dataclass(frozen=True, slots=True)
class EventRow:
    """One row of ``events``, the append-only history of a job."""

    seq: int
    job_id: str
    at: float
    kind: str
    from_status: JobStatus | None
    to_status: JobStatus | None
    attempt: int | None
    reason: str
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class RemoteRunRow:
    """One row of ``remote_runs``: an attempt this daemon runs, as worker, for another owner.

    Attributes:
        state: ``running``, ``exited`` or ``lost``.
        reported: the owner acknowledged the end of the attempt.
    """

    owner: str
    job_id: str
    attempt: int
    spec_json: str
    placement_json: str
    lease_s: float
    run_dir: str
    state: str
    exit_code: int | None = None
    reason: str = ""
    reported: bool = False
    started_at: float | None = None
    ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class GrantRow:
    """One row of ``grants``: a device this daemon, as worker, gave to a job's attempt."""

    device_uuid: str
    device_index: int
    accelerator: str
    job_id: str
    attempt: int
    granted_at: float


# ------------------------------------------------------------------------ row codecs

JOB_FIELDS = tuple(f.name for f in fields(JobRow))
"""The columns of ``jobs``, named as the fields of :class:`JobRow`."""


def job_params(row: JobRow) -> dict[str, object]:
    """Named SQL parameters for every column of ``jobs`` but ``seq``."""
    params: dict[str, object] = {name: getattr(row, name) for name in JOB_FIELDS if name != "seq"}
    return params | {"status": row.status.value, "cancel_requested": int(row.cancel_requested)}


def retry_json(policy: RetryPolicy) -> str:
    """The ``jobs.retry_json`` column of ``policy``: "" for the default (retry lost attempts only)."""
    return "" if policy == RetryPolicy(retries=policy.retries) else json.dumps(asdict(policy), sort_keys=True)


def retry_policy(text: str) -> RetryPolicy:
    """The retry policy a ``jobs.retry_json`` column holds (the default for "" or a column it cannot read)."""
    if not text:
        return RetryPolicy()
    try:
        d = json.loads(text)
        return RetryPolicy(int(d["retries"]), tuple(d["on"]), tuple(int(c) for c in d["exit_codes"]),
                           float(d["backoff_s"]), bool(d["elsewhere"]))
    except (ValueError, KeyError, TypeError):
        return RetryPolicy()


def job_row(r: Sequence[Any]) -> JobRow:
    """A :class:`JobRow` from the columns :data:`JOB_FIELDS`, in that order."""
    values = dict(zip(JOB_FIELDS, r, strict=True))
    values |= {"status": JobStatus(values["status"]), "cancel_requested": bool(values["cancel_requested"])}
    return JobRow(**values)


def attempt_row(r: Sequence[Any]) -> AttemptRow:
    """An :class:`AttemptRow` from its columns, in field order."""
    return AttemptRow(*r)


_MADE = [0]
_MADE_LOCK = threading.Lock()


def events_made() -> int:
    """How many ``events`` rows :func:`event_params` has made parameters for in this process (on any
    thread, for any store; a row rolled back counts too): while it stays the same, no job's status or
    reason changed in any store of this process (they change only with an event)."""
    with _MADE_LOCK:
        return _MADE[0]


def event_params(
    job_id: str,
    at: float,
    kind: str,
    from_status: JobStatus | None,
    to_status: JobStatus | None,
    attempt: int | None,
    reason: str,
    stimulus_id: str,
) -> tuple[object, ...]:
    """Positional SQL parameters for an ``events`` row (all columns but ``seq``); counted (:func:`events_made`)."""
    with _MADE_LOCK:
        _MADE[0] += 1
    from_value = None if from_status is None else from_status.value
    to_value = None if to_status is None else to_status.value
    return (job_id, at, kind, from_value, to_value, attempt, reason, stimulus_id)


def event_row(r: Sequence[Any]) -> EventRow:
    """An :class:`EventRow` from its columns, in field order."""
    seq, job_id, at, kind, from_status, to_status, attempt, reason, stimulus_id = r
    from_value = None if from_status is None else JobStatus(from_status)
    to_value = None if to_status is None else JobStatus(to_status)
    return EventRow(seq, job_id, at, kind, from_value, to_value, attempt, reason, stimulus_id)
