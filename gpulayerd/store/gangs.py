"""The ``gangs`` table: the owner's durable view of each multi-host job's current attempt.

One row per job, overwritten by each new attempt and on every change of the attempt's
durable state (members in rank order, the hold, the lease, who started, exits, losses,
the first failure, whether the rest were killed, the verdict), so that an owner
restarted mid-attempt can still abort the gang on a lost member. Renewal times are not
kept: a restarted owner counts every lease as renewed at its restart.
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass, fields

from gpulayerd.core.protocol import gang as core
from gpulayerd.core.protocol.gang import GangAttempt
from gpulayerd.store.db import Database

__all__ = ["GangRow", "GangsTable", "gang_from_row", "gang_to_row"]


@dataclass(frozen=True, slots=True)
class GangRow:
    """One row of ``gangs`` (fields named after the columns).

    Attributes:
        members_json: JSON list of node ids in rank order.
        master: rank 0's ``address:port``.
        started_json: JSON list of the members that reported their start.
        exits_json: JSON object: member -> {"code", "reason", "killed"}.
        lost_json: JSON object: member -> reason.
        first_failure_json: JSON {"member", "code", "reason"} of the first non-zero exit, or None.
        killed: the rest of the gang was told to stop.
        verdict_json: JSON {"status", "reason", "member", "exit_code"} once the attempt ended, or None.
        updated_at: wall-clock seconds of the last write.
    """

    job_id: str
    attempt: int
    hold_id: str
    members_json: str
    master: str
    lease_s: float
    grace_s: float
    started_json: str
    exits_json: str
    lost_json: str
    first_failure_json: str | None
    killed: bool
    verdict_json: str | None
    updated_at: float


_COLUMNS = ", ".join(f.name for f in fields(GangRow))
_UPSERT = (f"INSERT INTO gangs ({_COLUMNS}) VALUES ({', '.join('?' * len(fields(GangRow)))}) "
           "ON CONFLICT(job_id) DO UPDATE SET "
           + ", ".join(f"{f.name} = excluded.{f.name}" for f in fields(GangRow) if f.name != "job_id"))


_KILLED = [f.name for f in fields(GangRow)].index("killed")


def _row(r: tuple[object, ...]) -> GangRow:
    values = list(r)
    values[_KILLED] = bool(values[_KILLED])  # SQLite keeps booleans as 0/1
    return GangRow(*values)  # type: ignore[arg-type]


class GangsTable:
    """The gang attempts of the jobs this daemon owns."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    async def save(self, row: GangRow) -> None:
        """Write the job's gang attempt (replacing the row of its earlier attempt, if any)."""
        await self._db.write_one(_UPSERT, astuple(row))

    async def get(self, job_id: str) -> GangRow | None:
        """The job's latest gang attempt, or None."""
        rows = await self._db.fetch_all(f"SELECT {_COLUMNS} FROM gangs WHERE job_id = ?", (job_id,))
        return _row(tuple(rows[0])) if rows else None

    async def unfinished(self) -> list[GangRow]:
        """Every gang attempt with no verdict stored, by job id."""
        rows = await self._db.fetch_all(
            f"SELECT {_COLUMNS} FROM gangs WHERE verdict_json IS NULL ORDER BY job_id", ())
        return [_row(tuple(r)) for r in rows]

    async def all(self) -> list[GangRow]:
        """Every stored gang attempt, by job id."""
        rows = await self._db.fetch_all(f"SELECT {_COLUMNS} FROM gangs ORDER BY job_id", ())
        return [_row(tuple(r)) for r in rows]

    async def delete(self, job_id: str) -> None:
        """Forget the job's gang attempt."""
        await self._db.write_one("DELETE FROM gangs WHERE job_id = ?", (job_id,))


def gang_to_row(g: GangAttempt, now_wall: float) -> GangRow:
    """The store row of a gang attempt (its durable state) written at ``now_wall``."""
    ff = g.first_failure
    v = g.verdict
    return GangRow(
        job_id=g.job_id, attempt=g.attempt, hold_id=g.hold_id, members_json=json.dumps(list(g.members)),
        master=g.master, lease_s=g.lease_s, grace_s=g.grace_s, started_json=json.dumps(sorted(g.started)),
        exits_json=json.dumps({m: {"code": e.code, "reason": e.reason, "killed": e.killed}
                               for m, e in sorted(g.exits.items())}),
        lost_json=json.dumps({m: loss.reason for m, loss in sorted(g.lost.items())}),
        first_failure_json=None if ff is None else json.dumps(
            {"member": ff.member, "code": ff.code, "reason": ff.reason}),
        killed=g.killed,
        verdict_json=None if v is None else json.dumps(
            {"status": v.status, "reason": v.reason, "member": v.member, "exit_code": v.exit_code}),
        updated_at=now_wall)


def gang_from_row(r: GangRow) -> GangAttempt:
    """A gang attempt from its store row (times are 0: see :func:`gpulayerd.core.protocol.gang.recovered`)."""
    members = tuple(json.loads(r.members_json))
    ff = json.loads(r.first_failure_json) if r.first_failure_json else None
    v = json.loads(r.verdict_json) if r.verdict_json else None
    return GangAttempt(
        job_id=r.job_id, attempt=r.attempt, hold_id=r.hold_id, members=members, master=r.master,
        lease_s=r.lease_s, grace_s=r.grace_s, renewed_at={m: 0.0 for m in members},
        started=frozenset(json.loads(r.started_json)),
        exits={m: core.Exit(e["code"], 0.0, e["reason"], e["killed"]) for m, e in json.loads(r.exits_json).items()},
        lost={m: core.Loss(0.0, reason) for m, reason in json.loads(r.lost_json).items()},
        first_failure=None if ff is None else core.Failure(ff["member"], ff["code"], 0.0, ff["reason"]),
        killed=r.killed,
        verdict=None if v is None else core.Verdict(v["status"], v["reason"], v["member"], v["exit_code"]))
