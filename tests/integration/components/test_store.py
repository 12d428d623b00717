"""The SQLite store: migrations, compare-and-set, atomic claims, history, crash safety."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobRecord, JobStatus, PersistJob
from gpulayerd.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    AmbiguousJobId,
    JobNotFound,
    JobRow,
    Store,
    StoreError,
    schema,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
T0 = 1_700_000_000.0  # a fixed wall-clock time


def job(job_id: str, status: JobStatus = JobStatus.QUEUED, **kw: object) -> JobRow:
    fields: dict[str, object] = {"spec_json": "{}", "lease_s": 30.0, "submitted_at": T0, "updated_at": T0}
    fields.update(kw)
    return JobRow(id=job_id, status=status, **fields)  # type: ignore[arg-type]


def claim_action(row: JobRow, worker: str = "w1", now: float = 100.0) -> PersistJob:
    actions = claims.handle(row.record(), claims.ClaimRequested(worker, stimulus_id=f"claim-{worker}"), now)
    persist = actions[0]
    assert isinstance(persist, PersistJob)
    return persist


def tables(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()


def user_version(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute("PRAGMA user_version").fetchone()[0])
    finally:
        con.close()


# ------------------------------------------------------------------------ migrations


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    assert [v for v, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert len(MIGRATIONS) == SCHEMA_VERSION


@pytest.mark.asyncio
async def test_empty_db_migrates_to_head(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await Store.open(path) as s:
        assert await s.integrity_check() == "ok"
        assert await s.jobs.counts() == {st.value: 0 for st in JobStatus}
    assert user_version(path) == SCHEMA_VERSION
    assert {"jobs", "attempts", "events", "grants"} <= tables(path)
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()


@pytest.mark.asyncio
async def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with await Store.open(path) as s:
        stored = await s.jobs.insert_job(job("a1", name="train"), "submitted by alice")
    async with await Store.open(path) as s:
        assert await s.jobs.get_job("a1") == stored
        assert [e.kind for e in await s.jobs.events("a1")] == ["submitted"]
    assert user_version(path) == SCHEMA_VERSION


@pytest.mark.asyncio
async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(StoreError, match="newer than this gpulayerd knows"):
        await Store.open(path)
    assert user_version(path) == SCHEMA_VERSION + 1  # left untouched


@pytest.mark.asyncio
async def test_older_db_migrates_forward_keeping_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    async with await Store.open(path) as s:
        await s.jobs.insert_job(job("a1"), "submitted")
    extra = (SCHEMA_VERSION + 1, "CREATE TABLE extra (x INTEGER); INSERT INTO extra VALUES (7);")
    monkeypatch.setattr(schema, "MIGRATIONS", (*MIGRATIONS, extra))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    async with await Store.open(path) as s:
        assert (await s.jobs.get_job("a1")) is not None
    assert user_version(path) == SCHEMA_VERSION + 1
    assert "extra" in tables(path)


@pytest.mark.asyncio
async def test_failed_migration_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.db"
    async with await Store.open(path):
        pass
    broken = (SCHEMA_VERSION + 1, "CREATE TABLE half (x INTEGER); INSERT INTO no_such_table VALUES (1);")
    monkeypatch.setattr(schema, "MIGRATIONS", (*MIGRATIONS, broken))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(StoreError, match="cannot migrate"):
        await Store.open(path)
    assert user_version(path) == SCHEMA_VERSION
    assert "half" not in tables(path)


@pytest.mark.asyncio
async def test_closed_store_raises_and_close_is_idempotent(tmp_path: Path) -> None:
    s = await Store.open(tmp_path / "s.db")
    await s.close()
    await s.close()
    with pytest.raises(StoreError, match="closed"):
        await s.jobs.get_job("x")


# ------------------------------------------------------------------------------ jobs


@pytest.mark.asyncio
async def test_insert_get_and_list_in_submission_order(store: Store) -> None:
    ids = ["c3", "a1", "b2", "d4"]
    for i, job_id in enumerate(ids):
        status = JobStatus.REJECTED if job_id == "b2" else JobStatus.QUEUED
        stored = await store.jobs.insert_job(job(job_id, status), f"submitted {job_id}")
        assert stored.seq == i + 1
    row = await store.jobs.get_job("a1")
    assert row is not None
    assert (row.id, row.seq, row.status, row.spec_json, row.cancel_requested) == (
        "a1",
        2,
        JobStatus.QUEUED,
        "{}",
        False,
    )
    assert await store.jobs.get_job("zz") is None
    assert [r.id for r in await store.jobs.list_jobs()] == ids
    assert [r.id for r in await store.jobs.list_jobs(limit=2)] == ["c3", "a1"]
    assert [r.id for r in await store.jobs.list_jobs(newest_first=True, limit=2)] == ["d4", "b2"]
    assert [r.id for r in await store.jobs.list_jobs([JobStatus.QUEUED])] == ["c3", "a1", "d4"]
    assert [r.id for r in await store.jobs.list_jobs({JobStatus.REJECTED, JobStatus.RUNNING})] == ["b2"]
    assert await store.jobs.list_jobs([]) == []
    assert (await store.jobs.counts())["queued"] == 3


@pytest.mark.asyncio
async def test_insert_round_trips_every_field(store: Store) -> None:
    row = job(
        "full",
        JobStatus.QUEUED,
        name="n",
        submitted_by="alice",
        attempt=0,
        retries_left=2,
        lease_s=12.5,
        reason="waiting",
        explanation_json='{"x": 1}',
        submitted_at=T0 + 1,
        updated_at=T0 + 2,
        seq=None,
    )
    stored = await store.jobs.insert_job(row, "submitted")
    assert stored == replace(row, seq=1)
    assert await store.jobs.get_job("full") == stored
    assert stored.record() == JobRecord("full", JobStatus.QUEUED, retries_left=2, lease_s=12.5)


@pytest.mark.asyncio
async def test_submitted_event_and_rejection_reason(store: Store) -> None:
    await store.jobs.insert_job(job("ok"), "submitted by alice", stimulus_id="submit-ok")
    await store.jobs.insert_job(job("bad", JobStatus.REJECTED), "needs 80 GB; the largest GPU has 24 GB")
    [ev] = await store.jobs.events("ok")
    assert (ev.kind, ev.from_status, ev.to_status, ev.reason, ev.stimulus_id, ev.at) == (
        "submitted",
        None,
        JobStatus.QUEUED,
        "submitted by alice",
        "submit-ok",
        T0,
    )
    bad = await store.jobs.get_job("bad")
    assert bad is not None
    assert bad.reason == "needs 80 GB; the largest GPU has 24 GB"
    [ev] = await store.jobs.events("bad")
    assert (ev.to_status, ev.reason) == (JobStatus.REJECTED, "needs 80 GB; the largest GPU has 24 GB")


@pytest.mark.asyncio
async def test_duplicate_id_is_refused_without_a_second_event(store: Store) -> None:
    await store.jobs.insert_job(job("a1"), "first")
    with pytest.raises(StoreError, match="already exists") as info:
        await store.jobs.insert_job(job("a1"), "second")
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert [e.reason for e in await store.jobs.events("a1")] == ["first"]
    assert (await store.jobs.insert_job(job("b2"), "next")).seq == 2


@pytest.mark.asyncio
async def test_resolve_job_id(store: Store) -> None:
    for job_id in ["abc123", "abd456", "abc", "x1", "x2", "x3", "x4", "x5", "x6", "y"]:
        await store.jobs.insert_job(job(job_id), "submitted")
    assert await store.jobs.resolve_job_id("abd") == "abd456"
    assert await store.jobs.resolve_job_id("abc1") == "abc123"
    assert await store.jobs.resolve_job_id("abc") == "abc"  # an exact id wins over longer ones
    assert await store.jobs.resolve_job_id("y") == "y"
    with pytest.raises(AmbiguousJobId, match="abc, abc123, abd456"):
        await store.jobs.resolve_job_id("ab")
    with pytest.raises(AmbiguousJobId) as info:
        await store.jobs.resolve_job_id("x")
    assert "x1, x2, x3, x4, x5, ..." in str(info.value)
    assert "x6" not in str(info.value)
    for missing in ["z", "abe", "abc1234", ""]:
        with pytest.raises(JobNotFound):
            await store.jobs.resolve_job_id(missing)
    assert issubclass(JobNotFound, StoreError)
    assert issubclass(AmbiguousJobId, StoreError)


# ------------------------------------------------------------------------ CAS apply


@pytest.mark.asyncio
async def test_apply_is_a_compare_and_set(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    action = claim_action(row, "w1", now=100.0)
    assert await store.jobs.apply(action, T0 + 1)
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert stored.record() == action.record
    assert (stored.status, stored.attempt, stored.holder, stored.lease_expires_at) == (
        JobStatus.CLAIMED,
        1,
        "w1",
        130.0,
    )
    assert stored.reason == "claimed by w1 (attempt 1)"
    assert stored.updated_at == T0 + 1

    # The same action again: the job is no longer queued at attempt 0.
    assert not await store.jobs.apply(action, T0 + 2)
    # Right status, wrong attempt.
    wrong_attempt = replace(action, expect_status=JobStatus.CLAIMED, expect_attempt=0)
    assert not await store.jobs.apply(wrong_attempt, T0 + 3)
    # Right attempt, wrong status.
    wrong_status = replace(action, expect_status=JobStatus.RUNNING, expect_attempt=1)
    assert not await store.jobs.apply(wrong_status, T0 + 4)
    # Unknown job.
    assert not await store.jobs.apply(replace(action, record=replace(action.record, job_id="nope")), T0)

    assert await store.jobs.get_job("j") == stored
    assert [e.kind for e in await store.jobs.events("j")] == ["submitted", "state"]
    assert await store.jobs.events("nope") == []


@pytest.mark.asyncio
async def test_concurrent_claims_grant_exactly_one(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    actions = [claim_action(row, f"w{i}") for i in range(20)]
    results = await asyncio.gather(*(store.jobs.apply(a, T0) for a in actions))
    assert results.count(True) == 1
    winner = actions[results.index(True)].record.holder
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert (stored.holder, stored.attempt) == (winner, 1)
    assert len(await store.jobs.events("j")) == 2


@pytest.mark.asyncio
async def test_a_lease_renewal_stores_nothing_and_a_change_without_reason_is_refused(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    assert await store.jobs.apply(claim_action(row), T0)
    rec = (await store.jobs.get_job("j")).record()  # type: ignore[union-attr]
    assert claims.handle(rec, claims.LeaseRenewed(1, "w1", "renew-1"), 110.0) == [claims.ExtendLease(1, 140.0)]
    silent = PersistJob(rec, rec.status, rec.attempt, "")
    with pytest.raises(ValueError, match="needs a reason"):
        await store.jobs.apply(silent, T0 + 10)
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert stored.reason == "claimed by w1 (attempt 1)"
    assert [e.kind for e in await store.jobs.events("j")] == ["submitted", "state"]


@pytest.mark.asyncio
async def test_events_are_the_history_in_order(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted by alice", stimulus_id="s0")
    rec = row.record()
    steps: list[claims.Event] = [
        claims.ClaimRequested("w1", "s1"),
        claims.RunStarted(1, "w1", "s2"),
        claims.CancelRequested(stimulus_id="s3"),
        claims.RunExited(1, "w1", -15, stimulus_id="s4"),
    ]
    for i, ev in enumerate(steps):
        persist = claims.handle(rec, ev, 100.0 + i)[0]
        assert isinstance(persist, PersistJob)
        assert await store.jobs.apply(persist, T0 + i)
        rec = persist.record
    await store.jobs.add_event("j", "log", "worker said hello", attempt=1, stimulus_id="s5", now_wall=T0 + 9)
    events = await store.jobs.events("j")
    assert [(e.kind, e.from_status, e.to_status, e.attempt, e.stimulus_id) for e in events] == [
        ("submitted", None, JobStatus.QUEUED, None, "s0"),
        ("state", JobStatus.QUEUED, JobStatus.CLAIMED, 1, "s1"),
        ("state", JobStatus.CLAIMED, JobStatus.RUNNING, 1, "s2"),
        ("state", JobStatus.RUNNING, JobStatus.RUNNING, 1, "s3"),
        ("state", JobStatus.RUNNING, JobStatus.CANCELLED, 1, "s4"),
        ("log", None, None, 1, "s5"),
    ]
    assert [e.reason for e in events] == [
        "submitted by alice",
        "claimed by w1 (attempt 1)",
        "running on w1",
        "cancel requested; stopping attempt 1 on w1",
        "cancelled by user (exit by signal 15)",
        "worker said hello",
    ]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert (stored.status, stored.cancel_requested, stored.holder) == (JobStatus.CANCELLED, True, None)


# --------------------------------------------------------------- claims and grants


GPU0 = ("GPU-0000", 0, "cuda")
GPU1 = ("GPU-1111", 1, "cuda")
GPU2 = ("GPU-2222", 2, "cuda")


@pytest.mark.asyncio
async def test_claim_writes_attempt_and_grants_together(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    action = claim_action(row, "w1")
    assert await store.jobs.claim(action, "w1", '{"devices": [0, 1]}', [GPU0, GPU1], "/runs/j/1", T0 + 5)
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert (stored.status, stored.attempt, stored.holder) == (JobStatus.CLAIMED, 1, "w1")
    [att] = await store.jobs.attempts("j")
    assert (att.attempt, att.worker, att.state, att.run_dir, att.placement_json) == (
        1,
        "w1",
        "claimed",
        "/runs/j/1",
        '{"devices": [0, 1]}',
    )
    assert await store.jobs.active_attempts() == [att]
    grants = await store.runs.grants()
    assert [
        (g.device_uuid, g.device_index, g.accelerator, g.job_id, g.attempt, g.granted_at) for g in grants
    ] == [
        ("GPU-0000", 0, "cuda", "j", 1, T0 + 5),
        ("GPU-1111", 1, "cuda", "j", 1, T0 + 5),
    ]
    assert [e.to_status for e in await store.jobs.events("j")] == [JobStatus.QUEUED, JobStatus.CLAIMED]


@pytest.mark.asyncio
async def test_device_is_never_granted_twice(store: Store) -> None:
    first = await store.jobs.insert_job(job("first"), "submitted")
    second = await store.jobs.insert_job(job("second"), "submitted")
    assert await store.jobs.claim(claim_action(first), "w1", "{}", [GPU0, GPU1], "/runs/first/1", T0)
    before = await store.runs.grants()

    # GPU1 is taken: nothing of the second claim may be written.
    assert not await store.jobs.claim(claim_action(second), "w1", "{}", [GPU2, GPU1], "/runs/second/1", T0)
    # A claim naming one device twice is refused too.
    assert not await store.jobs.claim(claim_action(second), "w1", "{}", [GPU2, GPU2], "/runs/second/1", T0)

    assert await store.runs.grants() == before
    assert await store.jobs.get_job("second") == second
    assert await store.jobs.attempts("second") == []
    assert [e.kind for e in await store.jobs.events("second")] == ["submitted"]

    # A stale claim (CAS lost) writes no attempt and no grants either.
    assert not await store.jobs.claim(claim_action(first), "w2", "{}", [GPU2], "/runs/first/2", T0)
    assert await store.runs.grants() == before
    assert len(await store.jobs.attempts("first")) == 1

    # The free device can still be granted.
    assert await store.jobs.claim(claim_action(second), "w1", "{}", [GPU2], "/runs/second/1", T0)
    assert [g.device_uuid for g in await store.runs.grants()] == ["GPU-0000", "GPU-1111", "GPU-2222"]


@pytest.mark.asyncio
async def test_claim_requires_a_claim_action(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    [cancel] = claims.handle(row.record(), claims.CancelRequested(), 0.0)
    assert isinstance(cancel, PersistJob)
    with pytest.raises(ValueError, match="claimed"):
        await store.jobs.claim(cancel, "w1", "{}", [GPU0], "/r", T0)


@pytest.mark.asyncio
async def test_mark_running_then_end_attempt_releases_grants_idempotently(store: Store) -> None:
    row = await store.jobs.insert_job(job("j"), "submitted")
    assert await store.jobs.claim(claim_action(row), "w1", "{}", [GPU0, GPU1], "/runs/j/1", T0)
    await store.jobs.mark_running("j", 1, 4242, 1234.5, 4243, T0 + 1)
    await store.jobs.mark_running("j", 1, 5252, 2345.5, 5253, T0 + 2)  # re-adopted: keeps first start
    [att] = await store.jobs.attempts("j")
    assert (att.state, att.watchdog_pid, att.watchdog_create_time, att.job_pgid, att.started_at) == (
        "running",
        5252,
        2345.5,
        5253,
        T0 + 1,
    )

    await store.jobs.end_attempt("j", 1, "exited", 3, "exited 3", T0 + 10)
    await store.jobs.end_attempt("j", 1, "exited", 4, "again", T0 + 11)  # the first end is kept
    await store.jobs.end_attempt("j", 1, "lost", None, "late", T0 + 12)
    [att] = await store.jobs.attempts("j")
    assert (att.state, att.exit_code, att.ended_at, att.reason) == ("exited", 3, T0 + 10, "exited 3")
    assert await store.runs.grants() == []
    assert await store.jobs.active_attempts() == []
    stored = await store.jobs.get_job("j")
    assert stored is not None
    assert stored.exit_code == 3

    # The ended attempt keeps where it ran (WHERE of a finished job); jobs not run yet are absent.
    await store.jobs.insert_job(job("k"), "submitted")
    latest = await store.jobs.latest_attempts(["j", "k", "nope"])
    assert list(latest) == ["j"] and (latest["j"].worker, latest["j"].placement_json) == ("w1", "{}")
    assert await store.jobs.latest_attempts([]) == {}

    await store.jobs.mark_running("j", 1, 1, 1.0, 1, T0 + 20)  # an ended attempt stays ended
    assert (await store.jobs.attempts("j"))[0].state == "exited"
    with pytest.raises(ValueError, match="exited"):
        await store.jobs.end_attempt("j", 1, "running", None, "", T0)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_lost_attempt_releases_only_its_own_grants(store: Store) -> None:
    a = await store.jobs.insert_job(job("a"), "submitted")
    b = await store.jobs.insert_job(job("b"), "submitted")
    assert await store.jobs.claim(claim_action(a), "w1", "{}", [GPU0], "/runs/a/1", T0)
    assert await store.jobs.claim(claim_action(b), "w1", "{}", [GPU1], "/runs/b/1", T0)
    await store.jobs.end_attempt("a", 1, "lost", None, "watchdog gone", T0 + 1)
    assert [g.job_id for g in await store.runs.grants()] == ["b"]
    assert [(x.job_id, x.state) for x in await store.jobs.active_attempts()] == [("b", "claimed")]
    stored = await store.jobs.get_job("a")
    assert stored is not None
    assert stored.exit_code is None
    assert (await store.jobs.attempts("a"))[0].reason == "watchdog gone"


# ----------------------------------------------------------------------------- misc


@pytest.mark.asyncio
async def test_set_explanation_only_touches_waiting_jobs(store: Store) -> None:
    row = await store.jobs.insert_job(job("q"), "submitted")
    await store.jobs.insert_job(job("r", JobStatus.REJECTED), "no GPU can ever fit")
    await store.jobs.set_explanation("q", "waiting: all 2 GPUs busy", '{"rows": []}')
    await store.jobs.set_explanation("r", "still no GPU can fit", None)
    q = await store.jobs.get_job("q")
    assert q is not None
    assert (q.status, q.reason, q.explanation_json, q.updated_at) == (
        JobStatus.QUEUED,
        "waiting: all 2 GPUs busy",
        '{"rows": []}',
        T0,
    )
    r = await store.jobs.get_job("r")
    assert r is not None
    assert (r.status, r.reason) == (JobStatus.REJECTED, "still no GPU can fit")

    assert await store.jobs.apply(claim_action(row), T0)
    await store.jobs.set_explanation("q", "should not land", None)
    q = await store.jobs.get_job("q")
    assert q is not None
    assert q.reason == "claimed by w1 (attempt 1)"
    assert [e.kind for e in await store.jobs.events("q")] == ["submitted", "state"]


@pytest.mark.asyncio
async def test_add_event_returns_the_stored_event(store: Store) -> None:
    await store.jobs.insert_job(job("j"), "submitted")
    ev = await store.jobs.add_event("j", "explain", "2 workers checked", now_wall=T0 + 3)
    assert (await store.jobs.events("j"))[-1] == ev
    assert (ev.kind, ev.reason, ev.attempt, ev.at) == ("explain", "2 workers checked", None, T0 + 3)


@pytest.mark.asyncio
async def test_counts_per_status(store: Store) -> None:
    for i in range(3):
        await store.jobs.insert_job(job(f"q{i}"), "submitted")
    await store.jobs.insert_job(job("r", JobStatus.REJECTED), "no")
    counts = await store.jobs.counts()
    assert counts["queued"] == 3
    assert counts["rejected"] == 1
    assert counts["running"] == 0
    assert set(counts) == {s.value for s in JobStatus}


@pytest.mark.asyncio
async def test_cancelled_writers_leave_the_store_consistent(store: Store) -> None:
    # Cancel submits at spread-out moments: before, inside and during the commit of the transaction.
    for n in range(20):
        task = asyncio.create_task(store.jobs.insert_job(job(f"c{n}"), "submitted"))
        await asyncio.sleep(n * 0.00005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # Each submit is all there or not there at all, and the store still works.
    for n in range(20):
        present = await store.jobs.get_job(f"c{n}") is not None
        assert present == bool(await store.jobs.events(f"c{n}"))
    assert await store.jobs.get_job("c19") is not None
    assert (await store.jobs.insert_job(job("after"), "submitted")).seq is not None
    assert await store.jobs.get_job("after") is not None


# ---------------------------------------------------------------------- crash safety

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from gpulayerd.core.protocol.claims import JobStatus
    from gpulayerd.store import JobRow, Store

    async def main() -> None:
        store = await Store.open(Path(sys.argv[1]))
        print("ready", flush=True)
        i = 0
        while True:
            job_id = f"{sys.argv[2]}-{i}"
            now = time.time()
            row = JobRow(id=job_id, spec_json="{}", status=JobStatus.QUEUED, lease_s=30.0,
                         submitted_at=now, updated_at=now)
            await store.jobs.insert_job(row, "submitted")
            print(job_id, flush=True)
            i += 1

    asyncio.run(main())
    """
)


@pytest.mark.asyncio
async def test_kill_9_loses_no_acknowledged_job(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db = tmp_path / "crash.db"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    rng = random.Random(20240607)
    acked: list[str] = []
    for round_no in range(5):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            str(db),
            f"r{round_no}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
            assert ready == b"ready\n"
            await asyncio.sleep(rng.uniform(0.02, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            out, err = await proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err.decode()
        # Only whole lines: a line cut by the kill was never acknowledged.
        lines = out.decode().split("\n")[:-1]
        acked += lines
        async with await Store.open(db) as s:
            assert await s.integrity_check() == "ok"
            for job_id in acked:
                row = await s.jobs.get_job(job_id)
                assert row is not None, f"acknowledged job {job_id} lost"
                assert [e.kind for e in await s.jobs.events(job_id)] == ["submitted"]
            seqs = [r.seq or 0 for r in await s.jobs.list_jobs()]
            assert seqs == sorted(set(seqs))
            assert 0 not in seqs
    assert len(acked) > 10
