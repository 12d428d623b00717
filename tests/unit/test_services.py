"""The real services of an owner and two workers, over a loopback network, on a fake clock.

Each daemon is built by :func:`gpulayerd.daemon.build` with its own SQLite store; only
the world is fake (:mod:`tests.fakes.daemons`): the clock, the network, the runner (the
test says when a run exits), the machine's capabilities. No test sleeps: time moves in
``lab.step()``. The owner has one CPU slot and the jobs here want two, so they run on a
worker (``cpus=2``); the workers have two slots each.
"""

from __future__ import annotations

import asyncio

import pytest

from gpulayerd.net.transport import CLAIM, OFFER, REPORT
from gpulayerd.net.wire import Offer, RunReport, new_msg_id
from tests.fakes.daemons import GRACE_S, LEASE_S, OWNER, W1, W2, Lab, d


async def status(lab: Lab, job_id: str) -> str:
    return (await lab.job(d(lab, "owner"), job_id)).status


# ---------------------------------------------------------------------- a remote run, end to end


@pytest.mark.asyncio
async def test_offer_claim_run_exit_on_a_worker(lab: Lab) -> None:
    owner = d(lab, "owner")
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()  # the owner offers it to the lowest worker that fits (w1)
    await lab.schedule()  # w1 claims it, is granted attempt 1 and starts it
    view = await lab.job(owner, job)
    assert view.status == "running"
    assert (view.attempt, view.holder) == (1, W1)
    run = d(lab, "w1").runner.get(job, 1)
    assert run is not None and run.status.running
    assert "--nproc-per-node" in " ".join(run.argv) or "--nproc_per_node" in " ".join(run.argv)
    assert run.deadline == lab.clock.monotonic() + LEASE_S
    assert d(lab, "w2").runner.running() == []

    await lab.run_for(20)  # renewals keep it alive well past one lease
    assert await status(lab, job) == "running"
    assert run.deadline is not None and run.deadline >= lab.clock.monotonic() + LEASE_S - 1.0

    d(lab, "w1").runner.exit(job, 1, 0)
    await lab.step()
    view = await lab.job(owner, job)
    assert view.status == "succeeded"
    assert view.exit_code == 0
    assert [(a.attempt, a.worker, a.state, a.exit_code) for a in view.attempts] == [(1, W1, "exited", 0)]
    remote = await d(lab, "w1").store.runs.remote_runs()
    assert [(r.job_id, r.attempt, r.state, r.reported) for r in remote] == [(job, 1, "exited", True)]


@pytest.mark.asyncio
async def test_a_grant_whose_answer_was_lost_goes_back_at_once_not_at_its_lease(lab: Lab) -> None:
    """The owner granted w1's claim but the answer was lost (w1 released the devices): w1 asks again with
    the same claim, gets the same grant and gives it back as never started. The job is queued again in
    seconds (not after its lease) without using a retry, and attempt 2 runs: never two at once."""
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await lab.submit(owner, cpus=2)
    lab.net.lose_replies(OWNER, CLAIM, 2)  # the first claim's answer, and the first time it is asked again
    await lab.schedule()
    await lab.schedule()
    assert w1.runner.running() == [] and (await lab.job(owner, job)).attempt == 1  # granted, unknown to w1
    waited = await lab.run_until("the job running again", lambda: _running(lab, job), limit_s=LEASE_S / 2)
    view = await lab.job(owner, job)
    assert waited < 10 and (view.status, view.attempt) == ("running", 2), view.events
    assert [(a.attempt, a.state) for a in view.attempts] == [(1, "lost"), (2, "running")]
    assert "answer to its claim was lost" in view.attempts[0].reason
    assert view.retries_left == view.spec.policy.retries  # a never-started attempt uses no retry
    claims = [c for c in lab.net.calls if c.path == CLAIM.path and c.sender == W1]
    assert [c.outcome for c in claims[:3]] == ["reply lost", "reply lost", "ok"]
    assert claims[0].body is not None and claims[1].body is not None and claims[0].body.msg_id == claims[1].body.msg_id
    assert w1.services.worker._lost.outcomes == {"given back": 1}
    assert len([k for w in (w1, d(lab, "w2")) for k in w.runner.running()]) == 1


@pytest.mark.asyncio
async def test_an_end_frees_its_slot_at_once_and_is_reported_only_after_the_start(lab: Lab) -> None:
    """A job that exits while its ``started`` report is still unanswered: the worker records the end
    and frees its slots at once, and tells the owner of the end only after the start."""
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    held = lab.net.hold(OWNER, REPORT)
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    assert w1.runner.running() == [(job, 1)]
    w1.runner.exit(job, 1, 0)
    await lab.settle()
    assert [(r.job_id, r.state) for r in await w1.store.runs.remote_runs()] == [(job, "exited")]
    assert (await w1.services.machine.snapshot(refresh_apps=False)).cpu_slots_free == 2
    assert await status(lab, job) == "claimed"  # the owner heard nothing yet
    held.set_result(None)
    await lab.settle()
    assert await status(lab, job) == "succeeded"
    kinds = [c.body.kind for c in lab.net.calls if c.path == REPORT.path and isinstance(c.body, RunReport)]
    assert kinds[:2] == ["started", "exited"]


@pytest.mark.asyncio
async def test_an_end_deferred_behind_a_slow_start_report_is_sent_once(lab: Lab) -> None:
    """The ``started`` report waits (a Slurm start gate, a slow owner) while the job has ended: the renewal
    rounds meanwhile do not each add one more ``exited`` report, sent all at once after the start."""
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    lab.net._waiting.append(gate)  # (idle while it waits)

    async def start_gate(owner_id: str, key: object, handle: object) -> str:
        await gate
        return ""

    w1.services.worker.start_gate = start_gate
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    held = lab.net.hold(OWNER, REPORT)
    await lab.step(schedule=False)  # a renewal round with the owner, in flight
    w1.runner.exit(job, 1, 0)
    await lab.settle()
    held.set_result(None)  # that round ends
    await lab.settle()
    for _ in range(3):  # renewal ticks while the start is still being reported
        await lab.step(schedule=False)
    gate.set_result(None)
    await lab.settle()
    assert (await lab.job(owner, job)).status == "succeeded"
    kinds = [c.body.kind for c in lab.net.calls if c.path == REPORT.path and isinstance(c.body, RunReport)
             and c.body.job_id == job and c.body.kind != "renew"]
    assert kinds == ["started", "exited"]


async def _running(lab: Lab, job: str) -> bool:
    return await status(lab, job) == "running"


# ---------------------------------------------------------------------- claim races


@pytest.mark.asyncio
async def test_two_workers_claim_the_same_offer_exactly_one_is_granted(lab: Lab) -> None:
    owner, w1, w2 = d(lab, "owner"), d(lab, "w1"), d(lab, "w2")
    job = await lab.submit(owner, cpus=2)
    row = await owner.services.jobs.get(job)
    spec = owner.services.jobs.spec(row).model_dump(mode="json")
    for w in (w1, w2):  # the owner offered it to both (a re-offer after offer_interval_s)
        offer = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, spec=spec, lease_s=LEASE_S)
        owner.services.jobs.offered(job, w.node_id)  # as the owner's scheduler records the offers it sends
        assert (await owner.node.call(w.node_id, OFFER, offer)).ok
    await asyncio.gather(w1.services.worker.take_offers(), w2.services.worker.take_offers())
    await lab.settle()

    view = await lab.job(owner, job)
    assert view.status == "running"
    assert view.attempt == 1
    assert [a.attempt for a in view.attempts] == [1]
    winner = view.holder
    loser = w2 if winner == W1 else w1
    assert winner in (W1, W2)
    assert [k for w in (w1, w2) for k in w.runner.running()] == [(job, 1)]
    assert loser.runner.get(job, 1) is None
    assert await loser.store.runs.remote_runs() == []
    assert loser.services.signals.stats["claims_denied"] == 1
    assert owner.services.signals.stats["claim_requests_granted"] == 1
    assert owner.services.signals.stats["claim_requests_denied"] == 1
    claims = [c for c in lab.net.calls if c.path == "/v1/peer/claim"]
    assert sorted(c.sender for c in claims) == [W1, W2]


# ---------------------------------------------------------------------- leases


@pytest.mark.asyncio
@pytest.mark.parametrize("retries", [0, 1])
async def test_a_worker_that_stops_renewing_loses_the_attempt(lab: Lab, retries: int) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await lab.submit(owner, cpus=2, retries=retries)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, job)).holder == W1
    started = lab.clock.monotonic()
    # w1's renewals stop reaching the owner (its calls are refused), its job runs on.
    lab.net.fault(W1, "refuse")

    async def lost_or_requeued() -> bool:
        v = await lab.job(owner, job)
        return v.status != "running" or v.attempt != 1

    await lab.run_until("lost", lost_or_requeued)
    waited = lab.clock.monotonic() - started
    assert LEASE_S + GRACE_S <= waited <= LEASE_S + GRACE_S + 2.0
    # w1 kills its run when its own deadline passes (one lease after its last answered renewal),
    # before the owner gives up on it.
    run = w1.runner.get(job, 1)
    assert run is not None and run.status.reason == "deadline" and run.status.exit_code == -15
    view = await lab.job(owner, job)
    assert view.attempts[0].state == "lost"
    if retries == 0:
        assert view.status == "lost"
        assert view.retries_left == 0
    else:
        assert view.retries_left == 0
        # w1 is cut off (not up for the owner): attempt 2 goes to w2.

        async def second() -> bool:
            v = await lab.job(owner, job)
            return v.status == "running" and v.attempt == 2

        await lab.run_until("running attempt 2", second)
        assert (await lab.job(owner, job)).holder == W2


@pytest.mark.asyncio
async def test_a_worker_that_never_answers_is_declared_lost_and_its_run_dies_at_its_deadline(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await lab.submit(owner, cpus=2, retries=0)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, job)).holder == W1
    lab.net.fault(W1, "hang")  # every call to and from w1 hangs until the caller's timeout
    last_renewal = lab.clock.monotonic()

    run = w1.runner.get(job, 1)
    assert run is not None
    for _ in range(int(LEASE_S) - 1):
        await lab.step()
    assert run.status.running  # within one lease of its last answered renewal it runs on

    async def lost() -> bool:
        return await status(lab, job) == "lost"

    await lab.run_until("lost", lost)
    assert lab.clock.monotonic() - last_renewal <= LEASE_S + GRACE_S + 2.0
    assert run.status.reason == "deadline"
    ended_by_watchdog = [k for k in [(job, 1)] if not run.status.running]
    assert ended_by_watchdog == [(job, 1)]
    view = await lab.job(owner, job)
    assert view.attempts[0].state == "lost"
    assert any(c.target == W1 and "did not answer" in c.outcome for c in lab.net.calls) or any(
        c.sender == W1 and "did not answer" in c.outcome for c in lab.net.calls)

    # When w1 answers again, it reports the end; the owner keeps the attempt lost (it is stale).
    lab.net.fault(W1, None)
    await lab.run_for(5)
    assert (await lab.job(owner, job)).status == "lost"
    remote = await w1.store.runs.remote_runs()
    # Stopped at its lease deadline: the worker records it lost (its lease ran out), not failed.
    assert [(r.state, r.reported) for r in remote] == [("lost", True)]


# ---------------------------------------------------------------------- owner restart


@pytest.mark.asyncio
async def test_owner_restart_during_a_remote_run_the_worker_reports_when_it_is_back(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, job)).status == "running"

    await lab.stop(owner)  # the owner is down: w1's renewals are refused
    await lab.run_for(4)
    run = w1.runner.get(job, 1)
    assert run is not None and run.status.running
    w1.runner.exit(job, 1, 0)  # the job ends while its owner is away
    await lab.run_for(2)
    remote = await w1.store.runs.remote_runs()
    assert [(r.state, r.exit_code, r.reported) for r in remote] == [("exited", 0, False)]

    owner = await lab.restart(owner)
    assert (await lab.job(owner, job)).status == "running"  # recovered: the lease counts as renewed
    await lab.run_for(2)  # w1 reports the exit owed
    view = await lab.job(owner, job)
    assert view.status == "succeeded"
    assert view.attempts[0].state == "exited"
    remote = await w1.store.runs.remote_runs()
    assert [(r.state, r.reported) for r in remote] == [("exited", True)]


@pytest.mark.asyncio
async def test_owner_restart_during_a_remote_run_the_run_goes_on_and_renews(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    owner = await lab.restart(owner)
    await lab.run_for(3 * LEASE_S)  # the restarted owner accepts the renewals of attempt 1
    assert await status(lab, job) == "running"
    run = w1.runner.get(job, 1)
    assert run is not None and run.status.running
    w1.runner.exit(job, 1, 3)
    await lab.step()
    view = await lab.job(owner, job)
    assert (view.status, view.exit_code) == ("failed", 3)


@pytest.mark.asyncio
async def test_an_offer_that_fits_the_worker_now_wakes_its_scheduler_at_once_one_that_cannot_is_paced(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    signals = w1.services.signals
    for cpus, fits, broken in ((2, True, False), (3, False, False), (2, False, True)):  # (w1: two CPU slots, free)
        job = await lab.submit(owner, cpus=cpus)
        spec = owner.services.jobs.spec(await owner.services.jobs.get(job)).model_dump(mode="json")
        if broken:  # a spec that does not parse here: kept (a pass drops it and tells its owner), not hurried
            spec["command"] = []
        signals.clear_wake()
        offer = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, spec=spec, lease_s=LEASE_S)
        assert (await owner.node.call(w1.node_id, OFFER, offer)).ok
        assert (OWNER, job) in w1.services.worker.offers_kept()
        # One that fits is claimed by a pass at once, as this node's own wake-ups are (no pacing); a stream
        # of offers that cannot fit yet (a full worker in a burst) asks for paced passes only.
        assert signals.woken() and signals.peers_only() == (not fits), (cpus, fits, broken)
