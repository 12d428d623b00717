"""The owner's parsed-spec cache is bounded: a long queue stays in the store, not in memory."""

from __future__ import annotations

from typing import Any

import pytest

from gpulayerd.app.common import owned_jobs as jobs_mod
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.store import JobRow, Store


def _row(i: int) -> JobRow:
    return JobRow(id=f"job-{i}", spec_json=f'{{"command": ["echo", "{i}"], "user": "ann"}}',
                  status=JobStatus.QUEUED, lease_s=30.0, submitted_at=0.0, updated_at=0.0)


def test_spec_cache_keeps_the_most_recently_used_and_reparses_the_rest(monkeypatch: Any) -> None:
    monkeypatch.setattr(jobs_mod, "SPEC_CACHE_SIZE", 3)
    owned = OwnedJobs(store=None, signals=None, clock=None)  # type: ignore[arg-type]  # spec() reads neither
    rows = [_row(i) for i in range(5)]
    first = owned.spec(rows[0])
    for r in rows[1:3]:
        owned.spec(r)
    assert owned.spec(rows[0]) is first  # used again: moves to the end
    for r in rows[3:]:
        owned.spec(r)
    assert list(owned._specs) == ["job-0", "job-3", "job-4"]
    again = owned.spec(rows[1])  # dropped: parsed again from the stored JSON, same content
    assert again.command == ["echo", "1"] and list(owned._specs) == ["job-3", "job-4", "job-1"]


@pytest.mark.asyncio
async def test_spec_of_reads_a_spec_dropped_from_the_cache_back_from_the_store(store: Store, monkeypatch: Any) -> None:
    """The scheduler's queue keeps no spec JSON: a claim of a job whose parsed spec left the
    cache reads it back from the store (and a job the store does not have is None)."""
    monkeypatch.setattr(jobs_mod, "SPEC_CACHE_SIZE", 2)
    owned = OwnedJobs(store=store, signals=None, clock=None)  # type: ignore[arg-type]  # spec_of reads neither
    for i in range(4):
        await store.jobs.insert_job(_row(i), "queued")
        owned.spec(_row(i))
    assert list(owned._specs) == ["job-2", "job-3"]
    cached = owned._specs["job-3"]
    assert await owned.spec_of("job-3") is cached
    back = await owned.spec_of("job-0")
    assert back is not None and back.command == ["echo", "0"] and back.user == "ann"
    assert list(owned._specs) == ["job-3", "job-0"]  # read back: cached again, most recent last
    assert await owned.spec_of("job-nope") is None
