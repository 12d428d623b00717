"""The scheduler's partial walks never absorb a change they did not judge.

A pass after which only the free CPU slots changed walks only the jobs that ask for no device; after
each claim it takes a fresh snapshot of this machine, which may hold more than the claim did (a GPU
run that ended meanwhile). Such a pass must not record that machine as "settled": the next pass
walks every job again, so a waiting GPU job that fits the freed GPU starts (whichever comes first in
the queue's order, the GPU job or the CPU job claimed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.verdict import Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes.daemons import OWNER, Lab
from tests.unit.test_reasons_scheduler import _caps, _submit


@pytest.mark.asyncio
@pytest.mark.parametrize("gpu_job_first", [False, True])
async def test_a_gpu_freed_during_a_cpu_claim_is_not_absorbed_into_the_settled_state(
        tmp_path: Path, gpu_job_first: bool) -> None:
    lab = Lab(tmp_path)
    try:
        d = await lab.add("owner", OWNER, cpu_slots=1)
        d.services.machine.use_capabilities(_caps(d, 1, lab))
        g1 = await _submit(lab, d, (1, 1, {}), "g1")  # holds the GPU
        c1 = await _submit(lab, d, (0, 1, {}), "c1")  # holds the CPU slot
        await lab.settle()
        await lab.schedule()
        running = {r.id: r for r in await d.store.jobs.list_jobs([JobStatus.RUNNING], None)}
        assert set(running) == {g1, c1}
        if gpu_job_first:
            g2 = await _submit(lab, d, (1, 1, {}), "g2")
            c2 = await _submit(lab, d, (0, 1, {}), "c2")
        else:
            c2 = await _submit(lab, d, (0, 1, {}), "c2")
            g2 = await _submit(lab, d, (1, 1, {}), "g2")
        await lab.settle()
        await lab.schedule()  # both wait: the machine is settled
        d.runner.exit(c1, running[c1].attempt, 0)  # only the CPU slots change
        await lab.settle()

        worker = d.services.worker
        real_claim = worker.claim_own

        async def claim_then_gpu_run_ends(job_id, spec, placement):  # type: ignore[no-untyped-def]
            ok = await real_claim(job_id, spec, placement)
            if job_id == c2 and g1 in {j for j, _ in d.runner.running()}:
                # While the pass awaits (store writes, the fresh snapshot), the GPU run ends.
                d.runner.exit(g1, running[g1].attempt, 0)
                for _ in range(400):
                    await asyncio.sleep(0.005)
                    row_g1 = await d.store.jobs.get_job(g1)
                    if row_g1 is not None and row_g1.status is not JobStatus.RUNNING:
                        break
                for _ in range(20):
                    await asyncio.sleep(0)
            return ok

        worker.claim_own = claim_then_gpu_run_ends  # type: ignore[method-assign]
        await lab.schedule()  # the devices-only pass: c2 starts, g1 ends meanwhile
        worker.claim_own = real_claim  # type: ignore[method-assign]
        await lab.settle()
        for _ in range(3):  # the exit woke the scheduler: passes follow
            await lab.schedule()
        row = await d.store.jobs.get_job(g2)
        assert row is not None
        if row.status is JobStatus.QUEUED:  # say why in the failure: it fits the freed GPU now
            snap = await d.services.machine.snapshot(refresh_apps=True)
            e = explain(d.services.jobs.spec(row).to_core(g2), [snap], SUPPORT_MATRIX)
            assert e.verdict is not Verdict.FITS_NOW, ("g2 fits now but was left queued", row.reason)
        assert row.status in (JobStatus.CLAIMED, JobStatus.RUNNING), (row.status, row.reason)
        assert (await d.store.jobs.get_job(c2)).status in (JobStatus.CLAIMED, JobStatus.RUNNING)  # type: ignore[union-attr]
    finally:
        await lab.close()
