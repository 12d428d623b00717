"""Cluster-wide job control: any job id works on any daemon of the cluster (RemoteJobs).

Real services over the loopback network (tests/fakes): ``show``, ``explain``, ``logs`` and
``cancel`` through each daemon's local API service (``services.api``), the requests
forwarded to the job's owner with the user's name, believed as far as the asking node's
certificate (its ``mode`` and ``user`` on the loopback node) vouches for it.
"""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import pytest

from gpulayerd import routes
from gpulayerd.app.common.requester import HIDDEN, Requester
from gpulayerd.app.local import LocalApi
from gpulayerd.errors import AmbiguousJob, Forbidden, NoSuchJob, PeerUnreachable
from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import OWNER, W1, FakeDaemon, Lab, d, view

ME = pwd.getpwuid(os.getuid()).pw_name  # the jobs' user: an account the (personal) workers run jobs as
ALICE = Requester(uid=os.getuid(), user=ME)  # the jobs' user asking
BOB = Requester(uid=1002, user="glbob")  # someone else


async def submit_as(lab: Lab, where: FakeDaemon, user: str) -> str:
    spec = {"command": ["python", "train.py", "--secret"], "workdir": str(lab.workdir), "user": user,
            "policy": {"retries": 0, "lease_s": 10.0}}
    v = await where.services.owner.submit(SubmitRequest(spec=spec, submitted_by=user))
    await lab.settle()
    return v.id


async def running_on_w1(lab: Lab, user: str = ME) -> str:
    """A job of ``user`` owned by the owner, running on w1 (the owner has no interpreter)."""
    machine = d(lab, "owner").services.machine
    machine.use_capabilities((await machine.capabilities()).model_copy(update={"environments": []}))
    await lab.settle()
    job = await submit_as(lab, d(lab, "owner"), user)

    async def on_w1() -> bool:
        v = await view(lab, job)
        return v.status == "running" and v.holder == W1

    await lab.run_until("running on w1", on_w1, limit_s=20)
    return job


def system_nodes(lab: Lab) -> None:
    """Every node's certificate says system mode: each vouches for any user name; and each runs
    root's jobs (``allow_root_jobs``: the tests' jobs are root's, who runs them), as whose jobs a
    worker runs is judged from its certificate's mode (a system node runs root's only so)."""
    for x in lab.daemons.values():
        x.node.mode, x.node.user = "system", ""
        x.services.machine.accounts.allow_root_jobs = True


async def authorized(api: LocalApi, name: str, requester: Requester, job: str) -> None:
    """The local route ``name``'s role check, as the local API runs it before the handler."""
    await api.async_authorize(routes.LOCAL[name], requester, job)


async def write_log(lab: Lab, job: str, text: str) -> None:
    run = await d(lab, "w1").store.runs.remote_run(OWNER, job, 1)
    assert run is not None
    path = Path(run.run_dir) / "stdout.log"
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(path.write_text, text)


@pytest.mark.asyncio
async def test_show_explain_logs_cancel_of_a_job_owned_elsewhere_are_forwarded(lab: Lab) -> None:
    system_nodes(lab)
    job = await running_on_w1(lab)
    await write_log(lab, job, "step 1\n")
    w1, w2 = d(lab, "w1").services.api, d(lab, "w2").services.api

    for api in (w1, w2):  # the worker that runs it, and a bystander
        v = await api.async_get_job(job, ALICE)
        assert (v.id, v.owner, v.status, v.holder, v.spec_hidden) == (job, OWNER, "running", W1, False)
        assert v.spec.command == ["python", "train.py", "--secret"]
        assert [a.attempt for a in v.attempts] == [1]
        other = await api.async_get_job(job[:6], BOB)  # a prefix works too; bob sees it concealed
        assert (other.id, other.spec_hidden, other.spec.command) == (job, True, [HIDDEN])
        e = await api.async_explain(job, BOB)
        assert e.job_id == job
        chunk = await api.async_logs(job, "stdout", 0, None, ALICE)
        assert (chunk.job_id, chunk.attempt, chunk.data) == (job, 1, "step 1\n")
        chunk = await api.async_logs(job, "stdout", 5, None, ALICE, limit=1)  # a window, forwarded
        assert (chunk.data, chunk.next_offset, chunk.size) == ("1", 6, 7)
        with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
            await api.async_logs(job, "stdout", 0, None, BOB)
        with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
            await api.async_cancel(job, BOB)

    cancelled = await w2.async_cancel(job, ALICE)
    assert (cancelled.id, cancelled.cancel_requested) == (job, True)
    assert (await view(lab, job)).cancel_requested
    with pytest.raises(NoSuchJob, match="no job 'zzzzzzzzzzzz'"):
        await w2.async_get_job("zzzzzzzzzzzz", ALICE)


@pytest.mark.asyncio
async def test_a_personal_node_of_bob_cannot_read_another_users_logs_on_their_behalf(lab: Lab) -> None:
    system_nodes(lab)
    job = await running_on_w1(lab)
    await write_log(lab, job, "the secret output\n")
    w2 = d(lab, "w2")
    w2.node.mode, w2.node.user = "personal", "bob"  # its certificate: bob's personal node

    # Even though the request names the job's user (and claims admin), the owner believes neither.
    liar = Requester(uid=1002, user=ME, admin=True)
    with pytest.raises(Forbidden, match=f"w2 is bob's personal-mode node: it speaks only for bob, not for '{ME}'"):
        await w2.services.api.async_logs(job, "stdout", 0, None, liar)
    with pytest.raises(Forbidden, match="speaks only for bob"):
        await w2.services.api.async_cancel(job, liar)
    v = await w2.services.api.async_get_job(job, liar)
    assert (v.spec_hidden, v.spec.command) == (True, [HIDDEN])
    assert not (await view(lab, job)).cancel_requested
    # bob himself, on his node: vouched, but not admin there (a personal node's admin is its own).
    with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
        await w2.services.api.async_logs(job, "stdout", 0, None, Requester(uid=1002, user="bob", admin=True))


@pytest.mark.asyncio
async def test_admin_rights_are_the_owners_to_decide_and_only_for_a_system_nodes_request(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    system_nodes(lab)
    job = await running_on_w1(lab)
    await write_log(lab, job, "out\n")
    w2 = d(lab, "w2").services.api
    # An admin on w2 (its claim says so), not the job's user: the owner does not take w2's word for it.
    admin = Requester(uid=5000, user="gladmin", admin=True)
    with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
        await w2.async_logs(job, "stdout", 0, None, admin)
    # The owner's own admin_group names gladmin (its user database, faked here): then it may.
    requesters = d(lab, "owner").services.requesters
    assert requesters is not None
    monkeypatch.setattr(requesters, "mode", "system")
    monkeypatch.setattr(requesters, "_admin_by_name", lambda name: name == "gladmin")
    chunk = await w2.async_logs(job, "stdout", 0, None, Requester(uid=5000, user="gladmin"))
    assert chunk.data == "out\n"
    d(lab, "w2").node.mode, d(lab, "w2").node.user = "personal", "gladmin"  # gladmin's own personal node
    with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
        await w2.async_logs(job, "stdout", 0, None, admin)


@pytest.mark.asyncio
async def test_owner_down_the_worker_answers_for_its_run_and_others_say_unreachable(lab: Lab) -> None:
    system_nodes(lab)
    job = await running_on_w1(lab)
    await write_log(lab, job, "still going\n")
    await lab.stop(d(lab, "owner"))
    w1, w2 = d(lab, "w1").services.api, d(lab, "w2").services.api

    v = await w1.async_get_job(job, ALICE)  # the worker: what it knows of its run
    assert (v.id, v.status, v.attempt, v.holder, v.owner) == (job, "running", 1, W1, OWNER)
    assert v.reason.startswith("owner owner unreachable: what w1 knows: attempt 1 running on w1 since "), v.reason
    assert not v.spec_hidden
    assert (await w1.async_get_job(job, BOB)).spec_hidden
    chunk = await w1.async_logs(job, "stdout", 0, None, ALICE)
    assert (chunk.data, chunk.complete) == ("still going\n", False)
    with pytest.raises(Forbidden, match=f"job {job} belongs to {ME}"):
        await authorized(w1, "logs", BOB, job)  # the run is held here: w1 decides for its run's user
    await authorized(w1, "logs", ALICE, job)
    e = await w1.async_explain(job, ALICE)
    assert (e.verdict, e.summary.split(":")[0]) == ("running", "owner owner unreachable")
    # `gpulayer jobs` on the machine running it still lists it (the owner's listing is missing).
    listed = [j for j in await w1.async_list_jobs(None, None, "cluster", BOB) if j.id == job]
    assert [(j.status, j.holder, j.spec_hidden) for j in listed] == [("running", W1, True)], listed
    assert [j.id for j in await w1.async_list_jobs(["succeeded"], None, "cluster", ALICE)] == []
    with pytest.raises(PeerUnreachable, match=f"job {job}: owner owner unreachable"):
        await w1.async_cancel(job, ALICE)

    # A bystander: the owner does not answer, the worker does (it holds a run of the job).
    v2 = await w2.async_get_job(job, ALICE)
    assert (v2.status, v2.holder) == ("running", W1)
    assert v2.reason.startswith("owner owner unreachable from w2: what w1 knows: attempt 1 running"), v2.reason
    assert (await w2.async_logs(job, "stdout", 0, None, ALICE)).data == "still going\n"
    with pytest.raises(PeerUnreachable, match="owner owner unreachable"):
        await w2.async_cancel(job, ALICE)


@pytest.mark.asyncio
async def test_owner_down_and_nobody_knows_the_job_says_owner_unreachable(lab: Lab) -> None:
    job = await submit_as(lab, d(lab, "owner"), ME)  # queued on the owner: no worker holds it
    assert (await d(lab, "w2").services.api.async_get_job(job, ALICE)).id == job
    await lab.stop(d(lab, "owner"))
    for name in ("w1", "w2"):
        api = d(lab, name).services.api
        for call in (api.async_get_job(job, ALICE), api.async_explain(job, ALICE),
                     api.async_logs(job, "stdout", 0, None, ALICE), api.async_cancel(job, ALICE)):
            with pytest.raises(PeerUnreachable) as err:
                await call
            assert err.value.message == (f"job {job!r}: no machine that answered knows it, and owner did not "
                                         "answer (if it is its owner, ask again when it is back)")


@pytest.mark.asyncio
async def test_a_prefix_ambiguous_across_the_cluster_lists_the_matches_with_their_owners(lab: Lab) -> None:
    a = await submit_as(lab, d(lab, "owner"), ME)
    b = await submit_as(lab, d(lab, "w1"), ME)  # the same fake millisecond: the same time prefix
    prefix = a[:8]
    assert b.startswith(prefix) and a != b
    for name in ("owner", "w1", "w2"):
        with pytest.raises(AmbiguousJob) as err:
            await d(lab, name).services.api.async_get_job(prefix, ALICE)
        first, second = sorted([(a, "owner"), (b, "w1")])
        assert err.value.message == (f"job id prefix {prefix!r} matches several jobs: "
                                     f"{first[0]} (owner {first[1]}), {second[0]} (owner {second[1]})")
    # A longer prefix that names one job works anywhere.
    assert (await d(lab, "w2").services.api.async_get_job(b, ALICE)).owner == W1
    assert (await d(lab, "owner").services.api.async_get_job(b[:11], ALICE)).id == b
