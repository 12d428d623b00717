"""Gang coordination (owner side) of multi-host torch.distributed jobs; the member side is in :mod:`.member`.

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
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpulayerd.api.peer import PeerCallError
from gpulayerd.app.clock import Clock
from gpulayerd.app.jobs import Granted, OwnedJobs
from gpulayerd.app.names import Names
from gpulayerd.app.ports import Directory, PeerTransport
from gpulayerd.app.signals import Signals
from gpulayerd.config import DaemonConfig
from gpulayerd.core.matching import evaluate, explain
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.models import ExplanationModel, JobSpec
from gpulayerd.net.wire import Ack, Commit, Hold, HoldReply, Kill, Release, RunReport, RunReportReply, new_msg_id
from gpulayerd.store import JobRow, Store

__all__ = ["Gang", "GangCoordinator"]

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
