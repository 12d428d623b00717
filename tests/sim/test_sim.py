"""The simulator's tests: seeds of a faulty department hold every invariant; a planted bug is found.

Each seed: 20 real daemons (2 GPUs each, clocks skewed by up to 200 ppm), the lab mix
(1- and 2-GPU jobs of 5-20 s here, to fit CI) while the fault plan runs (a daemon crash and
restart, a partition of a fifth of the machines, 10 % message loss, a paused daemon), then
a quiet period. "Eventually" is bounded: every acknowledged job has ended within
:data:`QUIET_BOUND_S` seconds after the last fault healed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayerd.app.common.owned_jobs import Granted, OwnedJobs
from tests.sim.invariants import ENDED, Violation
from tests.sim.workload import Faults, burst, fault_plan, lab_mix, run_with
from tests.sim.world import Sim

QUIET_BOUND_S = 120.0
"""Seconds after the last fault heals (and the last job is submitted) by which every acknowledged job has
ended: jobs last at most 20 s in CI, 60 s in the 10-minute runs (``bench/sim.py --seeds``)."""


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    """The in-memory store's journal mode is not WAL: that warning (one per daemon) says nothing here."""
    log = logging.getLogger("gpulayerd.store.db")
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


async def _all_ended(sim: Sim) -> bool:
    for job in sim.jobs.values():
        d = sim.daemons[job.owner]
        if d.services is None:
            return False
        if (await d.services.owner.get_job(job.id)).status not in ENDED:
            return False
    return True


async def _faults(sim: Sim, plans: list[Faults]) -> None:
    """The fault plans one after another (the first with the plan's own random source: the CI seeds' runs)."""
    for i, plan in enumerate(plans):
        await fault_plan(sim, plan, None if i == 0 else random.Random(f"{sim.seed}-faults-{i}"))


async def faulty_department(root: Path, seed: int, n: int = 20, *, minutes: float | None = None
                            ) -> tuple[Sim, float, dict[str, int]]:
    """One seed: the lab mix under the fault plan, then quiet until every job ended; (sim, seconds to end, statuses).

    Without ``minutes``: the CI run (one short fault plan, jobs of 5-20 s). With ``minutes``: that
    many simulated minutes of the lab mix (jobs of 10-60 s) under the default fault plan
    (:class:`~tests.sim.workload.Faults`: a 20 s crash, a 30 s partition, 60 s of 10 % loss, a
    15 s pause) over and over; then quiet. Either way every job has ended within
    :data:`QUIET_BOUND_S` after the last fault healed and the last job was submitted.

    Raises:
        Violation: an invariant broke (its message names the seed and the last events).
    """
    sim = Sim(root / f"seed{seed}", seed=seed, n=n, skew_ppm=200)
    await sim.start()
    try:
        await sim.run_for(3)
        if minutes is None:
            plans = [Faults(start=sim.time.now + 5, crash_s=5, partition_s=8, loss_s=10, pause_s=5, gap_s=3)]
            span, durations = plans[0].end - sim.time.now + 1, (5.0, 20.0)
        else:
            span, durations, plans = minutes * 60 - sim.time.now, (10.0, 60.0), []
            assert span >= 230, "a run with faults takes at least 4 simulated minutes (one fault plan)"
            while not plans or plans[-1].end + 225 < sim.time.now + span:
                plans.append(Faults(start=plans[-1].end + 20 if plans else sim.time.now + 5))
        await run_with(sim, span, lab_mix(sim, span - 1, util=0.6, duration_s=durations), _faults(sim, plans))
        healed = sim.time.now
        while not await _all_ended(sim):
            if sim.time.now - healed > QUIET_BOUND_S:
                sim.checker.fail(f"jobs still waiting {QUIET_BOUND_S:g} s after the faults healed")
            await sim.run_for(2.0)
        counts = await sim.checker.final()
        assert sim.net.errors == [], sim.net.errors[:3]
        return sim, sim.time.now - healed, counts
    finally:
        await sim.close()


@pytest.mark.asyncio
async def test_three_seeds_of_twenty_daemons_with_faults_hold_every_invariant(tmp_path: Path) -> None:
    for seed in (1, 2, 3):
        sim, settle_s, counts = await faulty_department(tmp_path, seed)
        print(f"seed {seed}: {len(sim.jobs)} jobs {counts}, all ended {settle_s:.0f} s after the faults healed, "
              f"{sim.checker.checked} starts checked, {sim.steps} steps, {sim.net.calls} calls")
        assert len(sim.jobs) >= 20  # the mix submitted real work
        assert counts.get("succeeded", 0) >= 0.9 * len(sim.jobs)
        assert settle_s <= QUIET_BOUND_S
        assert sim.checker.checked >= len(sim.jobs)
    # Its time (budget 60 s on a quiet 2-core machine) is in scripts/test's ten slowest, never asserted.


async def _fingerprint(root: Path, seed: int) -> tuple[object, ...]:
    """What one short faulty run did: its events, every node's traffic, its steps and calls, each job's starts."""
    sim = Sim(root, seed=seed, n=6, skew_ppm=200)
    await sim.start()
    try:
        await sim.run_for(3)
        plan = Faults(start=sim.time.now + 2, crash_s=3, partition_s=3, loss_s=4, pause_s=3, gap_s=2)
        await run_with(sim, plan.end - sim.time.now + 1,
                       lab_mix(sim, plan.end - sim.time.now, util=0.6, duration_s=(3.0, 8.0)),
                       fault_plan(sim, plan))
        await sim.run_for(10)
        traffic = {n: (dict(t.sent_msgs), dict(t.sent_bytes)) for n, t in sorted(sim.net.traffic.items())}
        jobs = sorted((j.id, j.started, j.starts) for j in sim.jobs.values())
        return list(sim.trace), traffic, sim.steps, sim.net.calls, jobs
    finally:
        await sim.close()


@pytest.mark.asyncio
async def test_a_seed_gives_the_same_run_twice(tmp_path: Path) -> None:
    # Directory checks and device locks run in threads: their answers reach the loop at the same
    # point of the run whatever the threads' real timing (tests/sim/world.py Sim.quiet).
    first = await _fingerprint(tmp_path / "a", seed=4)
    second = await _fingerprint(tmp_path / "b", seed=4)
    assert first[2] > 1000 and len(first[4]) >= 3  # it did something: steps, jobs
    assert first == second


def _plant_claim_without_compare_and_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: a claim on a job already granted to another worker is granted too (no CAS)."""
    real = OwnedJobs.grant

    async def grant_without_cas(self: OwnedJobs, job_id: str, worker: str, *args: object, **kw: object) -> object:
        answer = await real(self, job_id, worker, *args, **kw)  # type: ignore[arg-type]
        if isinstance(answer, str):
            row = await self._store.jobs.get_job(job_id)
            if row is not None and row.status == "running":
                return Granted(row.attempt, row.lease_s, fresh=True)
        return answer

    monkeypatch.setattr(OwnedJobs, "grant", grant_without_cas)


@pytest.mark.asyncio
async def test_a_claim_without_compare_and_set_is_found_and_its_seed_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _plant_claim_without_compare_and_set(monkeypatch)
    found: Violation | None = None
    for seed in range(1, 6):
        sim = Sim(tmp_path / f"seed{seed}", seed=seed, n=8)
        await sim.start()
        try:
            await sim.run_for(3)
            await burst(sim, 40, owners=4, duration_s=10.0)
            await sim.run_for(30)
        except Violation as v:
            found = v
            print(v)
            break
        finally:
            await sim.close()
    assert found is not None, "the planted bug was not found in 5 seeds"
    text = str(found)
    assert f"seed {seed}" in text and f"reproduce: seed={seed}" in text
    assert "runs on" in text  # one attempt on two workers
    assert "start " in text  # the trace shows the starts
    assert "reproduce: seed=" in capsys.readouterr().out


@pytest.mark.asyncio
async def test_a_crashed_machine_is_not_an_idle_one_beside_a_waiting_job(tmp_path: Path) -> None:
    # bench/sim.py's detection phase kills a daemon for good (no fault for the checker): its GPUs
    # had been free since the start, and the idle check kept counting them free after the crash.
    sim = Sim(tmp_path, seed=1, n=3)
    await sim.start()
    try:
        await sim.run_for(3)
        await sim.crash(sim.daemons["n002"])
        await sim.run_for(3)
        ids = [await sim.submit(sim.daemons["n000"], gpus=1, duration_s=60.0) for _ in range(5)]
        await sim.run_for(45)  # one job waits (4 GPUs up) beyond the idle bound: legitimate
        waiting = [j for j in ids if j is not None and sim.jobs[j].started is None]
        assert len(waiting) == 1 and sim.checker.idle_bound_s < 45
        assert not [k for k in sim.checker._free_since if k[0] == "n002"]
        await sim.restart(sim.daemons["n002"])
        await sim.run_for(10)  # back: it takes the waiting job
        assert sim.jobs[waiting[0]].started is not None
    finally:
        await sim.close()


@pytest.mark.asyncio
async def test_handlers_are_charged_their_cpu_one_at_a_time_per_daemon(tmp_path: Path) -> None:
    """With ``charge_cpu`` each handler's reply leaves its CPU time later, after the daemon's earlier
    charged work (one handler at a time); without it nothing is charged (the seeds' reproducible runs)."""
    sim = Sim(tmp_path, seed=2, n=3, charge_cpu=True)
    net = sim.net
    net.time.now = 100.0
    assert net._charged("a", 0.002) == pytest.approx(100.002)
    assert net._charged("a", 0.001) == pytest.approx(100.003)  # behind a's earlier work
    assert net._charged("b", 0.001) == pytest.approx(100.001)  # another daemon: its own CPU
    net._busy_until.clear()
    net.cpu_charged_s.clear()
    net.time.now = 0.0
    await sim.start()
    try:
        await sim.run_for(5)
        job = await sim.submit(sim.daemons["n000"], gpus=1, duration_s=2.0)
        await sim.run_for(10)
        assert job is not None and sim.jobs[job].started is not None
        assert set(net.cpu_charged_s) == set(net.nodes) and len(net.nodes) == 3  # heartbeats, the claim
        assert all(0 < s < 5 for s in net.cpu_charged_s.values()), net.cpu_charged_s
    finally:
        await sim.close()
    plain = Sim(tmp_path / "plain", seed=2, n=2)
    assert plain.net._charged("a", 0.5) == plain.net.time.now and plain.net.cpu_charged_s == {}


async def _burst_passes(root: Path) -> tuple[float, int]:
    """Ten daemons (20 GPUs), 200 one-GPU jobs from five owners at once: the scheduling passes per daemon per
    simulated second over the burst's first 4 s, and the jobs started by then."""
    sim = Sim(root, seed=3, n=10)
    await sim.start()
    try:
        await sim.run_for(5)

        def passes() -> int:
            return sum(d.services.signals.stats["scheduler_passes"] for d in sim.daemons.values() if d.services)

        before = passes()
        ids = await burst(sim, 200, owners=5, duration_s=60.0)
        await sim.run_for(4)
        return (passes() - before) / 10 / 4, sum(sim.jobs[j].started is not None for j in ids)
    finally:
        await sim.close()


@pytest.mark.asyncio
async def test_a_burst_of_peers_offers_is_taken_a_pass_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """Five owners offer 200 jobs to ten workers: an offer (or a peer's capabilities) alone asks for a pass
    that waits until ``PEER_PASS_GAP_S`` after the last one (``TimerPass.hold``), so a worker takes the offers
    that came meanwhile in one pass. Every GPU is still taken at once; without the pacing, a pass per offer."""
    from gpulayerd.core.scheduling import successor

    rate, started = await _burst_passes(tmp_path / "paced")
    assert started == 20  # every GPU, within the first 4 s
    assert rate <= 1 / successor.PEER_PASS_GAP_S, rate
    monkeypatch.setattr(successor, "PEER_PASS_GAP_S", 0.0)  # (read by each TimerPass as it is made)
    unpaced, started = await _burst_passes(tmp_path / "unpaced")
    assert started == 20 and unpaced > 2 * rate, (unpaced, rate)
