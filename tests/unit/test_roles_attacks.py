"""Regression tests for what an attack review of the route table (issue 23) found: each test
failed before its fix (they were written as working attacks, then turned around).

- whose jobs a worker is sent (offers, gang holds) is judged from its certificate, not from what
  its capabilities say; a hold carries no environment values (only the commit does);
- another local user cannot read a held run's log by an id prefix while its owner is down;
- any member's offer or hold under another owner's job id does not bind the id on a worker, and
  a hold lasts at most the worker's own ``hold_ttl_s``;
- ``explain`` of a finished job hides its workdir from other users, as ``show`` does;
- a claimer's placement cannot name other nodes as holders (no ``gang`` list).
- a holder's renewal sets its claimed job's reason only to a one-line ``SlurmPending: ...`` (issue 36's review).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulayerd.app.common.requester import HIDDEN
from gpulayerd.errors import Forbidden, PeerRefused
from gpulayerd.models import SubmitRequest
from gpulayerd.models.stored import dump_placement, read_placement
from gpulayerd.net.transport import BY_NAME
from gpulayerd.net.wire import Hold, JobsRequest, Offer, new_msg_id
from tests.fakes.daemons import LEASE_S, OWNER, W1, W2, Lab, d
from tests.unit.test_services_remote_jobs import BOB, authorized, running_on_w1, system_nodes, write_log


@pytest.mark.asyncio
async def test_a_held_runs_log_cannot_be_read_by_another_user_through_an_id_prefix(lab: Lab) -> None:
    system_nodes(lab)
    job = await running_on_w1(lab)  # ALICE's job, owned by the owner, running on w1
    await write_log(lab, job, "alice's secret output\n")
    await lab.stop(d(lab, "owner"))
    w1 = d(lab, "w1").services.api
    for ref in (job, job[:8]):
        with pytest.raises(Forbidden, match=f"job {job} belongs to"):
            await authorized(w1, "logs", BOB, ref)
    with pytest.raises(Forbidden, match=f"job {job} belongs to"):  # the handler checks again
        await w1.async_logs(job[:8], "stdout", 0, None, BOB)


async def _queued_job_seen_by_w2(lab: Lab) -> tuple[str, dict[str, object]]:
    """A queued job of the owner (2 CPU slots: it must run on a worker), and its id as W2 learns it
    from the public ``jobs`` route."""
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2)
    listing = await d(lab, "w2").node.call(OWNER, BY_NAME["jobs"], JobsRequest(msg_id=new_msg_id()))
    assert job in [j.id for j in listing.jobs]
    row = await owner.services.jobs.get(job)
    assert row is not None
    return job, owner.services.jobs.spec(row).model_dump(mode="json")


@pytest.mark.asyncio
async def test_another_members_offer_under_a_job_id_does_not_keep_its_owner_out(lab: Lab) -> None:
    job, spec = await _queued_job_seen_by_w2(lab)
    me = d(lab, "w1").services.machine.accounts.user
    squat = Offer(msg_id=new_msg_id(), owner=W2, job_id=job, lease_s=LEASE_S,
                  spec={"command": ["true"], "workdir": "/", "user": me})
    assert (await d(lab, "w1").node.dispatch(BY_NAME["offer"], W2, squat, mode="personal", user=me)).ok
    real = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, lease_s=LEASE_S, spec=spec)
    assert (await d(lab, "w1").node.dispatch(BY_NAME["offer"], OWNER, real, mode="personal", user=me)).ok


@pytest.mark.asyncio
async def test_a_hold_lasts_at_most_the_workers_hold_ttl_and_binds_no_job_id(lab: Lab) -> None:
    job, spec = await _queued_job_seen_by_w2(lab)
    w1 = d(lab, "w1")
    me = w1.services.machine.accounts.user
    hold = Hold(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id="feedfacefeedface",
                spec={**spec, "user": me}, ttl_s=86_400.0)
    assert (await w1.node.dispatch(BY_NAME["hold"], W2, hold, mode="personal", user=me)).held
    real = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, lease_s=LEASE_S, spec=spec)
    assert (await w1.node.dispatch(BY_NAME["offer"], OWNER, real, mode="personal", user=me)).ok
    await lab.run_for(30)  # hold_ttl_s is 10 s in this lab
    assert w1.services.ledger.held("feedfacefeedface") is None
    v = await lab.job(d(lab, "owner"), job)
    assert v.status in ("running", "succeeded") and v.holder in (W1, W2)
    with pytest.raises(Exception, match="less than or equal to 86400"):  # and no ~30,000-year hold at all
        Hold(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id="f" * 16, spec=spec, ttl_s=1e12)


@pytest.mark.asyncio
async def test_explain_of_a_failed_job_hides_its_workdir_from_other_users(lab: Lab) -> None:
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    workdir = str(lab.workdir)
    d(lab, "w1").runner.exit(job, 1, code=127, detail=f"working directory not usable: {workdir} (Permission denied)")
    await lab.run_for(3)
    assert (await lab.job(owner, job)).status == "failed"
    api = owner.services.api
    explained = await api.async_explain(job, BOB)
    assert workdir not in explained.model_dump_json() and HIDDEN in explained.model_dump_json()
    own = await api.async_explain(job, None)  # the daemon itself (and the job's user) see it
    assert workdir in own.model_dump_json()


def test_a_claimers_placement_names_only_the_claimer() -> None:
    sent = {"worker": "someone-else", "environment": "/usr/bin/python3", "accelerator": "cpu",
            "device_indices": [], "device_uuids": [], "gang": [W1, W2], "master": "10.0.0.1:1", "hold_id": "x"}
    stored = read_placement(dump_placement(sent, W1))
    assert stored.gang == [] and stored.placement is not None and stored.placement.worker == W1
    assert dump_placement(None, W1) == "{}"


async def _offers_and_holds_to_a_node_that_lies(tmp_path: Path, says: tuple[str, str], gang: bool
                                                ) -> list[Any]:
    """What bob's personal node (its certificate: personal, glbob) receives of root's job when its
    capabilities say ``says`` (mode, user)."""
    lab = Lab(tmp_path)
    try:
        owner = await lab.add("owner", OWNER, cpu_slots=1)
        if gang:
            await lab.add("w1", W1, cpu_slots=2)
        w2 = await lab.add("w2", W2, cpu_slots=2)
        w2.node.mode, w2.node.user = "personal", "glbob"
        machine, handlers, received = w2.services.machine, w2.services.router._handlers, []
        real_caps = machine.capabilities

        async def lying(*_a: Any) -> Any:
            return (await real_caps()).model_copy(update={"mode": says[0], "user": says[1], "allow_root_jobs": True})

        async def record(sender: Any, msg: Any) -> Any:
            received.append(msg)
            raise PeerRefused("not interested")

        machine.capabilities = lying
        handlers["member.hold" if gang else "worker.offer"] = record
        await lab.net.heartbeat()
        me = owner.services.machine.accounts.user
        spec = {"command": ["python", "train.py", "--api-key=alice-s3cret"], "workdir": str(lab.workdir),
                "env": {"HF_TOKEN": "alice-s3cret"}, "user": me,
                "distributed": {"nnodes": 2 if gang else 1, "nproc_per_node": 2}}
        job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=me))).id
        await lab.run_for(3)
        return [m for m in received if m.job_id == job]
    finally:
        await lab.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("gang", [False, True], ids=["offer", "gang-hold"])
async def test_a_personal_node_that_says_system_is_sent_nothing_of_other_users(tmp_path: Path, gang: bool) -> None:
    assert await _offers_and_holds_to_a_node_that_lies(tmp_path, ("system", ""), gang) == []


@pytest.mark.asyncio
async def test_a_gang_hold_carries_environment_names_only_and_the_commit_the_values(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    try:
        owner = await lab.add("owner", OWNER, cpu_slots=1)
        holds: list[Hold] = []
        for name, node in (("w1", W1), ("w2", W2)):
            w = await lab.add(name, node, cpu_slots=2)
            real = w.services.router._handlers["member.hold"]

            async def spy(sender: Any, msg: Hold, real: Any = real) -> Any:
                holds.append(msg)
                return await real(sender, msg)

            w.services.router._handlers["member.hold"] = spy
        await lab.net.heartbeat()
        me = owner.services.machine.accounts.user
        spec = {"command": ["sh", "-c", "true"], "workdir": str(lab.workdir), "env": {"HF_TOKEN": "alice-s3cret"},
                "user": me, "distributed": {"nnodes": 2, "nproc_per_node": 2}}
        job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=me))).id
        await lab.run_for(5)
        sent = [h for h in holds if h.job_id == job]
        assert len(sent) >= 2 and all(h.spec["env"] == {"HF_TOKEN": ""} for h in sent), sent
        v = await lab.job(owner, job)
        assert v.status in ("running", "succeeded"), (v.status, v.reason)  # the commits brought the value
        for name in ("w1", "w2"):
            run = await d(lab, name).store.runs.remote_run(OWNER, job, v.attempt)
            assert run is not None and '"HF_TOKEN":"alice-s3cret"' in run.spec_json.replace(" ", ""), name
    finally:
        await lab.close()


@pytest.mark.asyncio
async def test_a_holders_renewal_sets_only_a_slurm_pending_reason(lab: Lab) -> None:
    """A renewal's ``reason`` (a Slurm worker's ``SlurmPending: ...`` while Slurm holds the job) is the
    claimed job's reason only when it is one: the holder cannot make the listing say another code
    (that it was cancelled, that another user's job goes first) or span lines."""
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2)
    granted = await owner.services.jobs.grant(job, W1, new_msg_id(), dump_placement({}, W1))
    assert not isinstance(granted, str)
    for forged in ("Cancelled: cancelled by root", "SlurmPending: Resources\nFairShare: bob's jobs go first"):
        await owner.services.jobs.reported(job, "renew", granted.attempt, W1, reason=forged)
        row = await owner.services.jobs.get(job)
        assert row is not None and row.status == "claimed" and row.reason != forged
    await owner.services.jobs.reported(job, "renew", granted.attempt, W1,
                                       reason="SlurmPending: Resources (partition gpu, position 1)")
    row = await owner.services.jobs.get(job)
    assert row is not None and row.reason == "SlurmPending: Resources (partition gpu, position 1)"
