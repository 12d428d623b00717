"""Requirement shapes and the verdicts kept per shape until an input they read changes.

A job's *shape* is everything the judgement (:func:`gpulayerd.core.matching.evaluate.evaluate`) reads
from it: every field of :class:`~gpulayerd.core.types.JobRequest` but ``job_id``, read
generically, so a requirement kind added to ``JobRequest`` is part of the shape without a
change here. Jobs of one shape get one answer from each worker (HTCondor's autoclusters).

A worker's *version* is a small integer that changes exactly when its snapshot changes (every
field of :class:`~gpulayerd.core.types.WorkerSnapshot`, compared by value: devices and their
grants, free CPU slots, environments, checked paths, accounts, online state).
:class:`ShapeBook` keeps each (shape, worker) row of the table at the worker version it was
judged at and re-judges only rows whose worker changed; each shape's :class:`Explanation` is
kept until the set of workers or one of their versions changes. Its answers are exactly
:func:`~gpulayerd.core.matching.evaluate.explain`'s (a property test checks this).

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core.matching.evaluate import assemble, evaluate, validate
from gpulayerd.core.matching.targeting import overflow_row
from gpulayerd.core.reasons import reason_text
from gpulayerd.core.types import OUTSIDE_HOLDER, JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import (
    Explanation,
    Rejection,
    RejectionCode,
    Verdict,
    WorkerExplanation,
)

__all__ = ["VOLATILE_CODES", "FreezeMemo", "ShapeBook", "assemble", "freeze", "shape_key"]

VOLATILE_CODES = frozenset({
    RejectionCode.WORKDIR_MISSING, RejectionCode.WORKDIR_UNANSWERED, RejectionCode.WORKDIR_DENIED,
    RejectionCode.NO_ACCOUNT, RejectionCode.FOREIGN_PROCESS,
})
"""Rejections whose cause can change without any event the daemon sees (a directory made, an
account added, a process outside gpulayer ending): a job waiting on one is re-checked every pass."""


def _volatile(r: Rejection) -> bool:
    """A cause no event reports: :data:`VOLATILE_CODES`, or a device whose lock something outside
    this daemon holds (:data:`~gpulayerd.core.types.OUTSIDE_HOLDER`)."""
    return r.code in VOLATILE_CODES or (r.code is RejectionCode.RESERVED and OUTSIDE_HOLDER in r.found)


_ATOMS = frozenset({str, int, float, bool, type(None)})  # frozen as they are
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Each dataclass type's field names, in order (:func:`dataclasses.fields` is slow; a type's fields never change)."""


_FROZEN_TYPES: set[type] = set()
"""The frozen dataclass types among :data:`_FIELD_NAMES`: an instance is frozen once per memo round
(its fields are never reassigned; the snapshots' mappings are never changed once made)."""


_SEEN: dict[int, tuple[object, Hashable]] = {}
"""Tuples frozen lately, by identity (with the tuple itself, so its id stays its own): a machine's
environments and probe health are the same tuple in snapshot after snapshot; at most :data:`_SEEN_MAX`."""
_SEEN_MAX = 256


class FreezeMemo:
    """One owner's tuples and frozen dataclasses frozen lately (:func:`freeze`'s ``memo``), by
    identity: those frozen or reused since the owner's last :meth:`turn` and in the round before it.

    A scheduler freezes every peer's snapshot each pass (their device and environment tuples, two
    or three a peer): with more than about a hundred peers they did not fit :data:`_SEEN`, whose
    oldest entry leaves first, so every pass froze every snapshot from scratch. A memo holds what
    its owner's rounds reuse, whatever their size, and lets go of the rest after one round. A
    peer's snapshot itself is the same object while that peer does not change
    (:class:`gpulayerd.app.cluster.node.PeerSnapshots`): it is frozen once, not once a pass.
    """

    __slots__ = ("_last", "_now")

    def __init__(self) -> None:
        self._now: dict[int, tuple[object, Hashable]] = {}
        self._last: dict[int, tuple[object, Hashable]] = {}

    def get(self, value: object) -> Hashable | None:
        """``value`` frozen, if this memo has it (None otherwise)."""
        key = id(value)
        hit = self._now.get(key)
        if hit is None:
            hit = self._last.get(key)
            if hit is None or hit[0] is not value:
                return None
            self._now[key] = hit
        return hit[1] if hit[0] is value else None

    def put(self, value: object, frozen: Hashable) -> None:
        """Keep ``value`` frozen (until two turns pass without it)."""
        self._now[id(value)] = (value, frozen)

    def turn(self) -> None:
        """A new round: what the last round did not use is let go."""
        self._last, self._now = self._now, {}


def freeze(value: object, memo: FreezeMemo | None = None) -> Hashable:
    """``value`` as a hashable, comparable value: dataclasses field by field (with their type
    name), mappings as sorted item tuples, sequences as tuples, sets as frozensets. A tuple of
    dataclasses (immutable here: the snapshots are frozen) frozen lately is answered from
    ``memo``, or without one from :data:`_SEEN`."""
    if type(value) in _ATOMS:
        return value
    if type(value) is tuple and value and type(value[0]) in _FIELD_NAMES:
        if memo is not None:
            kept = memo.get(value)
            if kept is None:
                kept = tuple(freeze(v, memo) for v in value)
                memo.put(value, kept)
            return kept
        seen = _SEEN.get(id(value))
        if seen is not None and seen[0] is value:
            return seen[1]
        frozen = tuple(freeze(v) for v in value)
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.pop(next(iter(_SEEN)))
        _SEEN[id(value)] = (value, frozen)
        return frozen
    names = _FIELD_NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
        if type(value).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            _FROZEN_TYPES.add(type(value))
    if names is not None:
        if memo is not None and type(value) in _FROZEN_TYPES:  # a peer's snapshot, the same object pass after pass
            kept = memo.get(value)
            if kept is None:
                kept = (type(value).__name__, *[freeze(getattr(value, n), memo) for n in names])
                memo.put(value, kept)
            return kept
        return (type(value).__name__, *[freeze(getattr(value, n), memo) for n in names])
    if isinstance(value, Mapping):
        return tuple(sorted(((freeze(k, memo), freeze(v, memo)) for k, v in value.items()), key=repr))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, memo) for v in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(v, memo) for v in value)
    assert isinstance(value, Hashable)
    return value


def shape_key(job: JobRequest) -> Hashable:
    """Everything the judgement reads from ``job`` (every field but ``job_id``), hashable."""
    return freeze(replace(job, job_id=""))


class ShapeBook:
    """Per-shape verdicts and per-(shape, worker) rows, kept until the worker changes.

    Feed it the current workers with :meth:`observe` (cheap when nothing changed), then ask
    :meth:`row` or :meth:`explanation`; call :meth:`retain` with the shapes still waiting to
    forget the rest. Not thread-safe.
    """

    def __init__(self, support: SupportMatrix) -> None:
        self._support = support
        self._shape_ids: dict[Hashable, int] = {}
        self._next_sid = 1
        self._job_shapes: dict[str, tuple[JobRequest, int]] = {}  # job id -> (request, shape id)
        self._validated: dict[int, tuple[Rejection, ...]] = {}
        self._workers: dict[str, tuple[Hashable, int]] = {}  # node id -> (frozen snapshot, version)
        # (node, devices only) -> (version, shape -> row); rows of jobs that ask for devices are
        # kept at the version of all the worker but its CPU slots (their judgement never reads them)
        self._rows: dict[tuple[str, bool], tuple[int, dict[int, WorkerExplanation]]] = {}
        self._dev_views: dict[str, tuple[Hashable, int]] = {}  # node id -> (frozen without CPU slots, version)
        self._epoch = 0  # bumped whenever a worker's version or the set of workers changes
        self._volatile: dict[tuple[str, bool], tuple[tuple[int, int], bool]] = {}
        self._dev_epoch = 0  # bumped whenever a worker's devices-only version or the set of workers changes
        self._explained: dict[int, tuple[int, Explanation]] = {}
        self._texts: dict[int, tuple[Explanation, str]] = {}  # id of an explanation -> (it, its reason line)
        self._text_pool: dict[str, str] = {}  # reason lines equal by value kept once
        # (node, devices only) -> (version, each distinct row judged at it): rows equal by value kept once
        self._pools: dict[tuple[str, bool], tuple[int, dict[WorkerExplanation, WorkerExplanation]]] = {}
        self._next_version = 1
        self.evaluations = 0
        """How many (shape, worker) rows were judged (for tests and benches)."""
        self.memo = FreezeMemo()
        """The workers' tuples frozen lately (turned by the scheduler's core, once a pass)."""

    # ------------------------------------------------------------------ inputs

    def observe(self, workers: Iterable[WorkerSnapshot]) -> set[str]:
        """Take ``workers`` as the current ones; returns the node ids whose version changed
        (new workers included; workers gone are forgotten)."""
        changed: set[str] = set()
        seen: dict[str, tuple[Hashable, int]] = {}
        views: dict[str, tuple[Hashable, int]] = {}
        dev_changed = False
        for w in workers:
            frozen = freeze(w, self.memo)
            old = self._workers.get(w.node_id)
            if old is not None and old[0] == frozen:
                seen[w.node_id] = old
                views[w.node_id] = self._dev_views[w.node_id]
                continue
            seen[w.node_id] = (frozen, self._next_version)
            self._next_version += 1
            changed.add(w.node_id)
            view = freeze(replace(w, cpu_slots_free=None, cpu_slots_total=None), self.memo)
            old_view = self._dev_views.get(w.node_id)
            if old_view is not None and old_view[0] == view:
                views[w.node_id] = old_view
            else:
                views[w.node_id] = (view, self._next_version)
                self._next_version += 1
                dev_changed = True
        for key in [k for k in self._rows if k[0] not in seen]:
            del self._rows[key]
        for key in [k for k in self._pools if k[0] not in seen]:
            del self._pools[key]
        if changed or set(seen) != set(self._workers):
            self._epoch += 1
        if dev_changed or set(seen) != set(self._workers):
            self._dev_epoch += 1
        self._workers, self._dev_views = seen, views
        return changed

    def version(self, node_id: str, *, devices_only: bool = False) -> int:
        """The version of the worker ``node_id`` last observed (0 if unknown); with ``devices_only``,
        of what a job that asks for devices reads (all of it but the CPU slots)."""
        entry = (self._dev_views if devices_only else self._workers).get(node_id)
        return entry[1] if entry is not None else 0

    def epochs(self) -> tuple[int, int]:
        """``(epoch, devices_epoch)``: the first changes whenever a worker's version or the set of
        workers changes, the second only when what a job that asks for devices reads changes (all
        of a worker but its CPU slots). A shape's :meth:`explanation` is the same object while the
        epoch it depends on (the second for jobs with ``gpu_count > 0``) stays."""
        return self._epoch, self._dev_epoch

    def shape_of(self, job: JobRequest, *, keep: bool = True) -> int:
        """A small id for ``job``'s shape (computed once per job id while it is retained). With
        ``keep`` False, ``job`` is not remembered (nor retained by it): for a caller that keeps one
        request per shape and asks with that one afterwards."""
        cached = self._job_shapes.get(job.job_id)
        if cached is not None and cached[0] is job:
            return cached[1]
        key = shape_key(job)
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = self._next_sid  # never reused: kept rows are keyed by it
            self._next_sid += 1
        if keep:
            self._job_shapes[job.job_id] = (job, sid)
        return sid

    def retain(self, job_ids: Iterable[str]) -> None:
        """Forget every job not in ``job_ids``, and the rows and verdicts of shapes none of them has."""
        keep = set(job_ids)
        self._job_shapes = {j: v for j, v in self._job_shapes.items() if j in keep}
        live = {sid for _, sid in self._job_shapes.values()}
        self._shape_ids = {k: s for k, s in self._shape_ids.items() if s in live}
        self._validated = {s: v for s, v in self._validated.items() if s in live}
        self._explained = {s: v for s, v in self._explained.items() if s in live}
        for key, (ver, rows) in list(self._rows.items()):
            self._rows[key] = (ver, {s: r for s, r in rows.items() if s in live})
        self._pools.clear()  # rows judged from now on are not shared with those kept

    # ------------------------------------------------------------------ answers

    def row(self, job: JobRequest, worker: WorkerSnapshot) -> WorkerExplanation:
        """:func:`evaluate` of ``job`` on ``worker`` (observed last), from the cache when the
        worker's version is the one the row was judged at (for a job that asks for devices, the
        version of all but the worker's CPU slots, which its judgement never reads)."""
        sid = self.shape_of(job)
        dev = job.gpu_count > 0
        ver = self.version(worker.node_id, devices_only=dev)
        entry = self._rows.get((worker.node_id, dev))
        if entry is None or entry[0] != ver or ver == 0:
            entry = self._rows[(worker.node_id, dev)] = (ver, {})
        got = entry[1].get(sid)
        if got is None:
            got = overflow_row(job, worker, evaluate(job, worker, self._support))  # [slurm] overflow-after
            self.evaluations += 1
            pool = self._pools.get((worker.node_id, dev))
            if pool is None or pool[0] != ver:
                pool = self._pools[(worker.node_id, dev)] = (ver, {})
            try:  # rows equal by value are kept once (many shapes get the same answer from a worker)
                shared = pool[1].setdefault(got, got)
            except TypeError:
                shared = got  # a row with a field that does not hash is kept as it is
            got = shared
            entry[1][sid] = got
        return got

    def explanation(self, job: JobRequest, workers: Sequence[WorkerSnapshot], *,
                    same_id: bool = True) -> Explanation:
        """:func:`~gpulayerd.core.matching.evaluate.explain` of ``job`` on ``workers``, which must be exactly
        the workers given to the last :meth:`observe`; kept per shape until a worker's version or
        the set of workers changes. With ``same_id`` False the kept object itself is returned
        (its ``job_id`` may be another job's of the same shape): the same object until an input changes."""
        sid = self.shape_of(job)
        rejected = self._validated.get(sid)
        if rejected is None:
            rejected = self._validated[sid] = tuple(validate(job, self._support))
        if rejected:
            return Explanation(job.job_id, Verdict.FITS_NOWHERE, None, rejected, ())
        kept = self._explained.get(sid)
        epoch = self._dev_epoch if job.gpu_count > 0 else self._epoch
        if kept is not None and kept[0] == epoch:
            e = kept[1]
        else:
            e = assemble(job, [self.row(job, w) for w in sorted(workers, key=lambda w: w.node_id)])
            self._explained[sid] = (epoch, e)
        return e if not same_id or e.job_id == job.job_id else replace(e, job_id=job.job_id)

    def reason(self, e: Explanation) -> str:
        """:func:`~gpulayerd.core.reasons.reason_text` of ``e``, computed once per kept explanation."""
        kept = self._texts.get(id(e))
        if kept is not None and kept[0] is e:
            return kept[1]
        if len(self._texts) > 2 * len(self._explained) + 256:
            self._texts.clear()
            self._text_pool.clear()
        text = reason_text(e)
        text = self._text_pool.setdefault(text, text)
        self._texts[id(e)] = (e, text)  # holds e: the id names it while the entry lives
        return text

    def volatile(self, node_id: str) -> bool:
        """Whether a kept row of ``node_id`` waits on a cause no event reports (:data:`VOLATILE_CODES`)."""
        for dev in (False, True):
            entry = self._rows.get((node_id, dev))
            if entry is None:
                continue
            mark = (entry[0], len(entry[1]))  # rows are only added while a version lasts
            kept = self._volatile.get((node_id, dev))
            if kept is None or kept[0] != mark:
                found = any(_volatile(r) for row in entry[1].values() for r in row.rejections)
                kept = self._volatile[(node_id, dev)] = (mark, found)
            if kept[1]:
                return True
        return False
