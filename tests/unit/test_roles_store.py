"""The facts behind the roles: credible fair-share holdings (pure), and a worker's job ids bound to one
owner in its store (the grants keyed by owner, the run records refused for a job id of another owner)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayerd.core.fairshare import credible_holdings
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.store import SCHEMA_VERSION, JobRow, RemoteRunRow, Store
from gpulayerd.store.schema import MIGRATIONS
from tests.fakes.daemons import W1, Lab

holdings = st.dictionaries(st.sampled_from(["alice", "bob", "carol", "root"]),
                           st.tuples(st.integers(0, 10), st.integers(0, 10)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(holdings, st.sampled_from(["system", "personal", ""]), st.sampled_from(["", "alice", "bob"]),
       st.integers(0, 16), st.one_of(st.none(), st.integers(0, 16)))
def test_credible_holdings_only_for_users_it_may_speak_for_and_never_above_what_it_has(
        report: dict[str, tuple[int, int]], mode: str, user: str, gpus: int, slots: int | None) -> None:
    kept, why = credible_holdings(report, sender_mode=mode, sender_user=user, gpus_advertised=gpus,
                                  slots_advertised=slots)
    assert set(kept) <= set(report) and all(kept[u] == report[u] for u in kept)
    if mode == "personal":
        assert set(kept) <= {user} - {""}
    if mode not in ("system", "personal"):
        assert kept == {}
    assert sum(g for g, _ in kept.values()) <= gpus
    if slots is not None:
        assert sum(c for _, c in kept.values()) <= slots
    if kept != report:
        assert why  # whatever is not counted is said (logged once per sender)


def test_credible_holdings_examples() -> None:
    assert credible_holdings({"alice": (1, 0), "bob": (1, 2)}, sender_mode="system", sender_user="",
                             gpus_advertised=2, slots_advertised=4) == ({"alice": (1, 0), "bob": (1, 2)}, None)
    kept, why = credible_holdings({"alice": (1, 0), "bob": (1, 0)}, sender_mode="personal", sender_user="alice",
                                  gpus_advertised=2, slots_advertised=None)
    assert kept == {"alice": (1, 0)} and why is not None and "'bob'" in why
    kept, why = credible_holdings({"bob": (1_000_000, 1_000_000)}, sender_mode="system", sender_user="",
                                  gpus_advertised=1, slots_advertised=8)
    assert kept == {} and why is not None and "more than the 1 GPUs" in why


def _run(owner: str, job: str, attempt: int = 1) -> RemoteRunRow:
    return RemoteRunRow(owner=owner, job_id=job, attempt=attempt, spec_json='{"user": "bob"}', placement_json="{}",
                        lease_s=30.0, run_dir=f"/runs/{job}/{attempt}", state="running", started_at=1.0)


@pytest.mark.asyncio
async def test_a_job_id_belongs_to_one_owner_on_a_worker(tmp_path: Path) -> None:
    async with await Store.open(tmp_path / "w.db") as s:
        assert await s.runs.insert_remote_run(_run("ownerA", "j1"), [("GPU-1", 0, "cuda")], 1.0, node_id="me")
        # Another owner's run of the same job id (a reused or forged id): refused, nothing written.
        assert not await s.runs.insert_remote_run(_run("ownerB", "j1", 2), [("GPU-2", 1, "cuda")], 2.0, node_id="me")
        assert [(r.owner, r.attempt) for r in await s.runs.remote_runs()] == [("ownerA", 1)]
        assert [g.device_uuid for g in await s.runs.grants()] == ["GPU-1"]
        assert await s.runs.job_claims("j1") == [("ownerA", 1), ("ownerA", None)]
        assert await s.runs.held_user("j1") == "bob" and await s.runs.held_user("j2") is None
        # A job owned here is this node's: a peer's run of that id is refused, a gang member's (this node) is not.
        await s.jobs.insert_job(JobRow(id="mine1", status=JobStatus.QUEUED, spec_json="{}", lease_s=30.0,
                                       submitted_at=1.0, updated_at=1.0), "submitted")
        assert not await s.runs.insert_remote_run(_run("ownerA", "mine1"), [], 3.0, node_id="me")
        assert await s.runs.insert_remote_run(_run("me", "mine1"), [], 3.0, node_id="me")
        # Grants are released by (owner, job, attempt): another owner's end of the same ids releases nothing.
        await s.runs.end_remote_run("ownerB", "j1", 1, "exited", 0, "", 4.0)
        assert [g.device_uuid for g in await s.runs.grants()] == ["GPU-1"]
        await s.runs.end_remote_run("ownerA", "j1", 1, "exited", 0, "", 4.0)
        assert await s.runs.grants() == []


@pytest.mark.asyncio
async def test_schema_5_keys_existing_grants_by_their_runs_owner(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    try:
        for _, script in MIGRATIONS[:4]:
            con.executescript(script)
        con.execute("PRAGMA user_version = 4")
        con.execute("INSERT INTO remote_runs (owner, job_id, attempt, spec_json, placement_json, lease_s, run_dir, "
                    "state) VALUES ('ownerA', 'j1', 1, '{}', '{}', 30, '/r', 'running')")
        con.executemany("INSERT INTO grants (device_uuid, device_index, accelerator, job_id, attempt, granted_at) "
                        "VALUES (?, ?, 'cuda', ?, 1, 1.0)", [("GPU-1", 0, "j1"), ("GPU-2", 1, "local1")])
        con.commit()
    finally:
        con.close()
    async with await Store.open(path) as s:
        assert await s.runs.job_claims("j1") == [("ownerA", 1), ("ownerA", None)]
        assert await s.runs.job_claims("local1") == [("", None)]
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    finally:
        con.close()


# ------------------------------------------------------- role checks from memory (no read per message)


@pytest.mark.asyncio
async def test_after_an_owner_restart_the_holder_asking_again_is_let_through_from_memory(lab: Lab) -> None:
    """The claim role reads no row: recovery notes every active job's holder, so the holder whose
    grant reply was lost may ask again after a restart of the owner; another member may not."""
    from gpulayerd import routes
    from gpulayerd.net.transport import Sender
    from gpulayerd.net.wire import Claim, new_msg_id
    from tests.fakes.daemons import W2, d
    from tests.unit.test_route_table import running_on_w1

    job = await running_on_w1(lab)
    owner = await lab.restart(d(lab, "owner"))
    roles = owner.services.router._roles
    assert owner.services.jobs.holder_of(job) == (1, W1)  # noted by recovery
    holder, member = Sender(W1, "system", ""), Sender(W2, "system", "")
    assert await roles.check(routes.PEER["claim"], holder, Claim(msg_id=new_msg_id(), worker=W1, job_id=job)) is None
    why = await roles.check(routes.PEER["claim"], member, Claim(msg_id=new_msg_id(), worker=W2, job_id=job))
    assert why is not None and "was not offered to it" in why


@pytest.mark.asyncio
async def test_stored_runs_are_read_once_and_kept_exact(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "w.db")
    try:
        def run(owner: str, job: str, attempt: int) -> RemoteRunRow:
            return RemoteRunRow(owner=owner, job_id=job, attempt=attempt, spec_json="{}", placement_json="{}",
                                lease_s=30.0, run_dir=f"/r/{job}/{attempt}", state="running", started_at=1.0)

        assert await store.runs.insert_remote_run(run("o1", "j1", 1), [], 1.0)
        assert await store.runs.stored_runs("j1") == {("o1", 1)}  # the first look reads the table
        assert await store.runs.insert_remote_run(run("o1", "j1", 2), [], 2.0)  # kept in memory too
        assert await store.runs.insert_remote_run(run("o2", "j2", 1), [], 3.0)
        assert not await store.runs.insert_remote_run(run("o2", "j1", 3), [], 4.0)  # another owner's id: refused
        assert await store.runs.stored_runs("j1") == {("o1", 1), ("o1", 2)}
        assert await store.runs.stored_runs("j2") == {("o2", 1)} and await store.runs.stored_runs("none") == set()
    finally:
        await store.close()
