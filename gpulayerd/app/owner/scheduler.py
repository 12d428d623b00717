"""The scheduler: one pass matches the queued jobs owned here against this machine and the peers.

In fair-share order (the user with the least decayed usage first, see :mod:`gpulayerd.core.fairshare`;
within one user, submission order): a job that fits here now is claimed and started here; one that
fits only a peer is offered to the best such peer; a multi-host job goes to the gang
coordinator. Identical jobs behind one that did not fit here are not matched again
in the same pass. Then every one-host job still queued gets its current reason, judged
against this machine as the pass left it and the peers' last snapshots (identical jobs
share the judgement, each job's row is written when its reason changed): a short code
and the deciding words (:mod:`gpulayerd.core.reasons`), e.g. ``Busy: cpu slots 1 free
of 2 on ws-1 (needs 2)``; one that fits only a peer now is offered to it (``Ready``).
A job that waits here while a user with less usage holds a device here (or waits ahead
of it) says so: ``FairShare: fair share: alice used 6.1 GPU-h today, bob 0.2``. Then the
worker claims the peers' offers that fit here now.

Incremental: every (shape, worker) row and every shape's explanation is kept in a
:class:`gpulayerd.core.matching.shapes.ShapeBook` until that worker's snapshot changes, so a pass
re-judges only what changed. A wake-up by the timer alone (no submit, exit, probe or peer
change) skips the pass when nothing it reads can have changed (:meth:`Scheduler._idle`).
The queue is kept in memory in fair-share order: a pass reads from the store only the rows of
jobs with an event since the last pass (:meth:`gpulayerd.store.jobs.JobsTable.queue_changes`;
every queued row again when the count of queued jobs disagrees). When this machine is as the
last pass left it, the jobs that pass left still cannot start here, so new jobs are placed
first and only they are walked; reasons are written in batches, only when their line changed.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import Counter
from collections.abc import Hashable
from dataclasses import replace

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.app.owner.placing import (
    CHUNK,
    Key,
    order_key,
    others_hold_gpus,
    pair_key,
    peer_loads,
    slim,
    spread,
    with_fair_share,
    without_paths,
)
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.config import DaemonConfig
from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import ShapeBook, freeze
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, Verdict
from gpulayerd.errors import PeerCallError
from gpulayerd.models import ExplanationModel
from gpulayerd.net.transport import OFFER, PeerTransport
from gpulayerd.net.wire import Offer, new_msg_id
from gpulayerd.store import JobRow, Store

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs scheduling passes whenever something changes (or every ``schedule_interval_s``)."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, jobs: OwnedJobs, machine: Machine,
                 worker: WorkerService, gangs: GangCoordinator, transport: PeerTransport,
                 directory: Directory | None, support: SupportMatrix, signals: Signals, clock: Clock,
                 usage: UsageService | None = None) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._jobs = jobs
        self._machine = machine
        self._worker = worker
        self._gangs = gangs
        self._transport = transport
        self._directory = directory
        self._support = support
        self._signals = signals
        self._clock = clock
        self._usage = usage
        self._offered: dict[str, tuple[str, float]] = {}  # our job -> (worker, when offered)
        self.book = ShapeBook(support)  # kept rows and verdicts (gpulayerd.core.matching.shapes)
        # One request per requirement shape (its first queued job's): jobs of a shape are judged alike.
        self._shape_reqs: dict[int, JobRequest] = {}
        self._busy = True  # the last pass left something that needs the timer (see _idle)
        self._last_inputs: object = None  # peers and fair-share order the last pass saw
        self.passes_skipped = 0
        # The queue in memory (the store stays the truth: see _refresh).
        self._queue: dict[str, JobRow] = {}  # queued job -> its row (without the stored explanation)
        self._event = -1  # the last event of the store applied to it (-1: reload)
        self._dropped = 0  # jobs that left the queue since the kept answers were last pruned
        self._order: tuple[object, list[Key]] | None = None  # (users' scores, the queue's keys, sorted)
        self._unordered: list[str] = []  # jobs added since the order was last brought up to date
        self._workdirs: set[tuple[str | None, str | None]] | None = None  # (user, workdir) pairs to check
        # this machine after the last walk: (frozen without paths, the same without CPU slots, it, workdirs)
        self._settled: tuple[Hashable, Hashable, WorkerSnapshot, set[str]] | None = None
        self._told: dict[str, Explanation] = {}  # job -> the kept explanation its stored reason came from
        self._users: Counter[str] = Counter()  # queued jobs per user
        self._gang: set[str] = set()  # queued multi-host jobs (walked every pass)
        # Queued jobs by shape, for the reasons of a one-user queue (see _reasons_by_shape).
        self._members: dict[int, dict[str, None]] = {}  # shape -> its queued jobs
        self._job_sid: dict[str, int] = {}  # queued job -> its shape
        self._shape_told: dict[int, str] = {}  # shape -> the reason line every one of its jobs has stored
        self._cpu_shapes: dict[int, None] = {}  # queued shapes that ask for no device (they read CPU slots)
        self._revisit: dict[int, None] = {}  # shapes whose line must be judged again at the next pass
        self._reasons_epochs: tuple[int, int] | None = None  # the book's epochs at the last shape walk
        # This pass cannot vouch that the jobs it did not walk still cannot start here: a job that fits
        # was not granted, a claim took devices, or the machine changed by more than a claim did.
        self._unsure = False

    async def loop(self) -> None:
        """Pass after pass: at every wake-up, and at least every ``schedule_interval_s``."""
        await self._machine.wait_ready()
        woken = True
        while True:
            self._signals.clear_wake()
            if woken or not self._idle():
                self._signals.stats["scheduler_passes"] += 1
                await self.run_once()
            else:
                self.passes_skipped += 1
                self._signals.stats["scheduler_passes_skipped"] += 1
                await self._worker.take_offers()
            await self._signals.wait_wake(self._config.schedule_interval_s)
            woken = self._signals.woken()

    def _inputs(self) -> object:
        """What a pass reads that changes without a wake-up: the peers' snapshots, the users' order."""
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        order: list[str] = []
        if self._usage is not None and self._users:
            users = sorted(self._users)  # the users of the queued jobs (kept per job: no walk of the queue)
            order = [c.user for c in self._usage.order(fairshare.Candidate(u, u, 0.0) for u in users)]
        return (freeze(sorted(remote, key=lambda w: w.node_id)), tuple(order))

    def _idle(self) -> bool:
        """True when a timer-only pass would decide nothing new: the last pass left no job waiting
        on a cause no event reports (a missing workdir or account, a process gpulayer did not start,
        an offer to repeat, a multi-host job, a fair-share figure that decays), and neither the
        peers' snapshots nor the users' fair-share order changed since."""
        return not self._busy and self._inputs() == self._last_inputs

    async def run_once(self) -> None:
        """One scheduling pass over the queued jobs, then the peers' offers."""
        new = await self._refresh()
        self._busy = False
        if self._queue:
            await self._place(new)
        if self._dropped > max(64, len(self._queue) // 8):  # forget the shapes only jobs gone had
            self._dropped = 0
            self.book.retain(r.job_id for r in self._shape_reqs.values())
        self._last_inputs = self._inputs()
        await self._worker.take_offers()

    # ------------------------------------------------------------------ the queue in memory

    async def _refresh(self) -> list[str]:
        """Bring the in-memory queue up to the store (the truth): the rows of the jobs with an
        event since the last refresh, or every queued row at the first pass or when the count
        of queued jobs disagrees. Returns the ids new to the queue, in submission order."""
        jobs = self._store.jobs
        if self._event >= 0:
            head, count, rows = await jobs.queue_changes(self._event)
            new: list[str] = []
            for row in rows:
                self._told.pop(row.id, None)  # its stored reason may have changed with the event
                if row.status is JobStatus.QUEUED:
                    if row.id not in self._queue:
                        new.append(row.id)
                    self._add(row)
                else:
                    self._drop(row.id)
            self._event = head
            if len(self._queue) == count:
                return sorted(new, key=lambda j: self._queue[j].seq or 0)
        head, _, _ = await jobs.queue_changes(1 << 62)  # changes after head are read again next time
        queued = await jobs.list_jobs([JobStatus.QUEUED], None)
        known = self._queue
        self._dropped += len(known)
        self._queue, self._users, self._told, self._gang = {}, Counter(), {}, set()
        self._members, self._job_sid, self._shape_told = {}, {}, {}
        self._cpu_shapes, self._revisit, self._reasons_epochs, self._shape_reqs = {}, {}, None, {}
        for row in queued:
            self._add(row)
        self._event, self._order, self._settled, self._workdirs = head, None, None, None
        self._unordered = []
        return [row.id for row in queued if row.id not in known]

    def _add(self, row: JobRow) -> None:
        """Keep ``row`` (queued) in the queue in memory."""
        if row.id not in self._queue:
            self._unordered.append(row.id)
            req = self._jobs.spec(row).to_core(row.id)
            self._users[req.user] += 1
            if self._workdirs is not None:
                self._workdirs.add((req.user or None, req.workdir))
            sid = self._job_sid[row.id] = self.book.shape_of(req, keep=False)
            if sid not in self._shape_reqs:  # the shape's first queued job: its request stands for all
                self._shape_reqs[sid] = req
                self.book.shape_of(req)
                if req.gpu_count == 0:
                    self._cpu_shapes[sid] = None
            self._members.setdefault(sid, {})[row.id] = None
        self._queue[row.id] = slim(row)
        sid = self._job_sid[row.id]
        self._shape_told.pop(sid, None)  # its stored reason may differ from its shape's
        self._revisit[sid] = None

    def _drop(self, job_id: str) -> None:
        """``job_id`` left the queue (claimed, cancelled, ...)."""
        row = self._queue.pop(job_id, None)
        self._told.pop(job_id, None)
        self._gang.discard(job_id)
        self._offered.pop(job_id, None)
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
        if row is not None:
            self._dropped += 1
            self._users[user] -= 1
            if self._users[user] <= 0:
                del self._users[user]

    def _req(self, job_id: str) -> JobRequest:
        """The request of ``job_id``'s shape (queued): another job's id, the same requirements."""
        return self._shape_reqs[self._job_sid[job_id]]

    def _ordered(self) -> list[str]:
        """The queue in fair-share order (see :meth:`_ordered_keys`)."""
        q = self._queue
        return [k[2] for k in self._ordered_keys() if k[2] in q]

    def _ordered_keys(self) -> list[Key]:
        """The queue's keys in fair-share order: :func:`gpulayerd.core.fairshare.order`'s key, kept sorted
        while the users' ranking holds (new jobs inserted, jobs gone skipped: filter on the queue),
        re-sorted when it changes."""
        users = self._users_key()
        q, req = self._queue, self._req
        if self._order is None or self._order[0] != users or len(self._order[1]) > 2 * len(q) + 64:
            scores = {u: sc for sc, u in users}
            keys = sorted(order_key(row, req(row.id).user, scores) for row in q.values())
            self._order = (users, keys)
            reqs = self._shape_reqs.values()
            self._workdirs = {(r.user or None, r.workdir) for r in reqs}
        else:
            scores = {u: sc for sc, u in users}
            keys = self._order[1]
            for j in self._unordered:
                if j in q:
                    bisect.insort(keys, order_key(q[j], req(j).user, scores))
        self._unordered = []
        return keys

    def _users_key(self) -> tuple[tuple[float, str], ...]:
        """Each user's rank by fair-share score (equal scores, equal ranks; 0 without a usage book):
        the order of jobs depends on nothing else of the usage."""
        if self._usage is None:
            return tuple((0.0, u) for u in sorted(self._users))
        usage = self._usage.usage()
        scores = {u: fairshare.score(usage, u) for u in self._users}
        rank = {sc: float(i) for i, sc in enumerate(sorted(set(scores.values())))}
        return tuple((rank[scores[u]], u) for u in sorted(self._users))

    def _settled_for(self, worker: WorkerSnapshot, *, devices_only: bool = False) -> bool:
        """Whether every job the last pass walked still cannot be placed here: this machine is as
        that pass left it, but for the answers about paths no job of that pass has. With
        ``devices_only``, whether every job that asks for devices still cannot: the same, but for the
        free CPU slots too (a judgement of such a job never reads them, see
        :meth:`gpulayerd.core.matching.shapes.ShapeBook.row`)."""
        if self._settled is None:
            return False
        frozen, dev_frozen, old, workdirs = self._settled
        if devices_only:
            if without_paths(worker, cpu_slots=False) != dev_frozen:
                return False
        elif without_paths(worker) != frozen:
            return False
        if (worker.existing_paths is None) != (old.existing_paths is None):
            return False
        changed = set((worker.existing_paths or frozenset()) ^ (old.existing_paths or frozenset()))
        changed |= worker.unanswered_paths ^ old.unanswered_paths
        changed |= {p for _, p in worker.denied_paths ^ old.denied_paths}
        return not (changed & workdirs)

    # ------------------------------------------------------------------ the pass

    async def _place(self, new: list[str]) -> None:
        fast_ids = set(new)
        self._unsure = False
        if self._workdirs is None:
            self._ordered()
        assert self._workdirs is not None
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=sorted(self._workdirs, key=pair_key))
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        self.book.observe([worker, *remote])
        settled = self._settled_for(worker)
        devices_settled = settled or self._settled_for(worker, devices_only=True)
        # Set again when the walks are through: a walk that raises (a claim, a snapshot) leaves the
        # next pass walking every job (this one took the new jobs out of "new" already).
        self._settled = None
        q = self._queue
        if settled and new:
            self._signals.stats["scheduler_new_jobs_first"] += 1
            # Every job the last pass left here still cannot start here: place the new ones first
            # (in their fair-share order), before the whole queue is walked for its reasons.
            worker, placed = await self._walk(self._fair_order(new), worker, remote)
            fast_ids -= placed
        keys = self._ordered_keys()
        if devices_settled:
            # The jobs the last pass left still cannot start here (or, when only the free CPU slots
            # changed, those that ask for devices): walk only the new ones, gangs, and the jobs that
            # ask for no device when the CPU slots changed (sorted by the queue's own key: no walk
            # over the whole queue).
            scores = {u: sc for sc, u in self._users_key()}
            few = fast_ids | (self._gang & q.keys())
            if not settled:
                self._signals.stats["scheduler_cpu_only_walks"] += 1
                few.update(j for sid in self._cpu_shapes for j in self._members.get(sid, ()))
            ids_walked = sorted((j for j in few if j in q),
                                key=lambda j: order_key(q[j], self._req(j).user, scores))
        else:
            ids_walked = [k[2] for k in keys if k[2] in q]
        worker, _ = await self._walk(ids_walked, worker, remote)
        self._settled = None if self._unsure else (
            without_paths(worker), without_paths(worker, cpu_slots=False), worker,
            {wd for _, wd in self._workdirs if wd is not None})
        await self._reasons(worker, remote)
        # After the reasons: they judged the shapes the walk skipped, at this machine's version.
        self._busy = self._busy or self.book.volatile(worker.node_id)

    async def _walk(self, ids: list[str], worker: WorkerSnapshot,
                    remote: list[WorkerSnapshot]) -> tuple[WorkerSnapshot, set[str]]:
        """Claim here, in order, each queued job of ``ids`` that fits here now (multi-host jobs go to
        the gang coordinator). Returns this machine after the claims and the ids claimed. Stops early
        once every shape of the queue did not fit since the last claim (no later job can fit then)."""
        blocked: set[int] = set()  # shapes that did not fit here since the last claim
        placed: set[str] = set()
        q = self._queue
        for n, job_id in enumerate(ids):
            if n % CHUNK == CHUNK - 1:
                await asyncio.sleep(0)  # a long queue never holds up the API or a job's start
            row = q.get(job_id)
            if row is None:
                continue  # claimed earlier in this pass
            req = self._req(job_id)
            if req.distributed is not None and req.distributed.nnodes > 1:
                self._busy = True  # the gang coordinator keeps its own timers
                self._gang.add(row.id)
                spec = await self._jobs.spec_of(job_id)
                if spec is not None:
                    await self._gangs.schedule(row, spec, spec.to_core(job_id), worker)
                continue
            sig = self.book.shape_of(req)
            if sig in blocked:  # an identical job did not fit: neither does this one
                continue
            ev = self.book.row(req, worker)  # kept until this machine's snapshot changes
            if ev.placement is None:
                blocked.add(sig)
                if not self._gang and len(blocked) >= len(self._members) and blocked.issuperset(self._members):
                    break  # every queued job has a shape that did not fit: the rest would be skipped
            elif (spec := await self._jobs.spec_of(job_id)) is None or job_id not in q:
                continue  # gone from the store (or the queue) meanwhile
            elif not await self._worker.claim_local(row, spec, ev.placement):
                self._unsure = True  # it fits but was not granted: the next pass walks every job again
            else:
                placed.add(row.id)
                self._drop(row.id)
                fresh = await self._machine.snapshot(refresh_apps=False)
                before, devices_version = worker, self.book.version(worker.node_id, devices_only=True)
                worker = replace(fresh, existing_paths=worker.existing_paths, denied_paths=worker.denied_paths,
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

    async def _reasons(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot]) -> None:
        """Offer each job that fits only a peer now to it; every other job records why it waits.

        Judged against ``worker`` as the placing left it (after this pass's claims) and the
        peers' last snapshots: identical jobs share one explanation (the fair-share part is
        each job's own), and each job's row is updated when its reason changed.
        """
        if len(self._users) <= 1:
            try:
                await self._reasons_by_shape(worker, remote)
            except BaseException:
                self._shape_told.clear()  # lines marked told may not have been written
                self._reasons_epochs = None
                raise
            return
        try:
            await self._reasons_by_job(worker, remote)
        except BaseException:
            self._told.clear()  # lines marked told may not have been written
            raise

    async def _reasons_by_job(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot]) -> None:
        """:meth:`_reasons` when the queue holds several users' jobs: job by job in fair-share order (who
        waits ahead is part of each job's fair-share line)."""
        self._shape_told.clear()  # rows written job by job below
        self._reasons_epochs = None
        ids = self._ordered()
        usage = self._usage.usage() if self._usage is not None else {}
        workers = [worker, *remote]  # as last observed by self.book
        waiting: dict[str, None] = {}  # users of the jobs that wait in this pass, in order
        offers: list[tuple[JobRow, str]] = []
        loads = peer_loads(remote)  # a burst spreads over every peer that fits (core.protocol.claims.choose_target)
        writes: list[tuple[JobRow, str, Explanation]] = []  # reasons to store, a batch at a time
        q, gang, shape_req = self._queue, self._gang, self._req
        for n, job_id in enumerate(ids):
            if n % CHUNK == CHUNK - 1:
                if len(writes) >= 256:
                    await self._write_reasons(writes)
                await asyncio.sleep(0)  # a long queue never holds up the API or a job's start
            row = q.get(job_id)
            if row is None or job_id in gang:
                continue  # claimed in this pass, or a multi-host job (the gang coordinator's)
            req = shape_req(job_id)
            e = self.book.explanation(req, workers, same_id=False)  # shared by the jobs of one shape
            if e.placement is not None and e.placement.worker != self.node_id:
                self._busy = True  # offers are repeated every offer_interval_s
                e = spread(e, loads, self._offered.get(row.id, ("", 0.0))[0] or None, self.node_id)
                offers.append((row, e.placement.worker if e.placement is not None else ""))
            elif e.verdict is Verdict.FITS_BUT_BUSY:
                fair = with_fair_share(e, req, worker, usage, waiting)
                # Fair-share figures change with the clock (and a user holding GPUs here may come to pass it over).
                self._busy = self._busy or fair is not e or others_hold_gpus(req, worker)
                e = fair
                waiting[req.user] = None
                self._told.pop(row.id, None)
            else:
                waiting[req.user] = None
                if self._told.get(row.id) is e:
                    continue  # the same judgement as when its reason was stored
                self._told[row.id] = e
            text = self.book.reason(e)
            if text != row.reason:
                writes.append((row, text, e))
        await self._write_reasons(writes)
        for row, target in offers:  # together, after the writes: a peer sees the pass's offers at once
            self._offer(row, target)

    async def _reasons_by_shape(self, worker: WorkerSnapshot, remote: list[WorkerSnapshot]) -> None:
        """:meth:`_reasons` when the queue holds one user's jobs: fair share can then name nobody who
        waits ahead (a shape is one user's), so every job of a shape gets its shape's line. Each shape is
        judged once; its jobs are visited only when that line changed or one of them is new or had an
        event (a burst of identical jobs costs one judgement per pass, not one per queued job).

        Only shapes whose line can have changed are judged: all of them when what a job that asks
        for devices reads changed (the book's devices epoch), else the shapes that ask for no
        device when the CPU slots changed, those with a new job or an event, and those whose line
        the clock changes (an offer repeated, fair-share figures): a pass after one CPU job started
        or ended costs nothing per waiting GPU job."""
        self._told.clear()  # rows written shape by shape below
        usage = self._usage.usage() if self._usage is not None else {}
        workers = [worker, *remote]  # as last observed by self.book
        offers: list[tuple[JobRow, str]] = []
        loads = peer_loads(remote)
        writes: list[tuple[JobRow, str, Explanation]] = []
        q, gang, shape_req = self._queue, self._gang, self._req
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
                await asyncio.sleep(0)
            members = self._members.get(sid)
            if not members:
                continue
            first = next((j for j in members if j in q), None)  # members are queued: the first one
            if first is None:
                continue
            req = shape_req(first)
            if req.distributed is not None and req.distributed.nnodes > 1:
                continue  # the gang coordinator's (a shape is all multi-host jobs or none)
            e = self.book.explanation(req, workers, same_id=False)
            if e.placement is not None and e.placement.worker != self.node_id:
                self._busy = True  # offers are repeated every offer_interval_s
                self._shape_told.pop(sid, None)
                self._revisit[sid] = None
                for job_id in list(members):
                    row = q.get(job_id)
                    if row is None or job_id in gang:
                        continue
                    one = spread(e, loads, self._offered.get(job_id, ("", 0.0))[0] or None, self.node_id)
                    offers.append((row, one.placement.worker if one.placement else ""))
                    text = self.book.reason(one)
                    if text != row.reason:
                        writes.append((row, text, one))
                continue
            if e.verdict is Verdict.FITS_BUT_BUSY:
                fair = with_fair_share(e, req, worker, usage, {})
                if fair is not e or others_hold_gpus(req, worker):
                    self._busy = True  # fair-share figures change with the clock
                    self._revisit[sid] = None
                e = fair
            text = self.book.reason(e)
            if self._shape_told.get(sid) == text:
                continue
            for job_id in list(members):
                visited += 1
                if visited % CHUNK == 0:
                    if len(writes) >= 256:
                        await self._write_reasons(writes)
                    await asyncio.sleep(0)  # a long queue never holds up the API or a job's start
                kept = q.get(job_id)
                if kept is not None and job_id not in gang and kept.reason != text:
                    writes.append((kept, text, e))
            self._shape_told[sid] = text
        await self._write_reasons(writes)
        self._reasons_epochs = epochs
        for row, target in offers:
            self._offer(row, target)

    def _fair_order(self, ids: list[str]) -> list[str]:
        """``ids`` (queued) in fair-share order (submission order without a usage book)."""
        if self._usage is None:
            return ids
        seqs = [self._queue[j].seq for j in ids]
        cands = [fairshare.Candidate(j, self._req(j).user, float(seq if seq is not None else i))
                 for i, (j, seq) in enumerate(zip(ids, seqs, strict=True))]
        return [c.job_id for c in self._usage.order(cands)]

    async def _write_reasons(self, writes: list[tuple[JobRow, str, Explanation]]) -> None:
        """Store each job's new reason line (:func:`gpulayerd.core.reasons.reason_text` of its
        explanation) and explanation, in one transaction; empties ``writes``."""
        if not writes:
            return
        items = [(row.id, text, ExplanationModel.from_core(e if e.job_id == row.id else replace(e, job_id=row.id))
                  .model_dump_json()) for row, text, e in writes]
        await self._store.jobs.set_explanations(items)
        for row, text, _ in writes:
            if row.id in self._queue:
                self._queue[row.id] = replace(row, reason=text)
            self._signals.job_changed(row.id)
        writes.clear()

    def _offer(self, row: JobRow, target: str) -> None:
        """Offer a job that fits the peer ``target`` now to it (at most every ``offer_interval_s``)."""
        last = self._offered.get(row.id)
        now = self._clock.monotonic()
        if last is not None and last[0] == target and now - last[1] < self._config.offer_interval_s:
            return
        self._offered[row.id] = (target, now)
        self._signals.spawn(self._send_offer(target, row.id))

    async def _send_offer(self, worker: str, job_id: str) -> None:
        row = await self._jobs.get(job_id)
        if row is None or row.status is not JobStatus.QUEUED:
            return  # claimed meanwhile: never offer a job that is no longer queued
        spec = self._jobs.spec(row)
        # Environment values (tokens) go only with the grant, to the worker that runs the job.
        offered = spec.model_dump(mode="json")
        offered["env"] = dict.fromkeys(spec.env, "")
        offer = Offer(msg_id=new_msg_id(), owner=self.node_id, job_id=row.id, spec=offered, lease_s=row.lease_s)
        self._signals.stats["offers_sent"] += 1
        self._jobs.offered(row.id, worker, spec.user or "")  # before the send: it may claim before it answers
        try:
            await self._transport.call(worker, OFFER, offer)
        except PeerCallError as e:
            log.info("job_id=%s: offer to %s failed: %s", offer.job_id, worker[:12], e)

