"""The owner's parsed-spec cache is bounded: a long queue stays in the store, not in memory."""

from __future__ import annotations

from typing import Any

from gpulayerd.app import jobs as jobs_mod
from gpulayerd.app.jobs import OwnedJobs
from gpulayerd.core.claims import JobStatus
from gpulayerd.store import JobRow


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
