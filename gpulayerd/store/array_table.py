"""The ``arrays`` table and the array tasks in ``jobs``: an array's cursor and its tasks' counts.

An array is a job row of its own (``jobs``, never scheduled) plus a row here (its expression, how
many tasks, how many positions are materialized). :meth:`ArraysTable.materialize` writes the next
tasks' job rows (``array_id`` set) and moves the cursor in one transaction: an index is
materialized once, whatever crashes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from gpulayerd.store.db import Database
from gpulayerd.store.rows import JOB_FIELDS, JobRow, event_params, job_params, job_row

__all__ = ["ArrayRow", "ArraysTable", "Materialized"]

_COLUMNS = ", ".join(JOB_FIELDS)
_INSERT_TASK = (
    f"INSERT INTO jobs ({_COLUMNS}, array_id) VALUES ("
    + ", ".join("(SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs)" if n == "seq" else f":{n}" for n in JOB_FIELDS)
    + ", :array_id) RETURNING seq"
)
_INSERT_EVENT = "INSERT INTO events VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_ARRAY = "INSERT INTO arrays (id, expr, total, materialized) VALUES (?, ?, ?, 0)"
_ARRAY = "SELECT a.id, a.expr, a.total, a.materialized, j.status, j.cancel_requested FROM arrays a " \
         "JOIN jobs j ON j.id = a.id WHERE a.id = ?"
_ARRAYS = "SELECT a.id, a.expr, a.total, a.materialized, j.status, j.cancel_requested FROM arrays a " \
          "JOIN jobs j ON j.id = a.id WHERE a.id IN (SELECT value FROM json_each(?))"
_OPEN = "SELECT a.id FROM arrays a JOIN jobs j ON j.id = a.id WHERE j.status = 'queued' ORDER BY j.seq"
_ACTIVE = "SELECT COUNT(*) FROM jobs WHERE array_id = ? AND status IN ('queued', 'claimed', 'running')"
_MOVE = "UPDATE arrays SET materialized = ? WHERE id = ? AND materialized = ?"
_EXISTS = "SELECT 1 FROM jobs WHERE id = ?"
_COUNTS = ("SELECT array_id, status, COUNT(*) FROM jobs WHERE array_id IN (SELECT value FROM json_each(?)) "
           "GROUP BY array_id, status")
_LATEST_NOT_TASKS = (f"SELECT {_COLUMNS} FROM jobs WHERE status IN (SELECT value FROM json_each(?)) "
                     "AND array_id IS NULL ORDER BY seq DESC LIMIT ?")
_COUNT_NOT_TASKS = "SELECT COUNT(*) FROM jobs WHERE status IN (SELECT value FROM json_each(?)) AND array_id IS NULL"
_UNFINISHED = (f"SELECT {_COLUMNS} FROM jobs WHERE array_id = ? AND status IN ('queued', 'claimed', 'running') "
               "ORDER BY seq")


@dataclass(frozen=True, slots=True)
class ArrayRow:
    """One array: its expression as submitted, tasks in all, positions materialized, its job row's state."""

    id: str
    expr: str
    total: int
    materialized: int
    status: str
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Materialized:
    """What one :meth:`ArraysTable.materialize` wrote: the new tasks' rows and the cursor after; whether
    the array's row is still queued and not being cancelled (``open``: else nothing was written), and
    how many of its tasks are queued, claimed or running after the write (``active``; 0 when not open)."""

    tasks: list[JobRow]
    materialized: int
    open: bool = True
    active: int = 0


class ArraysTable:
    """Arrays owned here: the cursor and the tasks' counts."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    @staticmethod
    def writer(array_id: str, expr: str, total: int) -> Callable[[sqlite3.Connection], None]:
        """The write of an array's row, for :meth:`JobsTable.insert_job`'s ``also`` (one transaction
        with the array's job row)."""
        return lambda db: db.execute(_INSERT_ARRAY, (array_id, expr, total)).close()

    async def get(self, array_id: str) -> ArrayRow | None:
        """The array ``array_id`` (exact), or None."""
        rows = await self._db.fetch_all(_ARRAY, (array_id,))
        return _array_row(rows[0]) if rows else None

    async def many(self, array_ids: Collection[str]) -> dict[str, ArrayRow]:
        """The arrays among ``array_ids`` (ids of other jobs are left out)."""
        if not array_ids:
            return {}
        rows = await self._db.fetch_all(_ARRAYS, (json.dumps(sorted(array_ids)),))
        return {r[0]: _array_row(r) for r in rows}

    async def open_ids(self) -> list[str]:
        """Arrays whose job row is still queued (tasks to materialize or to wait for), oldest first."""
        return [str(r[0]) for r in await self._db.fetch_all(_OPEN, ())]

    async def counts(self, array_ids: Collection[str]) -> dict[str, dict[str, int]]:
        """Array id -> task state -> how many materialized tasks are in it."""
        if not array_ids:
            return {}
        out: dict[str, dict[str, int]] = {}
        for array_id, status, n in await self._db.fetch_all(_COUNTS, (json.dumps(sorted(array_ids)),)):
            out.setdefault(str(array_id), {})[str(status)] = int(n)
        return out

    async def latest_not_tasks(self, statuses: Collection[str], limit: int) -> tuple[list[JobRow], int]:
        """The latest ``limit`` jobs in ``statuses`` that are no array's task (newest first), and how
        many such jobs there are in all (``gpulayer jobs``' latest finished: a task is counted in its
        array's row)."""
        states = json.dumps(sorted(statuses))
        rows = await self._db.fetch_all(_LATEST_NOT_TASKS, (states, limit))
        total = await self._db.fetch_all(_COUNT_NOT_TASKS, (states,))
        return [job_row(r) for r in rows], int(total[0][0])

    async def unfinished(self, array_id: str) -> list[JobRow]:
        """The array's tasks that are queued, claimed or running."""
        return [job_row(r) for r in await self._db.fetch_all(_UNFINISHED, (array_id,))]

    async def write_ahead(self, array_id: str, row: JobRow) -> JobRow | None:
        """Write the task row ``row`` of array ``array_id`` ahead of the cursor (a task cancelled before it
        was materialized: ``row`` is ended) with its event, in one transaction; :meth:`materialize` passes
        its position later. Nothing is written when a row of that id exists already (materialized
        meanwhile: cancel it as any job) or the array is gone.

        Returns:
            The row written (with its ``seq``), or None when nothing was written.
        """
        def txn(db: sqlite3.Connection) -> JobRow | None:
            if not db.execute(_ARRAY, (array_id,)).fetchall() or db.execute(_EXISTS, (row.id,)).fetchone():
                return None
            seq = db.execute(_INSERT_TASK, job_params(row) | {"array_id": array_id}).fetchall()
            db.execute(_INSERT_EVENT, event_params(row.id, row.submitted_at, "cancel requested", None, row.status,
                                                   None, row.reason, f"cancel-{row.id}"))
            return replace(row, seq=int(seq[0][0]))

        return await self._db.run(txn)

    async def materialize(self, array_id: str,
                          decide: Callable[[ArrayRow, int], Sequence[JobRow]]) -> Materialized | None:
        """Write the tasks ``decide(array, active)`` makes (``active``: the array's tasks queued,
        claimed or running now) and move the cursor past them, in one transaction.

        ``decide`` runs on the store's thread inside the transaction (pure, no await); it returns
        the next positions' job rows in order (none: nothing is written). Nothing is written for an
        array whose job row is no longer queued, or is being cancelled.

        Returns:
            The rows written (each with its ``seq``) and the cursor, or None when no such array.
        """
        def txn(db: sqlite3.Connection) -> Materialized | None:
            found = db.execute(_ARRAY, (array_id,)).fetchall()
            if not found:
                return None
            array = _array_row(found[0])
            if array.status != "queued" or array.cancel_requested:
                return Materialized([], array.materialized, open=False)
            active = int(db.execute(_ACTIVE, (array_id,)).fetchone()[0])
            rows = list(decide(array, active))
            written = []
            for row in rows:
                if db.execute(_EXISTS, (row.id,)).fetchone() is not None:
                    continue  # cancelled before it was materialized (write_ahead): its position is passed
                seq = db.execute(_INSERT_TASK, job_params(row) | {"array_id": array_id}).fetchall()
                db.execute(_INSERT_EVENT, event_params(row.id, row.submitted_at, "submitted", None, row.status,
                                                       None, row.reason, f"materialize-{array_id}"))
                written.append(replace(row, seq=int(seq[0][0])))
            moved = array.materialized + len(rows)
            if rows:
                db.execute(_MOVE, (moved, array_id, array.materialized))
            return Materialized(written, moved, active=active + len(written))

        return await self._db.run(txn)


def _array_row(r: Sequence[object]) -> ArrayRow:
    array_id, expr, total, materialized, status, cancel_requested = r
    return ArrayRow(str(array_id), str(expr), int(str(total)), int(str(materialized)), str(status),
                    bool(cancel_requested))
