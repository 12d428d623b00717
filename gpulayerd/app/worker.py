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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal

from gpulayerd.api.peer import PeerCallError
from gpulayerd.app.clock import Clock
from gpulayerd.app.jobs import Granted, OwnedJobs
from gpulayerd.app.ledger import Ledger, RunKey
from gpulayerd.app.logs import read_log
from gpulayerd.app.machine import Machine
from gpulayerd.app.ports import PeerTransport
from gpulayerd.app.signals import Signals, log_failure
from gpulayerd.app.starter import Starter, device_grants
from gpulayerd.config import DaemonConfig
from gpulayerd.core import claims
from gpulayerd.core.matching import evaluate
from gpulayerd.core.types import SupportMatrix
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec, LogChunk, PlacementModel, SpecError, job_spec_from_mapping
from gpulayerd.net.wire import Ack, Claim, ClaimReply, Kill, LogRequest, Offer, RunReport, RunReportReply, new_msg_id
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunStatus
from gpulayerd.store import JobRow, RemoteRunRow, Store

__all__ = ["ReportKind", "WorkerService"]

log = logging.getLogger(__name__)

ReportKind = Literal["started", "renew", "exited", "lost"]

OFFER_KEPT_S = 60.0
"""An offer not claimed within this long is dropped (the owner offers again while it waits)."""


class WorkerService:
    """Runs attempts on this machine; implements the worker side of the peer protocol."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, runner: Runner, starter: Starter,
                 ledger: Ledger, locks: DeviceLocks, machine: Machine, jobs: OwnedJobs, transport: PeerTransport,
                 support: SupportMatrix, signals: Signals, clock: Clock) -> None:
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
        self._offers: dict[tuple[str, str], tuple[Offer, float]] = {}  # (owner, job) -> offer, received
        self._watchers: dict[RunKey, asyncio.Task[None]] = {}
        self._renewing: dict[str, asyncio.Task[None]] = {}  # owner -> its renewal round in flight

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
        uuids = [u for u in placement.device_uuids if u]
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            self._signals.wake()
            return False  # another daemon on this machine took a device meanwhile
        placement_json = PlacementModel.from_core(placement).model_dump_json()
        try:
            granted = await self._jobs.grant(
                row.id, self.node_id, f"claim-{row.id}", placement_json, device_grants(placement),
                run_dir_of=lambda attempt: str(self._starter.run_dir(row.id, attempt)), tries=1)
        except BaseException:
            self._locks.release(fds)
            raise
        if not isinstance(granted, Granted) or not granted.fresh:
            self._locks.release(fds)
            return False
        self._signals.devices_changed()
        key = (row.id, granted.attempt)
        self._ledger.starting(key, spec)
        self._signals.spawn(self._start_local(key, spec, placement, row.lease_s, fds), name=f"start-{key}")
        return True

    async def _start_local(self, key: RunKey, spec: JobSpec, placement: Placement, lease_s: float,
                           fds: list[int]) -> None:
        job_id, attempt = key
        try:
            handle = await self._starter.start(job_id, attempt, spec, placement, lease_s, fds)
        except RunnerError as e:
            self._ledger.not_started(key)
            code = e.status.exit_code if e.status is not None else None
            await self._jobs.exited(job_id, attempt, code, str(e), f"could not start: {e}")
            return
        finally:
            if fds:
                self._locks.release(fds)
        self.track(key, handle, spec, None, lease_s)
        await self._store.jobs.mark_running(job_id, attempt, handle.watchdog_pid, handle.watchdog_create_time,
                                            handle.job_pgid, self._clock.wall())
        await self._jobs.started(job_id, attempt, self.node_id, f"start-{job_id}-{attempt}")

    # ------------------------------------------------------------- watching runs

    def track(self, key: RunKey, handle: RunHandle, spec: JobSpec, owner: str | None, lease_s: float) -> None:
        """Count a running attempt in the ledger and watch it until it exits.

        Args:
            owner: the owner's node id when we run it for a peer (or a gang), None for a job owned here.
        """
        self._ledger.started(key, handle, spec, owner, lease_s)
        task = asyncio.create_task(self._watch(key, handle), name=f"watch-{key[0]}-{key[1]}")
        task.add_done_callback(log_failure)
        self._watchers[key] = task

    async def _watch(self, key: RunKey, handle: RunHandle) -> None:
        status = await self._runner.async_wait(handle)
        await self.finished(key, status)

    async def finished(self, key: RunKey, status: RunStatus, owner: str | None = None) -> None:
        """Record the end of an attempt that ran here and tell its owner.

        Args:
            owner: for an attempt not tracked (found ended after a restart): its owner
                when it ran for a peer, None when owned here.
        """
        job_id, attempt = key
        entry = self._ledger.ended(key)
        self._watchers.pop(key, None)
        if entry is not None:
            owner = entry.owner
        text = status.detail or status.reason
        if status.gone and entry is not None:
            # The watchdog died but the job may live on: stop it before the attempt is
            # declared lost, or a retry would run a second copy beside it.
            await asyncio.to_thread(self._runner.cancel, entry.handle)
            text += "; its processes were stopped"
        if owner is not None:
            state = "lost" if status.gone else "exited"
            await self._store.runs.end_remote_run(owner, job_id, attempt, state, status.exit_code, text,
                                                  self._clock.wall())
            self._signals.devices_changed()
            self._signals.wake()
            self._signals.spawn(self._report_end(owner, job_id, attempt))
            return
        if status.gone:
            await self._jobs.lost(job_id, attempt, text or "the job's watchdog is gone",
                                  stimulus_id=f"lost-{job_id}-{attempt}")
        else:
            # A start failure or a watchdog error says more than the bare exit code.
            why = status.detail if status.reason in ("start_failed", "error", "deadline") else ""
            await self._jobs.exited(job_id, attempt, status.exit_code, text, why, f"exit-{job_id}-{attempt}")
        self._signals.devices_changed()

    async def kill_attempt(self, job_id: str, attempt: int, worker: str, reason: str, *, remote: bool) -> None:
        """Stop ``attempt`` of a job owned here: here if it runs here, else (``remote``) on ``worker``."""
        entry = self._ledger.get((job_id, attempt))
        if entry is not None and entry.owner is None:
            await asyncio.to_thread(self._runner.cancel, entry.handle)
        elif remote and worker and worker != self.node_id:
            self._signals.spawn(self._send_kill(worker, job_id, attempt, reason))

    async def _send_kill(self, worker: str, job_id: str, attempt: int, reason: str) -> None:
        msg = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=job_id, attempt=attempt, reason=reason)
        try:
            await self._transport.call(worker, "/v1/peer/kill", msg, Ack)
        except PeerCallError as e:
            log.info("job_id=%s: kill of attempt %d on %s failed: %s", job_id, attempt, worker[:12], e)

    # ------------------------------------------------------------- peers' jobs

    def offer(self, owner: str, msg: Offer) -> Ack:
        """Peer route: keep an owner's offer; the next scheduling pass claims it if it fits here now."""
        if self._ledger.runs_for(owner, msg.job_id):
            return Ack(ok=True, reason="already running it")  # a late duplicate offer
        self._signals.stats["offers_received"] += 1
        self._offers[(owner, msg.job_id)] = (msg, self._clock.monotonic())
        self._signals.wake()
        return Ack(ok=True)

    async def take_offers(self) -> None:
        """Claim every kept offer that fits here now, oldest first; drop stale ones."""
        if not self._offers:
            return
        now = self._clock.monotonic()
        for key, (offer, received) in sorted(self._offers.items(), key=lambda kv: kv[1][1]):
            if now - received > OFFER_KEPT_S:
                self._offers.pop(key, None)
                continue
            try:
                # The owner resolved the workdir: base_dir only spares a Path.cwd() on the event loop.
                spec = job_spec_from_mapping(offer.spec, source=f"offer of {offer.job_id}", base_dir="/")
            except SpecError as e:
                log.warning("job_id=%s: bad offer from %s: %s", offer.job_id, key[0][:12], e)
                self._offers.pop(key, None)
                continue
            req = spec.to_core(offer.job_id)
            worker = await self._machine.snapshot(refresh_apps=True, workdirs=[req.workdir])
            ev = evaluate(req, worker, self._support)
            if ev.placement is None:
                continue  # keep the offer: claim it when devices free up
            self._offers.pop(key, None)
            if self._ledger.runs_for(key[0], offer.job_id):
                continue
            await self._claim_remote(key[0], offer, spec, ev.placement)

    async def _claim_remote(self, owner: str, offer: Offer, spec: JobSpec, placement: Placement) -> None:
        uuids = [u for u in placement.device_uuids if u]
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            return
        stats = self._signals.stats
        try:
            claim = Claim(msg_id=new_msg_id(), worker=self.node_id, job_id=offer.job_id,
                          placement=PlacementModel.from_core(placement).model_dump(mode="json"))
            stats["claims_sent"] += 1
            try:
                reply = await self._transport.call(owner, "/v1/peer/claim", claim, ClaimReply)
            except PeerCallError as e:
                stats["claims_failed"] += 1
                log.info("job_id=%s: claim at %s failed: %s", offer.job_id, owner[:12], e)
                return
            if not reply.granted:
                stats["claims_denied"] += 1
                log.debug("job_id=%s: claim denied by %s: %s", offer.job_id, owner[:12], reply.reason)
                return
            stats["claims_granted"] += 1
            await self._start_remote(owner, (offer.job_id, reply.attempt), reply.lease_s, spec, placement, fds)
        finally:
            if fds:
                self._locks.release(fds)

    async def _start_remote(self, owner: str, key: RunKey, lease_s: float, spec: JobSpec, placement: Placement,
                            fds: list[int]) -> None:
        job_id, attempt = key
        if self._ledger.get(key) is not None or await self._store.runs.remote_run(owner, job_id, attempt):
            return  # a duplicate grant of an attempt we already run (or ran)
        row = RemoteRunRow(owner=owner, job_id=job_id, attempt=attempt, spec_json=spec.model_dump_json(),
                           placement_json=PlacementModel.from_core(placement).model_dump_json(), lease_s=lease_s,
                           run_dir=str(self._starter.run_dir(job_id, attempt)), state="running",
                           started_at=self._clock.wall())
        if not await self._store.runs.insert_remote_run(row, device_grants(placement), self._clock.wall()):
            await self.report(owner, key, "lost", None, "devices taken meanwhile", never_started=True)
            return
        self._ledger.starting(key, spec)
        try:
            handle = await self._starter.start(job_id, attempt, spec, placement, lease_s, fds)
        except RunnerError as e:
            self._ledger.not_started(key)
            await self._store.runs.end_remote_run(owner, job_id, attempt, "exited", None, str(e), self._clock.wall())
            await self.report(owner, key, "exited", None, f"could not start: {e}")
            return
        self.track(key, handle, spec, owner, lease_s)
        self._signals.devices_changed()
        await self.report(owner, key, "started", None, "")

    async def report(self, owner: str, key: RunKey, kind: ReportKind, exit_code: int | None, reason: str,
                     never_started: bool = False) -> RunReportReply | None:
        """Tell ``owner`` about an attempt we run for it; None if the owner did not answer."""
        msg = RunReport(msg_id=new_msg_id(), worker=self.node_id, job_id=key[0], attempt=key[1],
                        kind=kind, exit_code=exit_code, reason=reason, never_started=never_started)
        try:
            return await self._transport.call(owner, "/v1/peer/report", msg, RunReportReply)
        except PeerCallError as e:
            log.info("job_id=%s: report %s to %s failed: %s", key[0], kind, owner[:12], e)
            return None

    async def _report_end(self, owner: str, job_id: str, attempt: int) -> None:
        r = await self._store.runs.remote_run(owner, job_id, attempt)
        if r is None or r.reported:
            return
        reply = await self.report(owner, (job_id, attempt), "lost" if r.state == "lost" else "exited",
                                  r.exit_code, r.reason)
        if reply is not None:
            await self._store.runs.mark_remote_reported(owner, job_id, attempt)

    async def kill(self, owner: str, msg: Kill) -> Ack:
        """Peer route: the owner stops an attempt we run for it."""
        entry = self._ledger.get((msg.job_id, msg.attempt))
        if entry is None or entry.owner != owner:
            return Ack(ok=False, reason="no such attempt here")
        await asyncio.to_thread(self._runner.cancel, entry.handle)
        return Ack(ok=True)

    async def logs(self, msg: LogRequest) -> LogChunk:
        """Peer route: a chunk of the log of an attempt we run (or ran) for an owner."""
        path = self._starter.run_dir(msg.job_id, msg.attempt) / f"{msg.stream}.log"
        finished = self._ledger.get((msg.job_id, msg.attempt)) is None
        return await read_log(path, msg.job_id, msg.attempt, msg.stream, msg.offset, finished)

    # ------------------------------------------------------------- leases

    async def renew(self) -> None:
        """Renew the lease of every attempt running here and move its watchdog's deadline.

        Jobs owned here renew at once; each peer owner gets one concurrent round (its
        renewals and owed end reports, bounded by ``2 × peer_timeout_s``), started only
        when its previous round is over.
        """
        now = self._clock.monotonic()
        rounds: dict[str, tuple[list[RunKey], list[RunKey]]] = {}
        for key, entry in self._ledger.runs():
            if entry.owner is None:
                actions = await self._jobs.apply(key[0], claims.LeaseRenewed(key[1], self.node_id))
                if any(isinstance(a, claims.ExtendLease) for a in actions):
                    await asyncio.to_thread(self._runner.extend_deadline, entry.handle, now + entry.lease_s)
            else:
                rounds.setdefault(entry.owner, ([], []))[0].append(key)
        for r in await self._store.runs.remote_runs(active=False, unreported=True):
            rounds.setdefault(r.owner, ([], []))[1].append((r.job_id, r.attempt))
        for owner, (running, ended) in rounds.items():
            task = self._renewing.get(owner)
            if task is not None and not task.done():
                continue  # its last round is still waiting for it
            self._renewing[owner] = self._signals.spawn(self._renew_round(owner, running, ended, now),
                                                        name=f"renew-{owner[:12]}")

    async def _renew_round(self, owner: str, running: list[RunKey], ended: list[RunKey], now: float) -> None:
        calls = [*(self._renew_one(owner, k, now) for k in running),
                 *(self._report_end(owner, j, a) for j, a in ended)]
        bound_s = 2 * self._config.peer_timeout_s
        try:
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), bound_s)
        except asyncio.TimeoutError:
            log.info("owner %s did not answer %d renewals/reports within %.0f s", owner[:12], len(calls), bound_s)
            return
        for r in results:
            if isinstance(r, Exception):
                log.warning("renewal with %s failed: %r", owner[:12], r)

    async def _renew_one(self, owner: str, key: RunKey, now: float) -> None:
        entry = self._ledger.get(key)
        if entry is None:
            return
        reply = await self.report(owner, key, "renew", None, "")
        if reply is None:
            return  # owner unreachable: the deadline stays; the watchdog acts on it
        if reply.stale:
            log.info("job_id=%s attempt %d is stale at its owner: killing it", key[0], key[1])
            await asyncio.to_thread(self._runner.cancel, entry.handle)
            return
        await asyncio.to_thread(self._runner.extend_deadline, entry.handle, now + entry.lease_s)

    async def close(self) -> None:
        """Stop watching runs (the jobs keep running under their watchdogs)."""
        watchers = list(self._watchers.values())
        for t in watchers:
            t.cancel()
        for t in watchers:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged (log_failure)
                await t
        self._watchers.clear()
