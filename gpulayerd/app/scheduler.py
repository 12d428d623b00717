"""The scheduler: one pass matches the queued jobs owned here against this machine and the peers.

In fair-share order (the user with the least decayed usage first, see :mod:`gpulayerd.core.fairshare`;
within one user, submission order): a job that fits here now is claimed and started here; one that
fits only a peer is offered to the best such peer; a multi-host job goes to the gang
coordinator. Identical jobs behind one that did not fit here are not matched again
in the same pass. Then every one-host job still queued gets its current reason, judged
against this machine as the pass left it and the peers' last snapshots (identical jobs
share the judgement, each job's row is written when its reason changed): a short code
and the deciding words (:mod:`gpulayerd.core.reasons`), e.g. ``Busy: cpu slots 1 free
of 2 on ws-1 (needs 2)``; one that fits only a peer now is offered to it (``Ready``).
A job that waits here while a user with less usage holds a device here (or waits ahead
of it) says so: ``FairShare: fair share: alice used 6.1 GPU-h today, bob 0.2``. Then the
worker claims the peers' offers that fit here now.
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
from gpulayerd.core.reasons import reason_text
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
        blocked: set[tuple[object, ...]] = set()  # signatures that did not fit here since the last claim
        left: list[tuple[JobRow, JobSpec, JobRequest]] = []  # one-host jobs still queued after placing
        for row, spec in specs:
            req = spec.to_core(row.id)
            if req.distributed is not None and req.distributed.nnodes > 1:
                await self._gangs.schedule(row, spec, req, worker)
                continue
            sig = job_signature(req)
            if sig not in blocked:  # an identical job did not fit: neither does this one
                ev = evaluate(req, worker, self._support)
                if ev.placement is None:
                    blocked.add(sig)
                elif await self._worker.claim_local(row, spec, ev.placement):
                    fresh = await self._machine.snapshot(refresh_apps=False)
                    worker = replace(fresh, existing_paths=worker.existing_paths, denied_paths=worker.denied_paths,
                                     unanswered_paths=worker.unanswered_paths, path_timeout_s=worker.path_timeout_s)
                    blocked.clear()
                    continue
            left.append((row, spec, req))
        await self._reasons(left, worker)

    async def _reasons(self, left: list[tuple[JobRow, JobSpec, JobRequest]], worker: WorkerSnapshot) -> None:
        """Offer each job that fits only a peer now to it; every other job records why it waits.

        Judged against ``worker`` as the placing left it (after this pass's claims) and the
        peers' last snapshots: identical jobs share one explanation (the fair-share part is
        each job's own), and each job's row is updated when its reason changed.
        """
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        usage = self._usage.usage() if self._usage is not None else {}
        shared: dict[tuple[object, ...], Explanation] = {}
        waiting: list[str] = []  # users of the jobs that wait in this pass, in order
        offers: list[tuple[JobRow, JobSpec, str]] = []
        for row, spec, req in left:
            sig = job_signature(req)
            e = shared.get(sig)
            if e is None:
                e = shared[sig] = explain(req, [worker, *remote], self._support)
            e = replace(e, job_id=row.id)
            if e.placement is not None and e.placement.worker != self.node_id:
                offers.append((row, spec, e.placement.worker))
            else:
                e = _with_fair_share(e, req, worker, usage, waiting)
                waiting.append(req.user)
            await self._set_reason(row, e)
        for row, spec, target in offers:  # together, after the writes: a peer sees the pass's offers at once
            self._offer(row, spec, target)

    def _fair_order(self, specs: list[tuple[JobRow, JobSpec]]) -> list[tuple[JobRow, JobSpec]]:
        """``specs`` in fair-share order (submission order without a usage book)."""
        if self._usage is None:
            return specs
        by_id = {row.id: (row, spec) for row, spec in specs}
        cands = [fairshare.Candidate(row.id, spec.user or "", float(row.seq if row.seq is not None else i))
                 for i, (row, spec) in enumerate(specs)]
        return [by_id[c.job_id] for c in self._usage.order(cands)]

    async def _set_reason(self, row: JobRow, e: Explanation) -> None:
        """Store ``e`` and its reason line (:func:`gpulayerd.core.reasons.reason_text`) when the line changed."""
        text = reason_text(e)
        if text != row.reason:
            await self._store.jobs.set_explanation(row.id, text, ExplanationModel.from_core(e).model_dump_json())
            self._signals.job_changed(row.id)

    def _offer(self, row: JobRow, spec: JobSpec, target: str) -> None:
        """Offer a job that fits the peer ``target`` now to it (at most every ``offer_interval_s``)."""
        last = self._offered.get(row.id)
        now = self._clock.monotonic()
        if last is not None and last[0] == target and now - last[1] < self._config.offer_interval_s:
            return
        self._offered[row.id] = (target, now)
        # Environment values (tokens) go only with the grant, to the worker that runs the job.
        offered = spec.model_dump(mode="json")
        offered["env"] = dict.fromkeys(spec.env, "")
        offer = Offer(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, spec=offered, lease_s=row.lease_s)
        self._signals.spawn(self._send_offer(target, offer))

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
    text = fairshare.fair_share_reason(req.user, winner, usage, gpus=fairshare.gpus_of(req) > 0)
    rej = Rejection(RejectionCode.FAIR_SHARE, "fair_share", req.user or "(unknown user)", winner, worker.node_id,
                    text)
    rows[i] = replace(rows[i], rejections=(rej, *rows[i].rejections))
    return replace(e, workers=tuple(rows))
