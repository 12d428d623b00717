"""Who vouches for a user across machines, and a worker runs a job only as the job's user's local account.

Real services over the loopback network (tests/fakes): each node's certificate word (mode,
bound user) travels with its offers and holds as the mutual-TLS peer API gives it.
"""

from __future__ import annotations

import contextlib
import pwd
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.app.worker.accounts import MAX_MISSING, Accounts
from gpulayerd.errors import PeerRefused
from gpulayerd.models import SubmitRequest
from gpulayerd.net.transport import OFFER
from gpulayerd.net.wire import Offer, new_msg_id
from tests.fakes.clock import FakeClock
from tests.fakes.daemons import OWNER, W1, Lab, d, view

NO_SUCH_USER = "glnosuch-alice"


@contextlib.asynccontextmanager
async def two_daemons(tmp_path: Path, owner: dict[str, Any], worker: dict[str, Any]) -> AsyncIterator[Lab]:
    """An owner (1 CPU slot) and a worker w1 (2), with the given DaemonConfig settings each."""
    lab = Lab(tmp_path)
    await lab.add("owner", OWNER, cpu_slots=1, **owner)
    await lab.add("w1", W1, cpu_slots=2, **worker)
    await lab.net.heartbeat()
    try:
        yield lab
    finally:
        await lab.close()
    assert lab.net.errors == []


async def submit_as(lab: Lab, user: str) -> str:
    """A CPU job of ``user`` on the owner (as the owner daemon records a submitter's user)."""
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "user": user,
            "policy": {"retries": 0, "lease_s": 10.0}}
    v = await d(lab, "owner").services.owner.submit(SubmitRequest(spec=spec, submitted_by=user))
    await lab.settle()
    return v.id


async def no_room_on_the_owner(lab: Lab) -> None:
    """The owner has no interpreter: its jobs must go to a peer."""
    machine = d(lab, "owner").services.machine
    machine.use_capabilities((await machine.capabilities()).model_copy(update={"environments": []}))
    await lab.settle()


def offers_to(lab: Lab, target: str) -> list[str]:
    return [c.outcome for c in lab.net.calls if c.path == "/v1/peer/offer" and c.target == target]


@pytest.mark.asyncio
async def test_personal_node_of_bob_cannot_send_alices_job_to_a_system_worker(tmp_path: Path) -> None:
    async with two_daemons(tmp_path, {}, {"mode": "system"}) as lab:
        owner, w1 = d(lab, "owner"), d(lab, "w1")
        owner.node.mode, owner.node.user = "personal", "bob"  # its certificate: bob's personal node
        job = await submit_as(lab, "alice")
        await lab.run_for(6)

        assert offers_to(lab, W1), "the owner offered the job to w1"
        assert [c for c in lab.net.calls if c.path in ("/v1/peer/claim", "/v1/peer/hold")] == []
        assert w1.runner.get(job, 1) is None
        assert await w1.store.runs.remote_run(OWNER, job, 1) is None
        assert (await view(lab, job)).status == "queued"
        assert w1.services.signals.stats["refused_offer"] >= 1
        # What the worker answers, and that nothing of it is kept.
        offer = Offer(msg_id=new_msg_id(), owner=OWNER, job_id=job, lease_s=10.0,
                      spec={"command": ["true"], "workdir": str(lab.workdir), "user": "alice"})
        with pytest.raises(PeerRefused) as refused:  # the offer's role: the owner vouches for the job's user
            await w1.node.dispatch(OFFER, OWNER, offer, mode="personal", user="bob")
        assert refused.value.reason == ("owner is bob's personal-mode node: it cannot send jobs of "
                                        "'alice' (only a system-mode node vouches for other users)")
        assert w1.services.worker.offers_kept() == {}
        await w1.services.worker.take_offers()
        await lab.settle()
        assert [c for c in lab.net.calls if c.path == "/v1/peer/claim"] == []
        # The user's name is never advertised as a missing account: it was refused before any lookup.
        assert "alice" not in (await w1.services.machine.capabilities()).missing_accounts


@pytest.mark.asyncio
async def test_a_system_node_vouches_and_the_job_runs_as_its_user(tmp_path: Path) -> None:
    async with two_daemons(tmp_path, {"mode": "system"}, {"mode": "system", "allow_root_jobs": True}) as lab:
        job = await submit_as(lab, "root")
        explained = await d(lab, "owner").services.owner.explain(job)
        own = next(w for w in explained.workers if w.worker == OWNER)
        assert [r.message for r in own.rejections] == ["owner does not run root's jobs (allow_root_jobs is off)"]

        async def running_on_w1() -> bool:
            return d(lab, "w1").runner.get(job, 1) is not None

        await lab.run_until("the job runs on w1", running_on_w1, limit_s=10)
        run = await d(lab, "w1").store.runs.remote_run(OWNER, job, 1)
        assert run is not None and '"user":"root"' in run.spec_json.replace(" ", "")


@pytest.mark.asyncio
async def test_a_job_without_user_from_a_personal_node_is_its_users(tmp_path: Path) -> None:
    async with two_daemons(tmp_path, {}, {}) as lab:  # both personal, as root (the tests' account)
        await no_room_on_the_owner(lab)
        job = await lab.submit(d(lab, "owner"))

        async def running_on_w1() -> bool:
            return d(lab, "w1").runner.get(job, 1) is not None

        await lab.run_until("the job runs on w1", running_on_w1, limit_s=10)
        run = await d(lab, "w1").store.runs.remote_run(OWNER, job, 1)
        assert run is not None and '"user":"root"' in run.spec_json.replace(" ", "")


@pytest.mark.asyncio
async def test_worker_without_the_account_refuses_and_explain_says_so(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        pwd.getpwnam(NO_SUCH_USER)
    async with two_daemons(tmp_path, {"mode": "system"}, {"mode": "system"}) as lab:
        owner, w1 = d(lab, "owner"), d(lab, "w1")
        await no_room_on_the_owner(lab)
        job = await submit_as(lab, NO_SUCH_USER)
        await lab.run_for(6)

        assert offers_to(lab, W1)
        assert w1.runner.get(job, 1) is None
        assert await w1.store.runs.remote_run(OWNER, job, 1) is None
        assert NO_SUCH_USER in (await w1.services.machine.capabilities()).missing_accounts
        explained = await owner.services.owner.explain(job)
        row = next(w for w in explained.workers if w.worker == W1)
        assert row.state == "no_fit"
        assert [(r.code, r.message) for r in row.rejections] == [("NO_ACCOUNT", f"no account '{NO_SUCH_USER}' on w1")]
        # Once the owner knows, it stops offering there.
        sent = len(offers_to(lab, W1))
        await lab.run_for(6)
        assert len(offers_to(lab, W1)) == sent
        assert (await view(lab, job)).status == "queued"


@pytest.mark.asyncio
async def test_personal_worker_refuses_another_users_job_even_from_a_system_node(tmp_path: Path) -> None:
    async with two_daemons(tmp_path, {"mode": "system"}, {}) as lab:
        w1 = d(lab, "w1")
        offer = Offer(msg_id=new_msg_id(), owner=OWNER, job_id="j1", lease_s=10.0,
                      spec={"command": ["true"], "workdir": str(lab.workdir), "user": "alice"})
        ack = await w1.node.dispatch(OFFER, OWNER, offer, mode="system", user="")
        assert not ack.ok and ack.reason == "this gpulayerd runs only root's jobs; the job is alice's"
        explained_row = (await d(lab, "owner").services.owner.explain(await submit_as(lab, "alice"))).workers
        w1_row = next(w for w in explained_row if w.worker == W1)
        assert [r.message for r in w1_row.rejections] == ["gpulayerd on w1 runs only root's jobs"]


# ------------------------------------------------------------------ the account cache


@pytest.mark.asyncio
async def test_missing_accounts_are_bounded_and_expire() -> None:
    clock = FakeClock()
    looked: list[str] = []

    def exists(name: str) -> bool:
        looked.append(name)
        return name == "alice"

    acc = Accounts(clock, mode="system", user="", lookup_ttl_s=60.0, missing_ttl_s=600.0, exists=exists)
    assert await acc.exists("alice")
    assert not await acc.exists("bob")
    assert acc.missing() == {"bob"}
    assert not await acc.exists("bob")
    assert looked == ["alice", "bob"]  # the second answer came from the cache
    for i in range(MAX_MISSING + 10):
        await acc.exists(f"u{i}")
    assert len(acc.missing()) == MAX_MISSING
    assert "bob" not in acc.missing()  # the oldest went first
    clock.advance(601.0)
    assert acc.missing() == frozenset()


@pytest.mark.asyncio
async def test_an_account_created_later_is_seen() -> None:
    clock = FakeClock()
    known: set[str] = set()
    acc = Accounts(clock, mode="system", user="", lookup_ttl_s=60.0, exists=lambda n: n in known)
    assert not await acc.exists("carol")
    known.add("carol")
    clock.advance(61.0)
    assert await acc.exists("carol")
    assert acc.missing() == frozenset()
