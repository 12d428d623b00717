"""After a restart: re-adopt the runs whose watchdog lives, account for the rest.

Persisted leases count as renewed at restart (the owner gives every active attempt a
full lease from now). Every run on this machine, of a job owned here or a peer's, is
re-adopted from its run row (``remote_runs``) and reported to its owner as at its start. A
run whose watchdog never started is given up for good and its attempt is lost (never
started: re-queued for free); so is an attempt granted here that never got its run row.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models.stored import read_placement, spec_of
from gpulayerd.runs.runner import RunHandle, Runner
from gpulayerd.store import Store

__all__ = ["Recovery"]

log = logging.getLogger(__name__)

ADOPT_WAIT_S = 15.0
"""How long a watchdog that claimed its run directory gets to say it started."""


class Recovery:
    """Re-adoption of this machine's runs and of the owner's leases, once at start-up."""

    def __init__(self, *, node_id: str, store: Store, runner: Runner, jobs: OwnedJobs, worker: WorkerService,
                 clock: Clock) -> None:
        self.node_id = node_id
        self._store = store
        self._runner = runner
        self._jobs = jobs
        self._worker = worker
        self._clock = clock

    async def recover(self) -> None:
        """Re-adopt or account for every attempt the previous life of this daemon left active.

        Run directories and process records are read in threads.
        """
        now = self._clock.monotonic()
        for a in await self._store.jobs.active_attempts():
            row = await self._jobs.get(a.job_id)
            if row is None or row.attempt != a.attempt or row.status not in claims.ACTIVE:
                await self._store.jobs.end_attempt(a.job_id, a.attempt, "lost", None, "superseded",
                                                   self._clock.wall())
                continue
            self._jobs.set_lease(row.id, now + row.lease_s)
            self._jobs.note_holder(row.id, row.attempt, row.holder)  # (the claim role's check reads no row)
            if a.worker != self.node_id or read_placement(a.placement_json).gang:
                continue  # runs on a peer (its lease counts as renewed now), or a gang's (GangCoordinator.recover)
            # It runs here: the worker side re-adopts it from its run row (below) and reports to this
            # owner as any worker does; granted here but never given a run row, it never started.
            if await self._store.runs.remote_run(self.node_id, row.id, a.attempt) is None:
                await self._jobs.lost(row.id, a.attempt, "the daemon stopped before the job started",
                                      worker=self.node_id, never_started=True, stimulus_id=f"lost-{row.id}-{a.attempt}")
        await self._settle_ended_attempts()
        for r in await self._store.runs.remote_runs(active=True):
            key = (r.job_id, r.attempt)
            handle = await self._adopt_or_give_up(r.run_dir)
            if handle is None:
                await self._worker.never_started(key, r.owner, "the daemon stopped before the job started")
                continue
            status = await asyncio.to_thread(self._runner.poll, handle)
            if status.running:
                log.info("re-adopted job %s attempt %d of %s (watchdog pid %d)", r.job_id, r.attempt, r.owner[:12],
                         handle.watchdog_pid)
                await asyncio.to_thread(self._runner.extend_deadline, handle, now + r.lease_s)
                self._worker.adopt(key, handle, spec_of(r.spec_json), r.owner, r.lease_s)
                if r.owner == self.node_id:
                    await self._store.jobs.add_event(r.job_id, "adopted", f"re-adopted after daemon restart "
                                                     f"(watchdog pid {handle.watchdog_pid})", attempt=r.attempt,
                                                     now_wall=self._clock.wall())
            else:
                await self._worker.finished(key, status, owner=r.owner)

    async def _adopt_or_give_up(self, run_dir: str | None) -> RunHandle | None:
        """The handle of a run after a restart, or None if its watchdog never started (and now never will)."""
        if not run_dir:
            return None
        path = Path(run_dir)
        handle = await asyncio.to_thread(self._runner.adopt, path)
        if handle is not None or await asyncio.to_thread(self._runner.give_up_if_unstarted, path):
            return handle
        # A watchdog claimed the run directory and is starting: give it time to say so.
        deadline = self._clock.monotonic() + ADOPT_WAIT_S
        while self._clock.monotonic() < deadline:
            await self._clock.sleep(0.1)
            handle = await asyncio.to_thread(self._runner.adopt, path)
            if handle is not None:
                return handle
        return None

    async def _settle_ended_attempts(self) -> None:
        """A job still claimed/running whose current attempt already ended (a kill between the two
        commits): apply the end to the job now."""
        for row in await self._store.jobs.list_jobs([JobStatus.CLAIMED, JobStatus.RUNNING], None):
            attempt = next((a for a in await self._store.jobs.attempts(row.id) if a.attempt == row.attempt), None)
            if attempt is None or attempt.state not in ("exited", "lost", "preflight-failed"):
                continue
            holder = row.holder or ""  # the attempt row was ended by (or for) its holder
            if attempt.state == "exited":
                event: claims.Event = claims.RunExited(row.attempt, holder, attempt.exit_code, "",
                                                       f"settle-{row.id}")
            else:
                preflight = attempt.state == "preflight-failed"
                event = claims.RunLost(row.attempt, holder, attempt.reason or "lost", preflight, f"settle-{row.id}",
                                       preflight)
            await self._jobs.apply(row.id, event)
