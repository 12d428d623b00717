"""Multi-host jobs (gangs) through the real services, over a loopback network, on a fake clock.

An owner with one CPU slot and workers with two: a gang of ``nnodes = 2`` hosts with two
ranks each runs on the two lowest worker node ids (w1 = rank 0, w2 = rank 1). The
expected behaviour is issue 10's: a member lost before, or within ``lease_s + lease_grace_s`` after, the
first non-zero exit makes the attempt ``lost`` (naming that member) and the job retries as
its policy says; gang state is kept in the owner's store, so a restarted owner can still
abort on a lost member.
"""

from __future__ import annotations

import pytest

from tests.fakes.daemons import GRACE_S, LEASE_S, W1, W2, W3, Lab, d, start_gang, view


@pytest.mark.asyncio
async def test_a_gang_runs_rank_0_on_the_lowest_node_id_and_succeeds_when_every_rank_exits_0(lab: Lab) -> None:
    job = await start_gang(lab)
    r1, r2 = d(lab, "w1").runner.get(job, 1), d(lab, "w2").runner.get(job, 1)
    assert r1 is not None and r2 is not None
    argv1, argv2 = " ".join(r1.argv), " ".join(r2.argv)
    assert "--node-rank 0" in argv1 or "--node_rank=0" in argv1 or "--node-rank=0" in argv1
    assert "--node-rank 1" in argv2 or "--node_rank=1" in argv2 or "--node-rank=1" in argv2
    await lab.run_for(2 * LEASE_S)  # the gang's lease is renewed by its members
    running = await view(lab, job)
    assert running.status == "running"
    assert running.reason == "running on w1+w2 (a gang of 2, rank 0 on w1)", running.reason  # not its owner
    d(lab, "w1").runner.exit(job, 1, 0)
    await lab.step()
    assert (await view(lab, job)).status == "running"
    d(lab, "w2").runner.exit(job, 1, 0)
    await lab.step()
    v = await view(lab, job)
    assert (v.status, v.exit_code) == ("succeeded", 0)


@pytest.mark.asyncio
async def test_member_loss_aborts_the_gang_on_every_member(lab: Lab) -> None:
    job = await start_gang(lab, retries=0)
    lab.net.fault(W2, "refuse")  # w2 is cut off: it stops renewing; its rank runs on until its deadline
    took = await lab.run_until("lost", lambda: _status_is(lab, job, "lost"), limit_s=3 * LEASE_S)
    assert took <= LEASE_S + GRACE_S + 2.0
    v = await view(lab, job)
    assert v.attempts[0].state == "lost"
    assert _names(v.attempts[0].reason, "w2", W2)
    r1 = d(lab, "w1").runner.get(job, 1)
    assert r1 is not None and not r1.status.running  # aborted: the healthy member's rank was stopped
    assert r1.status.reason in ("cancelled", "deadline")


@pytest.mark.asyncio
async def test_a_crashed_member_host_makes_the_attempt_lost_then_it_is_retried(lab: Lab) -> None:
    """The measured LAN case: a 2-host job whose member host crashes, ``retries = 1``."""
    await lab.add("w3", W3, cpu_slots=2)  # room for attempt 2 once w2 is gone
    await lab.net.heartbeat()
    job = await start_gang(lab, retries=1)
    assert {v for v in (await view(lab, job)).attempts[0].model_dump().get("gang", [])} <= {W1, W2}

    await lab.crash_host(d(lab, "w2"))  # daemon, watchdog and job killed; connections reset
    await lab.step()
    d(lab, "w1").runner.exit(job, 1, 1)  # the healthy rank's collective fails: exit 1
    await lab.step()

    async def attempt_1_over() -> bool:
        v = await view(lab, job)
        return v.attempt >= 2 or v.status in ("failed", "lost", "succeeded")

    await lab.run_until("attempt 1 ended", attempt_1_over, limit_s=3 * LEASE_S)
    v = await view(lab, job)
    a1 = v.attempts[0]
    assert a1.state == "lost", (a1.state, a1.reason, v.status, v.reason)
    assert W2 in (a1.reason or "") or "w2" in (a1.reason or "")  # the dead member is named
    assert v.status != "failed"
    assert v.retries_left == 0

    async def attempt_2_running() -> bool:
        x = await view(lab, job)
        return x.attempt == 2 and x.status == "running"

    await lab.run_until("attempt 2 running", attempt_2_running, limit_s=30)
    ranks = [w for w in (d(lab, "w1"), d(lab, "w3")) if w.runner.get(job, 2) is not None]
    assert [w.name for w in ranks] == ["w1", "w3"]
    for w in ranks:
        w.runner.exit(job, 2, 0)
    await lab.step()
    v = await view(lab, job)
    assert (v.status, v.exit_code) == ("succeeded", 0)
    assert [a.state for a in v.attempts] == ["lost", "exited"]


@pytest.mark.asyncio
async def test_owner_restart_during_a_gang_then_both_ranks_exit_0(lab: Lab) -> None:
    job = await start_gang(lab)
    await lab.restart(d(lab, "owner"))
    await lab.run_for(2 * LEASE_S)
    assert (await view(lab, job)).status == "running"
    d(lab, "w1").runner.exit(job, 1, 0)
    d(lab, "w2").runner.exit(job, 1, 0)
    await lab.step()
    await lab.step()
    v = await view(lab, job)
    assert (v.status, v.exit_code) == ("succeeded", 0)


@pytest.mark.asyncio
async def test_owner_restart_during_a_gang_can_still_abort_on_a_lost_member(lab: Lab) -> None:
    job = await start_gang(lab)
    await lab.restart(d(lab, "owner"))
    await lab.step()
    lab.net.fault(W2, "refuse")  # after the restart, w2 stops renewing
    await lab.run_until("lost", lambda: _status_is(lab, job, "lost"), limit_s=3 * LEASE_S)
    v = await view(lab, job)
    assert v.attempts[0].state == "lost"
    assert _names(v.attempts[0].reason, "w2", W2)
    r1 = d(lab, "w1").runner.get(job, 1)
    assert r1 is not None and not r1.status.running


async def _status_is(lab: Lab, job_id: str, wanted: str) -> bool:
    return (await view(lab, job_id)).status == wanted


def _names(reason: str | None, name: str, node_id: str) -> bool:
    """The reason names the member (by host name or node id)."""
    return reason is not None and (name in reason or node_id in reason)


@pytest.mark.asyncio
async def test_logs_of_each_rank_come_from_the_member_that_ran_it_and_where_names_the_hosts(lab: Lab) -> None:
    import asyncio

    from gpulayerd.errors import BadRequest

    job = await start_gang(lab)
    for name, text in (("w1", "rank 0 says\n"), ("w2", "rank 1 says\n")):
        run_dir = d(lab, name).config.runs_dir / job / "1"
        await asyncio.to_thread(lambda p=run_dir, t=text: (p.mkdir(parents=True, exist_ok=True),
                                                            (p / "stdout.log").write_text(t)))
    owner = d(lab, "owner").owner
    got = [(await owner.logs(job, "stdout", 0, None, rank=r)).data for r in (0, 1)]
    assert got == ["rank 0 says\n", "rank 1 says\n"]
    chunk = await owner.logs(job, "stdout", 0, None, rank=1)
    assert chunk.size == len("rank 1 says\n")
    with pytest.raises(BadRequest, match="ranks 0 to 1"):
        await owner.logs(job, "stdout", 0, None, rank=2)
    d(lab, "w1").runner.exit(job, 1, 0)
    d(lab, "w2").runner.exit(job, 1, 0)
    await lab.step()
    (listed,) = [j for j in await owner.list_jobs(None, None) if j.id == job]
    assert listed.status == "succeeded"
    assert (listed.where_node, listed.where_devices) == (d(lab, "owner").node_id, [])
    assert listed.where_hosts == (await view(lab, job)).where_hosts == ["w1", "w2"]  # by node rank


@pytest.mark.asyncio
async def test_a_gang_is_never_formed_across_torch_versions_and_forms_on_hosts_that_agree(lab: Lab) -> None:
    """Issue 27: w1 has torch 2.4.0, w2 2.12.0; a 2-host job waits with GangSkew naming both, then runs
    on w1 and w3 (torch 2.4.0) once w3 joins; w2 is never a member."""
    from tests.fakes.daemons import caps_for

    caps = caps_for(W2, "w2", lab.clock.wall())
    caps.environments[0].frameworks["torch"] = caps.environments[0].frameworks["torch"].model_copy(
        update={"version": "2.12.0"})
    d(lab, "w2").services.machine.use_capabilities(caps)
    await lab.net.heartbeat()
    job = await lab.submit(d(lab, "owner"), nnodes=2, cpus=2)
    await lab.run_for(3.0)
    v = await view(lab, job)
    assert v.status == "queued"
    assert (v.reason or "").startswith("GangSkew: torch 2.12.0 on w2, 2.4.0 on w1"), v.reason

    await lab.add("w3", W3, cpu_slots=2)
    await lab.net.heartbeat()

    async def running() -> bool:
        return (await view(lab, job)).status == "running"

    await lab.run_until("running on w1 and w3", running, limit_s=30)
    assert d(lab, "w1").runner.get(job, 1) is not None and d(lab, "w3").runner.get(job, 1) is not None
    assert d(lab, "w2").runner.get(job, 1) is None
