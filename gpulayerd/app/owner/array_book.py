"""Job arrays owned here: checked at submit, tasks materialized lazily, the array ended, summaries.

An array is a job row (``ID``) the scheduler never takes; its tasks are job rows of their own
(``ID_7``), written by :meth:`ArrayBook.tick` only while fewer than ``%MAX`` (else
:data:`~gpulayerd.core.arrays.WINDOW`) of them are queued or running
(:func:`gpulayerd.core.arrays.to_materialize`, in the store's transaction). Only the owner
materializes, so ``%MAX`` holds lab-wide. When every task has ended the array's row ends too:
``succeeded`` when every task did, else ``failed``. ``cancel ID`` cancels the array's row and every
task not yet ended (:meth:`ArrayBook.cancel_rest`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.owner.dependency_gate import DependencyGate
from gpulayerd.core.arrays import (
    ArrayError,
    ArraySpec,
    parse_array,
    shown_state,
    split_task_id,
    task_command,
    task_id,
    to_materialize,
)
from gpulayerd.core.job_facts import JOB_STATES, TERMINAL_STATES, job_user
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobRecord, JobStatus
from gpulayerd.core.reasons import ReasonCode
from gpulayerd.errors import Forbidden, InvalidSpec
from gpulayerd.models import ArraySummary, ArrayTask, JobSpec, JobView
from gpulayerd.store import ArrayRow, JobRow, Store

__all__ = ["ArrayBook"]

log = logging.getLogger(__name__)

REFRESH_S = 1.0
"""A tick writes (or at least counts, in its transaction) each open array at least this often (s); between,
only when the ends of its tasks seen since let tasks in (:meth:`ArrayBook.tick`)."""

_ORDER = ("running", "claimed", *(s for s in JOB_STATES if s not in ("running", "claimed")))
"""The order an array's tasks are counted in its reason: running first."""


class ArrayBook:
    """The arrays owned here; see the module docstring."""

    def __init__(self, *, store: Store, jobs: OwnedJobs, gate: DependencyGate, signals: Signals, clock: Clock,
                 max_array_size: int) -> None:
        """``max_array_size``: most tasks one array may have (the daemon's setting)."""
        self._store = store
        self._jobs = jobs
        self.gate = gate
        self._signals = signals
        self._clock = clock
        self._max_size = max_array_size
        self._open: set[str] | None = None  # arrays whose row is queued (None: not read yet)
        # Open array id (let in by its dependencies) -> its row as read, its spec and its parsed expression: a tick
        # reads nothing else (the materializing transaction checks the row is still queued).
        self._kept: dict[str, tuple[JobRow, JobSpec, ArraySpec]] = {}
        # Open array id -> (its active tasks as its last transaction counted them, its cursor then, how many ends
        # of its tasks had been seen just before, when: monotonic s); and the ends seen so far: a tick skips the
        # transaction while the count less the ends seen since lets nothing in.
        self._counted: dict[str, tuple[int, int, int, float]] = {}
        self._ends: dict[str, int] = {}
        told = jobs.on_persisted  # (what the daemon set first, the notifier, is still told first)

        def persisted(record: JobRecord) -> None:
            if told is not None:
                told(record)
            self._ended(record)

        jobs.on_persisted = persisted

    def check(self, spec: JobSpec) -> ArraySpec | None:
        """The array a submitted spec asks for (None: an ordinary job).

        Raises:
            InvalidSpec: naming ``array`` and what is allowed (including ``max_array_size``).
        """
        if spec.array is None:
            return None
        try:
            return parse_array(spec.array, self._max_size)
        except ArrayError as e:
            raise InvalidSpec(f"array: {e}") from None

    async def prepare(self, spec: JobSpec, job_id: str) -> tuple[JobSpec, Callable[[Any], None] | None]:
        """A submitted spec checked (``array``) and its dependencies resolved to whole ids (``after``);
        and, for an array, the write of its ``arrays`` row (with its job row, one transaction).

        Raises:
            InvalidSpec: naming ``array`` or ``after`` (see :meth:`check`, :meth:`DependencyGate.resolve`).
        """
        if spec.array_task is not None:  # the owner's to set, never a submitter's
            spec = spec.model_copy(update={"array_task": None})
        parsed = self.check(spec)
        if spec.after:
            after = await self.gate.resolve(spec.after)
            self.gate.check_cycle(job_id, after)
            spec = spec.model_copy(update={"after": after})
        if parsed is None or spec.array is None:
            return spec, None
        return spec, self._store.arrays.writer(job_id, spec.array, parsed.count)

    def stored(self, array_id: str) -> None:
        """An array was just stored (its tasks come at the next :meth:`tick`)."""
        if self._open is not None:
            self._open.add(array_id)

    def held(self) -> int:
        """How many queued job rows are not the scheduler's: open arrays' own rows and jobs waiting for a
        dependency (so the scheduler's count of its queue agrees with the store's)."""
        return len(self.gate.waiting() | (self._open or set()))

    @staticmethod
    def is_array(spec: JobSpec) -> bool:
        """Whether ``spec`` is an array's own job (never scheduled: its tasks are)."""
        return spec.array is not None and spec.array_task is None

    async def tick(self) -> None:
        """Materialize the next tasks of every open array whose dependencies are met; end the arrays
        whose every task has ended."""
        if self._open is None:
            self._open = set(await self._store.arrays.open_ids())
        for array_id in sorted(self._open):
            kept = self._kept.get(array_id)
            if kept is None:
                row = await self._store.jobs.get_job(array_id)
                if row is None or row.status is not JobStatus.QUEUED:
                    self._open.discard(array_id)
                    self._forget_counts(array_id)
                    continue
                spec = self._jobs.spec(row)
                kept = self._kept[array_id] = (row, spec, parse_array(spec.array or "", max_size=1 << 62))
            row, spec, parsed = kept
            if not self.gate.released(row, spec):
                self._kept.pop(array_id, None)  # read afresh while it waits: the gate forgets it once it ended
                continue
            if self._nothing_due(array_id, parsed):
                continue
            await self._materialize(row, spec, parsed)

    def _nothing_due(self, array_id: str, parsed: ArraySpec) -> bool:
        """Whether the array's transaction would let no task in and end nothing, as its last count less the
        ends seen since says (a count at most :data:`REFRESH_S` old: a missed end delays tasks that long)."""
        counted = self._counted.get(array_id)
        if counted is None or self._clock.monotonic() - counted[3] >= REFRESH_S:
            return False
        active, materialized = counted[0] - (self._ends.get(array_id, 0) - counted[2]), counted[1]
        return to_materialize(parsed, materialized, active) == 0 and not (materialized >= parsed.count and active <= 0)

    def _forget_counts(self, array_id: str) -> None:
        self._counted.pop(array_id, None)
        self._ends.pop(array_id, None)

    def _ended(self, record: JobRecord) -> None:
        """A job's change was stored: an ended task of an array counted here is one active task less (an end
        stored before the count but told after it is taken off twice: only an extra transaction comes of it)."""
        if record.status in claims.TERMINAL and (parts := split_task_id(record.job_id)) is not None \
                and parts[0] in self._ends:
            self._ends[parts[0]] = self._ends.get(parts[0], 0) + 1

    async def _materialize(self, row: JobRow, spec: JobSpec, parsed: ArraySpec) -> None:
        now = self._clock.wall()
        specs: dict[str, JobSpec] = {}

        def decide(array: ArrayRow, active: int) -> list[JobRow]:  # on the store's thread, in the transaction
            out = []
            for pos in range(array.materialized, array.materialized + to_materialize(parsed, array.materialized,
                                                                                     active)):
                task, task_spec = _task(row, spec, parsed.index_at(pos), parsed.count, now)
                specs[task.id] = task_spec
                out.append(task)
            return out

        ends = self._ends.setdefault(row.id, 0)  # (its ends are counted from now on)
        done = await self._store.arrays.materialize(row.id, decide)
        if done is not None and done.open:
            self._counted[row.id] = (done.active, done.materialized, ends, self._clock.monotonic())
        else:
            self._counted.pop(row.id, None)
            self._ends.pop(row.id, None)
        if done is None or not done.open:  # gone, ended or being cancelled: read afresh at the next tick
            self._kept.pop(row.id, None)
            if done is None and self._open is not None:
                self._open.discard(row.id)
            elif done is not None and done.materialized >= parsed.count:
                await self._maybe_end(row)
            return
        for task in done.tasks:
            self._jobs.remember(task.id, specs[task.id])
            self._signals.job_changed(task.id)
        if done.tasks:
            self._signals.job_changed(row.id)
            self._signals.wake()
        elif done.materialized >= parsed.count and done.active == 0:
            await self._maybe_end(row)

    async def cancel_pending(self, task_ref: str, may_manage: Callable[[str], bool] | None, who: str) -> JobRow | None:
        """Cancel task ``task_ref`` (``ID_7``) of an array owned here before it was materialized: its row
        is written ``cancelled`` ahead of the cursor (which passes it later). None when ``task_ref`` is
        no such pending task (an ordinary id, an index not in the array, a task materialized already).

        Args:
            may_manage: whether the requester may manage a job of that user (None: the daemon itself).

        Raises:
            Forbidden: ``job ID_7 belongs to alice``.
        """
        parts = split_task_id(task_ref)
        row = await self._store.jobs.get_job(parts[0]) if parts is not None else None
        if parts is None or row is None or not self.is_array(spec := self._jobs.spec(row)):
            return None
        parsed = parse_array(spec.array or "", max_size=1 << 62)
        if parts[1] not in parsed.indices:
            return None
        user = job_user(spec.user, row.submitted_by)
        if may_manage is not None and not may_manage(user):
            raise Forbidden(f"job {task_ref} belongs to {user or 'nobody'}")
        now = self._clock.wall()
        task, task_spec = _task(row, spec, parts[1], parsed.count, now)
        task = replace(task, status=JobStatus.CANCELLED, reason=f"cancelled{who or ' by user'} before it ran")
        written = await self._store.arrays.write_ahead(row.id, task)
        if written is not None:
            self._jobs.remember(written.id, task_spec)
            self._signals.job_changed(written.id)
            self._signals.job_changed(row.id)
        return written

    async def _maybe_end(self, row: JobRow) -> None:
        """End the array's row when every task has ended: succeeded if every task did, else failed."""
        counts = (await self._store.arrays.counts([row.id])).get(row.id, {})
        if any(s not in TERMINAL_STATES for s in counts):
            return
        bad = {s: n for s, n in counts.items() if s != "succeeded"}
        total = sum(counts.values())
        if bad:
            words = ", ".join(f"{n} {s}" for s, n in sorted(bad.items()))
            status, reason = JobStatus.FAILED, f"{sum(bad.values())} of {total} tasks did not succeed ({words})"
        else:
            status, reason = JobStatus.SUCCEEDED, f"all {total} tasks succeeded" if total > 1 else "its task succeeded"
        rec = row.record()
        done = await self._store.jobs.apply(claims.PersistJob(
            replace(rec, status=status), JobStatus.QUEUED, rec.attempt, reason, f"array-end-{row.id}"),
            self._clock.wall(), kind="array ended")
        if done:
            self._forget_counts(row.id)
        if done and self._open is not None:
            self._open.discard(row.id)
            self._kept.pop(row.id, None)
        if done and self._jobs.on_persisted is not None:
            self._jobs.on_persisted(replace(rec, status=status))
        self._signals.job_changed(row.id)
        self._signals.wake()

    async def cancel_rest(self, array_id: str, who: str) -> None:
        """Cancel every task of array ``array_id`` not yet ended (its row is cancelled: none comes after)."""
        for task in await self._store.arrays.unfinished(array_id):
            await self._jobs.apply(task.id, claims.CancelRequested(reason=f"cancelled{who or ' by user'} (the array)",
                                                                   stimulus_id=f"cancel-{array_id}"),
                                   kind=f"cancel requested{who}")

    async def summarize(self, views: list[JobView]) -> list[JobView]:
        """``views`` with each array's :class:`ArraySummary`, state and reason (``running`` while a task
        runs; ``Array: 3 running, 12 pending of 20``)."""
        arrays = await self._store.arrays.many([v.id for v in views if v.array_id is None])
        if not arrays:
            return views
        counts = await self._store.arrays.counts(list(arrays))
        for view in views:
            array = arrays.get(view.id)
            if array is None:
                continue
            c = dict(counts.get(view.id, {}))
            if array.total > sum(c.values()) and view.status == "queued":  # (a task cancelled ahead has a row)
                c["pending"] = array.total - sum(c.values())
            elif array.total > sum(c.values()) and view.status == "cancelled":  # never written: none ever runs
                c["cancelled"] = c.get("cancelled", 0) + array.total - sum(c.values())
            parsed_max = view.spec.array.partition("%")[2] if view.spec.array else ""
            view.array = ArraySummary(expr=array.expr, total=array.total,
                                      max_running=int(parsed_max) if parsed_max.isdigit() else None, counts=c)
            if view.status == "cancelled":
                words = ", ".join(f"{c[s]} {s}" for s in _ORDER if c.get(s))
                view.reason = f"{view.reason} ({words} of {array.total})"
            if view.status == "queued":
                view.status = shown_state(view.status, c)
                if not view.reason.startswith("Dependency"):
                    words = ", ".join(f"{c[s]} {s}" for s in (*_ORDER, "pending") if c.get(s))
                    view.reason = f"{ReasonCode.ARRAY.value}: {words or 'no task yet'} of {array.total}"
        return views


def _task(array: JobRow, spec: JobSpec, index: int, count: int, now: float) -> tuple[JobRow, JobSpec]:
    """Task ``index`` of ``array`` (of ``count`` tasks; the array's ``spec``) as a queued job row written
    at ``now`` (wall s), and its spec."""
    task_spec = spec.model_copy(update={
        "array": None, "after": [], "command": task_command(spec.command, index),
        "array_task": ArrayTask(array_id=array.id, index=index, count=count)})
    row = JobRow(id=task_id(array.id, index), name=array.name, submitted_by=array.submitted_by,
                 spec_json=task_spec.model_dump_json(), status=JobStatus.QUEUED, retries_left=array.retries_left,
                 retry_json=array.retry_json,  # (its retry_on, exit codes, backoff, elsewhere: the array's)
                 lease_s=array.lease_s, reason="waiting for the scheduler", submitted_at=now, updated_at=now)
    return row, task_spec
