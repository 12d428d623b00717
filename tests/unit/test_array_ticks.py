"""The arrays' tick after a pass (in the background), on the loopback lab: an array that waits for a
dependency and is cancelled meanwhile is let go of (not held for ever, not re-registered at each tick);
the array's transaction runs only when the ends seen let a task in."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayerd.app.owner.array_book import REFRESH_S
from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import FakeDaemon, Lab, d


@pytest.mark.asyncio
async def test_an_array_cancelled_while_it_waits_for_a_dependency_is_let_go(lab: Lab) -> None:
    owner = d(lab, "owner")
    first = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, first)).status == "running"
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "array": "0-3", "after": [first]}
    array = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
    await lab.schedule()
    await lab.schedule()  # the array waits for its dependency (its tick has read it)
    books = owner.services.owner.arrays
    assert array in books.gate.waiting()
    await owner.services.owner.cancel(array)
    assert (await lab.job(owner, array)).status == "cancelled"
    for _ in range(3):
        await lab.step()
    assert array not in books.gate.waiting()
    assert books.held() == 0  # the scheduler's count of its queue agrees with the store's


@pytest.mark.asyncio
async def test_a_tick_writes_only_when_an_end_seen_lets_a_task_in(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick after each pass skips the array's transaction while its last count, less the ends of its tasks
    seen since, lets nothing in; an end lets the next task in at once; a count is never older than REFRESH_S."""
    owner = d(lab, "owner")
    calls: list[str] = []
    real = owner.store.arrays.materialize

    async def counted(array_id: str, decide: Any) -> Any:
        calls.append(array_id)
        return await real(array_id, decide)

    monkeypatch.setattr(owner.store.arrays, "materialize", counted)
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "array": "0-5%2"}
    array = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id

    def running() -> list[tuple[FakeDaemon, str, int]]:
        return [(x, j, a) for x in lab.alive() for j, a in x.runner.running() if j.startswith(f"{array}_")]

    for _ in range(3):
        await lab.schedule()
    assert len(running()) == 2
    before = len(calls)
    for _ in range(4):  # nothing ended, no time passed: no transaction
        await lab.schedule()
    assert len(calls) == before
    host, job_id, attempt = running()[0]
    host.runner.exit(job_id, attempt)
    for _ in range(3):
        await lab.schedule()
    assert len(running()) == 2 and (await lab.job(owner, job_id)).status == "succeeded"
    assert len(calls) == before + 1, calls  # the end let one task in, with one transaction
    lab.clock.advance(REFRESH_S)
    await lab.schedule()
    assert len(calls) == before + 2  # counted again after REFRESH_S


@pytest.mark.asyncio
async def test_a_dependency_many_waiting_jobs_name_is_read_once_per_tick(lab: Lab,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """20 jobs wait for the same running job: a tick reads each waiting job's row and that job's once (it read
    the dependency once per waiting job: 2,000 waiting jobs of 64 dependencies each kept a core busy)."""
    owner = d(lab, "owner")
    first = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, first)).status == "running"
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "after": [first]}
    waiting = [(await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
               for _ in range(20)]
    gate = owner.services.owner.arrays.gate
    await lab.schedule()
    assert set(waiting) <= gate.waiting()
    reads: list[str] = []
    real = owner.store.jobs.get_job

    async def counted(job_id: str) -> Any:
        reads.append(job_id)
        return await real(job_id)

    monkeypatch.setattr(owner.store.jobs, "get_job", counted)
    await gate.tick()
    assert reads.count(first) == 1 and sorted(r for r in reads if r != first) == sorted(waiting), reads
    assert {(await lab.job(owner, j)).reason for j in waiting} == {f"Dependency: after {first} (running)"}
