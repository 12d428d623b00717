"""Accounting and notifications (issue 37), the parts without processes: the tally over a period,
the merge of owners' reports, the retention of finished jobs in a real store, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpulayerd.core.fairshare import MAX_WAITS, AttemptSpan, JobOutcome, Tally, merge_tallies, tally
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.host.user_config import notify_policy
from gpulayerd.models import JobSpec
from gpulayerd.store import JobRow, Store


def test_a_tally_counts_only_the_time_within_the_period_times_gpus_and_slots() -> None:
    spans = [
        AttemptSpan("alice", start=50.0, end=150.0, gpus=2, cpu_slots=0),  # half inside [100, 200]
        AttemptSpan("alice", start=120.0, end=None, gpus=1, cpu_slots=0),  # still runs: until the end
        AttemptSpan("bob", start=10.0, end=90.0, gpus=4, cpu_slots=0),  # ended before: nothing
        AttemptSpan("bob", start=110.0, end=130.0, gpus=0, cpu_slots=3),
    ]
    outcomes = [JobOutcome("alice", False, 5.0), JobOutcome("alice", True, 1.0), JobOutcome("alice", False, 9.0),
                JobOutcome("bob", True, None)]
    alice, bob = tally(spans, outcomes, 100.0, 200.0)
    assert (alice.key, alice.gpu_s, alice.cpu_slot_s, alice.jobs, alice.failures) == ("alice", 100.0 + 80.0, 0.0, 3, 1)
    assert alice.median_wait_s == 5.0
    assert (bob.key, bob.gpu_s, bob.cpu_slot_s, bob.jobs, bob.failures, bob.median_wait_s) == (
        "bob", 0.0, 60.0, 1, 1, None)


def test_owners_reports_merge_by_key_and_keep_a_bounded_honest_median() -> None:
    a = [Tally("alice", 2, 1, 10.0, 1.0, [1.0, 3.0]), Tally("bob", 1, 0, 0.0, 5.0, [7.0])]
    b = [Tally("alice", 1, 0, 5.0, 0.0, [2.0])]
    alice, bob = merge_tallies([a, b])
    assert (alice.jobs, alice.failures, alice.gpu_s, alice.cpu_slot_s, alice.median_wait_s) == (3, 1, 15.0, 1.0, 2.0)
    assert (bob.key, bob.gpu_s, bob.cpu_slot_s) == ("bob", 0.0, 5.0)
    [big] = merge_tallies([[Tally("u", waits=[float(i) for i in range(3 * MAX_WAITS)])]])
    assert len(big.waits) <= MAX_WAITS
    assert big.median_wait_s == pytest.approx(1.5 * MAX_WAITS, rel=0.01)


@pytest.mark.asyncio
async def test_retention_removes_old_finished_jobs_with_their_history_and_keeps_the_rest(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    try:
        def row(job_id: str, status: JobStatus, at: float) -> JobRow:
            return JobRow(id=job_id, spec_json='{"command": ["true"]}', status=status, lease_s=30.0,
                          submitted_at=at, updated_at=at)

        for job_id, status, at in (("old-done", JobStatus.SUCCEEDED, 100.0), ("old-failed", JobStatus.FAILED, 150.0),
                                   ("new-done", JobStatus.SUCCEEDED, 5000.0), ("old-queued", JobStatus.QUEUED, 100.0)):
            await store.jobs.insert_job(row(job_id, status, at), "submitted", key=("alice", job_id))
        assert await store.history.purge(before=1000.0) == 2
        assert await store.history.purge(before=1000.0) == 0
        left = {r.id for r in await store.jobs.list_jobs(None, None)}
        assert left == {"new-done", "old-queued"}  # a job that has not ended is never removed
        assert await store.jobs.events("old-done") == []
    finally:
        await store.close()


def test_notify_needs_known_events_and_the_users_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("GPULAYER_USER_CONFIG", str(config))
    with pytest.raises(ValueError, match="unknown event 'finish'; allowed: start, end, fail"):
        notify_policy({"notify": "end,finish"})
    with pytest.raises(ValueError, match=f"no notify command: put `notify = .*` in {config}"):
        notify_policy({"notify": "end"})
    config.write_text('notify = "notify-send"\n')
    with pytest.raises(ValueError, match="must be a non-empty list of strings"):
        notify_policy({"notify": "end"})
    config.write_text('notify = ["notify-send", "gpulayer"]\n')
    policy: dict[str, object] = {"notify": "end, fail"}
    notify_policy(policy)
    assert policy == {"notify": ["end", "fail"], "notify_command": ["notify-send", "gpulayer"]}
    # The daemon checks the same (a spec from elsewhere): the field and the allowed values named.
    with pytest.raises(ValidationError, match="notify: unknown event 'done'"):
        JobSpec.model_validate({"command": ["true"], "policy": {"notify": ["done"], "notify_command": ["x"]}})
    with pytest.raises(ValidationError, match="notify: needs the notify command"):
        JobSpec.model_validate({"command": ["true"], "policy": {"notify": ["end"]}})
