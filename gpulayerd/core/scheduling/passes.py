"""The scheduler's pass, decided: events in, actions out, the clock as an argument (no I/O).

One pass matches the queued jobs owned here against this machine and the peers. In fair-share
order (the user with the least decayed usage first, see :mod:`gpulayerd.core.fairshare`; within one
user, submission order): a job that fits here now is claimed here, unless it asks for devices and a
peer's fit now is strictly smaller (best fit across hosts; for two offers at most); one that fits only
peers is offered to the best fit among them, then the least loaded (:mod:`gpulayerd.core.protocol.targets`);
a multi-host job goes to the gang coordinator. A retry that avoids a worker goes to any other that
fits now first (:mod:`.retrying`); one waiting out its backoff is neither claimed nor offered. Identical
jobs behind one that did not fit here are not judged again in the same walk. Then every one-host job
still queued gets its current reason, judged against this machine as the walk left it and the
peers' last snapshots (identical jobs share the judgement; a job's row is written only when its
reason changed): a short code and the deciding words (:mod:`gpulayerd.core.reasons`), e.g.
``Resources: cpu slots 1 free of 2 on ws-1 (needs 2)``. A job that waits here while a user with less
usage holds a device here (or waits ahead of it) says so (``FairShare: ...``).

Incremental: every (shape, worker) row and every shape's explanation is kept in a
:class:`~gpulayerd.core.matching.shapes.ShapeBook` until that worker's snapshot changes, so a
pass re-judges only what changed; the queue is kept in fair-share order; when this machine is as
the last pass left it, the jobs that pass left still cannot start here, so only new jobs (and
gangs, and CPU-only jobs when only the free CPU slots changed) are walked.

The machine is :class:`SchedulerCore`; one pass is the generator :meth:`SchedulerCore.run_pass`:
it yields one :data:`Action` at a time and is sent the answer (:data:`Answer`) of each; an I/O
error is thrown into it (``generator.throw``), which leaves it walking every job at the next
pass. The service that carries the actions out is :class:`gpulayerd.app.owner.scheduler.Scheduler`."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Generator, Hashable, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import ShapeBook
from gpulayerd.core.protocol.targets import Fit, OfferRound
from gpulayerd.core.scheduling.judging import (
    BUSY_OFFERS,
    StandingOffers,
    due_offers,
    elsewhere,
    fair_order,
    order_key,
    others_hold_gpus,
    overflow_waits,
    pair_key,
    pass_inputs,
    peer_fits,
    peer_loads,
    settled_for,
    spread,
    user_ranks,
    with_fair_share,
    without_paths,
)
from gpulayerd.core.scheduling.retrying import OfferAges, RetryHolds
from gpulayerd.core.scheduling.steps import (
    Action,
    Answer,
    Claim,
    ClaimAnswered,
    Count,
    Key,
    MachineRead,
    Pass,
    QueueChanges,
    QueuedJob,
    QueueLoaded,
    ReadChanges,
    ReadMachine,
    ReadQueue,
    StoreReasons,
    ToGang,
    Yield,
)
from gpulayerd.core.scheduling.successor import successor_claim
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, Verdict

__all__ = ["CHUNK", "REASON_BATCH", "SchedulerCore"]

CHUNK = 128
"""Jobs judged between two :class:`Yield` actions (about 0.2 ms: a long queue never holds up the API)."""

REASON_BATCH = 256
"""Reason lines written in one :class:`StoreReasons` at most while a walk is under way."""

# ---------------------------------------------------------------------------------------- the machine


class SchedulerCore:
    """The scheduler's state and decisions (pure: no I/O, no clock of its own).

    Args:
        node_id: this machine's node id.
        support: the support matrix jobs are judged with.
        offer_interval_s: an offer to the same peer is repeated at most this often (s).
        fair_share: whether the caller keeps a usage book (without one, submission order).
    """

    def __init__(self, node_id: str, support: SupportMatrix, *, offer_interval_s: float,
                 fair_share: bool = True) -> None:
        self.node_id = node_id
        self.book = ShapeBook(support)  # kept rows and verdicts (gpulayerd.core.matching.shapes)
        self._support = support
        self._offer_interval_s = offer_interval_s
        self._fair = fair_share
        self.offered: dict[str, tuple[str, float]] = {}  # our job -> (worker, when offered)
        # One request per requirement shape (its first queued job's): jobs of a shape are judged alike.
        self._shape_reqs: dict[int, JobRequest] = {}
        self._busy = True  # the last pass left something that needs the timer (see idle)
        self._last_inputs: object = None  # peers and fair-share order the last pass saw
        self.queue: dict[str, QueuedJob] = {}  # queued job -> as kept
        self._event = -1  # the last event of the store applied (-1: reload)
        self._dropped = 0  # jobs that left the queue since the kept answers were last pruned
        self._order: tuple[object, list[Key]] | None = None  # (users' ranks, the queue's keys, sorted)
        self._unordered: list[str] = []  # jobs added since the order was last brought up to date
        self._workdirs: set[tuple[str | None, str | None]] | None = None  # (user, workdir) pairs to check
        # this machine after the last walk: (frozen without paths, the same without CPU slots, it, workdirs)
        self._settled: tuple[Hashable, Hashable, WorkerSnapshot, set[str]] | None = None
        self._told: dict[str, Explanation] = {}  # job -> the kept explanation its stored reason came from
        self._users: Counter[str] = Counter()  # queued jobs per user
        self.gang: set[str] = set()  # queued multi-host jobs (walked every pass)
        self._members: dict[int, dict[str, None]] = {}  # shape -> its queued jobs
        self._job_sid: dict[str, int] = {}  # queued job -> its shape
        self._shape_told: dict[int, str] = {}  # shape -> the reason line every one of its jobs has stored
        self._cpu_shapes: dict[int, None] = {}  # queued shapes that ask for no device (they read CPU slots)
        self._revisit: dict[int, None] = {}  # shapes whose line must be judged again at the next pass
        self._reasons_epochs: tuple[int, int] | None = None  # the book's epochs at the last shape walk
        # This pass cannot vouch that the jobs it did not walk still cannot start here: a job that fits
        # was not granted, a claim took devices, or the machine changed by more than a claim did.
        self._unsure = False
        self._deferred: set[str] = set()  # this pass's device jobs that fit here, left to a smaller fit
        self._walk_round, self._now = OfferRound({}), 0.0  # the walks' promises of peers' devices, the time
        self._left_since: dict[str, float] = {}  # job -> when it was first left to a peer (fitting here)
        self._ages = OfferAges(3 * offer_interval_s)  # a peer that never claims a job's offer: the next best
        self._holds = RetryHolds()  # retries waiting out their backoff: neither walked nor offered

    # ------------------------------------------------------------------ queries

    def waiting_users(self) -> list[str]:
        """The users with one-host jobs queued here (as the last pass read the queue)."""
        return list(self._users)

    def queued(self, job_id: str) -> bool:
        """Whether ``job_id`` is in the kept queue (else its :class:`QueuedJob` must carry its request)."""
        return job_id in self.queue

    def retry_due(self) -> float | None:
        """When the first queued retry's backoff ends (wall-clock s; a pass is due then), or None."""
        return self._holds.next_due()

    def request(self, job_id: str) -> JobRequest:
        """The request of queued ``job_id``'s shape (another job's id, the same requirements); raises
        KeyError when ``job_id`` is not queued here."""
        return self._shape_reqs[self._job_sid[job_id]]

    def inputs(self, remote: Sequence[WorkerSnapshot], usage: Mapping[str, fairshare.Usage] | None) -> object:
        """What a pass reads that changes without a wake-up: the peers' snapshots, the users' order."""
        return pass_inputs(self._users, remote, usage, self.book.memo)

    def idle(self, remote: Sequence[WorkerSnapshot], usage: Mapping[str, fairshare.Usage] | None) -> bool:
        """True when a timer-only pass would decide nothing new: the last pass left no job waiting on a cause
        no event reports (a missing workdir or account, a process gpulayer did not start, an offer to repeat,
        a multi-host job, a fair-share figure that decays), and the peers and the users' order are as then."""
        return not self._busy and self.inputs(remote, usage) == self._last_inputs

    def successor(self, ended: str, worker: WorkerSnapshot, usage: Mapping[str, fairshare.Usage] | None,
                  peer_offers: bool) -> Claim | None:
        """The claim a pass would make first for the slot ``ended`` left here, if sure (:mod:`.successor`), or None."""
        q = self.queue
        first = next((q[k[2]] for k in self._ordered_keys(usage) if k[2] in q), None)
        return successor_claim(ended, first, self.request, worker, self.gang, self.offered, self._users,
                               self._support, peer_offers)

    def claimed_here(self, job_id: str) -> None:
        """``job_id`` was claimed here outside a pass (:meth:`successor`): it leaves the queue."""
        self._drop(job_id)

    # ------------------------------------------------------------------ the pass

    def run_pass(self) -> Pass:
        """One scheduling pass (a generator: see the module's doc)."""
        new = yield from self._refresh()
        self._busy = False
        machine: MachineRead | None = None
        if self.queue:
            machine = yield from self._place(new)
        if self._dropped > max(64, len(self.queue) // 8):  # forget the shapes only jobs gone had
            self._dropped = 0
            self.book.retain(r.job_id for r in self._shape_reqs.values())
        if machine is None:
            machine = yield from self._read_machine(local=False)
        self._last_inputs = self.inputs(machine.remote, machine.usage)

    def _read_machine(self, *, local: bool = True) -> Generator[Action, Answer, MachineRead]:
        workdirs = tuple(sorted(self._workdirs or (), key=pair_key)) if local else ()
        got = yield ReadMachine(workdirs, local)
        assert isinstance(got, MachineRead)
        return got

    # ------------------------------------------------------------------ the queue

    def _refresh(self) -> Generator[Action, Answer, list[str]]:
        """Bring the kept queue up to the store (the truth): the jobs with an event since the last refresh, or
        every queued job at the first pass or when the count of queued jobs disagrees; the ids new to it, in order."""
        if self._event >= 0:
            got = yield ReadChanges(self._event)
            assert isinstance(got, QueueChanges)
            new: list[str] = []
            for job, queued in got.changed:
                self._told.pop(job.id, None)  # its stored reason may have changed with the event
                if queued:
                    if job.id not in self.queue:
                        new.append(job.id)
                    self._add(job)
                else:
                    self._drop(job.id)
            self._event = got.head
            if len(self.queue) == got.count:
                return sorted(new, key=lambda j: self.queue[j].seq or 0)
        loaded = yield ReadQueue()
        assert isinstance(loaded, QueueLoaded)
        known = self.queue
        self._dropped += len(known)
        self.queue, self._users, self._told, self.gang = {}, Counter(), {}, set()
        self._members, self._job_sid, self._shape_told = {}, {}, {}
        self._cpu_shapes, self._revisit, self._reasons_epochs, self._shape_reqs = {}, {}, None, {}
        self._holds.clear()
        for job in loaded.queued:
            self._add(job)
        self._event, self._order, self._settled, self._workdirs = loaded.head, None, None, None
        self._unordered = []
        return [job.id for job in loaded.queued if job.id not in known]

    def _add(self, job: QueuedJob) -> None:
        """Keep ``job`` (queued) in the queue; raises ValueError when it is new to the queue and carries no
        request."""
        req = job.request
        if req is not None:
            job = replace(job, request=None)
        if job.id not in self.queue:
            if req is None:
                raise ValueError(f"queued job {job.id!r} is new to the scheduler and carries no request")
            self._unordered.append(job.id)
            self._users[req.user] += 1
            if self._workdirs is not None:
                self._workdirs.add((req.user or None, req.workdir))
            sid = self._job_sid[job.id] = self.book.shape_of(req, keep=False)
            if sid not in self._shape_reqs:  # the shape's first queued job: its request stands for all
                self._shape_reqs[sid] = req
                self.book.shape_of(req)
                if req.gpu_count == 0:
                    self._cpu_shapes[sid] = None
            self._members.setdefault(sid, {})[job.id] = None
        self.queue[job.id] = job
        self._holds.keep(job)
        sid = self._job_sid[job.id]
        self._shape_told.pop(sid, None)  # its stored reason may differ from its shape's
        self._revisit[sid] = None

    def _drop(self, job_id: str) -> None:
        """``job_id`` left the queue (claimed, cancelled, ...)."""
        job = self.queue.pop(job_id, None)
        self._told.pop(job_id, None)
        self.gang.discard(job_id)
        self.offered.pop(job_id, None)
        self._left_since.pop(job_id, None)
        self._ages.forget(job_id)
        self._holds.drop(job_id)
        sid = self._job_sid.pop(job_id, None)
        if sid is None:
            return
        user = self._shape_reqs[sid].user
        members = self._members.get(sid, {})
        members.pop(job_id, None)
        if not members:
            self._members.pop(sid, None)
            self._shape_told.pop(sid, None)
            self._cpu_shapes.pop(sid, None)
            self._revisit.pop(sid, None)
            self._shape_reqs.pop(sid, None)
        if job is not None:
            self._dropped += 1
            self._users[user] -= 1
            if self._users[user] <= 0:
                del self._users[user]

    def _ordered_keys(self, usage: Mapping[str, fairshare.Usage] | None) -> list[Key]:
        """The queue's keys in fair-share order: kept sorted while the users' ranking holds (new jobs
        inserted, jobs gone skipped: filter on the queue), re-sorted when it changes."""
        users = user_ranks(self._users, usage if self._fair else None)
        q, req = self.queue, self.request
        scores = {u: sc for sc, u in users}
        if self._order is None or self._order[0] != users or len(self._order[1]) > 2 * len(q) + 64:
            keys = sorted(order_key(job, req(job.id).user, scores) for job in q.values())
            self._order = (users, keys)
            self._workdirs = {(r.user or None, r.workdir) for r in self._shape_reqs.values()}
        else:
            keys = self._order[1]
            for j in self._unordered:
                if j in q:
                    bisect.insort(keys, order_key(q[j], req(j).user, scores))
        self._unordered = []
        return keys

    def _place(self, new: list[str]) -> Generator[Action, Answer, MachineRead]:
        self._unsure = False
        if self._workdirs is None:
            self._workdirs = {(r.user or None, r.workdir) for r in self._shape_reqs.values()}
        machine = yield from self._read_machine()
        assert machine.local is not None
        for job_id in self._holds.release(machine.wall):  # backoff over: walked and judged as new jobs
            self._told.pop(job_id, None)
            self._add(replace(self.queue[job_id], retry_at=None))
            new.append(job_id)
        moved, self._busy = overflow_waits(self.queue.values(), self.request, machine)
        for job_id, waited in moved.items():  # [slurm] overflow-after passed: a new shape (passes go on till then)
            job, req = self.queue[job_id], replace(self.request(job_id), job_id=job_id, waited_s=waited)
            self._drop(job_id)
            self._add(replace(job, request=req))
            new.append(job_id)
        fast_ids = set(new)
        worker, remote, usage = machine.local, list(machine.remote), machine.usage
        self.book.observe([worker, *remote])
        # Device jobs that fit here now but go to a peer with a smaller fit (best fit across hosts).
        self._deferred, self._walk_round, self._now = set(), OfferRound(peer_loads(remote)), machine.now
        settled = settled_for(self._settled, worker, memo=self.book.memo)
        devices_settled = settled or settled_for(self._settled, worker, devices_only=True, memo=self.book.memo)
        # Set again when the walks are through: a walk that raises (a claim, a snapshot) leaves the
        # next pass walking every job (this one took the new jobs out of "new" already).
        self._settled = None
        q = self.queue
        if settled and new:
            yield Count("scheduler_new_jobs_first")
            # Every job the last pass left here still cannot start here: place the new ones first
            # (in their fair-share order), before the whole queue is walked for its reasons.
            worker, placed = yield from self._walk(fair_order(new, self.queue, lambda j: self.request(j).user,
                                                                  usage if self._fair else None), worker, remote)
            fast_ids -= placed
        keys = self._ordered_keys(usage)
        if devices_settled:
            # Walk only the new jobs, gangs, and the jobs that ask for no device when the CPU slots
            # changed (sorted by the queue's own key: no walk over the whole queue).
            scores = {u: sc for sc, u in user_ranks(self._users, usage if self._fair else None)}
            few = fast_ids | (self.gang & q.keys())
            if not settled:
                yield Count("scheduler_cpu_only_walks")
                few.update(j for sid in self._cpu_shapes for j in self._members.get(sid, ()))
            ids_walked = sorted((j for j in few if j in q), key=lambda j: order_key(q[j], self.request(j).user, scores))
        else:
            ids_walked = [k[2] for k in keys if k[2] in q]
        worker, _ = yield from self._walk(ids_walked, worker, remote)
        assert self._workdirs is not None
        self._settled = None if self._unsure else (
            without_paths(worker, memo=self.book.memo), without_paths(worker, cpu_slots=False, memo=self.book.memo),
            worker,
            {wd for _, wd in self._workdirs if wd is not None})
        yield from self._reasons(worker, remote, usage, machine.now)
        # After the reasons: they judged the shapes the walk skipped, at this machine's version.
        self._busy = self._busy or self.book.volatile(worker.node_id)
        return replace(machine, local=worker)

    def _walk(self, ids: list[str], worker: WorkerSnapshot,
              remote: list[WorkerSnapshot]) -> Generator[Action, Answer, tuple[WorkerSnapshot, set[str]]]:
        """Claim here, in order, each queued job of ``ids`` that fits here now (multi-host jobs go to
        the gang coordinator). Returns this machine after the claims and the ids claimed. Stops early
        once every shape of the queue did not fit since the last claim (no later job can fit then)."""
        blocked: set[int] = set()  # shapes that did not fit here since the last claim
        placed: set[str] = set()
        q = self.queue
        for n, job_id in enumerate(ids):
            if n % CHUNK == CHUNK - 1:
                yield Yield()
            job = q.get(job_id)
            if job is None or job_id in self._deferred or job_id in self._holds:
                continue  # claimed earlier in this pass, left to a peer with a smaller fit, or a retry's backoff
            req = self.request(job_id)
            if req.distributed is not None and req.distributed.nnodes > 1:
                self._busy = True  # the gang coordinator keeps its own timers
                self.gang.add(job_id)
                yield ToGang(job, worker)
                continue
            sig = self.book.shape_of(req)
            if sig in blocked:  # an identical job did not fit: neither does this one
                continue
            ev = self.book.row(req, worker)  # kept until this machine's snapshot changes
            if ev.placement is None:
                blocked.add(sig)
                if not self.gang and len(blocked) >= len(self._members) and blocked.issuperset(self._members):
                    break  # every queued job has a shape that did not fit: the rest would be skipped
                continue
            first = self._left_since.get(job_id, self._now)  # left to peers for 2 offers at most, then here
            if self._now - first < 2 * self._offer_interval_s and elsewhere(
                    self.book, req, ev.placement, worker, remote, self._walk_round, job.avoid) is not None:
                self._left_since[job_id] = first
                self._deferred.add(job_id)  # offered to that peer by the reasons' walk
                self._unsure = True  # it fits here: the next pass walks it again (the peer may be gone)
                continue
            got = yield Claim(job, ev.placement)
            assert isinstance(got, ClaimAnswered)
            if got.gone:
                continue  # cancelled or claimed meanwhile: its event drops it at the next refresh
            if not got.granted or got.local is None:
                self._unsure = True  # it fits but was not granted: the next pass walks every job again
                continue
            placed.add(job_id)
            self._drop(job_id)
            before, devices_version = worker, self.book.version(worker.node_id, devices_only=True)
            worker = replace(got.local, existing_paths=worker.existing_paths, denied_paths=worker.denied_paths,
                             unanswered_paths=worker.unanswered_paths, path_timeout_s=worker.path_timeout_s)
            self.book.observe([worker, *remote])
            # The fresh snapshot holds whatever else changed meanwhile (a run that ended, a GPU
            # freed): the jobs this walk passed over or never walks were not judged against that.
            # A claim of CPU slots only leaves all but the free slots as they were (the book's
            # devices version) and frees none; anything else makes the next pass walk every job.
            self._unsure = (self._unsure or bool(ev.placement.device_uuids)
                            or self.book.version(worker.node_id, devices_only=True) != devices_version
                            or (worker.cpu_slots_free or 0) > (before.cpu_slots_free or 0))
            blocked.clear()
        return worker, placed

    def _reasons(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot],
                 usage: Mapping[str, fairshare.Usage] | None, now: float) -> Generator[Action, Answer, None]:
        """Offer each job that fits only a peer now to it; every other job records why it waits, judged against
        ``worker`` as the placing left it and the peers' last snapshots: identical jobs share one explanation
        (the fair-share part is each job's own); a job's reason is stored only when it changed."""
        if len(self._users) <= 1:
            try:
                yield from self._reasons_by_shape(worker, remote, usage or {}, now)
            except BaseException:
                self._shape_told.clear()  # lines marked told may not have been written
                self._reasons_epochs = None
                raise
            return
        try:
            yield from self._reasons_by_job(worker, remote, usage or {}, now)
        except BaseException:
            self._told.clear()  # lines marked told may not have been written
            raise

    def _store(self, writes: list[tuple[QueuedJob, str, Explanation]]) -> Generator[Action, Answer, None]:
        """Store ``writes`` (then kept as the jobs' reasons) and empty it."""
        if writes:
            yield StoreReasons(tuple(writes))
        for job, text, _ in writes:
            if job.id in self.queue:
                self.queue[job.id] = replace(job, reason=text)
        writes.clear()

    def _reasons_by_job(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot],
                        usage: Mapping[str, fairshare.Usage], now: float) -> Generator[Action, Answer, None]:
        """:meth:`_reasons` when the queue holds several users' jobs: job by job in fair-share order (who
        waits ahead is part of each job's fair-share line)."""
        self._shape_told.clear()  # rows written job by job below
        self._reasons_epochs = None
        q = self.queue
        ids = [k[2] for k in self._ordered_keys(usage) if k[2] in q]
        workers = [worker, *remote]  # as last observed by self.book
        by_id = {w.node_id: w for w in workers}
        waiting: dict[str, None] = {}  # users of the jobs that wait in this pass, in order
        offers: list[tuple[str, str]] = []
        # The best fit among the peers that fit, then the least loaded: a burst spreads over every idle peer
        # (core.protocol.targets); identical jobs share one explanation, so their fits are sized once.
        chooser, peers = OfferRound(peer_loads(remote)), {w.node_id: w for w in remote}
        sized: dict[int, tuple[Explanation, list[Fit]]] = {}
        standing = StandingOffers(remote, self.node_id, self.offered)  # of jobs that wait for a busy peer
        writes: list[tuple[QueuedJob, str, Explanation]] = []
        for n, job_id in enumerate(ids):
            if n % CHUNK == CHUNK - 1:
                if len(writes) >= REASON_BATCH:
                    yield from self._store(writes)
                yield Yield()
            job = q.get(job_id)
            if job is None or job_id in self.gang or job_id in self._holds:
                continue  # claimed in this pass, a multi-host job (the gang coordinator's), a retry's backoff
            req = self.request(job_id)
            e = self.book.explanation(req, workers, same_id=False)  # shared by the jobs of one shape
            if e.placement is not None and (e.placement.worker != self.node_id or job_id in self._deferred):
                self._busy = True  # offers are repeated every offer_interval_s
                if id(e) not in sized:
                    sized[id(e)] = (e, peer_fits(e, peers, self.node_id))
                left = worker if job_id in self._deferred else None  # fits here: only smaller fits count
                e = spread(e, chooser, self.offered.get(job_id, ("", 0.0))[0] or None, sized[id(e)][1], left,
                           job.avoid, self._ages.stale(job_id, now))
                if e.placement is not None and e.placement.worker != self.node_id:
                    offers.append((job_id, e.placement.worker))
            elif e.verdict is Verdict.FITS_BUT_BUSY:
                fair = with_fair_share(e, req, by_id, usage, waiting)
                # Fair-share figures change with the clock (and a user holding GPUs here may come to pass it over).
                self._busy = self._busy or fair is not e or others_hold_gpus(req, workers)
                e = fair
                waiting[req.user] = None
                self._told.pop(job_id, None)
                target = standing.target(e, req.user, job_id, job.avoid)
                if target is not None:
                    offers.append((job_id, target))  # a standing offer (see judging.busy_target)
                    self._busy = True  # repeated every offer_interval_s
            else:
                waiting[req.user] = None
                if self._told.get(job_id) is e:
                    continue  # the same judgement as when its reason was stored
                self._told[job_id] = e
            text = self.book.reason(e)
            if text != job.reason:
                writes.append((job, text, e))
        yield from self._store(writes)
        # Together, after the writes: a peer sees the pass's offers at once.
        yield from due_offers(offers, self.offered, now, self._offer_interval_s, self._ages)

    def _reasons_by_shape(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot],
                          usage: Mapping[str, fairshare.Usage], now: float) -> Generator[Action, Answer, None]:
        """:meth:`_reasons` when the queue holds one user's jobs: fair share can then name nobody who waits
        ahead, so every job of a shape gets its shape's line. Each shape is judged once; its jobs are visited
        only when that line changed or one of them is new or had an event. Only shapes whose line can have
        changed are judged: all when what a device job reads changed (the book's devices epoch), else the
        CPU-only shapes when the CPU slots changed, those with a new job or an event, and those whose line
        the clock changes (an offer repeated, fair-share figures)."""
        self._told.clear()  # rows written shape by shape below
        workers = [worker, *remote]  # as last observed by self.book
        by_id = {w.node_id: w for w in workers}
        offers: list[tuple[str, str]] = []
        chooser, peers = OfferRound(peer_loads(remote)), {w.node_id: w for w in remote}
        standing = StandingOffers(remote, self.node_id, self.offered)  # of jobs that wait for a busy peer
        writes: list[tuple[QueuedJob, str, Explanation]] = []
        q = self.queue
        visited = 0
        epochs, last = self.book.epochs(), self._reasons_epochs
        if last is None or last[1] != epochs[1]:
            todo = list(self._members)
        else:
            todo = list(self._revisit)
            if last[0] != epochs[0]:
                todo += [sid for sid in self._cpu_shapes if sid not in self._revisit]
            todo.sort()  # shape ids grow with first sight: the order of a walk over every shape
        self._reasons_epochs, self._revisit = None, {}  # set again when this walk is through
        for n, sid in enumerate(todo):
            if n % CHUNK == CHUNK - 1:
                yield Yield()
            members = self._members.get(sid)
            if not members:
                continue
            first = next((j for j in members if j in q), None)
            if first is None:
                continue
            req = self.request(first)
            if req.distributed is not None and req.distributed.nnodes > 1:
                continue  # the gang coordinator's (a shape is all multi-host jobs or none)
            e = self.book.explanation(req, workers, same_id=False)
            here = e.placement is not None and e.placement.worker == self.node_id
            if e.placement is not None and (not here or not self._deferred.isdisjoint(members)):
                self._busy = True  # offers are repeated every offer_interval_s
                self._shape_told.pop(sid, None)
                self._revisit[sid] = None
                fits = peer_fits(e, peers, self.node_id)  # sized once for the shape's jobs
                for job_id in list(members):
                    job = q.get(job_id)
                    if job is None or job_id in self.gang or job_id in self._holds:
                        continue
                    one = e  # fits here and was not left to a peer: its line as before
                    if not here or job_id in self._deferred:
                        left = worker if job_id in self._deferred else None
                        one = spread(e, chooser, self.offered.get(job_id, ("", 0.0))[0] or None, fits, left,
                                     job.avoid, self._ages.stale(job_id, now))
                    if one.placement is not None and one.placement.worker != self.node_id:
                        offers.append((job_id, one.placement.worker))
                    text = self.book.reason(one)
                    if text != job.reason:
                        writes.append((job, text, one))
                continue
            if e.verdict is Verdict.FITS_BUT_BUSY:
                fair = with_fair_share(e, req, by_id, usage, {})
                if fair is not e or others_hold_gpus(req, workers):
                    self._busy = True  # fair-share figures change with the clock
                    self._revisit[sid] = None
                e = fair
                for job_id in [j for j in members if j in q and not (j in self.gang or j in self._holds)][:BUSY_OFFERS]:
                    target = standing.target(e, req.user, job_id, q[job_id].avoid)
                    if target is None:
                        break
                    offers.append((job_id, target))  # a standing offer (see judging.busy_target)
                    self._busy = True  # repeated every offer_interval_s
                    self._revisit[sid] = None
            text = self.book.reason(e)
            if self._shape_told.get(sid) == text:
                continue
            for job_id in list(members):
                visited += 1
                if visited % CHUNK == 0:
                    if len(writes) >= REASON_BATCH:
                        yield from self._store(writes)
                    yield Yield()
                kept = q.get(job_id)
                if kept is not None and job_id not in self.gang and job_id not in self._holds and kept.reason != text:
                    writes.append((kept, text, e))
            self._shape_told[sid] = text
        yield from self._store(writes)
        self._reasons_epochs = epochs
        yield from due_offers(offers, self.offered, now, self._offer_interval_s, self._ages)
