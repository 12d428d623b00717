"""A slot freed by this node's own array task goes to the array's next task without a pass
(:meth:`Scheduler.react`, :mod:`gpulayerd.core.scheduling.successor`), on in-process daemons: only when
nothing else asked for a pass; the end of any other job, a submit, or another user's job first in
fair-share order leaves the slot to a pass."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpulayerd.app.common.signals import Signals
from gpulayerd.models import SubmitRequest
from gpulayerd.runs.runner import RunnerError
from tests.fakes.daemons import OWNER, FakeDaemon, Lab


@pytest_asyncio.fixture
async def alone(tmp_path: Path) -> AsyncIterator[tuple[Lab, FakeDaemon, list[int]]]:
    """One daemon with 2 CPU slots, and a count of the passes its scheduler runs."""
    lab = Lab(tmp_path)
    try:
        owner = await lab.add("owner", OWNER, cpu_slots=2)
        passes = [0]
        scheduler = owner.services.scheduler
        real = scheduler.run_once

        async def counted() -> None:
            passes[0] += 1
            await real()

        scheduler.run_once = counted  # type: ignore[method-assign]
        yield lab, owner, passes
    finally:
        await lab.close()


async def _submit(lab: Lab, owner: FakeDaemon, **extra: Any) -> str:
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), **extra}
    view = await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))
    await lab.settle()
    return view.id


def _running(owner: FakeDaemon) -> list[str]:
    return [j for j, _ in owner.runner.running()]


async def _end(lab: Lab, owner: FakeDaemon, job_id: str) -> None:
    """``job_id`` exits 0 here; its end is recorded and reported (to this owner)."""
    owner.runner.exit(job_id, 1)
    await lab.settle()


async def _react(lab: Lab, owner: FakeDaemon) -> None:
    await owner.services.scheduler.react(True)
    await lab.settle()


async def _array(lab: Lab, owner: FakeDaemon, expr: str, **extra: Any) -> str:
    """An array submitted and let run (its submit asked for a pass; then its tasks were written)."""
    array = await _submit(lab, owner, array=expr, **extra)
    for _ in range(3):
        await _react(lab, owner)
    return array


@pytest.mark.asyncio
async def test_a_tasks_end_starts_the_next_task_without_a_pass(alone: tuple[Lab, FakeDaemon, list[int]]) -> None:
    lab, owner, passes = alone
    array = await _array(lab, owner, "0-4")
    assert _running(owner) == [f"{array}_0", f"{array}_1"]
    stats, before = owner.services.signals.stats, passes[0]
    assert before >= 1
    for n in range(3):  # each end: the next task, no pass (the store's claim as ever: attempt 1, running)
        await _end(lab, owner, f"{array}_{n}")
        await _react(lab, owner)
        assert _running(owner) == [f"{array}_{n + 1}", f"{array}_{n + 2}"]
        assert stats["scheduler_successor_claims"] == n + 1
    assert passes[0] == before
    view = await lab.job(owner, f"{array}_3")
    assert view.status == "running" and [a.worker for a in view.attempts] == [OWNER]
    assert (await lab.job(owner, f"{array}_0")).status == "succeeded"
    # The last task's end has no task to give its slot to: a pass (nothing queued; nothing claimed).
    for n in (3, 4):
        await _end(lab, owner, f"{array}_{n}")
        await _react(lab, owner)
    assert _running(owner) == [] and passes[0] > before
    assert stats["scheduler_successor_claims"] == 3


@pytest.mark.asyncio
async def test_anything_else_that_asked_for_a_pass_gets_one(alone: tuple[Lab, FakeDaemon, list[int]]) -> None:
    lab, owner, passes = alone
    array = await _array(lab, owner, "0-5")
    assert _running(owner) == [f"{array}_0", f"{array}_1"]
    stats = owner.services.signals.stats

    # A submit meanwhile asked for a pass: the freed slot is the pass's (it claims the next task, first in order).
    plain = await _submit(lab, owner)
    before = passes[0]
    await _end(lab, owner, f"{array}_0")
    await _react(lab, owner)
    assert passes[0] == before + 1 and stats["scheduler_successor_claims"] == 0
    assert _running(owner) == [f"{array}_1", f"{array}_2"]

    # A freed slot of a job that is no array's task: a pass.
    await owner.services.owner.cancel(array)
    await lab.settle()
    for _ in range(2):
        await _react(lab, owner)
    assert _running(owner) == [plain]
    before = passes[0]
    await _end(lab, owner, plain)
    await _react(lab, owner)
    assert passes[0] == before + 1 and stats["scheduler_successor_claims"] == 0


@pytest.mark.asyncio
async def test_a_peers_offer_kept_here_leaves_the_slot_to_a_pass(alone: tuple[Lab, FakeDaemon, list[int]]) -> None:
    """A peer's job waits here (its offer is kept): the pass orders it against this node's own users."""
    lab, owner, passes = alone
    array = await _array(lab, owner, "0-3")
    worker = owner.services.worker
    worker._offers[("b" * 52, "peerjob")] = object()  # (its contents are not read: only that one is kept)
    try:
        assert worker.has_offers()
        before = passes[0]
        await _end(lab, owner, f"{array}_0")
        assert await owner.services.scheduler._successors([f"{array}_0"]) is False
        assert owner.services.signals.stats["scheduler_successor_claims"] == 0 and passes[0] == before
        assert _running(owner) == [f"{array}_1"]
    finally:
        worker._offers.pop(("b" * 52, "peerjob"), None)


@pytest.mark.asyncio
async def test_a_start_that_fails_frees_its_slot_for_a_pass(tmp_path: Path) -> None:
    """A run here that could not start (command not found) ends without a run's end being watched: its
    slot is free again and a pass is asked for, so the next job starts (the owner's end asks for none)."""
    lab = Lab(tmp_path)
    try:
        owner = await lab.add("owner", OWNER, cpu_slots=1)
        scheduler, signals = owner.services.scheduler, owner.services.signals
        first = await _submit(lab, owner)
        second = await _submit(lab, owner)
        owner.runner.start_errors[first] = RunnerError("command not found: train")
        await _react(lab, owner)
        assert (await lab.job(owner, first)).status == "failed" and _running(owner) == []
        assert signals.woken()  # (as the scheduler's loop reads it)
        await scheduler.react(signals.woken())
        await lab.settle()
        assert _running(owner) == [second]
    finally:
        await lab.close()


@pytest.mark.asyncio
async def test_successor_claims_never_hold_off_the_pass_the_timer_owes(
        alone: tuple[Lab, FakeDaemon, list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks that end more often than ``schedule_interval_s``: once that long has passed since the last pass,
    the next end gets a pass when the core is busy (what it waits on reports no event), and a successor
    claim when it calls a timer pass idle."""
    lab, owner, passes = alone
    scheduler, stats = owner.services.scheduler, owner.services.signals.stats
    array = await _array(lab, owner, "0-7")
    busy = [True]
    monkeypatch.setattr(scheduler, "_idle", lambda: not busy[0])
    interval = owner.config.schedule_interval_s
    before = passes[0]
    await _end(lab, owner, f"{array}_0")
    lab.clock.advance(interval / 2)
    await _react(lab, owner)
    assert (stats["scheduler_successor_claims"], passes[0]) == (1, before)
    lab.clock.advance(interval / 2)  # the timer's pass is due now, and the core is busy
    await _end(lab, owner, f"{array}_1")
    await _react(lab, owner)
    assert (stats["scheduler_successor_claims"], passes[0]) == (1, before + 1)
    assert _running(owner) == [f"{array}_2", f"{array}_3"]  # (the pass claimed it)
    lab.clock.advance(interval)
    busy[0] = False  # due again, but the core calls a timer pass idle: a successor
    await _end(lab, owner, f"{array}_2")
    await _react(lab, owner)
    assert (stats["scheduler_successor_claims"], passes[0]) == (2, before + 1)
    assert _running(owner) == [f"{array}_3", f"{array}_4"]


@pytest.mark.asyncio
async def test_a_task_queued_again_for_its_retry_gets_a_pass(alone: tuple[Lab, FakeDaemon, list[int]]) -> None:
    """A task that failed is queued again, as its array's retry policy says (``retry_on = ["failed"]``: tasks
    once kept only the default, lost attempts only), which asked for a pass: its slot is the pass's."""
    lab, owner, passes = alone
    array = await _array(lab, owner, "0-3", policy={"retries": 1, "retry_on": ["failed"]})
    before, stats = passes[0], owner.services.signals.stats
    owner.runner.exit(f"{array}_0", 1, code=1)
    await lab.settle()
    assert (await lab.job(owner, f"{array}_0")).status == "queued"
    await _react(lab, owner)
    assert passes[0] == before + 1 and stats["scheduler_successor_claims"] == 0
    assert len(_running(owner)) == 2


@pytest.mark.asyncio
async def test_signals_tell_a_wake_up_of_peers_alone_from_one_of_this_node() -> None:
    signals = Signals()
    signals.clear_wake()
    signals.peer_wake()
    assert signals.woken() and signals.peers_only() and signals.take_freed() == ([], True)
    signals.peer_wake()
    signals.wake()  # this node's own: the pass is not held
    assert signals.woken() and not signals.peers_only()
    signals.clear_wake()
    assert not signals.woken() and not signals.peers_only()
    signals.slot_freed("a_1")
    assert not signals.peers_only()
    signals.clear_wake()
    signals.peer_wake()
    await signals.wait_local(0)  # (times out at once: only a peer asked)
    assert signals.peers_only()
