"""The ``grants`` and ``remote_runs`` tables: devices this daemon granted, runs it does for others.

(Same name as the package :mod:`gpulayerd.runs`: the same idea (the attempts run on this machine),
their rows here and their processes there.)
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from gpulayerd.store.db import Database, Rollback
from gpulayerd.store.rows import GrantRow, RemoteRunRow

__all__ = ["INSERT_GRANT", "RELEASE_GRANTS", "SELECT_GRANTED", "RunsTable"]

_GRANT_COLUMNS = "device_uuid, device_index, accelerator, job_id, attempt, granted_at"
_INSERT_COLUMNS = f"{_GRANT_COLUMNS}, owner"
SELECT_GRANTED = "SELECT device_uuid FROM grants WHERE device_uuid IN (SELECT value FROM json_each(?))"
"""The device uuids, of a JSON list of them (the one parameter), that are granted already."""
INSERT_GRANT = f"INSERT INTO grants ({_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
"""Insert one ``grants`` row: (device_uuid, device_index, accelerator, job_id, attempt, granted_at, owner);
``owner`` is the node id of the job's owner, ``''`` for a job owned here."""
RELEASE_GRANTS = "DELETE FROM grants WHERE owner = ? AND job_id = ? AND attempt = ?"
"""Release the devices of one attempt: (owner, job_id, attempt); ``owner`` ``''`` for a job owned here."""
_JOB_OWNERS = ("SELECT owner FROM remote_runs WHERE job_id = ? UNION SELECT '' FROM jobs WHERE id = ? "
               "UNION SELECT owner FROM grants WHERE job_id = ?")
_JOB_CLAIMS = ("SELECT owner, attempt FROM remote_runs WHERE job_id = ? UNION ALL SELECT '', NULL FROM jobs "
               "WHERE id = ? UNION ALL SELECT owner, NULL FROM grants WHERE job_id = ?")
_HELD_USER = ("SELECT json_extract(spec_json, '$.user') FROM remote_runs WHERE job_id = ? "
              "ORDER BY attempt DESC LIMIT 1")
_GRANTS = f"SELECT {_GRANT_COLUMNS} FROM grants ORDER BY device_index, device_uuid"


class RunsTable:
    """Device grants and the attempts this daemon runs, as worker, for other owners."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db
        # job -> {(owner, attempt)} of every stored remote run: read once, then kept exact here (this
        # table is the only writer of remote_runs, whose rows are never deleted); ~100 bytes a run.
        self._runs_of: dict[str, set[tuple[str, int]]] | None = None

    async def stored_runs(self, job_id: str) -> frozenset[tuple[str, int]]:
        """(owner, attempt) of every run of job ``job_id`` stored here for another owner (a gang
        member's run of a job owned here has this node as owner). From memory after the first call
        (one read of the whole table): the peer role checks ask it for every log or kill."""
        if self._runs_of is None:
            index: dict[str, set[tuple[str, int]]] = {}
            for owner, job, attempt in await self._db.fetch_all("SELECT owner, job_id, attempt FROM remote_runs", ()):
                index.setdefault(str(job), set()).add((str(owner), int(attempt)))
            if self._runs_of is None:
                self._runs_of = index
        return frozenset(self._runs_of.get(job_id, ()))

    async def grants(self) -> list[GrantRow]:
        """Every device currently granted, by device index."""
        return [GrantRow(*r) for r in await self._db.fetch_all(_GRANTS, ())]

    async def job_owners(self, job_id: str) -> set[str]:
        """Every owner this worker has a stored run or grant of job ``job_id`` for; ``''`` when the
        job is owned here. A job id belongs to one owner on a worker: a second is refused."""
        return {str(r[0]) for r in await self._db.fetch_all(_JOB_OWNERS, (job_id, job_id, job_id))}

    async def job_claims(self, job_id: str) -> list[tuple[str, int | None]]:
        """What this worker keeps of job ``job_id``, in one read: (owner, attempt) of each stored run,
        (owner, None) of each device grant, and ``("", None)`` when the job is owned here."""
        return [(str(r[0]), r[1]) for r in await self._db.fetch_all(_JOB_CLAIMS, (job_id, job_id, job_id))]

    async def held_user(self, job_id: str) -> str | None:
        """The user of the latest run of job ``job_id`` held here for another owner ("" when its spec
        names none); None when no run of it is held here."""
        rows = await self._db.fetch_all(_HELD_USER, (job_id,))
        if not rows:
            return None
        return str(rows[0][0] or "")

    async def insert_remote_run(self, row: RemoteRunRow, grants: Sequence[tuple[str, int, str]],
                                now_wall: float, node_id: str = "") -> bool:
        """Record an attempt granted to us by another owner, with its device grants, atomically.

        Args:
            grants: (device_uuid, device_index, accelerator) of every device granted.
            node_id: this daemon's node id (a gang member's run of a job owned here has it as owner; a run
                of a job owned here is recorded without an ``fsync``: its owner's records say the same,
                :meth:`Database.run` ``durable``).

        Returns:
            False, writing nothing, if a device is already granted, the attempt is known, or the
            job id is known here under another owner (or is a job owned here): a job id names
            one owner's job on a worker, so its run directory and logs are that owner's alone.
        """
        uuids = [uuid for uuid, _i, _a in grants]

        def insert(db: sqlite3.Connection) -> None:
            if uuids and db.execute(SELECT_GRANTED, (json.dumps(uuids),)).fetchall():
                raise Rollback
            if db.execute("SELECT 1 FROM remote_runs WHERE owner = ? AND job_id = ? AND attempt = ?",
                          (row.owner, row.job_id, row.attempt)).fetchall():
                raise Rollback
            owners = {str(r[0]) for r in db.execute(_JOB_OWNERS, (row.job_id, row.job_id, row.job_id)).fetchall()}
            if owners - {row.owner, "" if row.owner == node_id else row.owner}:
                raise Rollback
            db.execute(
                "INSERT INTO remote_runs (owner, job_id, attempt, spec_json, placement_json, lease_s, "
                "run_dir, state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (row.owner, row.job_id, row.attempt, row.spec_json, row.placement_json, row.lease_s,
                 row.run_dir, row.state, row.started_at))
            db.executemany(INSERT_GRANT,
                           [(u, i, a, row.job_id, row.attempt, now_wall, row.owner) for u, i, a in grants])

        try:
            await self._db.run(insert, durable=row.owner != node_id or not node_id)  # one hop to the store's thread
        except Rollback:
            return False
        if self._runs_of is not None:
            self._runs_of.setdefault(row.job_id, set()).add((row.owner, row.attempt))
        return True

    async def end_remote_run(self, owner: str, job_id: str, attempt: int, state: str, exit_code: int | None,
                             reason: str, now_wall: float, *, node_id: str = "") -> None:
        """Record how a remote attempt ended and release its devices (idempotent). ``node_id``: this daemon's,
        as for :meth:`insert_remote_run` (the end of a job owned here is recorded without an ``fsync``)."""

        def end(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE remote_runs SET state = ?, exit_code = ?, reason = ?, ended_at = ? "
                "WHERE owner = ? AND job_id = ? AND attempt = ? "
                "AND state NOT IN ('exited', 'lost', 'timeout', 'preflight-failed')",
                (state, exit_code, reason, now_wall, owner, job_id, attempt))
            db.execute(RELEASE_GRANTS, (owner, job_id, attempt))

        await self._db.run(end, durable=owner != node_id or not node_id)  # one hop to the store's thread

    async def mark_remote_reported_many(self, acked: Sequence[tuple[str, str, int]]) -> None:
        """The owners acknowledged the ends of these (owner, job, attempt), in one transaction."""
        rows = list(acked)

        def mark(db: sqlite3.Connection) -> None:
            db.executemany("UPDATE remote_runs SET reported = 1 WHERE owner = ? AND job_id = ? AND attempt = ?", rows)

        await self._db.run(mark)  # one hop to the store's thread

    async def remote_runs(self, *, active: bool | None = None, unreported: bool = False) -> list[RemoteRunRow]:
        """Remote attempts: ``active`` True for running ones, False for ended ones."""
        where: list[str] = []
        params: list[object] = []
        if active is True:
            where.append("state = 'running'")
        elif active is False:
            where.append("state IN ('exited', 'lost', 'timeout', 'preflight-failed')")
        if unreported:
            where.append("reported = 0")
        sql = _SELECT_RUNS
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._db.fetch_all(sql + " ORDER BY started_at", params)
        return [_run_row(r) for r in rows]

    async def remote_run(self, owner: str, job_id: str, attempt: int) -> RemoteRunRow | None:
        """One remote attempt, or None if unknown."""
        rows = await self._db.fetch_all(_SELECT_RUNS + " WHERE owner = ? AND job_id = ? AND attempt = ?",
                                        (owner, job_id, attempt))
        return _run_row(rows[0]) if rows else None


_SELECT_RUNS = ("SELECT owner, job_id, attempt, spec_json, placement_json, lease_s, run_dir, state, exit_code, "
                "reason, reported, started_at, ended_at FROM remote_runs")


def _run_row(r: Sequence[Any]) -> RemoteRunRow:
    return RemoteRunRow(owner=r[0], job_id=r[1], attempt=r[2], spec_json=r[3], placement_json=r[4], lease_s=r[5],
                        run_dir=r[6], state=r[7], exit_code=r[8], reason=r[9], reported=bool(r[10]),
                        started_at=r[11], ended_at=r[12])
