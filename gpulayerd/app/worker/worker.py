"""The worker: attempts that run on this machine, for this daemon's own jobs and for peers alike.

Every job is offered, claimed, renewed and reported through the same messages, whoever owns it:
a job owned here that fits here now is offered to this node itself and claimed from it
(:meth:`WorkerService.claim_own`, through the self-first transport: the same role checks and
handlers as a peer's); a peer's offer is kept and claimed when it fits here now (late binding). A
granted attempt gets its run row and device grants in our store and starts in the background,
runs under its watchdog, renews its lease (only an answered renewal moves the watchdog's
deadline) and reports its end until the owner acknowledges it.

Renewals and reports go to each owner concurrently and within a time bound, one round in flight per
owner: an owner that does not answer delays only its own runs, never this machine's other renewals.

What to do is decided by the pure worker core (:mod:`gpulayerd.core.protocol.worker`: the same name, decided
there, done here; its state kept by the :class:`Ledger`); this service does the I/O: locks, the store, the starter,
the runner, the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger, RunKey
from gpulayerd.app.common.logread import read_log
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.signals import Signals, log_failure
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.kept_offers import KeptOffers, LostAnswers, claim_order, granted_spec, offered_spec
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.ship_client import TransferFailed
from gpulayerd.app.worker.starter import NotRecorded, Starter, device_grants
from gpulayerd.config import DaemonConfig
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.protocol import worker as core
from gpulayerd.core.types import SupportMatrix
from gpulayerd.core.verdict import Placement
from gpulayerd.errors import PeerBadRequest, PeerCallError, PeerRefused
from gpulayerd.models import JobSpec, LogChunk, PlacementModel, SpecError
from gpulayerd.net.transport import CLAIM, OFFER, REPORT, PeerTransport, Sender
from gpulayerd.net.wire import Ack, Claim, Kill, LogRequest, Offer, RunReport, RunReportReply, new_msg_id
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.exitnote import retry_delays
from gpulayerd.runs.preflight import PREFLIGHT_FAILED, PREFLIGHT_STOPPED
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunStatus
from gpulayerd.store import RemoteRunRow, Store, StoreError

__all__ = ["OFFER_KEPT_S", "ReportKind", "WorkerService"]

log = logging.getLogger(__name__)

ReportKind = Literal["started", "renew", "exited", "lost"]

OFFER_KEPT_S = core.OFFER_KEPT_S
"""An offer not claimed within this long is dropped (the owner offers again while it waits)."""


def _devices(placement: Placement) -> list[str]:
    return [u for u in placement.device_uuids if u]


class WorkerService:
    """Runs attempts on this machine; implements the worker side of the peer protocol."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, runner: Runner, starter: Starter,
                 ledger: Ledger, locks: DeviceLocks, machine: Machine, jobs: OwnedJobs, transport: PeerTransport,
                 support: SupportMatrix, signals: Signals, clock: Clock, usage: UsageService | None = None) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._runner = runner
        self._starter = starter
        self._ledger = ledger
        self._locks = locks
        self._machine = machine
        self._jobs = jobs
        self._transport = transport
        self._support = support
        self._signals = signals
        self._clock = clock
        self._offers = KeptOffers()  # (owner, job) -> the offer the core keeps
        self._lost = LostAnswers(transport, clock.sleep)  # claims whose answer never came
        self._watchers: dict[RunKey, asyncio.Task[None]] = {}
        self._telling: dict[RunKey, asyncio.Future[None]] = {}  # starts still being reported: ends wait
        self._deferred: set[RunKey] = set()  # ends waiting for those (each sent once, after)
        self._owed_loaded = False  # end reports left unacknowledged by a previous life, read once
        self._usage = usage  # fair share: the order in which kept offers are claimed
        self._acked: list[tuple[str, str, int]] = []  # (owner, job, attempt): end reports acknowledged, to store
        # A Slurm worker: `started` once Slurm runs it (its nodes: WHERE), renewed while squeue answers.
        self.start_gate: Callable[[str, RunKey, RunHandle], Awaitable[str]] | None = None
        self.renewable: Callable[[RunKey], bool] = lambda key: True

    def _apply(self, event: core.Event) -> list[core.Action]:
        return self._ledger.apply(event, self._clock.monotonic())

    async def claim_own(self, job_id: str, spec: JobSpec, placement: Placement) -> bool:
        """A job owned here that fits this machine now (``placement``, the scheduler's): offered to this
        node and claimed from it with the same offer and claim messages as a peer's job (through the
        self-first transport: the same role checks and handlers), then started in the background.

        Claims are sequential so that each scheduling decision sees the grants before it; the
        watchdog start (a Python start-up) runs concurrently, counted as starting in the ledger
        until it runs.

        Returns:
            True if the attempt was granted (it starts soon), False if not (the offer was refused,
            devices taken by another daemon meanwhile, or the job changed).
        """
        me = self.node_id
        try:
            ack = await self._transport.call(me, OFFER, self._jobs.make_offer(job_id, spec, me))
        except PeerCallError as e:
            log.info("job_id=%s: offer to this node failed: %s", job_id, e)
            return False
        if not ack.ok:
            log.info("job_id=%s: this node did not keep its own offer: %s", job_id, ack.reason)
            return False
        return await self._consider(me, job_id, placement)

    # ------------------------------------------------------------- watching runs

    def track(self, key: RunKey, handle: RunHandle, spec: JobSpec, owner: str, lease_s: float,
              after: asyncio.Future[None] | None = None) -> None:
        """Count a running attempt in the ledger and watch it until it exits (its watchdog's deadline
        is taken to be ``lease_s`` from now: set by the start or the re-adoption). ``owner``: the owner's
        node id (this node's for a job owned here). ``after``: done once the start is reported; the end is
        recorded here (its slot freed) as soon as it exits, but reported only after that (:meth:`_send_report`)."""
        self._apply(core.RunStarted(key, owner, lease_s))
        self._ledger.started(key, handle, spec, owner, lease_s)
        if after is not None and not after.done():
            self._telling[key] = after
            after.add_done_callback(lambda _: self._telling.pop(key, None))
            after.add_done_callback(lambda _: self._deferred.discard(key))
        task = asyncio.create_task(self._watch(key, handle), name=f"watch-{key[0]}-{key[1]}")
        task.add_done_callback(log_failure)
        self._watchers[key] = task

    def adopt(self, key: RunKey, handle: RunHandle, spec: JobSpec, owner: str, lease_s: float) -> None:
        """Watch a run re-adopted after a restart (see :meth:`track`) and tell its owner, in the
        background, that it runs (a ``started`` report the restart may have cut off: a duplicate
        changes nothing there); its end is reported only after that."""
        told: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.track(key, handle, spec, owner, lease_s, after=told)

        async def tell() -> None:
            try:
                where = await self.start_gate(owner, key, handle) if self.start_gate is not None else ""
                await self.report(owner, key, "started", None, "", where=where)
            finally:
                if not told.done():
                    told.set_result(None)

        self._signals.spawn(tell(), name=f"adopted-{key[0]}-{key[1]}")

    async def never_started(self, key: RunKey, owner: str, reason: str) -> None:
        """A run whose watchdog never started (and now never will, after a restart): its end is
        recorded as lost and its owner told it never started (re-queued without using a retry)."""
        await self._store.runs.end_remote_run(owner, key[0], key[1], "lost", None, reason, self._clock.wall())
        await self._carry_out(self._apply(core.RunEnded(key, owner, "lost", None, reason, never_started=True)))

    async def _watch(self, key: RunKey, handle: RunHandle) -> None:
        status = await self._runner.async_wait(handle)
        await self._starter.after_run(key)  # a shipped attempt's outputs go back first (its lease still renewed)
        await self.finished(key, status)

    async def finished(self, key: RunKey, status: RunStatus, owner: str = "") -> None:
        """Tell its owner an attempt that ran here ended, and record the end here (once per attempt).

        A store that cannot take the end (a full disk: ``database or disk is full``) is retried with backoff
        until it can, the attempt's lease renewed meanwhile so that it is not declared lost; then a watchdog
        that kept the end in memory is told it may go. ``owner``: for an attempt not tracked (found ended
        after a restart), its owner."""
        job_id, attempt = key
        entry = self._ledger.ended(key)
        if entry is not None:
            owner = entry.owner
        text = status.detail or status.reason
        if status.gone and entry is not None:
            # The watchdog died but the job may live on: stop it before the attempt is
            # declared lost, or a retry would run a second copy beside it.
            await asyncio.to_thread(self._runner.cancel, entry.handle)
            text += "; its processes were stopped"
        # Stopped at the lease deadline: lost (the job retries as its policy says), not failed. A failed
        # pre-flight check: lost too, nothing of the job ran (the owner moves it to another worker).
        preflight = status.reason in (PREFLIGHT_FAILED, PREFLIGHT_STOPPED)
        lost = preflight or status.gone or status.reason == "deadline"
        kind: Literal["exited", "lost"] = "lost" if lost else "exited"
        if status.reason == PREFLIGHT_FAILED and entry is not None:  # (a stopped check marks nothing)
            await self._machine.preflight_failed(entry.handle.run_dir, text)
        checked = self._starter.import_checks.pop(key, None)  # (no file read at each end: the starter knows)
        if checked is not None and status.reason in ("exited", "timeout"):  # the command ran: its check passed
            self._machine.preflight_passed(*checked)
        actions = self._apply(core.RunEnded(key, owner, kind, status.exit_code, text, never_started=preflight,
                                            timed_out=status.timed_out, preflight=preflight))
        if not any(isinstance(a, core.RecordEnd) for a in actions):
            self._watchers.pop(key, None)
            return  # its end was recorded already
        # Its owner is told at once, while the end is recorded here: a restart before either repeats
        # both (the run row says running, the watchdog keeps its exit record); a repeat changes nothing.
        await self._carry_out(actions)
        failed = 0
        for delay in retry_delays(0.1, min(2.0, max(entry.lease_s / 3, 0.1)) if entry is not None else 2.0):
            try:
                await self._record_end(key, owner, kind, status, text)
                break
            except (StoreError, OSError) as e:
                if not failed:
                    log.warning("job_id=%s attempt %d: cannot record its end (%s: %s) yet; retrying until it can",
                                job_id, attempt, kind, e)
                failed += 1
            await self._keep_lease(key, owner, entry.lease_s if entry is not None else None)
            await self._clock.sleep(delay)
        if failed:
            log.info("job_id=%s attempt %d: its end is recorded after %d failed tries", job_id, attempt, failed)
        self._watchers.pop(key, None)
        if entry is not None and status.kept:  # only a watchdog that kept its record waits for this
            await asyncio.to_thread(self._runner.recorded, entry.handle)

    async def _record_end(self, key: RunKey, owner: str, kind: Literal["exited", "lost"],
                          status: RunStatus, text: str) -> None:
        """Write an attempt's end (idempotent: a retry is safe; not ``durable`` when its owner is this node, which
        records it durably too); its owner is told by the report the core owes it.

        Raises:
            StoreError: the store cannot take it (e.g. the disk is full).
        """
        job_id, attempt = key
        state = "timeout" if status.timed_out else "preflight-failed" if status.reason in (
            PREFLIGHT_FAILED, PREFLIGHT_STOPPED) else kind
        await self._store.runs.end_remote_run(owner, job_id, attempt, state, status.exit_code, text, self._clock.wall(),
                                              node_id=self.node_id)
        self._signals.devices_changed()  # (after the write: a snapshot reads the device grants from the store)
        self._signals.slot_freed(job_id) if owner == self.node_id else self._signals.wake()

    async def _keep_lease(self, key: RunKey, owner: str, lease_s: float | None) -> None:
        """While an ended attempt's end cannot be recorded, keep its lease (so it is not declared lost)."""
        if lease_s is not None:
            await self.report(owner, key, "renew", None, "")

    async def _carry_out(self, actions: Sequence[core.Action]) -> None:
        """Carry out the core's run actions: reports (in the background), deadlines, kills."""
        for a in actions:
            if isinstance(a, core.SendReport):
                self._signals.spawn(self._send_report(a.key, a.report), name=f"report-{a.key[0]}-{a.key[1]}")
            elif isinstance(a, (core.ExtendDeadline, core.KillRun)):
                entry = self._ledger.get(a.key)
                if entry is None:
                    continue
                if isinstance(a, core.ExtendDeadline):
                    await asyncio.to_thread(self._runner.extend_deadline, entry.handle, a.deadline)
                else:
                    log.info("job_id=%s attempt %d: %s: killing it", a.key[0], a.key[1], a.reason)
                    await asyncio.to_thread(self._runner.cancel, entry.handle)

    # ------------------------------------------------------------- peers' jobs

    def offers_kept(self) -> dict[tuple[str, str], Offer]:
        """(owner, job id) -> the offer kept here (a copy; for the logical state and diagnostics)."""
        return dict(self._offers)

    async def offer(self, sender: Sender, msg: Offer) -> Ack:
        """Peer route ``offer`` (role: the job's owner, which vouches for its user): keep an owner's
        offer; the next scheduling pass claims it if it fits here now.

        Args:
            sender: the owner, as its certificate proves it.
            msg: the offer (one that fits here now asks for a pass at once; others a paced one).

        Returns:
            ``Ack(ok=False, reason=...)``, nothing kept, unless that user's jobs run here
            (:meth:`~gpulayerd.app.worker.accounts.Accounts.vet`: a personal worker only its own user's,
            root's only where allowed, and the account exists here); a job that names no user
            is kept as the user the owner is bound to.
        """
        owner = sender.node_id
        spec, refused = await self._machine.accounts.vet(msg.spec, sender.mode, sender.user)
        if refused is not None:
            log.info("job_id=%s: offer from %s not kept: %s", msg.job_id, owner[:12], refused)
            return Ack(ok=False, reason=refused)
        msg = msg.model_copy(update={"spec": spec})
        dropped = [a for a in self._apply(core.OfferReceived(owner, msg.job_id)) if isinstance(a, core.DropOffer)]
        if dropped:  # a late duplicate offer (ok), or one past the owner's share of kept offers
            return Ack(ok=dropped[0].reason != core.TOO_MANY_OFFERS, reason=dropped[0].reason)
        self._signals.stats["offers_received"] += 1
        self._offers[(owner, msg.job_id)] = msg
        if owner != self.node_id:  # (this node's own offer is claimed at once: no pass needed)
            if self._offers.fits_now((owner, msg.job_id), await self._machine.snapshot(False), self._support):
                self._signals.wake()  # it fits here now: claimed at once
            else:
                self._signals.peer_wake()  # (a stream of offers that cannot fit here yet: a paced pass)
        return Ack(ok=True)

    def has_offers(self) -> bool:
        """Whether a peer's offer is kept here (this node's own are claimed at once)."""
        return any(owner != self.node_id for owner, _ in self._offers)

    async def take_offers(self, below: float | None = None) -> None:
        """Claim every kept offer that fits here now, in fair-share order (the user with the least
        lab-wide decayed usage first; within one user, submission order); drop stale ones. With
        ``below``, only the offers of users whose fair-share score is under it (the best of this
        node's own waiting users: they go before this node's own jobs). A device freed halfway through
        (the devices changed, not by a claim here) stops the walk: a pass comes at once, from the head."""
        if not self._offers:
            return
        considered: list[core.ConsiderOffer] = []
        for a in self._apply(core.OffersReviewed()):
            if isinstance(a, core.DropOffer):
                self._offers.pop((a.owner, a.job_id), None)
            elif isinstance(a, core.ConsiderOffer):
                considered.append(a)
        kept = [self._offers.get((a.owner, a.job_id)) for a in considered]
        epoch, machine = self._signals.devices_epoch, await self._machine.snapshot(refresh_apps=False)
        for i in claim_order(kept, self._usage, below):
            offer, key = kept[i], (considered[i].owner, considered[i].job_id)
            if self._signals.devices_epoch != epoch:  # a device freed meanwhile: walk again from the head
                self._signals.wake()
                return
            if offer is None or not self._offers.may_fit(key, machine, self._support):
                continue  # (waits for devices gpulayer granted: no process list, no workdir check)
            if await self._consider(*key):
                epoch, machine = self._signals.devices_epoch, await self._machine.snapshot(refresh_apps=False)

    def _drop_offers(self, actions: Sequence[core.Action]) -> None:
        for a in actions:
            if isinstance(a, core.DropOffer):
                self._offers.pop((a.owner, a.job_id), None)

    async def _consider(self, owner: str, job_id: str, placement: Placement | None = None) -> bool:
        """Claim the kept offer of ``owner``'s job ``job_id`` if it fits here now (``placement``: as
        the caller judged it just now, else judged here), then start it in the background.

        Returns:
            True if a claim was granted (the attempt starts soon).
        """
        offer = self._offers.get((owner, job_id))  # (one's own offer is kept as a peer's is)
        if offer is None or (owner, job_id) in self._lost:
            return False
        spec: JobSpec | None = None  # parsed only to judge it here (a placement given was judged on it)
        if placement is None:
            try:
                spec = offered_spec(offer)
            except SpecError as e:
                log.warning("job_id=%s: bad offer from %s: %s", job_id, owner[:12], e)
                self._drop_offers(self._apply(core.OfferRejected(owner, job_id)))
                return False
            req = spec.to_core(job_id)
            worker = await self._machine.snapshot(refresh_apps=True, workdirs=[(req.user, req.workdir)])
            placement = evaluate(req, worker, self._support).placement
            if placement is None:
                return False  # keep the offer: claim it when devices free up
        uuids = _devices(placement)
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            self._signals.wake()  # another daemon on this machine took a device meanwhile
            return False
        handed = False
        try:
            actions = self._apply(core.OfferFits(owner, job_id, frozenset(uuids)))
            self._drop_offers(actions)
            if not any(isinstance(a, core.SendClaim) for a in actions):
                return False
            granted = await self._claim(owner, offer, spec, placement)
            if granted is None:
                return False
            key, lease_s, run_spec = granted
            self._ledger.starting(key, run_spec)  # counted before the next scheduling decision
            self._signals.devices_changed()
            self._signals.spawn(self._start_run(owner, key, lease_s, run_spec, placement, fds), name=f"start-{key}")
            handed = True  # the start releases the device locks
            return True
        finally:
            if fds and not handed:
                self._locks.release(fds)

    async def _claim(self, owner: str, offer: Offer, spec: JobSpec | None,
                     placement: Placement) -> tuple[RunKey, float, JobSpec] | None:
        """Send the claim; the attempt to start (its key, lease and the spec to run) if granted
        (a grant whose spec cannot be run is ended at once as never started)."""
        stats = self._signals.stats
        answer = core.ClaimAnswered(owner, offer.job_id, "failed")
        reply = None
        try:
            claim = Claim(msg_id=new_msg_id(), worker=self.node_id, job_id=offer.job_id,
                          placement=PlacementModel.from_core(placement).model_dump(mode="json"))
            stats["claims_sent"] += 1
            try:
                reply = await self._transport.call(owner, CLAIM, claim)
            except PeerCallError as e:
                stats["claims_failed"] += 1
                log.info("job_id=%s: claim at %s failed: %s", offer.job_id, owner[:12], e)
                if not isinstance(e, PeerRefused):  # a grant whose answer was lost goes back now, not at its lease
                    self._signals.spawn(self._lost.give_back(owner, claim), name=f"give-back-{offer.job_id}")
                return None
            if not reply.granted:
                stats["claims_denied"] += 1
                log.debug("job_id=%s: claim denied by %s: %s", offer.job_id, owner[:12], reply.reason)
                answer = core.ClaimAnswered(owner, offer.job_id, "denied")
                return None
            stats["claims_granted"] += 1
            answer = core.ClaimAnswered(owner, offer.job_id, "granted", reply.attempt, reply.lease_s)
        finally:
            actions = self._apply(answer)  # also when cancelled: the claim is never left in flight
            self._drop_offers(actions)
        start = next((a for a in actions if isinstance(a, core.StartRun)), None)
        if start is None or reply is None:
            return None
        try:
            own = self._jobs.cached_spec(offer.job_id) if owner == self.node_id else None  # (parsed at submit)
            return start.key, start.lease_s, granted_spec(reply.spec, offer, spec, own)
        except SpecError as e:
            log.warning("job_id=%s: granted, but no spec of it runs here: %s", offer.job_id, e)
            await self._carry_out(self._apply(core.RunEnded(start.key, owner, "lost", None,
                                                            f"its spec does not parse here: {e}", never_started=True)))
            return None

    async def _start_run(self, owner: str, key: RunKey, lease_s: float, spec: JobSpec, placement: Placement,
                         fds: list[int]) -> None:
        """Start a granted attempt (counted as starting by the caller): its run row and device grants, its watchdog,
        the ``started`` report (its end is reported after it); ``fds`` released once the watchdog holds them."""
        job_id, attempt = key
        started = False
        try:
            if (owner, attempt) in await self._store.runs.stored_runs(job_id):  # (from memory)
                self._apply(core.RunEnded(key, owner, "exited", report=False))
                return  # a duplicate grant of an attempt a previous life of this daemon ran
            row = RemoteRunRow(owner=owner, job_id=job_id, attempt=attempt, spec_json=spec.model_dump_json(),
                               placement_json=PlacementModel.from_core(placement).model_dump_json(),
                               lease_s=lease_s, run_dir=str(self._starter.run_dir(job_id, attempt)),
                               state="running", started_at=self._clock.wall())
            recorded = self._store.runs.insert_remote_run(row, device_grants(placement), self._clock.wall(),
                                                          node_id=self.node_id)  # (the start waits for it)
            try:
                handle = await self._starter.start(job_id, attempt, spec, placement, lease_s, fds, owner=owner,
                                                   renew=lambda: self._renew_starting(owner, key), recorded=recorded)
            except NotRecorded:
                await self._carry_out(self._apply(core.RunEnded(key, owner, "lost", None, "devices taken meanwhile",
                                                                never_started=True)))
                return
            except TransferFailed as e:  # nothing started: re-queued as never started, with the reason
                await self.never_started(key, owner, str(e))
                return
            except RunnerError as e:  # the cause first ("command not found: X") and its exit code (127)
                code, why = e.status.exit_code if e.status else None, e.cause
                await self._store.runs.end_remote_run(owner, job_id, attempt, "exited", code, why, self._clock.wall())
                await self._carry_out(self._apply(core.RunEnded(key, owner, "exited", code, f"could not start: {why}")))
                return
            started = True
        finally:
            if fds:
                self._locks.release(fds)
            if not started:
                self._ledger.not_started(key)
                if key in self._ledger.state.runs:  # cancelled or failed on the way
                    self._apply(core.RunEnded(key, owner, "lost", report=False))
                self._signals.wake()  # its slot is free again (the owner's end of a run here asks for no pass)
        # A short job's end is reported after its start (track): else the owner decides on them in either order.
        reported: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.track(key, handle, spec, owner, lease_s, after=reported)
        self._signals.devices_changed()
        try:
            where = await self.start_gate(owner, key, handle) if self.start_gate is not None else ""
            await self.report(owner, key, "started", None, self._starter.transfer_note(key), where=where)
        finally:
            if not reported.done():
                reported.set_result(None)

    async def _renew_starting(self, owner: str, key: RunKey) -> bool:
        """Renew the lease of an attempt still starting (a shipped job's transfer); False: stale there."""
        reply = await self.report(owner, key, "renew", None, "")
        return reply is None or not reply.stale

    async def report(self, owner: str, key: RunKey, kind: ReportKind, exit_code: int | None, reason: str,
                     never_started: bool = False, timed_out: bool = False,
                     preflight: bool = False, where: str = "") -> RunReportReply | None:
        """Tell ``owner`` about an attempt we run for it; None if the owner did not answer."""
        msg = RunReport(msg_id=new_msg_id(), worker=self.node_id, job_id=key[0], attempt=key[1], kind=kind,
                        exit_code=exit_code, reason=reason, never_started=never_started, timed_out=timed_out,
                        preflight_failed=preflight, where=where)
        try:
            return await self._transport.call(owner, REPORT, msg)
        except PeerCallError as e:
            log.info("job_id=%s: report %s to %s failed: %s", key[0], kind, owner[:12], e)
            return None

    async def _send_report(self, key: RunKey, owed: core.OwedReport) -> None:
        if (telling := self._telling.get(key)) is not None:  # the owner hears of the start first: sent after
            if key not in self._deferred:  # (once: a renewal round meanwhile asks again)
                self._deferred.add(key)
                telling.add_done_callback(lambda _: self._signals.spawn(self._send_report(key, owed)))
            return
        reply = None
        try:
            reply = await self.report(owed.owner, key, owed.kind, owed.exit_code, owed.reason, owed.never_started,
                                      owed.timed_out, owed.preflight)
            if reply is not None:
                # Stored with the next renewal tick, many in one write (a restart first: sent again, answered alike).
                self._acked.append((owed.owner, key[0], key[1]))
        finally:  # (whatever happened: an unanswered report is sent again in the owner's next round)
            self._apply(core.ReportAnswered(key, reply is not None))

    async def _store_acks(self) -> None:
        """Store the acknowledgements of end reports received since the last call (one write)."""
        acked, self._acked = self._acked, []
        if acked:
            try:
                await self._store.runs.mark_remote_reported_many(acked)
            except (StoreError, OSError) as e:  # (a full disk): kept for the next tick; renewals go on
                log.info("cannot store %d acknowledged end reports yet: %s", len(acked), e)
                self._acked[:0] = acked

    async def kill(self, sender: Sender, msg: Kill) -> Ack:
        """Peer route ``kill`` (role: the owner of the run): the owner stops an attempt we run for it."""
        key = (msg.job_id, msg.attempt)
        actions = self._apply(core.KillAsked(key, sender.node_id, msg.reason))
        refused = next((a for a in actions if isinstance(a, core.RefuseKill)), None)
        entry = self._ledger.get(key)
        if refused is not None or entry is None:
            return Ack(ok=False, reason=refused.reason if refused is not None else "no such attempt here")
        await asyncio.to_thread(self._runner.cancel, entry.handle, msg.signal)
        return Ack(ok=True)

    async def logs(self, sender: Sender, msg: LogRequest) -> LogChunk:
        """Peer route ``logs`` (role: the owner of the run): a chunk of the log of an attempt we run
        (or ran) for the sender.

        The file is found from the stored run (owner, job, attempt): its run directory, never
        the request's text.

        Raises:
            PeerBadRequest: no such run is stored here (it went between the role check and now).
        """
        owner = sender.node_id
        run = await self._store.runs.remote_run(owner, msg.job_id, msg.attempt)
        if run is None or not run.run_dir:
            raise PeerBadRequest(f"no attempt {msg.attempt} of job {msg.job_id!r} is stored here")
        path = Path(run.run_dir) / f"{msg.stream}.log"
        entry = self._ledger.get((run.job_id, run.attempt))
        finished = run.state != "running" or entry is None or entry.owner != owner
        return await read_log(path, run.job_id, run.attempt, msg.stream, msg.offset, finished, msg.limit)

    async def renew(self) -> None:
        """Renew the lease of every attempt running here and move its watchdog's deadline.

        Each owner (this node for the jobs owned here) gets one concurrent round (its renewals and owed end
        reports, bounded by ``2 × peer_timeout_s``), started only when its previous round is over.
        """
        await self._store_acks()
        if self._starter.shipping is not None:  # kept trees of shipped attempts, past ship_keep_s
            await self._starter.shipping.sweep()
        if not self._owed_loaded:
            self._owed_loaded = True
            for r in await self._store.runs.remote_runs(active=False, unreported=True):
                self._apply(core.ReportOwed((r.job_id, r.attempt), core.OwedReport(
                    r.owner, "lost" if r.state == "lost" else "exited", r.exit_code, r.reason,
                    never_started=r.state == "preflight-failed", timed_out=r.state == "timeout",
                    preflight=r.state == "preflight-failed")))
        now = self._clock.monotonic()
        for a in self._ledger.apply(core.Tick(), now):
            if isinstance(a, core.SendRenewals):
                self._signals.spawn(self._renew_round(a, now), name=f"renew-{a.owner[:12]}")

    async def _renew_round(self, round_: core.SendRenewals, now: float) -> None:
        owner = round_.owner
        owed = self._ledger.state.owed
        calls = [*(self._renew_one(owner, k, now) for k in round_.runs if self.renewable(k)),
                 *(self._send_report(k, owed[k]) for k in round_.reports if k in owed)]
        bound_s = 2 * self._config.peer_timeout_s
        try:
            results = await self._clock.wait_for(asyncio.gather(*calls, return_exceptions=True), bound_s)
        except asyncio.TimeoutError:
            log.info("owner %s did not answer %d renewals/reports within %.0f s", owner[:12], len(calls), bound_s)
            return
        finally:
            self._apply(core.RoundEnded(owner))
        for r in results:
            if isinstance(r, Exception):
                log.warning("renewal with %s failed: %r", owner[:12], r)

    async def _renew_one(self, owner: str, key: RunKey, now: float) -> None:
        reply = await self.report(owner, key, "renew", None, "")
        # Unanswered: the deadline stays (the watchdog acts on it); stale: kill it.
        answer: Literal["ok", "stale", "none"] = "none" if reply is None else "stale" if reply.stale else "ok"
        await self._carry_out(self._ledger.apply(core.RenewalAnswered(key, answer, now), self._clock.monotonic()))

    async def close(self) -> None:
        """Stop watching runs (the jobs keep running under their watchdogs); store the acknowledged
        end reports (those a failure leaves are sent again after a restart)."""
        await self._store_acks()
        watchers = list(self._watchers.values())
        for t in watchers:
            t.cancel()  # (then awaited: each ends)
        for t in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged (log_failure)
                await t
        self._watchers.clear()
