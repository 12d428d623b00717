"""Retries in the scheduler's pass (pure): the retries that wait out their backoff, kept out of the
walk until it ends, and the worker a retry avoids (``--retry-elsewhere``), preferred against; and a
peer offered a job for a while that never claimed it, preferred against for that job (:class:`OfferAges`).

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

__all__ = ["OfferAges", "RetryHolds", "prefer_others"]


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


class OfferAges:
    """How long each job has been offered to the same peer without being claimed (it is still queued).

    A peer that fits a job now (as its last snapshot says) claims it within a pass or two; one that
    does not (its snapshot is stale, the job's workdir is missing there, or it advertises devices it
    never grants) would otherwise keep the offer for ever, since best fit keeps choosing it. Once a job
    has been offered to one peer for ``patience_s``, that peer is :meth:`stale` for it: the next best
    fit is preferred (:func:`prefer_others`), and the clock starts again for the new target.

    Args:
        patience_s: how long a peer may hold a job's offer unclaimed (monotonic s).
    """

    def __init__(self, patience_s: float) -> None:
        self._patience_s = patience_s
        self._since: dict[str, tuple[str, float]] = {}  # job -> (peer, first offered to it)

    def sent(self, job_id: str, target: str, now: float) -> None:
        """``job_id`` was offered to ``target`` at ``now``."""
        last = self._since.get(job_id)
        if last is None or last[0] != target:
            self._since[job_id] = (target, now)

    def stale(self, job_id: str, now: float) -> str | None:
        """The peer that has held ``job_id``'s offer unclaimed for ``patience_s`` by ``now``, or None."""
        last = self._since.get(job_id)
        return last[0] if last is not None and now - last[1] >= self._patience_s else None

    def forget(self, job_id: str) -> None:
        """``job_id`` left the queue (claimed, cancelled) or is read again."""
        self._since.pop(job_id, None)
