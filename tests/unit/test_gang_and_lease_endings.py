"""Gang and lease endings: a killed rank's late exit, a hold that expires before its commit, ranks
and remote runs stopped at their lease deadline (each once found wrong by a review).

Each runs the real services of several daemons over the loopback fakes (fake clock, no sleeps).
"""
from __future__ import annotations

import pytest

from gpulayerd.models import JobView
from tests.fakes.daemons import GRACE_S, LEASE_S, W2, W3, Lab, d, start_gang, view


def dump(v: JobView) -> str:
    return (f"status={v.status} attempt={v.attempt} exit_code={v.exit_code} retries_left={v.retries_left} "
            f"reason={v.reason!r}\n attempts={[(a.attempt, a.state, a.exit_code, a.reason) for a in v.attempts]}")


@pytest.mark.asyncio
async def test_a_killed_ranks_late_exit_never_sets_the_retried_jobs_exit_code(lab: Lab) -> None:
    """w2 cut off -> gang lost -> w1 killed (exit -15 reported after the verdict); retry succeeds."""
    await lab.add("w3", W3, cpu_slots=2)
    await lab.net.heartbeat()
    job = await start_gang(lab, retries=1)
    lab.net.fault(W2, "refuse")

    async def a2_running() -> bool:
        v = await view(lab, job)
        return v.attempt == 2 and v.status == "running"

    await lab.run_until("attempt 2 running", a2_running, limit_s=60)
    for w in lab.alive():
        if w.runner.get(job, 2) is not None and w.runner.get(job, 2).status.running:
            w.runner.exit(job, 2, 0)
    await lab.step()
    await lab.step()
    v = await view(lab, job)
    assert v.status == "succeeded"
    assert v.exit_code == 0, dump(v)


@pytest.mark.asyncio
async def test_a_hold_that_expires_before_its_commit_is_requeued_without_using_a_retry(lab: Lab) -> None:
    """The first member's hold expires while the round is still going (slow claim): commit refused."""
    owner = d(lab, "owner")
    gangs = owner.services.gangs
    jobs = gangs._jobs
    real_grant = jobs.grant

    async def slow_grant(*a: object, **k: object) -> object:  # the compare-and-set (or the holds before it) took > hold_ttl_s
        lab.clock.advance(11.0)
        for w in (d(lab, "w1"), d(lab, "w2")):
            w.services.member.expire_holds()  # what their lease ticks do meanwhile
        return await real_grant(*a, **k)

    jobs.grant = slow_grant
    job = await lab.submit(owner, nnodes=2, cpus=2, retries=0)
    for _ in range(4):
        await lab.step()
    jobs.grant = real_grant
    v = await view(lab, job)
    ran = [w.name for w in (d(lab, "w1"), d(lab, "w2")) if w.runner.get(job, 1) is not None]
    assert ran == [], ran  # no rank of attempt 1 started
    assert v.status in ("queued", "claimed", "running"), dump(v)
    assert v.retries_left == 0 and v.attempts[0].state == "lost", dump(v)


@pytest.mark.asyncio
async def test_ranks_stopped_at_their_lease_deadline_are_lost_not_failed(lab: Lab) -> None:
    """Owner down > lease_s: every rank's watchdog kills it (deadline, -15). Is that the job's failure?"""
    job = await start_gang(lab, retries=1)
    owner = d(lab, "owner")
    await lab.stop(owner)
    await lab.run_for(LEASE_S + 3)
    for w in (d(lab, "w1"), d(lab, "w2")):
        r = w.runner.get(job, 1)
        assert r is not None and (r.status.reason, r.status.exit_code) == ("deadline", -15)
    await lab.restart(owner)
    await lab.run_for(LEASE_S + GRACE_S + 3)
    v = await view(lab, job)
    assert v.status != "failed", dump(v)
    assert v.attempts[0].state == "lost" and v.retries_left == 0, dump(v)  # retries = 1 was used


@pytest.mark.asyncio
async def test_a_remote_run_stopped_at_its_lease_deadline_is_lost_not_failed(lab: Lab) -> None:
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2, retries=1)
    await lab.schedule()
    await lab.schedule()
    await lab.stop(owner)
    await lab.run_for(LEASE_S + 3)
    owner = await lab.restart(owner)
    await lab.run_for(5)
    v = await view(lab, job)
    assert v.status != "failed", dump(v)
    assert v.attempts[0].state == "lost" and v.retries_left == 0, dump(v)
