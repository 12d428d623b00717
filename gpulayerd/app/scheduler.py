"""The scheduler: one pass matches the queued jobs owned here against this machine and the peers.

In fair-share order (the user with the least decayed usage first, see :mod:`gpulayerd.core.fairshare`;
within one user, submission order): a job that fits here now is claimed and started here; one that
fits only a peer is offered to the best such peer; a multi-host job goes to the gang
coordinator; anything else records why it waits. Identical jobs behind one that did
not fit are not matched again in the same pass. Then the worker claims the peers'
offers that fit here now. A job that waits here while a user with less usage holds a
device here (or waits ahead of it) says so: ``fair share: alice used 6.1 GPU-h today, bob 0.2``.
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
from gpulayerd.app.usage import UsageService
from gpulayerd.app.worker import WorkerService
from gpulayerd.config import DaemonConfig
from gpulayerd.core import fairshare
from gpulayerd.core.claims import JobStatus
from gpulayerd.core.matching import evaluate, explain, job_signature
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, Rejection, RejectionCode, Verdict
from gpulayerd.models import ExplanationModel, JobSpec
from gpulayerd.net.wire import Ack, Offer, new_msg_id
from gpulayerd.store import JobRow, Store

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs scheduling passes whenever something changes (or every ``schedule_interval_s``)."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, jobs: OwnedJobs, machine: Machine,
                 worker: WorkerService, gangs: GangCoordinator, transport: PeerTransport,
                 directory: Directory | None, support: SupportMatrix, signals: Signals, clock: Clock,
                 usage: UsageService | None = None) -> None:
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
        self._usage = usage
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
        specs = self._fair_order([(row, self._jobs.spec(row)) for row in queued])
        workdirs = [(spec.user, spec.workdir) for _, spec in specs]
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=workdirs)
        seen: dict[tuple[object, ...], Explanation | None] = {}
        usage = self._usage.usage() if self._usage is not None else {}
        waiting: list[str] = []  # users of the jobs that wait in this pass, in order
        for row, spec in specs:
            req = spec.to_core(row.id)
            if req.distributed is not None and req.distributed.nnodes > 1:
                await self._gangs.schedule(row, spec, req, worker)
                continue
            sig = job_signature(req)
            if sig in seen:  # an identical job already did not fit in this pass: the same reason
                same = seen[sig]
                if same is not None:
                    await self._set_reason(row, replace(same, job_id=row.id))
                continue
            ev = evaluate(req, worker, self._support)
            if ev.placement is None:
                if self._offer_elsewhere(row, req, spec):
                    continue
                seen[sig] = await self._record_wait(row, req, worker, usage, waiting)
                waiting.append(req.user)
                continue
            if await self._worker.claim_local(row, spec, ev.placement):
                fresh = await self._machine.snapshot(refresh_apps=False)
                worker = replace(fresh, existing_paths=worker.existing_paths, denied_paths=worker.denied_paths,
                                 unanswered_paths=worker.unanswered_paths, path_timeout_s=worker.path_timeout_s)
                seen.clear()

    def _fair_order(self, specs: list[tuple[JobRow, JobSpec]]) -> list[tuple[JobRow, JobSpec]]:
        """``specs`` in fair-share order (submission order without a usage book)."""
        if self._usage is None:
            return specs
        by_id = {row.id: (row, spec) for row, spec in specs}
        cands = [fairshare.Candidate(row.id, spec.user or "", float(row.seq if row.seq is not None else i))
                 for i, (row, spec) in enumerate(specs)]
        return [by_id[c.job_id] for c in self._usage.order(cands)]

    async def _record_wait(self, row: JobRow, req: JobRequest, worker: WorkerSnapshot,
                           usage: dict[str, fairshare.Usage] | None = None,
                           ahead: list[str] | None = None) -> Explanation:
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        e = explain(req, [worker, *remote], self._support)
        e = _with_fair_share(e, req, worker, usage or {}, ahead or [])
        await self._set_reason(row, e)
        return e

    async def _set_reason(self, row: JobRow, e: Explanation) -> None:
        summary = _summary(e)
        if summary != row.reason:
            await self._store.jobs.set_explanation(row.id, summary, ExplanationModel.from_core(e).model_dump_json())
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


def _with_fair_share(e: Explanation, req: JobRequest, worker: WorkerSnapshot, usage: dict[str, fairshare.Usage],
                     ahead: list[str]) -> Explanation:
    """``e`` with a FAIR_SHARE rejection on this machine's row when the job waits here (fits, but
    busy) while a user with less usage holds a GPU here or waits ahead of it."""
    if e.verdict is not Verdict.FITS_BUT_BUSY:
        return e
    rows = list(e.workers)
    i = next((k for k, r in enumerate(rows) if r.worker == worker.node_id), None)
    if i is None or rows[i].state is not FitState.FITS_BUT_BUSY:
        return e
    if any(r.code is RejectionCode.USER_GPU_CAP for r in rows[i].rejections):
        return e  # the per-user cap says it better
    others = list(ahead)
    if fairshare.gpus_of(req) > 0:
        others += [u for u, n in worker.gpus_held_by_user.items() if n > 0]
    winner = fairshare.passed_over_by(req.user, others, usage)
    if winner is None:
        return e
    text = fairshare.fair_share_reason(req.user, winner, usage)
    rej = Rejection(RejectionCode.FAIR_SHARE, "fair_share", req.user or "(unknown user)", winner, worker.node_id,
                    text)
    rows[i] = replace(rows[i], rejections=(rej, *rows[i].rejections))
    return replace(e, workers=tuple(rows))


def _summary(e: Explanation) -> str:
    """The one-line reason: a fair-share wait names it first, else :attr:`Explanation.summary`."""
    fair = next((r for w in e.workers for r in w.rejections if r.code is RejectionCode.FAIR_SHARE), None)
    if fair is not None:
        return f"{e.verdict.value}: {fair.message}"
    return e.summary
