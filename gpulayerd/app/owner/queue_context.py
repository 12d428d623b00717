"""Where a waiting job stands (``gpulayer show``): its position, who holds what it waits for, and a start
estimate in words with its basis.

- **position**: among the jobs queued here that ask for the same requirements (the same devices), in
  submission order; 1 is next.
- **holders**: the jobs holding the devices of the job's accelerator on the workers where it fits but
  they are busy (the explanation's ``fits_but_busy`` rows; for a CPU job, the runs holding this
  machine's CPU slots — a peer's CPU slots are not named): their id, user, how long their attempt has
  run, and their *usual duration*: the median of their user's earlier succeeded runs of the same
  command, computed by the holder's own owner (:meth:`QueueContext.fill_running`, a number in its
  ``show``; the command never leaves its owner).
- **estimate**: "after job X ends, likely within ~N" when the position-th holder to end has a usual
  duration, with the basis; ``unknown`` and why otherwise. An estimate, never a promise: a holder may
  end sooner or later, another user's job may pass by fair share.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from gpulayerd import text as fmt
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core.job_facts import job_user
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.types import OUTSIDE_HOLDER
from gpulayerd.models import ExplanationModel, HolderView, JobSpec, JobView
from gpulayerd.store import JobRow, Store

__all__ = ["MAX_HOLDERS", "QueueContext"]

MAX_HOLDERS = 16
"""Holders named at most (the first ones, by worker and device)."""


def _shape(spec_json: str) -> str:
    """What "wants the same devices" compares: the requirements and the distributed part, as JSON."""
    try:
        spec = json.loads(spec_json)
    except ValueError:
        return ""
    if not isinstance(spec, dict):
        return ""
    return json.dumps([spec.get("requirements"), spec.get("distributed")], sort_keys=True)


class QueueContext:
    """Fills the queue context of a job's view (see the module).

    ``lookup``: a job of the cluster by id (its owner's ``show``; set once the cluster's job service exists).
    """

    def __init__(self, *, store: Store, machine: Machine, directory: Directory | None, clock: Clock) -> None:
        self._store = store
        self._machine = machine
        self._directory = directory
        self._clock = clock
        self.lookup: Callable[[str], Awaitable[JobView]] | None = None

    async def fill_running(self, view: JobView, row: JobRow) -> None:
        """A running job's usual duration (its user's earlier succeeded runs of the same command)."""
        user = job_user(view.spec.user, row.submitted_by) or ""
        usual, runs = await self._store.history.usual_duration(user, json.dumps(view.spec.command), exclude=row.id)
        view.usual_duration_s, view.usual_runs = usual, runs

    async def fill_waiting(self, view: JobView | ExplanationModel, row: JobRow, explanation: ExplanationModel | None,
                           spec: JobSpec) -> None:
        """A queued job's position, holders and estimate, into its ``show`` view or its explanation."""
        rows = explanation.workers if explanation is not None else []
        busy = {w.worker for w in rows if w.state == "fits_but_busy"}
        if not busy:
            return  # it waits for nothing a job holds (it fits nowhere, or a peer is offline): no queue to stand in
        shape = _shape(row.spec_json)
        queued = await self._store.jobs.list_jobs([JobStatus.QUEUED], None)
        view.position = 1 + sum(1 for r in queued if r.seq is not None and row.seq is not None and r.seq < row.seq
                                and _shape(r.spec_json) == shape)
        held: list[str] = []
        if spec.requirements.accelerator.value == "cpu" and self._machine.node_id in busy:
            held += [key[0] for key, entry in self._machine.runs() if entry.cpu_slots]  # its CPU slots' holders
        else:
            workers = [await self._machine.snapshot(refresh_apps=False),
                       *(self._directory.worker_snapshots() if self._directory is not None else [])]
            kind = spec.requirements.accelerator.value
            for w in workers:
                if w.node_id in busy:
                    held += [d.granted_to for d in sorted(w.devices, key=lambda d: d.index)
                             if d.granted_to and d.granted_to != OUTSIDE_HOLDER and d.accelerator.value == kind]
        now = self._clock.wall()
        # Asked together (each lookup may be a peer's round trip, bounded by its timeout), kept in order.
        view.holders.extend(await asyncio.gather(*(self._holder(job_id, now)
                                                   for job_id in list(dict.fromkeys(held))[:MAX_HOLDERS])))
        view.estimate = _estimate(view.position, view.holders)

    async def _holder(self, job_id: str, now: float) -> HolderView:
        other: JobView | None = None
        try:
            if self.lookup is not None:
                other = await self.lookup(job_id)
        except Exception:  # an owner that does not answer: the holder is named without its figures
            other = None
        if other is None:
            return HolderView(id=job_id)
        started = next((a.started_at for a in other.attempts if a.attempt == other.attempt), None)
        return HolderView(id=other.id, user=job_user(other.spec.user, other.submitted_by) or "",
                          elapsed_s=None if started is None else max(0.0, now - started),
                          usual_s=other.usual_duration_s, runs=other.usual_runs)


def _estimate(position: int | None, holders: list[HolderView]) -> str:
    """The estimate in words (see the module)."""
    if not holders:
        return "unknown: no job holds what it waits for (it waits for something else; see its reason)"
    known = sorted(((max(0.0, h.usual_s - (h.elapsed_s or 0.0)), h) for h in holders if h.usual_s is not None),
                   key=lambda pair: pair[0])
    nth = position or 1
    if len(known) < nth:
        return (f"unknown: {len(holders) - len(known)} of the {len(holders)} jobs holding its devices never ran "
                "before (no usual duration to go by)" if len(known) < len(holders) else
                f"unknown: {nth - 1} jobs wait ahead of it for {len(holders)} holders")
    left, h = known[nth - 1]
    ahead = "" if nth == 1 else f", after the {nth - 1} job{'s' if nth > 2 else ''} ahead of it"
    when = f"likely within ~{fmt.age(left)}" if left > 0 else "soon, it has run longer than usual"
    return (f"after job {h.id} ends{ahead}, {when} (basis: "
            f"{h.user or 'its user'}'s {h.runs} earlier run{'s' if h.runs != 1 else ''} of the same command took "
            f"{fmt.age(h.usual_s or 0.0)} (median); it has run {fmt.age(h.elapsed_s or 0.0)})")
