"""Retries in the scheduler's pass (pure): the retries that wait out their backoff, kept out of the
walk until it ends, and the worker a retry avoids (``--retry-elsewhere``), preferred against.

A retry of a failed or timed-out attempt waits ``retry_backoff_s`` (doubled for each next retry)
before a claim is granted (:func:`gpulayerd.core.protocol.claims.handle`, ``jobs.retry_at``). The pass
neither claims nor offers it before then (a claim would be denied); it is walked as a new job once
the backoff is over. A retry with ``retry_elsewhere`` names the worker of its last attempt: any other
worker that fits it now is preferred, but it still runs there when that is the only fit ("prefer",
not "forbid").
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayerd.core.protocol.targets import Fit
from gpulayerd.core.scheduling.steps import QueuedJob

__all__ = ["RetryHolds", "prefer_others"]


def prefer_others(fits: Sequence[Fit], avoid: str | None) -> list[Fit]:
    """``fits`` but the avoided worker's (``avoid``: a node id, or None), unless it is the only one."""
    if avoid is None:
        return list(fits)
    return [f for f in fits if f.worker != avoid] or list(fits)


class RetryHolds:
    """The queued retries still waiting out their backoff: job id -> the wall-clock time (s) it ends."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._until

    def __len__(self) -> int:
        return len(self._until)

    def keep(self, job: QueuedJob) -> None:
        """Hold ``job`` (queued) until its ``retry_at`` (wall s), or not at all when it has none."""
        if job.retry_at is None:
            self._until.pop(job.id, None)
        else:
            self._until[job.id] = job.retry_at

    def drop(self, job_id: str) -> None:
        """``job_id`` left the queue."""
        self._until.pop(job_id, None)

    def clear(self) -> None:
        """Hold nothing (the queue is read again)."""
        self._until.clear()

    def release(self, wall: float | None) -> list[str]:
        """The held jobs whose backoff is over at ``wall`` (wall-clock s; None: unknown, every one),
        no longer held; in the order they were first held."""
        due = [j for j, t in self._until.items() if wall is None or wall >= t]
        for j in due:
            del self._until[j]
        return due

    def next_due(self) -> float | None:
        """The earliest end of a held retry's backoff (wall-clock s), or None when none is held."""
        return min(self._until.values(), default=None)
