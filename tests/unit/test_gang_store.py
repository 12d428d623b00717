"""The owner's ``gangs`` table and the codec of a gang attempt's durable state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpulayerd.core.protocol import gang
from gpulayerd.core.protocol.gang import Exit, Failure, GangAttempt, Loss, Verdict
from gpulayerd.store import SCHEMA_VERSION, Store
from gpulayerd.store.gangs import gang_from_row, gang_to_row


def running() -> GangAttempt:
    return GangAttempt(
        job_id="j1", attempt=2, hold_id="00ff", members=("a", "b", "c"), master="10.0.0.1:29500", lease_s=4.0,
        grace_s=2.0, renewed_at={"a": 0.0, "b": 0.0, "c": 0.0}, started=frozenset({"a", "c"}),
        exits={"b": Exit(3, 0.0, "Traceback", killed=False), "c": Exit(-15, 0.0, "", killed=True)},
        lost={}, first_failure=Failure("b", 3, 0.0, "Traceback"), killed=True)


@pytest.mark.asyncio
async def test_a_gang_attempt_round_trips_through_the_store(store: Store) -> None:
    assert SCHEMA_VERSION >= 3
    g = running()
    await store.gangs.save(gang_to_row(g, 1000.0))
    row = await store.gangs.get("j1")
    assert row is not None and row.killed is True and row.updated_at == 1000.0
    assert gang_from_row(row) == g
    assert [r.job_id for r in await store.gangs.unfinished()] == ["j1"]

    # Every change overwrites the job's one row; a verdict takes it out of the unfinished ones.
    v = Verdict("lost", "attempt 2 lost: a (rank 0) was lost: gone", member="a")
    ended = replace(g, lost={"a": Loss(0.0, "gone")}, verdict=v)
    await store.gangs.save(gang_to_row(ended, 1001.0))
    row = await store.gangs.get("j1")
    assert row is not None and gang_from_row(row) == ended
    assert await store.gangs.unfinished() == []
    assert [r.job_id for r in await store.gangs.all()] == ["j1"]
    await store.gangs.delete("j1")
    assert await store.gangs.get("j1") is None and await store.gangs.all() == []


@pytest.mark.asyncio
async def test_a_gang_attempt_resumes_after_a_restart_and_can_still_be_lost(store: Store) -> None:
    g = replace(running(), exits={}, first_failure=None, killed=False)
    await store.gangs.save(gang_to_row(g, 1000.0))
    row = await store.gangs.get("j1")
    assert row is not None
    resumed = gang.recovered(gang_from_row(row), 50.0)
    assert resumed.renewed_at == {"a": 50.0, "b": 50.0, "c": 50.0}
    resumed, _ = gang.handle(resumed, gang.MemberRenewed("a", 2), 53.0)
    resumed, _ = gang.handle(resumed, gang.MemberRenewed("c", 2), 53.0)
    _, actions = gang.handle(resumed, gang.LeaseTick(), 56.5)  # b silent since the restart: 6.5 s
    end = next(a for a in actions if isinstance(a, gang.EndAttempt))
    assert (end.verdict.status, end.verdict.member) == ("lost", "b")
    assert gang.KillMembers(("a", "c"), "gang abort: b was lost") in actions
