"""The peer protocol's owner and worker sides, mixed into :class:`gpulayerd.jobs.JobManager`.

Owner side: offer a job that fits only a peer, grant (compare-and-set) or deny a
worker's claim, take a worker's reports (started, renew, exited, lost). Worker side:
keep offers, claim them when they fit here now (late binding), run granted attempts
under their watchdogs with their device grants in our own store, renew their leases
(only an answered renewal moves the watchdog's deadline) and report their end until the
owner acknowledges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel

from gpulayerd.api.peer import PeerCallError
from gpulayerd.core import claims
from gpulayerd.core.claims import JobStatus
from gpulayerd.core.matching import Placement, evaluate, explain
from gpulayerd.core.types import JobRequest
from gpulayerd.feed import Change
from gpulayerd.models import (
    JobSpec,
    LogChunk,
    PlacementModel,
    SpecError,
    job_spec_from_mapping,
)
from gpulayerd.net.wire import (
    Ack,
    Claim,
    ClaimReply,
    Kill,
    LogRequest,
    Offer,
    RunReport,
    RunReportReply,
    new_msg_id,
)
from gpulayerd.roles import ManagerState
from gpulayerd.runner import RunnerError, build_argv, build_env
from gpulayerd.store import JobRow, RemoteRunRow

if TYPE_CHECKING:
    pass

__all__ = ["LOG_CHUNK_BYTES", "RemoteRole", "whole_chars"]

log = logging.getLogger("gpulayerd.jobs")

_M = TypeVar("_M", bound=BaseModel)

LOG_CHUNK_BYTES = 1 << 20


class RemoteRole(ManagerState):
    """Owner and worker sides of the peer protocol (a mixin of JobManager)."""



    def _offer_elsewhere(self, row: JobRow, req: JobRequest, spec: JobSpec) -> bool:
        """Offer a job that does not fit here to the best peer that fits now; True if offered."""
        remote = self._remote_workers()
        if not remote or self.cluster is None:
            return False
        e = explain(req, remote, self._support)
        if e.placement is None:
            return False
        target = e.placement.worker
        last = self._offered.get(row.id)
        now = time.monotonic()
        if last is not None and last[0] == target and now - last[1] < self._config.offer_interval_s:
            return True
        self._offered[row.id] = (target, now)
        offer = Offer(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id,
                      spec=spec.model_dump(mode="json"), lease_s=row.lease_s)
        self._spawn(self._send_offer(target, offer))
        return True

    async def _send_offer(self, worker: str, offer: Offer) -> None:
        assert self.cluster is not None
        row = await self._store.get_job(offer.job_id)
        if row is None or row.status is not JobStatus.QUEUED:
            return  # claimed meanwhile: never offer a job that is no longer queued
        self.stats["offers_sent"] += 1
        try:
            await self.cluster.call(worker, "/v1/peer/offer", offer, Ack)
        except PeerCallError as e:
            log.info("job_id=%s: offer to %s failed: %s", offer.job_id, worker[:12], e)

    async def _send_kill(self, worker: str, job_id: str, attempt: int, reason: str) -> None:
        if self.cluster is None:
            return
        msg = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=job_id, attempt=attempt, reason=reason)
        try:
            await self.cluster.call(worker, "/v1/peer/kill", msg, Ack)
        except PeerCallError as e:
            log.info("job_id=%s: kill of attempt %d on %s failed: %s", job_id, attempt, worker[:12], e)

    # --- owner side

    async def owner_claim(self, worker: str, msg: Claim) -> ClaimReply:
        """A worker claims one of our queued jobs: compare-and-set, then GRANT or DENY."""
        row = await self._store.get_job(msg.job_id)
        if row is None:
            return ClaimReply(granted=False, reason="no such job")
        placement_json = json.dumps(msg.placement or {})
        for _ in range(3):
            actions = claims.handle(self._record(row), claims.ClaimRequested(worker, msg.msg_id), time.monotonic())
            persist = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
            grant = next((a for a in actions if isinstance(a, claims.GrantClaim)), None)
            if grant is None:
                deny = next((a for a in actions if isinstance(a, claims.DenyClaim)), None)
                self.stats["claim_requests_denied"] += 1
                return ClaimReply(granted=False, reason=deny.reason if deny else "denied")
            if persist is None:  # the holder asked again: the same grant
                return ClaimReply(granted=True, attempt=grant.attempt, lease_s=grant.lease_s,
                                  spec=self._spec(row).model_dump(mode="json"))
            if await self._store.claim(persist, worker, placement_json, [], "", time.time()):
                self.stats["claim_requests_granted"] += 1
                self._leases[row.id] = time.monotonic() + row.lease_s
                self.feed.publish(Change("job", row.id))
                return ClaimReply(granted=True, attempt=grant.attempt, lease_s=grant.lease_s,
                                  spec=self._spec(row).model_dump(mode="json"))
            fresh = await self._store.get_job(msg.job_id)
            if fresh is None:
                break
            row = fresh
        return ClaimReply(granted=False, reason="the job changed meanwhile")

    async def owner_report(self, worker: str, msg: RunReport) -> RunReportReply:
        """A worker reports on an attempt of one of our jobs."""
        row = await self._store.get_job(msg.job_id)
        if row is None:
            return RunReportReply(ok=True, stale=True)
        gang = self._gangs.get(row.id)
        if gang is not None and worker in gang.members:
            return await self._gang_report(row, gang, worker, msg)
        event: claims.Event
        if msg.kind == "started":
            event = claims.RunStarted(msg.attempt, worker, msg.msg_id)
        elif msg.kind == "renew":
            event = claims.LeaseRenewed(msg.attempt, worker, msg.msg_id)
        elif msg.kind == "exited":
            event = claims.RunExited(msg.attempt, msg.exit_code, msg.reason if msg.exit_code != 0 else "",
                                     msg.msg_id)
        else:
            event = claims.RunLost(msg.attempt, msg.reason or f"lost on {worker[:12]}", msg.never_started,
                                   msg.msg_id)
        if msg.kind in ("exited", "lost") and msg.attempt == row.attempt:
            await self._store.end_attempt(row.id, msg.attempt, "exited" if msg.kind == "exited" else "lost",
                                          msg.exit_code, msg.reason, time.time())
        if msg.kind == "started" and msg.attempt == row.attempt:
            await self._store.mark_running(row.id, msg.attempt, 0, 0.0, 0, time.time())
        for _ in range(5):
            actions = claims.handle(self._record(row), event, time.monotonic())
            stale = next((a for a in actions if isinstance(a, claims.ReplyStale)), None)
            if stale is not None:
                return RunReportReply(ok=False, stale=True, current_attempt=stale.current_attempt)
            if await self._run_actions(row.id, actions):
                break
            fresh = await self._store.get_job(row.id)
            if fresh is None:
                break
            row = fresh
        if msg.kind in ("exited", "lost"):
            self._leases.pop(row.id, None)
            self._wake.set()
        return RunReportReply(ok=True, current_attempt=row.attempt)

    # --- worker side

    def remote_offer(self, owner: str, msg: Offer) -> Ack:
        """Keep an owner's offer; the next scheduling pass claims it if it fits here now."""
        if self._runs_for(owner, msg.job_id):
            return Ack(ok=True, reason="already running it")  # a late duplicate offer
        self.stats["offers_received"] += 1
        self._offers[(owner, msg.job_id)] = (msg, time.monotonic())
        self._wake.set()
        return Ack(ok=True)

    def _runs_for(self, owner: str, job_id: str) -> bool:
        """True if we already run an attempt of this owner's job."""
        return any(o == owner and j == job_id for (j, _a), o in self._remote.items())

    async def _take_offers(self) -> None:
        if not self._offers or self.cluster is None:
            return
        now = time.monotonic()
        for key, (offer, received) in sorted(self._offers.items(), key=lambda kv: kv[1][1]):
            if now - received > 60.0:
                self._offers.pop(key, None)
                continue
            try:
                spec = job_spec_from_mapping(offer.spec, source=f"offer of {offer.job_id}")
            except SpecError as e:
                log.warning("job_id=%s: bad offer from %s: %s", offer.job_id, key[0][:12], e)
                self._offers.pop(key, None)
                continue
            req = spec.to_core(offer.job_id)
            worker = await self._worker_snapshot(refresh_apps=True)
            ev = evaluate(req, self._with_paths(worker, req.workdir), self._support)
            if ev.placement is None:
                continue  # keep the offer: claim it when devices free up
            self._offers.pop(key, None)
            if self._runs_for(key[0], offer.job_id):
                continue
            await self._claim_remote(key[0], offer, spec, ev.placement)

    async def _claim_remote(self, owner: str, offer: Offer, spec: JobSpec, placement: Placement) -> None:
        assert self.cluster is not None
        uuids = [u for u in placement.device_uuids if u]
        fds = self._locks.try_acquire(uuids) if uuids else []
        if fds is None:
            return
        try:
            claim = Claim(msg_id=new_msg_id(), worker=self.node_id, job_id=offer.job_id,
                          placement=PlacementModel.from_core(placement).model_dump(mode="json"))
            self.stats["claims_sent"] += 1
            try:
                reply = await self.cluster.call(owner, "/v1/peer/claim", claim, ClaimReply)
            except PeerCallError as e:
                self.stats["claims_failed"] += 1
                log.info("job_id=%s: claim at %s failed: %s", offer.job_id, owner[:12], e)
                return
            if not reply.granted:
                self.stats["claims_denied"] += 1
                log.debug("job_id=%s: claim denied by %s: %s", offer.job_id, owner[:12], reply.reason)
                return
            self.stats["claims_granted"] += 1
            await self._start_remote(owner, offer.job_id, reply.attempt, reply.lease_s, spec, placement, fds)
        finally:
            if fds:
                self._locks.release(fds)

    async def _start_remote(self, owner: str, job_id: str, attempt: int, lease_s: float, spec: JobSpec,
                            placement: Placement, fds: Sequence[int]) -> None:
        run_dir = self._config.runs_dir / job_id / str(attempt)
        now = time.monotonic()
        grants = [(u, i, placement.accelerator.value)
                  for u, i in zip(placement.device_uuids, placement.device_indices, strict=True) if u]
        row = RemoteRunRow(owner=owner, job_id=job_id, attempt=attempt, spec_json=spec.model_dump_json(),
                           placement_json=PlacementModel.from_core(placement).model_dump_json(), lease_s=lease_s,
                           run_dir=str(run_dir), state="running", started_at=time.time())
        if (job_id, attempt) in self._remote or await self._store.remote_run(owner, job_id, attempt) is not None:
            return  # a duplicate grant of an attempt we already run (or ran)
        if not await self._store.insert_remote_run(row, grants, time.time()):
            await self._report(owner, job_id, attempt, "lost", None, "devices taken meanwhile", never_started=True)
            return
        self._specs[job_id] = spec
        key = (job_id, attempt)
        self._remote[key] = owner
        self._leases_remote[key] = (now + lease_s, lease_s)
        nproc = spec.distributed.nproc_per_node if spec.distributed is not None else None
        try:
            argv = build_argv(spec, placement.environment, nproc, rdzv_timeout_s=self._config.rdzv_timeout_s,
                              log_dir=str(run_dir / "torchrun"))
            env = build_env(os.environ, spec, placement, job_id, attempt, self._config.dist_timeout_s)
            handle = await asyncio.to_thread(self._runner.start, job_id, attempt, argv, env, spec.workdir or "/",
                                             now + lease_s, fds)
        except RunnerError as e:
            self._remote.pop(key, None)
            self._leases_remote.pop(key, None)
            await self._store.end_remote_run(owner, job_id, attempt, "exited", None, str(e), time.time())
            await self._report(owner, job_id, attempt, "exited", None, f"could not start: {e}")
            return
        self._track(job_id, attempt, handle)
        self.feed.publish(Change("devices"))
        await self._report(owner, job_id, attempt, "started", None, "")

    async def _report(self, owner: str, job_id: str, attempt: int,
                      kind: Literal["started", "renew", "exited", "lost"], exit_code: int | None, reason: str,
                      never_started: bool = False) -> RunReportReply | None:
        msg = RunReport(msg_id=new_msg_id(), worker=self.node_id, job_id=job_id, attempt=attempt,
                        kind=kind, exit_code=exit_code, reason=reason, never_started=never_started)
        if owner == self.node_id:
            return await self.owner_report(self.node_id, msg)
        if self.cluster is None:
            return None
        try:
            reply = await self.cluster.call(owner, "/v1/peer/report", msg, RunReportReply)
        except PeerCallError as e:
            log.info("job_id=%s: report %s to %s failed: %s", job_id, kind, owner[:12], e)
            return None
        return reply

    async def _report_end(self, owner: str, job_id: str, attempt: int) -> None:
        r = await self._store.remote_run(owner, job_id, attempt)
        if r is None or r.reported:
            return
        reply = await self._report(owner, job_id, attempt, "lost" if r.state == "lost" else "exited",
                                   r.exit_code, r.reason)
        if reply is not None:
            await self._store.mark_remote_reported(owner, job_id, attempt)

    async def _renew_remote(self, now: float) -> None:
        """Renew each remote run's lease with its owner; only a renewal moves the watchdog deadline."""
        for key, owner in list(self._remote.items()):
            handle = self._runs.get(key)
            deadline = self._leases_remote.get(key)
            if handle is None or deadline is None:
                continue
            reply = await self._report(owner, key[0], key[1], "renew", None, "")
            if reply is None:
                continue  # owner unreachable: the deadline stays; the watchdog acts on it
            if reply.stale:
                log.info("job_id=%s attempt %d is stale at its owner: killing it", key[0], key[1])
                await asyncio.to_thread(self._runner.cancel, handle)
                continue
            lease_s = deadline[1]
            self._leases_remote[key] = (now + lease_s, lease_s)
            self._runner.extend_deadline(handle, now + lease_s)
        for r in await self._store.remote_runs(active=False, unreported=True):
            await self._report_end(r.owner, r.job_id, r.attempt)

    async def worker_kill(self, owner: str, msg: Kill) -> Ack:
        """The owner stops an attempt we run for it."""
        key = (msg.job_id, msg.attempt)
        if self._remote.get(key) != owner:
            return Ack(ok=False, reason="no such attempt here")
        handle = self._runs.get(key)
        if handle is not None:
            await asyncio.to_thread(self._runner.cancel, handle)
        return Ack(ok=True)

    async def worker_logs(self, msg: LogRequest) -> LogChunk:
        """A chunk of the log of an attempt we run (or ran) for an owner."""
        path = self._config.runs_dir / msg.job_id / str(msg.attempt) / f"{msg.stream}.log"
        data, size = b"", 0
        with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(msg.offset)
            data = whole_chars(f.read(LOG_CHUNK_BYTES))
        nxt = msg.offset + len(data)
        done = (msg.job_id, msg.attempt) not in self._runs
        return LogChunk(job_id=msg.job_id, attempt=msg.attempt, stream=msg.stream, offset=msg.offset,
                        next_offset=nxt, data=data.decode("utf-8", errors="replace"), complete=done and nxt >= size)


def whole_chars(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end (the next chunk starts with it)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data  # ASCII: nothing cut
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
