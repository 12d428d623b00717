"""The ``grants`` and ``remote_runs`` tables: devices this daemon granted, runs it does for others."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpulayerd.store.db import Database, Rollback
from gpulayerd.store.rows import GrantRow, RemoteRunRow

__all__ = ["INSERT_GRANT", "SELECT_GRANTED", "RunsTable"]

_GRANT_COLUMNS = "device_uuid, device_index, accelerator, job_id, attempt, granted_at"
SELECT_GRANTED = "SELECT device_uuid FROM grants WHERE device_uuid IN (SELECT value FROM json_each(?))"
"""The device uuids, of a JSON list of them (the one parameter), that are granted already."""
INSERT_GRANT = f"INSERT INTO grants ({_GRANT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
"""Insert one ``grants`` row: (device_uuid, device_index, accelerator, job_id, attempt, granted_at)."""
_GRANTS = f"SELECT {_GRANT_COLUMNS} FROM grants ORDER BY device_index, device_uuid"


class RunsTable:
    """Device grants and the attempts this daemon runs, as worker, for other owners."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    async def grants(self) -> list[GrantRow]:
        """Every device currently granted, by device index."""
        return [GrantRow(*r) for r in await self._db.fetch_all(_GRANTS, ())]

    async def insert_remote_run(self, row: RemoteRunRow, grants: Sequence[tuple[str, int, str]],
                                now_wall: float) -> bool:
        """Record an attempt granted to us by another owner, with its device grants, atomically.

        Args:
            grants: (device_uuid, device_index, accelerator) of every device granted.

        Returns:
            False, writing nothing, if a device is already granted or the attempt is known.
        """
        uuids = [uuid for uuid, _i, _a in grants]
        try:
            async with self._db.transaction() as db:
                if uuids and await db.execute_fetchall(SELECT_GRANTED, (json.dumps(uuids),)):
                    raise Rollback
                known = await db.execute_fetchall(
                    "SELECT 1 FROM remote_runs WHERE owner = ? AND job_id = ? AND attempt = ?",
                    (row.owner, row.job_id, row.attempt))
                if known:
                    raise Rollback
                await db.execute(
                    "INSERT INTO remote_runs (owner, job_id, attempt, spec_json, placement_json, lease_s, "
                    "run_dir, state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (row.owner, row.job_id, row.attempt, row.spec_json, row.placement_json, row.lease_s,
                     row.run_dir, row.state, row.started_at))
                await db.executemany(
                    INSERT_GRANT, [(u, i, a, row.job_id, row.attempt, now_wall) for u, i, a in grants])
        except Rollback:
            return False
        return True

    async def end_remote_run(self, owner: str, job_id: str, attempt: int, state: str, exit_code: int | None,
                             reason: str, now_wall: float) -> None:
        """Record how a remote attempt ended and release its devices (idempotent)."""
        async with self._db.transaction() as db:
            await db.execute(
                "UPDATE remote_runs SET state = ?, exit_code = ?, reason = ?, ended_at = ? "
                "WHERE owner = ? AND job_id = ? AND attempt = ? AND state NOT IN ('exited', 'lost')",
                (state, exit_code, reason, now_wall, owner, job_id, attempt))
            await db.execute("DELETE FROM grants WHERE job_id = ? AND attempt = ?", (job_id, attempt))

    async def mark_remote_reported(self, owner: str, job_id: str, attempt: int) -> None:
        """The owner acknowledged the end of this attempt."""
        await self._db.write_one(
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
        rows = await self._db.fetch_all(sql + " ORDER BY started_at", params)
        return [
            RemoteRunRow(owner=r[0], job_id=r[1], attempt=r[2], spec_json=r[3], placement_json=r[4], lease_s=r[5],
                         run_dir=r[6], state=r[7], exit_code=r[8], reason=r[9], reported=bool(r[10]),
                         started_at=r[11], ended_at=r[12])
            for r in rows
        ]

    async def remote_run(self, owner: str, job_id: str, attempt: int) -> RemoteRunRow | None:
        """One remote attempt, or None if unknown."""
        for r in await self.remote_runs():
            if (r.owner, r.job_id, r.attempt) == (owner, job_id, attempt):
                return r
        return None
