"""An attempt's start or end written with the job's compare-and-set in one transaction (one commit)."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayerd.app.common.owned_jobs import Granted, OwnedJobs
from gpulayerd.app.common.signals import Signals
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobStatus, PersistJob
from gpulayerd.store import JobRow, Store
from tests.fakes.clock import FakeClock

T0 = 1_700_000_000.0


def job(job_id: str) -> JobRow:
    return JobRow(id=job_id, status=JobStatus.QUEUED, spec_json="{}", lease_s=30.0, submitted_at=T0, updated_at=T0)


def persist_of(row: JobRow, event: claims.Event, now: float = 100.0) -> PersistJob:
    action = claims.handle(row.record(), event, now)[0]
    assert isinstance(action, PersistJob)
    return action


async def claimed(store: Store, job_id: str = "j") -> JobRow:
    row = await store.jobs.insert_job(job(job_id), "submitted")
    assert await store.jobs.claim(persist_of(row, claims.ClaimRequested("w1", "c")), "w1", "{}", [],
                                  f"/runs/{job_id}/1", T0)
    got = await store.jobs.get_job(job_id)
    assert got is not None
    return got


@pytest.mark.asyncio
async def test_mark_running_with_its_cas_and_a_lost_cas_keeps_the_attempt(store: Store) -> None:
    row = await claimed(store)
    start = persist_of(row, claims.RunStarted(1, "w1", "s"))
    assert await store.jobs.mark_running("j", 1, 4242, 1.5, 4243, T0 + 1, start) is True
    got = await store.jobs.get_job("j")
    assert got is not None and (got.status, got.reason) == (JobStatus.RUNNING, "running on w1")
    [att] = await store.jobs.attempts("j")
    assert (att.state, att.watchdog_pid, att.job_pgid) == ("running", 4242, 4243)
    # The same compare-and-set again loses (the job is running now): the attempt's row is still written.
    assert await store.jobs.mark_running("j", 1, 5252, 2.5, 5253, T0 + 2, start) is False
    [att] = await store.jobs.attempts("j")
    assert att.watchdog_pid == 5252
    assert [e.reason for e in await store.jobs.events("j")].count("running on w1") == 1


@pytest.mark.asyncio
async def test_end_attempt_with_its_cas(store: Store) -> None:
    row = await claimed(store)
    await store.jobs.mark_running("j", 1, 4242, 1.5, 4243, T0 + 1, persist_of(row, claims.RunStarted(1, "w1", "s")))
    row2 = await store.jobs.get_job("j")
    assert row2 is not None
    end = persist_of(row2, claims.RunExited(1, "w1", 0, "", "e"))
    assert await store.jobs.end_attempt("j", 1, "exited", 0, "exited 0", T0 + 3, end) is True
    got = await store.jobs.get_job("j")
    assert got is not None and (got.status, got.exit_code) == (JobStatus.SUCCEEDED, 0)
    assert await store.jobs.end_attempt("j", 1, "exited", 0, "again", T0 + 4, end) is False
    [att] = await store.jobs.attempts("j")
    assert (att.state, att.reason) == ("exited", "exited 0")


@pytest.mark.asyncio
async def test_a_workers_start_and_exit_reports_cost_one_commit_each(store: Store,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    await claimed(store)
    owned = OwnedJobs(store=store, signals=Signals(), clock=FakeClock())
    db: Any = store.jobs._db  # counting the store's transactions
    commits = 0
    run = db.run

    async def counted(fn: Any) -> Any:
        nonlocal commits
        commits += 1
        return await run(fn)

    monkeypatch.setattr(db, "run", counted)
    await owned.reported("j", "started", 1, "w1", stimulus_id="start-j-1")
    assert commits == 1
    await owned.reported("j", "exited", 1, "w1", exit_code=3, reason="exited 3", stimulus_id="exit-j-1")
    assert commits == 2
    got = await store.jobs.get_job("j")
    assert got is not None and (got.status, got.exit_code, got.reason) == (JobStatus.FAILED, 3, "exited 3")
    [att] = await store.jobs.attempts("j")
    assert (att.state, att.exit_code) == ("exited", 3)
    assert [(e.from_status, e.to_status) for e in await store.jobs.events("j")][-2:] == [
        (JobStatus.CLAIMED, JobStatus.RUNNING), (JobStatus.RUNNING, JobStatus.FAILED)]


async def _count_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs read from the store: alone, or in a claim's own transaction."""
    reads: list[str] = []
    get, decided = store.jobs.get_job, store.jobs.claim_decided

    async def counted(job_id: str) -> JobRow | None:
        reads.append(job_id)
        return await get(job_id)

    async def counted_claim(job_id: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(job_id)
        return await decided(job_id, *args, **kwargs)

    monkeypatch.setattr(store.jobs, "get_job", counted)
    monkeypatch.setattr(store.jobs, "claim_decided", counted_claim)
    return reads


@pytest.mark.asyncio
async def test_a_grant_reads_the_job_only_in_its_own_transaction(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    await store.jobs.insert_job(job("j"), "submitted")
    owned = OwnedJobs(store=store, signals=Signals(), clock=FakeClock())
    reads = await _count_reads(store, monkeypatch)
    granted = await owned.grant("j", "w1", "claim-j", "{}", tries=1)
    assert granted == Granted(1, 30.0, fresh=True) and reads == ["j"]  # the claim's own read
    got = await store.jobs.get_job("j")
    assert got is not None and (got.status, got.holder, got.attempt) == (JobStatus.CLAIMED, "w1", 1)


@pytest.mark.asyncio
async def test_a_second_claimer_and_a_cancelled_job_are_refused_and_nothing_is_granted_twice(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker claimed the job first (or a cancel was asked): the claim, read and decided in
    its own transaction, is refused; never two grants."""
    await store.jobs.insert_job(job("j"), "submitted")
    owned = OwnedJobs(store=store, signals=Signals(), clock=FakeClock())
    assert await owned.grant("j", "w2", "claim-j-w2", "{}", tries=1) == Granted(1, 30.0, fresh=True)
    reads = await _count_reads(store, monkeypatch)
    refused = await owned.grant("j", "w1", "claim-j-w1", "{}", tries=1)
    assert not isinstance(refused, Granted) and reads == ["j"]
    got = await store.jobs.get_job("j")
    assert got is not None and (got.holder, got.attempt) == ("w2", 1)
    assert len(await store.jobs.attempts("j")) == 1

    await store.jobs.insert_job(job("k"), "submitted")
    await owned.apply("k", claims.CancelRequested("cancelled by user", "cancel-k"))
    granted = await owned.grant("k", "w1", "claim-k", "{}", tries=1)
    assert not isinstance(granted, Granted)
    got = await store.jobs.get_job("k")
    assert got is not None and got.status is JobStatus.CANCELLED and await store.jobs.attempts("k") == []


@pytest.mark.asyncio
async def test_the_queues_changes_are_read_again_only_after_an_event(store: Store,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler asks for the queue's changes at every pass; with no event made since the last answer (a
    job's status changes only with one), the answer is the same, and no read is made."""
    await store.jobs.insert_job(job("a"), "submitted")
    reads: list[int] = []
    real = store.jobs._db.read

    async def counted(fn: Any) -> Any:
        reads.append(1)
        return await real(fn)

    monkeypatch.setattr(store.jobs._db, "read", counted)
    head, queued, rows = await store.jobs.queue_changes(0)
    assert (queued, [r.id for r in rows], len(reads)) == (1, ["a"], 1)
    assert await store.jobs.queue_changes(head) == (head, 1, []) and len(reads) == 1
    await store.jobs.set_explanation("a", "Ready: fits now", None)  # no event
    assert await store.jobs.queue_changes(head) == (head, 1, []) and len(reads) == 1
    await store.jobs.insert_job(job("b"), "submitted")
    head2, queued2, rows2 = await store.jobs.queue_changes(head)
    assert (head2 > head, queued2, [r.id for r in rows2], len(reads)) == (True, 2, ["b"], 2)
    _, _, rows0 = await store.jobs.queue_changes(0)  # asked from another point: read
    assert ([r.id for r in rows0], len(reads)) == (["a", "b"], 3)
