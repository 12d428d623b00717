"""The worker: attempts that run on this machine, for this daemon's own jobs and for peers.

Local jobs: the scheduler decides, :meth:`WorkerService.claim_local` takes the device
locks and the owner's compare-and-set, and the attempt starts in the background.
Peers' jobs: offers are kept and claimed when they fit here now (late binding); a
granted attempt gets its device grants in our store, runs under its watchdog, renews
its lease (only an answered renewal moves the watchdog's deadline) and reports its end
until the owner acknowledges it.

Renewals and reports go to each owner concurrently and within a time bound, one round
in flight per owner: an owner that does not answer (powered off, stopped) delays only
its own runs, never the renewals of this machine's other jobs.

What to do is decided by the pure worker core (:mod:`gpulayerd.core.protocol.worker`, its state
kept by the :class:`Ledger`); this service does the I/O: locks, the store, the starter,
the runner, the transport.


(Same name as :mod:`gpulayerd.core.protocol.worker`: the same idea (the worker's bookkeeping),
decided there (pure) and carried out here.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger, RunKey
from gpulayerd.app.common.logread import read_log
from gpulayerd.app.common.owned_jobs import Granted, OwnedJobs
from gpulayerd.app.common.signals import Signals, log_failure
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.starter import Starter, device_grants
from gpulayerd.config import DaemonConfig
from gpulayerd.core.fairshare import Candidate
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol import worker as core
from gpulayerd.core.types import SupportMatrix
from gpulayerd.core.verdict import Placement
from gpulayerd.errors import PeerBadRequest, PeerCallError
from gpulayerd.models import JobSpec, LogChunk, PlacementModel, SpecError, job_spec_from_mapping
from gpulayerd.net.transport import CLAIM, REPORT, PeerTransport, Sender
from gpulayerd.net.wire import Ack, Claim, Kill, LogRequest, Offer, RunReport, RunReportReply, new_msg_id
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.exitnote import retry_delays
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunStatus
from gpulayerd.store import JobRow, RemoteRunRow, Store, StoreError

__all__ = ["OFFER_KEPT_S", "ReportKind", "WorkerService"]

log = logging.getLogger(__name__)

ReportKind = Literal["started", "renew", "exited", "lost"]

OFFER_KEPT_S = core.OFFER_KEPT_S
"""An offer not claimed within this long is dropped (the owner offers again while it waits)."""


def _devices(placement: Placement) -> list[str]:
    return [u for u in placement.device_uuids if u]


def _granted_spec(granted: dict[str, object] | None, offered: JobSpec, job_id: str) -> JobSpec:
    """The spec to run: the one the grant carries (the only message that must hold the job's
    environment values), else the offer's; as the offer's user either way (the one vetted)."""
    if not granted:
        return offered
    try:
        spec = job_spec_from_mapping(granted, source=f"grant of {job_id}", base_dir="/")
    except SpecError as e:
        log.warning("job_id=%s: the grant's spec does not parse (%s); running the offered one", job_id, e)
        return offered
    if spec.user != offered.user:
        if spec.user:  # (a grant that names no user is an older owner's: its offer's user was vetted)
            log.warning("job_id=%s: the grant names user %r, the offer %r: running it as %r", job_id, spec.user,
                        offered.user, offered.user)
        spec = spec.model_copy(update={"user": offered.user})
    return spec


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
        self._offers: dict[tuple[str, str], Offer] = {}  # (owner, job) -> the offer the core keeps
        self._watchers: dict[RunKey, asyncio.Task[None]] = {}
        self._owed_loaded = False  # end reports left unacknowledged by a previous life, read once
        self._usage = usage  # fair share: the order in which kept offers are claimed

    def _apply(self, event: core.Event) -> list[core.Action]:
        return self._ledger.apply(event, self._clock.monotonic())

    # ------------------------------------------------------------- local jobs

    async def claim_local(self, row: JobRow, spec: JobSpec, placement: Placement) -> bool:
        """Claim a job owned here for this machine and start it in the background.

        Claims are sequential so that each scheduling decision sees the grants before it;
        the watchdog start (a Python start-up) runs concurrently, counted as starting in
        the ledger until it runs.

        Returns:
            True if the attempt was granted (it starts soon), False if not (devices
            taken by another daemon meanwhile, or the job changed).
        """
        uuids = _devices(placement)
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            self._signals.wake()
            return False  # another daemon on this machine took a device meanwhile
        placement_json = PlacementModel.from_core(placement).model_dump_json()
        try:
            granted = await self._jobs.grant(
                row.id, self.node_id, f"claim-{row.id}", placement_json, device_grants(placement),
                run_dir_of=lambda attempt: str(self._starter.run_dir(row.id, attempt)), tries=1, row=row)
        except BaseException:
            self._locks.release(fds)
            raise
        if not isinstance(granted, Granted) or not granted.fresh:
            self._locks.release(fds)
            return False
        key = (row.id, granted.attempt)
        if not any(isinstance(a, core.StartLocal)
                   for a in self._apply(core.LocalClaimed(key, row.lease_s, frozenset(uuids)))):
            self._locks.release(fds)  # a device is in use here (a hold, a peer's run): nothing ran
            await self._jobs.lost(row.id, granted.attempt, "a device was in use on this machine",
                                  worker=self.node_id, never_started=True,
                                  stimulus_id=f"lost-{row.id}-{granted.attempt}")
            return False
        self._signals.devices_changed()
        self._ledger.starting(key, spec)
        self._signals.spawn(self._start_local(key, spec, placement, row.lease_s, fds), name=f"start-{key}")
        return True

    async def _start_local(self, key: RunKey, spec: JobSpec, placement: Placement, lease_s: float,
                           fds: list[int]) -> None:
        job_id, attempt = key
        try:
            handle = await self._starter.start(job_id, attempt, spec, placement, lease_s, fds)
        except BaseException as e:
            self._ledger.not_started(key)
            self._apply(core.RunEnded(key, None, "exited", reason=str(e)))
            if not isinstance(e, RunnerError):
                raise
            code = e.status.exit_code if e.status is not None else None
            await self._jobs.exited(job_id, attempt, code, str(e), f"could not start: {e}", worker=self.node_id)
            return
        finally:
            if fds:
                self._locks.release(fds)
        # The end of a short job is recorded after its start, not beside it: the two would race for
        # the job's row and the loser would read it and write it again.
        recorded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.track(key, handle, spec, None, lease_s, after=recorded)
        try:
            await self._jobs.started(job_id, attempt, self.node_id, f"start-{job_id}-{attempt}",
                                     run=(handle.watchdog_pid, handle.watchdog_create_time, handle.job_pgid))
        finally:
            if not recorded.done():
                recorded.set_result(None)

    # ------------------------------------------------------------- watching runs

    def track(self, key: RunKey, handle: RunHandle, spec: JobSpec, owner: str | None, lease_s: float,
              after: asyncio.Future[None] | None = None) -> None:
        """Count a running attempt in the ledger and watch it until it exits.

        Its watchdog's deadline is taken to be ``lease_s`` from now (set by the start or
        the re-adoption).

        Args:
            owner: the owner's node id when we run it for a peer (or a gang), None for a job owned here.
            after: done once the start is recorded: the end is recorded only after it.
        """
        self._apply(core.RunStarted(key, owner, lease_s))
        self._ledger.started(key, handle, spec, owner, lease_s)
        task = asyncio.create_task(self._watch(key, handle, after), name=f"watch-{key[0]}-{key[1]}")
        task.add_done_callback(log_failure)
        self._watchers[key] = task

    async def _watch(self, key: RunKey, handle: RunHandle, after: asyncio.Future[None] | None) -> None:
        status = await self._runner.async_wait(handle)
        if after is not None:
            await asyncio.shield(after)
        await self.finished(key, status)

    async def finished(self, key: RunKey, status: RunStatus, owner: str | None = None) -> None:
        """Record the end of an attempt that ran here and tell its owner (once per attempt).

        A store that cannot take the end (a full disk: ``database or disk is full``) is
        retried with backoff until it can, the attempt's lease renewed meanwhile so that it
        is not declared lost; then a watchdog that kept the end in memory is told it may go.

        Args:
            owner: for an attempt not tracked (found ended after a restart): its owner
                when it ran for a peer, None when owned here.
        """
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
        # A run its watchdog stopped at the lease deadline did not fail: its lease ran out
        # (the owner, or this daemon, was unreachable), so the attempt is lost and the job
        # retries as its policy says.
        lost = status.gone or status.reason == "deadline"
        kind: Literal["exited", "lost"] = "lost" if lost else "exited"
        actions = self._apply(core.RunEnded(key, owner, kind, status.exit_code, text))
        if not any(isinstance(a, core.RecordEnd) for a in actions):
            self._watchers.pop(key, None)
            return  # its end was recorded already
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
        if owner is not None:
            await self._carry_out(actions)

    async def _record_end(self, key: RunKey, owner: str | None, kind: Literal["exited", "lost"],
                          status: RunStatus, text: str) -> None:
        """Write an attempt's end to the store (idempotent: a retry after a failure is safe).

        Raises:
            StoreError: the store cannot take it (e.g. the disk is full).
        """
        job_id, attempt = key
        if owner is not None:
            await self._store.runs.end_remote_run(owner, job_id, attempt, kind, status.exit_code, text,
                                                  self._clock.wall())
            self._signals.devices_changed()
            self._signals.wake()
            return
        if kind == "lost":
            await self._jobs.lost(job_id, attempt, text or "the job's watchdog is gone", worker=self.node_id,
                                  stimulus_id=f"lost-{job_id}-{attempt}")
        else:
            # A start failure or a watchdog error says more than the bare exit code.
            why = status.detail if status.reason in ("start_failed", "error") else ""
            await self._jobs.exited(job_id, attempt, status.exit_code, text, why, f"exit-{job_id}-{attempt}",
                                    worker=self.node_id)
        self._signals.devices_changed()

    async def _keep_lease(self, key: RunKey, owner: str | None, lease_s: float | None) -> None:
        """While an ended attempt's end cannot be recorded, keep its lease (so it is not declared lost)."""
        if lease_s is None:
            return
        if owner is None:
            self._jobs.set_lease(key[0], self._clock.monotonic() + lease_s)
        else:
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
            msg: the offer.

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
        if any(isinstance(a, core.DropOffer) for a in self._apply(core.OfferReceived(owner, msg.job_id))):
            return Ack(ok=True, reason="already running it")  # a late duplicate offer
        self._signals.stats["offers_received"] += 1
        self._offers[(owner, msg.job_id)] = msg
        self._signals.wake()
        return Ack(ok=True)

    async def take_offers(self) -> None:
        """Claim every kept offer that fits here now, in fair-share order (the user with the least
        decayed usage first; within one user, oldest first); drop stale ones."""
        if not self._offers:
            return
        considered: list[core.ConsiderOffer] = []
        for a in self._apply(core.OffersReviewed()):
            if isinstance(a, core.DropOffer):
                self._offers.pop((a.owner, a.job_id), None)
            elif isinstance(a, core.ConsiderOffer):
                considered.append(a)
        for a in self._fair_order(considered):
            await self._consider(a.owner, a.job_id)

    def _fair_order(self, considered: list[core.ConsiderOffer]) -> list[core.ConsiderOffer]:
        """The offers to consider (oldest first, as the core gives them) in fair-share order."""
        if self._usage is None or len(considered) < 2:
            return considered
        cands = []
        for i, a in enumerate(considered):
            kept = self._offers.get((a.owner, a.job_id))
            user = kept.spec.get("user") if kept is not None else None
            cands.append(Candidate(f"{i:08d}", user if isinstance(user, str) else "", float(i)))
        return [considered[int(c.job_id)] for c in self._usage.order(cands)]

    def _drop_offers(self, actions: Sequence[core.Action]) -> None:
        for a in actions:
            if isinstance(a, core.DropOffer):
                self._offers.pop((a.owner, a.job_id), None)

    async def _consider(self, owner: str, job_id: str) -> None:
        offer = self._offers.get((owner, job_id))
        if offer is None:
            return
        try:
            # The owner resolved the workdir: base_dir only spares a Path.cwd() on the event loop.
            spec = job_spec_from_mapping(offer.spec, source=f"offer of {job_id}", base_dir="/")
        except SpecError as e:
            log.warning("job_id=%s: bad offer from %s: %s", job_id, owner[:12], e)
            self._drop_offers(self._apply(core.OfferRejected(owner, job_id)))
            return
        req = spec.to_core(job_id)
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=[(req.user, req.workdir)])
        ev = evaluate(req, worker, self._support)
        if ev.placement is None:
            return  # keep the offer: claim it when devices free up
        uuids = _devices(ev.placement)
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            return
        try:
            actions = self._apply(core.OfferFits(owner, job_id, frozenset(uuids)))
            self._drop_offers(actions)
            if any(isinstance(a, core.SendClaim) for a in actions):
                await self._claim_remote(owner, offer, spec, ev.placement, fds)
        finally:
            if fds:
                self._locks.release(fds)

    async def _claim_remote(self, owner: str, offer: Offer, spec: JobSpec, placement: Placement,
                            fds: list[int]) -> None:
        stats = self._signals.stats
        answer = core.ClaimAnswered(owner, offer.job_id, "failed")
        try:
            claim = Claim(msg_id=new_msg_id(), worker=self.node_id, job_id=offer.job_id,
                          placement=PlacementModel.from_core(placement).model_dump(mode="json"))
            stats["claims_sent"] += 1
            try:
                reply = await self._transport.call(owner, CLAIM, claim)
            except PeerCallError as e:
                stats["claims_failed"] += 1
                log.info("job_id=%s: claim at %s failed: %s", offer.job_id, owner[:12], e)
                return
            if not reply.granted:
                stats["claims_denied"] += 1
                log.debug("job_id=%s: claim denied by %s: %s", offer.job_id, owner[:12], reply.reason)
                answer = core.ClaimAnswered(owner, offer.job_id, "denied")
                return
            stats["claims_granted"] += 1
            answer = core.ClaimAnswered(owner, offer.job_id, "granted", reply.attempt, reply.lease_s)
        finally:
            actions = self._apply(answer)  # also when cancelled: the claim is never left in flight
            self._drop_offers(actions)
        for a in actions:
            if isinstance(a, core.StartRun):
                await self._start_remote(owner, a.key, a.lease_s, _granted_spec(reply.spec, spec, offer.job_id),
                                         placement, fds)

    async def _start_remote(self, owner: str, key: RunKey, lease_s: float, spec: JobSpec, placement: Placement,
                            fds: list[int]) -> None:
        job_id, attempt = key
        started = False
        try:
            if await self._store.runs.remote_run(owner, job_id, attempt):
                self._apply(core.RunEnded(key, owner, "exited", report=False))
                return  # a duplicate grant of an attempt a previous life of this daemon ran
            row = RemoteRunRow(owner=owner, job_id=job_id, attempt=attempt, spec_json=spec.model_dump_json(),
                               placement_json=PlacementModel.from_core(placement).model_dump_json(),
                               lease_s=lease_s, run_dir=str(self._starter.run_dir(job_id, attempt)),
                               state="running", started_at=self._clock.wall())
            if not await self._store.runs.insert_remote_run(row, device_grants(placement), self._clock.wall(),
                                                            node_id=self.node_id):
                await self._carry_out(self._apply(core.RunEnded(key, owner, "lost", None, "devices taken meanwhile",
                                                                never_started=True)))
                return
            self._ledger.starting(key, spec)
            try:
                handle = await self._starter.start(job_id, attempt, spec, placement, lease_s, fds)
            except RunnerError as e:
                self._ledger.not_started(key)
                await self._store.runs.end_remote_run(owner, job_id, attempt, "exited", None, str(e),
                                                      self._clock.wall())
                await self._carry_out(self._apply(core.RunEnded(key, owner, "exited", None,
                                                                f"could not start: {e}")))
                return
            started = True
        finally:
            if not started and key in self._ledger.state.runs:  # cancelled or failed on the way
                self._ledger.not_started(key)
                self._apply(core.RunEnded(key, owner, "lost", report=False))
        self.track(key, handle, spec, owner, lease_s)
        self._signals.devices_changed()
        await self.report(owner, key, "started", None, "")

    async def report(self, owner: str, key: RunKey, kind: ReportKind, exit_code: int | None, reason: str,
                     never_started: bool = False) -> RunReportReply | None:
        """Tell ``owner`` about an attempt we run for it; None if the owner did not answer."""
        msg = RunReport(msg_id=new_msg_id(), worker=self.node_id, job_id=key[0], attempt=key[1],
                        kind=kind, exit_code=exit_code, reason=reason, never_started=never_started)
        try:
            return await self._transport.call(owner, REPORT, msg)
        except PeerCallError as e:
            log.info("job_id=%s: report %s to %s failed: %s", key[0], kind, owner[:12], e)
            return None

    async def _send_report(self, key: RunKey, owed: core.OwedReport) -> None:
        reply = await self.report(owed.owner, key, owed.kind, owed.exit_code, owed.reason, owed.never_started)
        if reply is not None:
            await self._store.runs.mark_remote_reported(owed.owner, key[0], key[1])
        self._apply(core.ReportAnswered(key, reply is not None))

    async def kill(self, sender: Sender, msg: Kill) -> Ack:
        """Peer route ``kill`` (role: the owner of the run): the owner stops an attempt we run for it."""
        key = (msg.job_id, msg.attempt)
        actions = self._apply(core.KillAsked(key, sender.node_id, msg.reason))
        refused = next((a for a in actions if isinstance(a, core.RefuseKill)), None)
        entry = self._ledger.get(key)
        if refused is not None or entry is None:
            return Ack(ok=False, reason=refused.reason if refused is not None else "no such attempt here")
        await asyncio.to_thread(self._runner.cancel, entry.handle)
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
        return await read_log(path, run.job_id, run.attempt, msg.stream, msg.offset, finished)

    # ------------------------------------------------------------- leases

    async def renew(self) -> None:
        """Renew the lease of every attempt running here and move its watchdog's deadline.

        Jobs owned here renew at once; each peer owner gets one concurrent round (its
        renewals and owed end reports, bounded by ``2 × peer_timeout_s``), started only
        when its previous round is over.
        """
        if not self._owed_loaded:
            self._owed_loaded = True
            for r in await self._store.runs.remote_runs(active=False, unreported=True):
                self._apply(core.ReportOwed((r.job_id, r.attempt), core.OwedReport(
                    r.owner, "lost" if r.state == "lost" else "exited", r.exit_code, r.reason)))
        now = self._clock.monotonic()
        for a in self._ledger.apply(core.Tick(), now):
            if isinstance(a, core.RenewLocal):
                actions = await self._jobs.apply(a.key[0], claims.LeaseRenewed(a.key[1], self.node_id))
                answer: Literal["ok", "none"] = (
                    "ok" if any(isinstance(x, claims.ExtendLease) for x in actions) else "none")
                await self._carry_out(self._ledger.apply(core.RenewalAnswered(a.key, answer, now), now))
            elif isinstance(a, core.SendRenewals):
                self._signals.spawn(self._renew_round(a, now), name=f"renew-{a.owner[:12]}")

    async def _renew_round(self, round_: core.SendRenewals, now: float) -> None:
        owner = round_.owner
        owed = self._ledger.state.owed
        calls = [*(self._renew_one(owner, k, now) for k in round_.runs),
                 *(self._send_report(k, owed[k]) for k in round_.reports if k in owed)]
        bound_s = 2 * self._config.peer_timeout_s
        try:
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), bound_s)
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
        """Stop watching runs (the jobs keep running under their watchdogs)."""
        watchers = list(self._watchers.values())
        for t in watchers:
            t.cancel()
        for t in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged (log_failure)
                await t
        self._watchers.clear()
