"""The daemon's SQLite store: jobs it owns, their attempts and history, devices it granted.

The only module that imports aiosqlite. One writer connection in WAL mode with
``synchronous=FULL``: a method that returns has committed its write, so a ``kill -9``
at any later moment loses nothing acknowledged. Every read-modify-write runs in
``BEGIN IMMEDIATE``; an :class:`asyncio.Lock` keeps coroutines from interleaving
statements inside one transaction.

The schema grows only through the numbered, forward-only :data:`MIGRATIONS`, tracked
with ``PRAGMA user_version``.

Times: ``*_at`` columns are wall-clock seconds since the epoch, except
``jobs.lease_expires_at``, which is on the owner's monotonic clock (it is the core's
:attr:`JobRecord.lease_expires_at`). ``*_s`` are durations in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import aiosqlite

from gpulayerd.core.claims import JobRecord, JobStatus, PersistJob

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AmbiguousJobId",
    "AttemptRow",
    "EventRow",
    "GrantRow",
    "JobNotFound",
    "JobRow",
    "RemoteRunRow",
    "Store",
    "StoreError",
]

logger = logging.getLogger(__name__)

AttemptState = Literal["claimed", "running", "exited", "lost"]
_T = TypeVar("_T")
_Params = Sequence[object] | Mapping[str, object]

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY NOT NULL,
            name TEXT,
            submitted_by TEXT,
            spec_json TEXT NOT NULL,
            status TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            holder TEXT,
            retries_left INTEGER NOT NULL DEFAULT 0,
            lease_s REAL NOT NULL,
            lease_expires_at REAL,  -- owner's monotonic clock
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            reason TEXT NOT NULL DEFAULT '',
            explanation_json TEXT,
            exit_code INTEGER,
            submitted_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            seq INTEGER  -- submission order
        );
        CREATE UNIQUE INDEX jobs_seq ON jobs (seq);
        CREATE INDEX jobs_status_seq ON jobs (status, seq);

        CREATE TABLE attempts (
            job_id TEXT NOT NULL REFERENCES jobs (id),
            attempt INTEGER NOT NULL,
            worker TEXT NOT NULL,
            placement_json TEXT NOT NULL,
            state TEXT NOT NULL,  -- claimed | running | exited | lost
            run_dir TEXT,
            watchdog_pid INTEGER,
            watchdog_create_time REAL,
            job_pgid INTEGER,
            started_at REAL,
            ended_at REAL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (job_id, attempt)
        );
        CREATE INDEX attempts_state ON attempts (state);

        CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            from_status TEXT,
            to_status TEXT,
            attempt INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            stimulus_id TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX events_job_seq ON events (job_id, seq);

        CREATE TABLE grants (
            device_uuid TEXT PRIMARY KEY NOT NULL,
            device_index INTEGER NOT NULL,
            accelerator TEXT NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            granted_at REAL NOT NULL
        );
        CREATE INDEX grants_job_attempt ON grants (job_id, attempt);
        """,
    ),
    (
        2,
        """
        CREATE TABLE remote_runs (
            owner TEXT NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            spec_json TEXT NOT NULL,
            placement_json TEXT NOT NULL,
            lease_s REAL NOT NULL,
            run_dir TEXT NOT NULL,
            state TEXT NOT NULL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            reported INTEGER NOT NULL DEFAULT 0,
            started_at REAL,
            ended_at REAL,
            PRIMARY KEY (owner, job_id, attempt)
        );
        CREATE INDEX remote_runs_state ON remote_runs (state, reported);

        CREATE TABLE peers (
            node_id TEXT PRIMARY KEY NOT NULL,
            name TEXT NOT NULL DEFAULT '',
            addresses_json TEXT NOT NULL DEFAULT '[]',
            port INTEGER NOT NULL,
            last_seen_at REAL
        );
        """,
    ),
)
"""(version, SQL script) pairs, applied in order, each in its own transaction. Append only."""

SCHEMA_VERSION = MIGRATIONS[-1][0]
"""The schema version this code writes."""


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption, constraint, version)."""


class JobNotFound(StoreError):
    """No job matches the given id or prefix."""


class AmbiguousJobId(StoreError):
    """A job id prefix matches more than one job."""


# ------------------------------------------------------------------------------ rows


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of ``jobs``: a job this daemon owns.

    Fields are named after the columns.

    Attributes:
        seq: submission order, assigned by :meth:`Store.insert_job` (None before).
        lease_expires_at: owner-monotonic seconds, or None when no lease runs.
        explanation_json: the latest ``explain`` result for a waiting job, or None.
        exit_code: exit status of the attempt that exited, or None.
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

    def record(self) -> JobRecord:
        """The core state machine's view of this job."""
        return JobRecord(
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


# ------------------------------------------------------------------------------- SQL

_JOB_FIELDS = tuple(f.name for f in fields(JobRow))
"""The columns of ``jobs``, named as the fields of :class:`JobRow`."""
_JOB_COLUMNS = ", ".join(_JOB_FIELDS)
_ATTEMPT_COLUMNS = (
    "job_id, attempt, worker, placement_json, state, run_dir, watchdog_pid, watchdog_create_time, "
    "job_pgid, started_at, ended_at, exit_code, reason"
)
_EVENT_COLUMNS = "seq, job_id, at, kind, from_status, to_status, attempt, reason, stimulus_id"
_GRANT_COLUMNS = "device_uuid, device_index, accelerator, job_id, attempt, granted_at"

_NEXT_SEQ = "(SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs)"
_INSERT_JOB = (
    f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES ("
    + ", ".join(_NEXT_SEQ if name == "seq" else f":{name}" for name in _JOB_FIELDS)
    + ") RETURNING seq"
)
_INSERT_EVENT = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq"
_CAS_JOB = """
UPDATE jobs SET status = :status, attempt = :attempt, holder = :holder, retries_left = :retries_left,
    lease_expires_at = :lease_expires_at, cancel_requested = :cancel_requested,
    reason = CASE WHEN :reason = '' THEN reason ELSE :reason END, updated_at = :now
WHERE id = :id AND status = :expect_status AND attempt = :expect_attempt
    AND cancel_requested = :expect_cancel_requested"""
_SELECT_GRANTED = "SELECT device_uuid FROM grants WHERE device_uuid IN (SELECT value FROM json_each(?))"
_INSERT_ATTEMPT = """
INSERT INTO attempts (job_id, attempt, worker, placement_json, state, run_dir)
VALUES (?, ?, ?, ?, 'claimed', ?)"""
_INSERT_GRANT = f"INSERT INTO grants ({_GRANT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
_MARK_RUNNING = """
UPDATE attempts SET state = 'running', watchdog_pid = :watchdog_pid,
    watchdog_create_time = :watchdog_create_time, job_pgid = :job_pgid,
    started_at = COALESCE(started_at, :now)
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('claimed', 'running')"""
_END_ATTEMPT = """
UPDATE attempts SET state = :state, ended_at = :now, exit_code = :exit_code, reason = :reason
WHERE job_id = :job_id AND attempt = :attempt AND state IN ('claimed', 'running')"""
_RELEASE_GRANTS = "DELETE FROM grants WHERE job_id = ? AND attempt = ?"
_SET_JOB_EXIT = "UPDATE jobs SET exit_code = ? WHERE id = ? AND attempt = ? AND exit_code IS NULL"
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
_IDS_FROM = "SELECT id FROM jobs WHERE id >= ? ORDER BY id LIMIT ?"
_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events WHERE job_id = ? ORDER BY seq"
_ATTEMPTS = f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY attempt"
_ACTIVE_ATTEMPTS = (
    f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE state IN ('claimed', 'running') ORDER BY job_id, attempt"
)
_GRANTS = f"SELECT {_GRANT_COLUMNS} FROM grants ORDER BY device_index, device_uuid"
_COUNTS = "SELECT status, COUNT(*) FROM jobs GROUP BY status"

_AMBIGUOUS_SHOWN = 5
"""How many matching ids an :class:`AmbiguousJobId` message lists."""


class _Rollback(Exception):
    """Raised inside a transaction to roll it back without an error."""


# ----------------------------------------------------------------------------- store


class Store:
    """The daemon's durable state. Open with :meth:`open`; close with :meth:`close`."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        """Wrap an already configured and migrated connection; use :meth:`open` instead."""
        self._db: aiosqlite.Connection | None = db
        self._path = path
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0) -> Store:
        """Open (creating if needed) the store at ``path`` and migrate it to :data:`SCHEMA_VERSION`.

        Args:
            path: the SQLite file; its directory must exist.
            busy_timeout_s: how long a statement waits for another process's lock.

        Raises:
            StoreError: the file cannot be opened or migrated, or it was written by
                newer code (its schema version is above :data:`SCHEMA_VERSION`).
        """
        try:
            db = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open store {path}: {e}") from e
        try:
            await _configure(db, path, busy_timeout_s)
            await _migrate(db, path)
        except BaseException:
            await db.close()
            raise
        return cls(db, path)

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    async def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        db, self._db = self._db, None
        if db is not None:
            async with self._lock:
                await db.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ---------------------------------------------------------------------- jobs

    async def insert_job(self, row: JobRow, reason: str, stimulus_id: str = "") -> JobRow:
        """Store a new job and its "submitted" event in one transaction.

        ``row.seq`` is ignored: the job gets the next submission number. A job stored
        as ``rejected`` with an empty ``row.reason`` keeps ``reason`` as its reason.

        Returns:
            The row as stored (with its ``seq``).

        Raises:
            StoreError: a job with this id exists already.
        """
        stored_reason = row.reason or (reason if row.status is JobStatus.REJECTED else "")
        async with self._transaction() as db:
            try:
                seq_rows = await db.execute_fetchall(
                    _INSERT_JOB, _job_params(replace(row, reason=stored_reason))
                )
            except sqlite3.IntegrityError as e:
                raise StoreError(f"job {row.id} already exists") from e
            await db.execute_fetchall(
                _INSERT_EVENT,
                _event_params(
                    row.id, row.submitted_at, "submitted", None, row.status, None, reason, stimulus_id
                ),
            )
        return replace(row, reason=stored_reason, seq=int(next(iter(seq_rows))[0]))

    async def get_job(self, job_id: str) -> JobRow | None:
        """The job with exactly this id, or None."""
        rows = await self._read(_GET_JOB, (job_id,))
        return _job_row(rows[0]) if rows else None

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
        rows = await self._read(_LIST_JOBS[statuses is not None, newest_first], params)
        return [_job_row(r) for r in rows]

    async def resolve_job_id(self, prefix: str) -> str:
        """The id of the one job whose id starts with ``prefix`` (an exact id always wins).

        Raises:
            JobNotFound: no job id starts with ``prefix``.
            AmbiguousJobId: several do; the message lists up to five of them.
        """
        if not prefix:
            raise JobNotFound("empty job id")
        # Ids sharing a prefix are contiguous in BINARY order and start at the prefix itself.
        rows = await self._read(_IDS_FROM, (prefix, _AMBIGUOUS_SHOWN + 1))
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
        """Carry out ``action`` as a compare-and-set on (status, attempt).

        An event row is appended unless ``action.reason`` is empty (a lease renewal).

        Returns:
            True if the job still had ``expect_status`` and ``expect_attempt`` and is
            now stored as ``action.record``; False if it had moved on (nothing written).
        """
        try:
            async with self._transaction() as db:
                await self._cas(db, action, now_wall, kind)
        except _Rollback:
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

        Returns:
            False, writing nothing, if the job was no longer as expected or any of the
            devices is already granted (a device is never granted twice).

        Raises:
            ValueError: ``action`` is not a claim.
        """
        rec = action.record
        if rec.status is not JobStatus.CLAIMED:
            raise ValueError(f"claim() needs a PersistJob to 'claimed', not {rec.status.value!r}")
        uuids = [uuid for uuid, _index, _accelerator in grants]
        if len(set(uuids)) != len(uuids):
            logger.warning("job_id=%s: claim lists a device twice: %s", rec.job_id, uuids)
            return False
        try:
            async with self._transaction() as db:
                taken = await db.execute_fetchall(_SELECT_GRANTED, (json.dumps(uuids),))
                if taken:
                    logger.info(
                        "job_id=%s stimulus_id=%s: claim refused, devices already granted: %s",
                        rec.job_id,
                        action.stimulus_id,
                        ", ".join(str(r[0]) for r in taken),
                    )
                    raise _Rollback
                await self._cas(db, action, now_wall, kind)
                await db.execute(_INSERT_ATTEMPT, (rec.job_id, rec.attempt, worker, placement_json, run_dir))
                await db.executemany(
                    _INSERT_GRANT,
                    [(uuid, index, acc, rec.job_id, rec.attempt, now_wall) for uuid, index, acc in grants],
                )
        except _Rollback:
            return False
        return True

    async def set_explanation(self, job_id: str, reason: str, explanation_json: str | None) -> None:
        """Refresh a waiting job's one-line reason and explanation (no event, no status change).

        Does nothing unless the job is ``queued`` or ``rejected``.
        """
        await self._write_one(_SET_EXPLANATION, (reason, explanation_json, job_id))

    async def counts(self) -> dict[str, int]:
        """Number of jobs in each status (every known status present, 0 if none)."""
        counts = {s.value: 0 for s in JobStatus}
        for status, n in await self._read(_COUNTS, ()):
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
    ) -> None:
        """Record that an attempt's processes run (or were re-adopted) under this watchdog.

        Keeps the first ``started_at``. An attempt that already ended is left alone.
        The job's own status change goes through :meth:`apply`.
        """
        params = {
            "watchdog_pid": watchdog_pid,
            "watchdog_create_time": watchdog_create_time,
            "job_pgid": job_pgid,
            "now": now_wall,
            "job_id": job_id,
            "attempt": attempt,
        }
        if await self._write_one(_MARK_RUNNING, params) == 0:
            logger.warning("job_id=%s attempt=%d: mark_running for no active attempt", job_id, attempt)

    async def end_attempt(
        self,
        job_id: str,
        attempt: int,
        state: Literal["exited", "lost"],
        exit_code: int | None,
        reason: str,
        now_wall: float,
    ) -> None:
        """End an attempt, release its devices and, if it exited, record the job's exit code.

        One transaction. Idempotent: the first end of an attempt is the one kept.
        """
        if state not in ("exited", "lost"):
            raise ValueError(f"an attempt ends as 'exited' or 'lost', not {state!r}")
        params = {
            "state": state,
            "now": now_wall,
            "exit_code": exit_code,
            "reason": reason,
            "job_id": job_id,
            "attempt": attempt,
        }
        async with self._transaction() as db:
            await db.execute(_END_ATTEMPT, params)
            await db.execute(_RELEASE_GRANTS, (job_id, attempt))
            if state == "exited" and exit_code is not None:
                await db.execute(_SET_JOB_EXIT, (exit_code, job_id, attempt))

    async def attempts(self, job_id: str) -> list[AttemptRow]:
        """A job's attempts, first attempt first."""
        return [_attempt_row(r) for r in await self._read(_ATTEMPTS, (job_id,))]

    async def active_attempts(self) -> list[AttemptRow]:
        """Every attempt still claimed or running (to re-adopt or mark lost at restart)."""
        return [_attempt_row(r) for r in await self._read(_ACTIVE_ATTEMPTS, ())]

    async def grants(self) -> list[GrantRow]:
        """Every device currently granted, by device index."""
        return [GrantRow(*r) for r in await self._read(_GRANTS, ())]

    # ------------------------------------------------------------- remote runs

    async def insert_remote_run(self, row: RemoteRunRow, grants: Sequence[tuple[str, int, str]],
                                now_wall: float) -> bool:
        """Record an attempt granted to us by another owner, with its device grants, atomically.

        Returns:
            False, writing nothing, if a device is already granted or the attempt is known.
        """
        uuids = [uuid for uuid, _i, _a in grants]
        try:
            async with self._transaction() as db:
                if uuids and await db.execute_fetchall(_SELECT_GRANTED, (json.dumps(uuids),)):
                    raise _Rollback
                known = await db.execute_fetchall(
                    "SELECT 1 FROM remote_runs WHERE owner = ? AND job_id = ? AND attempt = ?",
                    (row.owner, row.job_id, row.attempt))
                if known:
                    raise _Rollback
                await db.execute(
                    "INSERT INTO remote_runs (owner, job_id, attempt, spec_json, placement_json, lease_s, "
                    "run_dir, state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row.owner, row.job_id, row.attempt, row.spec_json, row.placement_json, row.lease_s,
                     row.run_dir, row.state, row.started_at))
                await db.executemany(
                    _INSERT_GRANT, [(u, i, a, row.job_id, row.attempt, now_wall) for u, i, a in grants])
        except _Rollback:
            return False
        return True

    async def end_remote_run(self, owner: str, job_id: str, attempt: int, state: str, exit_code: int | None,
                             reason: str, now_wall: float) -> None:
        """Record how a remote attempt ended and release its devices (idempotent)."""
        async with self._transaction() as db:
            await db.execute(
                "UPDATE remote_runs SET state = ?, exit_code = ?, reason = ?, ended_at = ? "
                "WHERE owner = ? AND job_id = ? AND attempt = ? AND state NOT IN ('exited', 'lost')",
                (state, exit_code, reason, now_wall, owner, job_id, attempt))
            await db.execute("DELETE FROM grants WHERE job_id = ? AND attempt = ?", (job_id, attempt))

    async def mark_remote_reported(self, owner: str, job_id: str, attempt: int) -> None:
        """The owner acknowledged the end of this attempt."""
        await self._write_one(
            "UPDATE remote_runs SET reported = 1 WHERE owner = ? AND job_id = ? AND attempt = ?",
            (owner, job_id, attempt))

    async def remote_runs(self, *, active: bool | None = None, unreported: bool = False) -> list[RemoteRunRow]:
        """Remote attempts: ``active`` True for running ones, False for ended ones."""
        where: list[str] = []
        params: list[object] = []
        if active is True:
            where.append("state = 'running'")
        elif active is False:
            where.append("state IN ('exited', 'lost')")
        if unreported:
            where.append("reported = 0")
        sql = ("SELECT owner, job_id, attempt, spec_json, placement_json, lease_s, run_dir, state, exit_code, "
               "reason, reported, started_at, ended_at FROM remote_runs")
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._read(sql + " ORDER BY started_at", params)
        return [
            RemoteRunRow(owner=r[0], job_id=r[1], attempt=r[2], spec_json=r[3], placement_json=r[4], lease_s=r[5],
                         run_dir=r[6], state=r[7], exit_code=r[8], reason=r[9], reported=bool(r[10]),
                         started_at=r[11], ended_at=r[12])
            for r in rows
        ]

    async def remote_run(self, owner: str, job_id: str, attempt: int) -> RemoteRunRow | None:
        """One remote attempt."""
        for r in await self.remote_runs():
            if (r.owner, r.job_id, r.attempt) == (owner, job_id, attempt):
                return r
        return None

    async def save_peer(self, node_id: str, name: str, addresses: Sequence[str], port: int, now_wall: float) -> None:
        """Remember a trusted peer's addresses (used as hints after a restart)."""
        await self._write_one(
            "INSERT INTO peers (node_id, name, addresses_json, port, last_seen_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(node_id) DO UPDATE SET name = excluded.name, addresses_json = excluded.addresses_json, "
            "port = excluded.port, last_seen_at = excluded.last_seen_at",
            (node_id, name, json.dumps(list(addresses)), port, now_wall))

    async def saved_peers(self) -> list[tuple[str, str, list[str], int]]:
        """(node id, name, addresses, port) of every remembered peer."""
        rows = await self._read("SELECT node_id, name, addresses_json, port FROM peers ORDER BY node_id", ())
        return [(r[0], r[1], list(json.loads(r[2])), int(r[3])) for r in rows]

    # -------------------------------------------------------------------- events

    async def events(self, job_id: str) -> list[EventRow]:
        """A job's history, oldest first."""
        return [_event_row(r) for r in await self._read(_EVENTS, (job_id,))]

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
        params = _event_params(job_id, now_wall, kind, None, None, attempt, reason, stimulus_id)
        async with self._lock:
            db = self._conn()
            await self._settle(db)
            rows = await self._call(db.execute_fetchall(_INSERT_EVENT, params))
        seq = int(next(iter(rows))[0])
        return EventRow(seq, job_id, now_wall, kind, None, None, attempt, reason, stimulus_id)

    # --------------------------------------------------------------------- admin

    async def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: "ok" when the file is sound, else its findings."""
        rows = await self._read("PRAGMA integrity_check", ())
        return "\n".join(str(r[0]) for r in rows)

    # ------------------------------------------------------------------- helpers

    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StoreError(f"store {self._path} is closed")
        return self._db

    async def _cas(self, db: aiosqlite.Connection, action: PersistJob, now_wall: float, kind: str) -> None:
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
            "id": rec.job_id,
            "expect_status": action.expect_status.value,
            "expect_attempt": action.expect_attempt,
            "expect_cancel_requested": int(action.expect_cancel_requested),
        }
        async with db.execute(_CAS_JOB, params) as cur:
            if cur.rowcount != 1:
                raise _Rollback
        if action.reason:
            await db.execute_fetchall(
                _INSERT_EVENT,
                _event_params(
                    rec.job_id,
                    now_wall,
                    kind,
                    action.expect_status,
                    rec.status,
                    rec.attempt,
                    action.reason,
                    action.stimulus_id,
                ),
            )

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` under the lock; rolled back on any exception."""
        async with self._lock:
            db = self._conn()
            await self._settle(db)
            try:
                # Inside the try: if cancelled while BEGIN is in flight, the ROLLBACK queued
                # behind it still closes the transaction.
                await db.execute("BEGIN IMMEDIATE")
                yield db
                await db.execute("COMMIT")
            except BaseException as e:
                await self._rollback(db)
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"store {self._path}: {e}") from e
                raise

    async def _settle(self, db: aiosqlite.Connection) -> None:
        """Roll back a transaction left open by a coroutine cancelled inside it."""
        if db.in_transaction:
            await self._rollback(db)

    async def _rollback(self, db: aiosqlite.Connection) -> None:
        # Unconditional: a statement still in flight (its awaiter cancelled) runs first on the
        # connection's thread, so in_transaction may not be up to date yet.
        try:
            await db.execute("ROLLBACK")
        except sqlite3.Error as e:
            logger.debug("store %s: rollback: %s", self._path, e)

    async def _read(self, sql: str, params: _Params) -> list[Any]:
        async with self._lock:
            db = self._conn()
            await self._settle(db)
            rows = await self._call(db.execute_fetchall(sql, params))
        return list(rows)

    async def _write_one(self, sql: str, params: _Params) -> int:
        """Run one statement on its own (it is its own transaction); the number of rows changed."""
        async with self._lock:
            db = self._conn()
            await self._settle(db)
            async with await self._call(db.execute(sql, params)) as cur:
                return int(cur.rowcount)

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except sqlite3.Error as e:
            raise StoreError(f"store {self._path}: {e}") from e


# ----------------------------------------------------------------- open and migrate


async def _configure(db: aiosqlite.Connection, path: Path, busy_timeout_s: float) -> None:
    try:
        await db.execute(f"PRAGMA busy_timeout = {max(0, round(busy_timeout_s * 1000)):d}")
        rows = list(await db.execute_fetchall("PRAGMA journal_mode = WAL"))
        await db.execute("PRAGMA synchronous = FULL")
        await db.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as e:
        raise StoreError(f"cannot configure store {path}: {e}") from e
    mode = str(rows[0][0]) if rows else "?"
    if mode.lower() != "wal":
        logger.warning("store %s: journal mode is %s, not wal", path, mode)


async def _user_version(db: aiosqlite.Connection) -> int:
    rows = list(await db.execute_fetchall("PRAGMA user_version"))
    return int(rows[0][0])


async def _migrate(db: aiosqlite.Connection, path: Path) -> None:
    try:
        version = await _user_version(db)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {path} has schema version {version}, newer than this gpulayerd knows "
                f"({SCHEMA_VERSION}); upgrade gpulayer or use another state directory"
            )
        for target, script in MIGRATIONS:
            if target <= version:
                continue
            try:
                await db.execute("BEGIN IMMEDIATE")
                if await _user_version(db) < target:  # another process may have got there first
                    for statement in _statements(script):
                        await db.execute(statement)
                    await db.execute(f"PRAGMA user_version = {target:d}")
                await db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    await db.execute("ROLLBACK")
                raise
            logger.info("store %s: migrated to schema version %d", path, target)
    except sqlite3.Error as e:
        raise StoreError(f"cannot migrate store {path}: {e}") from e


def _statements(script: str) -> Iterable[str]:
    """Split an SQL script into statements (executescript would commit the open transaction)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement != ";":
                yield statement
    if pending.strip(" \n\t;"):
        raise StoreError(f"incomplete SQL statement in migration: {pending.strip()[:80]!r}")


# ------------------------------------------------------------------------ row codecs


def _job_params(row: JobRow) -> dict[str, object]:
    params: dict[str, object] = {name: getattr(row, name) for name in _JOB_FIELDS if name != "seq"}
    return params | {"status": row.status.value, "cancel_requested": int(row.cancel_requested)}


def _job_row(r: Sequence[Any]) -> JobRow:
    values = dict(zip(_JOB_FIELDS, r, strict=True))
    values |= {"status": JobStatus(values["status"]), "cancel_requested": bool(values["cancel_requested"])}
    return JobRow(**values)


def _attempt_row(r: Sequence[Any]) -> AttemptRow:
    return AttemptRow(*r)


def _event_params(
    job_id: str,
    at: float,
    kind: str,
    from_status: JobStatus | None,
    to_status: JobStatus | None,
    attempt: int | None,
    reason: str,
    stimulus_id: str,
) -> tuple[object, ...]:
    from_value = None if from_status is None else from_status.value
    to_value = None if to_status is None else to_status.value
    return (job_id, at, kind, from_value, to_value, attempt, reason, stimulus_id)


def _event_row(r: Sequence[Any]) -> EventRow:
    seq, job_id, at, kind, from_status, to_status, attempt, reason, stimulus_id = r
    from_value = None if from_status is None else JobStatus(from_status)
    to_value = None if to_status is None else JobStatus(to_status)
    return EventRow(seq, job_id, at, kind, from_value, to_value, attempt, reason, stimulus_id)
