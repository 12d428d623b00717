"""Authorization by role on the peer routes (issue 12), through the real services over the loopback network.

Every member here is a valid member of the cluster (the loopback's ``sender`` is what the
TLS certificate proves): w2 does not hold the job that runs on w1 for the owner, and
tries to end, renew, lose, kill, read or hijack it anyway. Nothing may change: the job
keeps running, no attempt row moves, the real run is not killed, and each refusal is
counted and logged once per peer and kind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.api.peer import MAX_LOG_OFFSET, REFUSED_STAT, request_problem
from gpulayerd.app.common.requester import Requester
from gpulayerd.errors import PeerCallError
from gpulayerd.models import JobList, SubmitRequest
from gpulayerd.net.transport import COMMIT, HOLD, JOBS, KILL, LOGS, OFFER, RELEASE, REPORT, PeerRoute
from gpulayerd.net.wire import (
    Commit,
    Hold,
    JobsRequest,
    Kill,
    LogRequest,
    Offer,
    Release,
    RunReport,
    new_msg_id,
)
from tests.fakes.daemons import LEASE_S, OWNER, W1, W2, Lab, d


async def running_on_w1(lab: Lab, retries: int = 0, env: dict[str, str] | None = None) -> str:
    """A two-slot job of the owner, running on w1 (attempt 1)."""
    owner = d(lab, "owner")
    if env is None:
        job = await lab.submit(owner, cpus=2, retries=retries)
    else:
        spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "env": env, "user": "root",
                "distributed": {"nnodes": 1, "nproc_per_node": 2}, "policy": {"retries": retries, "lease_s": LEASE_S}}
        job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
        await lab.settle()
    await lab.schedule()
    await lab.schedule()
    view = await lab.job(owner, job)
    assert (view.status, view.attempt, view.holder) == ("running", 1, W1)
    return job


async def snapshot(lab: Lab, job: str) -> tuple[object, ...]:
    """What a refused message must not change: the job, its attempt rows, and w1's run."""
    view = await lab.job(d(lab, "owner"), job)
    run = d(lab, "w1").runner.get(job, 1)
    assert run is not None
    attempts = [(a.attempt, a.worker, a.state, a.exit_code, a.ended_at, a.reason) for a in view.attempts]
    return (view.status, view.attempt, view.holder, view.retries_left, view.exit_code, attempts,
            run.status.running, run.cancels)


def report(sender: str, job: str, kind: str, **kw: object) -> RunReport:
    return RunReport(msg_id=new_msg_id(), worker=sender, job_id=job, attempt=1, kind=kind, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- forged reports


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "extra"),
    [("exited", {"exit_code": 0}), ("exited", {"exit_code": 3, "reason": "boom"}), ("lost", {}),
     ("lost", {"never_started": True}), ("renew", {}), ("started", {})],
    ids=["exited-0", "exited-3", "lost", "lost-never-started", "renew", "started"],
)
async def test_a_member_that_does_not_hold_the_job_cannot_report_on_it(
    lab: Lab, kind: str, extra: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    owner, w2 = d(lab, "owner"), d(lab, "w2")
    job = await running_on_w1(lab, retries=1)
    before = await snapshot(lab, job)
    caplog.set_level(logging.DEBUG, logger="gpulayerd.app.roles")

    for _ in range(3):
        reply = await w2.node.call(OWNER, REPORT, report(W2, job, kind, **extra))
        assert (reply.ok, reply.stale, reply.current_attempt) == (False, True, 0)  # refused: it names no attempt
    await lab.settle()

    assert await snapshot(lab, job) == before
    assert owner.services.signals.stats[REFUSED_STAT] == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "refused" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per peer and route
    assert W2[:12] in warnings[0].getMessage() and "refused report" in warnings[0].getMessage()
    # No second copy ever starts, and the real holder still ends the job.
    await lab.run_for(3)
    assert d(lab, "w2").runner.running() == [] and owner.runner.running() == []
    d(lab, "w1").runner.exit(job, 1, 0)
    await lab.step()
    view = await lab.job(owner, job)
    assert (view.status, view.exit_code) == ("succeeded", 0)
    assert [(a.attempt, a.worker, a.state) for a in view.attempts] == [(1, W1, "exited")]


@pytest.mark.asyncio
async def test_a_forged_report_never_kills_a_run_on_the_owner_itself(lab: Lab) -> None:
    """The owner's stale reply used to stop the attempt running here when a peer reported on it."""
    owner, w2 = d(lab, "owner"), d(lab, "w2")
    job = await lab.submit(owner, cpus=1)
    await lab.schedule()
    view = await lab.job(owner, job)
    assert (view.status, view.holder) == ("running", OWNER)
    for kind in ("renew", "started", "exited", "lost"):
        reply = await w2.node.call(OWNER, REPORT, report(W2, job, kind))
        assert reply.stale
    await lab.settle()
    run = owner.runner.get(job, 1)
    assert run is not None and run.status.running and run.cancels == 0
    assert (await lab.job(owner, job)).status == "running"


@pytest.mark.asyncio
async def test_a_report_on_an_unknown_job_is_stale(lab: Lab) -> None:
    reply = await d(lab, "w2").node.call(OWNER, REPORT, report(W2, "0123456789ab", "exited"))
    assert (reply.ok, reply.stale) == (False, True)


# ---------------------------------------------------------------------- worker side: kill, logs


@pytest.mark.asyncio
async def test_only_the_owner_may_kill_a_run(lab: Lab) -> None:
    owner, w1, w2 = d(lab, "owner"), d(lab, "w1"), d(lab, "w2")
    job = await running_on_w1(lab)
    before = await snapshot(lab, job)
    kill = Kill(msg_id=new_msg_id(), owner=W2, job_id=job, attempt=1, reason="forged")
    with pytest.raises(PeerCallError, match="403"):
        await w2.node.call(W1, KILL, kill)
    await lab.settle()
    assert await snapshot(lab, job) == before
    assert w1.services.signals.stats[REFUSED_STAT] == 1
    # The owner may.
    ack = await owner.node.call(W1, KILL, Kill(msg_id=new_msg_id(), owner=OWNER, job_id=job, attempt=1,
                                               reason="cancel"))
    assert ack.ok
    run = w1.runner.get(job, 1)
    assert run is not None and run.cancels == 1


@pytest.mark.asyncio
async def test_logs_of_a_remote_run_go_only_to_its_owner_from_the_stored_run_dir(lab: Lab) -> None:
    owner, w1, w2 = d(lab, "owner"), d(lab, "w1"), d(lab, "w2")
    job = await running_on_w1(lab)
    run = await w1.store.runs.remote_run(OWNER, job, 1)
    assert run is not None
    Path(run.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run.run_dir) / "stdout.log").write_text("step 1\nstep 2\n")

    chunk = await owner.services.owner.logs(job, "stdout", 0, None)  # the owner, through w1's peer route
    assert (chunk.data, chunk.next_offset, chunk.complete) == ("step 1\nstep 2\n", 14, False)
    chunk = await owner.node.call(W1, LOGS, LogRequest(job_id=job, attempt=1, offset=7))
    assert chunk.data == "step 2\n"
    chunk = await owner.services.owner.logs(job, "stdout", 7, None, limit=4)  # a window, through the peer route
    assert (chunk.data, chunk.offset, chunk.next_offset, chunk.size) == ("step", 7, 11, 14)

    with pytest.raises(PeerCallError, match="403"):  # another member: refused, whatever it asks
        await w2.node.call(W1, LOGS, LogRequest(job_id=job, attempt=1))
    with pytest.raises(PeerCallError, match="403"):  # an attempt that does not exist
        await owner.node.call(W1, LOGS, LogRequest(job_id=job, attempt=2))
    assert w1.services.signals.stats[REFUSED_STAT] == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("job_id", ["../../../etc", "..", "a/b", "/etc/passwd", "", "x" * 65, "job\x00", ".hidden"])
async def test_traversal_job_ids_are_refused(lab: Lab, tmp_path: Path, job_id: str) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    secret = tmp_path / "secret.log"
    secret.write_text("not yours")
    forged: list[tuple[PeerRoute[Any, Any], Any]] = [
        (LOGS, LogRequest(job_id=job_id, attempt=1)),
        (KILL, Kill(msg_id=new_msg_id(), owner=OWNER, job_id=job_id, attempt=1, reason="x")),
        (REPORT, report(W1, job_id, "renew")),
    ]
    for route, body in forged:
        target = W1 if route is not REPORT else OWNER
        sender = owner if route is not REPORT else w1
        with pytest.raises(PeerCallError, match="400"):
            await sender.node.call(target, route, body)


@pytest.mark.asyncio
@pytest.mark.parametrize("offset", [-1, -(2**40), MAX_LOG_OFFSET + 1, 2**70])
async def test_a_log_offset_out_of_range_is_a_bad_request(lab: Lab, offset: int) -> None:
    owner = d(lab, "owner")
    job = await running_on_w1(lab)
    with pytest.raises(PeerCallError, match="400"):
        await owner.node.call(W1, LOGS, LogRequest(job_id=job, attempt=1, offset=offset))


@pytest.mark.asyncio
@pytest.mark.parametrize("limit", [0, -1, (1 << 20) + 1])
async def test_a_log_limit_out_of_range_is_a_bad_request(lab: Lab, limit: int) -> None:
    owner = d(lab, "owner")
    job = await running_on_w1(lab)
    with pytest.raises(PeerCallError, match="400"):
        await owner.node.call(W1, LOGS, LogRequest(job_id=job, attempt=1, limit=limit))


def test_request_problem_checks_ids_attempts_and_offsets() -> None:
    assert request_problem(LogRequest(job_id="06f3k2m9q1ab", attempt=1, offset=0)) is None
    assert request_problem(LogRequest(job_id="06f3k2m9q1ab", attempt=1, offset=MAX_LOG_OFFSET)) is None
    assert "offset" in (request_problem(LogRequest(job_id="j", attempt=1, offset=-1)) or "")
    assert "limit" in (request_problem(LogRequest(job_id="j", attempt=1, limit=0)) or "")
    assert request_problem(LogRequest(job_id="j", attempt=1, limit=1 << 20)) is None
    assert "job_id" in (request_problem(LogRequest(job_id="../x", attempt=1)) or "")
    assert "attempt" in (request_problem(LogRequest(job_id="j", attempt=0)) or "")
    assert "attempt" in (request_problem(LogRequest(job_id="j", attempt=-3)) or "")
    assert "hold_id" in (request_problem(Release(msg_id="m", owner="o", hold_id="a/../b")) or "")


# ---------------------------------------------------------------------- gang holds


async def hold_on_w1(lab: Lab) -> tuple[str, str]:
    """A hold the owner placed on w1 for one of its jobs: (job id, hold id)."""
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2, nnodes=2)
    row = await owner.services.jobs.get(job)
    spec = owner.services.jobs.spec(row).model_dump(mode="json")
    hold = Hold(msg_id=new_msg_id(), owner=OWNER, job_id=job, hold_id="00112233aabbccdd", spec=spec,
                ttl_s=60.0)
    reply = await owner.node.call(W1, HOLD, hold)
    assert reply.held
    return hold.job_id, hold.hold_id


@pytest.mark.asyncio
async def test_only_the_owner_of_a_hold_may_hold_release_or_commit_it(lab: Lab) -> None:
    w1, w2 = d(lab, "w1"), d(lab, "w2")
    job, hold_id = await hold_on_w1(lab)
    kept = w1.services.ledger.held(hold_id)
    assert kept is not None and kept.owner == OWNER
    spec = kept.spec.model_dump(mode="json")
    forged: list[tuple[PeerRoute[Any, Any], Any]] = [
        (HOLD, Hold(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id=hold_id, spec=spec, ttl_s=60.0)),
        (RELEASE, Release(msg_id=new_msg_id(), owner=W2, hold_id=hold_id)),
        (COMMIT, Commit(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id=hold_id, attempt=1,
                        lease_s=LEASE_S, spec=spec, node_rank=0, nnodes=1, master_addr="127.0.0.1",
                        master_port=1)),
    ]
    for route, body in forged:
        with pytest.raises(PeerCallError, match="403"):
            await w2.node.call(W1, route, body)
    await lab.settle()
    assert w1.services.ledger.held(hold_id) is kept
    assert w1.runner.running() == []
    assert await w1.store.runs.remote_runs() == []
    assert w1.services.signals.stats[REFUSED_STAT] == 3


@pytest.mark.asyncio
async def test_the_owner_cannot_commit_its_hold_under_another_job_id(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    _, hold_id = await hold_on_w1(lab)
    kept = w1.services.ledger.held(hold_id)
    assert kept is not None
    commit = Commit(msg_id=new_msg_id(), owner=OWNER, job_id="someoneelses", hold_id=hold_id, attempt=1,
                    lease_s=LEASE_S, spec=kept.spec.model_dump(mode="json"), node_rank=0, nnodes=1,
                    master_addr="127.0.0.1", master_port=1)
    with pytest.raises(PeerCallError, match="403"):
        await owner.node.call(W1, COMMIT, commit)
    assert w1.services.ledger.held(hold_id) is kept
    assert w1.runner.running() == []


# ---------------------------------------------------------------------- environment values


@pytest.mark.asyncio
async def test_environment_values_go_only_to_the_node_that_runs_the_job(lab: Lab) -> None:
    owner, w1, w2 = d(lab, "owner"), d(lab, "w1"), d(lab, "w2")
    job = await running_on_w1(lab, env={"HF_TOKEN": "s3cret", "MODE": "fast"})
    queued = (await owner.services.owner.submit(SubmitRequest(spec={
        "command": ["python", "x.py"], "workdir": str(lab.workdir), "env": {"API_KEY": "k"}, "user": "root",
        "distributed": {"nnodes": 1, "nproc_per_node": 16}}, submitted_by="test"))).id

    def envs(jobs: JobList) -> dict[str, dict[str, str]]:
        return {j.id: dict(j.spec.env) for j in jobs.jobs if j.spec is not None}

    mine = JobsRequest(msg_id=new_msg_id(), user="root")  # the jobs' user, on w1 or on w2

    # The offer that placed it carried the keys only; the grant to w1 carried the values.
    offers = [c.body for c in lab.net.calls if c.path == "/v1/peer/offer" and isinstance(c.body, Offer)
              and c.body.job_id == job]
    assert offers and all(o.spec["env"] == {"HF_TOKEN": "", "MODE": ""} for o in offers), offers
    run = w1.runner.get(job, 1)
    assert run is not None and (run.env["HF_TOKEN"], run.env["MODE"]) == ("s3cret", "fast")
    assert envs(await w1.node.call(OWNER, JOBS, mine)) == {
        job: {"HF_TOKEN": "s3cret", "MODE": "fast"}, queued: {"API_KEY": ""}}
    assert envs(await w2.node.call(OWNER, JOBS, mine)) == {
        job: {"HF_TOKEN": "", "MODE": ""}, queued: {"API_KEY": ""}}
    # The cluster view of a member that does not run it has no values either, and the owner's own view is whole.
    root = Requester(uid=0, user="root")
    views = {v.id: v for v in await w2.services.owner.list_jobs(None, None, scope="cluster", requester=root)}
    assert views[job].spec is not None and dict(views[job].spec.env) == {"HF_TOKEN": "", "MODE": ""}
    whole = await owner.services.owner.get_job(job)
    assert whole.spec is not None and dict(whole.spec.env) == {"HF_TOKEN": "s3cret", "MODE": "fast"}
    # Once it ended, nobody gets them.
    w1.runner.exit(job, 1, 0)
    await lab.step()
    assert envs(await w1.node.call(OWNER, JOBS, mine))[job] == {"HF_TOKEN": "", "MODE": ""}


@pytest.mark.asyncio
async def test_a_worker_runs_the_spec_its_grant_carries(lab: Lab) -> None:
    """An offer need not carry environment values: the grant (to the one worker that runs it) does."""
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "env": {"HF_TOKEN": "s3cret"},
            "distributed": {"nnodes": 1, "nproc_per_node": 2}, "policy": {"lease_s": LEASE_S}}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
    await lab.settle()
    row = await owner.services.jobs.get(job)
    offered = owner.services.jobs.spec(row).model_dump(mode="json")
    offered["env"] = dict.fromkeys(offered["env"], "")
    offer = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, spec=offered, lease_s=LEASE_S)
    owner.services.jobs.offered(job, W1)  # as the owner's scheduler records the offers it sends
    assert (await owner.node.call(W1, OFFER, offer)).ok
    await w1.services.worker.take_offers()
    await lab.settle()
    run = w1.runner.get(job, 1)
    assert run is not None and run.env.get("HF_TOKEN") == "s3cret"
