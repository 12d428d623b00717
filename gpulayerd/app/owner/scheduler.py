"""The scheduler's I/O driver: runs the passes :class:`gpulayerd.core.scheduling.SchedulerCore` decides.

At every wake-up (a submit, an exit, a probe, a peer's change) and at least every
``schedule_interval_s``, one pass: the core asks for the queue's changes, this machine's
snapshot and the peers', and answers with claims, gang hand-overs, reason lines and offers;
this service reads the store, snapshots the machine, claims through the worker, writes the
reasons and sends the offers, and decides nothing itself. A wake-up by the timer alone is
skipped when the core says nothing it reads can have changed (:meth:`SchedulerCore.idle`).
Then the worker claims the peers' offers that fit here now. A wake-up by peers' messages alone is paced
(``TimerPass.hold``). A wake-up by the end of runs of this node's own array tasks alone gives each freed slot
to its array's next task without a pass, when the core says that is the claim a pass would make first
(:mod:`gpulayerd.core.scheduling.successor`)."""

from __future__ import annotations

import asyncio
import logging

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.owner.array_book import ArrayBook
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.config import DaemonConfig
from gpulayerd.core import scheduling as core
from gpulayerd.core.arrays import split_task_id
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.types import SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import Explanation
from gpulayerd.errors import PeerCallError
from gpulayerd.models import ExplanationModel
from gpulayerd.net.transport import OFFER, PeerTransport
from gpulayerd.store import JobRow, Store

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs scheduling passes whenever something changes (or every ``schedule_interval_s``)."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, jobs: OwnedJobs, machine: Machine,
                 worker: WorkerService, gangs: GangCoordinator, transport: PeerTransport,
                 directory: Directory | None, support: SupportMatrix, signals: Signals, clock: Clock,
                 usage: UsageService | None = None, arrays: ArrayBook | None = None) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._jobs = jobs
        self._machine = machine
        self._worker = worker
        self._gangs = gangs
        self._transport = transport
        self._directory = directory
        self._signals = signals
        self._clock = clock
        self._usage = usage
        self._arrays = arrays  # arrays' tasks and dependencies, ticked after each pass
        self.core = core.SchedulerCore(node_id, support, offer_interval_s=config.offer_interval_s,
                                       fair_share=usage is not None)
        self.passes_skipped = 0
        self._timer = core.TimerPass(config.schedule_interval_s, clock.monotonic())  # (successors never hold it off)
        self._ticking: asyncio.Task[None] | None = None  # the books' tick running in the background
        self._tick_again = False  # asked again while it ran

    def _kept(self, row: JobRow, *, fresh: bool = False) -> core.QueuedJob:
        """``row`` as the core keeps it (id, seq, reason line, a retry's worker to avoid and end of
        backoff, its submit time), with its request when it is new to the queue (or ``fresh``: a reload). The rest of
        the row is read again by a claim or a gang."""
        queued = row.status is JobStatus.QUEUED and (fresh or not self.core.queued(row.id))
        return core.QueuedJob(row.id, row.seq, row.reason, self._jobs.spec(row).to_core(row.id) if queued else None,
                              avoid=row.avoid_worker, retry_at=row.retry_at, submitted_at=row.submitted_at)

    def _schedulable(self, row: JobRow) -> bool:
        """Whether queued ``row`` is the scheduler's: not an array's own row (its tasks are), not
        waiting for a dependency (:class:`~gpulayerd.app.owner.dependency_gate.DependencyGate`)."""
        if row.status is not JobStatus.QUEUED:
            return False
        if self._arrays is None or ('"array":"' not in row.spec_json and '"after":["' not in row.spec_json):
            return True
        spec = self._jobs.spec(row)
        held = self._arrays.gate.holds(row, spec)  # (registers a job that waits)
        return not held and not self._arrays.is_array(spec)

    async def _tick_books(self) -> None:
        """Dependencies judged and arrays' tasks materialized (:meth:`DependencyGate.tick`, :meth:`ArrayBook.tick`)."""
        if self._arrays is None:
            return
        try:
            await self._arrays.gate.tick()
            await self._arrays.tick()
        except Exception:  # the next pass tries again; the scheduler goes on
            log.exception("arrays and dependencies: tick failed")

    def _peers(self) -> list[WorkerSnapshot]:
        return self._directory.worker_snapshots() if self._directory is not None else []

    def _idle(self) -> bool:
        """Whether a timer-only pass would decide nothing new (see :meth:`SchedulerCore.idle`); never when
        a retry's backoff ended since the last pass (:meth:`SchedulerCore.retry_due`)."""
        due = self.core.retry_due()
        if due is not None and self._clock.wall() >= due:
            return False
        return self.core.idle(self._peers(), self._usage.usage() if self._usage is not None else None)

    async def loop(self) -> None:
        """Pass after pass: at every wake-up (peers' alone paced), at least every ``schedule_interval_s``."""
        await self._machine.wait_ready()
        woken = True
        while True:
            await self.react(woken)
            self._timer.turned(self._clock.monotonic())
            due = self.core.retry_due()  # a pass when a retry's backoff ends, and when the timer's pass is owed
            wait = self._timer.left(self._clock.monotonic())
            await self._signals.wait_wake(wait if due is None else min(wait, max(due - self._clock.wall(), 0.01)))
            if (hold := self._timer.hold(self._clock.monotonic(), self._signals.peers_only())) > 0:
                await self._signals.wait_local(hold)  # peers' messages alone: paced (one pass takes them all)
            woken = self._signals.woken()

    async def react(self, woken: bool) -> None:
        """One turn of :meth:`loop`, after a wake-up (``woken``) or the timer: slots freed by this node's own array
        tasks alone go to their arrays' next tasks (:meth:`_successors`) unless the timer's pass is due (``TimerPass``);
        else a pass, unless the timer alone woke it and the core says nothing changed (then the peers' offers)."""
        self._signals.clear_wake()
        freed, asked = self._signals.take_freed()
        now = self._clock.monotonic()
        if woken and not asked and not self._timer.due(now, self._idle) and await self._successors(freed):
            self._tick_soon()  # (a slot freed, its next task claimed, or an end to count: no pass asked for)
        elif woken or not self._idle():
            self._signals.stats["scheduler_passes"] += 1
            self._timer.looked(now)
            await self.run_once()
        else:
            self._timer.looked(now)
            self.passes_skipped += 1
            self._signals.stats["scheduler_passes_skipped"] += 1
            self._tick_soon()
            await self._worker.take_offers(below=self._best_waiting())  # (the rest after the next pass)

    async def run_once(self) -> None:
        """One scheduling pass over the queued jobs (the core's actions carried out), then the peers'
        offers; the offers of users with less lab-wide usage than every user waiting here go first.
        Arrays and dependencies are ticked after the pass, in the background (:meth:`_tick_soon`), off the
        path from a freed slot to its next claim: what they let in wakes the next pass."""
        try:
            await self._pass()
        finally:
            self._tick_soon()

    async def _successors(self, freed: list[str]) -> bool:
        """Claim for each slot that a run of a job of ``freed`` (owned here, run here) left its array's next
        task, when the core says a pass would claim it first (:meth:`SchedulerCore.successor`); False as soon
        as one is not so (a pass decides then)."""
        usage = self._usage.usage() if self._usage is not None else None
        for job_id in freed:
            ended = self._jobs.cached_spec(job_id) if split_task_id(job_id) is not None else None
            if ended is None:  # (no task, or its spec no longer cached: the next task's user and workdir are its)
                return False
            req = ended.to_core(job_id)
            try:
                # (a successor asks for no device: no nvidia-smi process list, which a pass asks for)
                worker = await self._machine.snapshot(refresh_apps=False, workdirs=[(req.user or None, req.workdir)])
                claim = self.core.successor(job_id, worker, usage, self._worker.has_offers())
                spec = await self._jobs.spec_of(claim.job.id) if claim is not None else None
                if claim is None or spec is None or not await self._worker.claim_own(claim.job.id, spec,
                                                                                     claim.placement):
                    return False
            except Exception:  # (the pass that follows meets it too, and says so)
                log.exception("job_id=%s: its slot's next task could not be claimed", job_id)
                return False
            self.core.claimed_here(claim.job.id)
            self._signals.stats["scheduler_successor_claims"] += 1
        return True

    def _tick_soon(self) -> None:
        """Tick the books (:meth:`_tick_books`) in a background task, one tick at a time: asked while one
        runs, it runs once more after it."""
        if self._arrays is None:
            return
        if self._ticking is not None and not self._ticking.done():
            self._tick_again = True
            return
        self._ticking = self._signals.spawn(self._tick_while_asked(), name="scheduler-books")

    async def _tick_while_asked(self) -> None:
        again = True
        while again:
            self._tick_again = False
            await self._tick_books()
            again = self._tick_again

    async def _pass(self) -> None:
        best = self._best_waiting()
        if best is not None:
            await self._worker.take_offers(below=best)
        epoch = self._signals.devices_epoch
        steps = self.core.run_pass()
        answer: core.Answer = None
        failure: BaseException | None = None
        while True:
            thrown, failure = failure, None
            try:
                action = steps.throw(thrown) if thrown is not None else steps.send(answer)
            except StopIteration:
                break
            finally:
                thrown = None  # an error that leaves the pass keeps no reference to this frame
            try:
                answer = await self._carry_out(action)
            except BaseException as e:  # thrown into the pass: it forgets what it cannot vouch for
                failure = e
        if best is not None and self._signals.devices_epoch != epoch:
            # This machine's devices changed during the pass (freed, or claimed by it): the jobs still waiting
            # here were not judged against that; the offers of users after them wait for the next pass, at once.
            await self._worker.take_offers(below=best)
            self._signals.wake()
            return
        await self._worker.take_offers()

    def _best_waiting(self) -> float | None:
        """The lowest fair-share score of the users with jobs queued here; None when no peer's offer is kept
        here (nothing to order against them), no job is queued here, or there is no fair share."""
        if self._usage is None or not self._worker.has_offers():
            return None
        return self._usage.best_score(self.core.waiting_users())

    async def _carry_out(self, action: core.Action) -> core.Answer:
        """Do what ``action`` says; returns its answer."""
        if isinstance(action, core.Yield):
            await asyncio.sleep(0)  # a long queue never holds up the API or a job's start
        elif isinstance(action, core.ReadChanges):
            head, count, rows = await self._store.jobs.queue_changes(action.since)
            changed = tuple((self._kept(r), self._schedulable(r)) for r in rows)
            held = self._arrays.held() if self._arrays is not None else 0  # queued, but not the scheduler's
            return core.QueueChanges(head, count - held, changed)
        elif isinstance(action, core.ReadQueue):
            head, _, _ = await self._store.jobs.queue_changes(1 << 62)  # changes after head are read again
            queued = await self._store.jobs.list_jobs([JobStatus.QUEUED], None)
            return core.QueueLoaded(head, tuple(self._kept(r, fresh=True) for r in queued if self._schedulable(r)))
        elif isinstance(action, core.ReadMachine):
            local = (await self._machine.snapshot(refresh_apps=True, workdirs=list(action.workdirs))
                     if action.local else None)
            usage = self._usage.usage() if self._usage is not None else None
            return core.MachineRead(local, tuple(self._peers()), usage, self._clock.monotonic(), self._clock.wall())
        elif isinstance(action, core.Claim):
            return await self._claim(action)
        elif isinstance(action, core.ToGang):
            row = await self._jobs.get(action.job.id)
            if row is not None and row.status is JobStatus.QUEUED:
                spec = self._jobs.spec(row)
                await self._gangs.schedule(row, spec, spec.to_core(row.id), action.local)
        elif isinstance(action, core.StoreReasons):
            await self._write_reasons(action.items)
        elif isinstance(action, core.SendOffer):
            self._signals.spawn(self._send_offer(action.worker, action.job_id))
        elif isinstance(action, core.Count):
            self._signals.stats[action.stat] += 1
        return core.Resume()

    async def _claim(self, action: core.Claim) -> core.ClaimAnswered:
        """Offer a job that fits here now to this node and claim it (:meth:`WorkerService.claim_own`:
        the same messages as a peer's); this machine afresh when granted."""
        spec = await self._jobs.spec_of(action.job.id)  # (cached: no read)
        if spec is None:
            return core.ClaimAnswered(False, gone=True)  # removed meanwhile
        if not await self._worker.claim_own(action.job.id, spec, action.placement):
            return core.ClaimAnswered(False)
        return core.ClaimAnswered(True, await self._machine.snapshot(refresh_apps=False))

    async def _write_reasons(self, items: tuple[tuple[core.QueuedJob, str, Explanation], ...]) -> None:
        """Store each job's new reason line and explanation, in one transaction. The jobs of one shape
        share an explanation: it is converted once (only its job id differs between their rows)."""
        made: dict[int, tuple[Explanation, ExplanationModel]] = {}  # id -> (the explanation, kept alive; its model)
        rows = []
        for job, text, e in items:
            got = made.get(id(e))
            if got is None:
                got = made[id(e)] = (e, ExplanationModel.from_core(e))
            model = got[1] if e.job_id == job.id else got[1].model_copy(update={"job_id": job.id})
            rows.append((job.id, text, model.model_dump_json()))
        await self._store.jobs.set_explanations(rows)
        for job, _, _ in items:
            self._signals.job_changed(job.id)

    async def _send_offer(self, worker: str, job_id: str) -> None:
        row = await self._jobs.get(job_id)
        if row is None or row.status is not JobStatus.QUEUED:
            return  # claimed meanwhile: never offer a job that is no longer queued
        offer = self._jobs.make_offer(row.id, self._jobs.spec(row), worker, row.submitted_at)
        self._signals.stats["offers_sent"] += 1
        try:
            await self._transport.call(worker, OFFER, offer)
        except PeerCallError as e:
            log.info("job_id=%s: offer to %s failed: %s", offer.job_id, worker[:12], e)
