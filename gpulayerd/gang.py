"""Gangs: multi-host torch.distributed jobs, mixed into :class:`gpulayerd.jobs.JobManager`.

The owner places short holds (with a TTL) on N workers in node-id order, releases them
all on any refusal and retries with jittered backoff; with all N held it claims the job
(compare-and-set) and commits every member: rank 0 is the lowest node id, whose address
and reserved port are the rendezvous. One lease for the gang: a member that fails, is
lost or stops renewing aborts the attempt everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from gpulayerd.api.peer import PeerCallError
from gpulayerd.core import claims
from gpulayerd.core.matching import Placement, evaluate, explain
from gpulayerd.core.types import Accelerator, JobRequest, WorkerSnapshot
from gpulayerd.feed import Change
from gpulayerd.models import (
    ExplanationModel,
    JobSpec,
    PlacementModel,
    SpecError,
    job_spec_from_mapping,
)
from gpulayerd.net.wire import (
    Ack,
    Commit,
    Hold,
    HoldReply,
    Kill,
    Release,
    RunReport,
    RunReportReply,
    new_msg_id,
)
from gpulayerd.roles import ManagerState
from gpulayerd.runner import RunnerError, build_env, build_gang_argv
from gpulayerd.store import JobRow, RemoteRunRow

if TYPE_CHECKING:
    pass

__all__ = ["Gang", "GangRole", "HeldResources"]

log = logging.getLogger("gpulayerd.jobs")

_M = TypeVar("_M", bound=BaseModel)


class GangRole(ManagerState):
    """Owner and worker sides of gang placement (a mixin of JobManager)."""




    async def _schedule_gang(self, row: JobRow, spec: JobSpec, req: JobRequest, local: WorkerSnapshot) -> None:
        """Owner: place short holds on N workers in node-id order, then commit them all."""
        assert req.distributed is not None
        now = time.monotonic()
        not_before = self._gang_backoff.get(row.id, (0.0, 0))[0]
        if row.id in self._gang_busy or now < not_before:
            return
        workers = [local, *self._remote_workers()]
        fits = [w for w in sorted(workers, key=lambda w: w.node_id)
                if evaluate(req, w, self._support).placement is not None]
        n = req.distributed.nnodes
        if len(fits) < n:
            e = explain(req, workers, self._support)
            summary = e.summary
            if summary != row.reason:
                await self._store.set_explanation(row.id, summary, ExplanationModel.from_core(e).model_dump_json())
                self.feed.publish(Change("job", row.id))
            return
        self._gang_busy.add(row.id)
        self._spawn(self._gang_round(row, spec, [w.node_id for w in fits[:n]]))

    async def _gang_round(self, row: JobRow, spec: JobSpec, members: list[str]) -> None:
        try:
            await self._gang_round_inner(row, spec, members)
        finally:
            self._gang_busy.discard(row.id)

    async def _gang_call(self, node: str, path: str, body: BaseModel, reply: type[_M]) -> _M:
        if node == self.node_id:
            result: BaseModel
            if isinstance(body, Hold):
                result = await self.worker_hold(self.node_id, body)
            elif isinstance(body, Release):
                result = self.worker_release(self.node_id, body)
            elif isinstance(body, Commit):
                result = await self.worker_commit(self.node_id, body)
            else:
                result = await self.worker_kill(self.node_id, body)  # type: ignore[arg-type]
            assert isinstance(result, reply)
            return result
        if self.cluster is None:
            raise PeerCallError("not in a cluster")
        return await self.cluster.call(node, path, body, reply)

    async def _gang_round_inner(self, row: JobRow, spec: JobSpec, members: list[str]) -> None:
        hold_id = secrets.token_hex(8)
        held: list[tuple[str, HoldReply]] = []
        failed = ""
        for m in members:  # node-id order: two owners never deadlock on each other's holds
            hold = Hold(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, hold_id=hold_id,
                        spec=spec.model_dump(mode="json"), ttl_s=self._config.hold_ttl_s)
            try:
                reply = await self._gang_call(m, "/v1/peer/hold", hold, HoldReply)
            except PeerCallError as e:
                failed = f"hold on {m[:12]} failed: {e}"
                break
            if not reply.held:
                failed = f"{self._label(m)} refused the hold: {reply.reason}"
                break
            held.append((m, reply))
        if failed:
            await self._gang_release(hold_id, [m for m, _ in held])
            _, k = self._gang_backoff.get(row.id, (0.0, 0))
            delay = min(30.0, 0.5 * 2**k) * (0.5 + secrets.randbelow(1000) / 1000)
            self._gang_backoff[row.id] = (time.monotonic() + delay, k + 1)
            log.info("job_id=%s: gang hold round failed (%s); retrying in %.1f s", row.id, failed, delay)
            return
        master_addr, master_port = held[0][1].address, held[0][1].port
        fresh = await self._store.get_job(row.id)
        if fresh is None:
            await self._gang_release(hold_id, members)
            return
        actions = claims.handle(self._record(fresh), claims.ClaimRequested(self.node_id, f"gang-{hold_id}"),
                                time.monotonic())
        persist = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
        grant = next((a for a in actions if isinstance(a, claims.GrantClaim)), None)
        placement = json.dumps({"gang": members, "master": f"{master_addr}:{master_port}", "hold_id": hold_id})
        if persist is None or grant is None or not await self._store.claim(
                persist, self.node_id, placement, [], "", time.time()):
            await self._gang_release(hold_id, members)
            return
        self._gang_backoff.pop(row.id, None)
        attempt = grant.attempt
        now = time.monotonic()
        gang = Gang(job_id=row.id, attempt=attempt, hold_id=hold_id, members=list(members),
                    renewed_at={m: now for m in members})
        self._gangs[row.id] = gang
        self._leases[row.id] = now + row.lease_s
        self.feed.publish(Change("job", row.id))
        for rank, m in enumerate(members):
            commit = Commit(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, hold_id=hold_id,
                            attempt=attempt, lease_s=row.lease_s, spec=spec.model_dump(mode="json"),
                            node_rank=rank, nnodes=len(members), master_addr=master_addr, master_port=master_port)
            try:
                ack = await self._gang_call(m, "/v1/peer/commit", commit, Ack)
                ok, why = ack.ok, ack.reason
            except PeerCallError as e:
                ok, why = False, str(e)
            if not ok:
                await self._gang_abort(gang, f"commit to {self._label(m)} failed: {why}")
                return

    async def _gang_release(self, hold_id: str, members: Sequence[str]) -> None:
        for m in members:
            with contextlib.suppress(PeerCallError):
                await self._gang_call(m, "/v1/peer/release", Release(msg_id=new_msg_id(), owner=self.node_id,
                                                                     hold_id=hold_id), Ack)

    async def _gang_abort(self, gang: Gang, reason: str) -> None:
        """One member lost or failed: stop every member, and the attempt is lost (or failed)."""
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
                await self._gang_call(m, "/v1/peer/kill", kill, Ack)
        failed = [code for code in gang.exits.values() if code not in (0, None)]
        self._gangs.pop(gang.job_id, None)
        await self._store.end_attempt(gang.job_id, gang.attempt, "exited" if failed else "lost",
                                      failed[0] if failed else None, reason, time.time())
        if failed:
            await self._apply_event(gang.job_id, claims.RunExited(gang.attempt, failed[0], reason))
        else:
            await self._apply_event(gang.job_id, claims.RunLost(gang.attempt, f"gang aborted: {reason}"))
        self._leases.pop(gang.job_id, None)
        self._wake.set()

    async def _gang_report(self, row: JobRow, gang: Gang, worker: str, msg: RunReport) -> RunReportReply:
        if msg.attempt != gang.attempt:
            return RunReportReply(ok=False, stale=True, current_attempt=gang.attempt)
        now = time.monotonic()
        gang.renewed_at[worker] = now
        if msg.kind == "started":
            gang.started.add(worker)
            if len(gang.started) == 1:
                await self._apply_event(row.id, claims.RunStarted(gang.attempt, self.node_id, msg.msg_id))
        elif msg.kind == "exited":
            gang.exits[worker] = msg.exit_code
            if msg.exit_code != 0:
                await self._gang_abort(gang, f"{self._label(worker)} exited {msg.exit_code}: {msg.reason}")
            elif len(gang.exits) == len(gang.members):
                self._gangs.pop(row.id, None)
                await self._store.end_attempt(row.id, gang.attempt, "exited", 0, "every member exited 0", time.time())
                self._leases.pop(row.id, None)
                await self._apply_event(row.id, claims.RunExited(gang.attempt, 0, "", msg.msg_id))
                self._wake.set()
        elif msg.kind == "lost":
            gang.exits[worker] = None
            await self._gang_abort(gang, f"{self._label(worker)} lost its rank: {msg.reason}")
        return RunReportReply(ok=True, current_attempt=gang.attempt)

    async def _gang_lease_tick(self, now: float) -> None:
        for gang in list(self._gangs.values()):
            row = await self._store.get_job(gang.job_id)
            if row is None:
                continue
            late = [m for m in gang.members if m not in gang.exits
                    and now - gang.renewed_at.get(m, 0.0) > row.lease_s + self._config.lease_grace_s]
            if late:
                await self._gang_abort(gang, f"no lease renewal from {', '.join(self._label(m) for m in late)}")
                continue
            self._leases[gang.job_id] = now + row.lease_s  # every live member renewed: so does the gang

    async def worker_hold(self, owner: str, msg: Hold) -> HoldReply:
        """Worker: reserve devices/CPU slots and a port for one member of a gang, for ``ttl_s``."""
        if msg.hold_id in self._holds:
            h = self._holds[msg.hold_id]
            return HoldReply(held=True, address=h.address, interface=h.interface, port=h.port)
        try:
            spec = job_spec_from_mapping(msg.spec, source=f"hold for {msg.job_id}")
        except SpecError as e:
            return HoldReply(held=False, reason=str(e))
        req = spec.to_core(msg.job_id)
        await self._caps_ready.wait()
        worker = await self._worker_snapshot(refresh_apps=True)
        ev = evaluate(req, self._with_paths(worker, req.workdir), self._support)
        if ev.placement is None:
            return HoldReply(held=False, reason=ev.rejections[0].message if ev.rejections else "does not fit")
        uuids = [u for u in ev.placement.device_uuids if u]
        fds = self._locks.try_acquire(uuids) if uuids else []
        if fds is None:
            return HoldReply(held=False, reason="a device was taken by another gpulayerd on this machine")
        address = self.cluster.addresses[0] if self.cluster is not None and self.cluster.addresses else "127.0.0.1"
        interface = (self.cluster.interface if self.cluster is not None else None) or "lo"
        port = _free_port(address)
        nproc = spec.distributed.nproc_per_node if spec.distributed is not None else 1
        self._holds[msg.hold_id] = HeldResources(
            owner=owner, job_id=msg.job_id, spec=spec, placement=ev.placement, fds=fds,
            expires_at=time.monotonic() + msg.ttl_s, address=address, interface=interface, port=port,
            cpu_slots=nproc if spec.requirements.accelerator is Accelerator.CPU else 0)
        return HoldReply(held=True, address=address, interface=interface, port=port)

    def worker_release(self, owner: str, msg: Release) -> Ack:
        """Worker: drop a hold (its devices and slots are free again)."""
        h = self._holds.get(msg.hold_id)
        if h is not None and h.owner == owner:
            self._holds.pop(msg.hold_id, None)
            self._locks.release(h.fds)
            self._wake.set()
        return Ack(ok=True)

    async def worker_commit(self, owner: str, msg: Commit) -> Ack:
        """Worker: start our rank of a gang job under the hold."""
        h = self._holds.get(msg.hold_id)
        if h is None or h.owner != owner:
            return Ack(ok=False, reason="no such hold (expired?)")
        self._holds.pop(msg.hold_id, None)
        spec, placement = h.spec, h.placement
        run_dir = self._config.runs_dir / msg.job_id / str(msg.attempt)
        now = time.monotonic()
        try:
            grants = [(u, i, placement.accelerator.value)
                      for u, i in zip(placement.device_uuids, placement.device_indices, strict=True) if u]
            row = RemoteRunRow(owner=owner, job_id=msg.job_id, attempt=msg.attempt,
                               spec_json=spec.model_dump_json(),
                               placement_json=PlacementModel.from_core(placement).model_dump_json(),
                               lease_s=msg.lease_s, run_dir=str(run_dir), state="running", started_at=time.time())
            if not await self._store.insert_remote_run(row, grants, time.time()):
                return Ack(ok=False, reason="devices taken meanwhile")
            self._specs[msg.job_id] = spec
            key = (msg.job_id, msg.attempt)
            self._remote[key] = owner
            self._leases_remote[key] = (now + msg.lease_s, msg.lease_s)
            argv = build_gang_argv(spec, placement.environment, nnodes=msg.nnodes, node_rank=msg.node_rank,
                                   master_addr=msg.master_addr, master_port=msg.master_port,
                                   log_dir=str(run_dir / "torchrun"))
            env = build_env(os.environ, spec, placement, msg.job_id, msg.attempt, self._config.dist_timeout_s)
            env["GLOO_SOCKET_IFNAME"] = h.interface
            env["NCCL_SOCKET_IFNAME"] = h.interface
            try:
                handle = await asyncio.to_thread(self._runner.start, msg.job_id, msg.attempt, argv, env,
                                                 spec.workdir or "/", now + msg.lease_s, h.fds)
            except RunnerError as e:
                self._remote.pop(key, None)
                self._leases_remote.pop(key, None)
                await self._store.end_remote_run(owner, msg.job_id, msg.attempt, "exited", None, str(e), time.time())
                return Ack(ok=False, reason=f"could not start: {e}")
        finally:
            self._locks.release(h.fds)
        self._track(msg.job_id, msg.attempt, handle)
        self.feed.publish(Change("devices"))
        self._spawn(self._report_started(owner, msg.job_id, msg.attempt))
        return Ack(ok=True)

    async def _report_started(self, owner: str, job_id: str, attempt: int) -> None:
        await self._report(owner, job_id, attempt, "started", None, "")

    def _expire_holds(self, now: float) -> None:
        for hold_id, h in list(self._holds.items()):
            if now > h.expires_at:
                self._holds.pop(hold_id, None)
                self._locks.release(h.fds)
                log.info("hold %s for job %s expired", hold_id, h.job_id)


@dataclass
class Gang:
    """Owner side: one attempt of a multi-host job, and what each member reported."""

    job_id: str
    attempt: int
    hold_id: str
    members: list[str]
    renewed_at: dict[str, float]
    started: set[str] = field(default_factory=set)
    exits: dict[str, int | None] = field(default_factory=dict)
    aborted: bool = False


@dataclass
class HeldResources:
    """Worker side: what a gang hold reserves until commit, release or expiry."""

    owner: str
    job_id: str
    spec: JobSpec
    placement: Placement
    fds: list[int]
    expires_at: float
    address: str
    interface: str
    port: int
    cpu_slots: int


def _free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the master of a gang binds it soon after)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
