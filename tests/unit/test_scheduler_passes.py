"""A queued job that fits this machine now never stays queued across passes.

1. A claim (or anything in the walk) that raises: the pass already took the new jobs out of "new",
   so the next pass must walk every job (it must not find the machine "settled").
2. A job waiting on a missing workdir (a cause no event reports) keeps the timer passes on, even
   when the walk skipped its shape and only the reasons judged it at this machine's version.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import OWNER, FakeDaemon, Lab
from tests.unit.test_reasons_scheduler import _caps, _submit


@contextlib.asynccontextmanager
async def _owner_lab(tmp_path: Path) -> AsyncIterator[tuple[Lab, FakeDaemon]]:
    """A lab with one owner daemon of 2 CPU slots and no GPU, closed at the end."""
    lab = Lab(tmp_path)
    try:
        d = await lab.add("owner", OWNER, cpu_slots=2)
        d.services.machine.use_capabilities(_caps(d, 0, lab))
        yield lab, d
    finally:
        await lab.close()


async def _submit_in(d: FakeDaemon, workdir: Path, name: str, frameworks: dict[str, str] | None = None) -> str:
    spec: dict[str, Any] = {"command": ["python", "train.py"], "workdir": str(workdir), "name": name,
                            "policy": {"lease_s": 3600.0}, "requirements": {"frameworks": frameworks or {}}}
    view = await d.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))
    return str(view.id)


@pytest.mark.asyncio
async def test_a_claim_that_raises_does_not_leave_the_new_jobs_unwalked(tmp_path: Path) -> None:
    async with _owner_lab(tmp_path) as (lab, d):
        await _submit(lab, d, (0, 1, {"torch": ">=9"}), "never")  # never fits: the machine is settled
        await lab.settle()
        await lab.schedule()
        a = await _submit(lab, d, (0, 1, {}), "a")  # fits now
        await lab.settle()
        worker = d.services.worker
        real = worker.claim_own

        async def boom(job_id, spec, placement):  # type: ignore[no-untyped-def]
            raise OSError("transient")

        worker.claim_own = boom  # type: ignore[method-assign]
        with pytest.raises(OSError):
            await d.services.scheduler.run_once()  # the supervisor restarts the loop
        worker.claim_own = real  # type: ignore[method-assign]
        for _ in range(3):
            await lab.schedule()
        row = await d.store.jobs.get_job(a)
        assert row is not None
        assert row.status is not JobStatus.QUEUED, ("a fits now but stays queued", row.reason)


@pytest.mark.asyncio
async def test_a_job_waiting_on_a_missing_workdir_keeps_timer_passes_on(tmp_path: Path) -> None:
    async with _owner_lab(tmp_path) as (lab, d):
        missing = tmp_path / "later"
        x = await _submit_in(d, missing, "x")  # waits: its workdir is missing (volatile)
        await lab.settle()
        await lab.schedule()
        sched = d.services.scheduler
        assert not sched._idle()  # waits on a cause no event reports
        other = tmp_path / "other"
        os.makedirs(other)
        await _submit_in(d, other, "y", {"torch": ">=9"})  # never fits; a new path answer
        await lab.settle()
        await lab.schedule()
        os.makedirs(missing)  # no event reports it
        assert not sched._idle(), ("a timer pass would be skipped although x waits on a missing workdir",
                                   (await d.store.jobs.get_job(x)).reason)  # type: ignore[union-attr]
