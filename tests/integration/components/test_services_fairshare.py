"""Fair share through the real services (loopback lab, fake clock, fake runner, fake GPUs).

Done-when of issue 11: alice queues 20 one-GPU jobs on a 2-GPU worker, then bob queues 2;
when a GPU frees, bob's job starts before alice's next one, and alice's waiting jobs show
the fair-share reason. ``max_gpus_per_user = 1`` keeps alice to one GPU there.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gpulayerd.models import DeviceModel, SubmitRequest
from gpulayerd.net.wire import Heartbeat
from tests.fakes.accounts import Account, Accounts
from tests.fakes.daemons import OWNER, W1, FakeDaemon, Lab, caps_for

LONG_LEASE_S = 3600.0  # the runs outlive the minutes the test steps through


def _two_gpus(d: FakeDaemon, lab: Lab) -> None:
    caps = caps_for(d.node_id, d.name, lab.clock.wall())
    caps.devices = [DeviceModel(accelerator="cuda", index=i, uuid=f"GPU-{d.name}-{i}", name="RTX 4090",
                                memory_total_bytes=24 * 10**9, execution_supported=True) for i in range(2)]
    d.services.machine.use_capabilities(caps)


@pytest_asyncio.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        await lab.close()
    assert lab.net.errors == []


@pytest.fixture
def people(accounts: Accounts) -> tuple[Account, Account]:
    """Two real accounts (system mode runs each job as its user): alice and bob."""
    return accounts.user("alice"), accounts.user("bob")


async def _submit(lab: Lab, d: FakeDaemon, who: Account, n: int) -> list[str]:
    ids = []
    user = who.name
    for i in range(n):
        spec: dict[str, Any] = {"command": ["/bin/sh", "-c", "true"], "workdir": str(who.home), "user": user,
                                "name": f"{user}-{i}", "requirements": {"accelerator": "cuda", "gpu_count": 1},
                                "policy": {"lease_s": LONG_LEASE_S}}
        view = await d.owner.submit(SubmitRequest(spec=spec, submitted_by=user))
        ids.append(view.id)
    await lab.settle()
    return ids


async def _running(lab: Lab, d: FakeDaemon, ids: list[str]) -> list[str]:
    return [j for j in ids if (await lab.job(d, j)).status == "running"]


async def _end_one(lab: Lab, d: FakeDaemon, job_id: str, on: FakeDaemon | None = None) -> None:
    """End the run of ``d``'s job ``job_id`` (on the worker ``on``, default ``d``) with exit 0."""
    view = await lab.job(d, job_id)
    (on or d).runner.exit(job_id, view.attempt, 0)
    await lab.settle()


@pytest.mark.asyncio
async def test_bob_goes_before_alices_next_job_and_alice_is_told_why(lab: Lab, people: tuple[Account, Account]) -> None:
    a, b = people
    ws = await lab.add("ws-2", W1, mode="system")
    _two_gpus(ws, lab)
    alice = await _submit(lab, ws, a, 20)
    await lab.step()
    assert await _running(lab, ws, alice) == alice[:2]
    await lab.run_for(1800, dt=60)  # alice holds both GPUs for half an hour
    bob = await _submit(lab, ws, b, 2)
    await lab.step()
    assert await _running(lab, ws, bob) == []  # nothing is free yet

    await _end_one(lab, ws, alice[0])
    await lab.step()
    assert await _running(lab, ws, bob) == [bob[0]]  # bob's first, not alice's third
    assert await _running(lab, ws, alice) == [alice[1]]
    usage = {u.user: u for u in await ws.services.api.async_users()}
    assert usage[a.name].gpu_hours == pytest.approx(1.0, abs=0.05)  # 2 GPUs × 30 min (decay: a day)
    for j in alice[2:]:
        # Both GPUs are held (by alice's second job and bob's first) and bob's second waits ahead:
        # bob goes first once a GPU frees up, and the holders are named.
        reason = (await lab.job(ws, j)).reason
        assert reason.startswith(f"FairShare: fair share: {b.name}'s jobs go first (less recent GPU use than "
                                 f"{a.name}); GPU 0 is granted to job "), reason
        assert alice[1] in reason and bob[0] in reason, reason
    explained = await ws.services.owner.explain(alice[2])  # what `gpulayer explain` shows
    assert "FAIR_SHARE" in [r.code for w in explained.workers for r in w.rejections], explained.workers

    await _end_one(lab, ws, alice[1])
    await lab.step()
    assert await _running(lab, ws, bob) == bob  # bob's second before alice's third as well
    assert await _running(lab, ws, alice) == []

    users = await ws.services.api.async_users()
    assert [(u.user, u.rank, u.jobs_queued, u.jobs_running) for u in users] == [
        (b.name, 1, 0, 2), (a.name, 2, 18, 0)]
    assert [(h.host, h.gpus) for h in users[0].holding] == [("ws-2", 2)]


@pytest.mark.asyncio
async def test_max_gpus_per_user_keeps_alice_to_one_gpu(lab: Lab, people: tuple[Account, Account]) -> None:
    a, b = people
    ws = await lab.add("ws-2", W1, mode="system", max_gpus_per_user=1)
    _two_gpus(ws, lab)
    alice = await _submit(lab, ws, a, 3)
    await lab.run_for(5)
    assert await _running(lab, ws, alice) == alice[:1]  # the second GPU stays free
    for j in alice[1:]:
        assert (await lab.job(ws, j)).reason == f"UserCap: fair share: {a.name} holds 1 of max 1 GPUs on ws-2"
    bob = await _submit(lab, ws, b, 1)
    await lab.step()
    assert await _running(lab, ws, bob) == bob


@pytest.mark.asyncio
async def test_a_worker_takes_the_offer_of_the_user_with_less_usage_first(lab: Lab, people: tuple[Account, Account]) -> None:
    a, b = people
    owner = await lab.add("owner", OWNER, cpu_slots=1, mode="system")  # no GPU: offers its jobs to ws-2
    ws = await lab.add("ws-2", W1, mode="system")
    _two_gpus(ws, lab)
    await lab.net.heartbeat()
    alice = await _submit(lab, owner, a, 4)
    await lab.run_for(3)
    first = await _running(lab, owner, alice)  # (offers submitted at one fake instant arrive in any order)
    assert len(first) == 2, first
    await lab.run_for(600, dt=60)
    bob = await _submit(lab, owner, b, 1)
    await lab.run_for(3)  # the owner offers everything queued; ws-2 keeps the offers
    await _end_one(lab, owner, first[0], on=ws)
    await lab.run_for(3)
    assert await _running(lab, owner, bob) == bob
    assert await _running(lab, owner, alice) == [first[1]]


def test_heartbeat_holdings_are_bounded() -> None:
    base = {"msg_id": "m", "node_id": "n", "name": "h", "version": "1", "cluster": "c", "port": 1}
    assert Heartbeat.model_validate({**base, "holdings": {"alice": [1, 2]}}).holdings == {"alice": (1, 2)}
    with pytest.raises(ValueError, match="at most 256 users"):
        Heartbeat.model_validate({**base, "holdings": {f"u{i}": [1, 0] for i in range(257)}})
    with pytest.raises(ValueError, match="must be 0 to 1000000"):
        Heartbeat.model_validate({**base, "holdings": {"alice": [-1, 0]}})


@pytest.mark.asyncio
async def test_a_peers_report_counts_only_under_its_own_node_id(lab: Lab) -> None:
    ws = await lab.add("ws-2", W1, mode="system")
    usage = ws.services.usage
    assert usage is not None
    usage.report(OWNER, {"carol": (2, 0)}, "ws-1")
    usage.report(W1, {"mallory": (8, 0)}, "forged")  # a report "from" this node itself is ignored
    lab.clock.advance(10)
    held = usage.held_now()
    assert held == {"carol": {OWNER: (2, 0)}}
    assert usage.usage()["carol"].gpu_s == pytest.approx(20.0, rel=1e-3)


def test_users_table_names_priority_usage_and_holdings() -> None:
    from gpulayerd.cli.users import render_users, usage_words
    from gpulayerd.models import UserHoldingView, UserUsageView

    rows = [UserUsageView(user="bob", gpu_hours=0.24, rank=1, jobs_running=1,
                          holding=[UserHoldingView(node_id="n2", host="ws-2", gpus=1)]),
            UserUsageView(user="alice", gpu_hours=6.1, cpu_slot_hours=2.0, rank=2, jobs_queued=18,
                          holding=[UserHoldingView(node_id="n2", host="ws-2", gpus=1, cpu_slots=2)])]
    lines = render_users(rows).splitlines()
    assert lines[0].split() == ["USER", "PRIORITY", "GPU", "USE", "SLOT", "USE", "QUEUED", "RUNNING", "HOLDS"]
    assert lines[1].split() == ["bob", "1", "0.2", "h", "0", "s", "0", "1", "ws-2:", "1", "GPU"]
    assert lines[2].split() == ["alice", "2", "6.1", "h", "2.0", "h", "18", "0", "ws-2:", "1", "GPU", "+", "2", "slots"]
    # Below 0.1 hour in seconds: two users 0.06 and 0.08 GPU-hours apart are told apart.
    assert [usage_words(h) for h in (0.0, 0.0001, 0.06, 0.08, 0.0999, 0.1)] == [
        "0 s", "0 s", "216 s", "288 s", "360 s", "0.1 h"]
    assert render_users([]).startswith("no users known yet")


@pytest.mark.asyncio
async def test_usage_survives_a_restart_decayed_over_the_downtime(lab: Lab, people: tuple[Account, Account]) -> None:
    a, _ = people
    half_life_s = 3600.0
    ws = await lab.add("ws-2", W1, mode="system", fairshare_half_life_s=half_life_s)
    _two_gpus(ws, lab)
    alice = await _submit(lab, ws, a, 2)
    await lab.step()
    await lab.run_for(600, dt=60)  # 2 GPUs for 10 minutes: 1,200 GPU-s (less their decay)
    await _end_one(lab, ws, alice[0])
    await _end_one(lab, ws, alice[1])
    await lab.step()
    assert ws.services.usage is not None
    before = ws.services.usage.usage()[a.name].gpu_s
    assert 1000 < before < 1200
    await ws.services.usage.save()  # (what a shutdown does; the lease tick saves every 30 s)
    await lab.stop(ws)
    lab.clock.advance(half_life_s)  # down for one half-life
    ws = await lab.restart(ws)
    assert ws.services.usage is not None
    after = ws.services.usage.usage()[a.name].gpu_s
    assert after == pytest.approx(before / 2, rel=1e-3)
    assert [(u.user, u.gpu_hours) for u in await ws.services.api.async_users()] == [(a.name, pytest.approx(after / 3600))]


@pytest.mark.asyncio
async def test_a_run_shorter_than_a_tick_counts_to_the_second(lab: Lab, people: tuple[Account, Account]) -> None:
    a, _ = people
    ws = await lab.add("ws-2", W1, mode="system")
    _two_gpus(ws, lab)
    [job] = await _submit(lab, ws, a, 1)
    await lab.schedule()  # claimed and started, no time passing
    assert (await lab.job(ws, job)).status == "running"
    lab.clock.advance(0.4)  # no lease tick meanwhile
    view = await lab.job(ws, job)
    ws.runner.exit(job, view.attempt, 0)
    await lab.settle()
    assert ws.services.usage is not None
    assert ws.services.usage.usage()[a.name].gpu_s == pytest.approx(0.4, rel=1e-3)


def test_the_saved_book_is_restored_decayed_and_added() -> None:
    from gpulayerd.core.fairshare import Usage, UsageBook, restored, usage_at

    book = UsageBook(half_life_s=100.0)
    book = restored(book, {"alice": Usage(gpu_s=800.0, cpu_slot_s=80.0), "bob": Usage()}, age_s=200.0, now=5.0)
    assert usage_at(book, 5.0) == {"alice": Usage(gpu_s=pytest.approx(200.0), cpu_slot_s=pytest.approx(20.0))}
    book = restored(book, {"alice": Usage(gpu_s=100.0)}, age_s=-50.0, now=5.0)  # a clock set back: no growth
    assert usage_at(book, 105.0)["alice"].gpu_s == pytest.approx(150.0)


@pytest.mark.asyncio
async def test_a_saved_row_that_cannot_be_usage_is_dropped_at_restart(lab: Lab) -> None:
    """Attack (issue 31): rows of the saved book that no save writes (an infinite, negative or
    non-numeric value, as a damaged or edited store may hold) neither stop the daemon from starting
    nor rank a user last forever (an infinite usage never decays); the good rows are restored."""
    import sqlite3

    ws = await lab.add("ws-2", W1, mode="system")
    assert ws.services.usage is not None
    await ws.services.usage.save()
    await lab.stop(ws)
    with sqlite3.connect(ws.config.db_path) as conn:
        conn.executemany("INSERT INTO usage (user, gpu_s, cpu_slot_s, at) VALUES (?, ?, ?, ?)",
                         [("inf", float("inf"), 0.0, lab.clock.wall()), ("neg", -5.0, -1.0, lab.clock.wall()),
                          ("junk", "junk", 0.0, lab.clock.wall()), ("when", 1.0, 0.0, "yesterday"),
                          ("carol", 360.0, 0.0, lab.clock.wall())])
    ws = await lab.restart(ws)
    assert ws.services.usage is not None
    assert set(ws.services.usage.usage()) == {"carol"}
    assert ws.services.usage.usage()["carol"].gpu_s == pytest.approx(360.0)


def test_a_restored_figure_that_is_not_a_finite_number_counts_as_none() -> None:
    from gpulayerd.core.fairshare import Usage, UsageBook, restored, usage_at

    saved = {"inf": Usage(gpu_s=math.inf), "nan": Usage(gpu_s=math.nan, cpu_slot_s=-math.inf),
             "carol": Usage(gpu_s=100.0, cpu_slot_s=math.nan)}
    book = restored(UsageBook(half_life_s=100.0), saved, age_s=math.nan, now=5.0)
    assert usage_at(book, 5.0) == {"carol": Usage(gpu_s=pytest.approx(100.0))}
    book = restored(UsageBook(half_life_s=100.0), {"carol": Usage(gpu_s=100.0)}, age_s=math.inf, now=5.0)
    assert usage_at(book, 5.0) == {}  # saved forever ago (a clock set far forward): decayed to nothing
