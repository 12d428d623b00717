"""The jobs owned here, driven through the pure claim machine (:mod:`gpulayerd.core.protocol.claims`).

Every change to a job owned by this daemon goes through :class:`OwnedJobs`: it feeds an
event to :func:`claims.handle` with the owner's lease view, carries out the actions
(the store's compare-and-set first; nothing else unless it succeeds), and retries
from a fresh row when a concurrent change won. Leases are kept in memory (persisted
leases count as renewed at restart).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.signals import Signals
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobRecord, JobStatus
from gpulayerd.core.protocol.worker import OFFER_KEPT_S
from gpulayerd.errors import AmbiguousJob, NoSuchJob
from gpulayerd.models import JobSpec
from gpulayerd.models.stored import spec_of
from gpulayerd.net.wire import Offer, new_msg_id
from gpulayerd.store import AmbiguousJobId, JobNotFound, JobRow, Store

__all__ = ["OFFER_STANDING_S", "SPEC_CACHE_SIZE", "Granted", "OwnedJobs", "RunControl"]

SPEC_CACHE_SIZE = 1024
"""Parsed job specs kept by :meth:`OwnedJobs.spec` (least recently used dropped first)."""

_T = TypeVar("_T")

OFFER_STANDING_S = OFFER_KEPT_S + 5.0
"""An offer this owner sent stands this long (seconds): a worker keeps an offer for
:data:`~gpulayerd.core.protocol.worker.OFFER_KEPT_S`, and only a worker with a standing offer may claim."""

MAX_OFFERS_KEPT = 65536
"""The most (job, worker) offers remembered; beyond it the ones that no longer stand are dropped."""


class RunControl(Protocol):
    """Stops attempts: what :class:`OwnedJobs` needs for a ``KillRun`` or ``ReplyStale``."""

    async def kill_attempt(self, job_id: str, attempt: int, worker: str, reason: str, *, remote: bool,
                           signal: str = "") -> None:
        """Stop ``attempt`` if it runs here; with ``remote``, ask ``worker`` to stop it otherwise
        (``signal``: the name of the signal sent first; "" is SIGTERM)."""
        ...


@dataclass(frozen=True)
class Granted:
    """A claim the owner granted: ``fresh`` is False when the holder only asked again for its grant."""

    attempt: int
    lease_s: float
    fresh: bool


def _record(row: JobRow, lease: float | None) -> JobRecord:
    """The claim machine's view of ``row`` with the lease this owner keeps for it (see :meth:`OwnedJobs.record`)."""
    rec = row.record()
    return replace(rec, lease_expires_at=lease) if rec.status in claims.ACTIVE and lease else rec


def _decide_claim(row: JobRow, *, lease: float | None, event: claims.ClaimRequested, now: float) -> list[claims.Action]:
    """The claim machine's actions for ``event`` on ``row`` (pure: it runs on the store's thread)."""
    return claims.handle(_record(row, lease), event, now)


def _refuses(actions: Sequence[object]) -> bool:
    """Whether the claim machine's ``actions`` change nothing or answer "stale" (decisions taken from a
    kept row only after a fresh read)."""
    return not actions or any(isinstance(a, claims.ReplyStale) for a in actions)


def _granted(actions: Sequence[object]) -> tuple[claims.PersistJob | None, claims.GrantClaim | None]:
    """The PersistJob and GrantClaim of a claim's actions (None for each one missing)."""
    persist = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
    grant = next((a for a in actions if isinstance(a, claims.GrantClaim)), None)
    return persist, grant


class OwnedJobs:
    """The owner's job state: rows in the store, leases in memory, decisions from ``core.protocol.claims``."""

    def __init__(self, *, store: Store, signals: Signals, clock: Clock, runs: RunControl | None = None,
                 node_id: str = "") -> None:
        """``runs`` stops attempts (:class:`~gpulayerd.app.common.stopper.AttemptStopper`; None: a
        ``KillRun`` is only recorded, for tests of the bookkeeping alone); ``node_id``: this owner
        (named in its offers)."""
        self._node_id = node_id
        self._store = store
        self._signals = signals
        self._clock = clock
        self._leases: dict[str, float] = {}  # job -> owner-monotonic lease end
        self._specs: OrderedDict[str, JobSpec] = OrderedDict()  # least recently used first
        self._runs = runs
        # (job, worker) -> (when offered, job's user, when offered in wall-clock s: the history's)
        self._offers: dict[tuple[str, str], tuple[float, str, float]] = {}
        self._offered_jobs: dict[str, tuple[float, str]] = {}  # job -> (its latest offer, its user)
        self._holders: dict[str, tuple[int, str | None]] = {}  # active job -> (attempt, holder), a cache
        # Active job -> its row as this owner last read or wrote it: reports are decided from it without
        # a read (the compare-and-set of every write catches a stale one, and a fresh read follows).
        self._active: dict[str, JobRow] = {}
        self.on_persisted: Callable[[JobRecord], None] | None = None
        """Told each job state this owner wrote (the notifier's hook); None: nobody."""

    # --- reading

    async def row(self, job_ref: str) -> JobRow:
        """The job ``job_ref`` names (a full id or a unique prefix).

        Raises:
            NoSuchJob: nothing matches. AmbiguousJob: the prefix matches several jobs.
        """
        try:
            job_id = await self._store.jobs.resolve_job_id(job_ref)
        except JobNotFound as e:
            raise NoSuchJob(f"no job {job_ref!r}") from e
        except AmbiguousJobId as e:
            raise AmbiguousJob(str(e)) from e
        row = await self._store.jobs.get_job(job_id)
        if row is None:
            raise NoSuchJob(f"no job {job_ref!r}")
        return row

    async def get(self, job_id: str) -> JobRow | None:
        """The job ``job_id`` (exact), or None."""
        row = await self._store.jobs.get_job(job_id)
        if row is not None and row.status in claims.ACTIVE:
            self._active[job_id] = row
        return row

    async def current(self, job_id: str) -> JobRow | None:
        """The job ``job_id`` as this owner last read or wrote it while it is claimed or running (no
        read), else as stored: for a decision whose write is a compare-and-set (a stale row loses
        it, and the decision is taken again from a fresh read)."""
        kept = self._active.get(job_id)
        return kept if kept is not None else await self.get(job_id)

    def spec(self, row: JobRow) -> JobSpec:
        """The job's spec, parsed from the stored JSON; the :data:`SPEC_CACHE_SIZE` most recently used
        are kept parsed (the scheduler keeps one request per requirement shape, so a long queue need
        not stay parsed here: ~3 kB per cached spec)."""
        spec = self._specs.get(row.id)
        if spec is None:
            spec = spec_of(row.spec_json)
        self.remember(row.id, spec)
        return spec

    async def spec_of(self, job_id: str) -> JobSpec | None:
        """The spec of the job ``job_id``: the cached one (see :meth:`spec`), else read from the
        store and parsed (then cached); None when no such job is stored."""
        spec = self._specs.get(job_id)
        if spec is not None:
            self._specs.move_to_end(job_id)
            return spec
        row = await self.get(job_id)
        return None if row is None else self.spec(row)

    def remember(self, job_id: str, spec: JobSpec) -> None:
        """Cache the spec of a job just stored (or just read)."""
        self._specs[job_id] = spec
        self._specs.move_to_end(job_id)
        while len(self._specs) > SPEC_CACHE_SIZE:
            self._specs.popitem(last=False)

    def record(self, row: JobRow) -> JobRecord:
        """The claim machine's view of ``row``, with the lease as this owner keeps it."""
        return _record(row, self._leases.get(row.id))

    # --- offers

    def make_offer(self, job_id: str, spec: JobSpec, worker: str, submitted_at: float | None = None) -> Offer:
        """The offer of queued job ``job_id`` (its ``spec``) to ``worker`` (this node's own included),
        noted as made now (:meth:`offered`): the spec without environment values (tokens go only
        with the grant, to the worker that runs the job); ``submitted_at`` orders one user's offers there."""
        offered = spec.model_dump(mode="json")
        offered["env"] = dict.fromkeys(spec.env, "")
        self.offered(job_id, worker, spec.user or "")  # before the send: it may claim before it answers
        return Offer(msg_id=new_msg_id(), owner=self._node_id, job_id=job_id, spec=offered,
                     lease_s=spec.policy.lease_s, submitted_at=submitted_at)

    def offered(self, job_id: str, worker: str, user: str = "") -> None:
        """This owner offers job ``job_id`` (of ``user``) to ``worker`` now (it may claim it while the
        offer stands)."""
        now = self._clock.monotonic()
        self._offers[(job_id, worker)] = (now, user, self._clock.wall())
        self._offered_jobs[job_id] = (now, user)
        if len(self._offers) > MAX_OFFERS_KEPT:
            self._offers = {k: v for k, v in self._offers.items() if now - v[0] <= OFFER_STANDING_S}
            self._offered_jobs = {k: v for k, v in self._offered_jobs.items() if now - v[0] <= OFFER_STANDING_S}

    def offered_to_others(self, job_id: str, worker: str) -> str | None:
        """The job's user when job ``job_id`` has a standing offer, but none to ``worker``: a claim
        from ``worker`` is refused without reading the store. None otherwise (read the store)."""
        kept = self._offered_jobs.get(job_id)
        if kept is None or self._clock.monotonic() - kept[0] > OFFER_STANDING_S:
            return None
        return None if self.offer_standing(job_id, worker) else kept[1]

    def standing_offer(self, job_id: str, worker: str) -> str | None:
        """The job's user if job ``job_id`` was offered to ``worker`` within :data:`OFFER_STANDING_S`, else None."""
        kept = self._offers.get((job_id, worker))
        if kept is None or self._clock.monotonic() - kept[0] > OFFER_STANDING_S:
            return None
        return kept[1]

    def offer_standing(self, job_id: str, worker: str) -> bool:
        """True if job ``job_id`` was offered to ``worker`` within :data:`OFFER_STANDING_S`."""
        return self.standing_offer(job_id, worker) is not None

    def offers(self) -> dict[tuple[str, str], float]:
        """(job, worker) -> when offered (monotonic s), of the offers that stand now (a copy)."""
        now = self._clock.monotonic()
        return {k: v[0] for k, v in self._offers.items() if now - v[0] <= OFFER_STANDING_S}

    def cached_spec(self, job_id: str) -> JobSpec | None:
        """The job's parsed spec if it is cached (see :meth:`spec`), without a read."""
        return self._specs.get(job_id)

    # --- leases

    def set_lease(self, job_id: str, expires_at: float) -> None:
        """The job's lease now ends at ``expires_at`` (owner-monotonic seconds)."""
        self._leases[job_id] = expires_at

    def drop_lease(self, job_id: str) -> None:
        """The job holds no lease any more."""
        self._leases.pop(job_id, None)
        self._holders.pop(job_id, None)

    # --- holders (a cache of the active jobs' rows: the report route's role check reads it first)

    def holder_of(self, job_id: str) -> tuple[int, str | None] | None:
        """(current attempt, holder) of an active job owned here; None if the job is not active here.
        Complete for the active jobs (recovery notes them at start; grants and ends keep it), so the
        claim role refuses without a read; never the only word for a grant: the claim machine
        decides from the row."""
        return self._holders.get(job_id)

    def note_holder(self, job_id: str, attempt: int, holder: str | None) -> None:
        """Remember an active job's current attempt and holder, read from the store."""
        self._holders[job_id] = (attempt, holder)

    async def check_leases(self, grace_s: float) -> None:
        """Declare lost every attempt whose lease ran out more than ``grace_s`` ago."""
        now = self._clock.monotonic()
        for job_id in list(self._leases):
            row = await self.get(job_id)
            if row is None or row.status not in claims.ACTIVE:
                self._leases.pop(job_id, None)
                continue
            actions = claims.handle(self.record(row), claims.LeaseChecked(grace_s), now)
            if actions and await self.run_actions(job_id, actions):
                persist = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
                if persist is not None:
                    self._signals.stats["lease_losses"] += 1
                    await self._store.jobs.end_attempt(job_id, row.attempt, "lost", None, persist.reason,
                                                       self._clock.wall())
                self._leases.pop(job_id, None)

    def _remember_holder(self, rec: JobRecord, row: JobRow | None = None, reason: str = "") -> None:
        """Note the job as a successful write left it (``row``: the row it was decided from)."""
        if rec.status in claims.ACTIVE:
            self._holders[rec.job_id] = (rec.attempt, rec.holder)
            base = row if row is not None else self._active.get(rec.job_id)
            if base is None:
                return
            self._active[rec.job_id] = replace(
                base, status=rec.status, attempt=rec.attempt, holder=rec.holder, retries_left=rec.retries_left,
                lease_expires_at=rec.lease_expires_at, cancel_requested=rec.cancel_requested,
                reason=reason or base.reason)
        else:
            self._holders.pop(rec.job_id, None)
            self._active.pop(rec.job_id, None)

    # --- deciding

    async def _forgetting(self, job_id: str, write: Awaitable[_T]) -> _T:
        """``write``'s result; a write that raises (cancelled included: it may have committed) drops
        the job's kept row, so that the next decision reads it afresh."""
        try:
            return await write
        except BaseException:
            self._active.pop(job_id, None)
            raise

    async def run_actions(self, job_id: str, actions: Sequence[claims.Action], kind: str = "state") -> bool:
        """Carry out ``actions``; False if the leading compare-and-set lost (the caller retries)."""
        for action in actions:
            if isinstance(action, claims.PersistJob):
                same = action.record.status is action.expect_status
                if not await self._forgetting(job_id, self._store.jobs.apply(action, self._clock.wall(),
                                                                             kind=kind if same else "state")):
                    self._active.pop(job_id, None)  # decided from a stale row: the retry reads it afresh
                    return False
                self._remember_holder(action.record, reason=action.reason)
                self._signals.job_changed(job_id)
                if self.on_persisted is not None:
                    self.on_persisted(action.record)
                if action.record.status is JobStatus.QUEUED:
                    self._signals.wake()
            elif isinstance(action, claims.ExtendLease):
                self._leases[job_id] = action.expires_at
            elif isinstance(action, (claims.KillRun, claims.ReplyStale)) and self._runs is not None:
                # A stale attempt (ReplyStale) must die just like a killed one.
                await self._runs.kill_attempt(job_id, action.attempt, action.worker,
                                              action.reason if isinstance(action, claims.KillRun) else "stale",
                                              remote=isinstance(action, claims.KillRun),
                                              signal=action.signal if isinstance(action, claims.KillRun) else "")
        return True

    async def apply(self, job_id: str, event: claims.Event, kind: str = "state",
                    row: JobRow | None = None) -> list[claims.Action]:
        """Feed ``event`` to the job's claim machine until its actions are carried out (5 tries).

        ``row``: the job as the caller just read it, decided from first without a read (a
        compare-and-set that lost reads again).

        Returns:
            The actions carried out (empty if the job is gone or nothing changed).
        """
        given = row
        for _ in range(5):
            kept = given is not None
            row, given = (given, None) if given is not None else (await self.get(job_id), None)
            if row is None:
                return []
            actions = claims.handle(self.record(row), event, self._clock.monotonic())
            if kept and _refuses(actions):
                continue  # "stale" or nothing, from a row kept in memory: said only after a fresh read
            if await self.run_actions(job_id, actions, kind):
                return actions
        return []

    async def grant(self, job_id: str, worker: str, stimulus_id: str, placement_json: str,
                    run_dir_of: Callable[[int], str] | None = None, tries: int = 3) -> Granted | str:
        """The claim: grant ``worker`` the next attempt of a queued job, the job read, decided and
        written in one store transaction (:meth:`~gpulayerd.store.jobs.JobsTable.claim_decided`).

        Args:
            placement_json: what the worker will use (stored with the attempt).
            run_dir_of: the run directory of an attempt number, when it runs here.
            tries: how many times to decide (a claim whose devices are granted meanwhile is tried again).

        Returns:
            :class:`Granted`, or the reason of the refusal.
        """
        offer = self._offers.get((job_id, worker))
        for _ in range(tries):
            now, wall = self._clock.monotonic(), self._clock.wall()
            event = claims.ClaimRequested(worker, stimulus_id, wall)
            # The history of a grant, for a peer and this node alike: the offer, the claim, the grant.
            history = [("offer", offer[2], f"offered to {worker}")] if offer is not None else []
            history.append(("claim", wall, f"claimed by {worker}"))
            # (the lease read here: the decision runs on the store's thread)
            decide = functools.partial(_decide_claim, lease=self._leases.get(job_id), event=event, now=now)
            row, actions, written = await self._forgetting(job_id, self._store.jobs.claim_decided(
                job_id, decide, worker, placement_json, [], run_dir_of, wall, kind="grant", history=history))
            if row is None:
                return "no such job"
            persist, grant = _granted(actions)
            if grant is None:
                deny = next((a for a in actions if isinstance(a, claims.DenyClaim)), None)
                return deny.reason if deny else "denied"
            if persist is None:  # the holder asked again: the same grant
                return Granted(grant.attempt, grant.lease_s, fresh=False)
            if written:
                self._leases[job_id] = now + row.lease_s
                self._remember_holder(persist.record, row, persist.reason)
                self._signals.job_changed(job_id)
                return Granted(grant.attempt, grant.lease_s, fresh=True)
        return "the job changed meanwhile"

    async def started(self, job_id: str, attempt: int, worker: str, stimulus_id: str, where: str = "") -> None:
        """The attempt's processes started on ``worker`` (a gang's, as its coordinator saw it, with its
        members as ``where``; a one-host attempt's start comes as a ``started`` report, :meth:`reported`)."""
        await self.apply(job_id, claims.RunStarted(attempt, worker, stimulus_id, where))

    async def _apply_joined(self, job_id: str, event: claims.Event,
                            write: Callable[[claims.PersistJob | None, str], Awaitable[bool]], *,
                            write_alone: bool = True, row: JobRow | None = None) -> list[claims.Action]:
        """:meth:`apply`, with a write of the attempt (``write``) in the same transaction as the job's
        leading compare-and-set (or alone when the event changes no job row). ``write`` gets that
        PersistJob (or None) and the event kind, and returns False if the compare-and-set lost: the
        attempt's write is kept, and the event is applied again from a fresh row. Without
        ``write_alone``, the attempt is written only with a change of the job (a peer's report on an
        attempt that is not current, or a duplicate, writes nothing).

        ``row``: the job as the caller just read it (decided from without a read; the
        compare-and-set catches a stale one, and the event is then applied from a fresh read).

        Returns:
            The actions carried out (a stale report: its ReplyStale, and nothing is written).
        """
        kept = row is not None
        if row is None:
            row = await self.get(job_id)
        actions = claims.handle(self.record(row), event, self._clock.monotonic()) if row is not None else []
        if kept and _refuses(actions):  # "stale" or nothing, from a row kept in memory: read it afresh
            row = await self.get(job_id)
            actions = claims.handle(self.record(row), event, self._clock.monotonic()) if row is not None else []
        if any(isinstance(a, claims.ReplyStale) for a in actions):
            return actions  # refused by the claim machine: nothing is written, not even the attempt
        persist = actions[0] if actions and isinstance(actions[0], claims.PersistJob) else None
        if not write_alone and not any(isinstance(a, claims.PersistJob) for a in actions):
            await self.run_actions(job_id, actions)
            return actions
        if persist is None and any(isinstance(a, claims.PersistJob) for a in actions):
            await write(None, "state")  # not the leading action: the two writes go apart
            return await self.apply(job_id, event)
        if not await self._forgetting(job_id, write(persist, "state")):
            self._active.pop(job_id, None)  # decided from a stale row: the retry reads it afresh
            return await self.apply(job_id, event)  # a concurrent change won: retry as apply() would
        if persist is not None:
            self._remember_holder(persist.record, row, persist.reason)
            self._signals.job_changed(job_id)
            if self.on_persisted is not None:
                self.on_persisted(persist.record)
            if persist.record.status is JobStatus.QUEUED:
                self._signals.wake()
        await self.run_actions(job_id, actions[1:] if persist is not None else actions)
        return actions

    async def reported(self, job_id: str, kind: str, attempt: int, worker: str, *, exit_code: int | None = None,
                       reason: str = "", never_started: bool = False, stimulus_id: str = "",
                       row: JobRow | None = None, timed_out: bool = False,
                       preflight: bool = False, where: str = "") -> list[claims.Action]:
        """A worker's report (this node's own included) on an attempt of a job owned here (``kind``:
        started, renew, exited, lost): one decision of the claim machine
        (:func:`~gpulayerd.core.protocol.claims.report_event`), its actions carried out with the
        attempt row written in the same transaction as the job's.

        Returns:
            The actions carried out: a ReplyStale when the sender must stop that run (nothing written).
            ``row``: the job as the caller just read it (see :meth:`_apply_joined`).
            ``reason`` of a ``renew`` (an attempt its worker has not started yet: ``SlurmPending: ...``) is
            the claimed job's reason; ``where`` of a ``started``: where it runs besides ``worker`` (WHERE).
        """
        event = claims.report_event(kind, attempt, worker, exit_code=exit_code, reason=reason,
                                    never_started=never_started, stimulus_id=stimulus_id, timed_out=timed_out,
                                    preflight=preflight, where=where)
        if kind == "renew":
            actions = await self.apply(job_id, event, row=row)
            if _pending_reason(reason) and not any(isinstance(a, claims.ReplyStale) for a in actions):
                await self._store.jobs.set_claimed_reason(job_id, attempt, reason[:300])
                self._signals.job_changed(job_id)
            return actions
        wall = self._clock.wall()
        if kind == "started":  # (its processes are in the worker's run row, none recorded here)
            actions = await self._apply_joined(job_id, event, lambda then, k: self._store.jobs.mark_running(
                job_id, attempt, 0, 0.0, 0, wall, then, k, place=where), write_alone=False, row=row)
        else:
            state: Literal["exited", "lost", "preflight-failed"] = (
                "exited" if kind == "exited" else "preflight-failed" if preflight else "lost")
            actions = await self._apply_joined(job_id, event, lambda then, k: self._store.jobs.end_attempt(
                job_id, attempt, state, exit_code, reason, wall, then, k), write_alone=False, row=row)
        self._ended(job_id, actions, here=worker == self._node_id)
        return actions

    def _ended(self, job_id: str, actions: Sequence[claims.Action], here: bool = False) -> None:
        """After an attempt's end was decided: when it ended the job's attempt (the job queued again
        or finished), its lease is dropped and the scheduler woken (a one-host attempt that ran ``here``:
        its worker tells of the slot, :meth:`Signals.slot_freed`; a job queued again asks for a pass);
        a stale or duplicate end (nothing changed) leaves the current attempt's lease alone."""
        if any(isinstance(a, claims.PersistJob) and a.record.status not in claims.ACTIVE for a in actions):
            self.drop_lease(job_id)
            self._signals.ended_here() if here else self._signals.wake()

    async def exited(self, job_id: str, attempt: int, exit_code: int | None, detail: str, why: str,
                     stimulus_id: str = "", *, worker: str) -> None:
        """The attempt ended with ``exit_code``: record it on the attempt, then on the job.

        Only for what this daemon saw itself (``worker`` is this node, a gang's coordinator); a
        worker's report, this node's own included, goes through the owner's report route.

        Args:
            detail: what the attempt row keeps (the watchdog's words).
            why: the job's reason for a failure, when it says more than the exit code.
        """
        self._ended(job_id, await self._apply_joined(
            job_id, claims.RunExited(attempt, worker, exit_code, why, stimulus_id),
            lambda then, kind: self._store.jobs.end_attempt(job_id, attempt, "exited", exit_code, detail,
                                                            self._clock.wall(), then, kind)))

    async def lost(self, job_id: str, attempt: int, reason: str, *, worker: str, never_started: bool = False,
                   stimulus_id: str = "") -> None:
        """The attempt is gone without an exit status: record it; the job retries as its policy says.

        Like :meth:`exited`, only for what this daemon (``worker``, the attempt's holder) saw itself.
        """
        self._ended(job_id, await self._apply_joined(
            job_id, claims.RunLost(attempt, worker, reason, never_started, stimulus_id),
            lambda then, kind: self._store.jobs.end_attempt(job_id, attempt, "lost", None, reason,
                                                            self._clock.wall(), then, kind)))


def _pending_reason(reason: str) -> bool:
    """Whether a renewal's ``reason`` is one a holder may set as its claimed job's: a Slurm worker's
    ``SlurmPending: ...`` on one line (no other code: a holder cannot make the listing say the job was
    cancelled or waits on another user's)."""
    return reason.startswith("SlurmPending: ") and reason.isprintable()
