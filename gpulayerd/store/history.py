"""What accounting reads of the jobs owned here, and the retention of finished jobs.

:meth:`HistoryTable.usage_since` reads, for ``gpulayer report``, the attempts that ran within a
period and the jobs that ended in it (with their first start, for the wait); :meth:`HistoryTable.purge`
removes finished jobs (with their attempts, history events, submission keys and array rows) last
changed before a time: the retention of ``gpulayer history`` (``history_keep_days``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from gpulayerd.core.job_facts import TERMINAL_STATES
from gpulayerd.store.db import Database

__all__ = ["AttemptUsage", "EndedJob", "HistoryTable"]

_TERMINAL = "(" + ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATES)) + ")"


@dataclass(frozen=True, slots=True)
class AttemptUsage:
    """One attempt that ran (``started_at`` set) and had not ended before the period began.

    Attributes:
        spec_json: its job's spec (the user, the GPUs and CPU slots it takes).
        started_at, ended_at: wall s; ``ended_at`` None while it runs.
    """

    job_id: str
    attempt: int
    worker: str
    placement_json: str
    spec_json: str
    started_at: float
    ended_at: float | None


@dataclass(frozen=True, slots=True)
class EndedJob:
    """A job that ended in the period: its state, when it was submitted, ended and first started.

    Attributes:
        worker: the worker of its last attempt ("" when it never ran).
        first_start: wall s its first attempt started; None when none did.
    """

    job_id: str
    spec_json: str
    status: str
    submitted_at: float
    ended_at: float
    worker: str
    placement_json: str
    first_start: float | None


_ATTEMPTS = """
SELECT a.job_id, a.attempt, a.worker, a.placement_json, j.spec_json, a.started_at, a.ended_at
FROM attempts a JOIN jobs j ON j.id = a.job_id
WHERE a.started_at IS NOT NULL AND (a.ended_at IS NULL OR a.ended_at >= ?) AND a.started_at <= ?"""

_ENDED = f"""
SELECT j.id, j.spec_json, j.status, j.submitted_at, j.updated_at,
    COALESCE((SELECT a.worker FROM attempts a WHERE a.job_id = j.id ORDER BY a.attempt DESC LIMIT 1), ''),
    COALESCE((SELECT a.placement_json FROM attempts a WHERE a.job_id = j.id ORDER BY a.attempt DESC LIMIT 1), ''),
    (SELECT MIN(a.started_at) FROM attempts a WHERE a.job_id = j.id)
FROM jobs j
WHERE j.status IN {_TERMINAL} AND j.updated_at >= ? AND j.updated_at <= ?
    AND NOT EXISTS (SELECT 1 FROM arrays r WHERE r.id = j.id)"""

_OLD = f"SELECT id FROM jobs WHERE status IN {_TERMINAL} AND updated_at < ? AND array_id IS NULL"


class HistoryTable:
    """Accounting reads and the retention of finished jobs (see the module)."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    async def usage_since(self, since: float, until: float) -> tuple[list[AttemptUsage], list[EndedJob]]:
        """The attempts that ran between ``since`` and ``until`` (wall s) and the jobs (not whole arrays:
        their tasks) that ended between them."""

        def read(db: sqlite3.Connection) -> tuple[list[AttemptUsage], list[EndedJob]]:
            attempts = [AttemptUsage(*r) for r in db.execute(_ATTEMPTS, (since, until))]
            ended = [EndedJob(*r) for r in db.execute(_ENDED, (since, until))]
            return attempts, ended

        return await self._db.read(read)

    async def usual_duration(self, user: str, command_json: str, exclude: str = "",
                             last: int = 20) -> tuple[float | None, int]:
        """(the median duration in s, how many runs) of the last ``last`` succeeded jobs of ``user`` whose
        command is ``command_json`` (a JSON list), their final attempt's start to end; (None, 0): none."""
        rows = await self._db.fetch_all(
            "SELECT a.ended_at - a.started_at FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.attempt = j.attempt "
            "WHERE j.status = 'succeeded' AND j.id != ? AND a.started_at IS NOT NULL AND a.ended_at IS NOT NULL "
            "AND COALESCE(json_extract(j.spec_json, '$.user'), j.submitted_by, '') = ? "
            "AND json_extract(j.spec_json, '$.command') = json(?) ORDER BY j.updated_at DESC LIMIT ?",
            (exclude, user, command_json, last))
        durations = sorted(max(0.0, float(r[0])) for r in rows)
        if not durations:
            return None, 0
        mid = len(durations) // 2
        median = durations[mid] if len(durations) % 2 else (durations[mid - 1] + durations[mid]) / 2
        return median, len(durations)

    async def active_jobs(self) -> list[tuple[str, str, str]]:
        """(state, user, reason line) of every job owned here that has not ended (queued, claimed,
        running; not the rows of whole arrays), in one read: what ``GET /metrics`` counts."""
        rows = await self._db.fetch_all(
            "SELECT status, COALESCE(json_extract(spec_json, '$.user'), submitted_by, ''), reason FROM jobs "
            "WHERE status IN ('queued', 'claimed', 'running') "
            "AND NOT EXISTS (SELECT 1 FROM arrays r WHERE r.id = jobs.id)",
            ())
        return [(str(s), str(u or ""), str(r or "")) for s, u, r in rows]

    async def purge(self, before: float, batch: int = 500) -> int:
        """Remove the finished jobs last changed before ``before`` (wall s), at most ``batch`` of them
        (an array goes with its tasks, when every one of them is that old), in one transaction; how
        many jobs went. Call again while it returns ``batch``."""

        def purge(db: sqlite3.Connection) -> int:
            ids = [r[0] for r in db.execute(_OLD + " LIMIT ?", (before, batch))]
            arrays = [i for i in ids if db.execute("SELECT 1 FROM arrays WHERE id = ?", (i,)).fetchone()]
            for array_id in arrays:
                if db.execute(f"SELECT 1 FROM jobs WHERE array_id = ? AND (status NOT IN {_TERMINAL} "
                              "OR updated_at >= ?) LIMIT 1", (array_id, before)).fetchone():
                    ids.remove(array_id)  # a task is younger (or still runs): the array stays
                    continue
                ids.extend(r[0] for r in db.execute("SELECT id FROM jobs WHERE array_id = ?", (array_id,)))
            for chunk in (ids[i:i + 400] for i in range(0, len(ids), 400)):
                marks = ", ".join("?" * len(chunk))
                for table, column in (("events", "job_id"), ("attempts", "job_id"), ("submission_keys", "job_id"),
                                      ("arrays", "id"), ("jobs", "id")):
                    db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", chunk)
            return len(ids)

        return await self._db.run(purge)
