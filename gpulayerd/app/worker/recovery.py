"""After a restart: re-adopt the runs whose watchdog lives, account for the rest.

Persisted leases count as renewed at restart (the owner gives every active attempt a
full lease from now). A run whose watchdog never started is given up for good and
its attempt is lost (never started: re-queued for free).
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
            if a.worker != self.node_id:
                continue  # runs on a peer: its lease counts as renewed now; it reports when it can
            if read_placement(a.placement_json).gang:
                continue  # a gang's attempt: GangCoordinator.recover resumes it
            handle = await self._adopt_or_give_up(a.run_dir)
            if handle is None:
                await self._jobs.lost(row.id, a.attempt, "the daemon stopped before the job started",
                                      worker=self.node_id, never_started=True, stimulus_id=f"lost-{row.id}-{a.attempt}")
                continue
            status = await asyncio.to_thread(self._runner.poll, handle)
            if a.state == "claimed" and (status.running or status.exit_code is not None):
                # The daemon died between starting the watchdog and recording it.
                await self._store.jobs.mark_running(row.id, a.attempt, handle.watchdog_pid,
                                                    handle.watchdog_create_time, handle.job_pgid or 0,
                                                    self._clock.wall())
                await self._jobs.started(row.id, a.attempt, self.node_id, f"adopt-{row.id}")
            if status.running:
                log.info("re-adopted job %s attempt %d (watchdog pid %d)", row.id, a.attempt, handle.watchdog_pid)
                await self._store.jobs.add_event(row.id, "adopted", f"re-adopted after daemon restart "
                                                 f"(watchdog pid {handle.watchdog_pid})", attempt=a.attempt,
                                                 now_wall=self._clock.wall())
                await asyncio.to_thread(self._runner.extend_deadline, handle, now + row.lease_s)
                self._worker.track((row.id, a.attempt), handle, self._jobs.spec(row), None, row.lease_s)
            else:
                await self._worker.finished((row.id, a.attempt), status)
        await self._settle_ended_attempts()
        for r in await self._store.runs.remote_runs(active=True):
            key = (r.job_id, r.attempt)
            handle = await asyncio.to_thread(self._runner.adopt, Path(r.run_dir))
            if handle is None:
                await self._store.runs.end_remote_run(r.owner, r.job_id, r.attempt, "lost", None,
                                                      "the daemon stopped before the job started",
                                                      self._clock.wall())
                continue
            status = await asyncio.to_thread(self._runner.poll, handle)
            if status.running:
                await asyncio.to_thread(self._runner.extend_deadline, handle, now + r.lease_s)
                self._worker.track(key, handle, spec_of(r.spec_json), r.owner, r.lease_s)
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
            if attempt is None or attempt.state not in ("exited", "lost"):
                continue
            holder = row.holder or ""  # the attempt row was ended by (or for) its holder
            if attempt.state == "exited":
                event: claims.Event = claims.RunExited(row.attempt, holder, attempt.exit_code, "",
                                                       f"settle-{row.id}")
            else:
                event = claims.RunLost(row.attempt, holder, attempt.reason or "lost", False, f"settle-{row.id}")
            await self._jobs.apply(row.id, event)
