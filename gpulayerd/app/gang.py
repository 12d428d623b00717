"""Gangs: multi-host torch.distributed jobs. The coordinator runs on the owner, the member on each worker.

The owner places short holds (with a TTL) on N workers in node-id order, releases them
all on any refusal and retries with jittered backoff; with all N held it claims the job
(compare-and-set) and commits every member: rank 0 is the lowest node id, whose address
and reserved port are the rendezvous. One lease for the gang: a member that fails, is
lost or stops renewing aborts the attempt everywhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpulayerd.api.peer import PeerCallError
from gpulayerd.app.clock import Clock
from gpulayerd.app.jobs import Granted, OwnedJobs
from gpulayerd.app.ledger import HeldResources, Ledger
from gpulayerd.app.machine import Machine
from gpulayerd.app.names import Names
from gpulayerd.app.ports import Directory, PeerTransport
from gpulayerd.app.signals import Signals
from gpulayerd.app.starter import GangRank, Starter, device_grants
from gpulayerd.app.worker import WorkerService
from gpulayerd.config import DaemonConfig
from gpulayerd.core.matching import evaluate, explain
from gpulayerd.core.types import Accelerator, JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.models import ExplanationModel, JobSpec, PlacementModel, SpecError, job_spec_from_mapping
from gpulayerd.net.wire import Ack, Commit, Hold, HoldReply, Kill, Release, RunReport, RunReportReply, new_msg_id
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import RunnerError
from gpulayerd.store import JobRow, RemoteRunRow, Store

__all__ = ["Gang", "GangCoordinator", "GangMember"]

log = logging.getLogger(__name__)


@dataclass
class Gang:
    """Owner side: one attempt of a multi-host job, and what each member reported (monotonic s)."""

    job_id: str
    attempt: int
    hold_id: str
    members: list[str]
    renewed_at: dict[str, float]
    started: set[str] = field(default_factory=set)
    exits: dict[str, int | None] = field(default_factory=dict)
    aborted: bool = False


class GangCoordinator:
    """Owner side of gang placement: hold rounds, commit, reports, one lease, abort."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, jobs: OwnedJobs,
                 transport: PeerTransport, directory: Directory | None, names: Names, support: SupportMatrix,
                 signals: Signals, clock: Clock, rng: random.Random) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._jobs = jobs
        self._transport = transport
        self._directory = directory
        self._names = names
        self._support = support
        self._signals = signals
        self._clock = clock
        self._rng = rng
        self._gangs: dict[str, Gang] = {}  # our multi-host jobs being run
        self._busy: set[str] = set()  # jobs with a hold round in flight
        self._backoff: dict[str, tuple[float, int]] = {}  # job -> (not before, failures)

    async def schedule(self, row: JobRow, spec: JobSpec, req: JobRequest, local: WorkerSnapshot) -> None:
        """Place a queued multi-host job: start a hold round if enough workers fit, else record why not."""
        assert req.distributed is not None
        now = self._clock.monotonic()
        not_before = self._backoff.get(row.id, (0.0, 0))[0]
        if row.id in self._busy or now < not_before:
            return
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        workers = [local, *remote]
        fits = [w for w in sorted(workers, key=lambda w: w.node_id)
                if evaluate(req, w, self._support).placement is not None]
        n = req.distributed.nnodes
        if len(fits) < n:
            e = explain(req, workers, self._support)
            if e.summary != row.reason:
                await self._store.jobs.set_explanation(row.id, e.summary,
                                                       ExplanationModel.from_core(e).model_dump_json())
                self._signals.job_changed(row.id)
            return
        self._busy.add(row.id)
        self._signals.spawn(self._round(row, spec, [w.node_id for w in fits[:n]]), name=f"gang-{row.id}")

    async def _round(self, row: JobRow, spec: JobSpec, members: list[str]) -> None:
        try:
            await self._hold_and_commit(row, spec, members)
        finally:
            self._busy.discard(row.id)

    async def _hold_and_commit(self, row: JobRow, spec: JobSpec, members: list[str]) -> None:
        hold_id = f"{self._rng.getrandbits(64):016x}"
        held: list[tuple[str, HoldReply]] = []
        failed = ""
        for m in members:  # node-id order: two owners never deadlock on each other's holds
            hold = Hold(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, hold_id=hold_id,
                        spec=spec.model_dump(mode="json"), ttl_s=self._config.hold_ttl_s)
            try:
                reply = await self._transport.call(m, "/v1/peer/hold", hold, HoldReply)
            except PeerCallError as e:
                failed = f"hold on {m[:12]} failed: {e}"
                break
            if not reply.held:
                failed = f"{self._names.label(m)} refused the hold: {reply.reason}"
                break
            held.append((m, reply))
        if failed:
            await self._release(hold_id, [m for m, _ in held])
            _, k = self._backoff.get(row.id, (0.0, 0))
            delay = min(30.0, 0.5 * 2**k) * (0.5 + self._rng.random())
            self._backoff[row.id] = (self._clock.monotonic() + delay, k + 1)
            log.info("job_id=%s: gang hold round failed (%s); retrying in %.1f s", row.id, failed, delay)
            return
        master_addr, master_port = held[0][1].address, held[0][1].port
        placement = json.dumps({"gang": members, "master": f"{master_addr}:{master_port}", "hold_id": hold_id})
        granted = await self._jobs.grant(row.id, self.node_id, f"gang-{hold_id}", placement, tries=1)
        if not isinstance(granted, Granted) or not granted.fresh:
            await self._release(hold_id, members)
            return
        self._backoff.pop(row.id, None)
        attempt = granted.attempt
        now = self._clock.monotonic()
        gang = Gang(job_id=row.id, attempt=attempt, hold_id=hold_id, members=list(members),
                    renewed_at={m: now for m in members})
        self._gangs[row.id] = gang
        for rank, m in enumerate(members):
            commit = Commit(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, hold_id=hold_id,
                            attempt=attempt, lease_s=row.lease_s, spec=spec.model_dump(mode="json"),
                            node_rank=rank, nnodes=len(members), master_addr=master_addr, master_port=master_port)
            try:
                ack = await self._transport.call(m, "/v1/peer/commit", commit, Ack)
                ok, why = ack.ok, ack.reason
            except PeerCallError as e:
                ok, why = False, str(e)
            if not ok:
                await self._abort(gang, f"commit to {self._names.label(m)} failed: {why}")
                return

    async def _release(self, hold_id: str, members: Sequence[str]) -> None:
        for m in members:
            with contextlib.suppress(PeerCallError):
                await self._transport.call(m, "/v1/peer/release", Release(msg_id=new_msg_id(), owner=self.node_id,
                                                                          hold_id=hold_id), Ack)

    async def _abort(self, gang: Gang, reason: str) -> None:
        """One member lost or failed: stop every member; the attempt is lost (or failed)."""
        if gang.aborted:
            return
        gang.aborted = True
        log.info("job_id=%s attempt %d: gang abort: %s", gang.job_id, gang.attempt, reason)
        for m in gang.members:
            if m in gang.exits:
                continue
            kill = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=gang.job_id, attempt=gang.attempt,
                        reason=f"gang abort: {reason}")
            with contextlib.suppress(PeerCallError):
                await self._transport.call(m, "/v1/peer/kill", kill, Ack)
        failed = [code for code in gang.exits.values() if code not in (0, None)]
        self._gangs.pop(gang.job_id, None)
        if failed:
            await self._jobs.exited(gang.job_id, gang.attempt, failed[0], reason, reason)
        else:
            await self._jobs.lost(gang.job_id, gang.attempt, f"gang aborted: {reason}")

    async def report(self, row: JobRow, worker: str, msg: RunReport) -> RunReportReply | None:
        """A member's report on a gang attempt; None if ``worker`` is not a member of a gang of ``row``."""
        gang = self._gangs.get(row.id)
        if gang is None or worker not in gang.members:
            return None
        if msg.attempt != gang.attempt:
            return RunReportReply(ok=False, stale=True, current_attempt=gang.attempt)
        gang.renewed_at[worker] = self._clock.monotonic()
        if msg.kind == "started":
            gang.started.add(worker)
            if len(gang.started) == 1:
                await self._jobs.started(row.id, gang.attempt, self.node_id, msg.msg_id)
        elif msg.kind == "exited":
            gang.exits[worker] = msg.exit_code
            if msg.exit_code != 0:
                await self._abort(gang, f"{self._names.label(worker)} exited {msg.exit_code}: {msg.reason}")
            elif len(gang.exits) == len(gang.members):
                self._gangs.pop(row.id, None)
                await self._jobs.exited(row.id, gang.attempt, 0, "every member exited 0", "", msg.msg_id)
        elif msg.kind == "lost":
            gang.exits[worker] = None
            await self._abort(gang, f"{self._names.label(worker)} lost its rank: {msg.reason}")
        return RunReportReply(ok=True, current_attempt=gang.attempt)

    async def check_leases(self) -> None:
        """Abort a gang whose member stopped renewing; otherwise its one lease is renewed."""
        now = self._clock.monotonic()
        for gang in list(self._gangs.values()):
            row = await self._jobs.get(gang.job_id)
            if row is None:
                continue
            late = [m for m in gang.members if m not in gang.exits
                    and now - gang.renewed_at.get(m, 0.0) > row.lease_s + self._config.lease_grace_s]
            if late:
                await self._abort(gang, f"no lease renewal from {', '.join(self._names.label(m) for m in late)}")
                continue
            self._jobs.set_lease(gang.job_id, now + row.lease_s)  # every live member renewed: so does the gang


class GangMember:
    """Worker side of gang placement: holds, release, commit of one rank."""

    def __init__(self, *, node_id: str, store: Store, ledger: Ledger, locks: DeviceLocks, machine: Machine,
                 starter: Starter, worker: WorkerService, directory: Directory | None, support: SupportMatrix,
                 signals: Signals, clock: Clock) -> None:
        self.node_id = node_id
        self._store = store
        self._ledger = ledger
        self._locks = locks
        self._machine = machine
        self._starter = starter
        self._worker = worker
        self._directory = directory
        self._support = support
        self._signals = signals
        self._clock = clock

    async def hold(self, owner: str, msg: Hold) -> HoldReply:
        """Peer route: reserve devices/CPU slots and a port for one member of a gang, for ``ttl_s``."""
        h = self._ledger.held(msg.hold_id)
        if h is not None:
            return HoldReply(held=True, address=h.address, interface=h.interface, port=h.port)
        try:
            # The owner resolved the workdir: base_dir only spares a Path.cwd() on the event loop.
            spec = job_spec_from_mapping(msg.spec, source=f"hold for {msg.job_id}", base_dir="/")
        except SpecError as e:
            return HoldReply(held=False, reason=str(e))
        req = spec.to_core(msg.job_id)
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=[req.workdir])
        ev = evaluate(req, worker, self._support)
        if ev.placement is None:
            return HoldReply(held=False, reason=ev.rejections[0].message if ev.rejections else "does not fit")
        uuids = [u for u in ev.placement.device_uuids if u]
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            return HoldReply(held=False, reason="a device was taken by another gpulayerd on this machine")
        d = self._directory
        address = d.addresses[0] if d is not None and d.addresses else "127.0.0.1"
        interface = (d.interface if d is not None else None) or "lo"
        port = _free_port(address)
        nproc = spec.distributed.nproc_per_node if spec.distributed is not None else 1
        self._ledger.hold(msg.hold_id, HeldResources(
            owner=owner, job_id=msg.job_id, spec=spec, placement=ev.placement, fds=fds,
            expires_at=self._clock.monotonic() + msg.ttl_s, address=address, interface=interface, port=port,
            cpu_slots=nproc if spec.requirements.accelerator is Accelerator.CPU else 0))
        return HoldReply(held=True, address=address, interface=interface, port=port)

    async def release(self, owner: str, msg: Release) -> Ack:
        """Peer route: drop a hold (its devices and slots are free again)."""
        h = self._ledger.held(msg.hold_id)
        if h is not None and h.owner == owner:
            self._ledger.release(msg.hold_id)
            self._locks.release(h.fds)
            self._signals.wake()
        return Ack(ok=True)

    async def commit(self, owner: str, msg: Commit) -> Ack:
        """Peer route: start our rank of a gang job under the hold."""
        h = self._ledger.held(msg.hold_id)
        if h is None or h.owner != owner:
            return Ack(ok=False, reason="no such hold (expired?)")
        self._ledger.release(msg.hold_id)
        spec, placement = h.spec, h.placement
        key = (msg.job_id, msg.attempt)
        try:
            row = RemoteRunRow(owner=owner, job_id=msg.job_id, attempt=msg.attempt,
                               spec_json=spec.model_dump_json(),
                               placement_json=PlacementModel.from_core(placement).model_dump_json(),
                               lease_s=msg.lease_s, run_dir=str(self._starter.run_dir(msg.job_id, msg.attempt)),
                               state="running", started_at=self._clock.wall())
            if not await self._store.runs.insert_remote_run(row, device_grants(placement), self._clock.wall()):
                return Ack(ok=False, reason="devices taken meanwhile")
            rank = GangRank(nnodes=msg.nnodes, node_rank=msg.node_rank, master_addr=msg.master_addr,
                            master_port=msg.master_port, interface=h.interface)
            self._ledger.starting(key, spec)
            try:
                handle = await self._starter.start(msg.job_id, msg.attempt, spec, placement, msg.lease_s, h.fds,
                                                   gang=rank)
            except RunnerError as e:
                self._ledger.not_started(key)
                await self._store.runs.end_remote_run(owner, msg.job_id, msg.attempt, "exited", None, str(e),
                                                      self._clock.wall())
                return Ack(ok=False, reason=f"could not start: {e}")
        finally:
            self._locks.release(h.fds)
        self._worker.track(key, handle, spec, owner, msg.lease_s)
        self._signals.devices_changed()
        self._signals.spawn(self._report_started(owner, key))
        return Ack(ok=True)

    async def _report_started(self, owner: str, key: tuple[str, int]) -> None:
        await self._worker.report(owner, key, "started", None, "")

    def expire_holds(self) -> None:
        """Drop holds past their TTL."""
        now = self._clock.monotonic()
        for hold_id, h in self._ledger.holds():
            if now > h.expires_at:
                self._ledger.release(hold_id)
                self._locks.release(h.fds)
                log.info("hold %s for job %s expired", hold_id, h.job_id)


def _free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the master of a gang binds it soon after)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
