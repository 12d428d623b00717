"""Attacks on the one claim path (issue 26): a job owned here runs through OFFER, CLAIM, REPORT and
KILL to this node itself, through the self-first transport. A peer without the role is refused and
changes nothing; a restart in each window of a start runs the job once; a full disk at either end
loses no exit and runs nothing twice (found by an attack review: a handler's StoreFull once escaped
the self-first transport and left the exit report unsent for good).

Over the loopback lab (tests/fakes/daemons.py): real services, fake clock and runner.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpulayerd.models import SubmitRequest
from gpulayerd.store import StoreFull
from tests.fakes.daemons import OWNER, Lab, d, view
from tests.unit.test_services_remote_jobs import ME


async def _own_running(lab: Lab, retries: int) -> str:
    owner = d(lab, "owner")
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "user": ME,
            "policy": {"retries": retries, "lease_s": 10.0}}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=ME))).id
    await lab.settle()

    async def running_here() -> bool:
        v = await view(lab, job)
        return v.status == "running" and v.holder == OWNER

    await lab.run_until("running on the owner", running_here, limit_s=20)
    return job


@pytest.mark.asyncio
async def test_a_full_disk_at_the_owners_end_write_keeps_the_exit_of_a_job_run_here(lab: Lab) -> None:
    """The job owned here exits 0 while the disk is full for the owner's job write (the worker's own
    run-row write went through). The exited report to this node fails like a peer's 5xx (the
    self-first transport turns the handler's StoreFull into a failed call), stays owed and is sent
    again in the next round: once the disk has room the job succeeds, attempt 1 exited 0, and it
    never runs again (before the fix the report was never sent again and a retry ran it twice)."""
    owner = d(lab, "owner")
    job = await _own_running(lab, retries=1)

    jobs_table: Any = owner.store.jobs
    real = jobs_table.end_attempt
    full = {"on": True, "hits": 0}

    async def end_attempt(*a: Any, **k: Any) -> Any:
        if full["on"]:
            full["hits"] += 1
            raise StoreFull("database or disk is full")
        return await real(*a, **k)

    jobs_table.end_attempt = end_attempt
    owner.runner.exit(job, 1, 0)
    await lab.step()
    assert full["hits"] >= 1  # the owner's write of the exit was refused once
    full["on"] = False  # room again on the disk
    await lab.run_for(40)
    v = await view(lab, job)
    attempts = [(a.attempt, a.state, a.exit_code) for a in (await lab.job(owner, job)).attempts or []]
    assert (v.status, attempts[:1]) == ("succeeded", [(1, "exited", 0)]), (v.status, v.reason, attempts)


@pytest.mark.asyncio
async def test_a_peer_cannot_claim_report_kill_or_read_logs_of_a_job_its_owner_runs_itself(lab: Lab) -> None:
    """A valid member (w1) without the role, against a job the owner offered and runs itself."""
    from gpulayerd.errors import PeerRefused
    from gpulayerd.net.transport import CLAIM, KILL, LOGS, OFFER, REPORT
    from gpulayerd.net.wire import Claim, Kill, LogRequest, Offer, RunReport, new_msg_id
    from tests.fakes.daemons import W1

    owner, w1 = d(lab, "owner"), d(lab, "w1")
    # 1. an offer only to the owner's own node stands: w1 claims it
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "user": ME,
            "policy": {"retries": 1, "lease_s": 10.0}}
    machine = owner.services.machine
    caps = await machine.capabilities()
    machine.use_capabilities(caps.model_copy(update={"environments": []}))  # nobody claims it meanwhile
    w1.services.machine.use_capabilities((await w1.services.machine.capabilities()).model_copy(
        update={"environments": []}))
    d(lab, "w2").services.machine.use_capabilities((await d(lab, "w2").services.machine.capabilities()).model_copy(
        update={"environments": []}))
    await lab.schedule()
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=ME))).id
    await lab.settle()
    jobs = owner.services.jobs if hasattr(owner.services, "jobs") else owner.owner._jobs
    jobs.make_offer(job, await jobs.spec_of(job), OWNER)
    with pytest.raises(PeerRefused):
        await w1.node.call(OWNER, CLAIM, Claim(msg_id=new_msg_id(), worker=W1, job_id=job, placement={}))
    assert (await view(lab, job)).status == "queued"
    # 2. it runs on the owner: w1 reports on it, kills it, reads its logs, offers its id back
    machine.use_capabilities(caps)
    await lab.schedule()
    w1.services.machine.use_capabilities((await w1.services.machine.capabilities()).model_copy(
        update={"environments": caps.environments}))

    async def running_here() -> bool:
        v = await view(lab, job)
        return v.status == "running" and v.holder == OWNER

    await lab.run_until("running on the owner", running_here, limit_s=20)
    for kind in ("renew", "exited", "lost", "started"):
        r = await w1.node.call(OWNER, REPORT, RunReport(msg_id=new_msg_id(), worker=W1, job_id=job, attempt=1,
                                                        kind=kind, exit_code=0, reason="forged"))
        assert r.stale and not r.ok
    with pytest.raises(PeerRefused):
        await w1.node.call(OWNER, KILL, Kill(msg_id=new_msg_id(), owner=W1, job_id=job, attempt=1, reason="x"))
    with pytest.raises(PeerRefused):
        await w1.node.call(OWNER, LOGS, LogRequest(job_id=job, attempt=1, stream="stdout", offset=0))
    with pytest.raises(PeerRefused):
        await w1.node.call(OWNER, OFFER, Offer(msg_id=new_msg_id(), owner=W1, job_id=job,
                                               spec={**spec, "policy": {"retries": 0}}, lease_s=10.0))
    await lab.run_for(3)
    assert owner.runner.running() == [(job, 1)]
    v = await view(lab, job)
    assert (v.status, v.attempt) == ("running", 1)


@pytest.mark.asyncio
@pytest.mark.parametrize("window", ["before-run-row", "before-watchdog", "before-started", "before-exited",
                                    "ack-not-stored"])
async def test_a_kill_in_each_window_of_a_job_run_here_runs_it_once_and_ends_it(lab: Lab, window: str) -> None:
    """kill -9 of the owner daemon (its runs live on under their watchdogs) at each step of a job it
    runs itself; after the restart the job runs exactly once more at most, never beside itself, and ends."""
    owner = d(lab, "owner")
    worker: Any = owner.services.worker
    forever = lambda: lab.clock.sleep(10**9)  # noqa: E731

    if window == "before-run-row":
        runs: Any = owner.store.runs
        async def hang_insert(*a: Any, **k: Any) -> bool:
            await forever()
            return False
        runs.insert_remote_run = hang_insert
    elif window == "before-watchdog":
        starter: Any = worker._starter
        async def hang_start(*a: Any, recorded: Any = None, **k: Any) -> Any:
            if recorded is not None:
                assert await recorded  # its run row is written (while the start prepares), then no watchdog
            await forever()
        starter.start = hang_start
    else:
        real_report = worker.report
        hang_kind = {"before-started": "started", "before-exited": "exited"}.get(window)
        async def report(owner_id: str, key: Any, kind: str, *a: Any, **k: Any) -> Any:
            if kind == hang_kind:
                await forever()
            return await real_report(owner_id, key, kind, *a, **k)
        worker.report = report

    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "user": ME,
            "policy": {"retries": 1, "lease_s": 10.0}}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=ME))).id
    await lab.settle()
    await lab.run_for(3)
    before = (await view(lab, job)).status, owner.runner.running()
    if window in ("before-run-row", "before-watchdog"):
        assert before == ("claimed", []), before
    elif window == "before-started":
        assert before == ("claimed", [(job, 1)]), before
    else:
        assert before == ("running", [(job, 1)]), before
    ever_ran: set[tuple[str, int]] = set(owner.runner.running())
    if window in ("before-exited", "ack-not-stored"):
        assert owner.runner.running() == [(job, 1)]
        owner.runner.exit(job, 1, 0)
        await lab.settle()
        if window == "ack-not-stored":
            await lab.settle()
            assert worker._acked, "the end report was acknowledged and its ack waits for the tick"
            worker._acked.clear()  # kill -9 before the tick stores it
    ever_ran.update(owner.runner.running())
    runner = owner.runner
    await lab.stop(owner)  # kill -9: services gone, watchdogs (fake runs) live on
    owner = await lab.restart(owner)

    async def ended() -> bool:
        ever_ran.update(runner.running())
        assert len(runner.running()) <= 1, runner.running()
        return (await view(lab, job)).status in ("succeeded", "failed", "lost", "cancelled")

    for _ in range(40):
        ever_ran.update(runner.running())
        for key in runner.running():
            runner.exit(*key, 0)
        if await ended():
            break
        await lab.step()
    v = await lab.job(owner, job)
    attempts = [(a.attempt, a.state, a.exit_code) for a in v.attempts or []]
    assert v.status == "succeeded", (v.status, v.reason, attempts)
    assert len(ever_ran) == 1, (ever_ran, attempts)  # ran once (counting only attempts that had processes)


@pytest.mark.slow  # (~1.3 s on a loaded 2-core machine)
@pytest.mark.asyncio
async def test_a_full_disk_at_the_workers_end_and_ack_writes_keeps_the_lease_and_records_the_end(lab: Lab) -> None:
    """The worker side cannot store the run's end (end_remote_run) nor the acks for a while: its owner
    is told of the exit at once (the job succeeded, once), the worker's end is recorded once there is
    room, and every end report ends up acknowledged in the store."""
    owner = d(lab, "owner")
    job = await _own_running(lab, retries=1)
    runs: Any = owner.store.runs
    real_end, real_acks = runs.end_remote_run, runs.mark_remote_reported_many
    full = {"on": True, "end": 0, "acks": 0}

    async def end_remote_run(*a: Any, **k: Any) -> Any:
        if full["on"]:
            full["end"] += 1
            raise StoreFull("database or disk is full")
        return await real_end(*a, **k)

    async def acks(*a: Any, **k: Any) -> Any:
        if full["on"] or full["acks"] < 3:
            full["acks"] += 1
            raise StoreFull("database or disk is full")
        return await real_acks(*a, **k)

    runs.end_remote_run, runs.mark_remote_reported_many = end_remote_run, acks
    owner.runner.exit(job, 1, 0)
    await lab.run_for(30)  # three leases
    assert full["end"] >= 3
    assert (await view(lab, job)).status == "succeeded"
    run = await owner.store.runs.remote_run(OWNER, job, 1)
    assert run is not None and run.state == "running"  # its end not recorded here yet
    full["on"] = False
    await lab.run_for(10)
    v = await view(lab, job)
    assert v.status == "succeeded", (v.status, v.reason)
    assert [a.attempt for a in (await lab.job(owner, job)).attempts or []] == [1]
    assert full["acks"] >= 3
    run = await owner.store.runs.remote_run(OWNER, job, 1)
    assert run is not None and run.state == "exited"
    assert [r.job_id for r in await owner.store.runs.remote_runs(active=False, unreported=True)] == []
