"""The scheduler: one pass matches the queued jobs owned here against this machine and the peers.

In submission order: a job that fits here now is claimed and started here; one that
fits only a peer is offered to the best such peer; a multi-host job goes to the gang
coordinator; anything else records why it waits. Identical jobs behind one that did
not fit are not matched again in the same pass. Then the worker claims the peers'
offers that fit here now.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gpulayerd.api.peer import PeerCallError
from gpulayerd.app.clock import Clock
from gpulayerd.app.gang import GangCoordinator
from gpulayerd.app.jobs import OwnedJobs
from gpulayerd.app.machine import Machine
from gpulayerd.app.ports import Directory, PeerTransport
from gpulayerd.app.signals import Signals
from gpulayerd.app.worker import WorkerService
from gpulayerd.config import DaemonConfig
from gpulayerd.core.claims import JobStatus
from gpulayerd.core.matching import evaluate, explain, job_signature
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.models import ExplanationModel, JobSpec
from gpulayerd.net.wire import Ack, Offer, new_msg_id
from gpulayerd.store import JobRow, Store

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs scheduling passes whenever something changes (or every ``schedule_interval_s``)."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, jobs: OwnedJobs, machine: Machine,
                 worker: WorkerService, gangs: GangCoordinator, transport: PeerTransport,
                 directory: Directory | None, support: SupportMatrix, signals: Signals, clock: Clock) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._jobs = jobs
        self._machine = machine
        self._worker = worker
        self._gangs = gangs
        self._transport = transport
        self._directory = directory
        self._support = support
        self._signals = signals
        self._clock = clock
        self._offered: dict[str, tuple[str, float]] = {}  # our job -> (worker, when offered)

    async def loop(self) -> None:
        """Pass after pass: at every wake-up, and at least every ``schedule_interval_s``."""
        await self._machine.wait_ready()
        while True:
            self._signals.clear_wake()
            await self.run_once()
            await self._signals.wait_wake(self._config.schedule_interval_s)

    async def run_once(self) -> None:
        """One scheduling pass over the queued jobs, then the peers' offers."""
        queued = await self._store.jobs.list_jobs([JobStatus.QUEUED], None)
        if queued:
            await self._place(queued)
        await self._worker.take_offers()

    async def _place(self, queued: list[JobRow]) -> None:
        specs = [(row, self._jobs.spec(row)) for row in queued]
        workdirs = [spec.workdir for _, spec in specs]
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=workdirs)
        seen: dict[tuple[object, ...], bool] = {}
        for row, spec in specs:
            req = spec.to_core(row.id)
            if req.distributed is not None and req.distributed.nnodes > 1:
                await self._gangs.schedule(row, spec, req, worker)
                continue
            sig = job_signature(req)
            if seen.get(sig) is False:
                continue  # an identical job already did not fit in this pass
            ev = evaluate(req, worker, self._support)
            if ev.placement is None:
                if self._offer_elsewhere(row, req, spec):
                    continue
                seen[sig] = False
                await self._record_wait(row, req, worker)
                continue
            if await self._worker.claim_local(row, spec, ev.placement):
                fresh = await self._machine.snapshot(refresh_apps=False)
                worker = replace(fresh, existing_paths=worker.existing_paths,
                                 unanswered_paths=worker.unanswered_paths, path_timeout_s=worker.path_timeout_s)
                seen.clear()

    async def _record_wait(self, row: JobRow, req: JobRequest, worker: WorkerSnapshot) -> None:
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        e = explain(req, [worker, *remote], self._support)
        if e.summary != row.reason:
            await self._store.jobs.set_explanation(row.id, e.summary, ExplanationModel.from_core(e).model_dump_json())
            self._signals.job_changed(row.id)

    def _offer_elsewhere(self, row: JobRow, req: JobRequest, spec: JobSpec) -> bool:
        """Offer a job that does not fit here to the best peer that fits now; True if offered."""
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        if not remote:
            return False
        e = explain(req, remote, self._support)
        if e.placement is None:
            return False
        target = e.placement.worker
        last = self._offered.get(row.id)
        now = self._clock.monotonic()
        if last is not None and last[0] == target and now - last[1] < self._config.offer_interval_s:
            return True
        self._offered[row.id] = (target, now)
        # Environment values (tokens) go only with the grant, to the worker that runs the job.
        offered = spec.model_dump(mode="json")
        offered["env"] = dict.fromkeys(spec.env, "")
        offer = Offer(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, spec=offered, lease_s=row.lease_s)
        self._signals.spawn(self._send_offer(target, offer))
        return True

    async def _send_offer(self, worker: str, offer: Offer) -> None:
        row = await self._jobs.get(offer.job_id)
        if row is None or row.status is not JobStatus.QUEUED:
            return  # claimed meanwhile: never offer a job that is no longer queued
        self._signals.stats["offers_sent"] += 1
        try:
            await self._transport.call(worker, "/v1/peer/offer", offer, Ack)
        except PeerCallError as e:
            log.info("job_id=%s: offer to %s failed: %s", offer.job_id, worker[:12], e)
