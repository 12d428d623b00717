"""The ``jobs``, ``attempts`` and ``events`` tables: jobs this daemon owns and their history.

A state change is a compare-and-set on (status, attempt, cancel_requested) that appends an
event row in the same transaction; :meth:`JobsTable.claim` also writes the attempt row and the
device grants in that transaction.


(Same name as :mod:`gpulayerd.cli.jobs`: the same idea (the job queue) at the store and at the CLI.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Literal

from gpulayerd.core.protocol.claims import JobStatus, PersistJob
from gpulayerd.store.db import Database, Rollback
from gpulayerd.store.rows import (
    JOB_FIELDS,
    AmbiguousJobId,
    AttemptRow,
    EventRow,
    JobNotFound,
    JobRow,
    StoreError,
    attempt_row,
    event_params,
    event_row,
    events_made,
    job_params,
    job_row,
)
from gpulayerd.store.runs import INSERT_GRANT, RELEASE_GRANTS, SELECT_GRANTED

__all__ = ["JobsTable"]

logger = logging.getLogger(__name__)

_JOB_COLUMNS = ", ".join(JOB_FIELDS)
_ATTEMPT_COLUMNS = (
    "job_id, attempt, worker, placement_json, state, run_dir, watchdog_pid, watchdog_create_time, "
    "job_pgid, started_at, ended_at, exit_code, reason, place"
)
_EVENT_COLUMNS = "seq, job_id, at, kind, from_status, to_status, attempt, reason, stimulus_id"

_NEXT_SEQ = "(SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs)"
_INSERT_JOB = (
    f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES ("
    + ", ".join(_NEXT_SEQ if name == "seq" else f":{name}" for name in JOB_FIELDS)
    + ") RETURNING seq"
)
_INSERT_EVENT = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq"
_CAS_JOB = """
UPDATE jobs SET status = :status, attempt = :attempt, holder = :holder, retries_left = :retries_left,
    lease_expires_at = :lease_expires_at, cancel_requested = :cancel_requested,
    reason = CASE WHEN :reason = '' THEN reason ELSE :reason END, updated_at = :now,
    retry_at = :retry_at, avoid_worker = :avoid_worker, preflight_failed_on = :preflight_failed_on
WHERE id = :id AND status = :expect_status AND attempt = :expect_attempt
    AND cancel_requested = :expect_cancel_requested"""
_INSERT_ATTEMPT = """
INSERT INTO attempts (job_id, attempt, worker, placement_json, state, run_dir)
VALUES (?, ?, ?, ?, 'claimed', ?)"""
_MARK_RUNNING = """
UPDATE attempts SET state = 'running', watchdog_pid = :watchdog_pid,
    watchdog_create_time = :watchdog_create_time, job_pgid = :job_pgid,
    started_at = COALESCE(started_at, :now), place = CASE WHEN :place = '' THEN place ELSE :place END
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('claimed', 'running')"""
_END_ATTEMPT = """
UPDATE attempts SET state = :state, ended_at = :now, exit_code = :exit_code, reason = :reason
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('claimed', 'running')"""
_HOLDER_FACTS = ("SELECT j.attempt, j.holder, a.worker, a.placement_json FROM jobs j LEFT JOIN attempts a "
                 "ON a.job_id = j.id AND a.attempt = ? WHERE j.id = ?")
_SET_JOB_EXIT = "UPDATE jobs SET exit_code = ? WHERE id = ? AND attempt = ? AND exit_code IS NULL"
_SET_CLAIMED_REASON = "UPDATE jobs SET reason = ? WHERE id = ? AND attempt = ? AND status = 'claimed'"
_SET_EXPLANATION = (
    "UPDATE jobs SET reason = ?, explanation_json = ? WHERE id = ? AND status IN ('queued', 'rejected')"
)
_GET_JOB = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?"
_LIST_JOBS = {
    (filtered, newest_first): f"SELECT {_JOB_COLUMNS} FROM jobs"
    + (" WHERE status IN (SELECT value FROM json_each(:statuses))" if filtered else "")
    + f" ORDER BY seq {'DESC' if newest_first else 'ASC'} LIMIT :limit"
    for filtered in (False, True)
    for newest_first in (False, True)
}
"""SELECT statements by (filtered by status, newest first)."""
_JOBS_BY_IDS = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id IN (SELECT value FROM json_each(?)) ORDER BY seq"
_IDS_FROM = "SELECT id FROM jobs WHERE id >= ? ORDER BY id LIMIT ?"
_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events WHERE job_id = ? ORDER BY seq"
_ATTEMPTS = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY attempt"
_LATEST_ATTEMPTS = (
    f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE (job_id, attempt) IN "
    "(SELECT id, attempt FROM jobs WHERE id IN (SELECT value FROM json_each(?)))"
)
_ACTIVE_ATTEMPTS = (
    f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state IN ('claimed', 'running') ORDER BY job_id, attempt"
)
_COUNTS = "SELECT status, COUNT(*) FROM jobs GROUP BY status"
_QUEUE_HEAD = (
    "SELECT COALESCE((SELECT MAX(seq) FROM events), 0), (SELECT COUNT(*) FROM jobs WHERE status = 'queued')"
)
_CHANGED_JOBS = (
    f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id IN (SELECT job_id FROM events WHERE seq > ? AND seq <= ?)"
)
_KEY_JOB = "SELECT job_id FROM submission_keys WHERE user = ? AND key = ?"
_INSERT_KEY = "INSERT INTO submission_keys (user, key, job_id) VALUES (?, ?, ?)"
_FORGET_KEY = "DELETE FROM submission_keys WHERE user = ? AND key = ?"

_AMBIGUOUS_SHOWN = 5
"""How many matching ids an :class:`AmbiguousJobId` message lists."""


class JobsTable:
    """Jobs this daemon owns, their attempts and their append-only history."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db
        self._head: tuple[int, int, int] | None = None  # last queue_changes: (events_made() before, head, queued)

    # ---------------------------------------------------------------------- jobs

    async def insert_job(self, row: JobRow, reason: str, stimulus_id: str = "",
                         key: tuple[str, str] | None = None,
                         also: Callable[[sqlite3.Connection], None] | None = None) -> JobRow:
        """Store a new job and its "submitted" event in one transaction.

        ``row.seq`` is ignored: the job gets the next submission number. A job stored
        as ``rejected`` with an empty ``row.reason`` keeps ``reason`` as its reason.
        ``key``: the submission's ``(user, client key)``, unique: when a job was stored with it
        already, nothing is stored and that job's row is returned (an idempotent retry).
        ``also``: more writes of the same transaction, after the job's (an array's row).

        Returns:
            The row as stored (with its ``seq``), or the one stored before with ``key``.

        Raises:
            StoreError: a job with this id exists already.
        """
        stored_reason = row.reason or (reason if row.status is JobStatus.REJECTED else "")

        def insert(db: sqlite3.Connection) -> JobRow:
            if key is not None:
                before = db.execute(_KEY_JOB, key).fetchall()
                if before:
                    found = db.execute(_GET_JOB, (before[0][0],)).fetchall()
                    if found:
                        return job_row(found[0])
                    db.execute(_FORGET_KEY, key)  # its job is gone: a new one
                db.execute(_INSERT_KEY, (*key, row.id))
            try:
                seq_rows = db.execute(_INSERT_JOB, job_params(replace(row, reason=stored_reason))).fetchall()
            except sqlite3.IntegrityError as e:
                raise StoreError(f"job {row.id} already exists") from e
            db.execute(_INSERT_EVENT, event_params(
                row.id, row.submitted_at, "submitted", None, row.status, None, reason, stimulus_id)).fetchall()
            if also is not None:
                also(db)
            return replace(row, reason=stored_reason, seq=int(seq_rows[0][0]))

        return await self._db.run(insert)  # one hop to the store's thread

    async def get_job(self, job_id: str) -> JobRow | None:
        """The job with exactly this id, or None."""
        rows = await self._db.fetch_all(_GET_JOB, (job_id,))
        return job_row(rows[0]) if rows else None

    async def list_jobs(
        self,
        statuses: Collection[JobStatus] | None = None,
        limit: int | None = None,
        *,
        newest_first: bool = False,
    ) -> list[JobRow]:
        """Jobs in submission order (oldest first unless ``newest_first``).

        Args:
            statuses: only jobs in one of these states; None for all.
            limit: at most this many rows; None for all.
        """
        params = {
            "statuses": None if statuses is None else json.dumps(sorted(s.value for s in statuses)),
            "limit": -1 if limit is None else limit,
        }
        rows = await self._db.fetch_all(_LIST_JOBS[statuses is not None, newest_first], params)
        return [job_row(r) for r in rows]

    async def jobs_by_ids(self, job_ids: Collection[str]) -> list[JobRow]:
        """The jobs with exactly these ids, in submission order (ids of no job are left out)."""
        if not job_ids:
            return []
        rows = await self._db.fetch_all(_JOBS_BY_IDS, (json.dumps(sorted(job_ids)),))
        return [job_row(r) for r in rows]

    async def resolve_job_id(self, prefix: str) -> str:
        """The id of the one job whose id starts with ``prefix`` (an exact id always wins).

        Raises:
            JobNotFound: no job id starts with ``prefix``.
            AmbiguousJobId: several do; the message lists up to five of them.
        """
        if not prefix:
            raise JobNotFound("empty job id")
        # Ids sharing a prefix are contiguous in BINARY order and start at the prefix itself.
        rows = await self._db.fetch_all(_IDS_FROM, (prefix, _AMBIGUOUS_SHOWN + 1))
        ids: list[str] = []
        for (job_id,) in rows:
            if not str(job_id).startswith(prefix):
                break
            ids.append(str(job_id))
        if not ids:
            raise JobNotFound(f"no job id starts with {prefix!r}")
        if len(ids) == 1 or ids[0] == prefix:
            return ids[0]
        shown = ", ".join(ids[:_AMBIGUOUS_SHOWN])
        more = ", ..." if len(ids) > _AMBIGUOUS_SHOWN else ""
        raise AmbiguousJobId(f"job id prefix {prefix!r} matches several jobs: {shown}{more}")

    async def apply(self, action: PersistJob, now_wall: float, kind: str = "state") -> bool:
        """Carry out ``action`` as a compare-and-set on (status, attempt), with its event row.

        Every stored change has a reason (a lease renewal is not stored at all: it is
        :class:`~gpulayerd.core.protocol.claims.ExtendLease`, kept in the owner's memory).

        Returns:
            True if the job still had ``expect_status`` and ``expect_attempt`` and is
            now stored as ``action.record``; False if it had moved on (nothing written).

        Raises:
            ValueError: ``action.reason`` is empty.
        """
        if not action.reason:
            raise ValueError(f"job {action.record.job_id}: a stored change needs a reason")
        try:
            await self._db.run(lambda db: _cas(db, action, now_wall, kind))
        except Rollback:
            return False
        return True

    async def claim(
        self,
        action: PersistJob,
        worker: str,
        placement_json: str,
        grants: Sequence[tuple[str, int, str]],
        run_dir: str,
        now_wall: float,
        kind: str = "state",
        history: Sequence[tuple[str, float, str]] = (),
    ) -> bool:
        """Grant a claim: the queued→claimed compare-and-set, its attempt row and its devices.

        All in one transaction: either everything is written or nothing is.

        Args:
            action: the core's PersistJob for the claim (new status ``claimed``).
            worker: node id of the claiming worker.
            placement_json: the placement the worker will run.
            grants: (device_uuid, device_index, accelerator) of every device granted.
            run_dir: where the attempt's logs go.
            now_wall: wall-clock time of the grant.
            kind: the grant's event kind (the queued→claimed change).
            history: (kind, wall-clock time, words) of events that led to it (the offer, the
                claim), written before the grant's own event, in the same transaction.

        Returns:
            False, writing nothing, if the job was no longer as expected or any of the
            devices is already granted (a device is never granted twice).

        Raises:
            ValueError: ``action`` is not a claim.
        """
        rec = action.record
        if rec.status is not JobStatus.CLAIMED:
            raise ValueError(f"claim() needs a PersistJob to 'claimed', not {rec.status.value!r}")
        taken: list[str] = []
        try:
            await self._db.run(lambda db: _write_claim(db, action, worker, placement_json, grants, run_dir,
                                                       now_wall, kind, history, taken))  # one hop
        except Rollback:
            return False
        return True

    async def claim_decided(
        self,
        job_id: str,
        decide: Callable[[JobRow], Sequence[object]],
        worker: str,
        placement_json: str,
        grants: Sequence[tuple[str, int, str]],
        run_dir_of: Callable[[int], str] | None,
        now_wall: float,
        kind: str = "state",
        history: Sequence[tuple[str, float, str]] = (),
    ) -> tuple[JobRow | None, Sequence[object], bool]:
        """Read job ``job_id``, decide its claim and write it (as :meth:`claim`), in one transaction:
        no compare-and-set can lose to a change between the read and the write.

        Args:
            decide: the claim machine's actions for the row read (pure: it runs on the store's thread).
            run_dir_of: the run directory of the attempt decided, when it runs here.

        Returns:
            (the row read, None if no such job; the actions decided; whether the grant was written:
            False when the actions hold no claim to write, or a device is already granted).
        """
        out: list[object] = [None, (), False]

        def txn(db: sqlite3.Connection) -> None:
            rows = db.execute(_GET_JOB, (job_id,)).fetchall()
            if not rows:
                return
            row = job_row(rows[0])
            actions = decide(row)
            out[0], out[1] = row, actions
            action = actions[0] if actions and isinstance(actions[0], PersistJob) else None
            if action is None or action.record.status is not JobStatus.CLAIMED:
                return
            run_dir = run_dir_of(action.record.attempt) if run_dir_of is not None else ""
            _write_claim(db, action, worker, placement_json, grants, run_dir, now_wall, kind, history, [])
            out[2] = True

        with contextlib.suppress(Rollback):
            await self._db.run(txn)  # one hop to the store's thread
        row, actions, written = out
        return (row if isinstance(row, JobRow) else None), actions if isinstance(actions, (list, tuple)) else (), \
            bool(written)

    async def set_explanation(self, job_id: str, reason: str, explanation_json: str | None) -> None:
        """Refresh a waiting job's one-line reason and explanation (no event, no status change); only of a
        ``queued`` or ``rejected`` job."""
        await self._db.write_one(_SET_EXPLANATION, (reason, explanation_json, job_id))

    async def set_claimed_reason(self, job_id: str, attempt: int, reason: str) -> None:
        """A claimed job's reason while its worker has not started it (``SlurmPending: ...``; no event)."""
        await self._db.write_one(_SET_CLAIMED_REASON, (reason, job_id, attempt))

    async def set_explanations(self, items: Sequence[tuple[str, str, str | None]]) -> None:
        """:meth:`set_explanation` for each ``(job_id, reason, explanation_json)``, in one transaction."""
        if not items:
            return
        params = [(reason, ej, job_id) for job_id, reason, ej in items]
        await self._db.run(lambda db: db.executemany(_SET_EXPLANATION, params))  # one hop to the store's thread

    async def queue_changes(self, after_event: int) -> tuple[int, int, list[JobRow]]:
        """What changed for the scheduler's in-memory queue since event ``after_event``.

        Returns:
            ``(head, queued, rows)``: the newest event's seq (0 when none), how many jobs are
            queued now, and the current row of every job with an event after ``after_event``
            up to ``head`` (submitted, claimed, requeued, cancelled, ...), in any status. A job's
            status and reason change only with an event (:meth:`apply`, :meth:`insert_job`);
            :meth:`set_explanation` writes none: with no event made since the last call (:func:`events_made`),
            the last answer, without a read (asked at every pass: a freed slot's claim need not wait for one).
        """

        made, last = events_made(), self._head  # (made counted before the read: one made after is seen next time)
        if last is not None and last[0] == made and last[1] == after_event:
            return last[1], last[2], []

        def changes(db: sqlite3.Connection) -> tuple[int, int, list[JobRow]]:
            head_rows = db.execute(_QUEUE_HEAD, ()).fetchall()
            head, queued = int(head_rows[0][0]), int(head_rows[0][1])
            if head <= after_event:
                return head, queued, []
            return head, queued, [job_row(r) for r in db.execute(_CHANGED_JOBS, (after_event, head)).fetchall()]

        got = await self._db.read(changes)  # one hop to the store's thread
        self._head = (made, got[0], got[1])
        return got

    async def counts(self) -> dict[str, int]:
        """Number of jobs in each status (every known status present, 0 if none)."""
        counts = {s.value: 0 for s in JobStatus}
        for status, n in await self._db.fetch_all(_COUNTS, ()):
            counts[str(status)] = int(n)
        return counts

    # ------------------------------------------------------------------ attempts

    async def mark_running(
        self,
        job_id: str,
        attempt: int,
        watchdog_pid: int | None,
        watchdog_create_time: float | None,
        job_pgid: int | None,
        now_wall: float,
        then: PersistJob | None = None,
        kind: str = "state",
        place: str = "",
    ) -> bool:
        """Record that an attempt's processes run (or were re-adopted) under this watchdog (``place``: where
        besides the worker, a Slurm node; "" keeps the stored one).

        Keeps the first ``started_at``. An attempt that already ended is left alone.
        The job's own status change goes through :meth:`apply`, or through ``then``: that
        compare-and-set in the same transaction (one commit), after the attempt's row.

        Returns:
            False if ``then`` lost its compare-and-set (the attempt's row is written even so);
            True otherwise.
        """
        params = {
            "watchdog_pid": watchdog_pid,
            "watchdog_create_time": watchdog_create_time,
            "job_pgid": job_pgid,
            "now": now_wall,
            "job_id": job_id,
            "attempt": attempt,
            "place": place,
        }

        def mark(db: sqlite3.Connection) -> tuple[int, bool]:
            return int(db.execute(_MARK_RUNNING, params).rowcount), _try_cas(db, then, now_wall, kind)

        changed, applied = await self._db.run(mark)  # one hop, one commit
        if changed == 0:
            logger.warning("job_id=%s attempt=%d: mark_running for no active attempt", job_id, attempt)
        return applied

    async def end_attempt(
        self,
        job_id: str,
        attempt: int,
        state: Literal["exited", "lost", "preflight-failed"],
        exit_code: int | None,
        reason: str,
        now_wall: float,
        then: PersistJob | None = None,
        kind: str = "state",
    ) -> bool:
        """End an attempt, release its devices and, if it exited, record the job's exit code.

        One transaction, with ``then`` (the job's compare-and-set, see :meth:`apply`) after it when
        given. Idempotent: the first end of an attempt is the one kept.

        Returns:
            False if ``then`` lost its compare-and-set (the attempt's end is written even so);
            True otherwise.
        """
        if state not in ("exited", "lost", "preflight-failed"):
            raise ValueError(f"an attempt ends as 'exited', 'lost' or 'preflight-failed', not {state!r}")
        params = {
            "state": state,
            "now": now_wall,
            "exit_code": exit_code,
            "reason": reason,
            "job_id": job_id,
            "attempt": attempt,
        }

        def end(db: sqlite3.Connection) -> bool:
            db.execute(_END_ATTEMPT, params)
            db.execute(RELEASE_GRANTS, ("", job_id, attempt))
            if state == "exited" and exit_code is not None:
                db.execute(_SET_JOB_EXIT, (exit_code, job_id, attempt))
            return _try_cas(db, then, now_wall, kind)

        return await self._db.run(end)  # one hop to the store's thread, one commit

    async def holder_facts(self, job_id: str, attempt: int) -> tuple[int, str | None, set[str]] | None:
        """In one read: the job's current attempt and holder, and the node ids that held attempt
        ``attempt`` (its worker and its gang's members); None when no such job is owned here."""
        rows = await self._db.fetch_all(_HOLDER_FACTS, (attempt, job_id))
        if not rows:
            return None
        current, holder, worker, placement = rows[0]
        held: set[str] = set()
        if isinstance(worker, str):
            held.add(worker)
            try:
                gang = json.loads(placement or "{}").get("gang", [])
            except (ValueError, AttributeError):
                gang = []
            if isinstance(gang, list):
                held.update(m for m in gang if isinstance(m, str))
        return int(current), holder, held

    async def attempts(self, job_id: str) -> list[AttemptRow]:
        """A job's attempts, first attempt first."""
        return [attempt_row(r) for r in await self._db.fetch_all(_ATTEMPTS, (job_id,))]

    async def latest_attempts(self, job_ids: Collection[str]) -> dict[str, AttemptRow]:
        """The row of each job's current attempt (``jobs.attempt``), by job id; jobs not run yet are absent."""
        if not job_ids:
            return {}
        rows = await self._db.fetch_all(_LATEST_ATTEMPTS, (json.dumps(sorted(job_ids)),))
        return {a.job_id: a for a in (attempt_row(r) for r in rows)}

    async def active_attempts(self) -> list[AttemptRow]:
        """Every attempt still claimed or running (to re-adopt or mark lost at restart)."""
        return [attempt_row(r) for r in await self._db.fetch_all(_ACTIVE_ATTEMPTS, ())]

    # -------------------------------------------------------------------- events

    async def events(self, job_id: str) -> list[EventRow]:
        """A job's history, oldest first."""
        return [event_row(r) for r in await self._db.fetch_all(_EVENTS, (job_id,))]

    async def add_event(
        self,
        job_id: str,
        kind: str,
        reason: str,
        *,
        attempt: int | None = None,
        stimulus_id: str = "",
        now_wall: float,
    ) -> EventRow:
        """Append a history entry that is not a state change (an explain refresh, a log note).

        Returns:
            The stored event.
        """
        params = event_params(job_id, now_wall, kind, None, None, attempt, reason, stimulus_id)
        rows = await self._db.fetch_all(_INSERT_EVENT, params)
        seq = int(next(iter(rows))[0])
        return EventRow(seq, job_id, now_wall, kind, None, None, attempt, reason, stimulus_id)


def _try_cas(db: sqlite3.Connection, action: PersistJob | None, now_wall: float, kind: str) -> bool:
    """:func:`_cas` of ``action`` (None: nothing, True) without rolling back the caller's other writes:
    False if it lost (its UPDATE changed nothing, so nothing of it is written)."""
    if action is None:
        return True
    if not action.reason:
        raise ValueError(f"job {action.record.job_id}: a stored change needs a reason")
    try:
        _cas(db, action, now_wall, kind)
    except Rollback:
        return False
    return True


def _cas(db: sqlite3.Connection, action: PersistJob, now_wall: float, kind: str) -> None:
    """The compare-and-set of ``action`` and its event row, in the caller's transaction (store thread).

    Raises:
        Rollback: the job was no longer as ``action`` expects.
    """
    rec = action.record
    params = {
        "status": rec.status.value,
        "attempt": rec.attempt,
        "holder": rec.holder,
        "retries_left": rec.retries_left,
        "lease_expires_at": rec.lease_expires_at,
        "cancel_requested": int(rec.cancel_requested),
        "reason": action.reason,
        "now": now_wall,
        "retry_at": None if action.retry_in_s is None else now_wall + action.retry_in_s,
        "avoid_worker": rec.avoid,
        "preflight_failed_on": " ".join(rec.preflight_failed_on),
        "id": rec.job_id,
        "expect_status": action.expect_status.value,
        "expect_attempt": action.expect_attempt,
        "expect_cancel_requested": int(action.expect_cancel_requested),
    }
    if db.execute(_CAS_JOB, params).rowcount != 1:
        raise Rollback
    if action.reason:  # always, through apply(); claim() passes the claim's reason
        db.execute(_INSERT_EVENT, event_params(rec.job_id, now_wall, kind, action.expect_status, rec.status,
                                               rec.attempt, action.reason, action.stimulus_id)).fetchall()


def _write_claim(db: sqlite3.Connection, action: PersistJob, worker: str, placement_json: str,
                 grants: Sequence[tuple[str, int, str]], run_dir: str, now_wall: float, kind: str,
                 history: Sequence[tuple[str, float, str]], taken: list[str]) -> None:
    """The writes of a granted claim in the caller's transaction (store thread): its history events,
    the compare-and-set, the attempt row and the device grants.

    Raises:
        Rollback: the job was no longer as expected, a device is listed twice or already granted
            (its uuids are added to ``taken``).
    """
    rec = action.record
    uuids = [uuid for uuid, _index, _accelerator in grants]
    if len(set(uuids)) != len(uuids):
        logger.warning("job_id=%s: claim lists a device twice: %s", rec.job_id, uuids)
        raise Rollback
    if uuids:
        taken.extend(str(r[0]) for r in db.execute(SELECT_GRANTED, (json.dumps(uuids),)).fetchall())
        if taken:
            logger.info("job_id=%s stimulus_id=%s: claim refused, devices already granted: %s",
                        rec.job_id, action.stimulus_id, ", ".join(taken))
            raise Rollback
    for h_kind, at, words in history:
        db.execute(_INSERT_EVENT, event_params(rec.job_id, at, h_kind, JobStatus.QUEUED, JobStatus.QUEUED,
                                               rec.attempt, words, action.stimulus_id)).fetchall()
    _cas(db, action, now_wall, kind)
    db.execute(_INSERT_ATTEMPT, (rec.job_id, rec.attempt, worker, placement_json, run_dir))
    db.executemany(INSERT_GRANT,
                   [(uuid, index, acc, rec.job_id, rec.attempt, now_wall, "") for uuid, index, acc in grants])
