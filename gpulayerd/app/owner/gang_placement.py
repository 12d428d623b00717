"""Gang coordination (owner side) of multi-host torch.distributed jobs; the member side is in
:mod:`gpulayerd.app.worker.member`. (Same idea as :mod:`gpulayerd.core.protocol.gang`, one layer up:
that module decides, this one carries out.)

Every decision is :mod:`gpulayerd.core.protocol.holds`' or :mod:`gpulayerd.core.protocol.gang`'s: this
service carries out its actions (holds, releases, the job's claim, commits, kills, the verdict) and feeds back what
happened. The owner places holds on N workers in node-id order, releases them all on
any refusal and retries with jittered backoff; with all N held it claims the job
(compare-and-set) and commits every member: rank 0 is the lowest node id, whose address
and reserved port are the rendezvous. One lease for the gang; the verdict rule (a member
lost near the first failure makes the attempt ``lost``, not ``failed``) is the core's.

The attempt's durable state is written to the store's ``gangs`` table on every change,
so that a restarted owner resumes it (:meth:`GangCoordinator.recover`).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.owned_jobs import Granted, OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.signals import Signals
from gpulayerd.config import DaemonConfig
from gpulayerd.core.matching.evaluate import evaluate, explain
from gpulayerd.core.matching.gangskew import consistent_members
from gpulayerd.core.protocol import gang as core
from gpulayerd.core.protocol import holds
from gpulayerd.core.protocol.claims import ACTIVE
from gpulayerd.core.protocol.gang import GangAttempt
from gpulayerd.core.reasons import reason_text
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.errors import PeerCallError
from gpulayerd.models import ExplanationModel, JobSpec
from gpulayerd.models.stored import gang_placement
from gpulayerd.net.transport import COMMIT, HOLD, KILL, RELEASE, PeerTransport, Sender
from gpulayerd.net.wire import Commit, Hold, Kill, Release, RunReport, RunReportReply, new_msg_id
from gpulayerd.store import JobRow, Store
from gpulayerd.store.gangs import gang_from_row, gang_to_row

__all__ = ["GangCoordinator"]

log = logging.getLogger(__name__)


class GangCoordinator:
    """Owner side of gang placement: hold rounds, commit, reports, one lease, abort, verdict.

    Args:
        rng: the random source (hold ids, backoff jitter); tests give a seeded one.
    """

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
        self._gangs: dict[str, GangAttempt] = {}  # our multi-host jobs' current attempts
        self._locks: dict[str, asyncio.Lock] = {}  # one event at a time per gang
        self._busy: set[str] = set()  # jobs with a hold round in flight
        self._backoff: dict[str, tuple[float, int]] = {}  # job -> (not before, failed rounds in a row)

    def attempt(self, job_id: str) -> GangAttempt | None:
        """The gang attempt of ``job_id`` being run, or None."""
        return self._gangs.get(job_id)

    # ------------------------------------------------------------- placement

    async def schedule(self, row: JobRow, spec: JobSpec, req: JobRequest, local: WorkerSnapshot) -> None:
        """Place a queued multi-host job: start a hold round if enough workers fit, else record why not."""
        assert req.distributed is not None
        now = self._clock.monotonic()
        not_before = self._backoff.get(row.id, (0.0, 0))[0]
        if row.id in self._busy or now < not_before:
            return
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        workers = [local, *remote]
        fitting = [(w, p) for w in workers if (p := evaluate(req, w, self._support).placement) is not None]
        fits = [w.node_id for w, _ in fitting]
        n = req.distributed.nnodes
        if len(set(fits)) < n:
            e = explain(req, workers, self._support)
            text = reason_text(e)  # "<Code>: <words>" (gpulayerd.core.reasons)
            if text != row.reason:
                await self._store.jobs.set_explanation(row.id, text, ExplanationModel.from_core(e).model_dump_json())
                self._signals.job_changed(row.id)
            return
        members, skew = consistent_members(req, fitting, n)  # same frameworks and Python on every host
        if skew is not None:
            if skew != row.reason:
                e = explain(req, workers, self._support)
                await self._store.jobs.set_explanation(row.id, skew, ExplanationModel.from_core(e).model_dump_json())
                self._signals.job_changed(row.id)
            return
        self._busy.add(row.id)
        self._signals.spawn(self._round(row, spec, members, n), name=f"gang-{row.id}")

    async def _round(self, row: JobRow, spec: JobSpec, candidates: Sequence[str], n: int) -> None:
        try:
            await self.place(row, spec, candidates, n)
        finally:
            self._busy.discard(row.id)

    async def place(self, row: JobRow, spec: JobSpec, candidates: Sequence[str], n: int) -> None:
        """One hold round for ``row`` over the first ``n`` of ``candidates`` in node-id order, to its end.

        On success the gang attempt runs (:meth:`attempt`); on a failed hold the job waits
        out its backoff before the next round.
        """
        failures = self._backoff.get(row.id, (0.0, 0))[1]
        hold_id = f"{self._rng.getrandbits(64):016x}"
        r, pending = holds.begin_round(row.id, hold_id, candidates, n, failures)
        body = spec.model_dump(mode="json")
        while pending:
            action = pending.pop(0)
            event: holds.RoundEvent | None = None
            if isinstance(action, holds.SendHold):
                event = await self._hold(row.id, hold_id, body, action.member)
            elif isinstance(action, holds.ReleaseHolds):
                await self._release(action.hold_id, action.members)
            elif isinstance(action, holds.RetryAfter):
                self._backoff[row.id] = (self._clock.monotonic() + action.delay_s, action.failures)
                log.info("job_id=%s: gang hold round failed (%s); retrying in %.1f s", row.id,
                         self._names.readable(action.reason), action.delay_s)
            elif isinstance(action, holds.ClaimJob):
                placement = gang_placement(action.members, f"{action.master_addr}:{action.master_port}",
                                           action.hold_id)
                granted = await self._jobs.grant(row.id, self.node_id, f"gang-{hold_id}", placement, tries=1)
                if isinstance(granted, Granted) and granted.fresh:
                    event = holds.ClaimGranted(granted.attempt, granted.lease_s, self._config.lease_grace_s)
                else:
                    event = holds.ClaimDenied(granted if isinstance(granted, str) else "claimed already")
            elif isinstance(action, holds.AttemptBegun):
                self._backoff.pop(row.id, None)
                self._gangs[row.id] = action.gang
                await self._save(action.gang)
            elif isinstance(action, holds.SendCommit):
                why = await self._commit(row, body, hold_id, action)
                if why is not None:
                    # The commits not sent yet never will be: their holds are released.
                    rest = [a.member for a in pending if isinstance(a, holds.SendCommit)]
                    pending.clear()
                    await self.feed(row.id, core.MemberLost(action.member, action.attempt,
                                                            f"commit failed: {why}"))
                    await self._release(hold_id, [action.member, *rest])
            if event is not None:
                r, more = holds.advance_round(r, event, self._clock.monotonic(), self._rng.random())
                pending.extend(more)

    async def _hold(self, job_id: str, hold_id: str, body: dict[str, object], member: str) -> holds.RoundEvent:
        # Environment values (tokens) go only with the commit, to the members that run a rank.
        env = body.get("env")
        held = {**body, "env": dict.fromkeys(env, "") if isinstance(env, dict) else {}}
        hold = Hold(msg_id=new_msg_id(), owner=self.node_id, job_id=job_id, hold_id=hold_id, spec=held,
                    ttl_s=self._config.hold_ttl_s)
        try:
            reply = await self._transport.call(member, HOLD, hold)
        except PeerCallError as e:
            return holds.HoldFailed(member, str(e))
        if not reply.held:
            return holds.HoldFailed(member, f"refused: {reply.reason}")
        return holds.HoldGranted(member, reply.address, reply.port)

    async def _commit(self, row: JobRow, body: dict[str, object], hold_id: str, c: holds.SendCommit) -> str | None:
        """Send one commit; None when the member took it, else why not."""
        commit = Commit(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, hold_id=hold_id,
                        attempt=c.attempt, lease_s=row.lease_s, spec=body, node_rank=c.rank, nnodes=c.nnodes,
                        master_addr=c.master_addr, master_port=c.master_port)
        try:
            ack = await self._transport.call(c.member, COMMIT, commit)
        except PeerCallError as e:
            return str(e)
        return None if ack.ok else ack.reason

    async def _release(self, hold_id: str, members: Sequence[str]) -> None:
        for m in members:
            try:
                await self._transport.call(m, RELEASE, Release(msg_id=new_msg_id(), owner=self.node_id,
                                                               hold_id=hold_id))
            except PeerCallError as e:
                log.info("release of hold %s on %s failed (it expires): %s", hold_id, m[:12], e)

    # ------------------------------------------------------------- the attempt

    async def feed(self, job_id: str, event: core.AttemptEvent) -> list[core.AttemptAction]:
        """Feed ``event`` to the job's gang attempt and carry out the actions (none if no attempt runs)."""
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        async with lock:
            g = self._gangs.get(job_id)
            if g is None:
                return []
            new, actions = core.handle(g, event, self._clock.monotonic())
            self._gangs[job_id] = new
            for action in actions:
                await self._carry_out(new, action)
            return actions

    async def _carry_out(self, g: GangAttempt, action: core.AttemptAction) -> None:
        if isinstance(action, core.PersistGang):
            await self._save(action.gang)
        elif isinstance(action, core.MarkStarted):
            names = [self._names.name_of(m) or m[:12] for m in g.members]  # rank 0 first
            where = f"{'+'.join(names)} (a gang of {len(names)}, rank 0 on {names[0]})"
            await self._jobs.started(g.job_id, g.attempt, self.node_id, f"gang-start-{g.job_id}-{g.attempt}",
                                     where=where)
        elif isinstance(action, core.ExtendGangLease):
            self._jobs.set_lease(g.job_id, action.expires_at)
        elif isinstance(action, core.KillMembers):
            log.info("job_id=%s attempt %d: %s", g.job_id, g.attempt, self._names.readable(action.reason))
            for m in action.members:
                self._signals.spawn(self._kill(g, m, action.reason), name=f"gang-kill-{g.job_id}")
        elif isinstance(action, core.EndAttempt):
            self._gangs.pop(g.job_id, None)
            self._locks.pop(g.job_id, None)
            await self._end(g.job_id, g.attempt, action.verdict, never_started=not g.started)

    async def _end(self, job_id: str, attempt: int, v: core.Verdict, *, never_started: bool = False) -> None:
        """Apply the verdict to the job. A lost attempt none of whose ranks started (e.g. a
        commit refused because a hold expired) is re-queued without using a retry."""
        log.info("job_id=%s attempt %d: gang %s: %s", job_id, attempt, v.status, self._names.readable(v.reason))
        stimulus = f"gang-end-{job_id}-{attempt}"
        if v.status == "succeeded":
            await self._jobs.exited(job_id, attempt, 0, v.reason, "", stimulus, worker=self.node_id)
        elif v.status == "failed":
            await self._jobs.exited(job_id, attempt, v.exit_code, v.reason, v.reason, stimulus,
                                    worker=self.node_id)
        else:
            await self._jobs.lost(job_id, attempt, v.reason, worker=self.node_id, never_started=never_started,
                                  stimulus_id=stimulus)
        await self._store.gangs.delete(job_id)

    async def _kill(self, g: GangAttempt, member: str, reason: str) -> None:
        kill = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=g.job_id, attempt=g.attempt, reason=reason)
        try:
            await self._transport.call(member, KILL, kill)
        except PeerCallError as e:
            log.info("job_id=%s: kill of rank %d on %s failed: %s", g.job_id, g.rank(member), member[:12], e)

    async def _save(self, g: GangAttempt) -> None:
        await self._store.gangs.save(gang_to_row(g, self._clock.wall()))

    async def report(self, row: JobRow, sender: Sender, msg: RunReport) -> RunReportReply | None:
        """A member's report on a gang attempt; None if ``sender`` is not a member of a gang of ``row``."""
        worker = sender.node_id
        g = self._gangs.get(row.id)
        if g is None or worker not in g.members:
            return None
        event: core.AttemptEvent
        if msg.kind == "started":
            event = core.MemberStarted(worker, msg.attempt)
        elif msg.kind == "renew":
            event = core.MemberRenewed(worker, msg.attempt)
        elif msg.kind == "exited":
            event = core.MemberExited(worker, msg.attempt, msg.exit_code, msg.reason)
        else:
            event = core.MemberLost(worker, msg.attempt, msg.reason or "its rank is gone")
        actions = await self.feed(row.id, event)
        stale = next((a for a in actions if isinstance(a, core.ReplyStale)), None)
        if stale is not None:
            return RunReportReply(ok=False, stale=True, current_attempt=stale.current_attempt)
        return RunReportReply(ok=True, current_attempt=g.attempt)

    async def check_leases(self) -> None:
        """The lease tick of every gang: silent members are lost, failure windows close, leases renew.

        A cancel requested on the job stops every member. A gang whose job moved on
        without it (its attempt ended elsewhere) is forgotten.
        """
        for job_id, g in list(self._gangs.items()):
            row = await self._jobs.get(job_id)
            if row is None or row.attempt != g.attempt or row.status not in ACTIVE:
                self._gangs.pop(job_id, None)
                await self._store.gangs.delete(job_id)
                continue
            if row.cancel_requested:
                await self.feed(job_id, core.AbortRequested("cancelled by user"))
            await self.feed(job_id, core.LeaseTick())

    async def recover(self) -> None:
        """At start-up: resume the gang attempts of jobs still claimed or running with the same attempt.

        Every member's lease counts as renewed now (as do persisted leases in
        :mod:`gpulayerd.core.protocol.claims`); a verdict stored but not yet applied to its job is applied now.
        """
        now = self._clock.monotonic()
        for r in await self._store.gangs.all():
            row = await self._jobs.get(r.job_id)
            if row is None or row.attempt != r.attempt or row.status not in ACTIVE:
                await self._store.gangs.delete(r.job_id)
                continue
            g = gang_from_row(r)
            if g.verdict is not None:
                await self._end(g.job_id, g.attempt, g.verdict)
                continue
            self._gangs[g.job_id] = core.recovered(g, now)
            self._jobs.set_lease(g.job_id, now + g.lease_s)
            log.info("job_id=%s: resumed gang attempt %d (%d members)", g.job_id, g.attempt, len(g.members))
