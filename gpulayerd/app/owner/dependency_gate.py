"""The dependency gate: queued jobs that name ``after`` wait outside the scheduler until satisfied.

Decisions are :func:`gpulayerd.core.dependencies.judge`'s; this service reads the states of the
jobs named (owned here: the store; elsewhere in the cluster: their owner, through ``lookup``),
keeps the waiting jobs out of the scheduler's queue (:meth:`DependencyGate.holds`), writes their
reason (``Dependency: after ID (running on ws-2)``), lets them in when satisfied, and cancels one
whose dependency can never be satisfied (``DependencyNeverSatisfied: ID failed``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.signals import Signals
from gpulayerd.core.arrays import ArrayError, parse_array, shown_state, split_task_id, task_id
from gpulayerd.core.dependencies import After, Never, Satisfied, Waiting, cycle_through, judge, parse_after
from gpulayerd.core.job_facts import TERMINAL_STATES
from gpulayerd.core.protocol import claims
from gpulayerd.core.reasons import ReasonCode
from gpulayerd.errors import GpulayerError, InvalidSpec, NoSuchJob
from gpulayerd.models import JobSpec, JobView
from gpulayerd.store import JobRow, Store

__all__ = ["REMOTE_EVERY_S", "DependencyGate", "Lookup"]

log = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[JobView]]
"""Any job of the cluster by id or unique prefix (``RemoteJobs.show`` as the daemon; raises
:class:`~gpulayerd.errors.NoSuchJob`, ``AmbiguousJob`` or ``PeerUnreachable``)."""

REMOTE_EVERY_S = 2.0
"""How often (seconds) the states of jobs owned by peers are asked again."""


class DependencyGate:
    """Holds back queued jobs whose dependencies are not satisfied yet; see the module docstring."""

    def __init__(self, *, store: Store, jobs: OwnedJobs, signals: Signals, clock: Clock) -> None:
        self._store = store
        self._jobs = jobs
        self._signals = signals
        self._clock = clock
        self.lookup: Lookup | None = None
        """Set by the composition root (None: only jobs owned here can be named)."""
        self._waiting: dict[str, tuple[After, ...]] = {}
        self._released: set[str] = set()
        self._reasons: dict[str, str] = {}
        self._remote: dict[str, tuple[float, str | None, str]] = {}  # id -> (asked at, state, where)

    async def resolve(self, after: list[str]) -> list[str]:
        """The dependencies of a job being submitted with each id made whole (``ID:cond``).

        Raises:
            InvalidSpec: an id that names no job (or several), naming ``after`` and the id.
        """
        out = []
        for text in after:
            dep = parse_after(text)
            try:
                job_id = (await self._jobs.row(dep.job_id)).id
            except NoSuchJob:
                job_id = await self._elsewhere(dep.job_id)
            except GpulayerError as e:
                raise InvalidSpec(f"after: {e}") from None
            out.append(str(After(job_id, dep.condition)))
        return out

    async def _elsewhere(self, ref: str) -> str:
        """The whole id of ``ref``, not a job stored here: a peer's job (``lookup``), or a task not written
        yet of an array of the cluster (``ID_7`` where the array lists index 7).

        Raises:
            InvalidSpec: naming ``after``, the id and what is allowed.
        """
        problem = f"no job {ref!r}"
        if self.lookup is not None:
            try:
                return (await self.lookup(ref)).id
            except GpulayerError as e:
                problem = str(e)
        task = await self._array_of(ref)
        if task is not None:
            return task[0]
        raise InvalidSpec(f"after: {problem} (allowed: ids of jobs, tasks or arrays of the cluster, ID[:ok|any|notok])")

    async def _array_of(self, ref: str) -> tuple[str, str] | None:
        """For ``ref`` naming a task (``ID_7``): its whole id and its array's state (owned here: the store;
        elsewhere: ``lookup``) when that array lists the index; else None (the task row is not read)."""
        parts = split_task_id(ref)
        if parts is None:
            return None
        try:
            row = await self._jobs.row(parts[0])
            array_id, spec, state = row.id, self._jobs.spec(row), row.status.value
        except NoSuchJob:
            if self.lookup is None:
                return None
            try:
                view = await self.lookup(parts[0])
            except GpulayerError:
                return None
            array_id, spec, state = view.id, view.spec, view.status
        except GpulayerError:
            return None
        if not spec.array or spec.array_task is not None:
            return None
        try:
            listed = parts[1] in parse_array(spec.array, max_size=1 << 62).indices
        except ArrayError:
            return None
        return (task_id(array_id, parts[1]), state) if listed else None

    def check_cycle(self, job_id: str, after: list[str]) -> None:
        """Refuse ``after`` naming ``job_id`` itself, or closing a cycle through the jobs waiting here.

        Raises:
            InvalidSpec: naming ``after`` and the ids of the cycle.
        """
        graph = {k: [a.job_id for a in v] for k, v in self._waiting.items()}
        graph[job_id] = [parse_after(a).job_id for a in after]
        if job_id in graph[job_id]:
            raise InvalidSpec(f"after: job {job_id} cannot wait for itself")
        cycle = cycle_through(job_id, graph)
        if cycle is not None:
            raise InvalidSpec(f"after: a dependency cycle: {' -> '.join([*cycle, job_id])}")

    def holds(self, row: JobRow, spec: JobSpec) -> bool:
        """Whether queued job ``row`` must stay out of the scheduler's queue (waits for a dependency)."""
        if not spec.after or row.id in self._released:
            return False
        if row.id not in self._waiting:
            self._waiting[row.id] = tuple(parse_after(a) for a in spec.after)
            self._signals.wake()
        return True

    def waiting(self) -> set[str]:
        """The queued jobs held back now (ids)."""
        return set(self._waiting)

    def released(self, row: JobRow, spec: JobSpec) -> bool:
        """Whether ``row`` (queued) has no dependency left to wait for."""
        return not self.holds(row, spec)

    async def tick(self) -> None:
        """Judge every waiting job once: let in, write why it waits, or cancel it. Each dependency's state is
        read once per tick, however many waiting jobs name it (a pipeline's jobs often wait for the same ones)."""
        known: dict[str, tuple[str | None, str]] = {}
        for job_id, deps in list(self._waiting.items()):
            row = await self._store.jobs.get_job(job_id)
            if row is None or row.status is not claims.JobStatus.QUEUED:
                self._forget(job_id)
                continue
            states: dict[str, str | None] = {}
            where: dict[str, str] = {}
            for dep in deps:
                if dep.job_id not in known:
                    known[dep.job_id] = await self._state(dep.job_id)
                states[dep.job_id], where[dep.job_id] = known[dep.job_id]
            verdict = judge(deps, states)
            if isinstance(verdict, Satisfied):
                await self._release(row)
            elif isinstance(verdict, Never):
                await self._never(row, verdict)
            elif isinstance(verdict, Waiting):
                await self._wait(row, verdict, states, where)

    async def _state(self, job_id: str) -> tuple[str | None, str]:
        """A job's state and where it runs (``on ws-2``), or why it is unknown; None: unknown now."""
        row = await self._store.jobs.get_job(job_id)
        if row is not None and row.status is claims.JobStatus.QUEUED:  # an array's row: running while a task runs
            return shown_state(row.status.value, (await self._store.arrays.counts([job_id])).get(job_id, {})), ""
        if row is not None:
            return row.status.value, ""
        kept = self._remote.get(job_id)
        now = self._clock.monotonic()
        if kept is not None and (now - kept[0] < REMOTE_EVERY_S or kept[1] in TERMINAL_STATES):
            return kept[1], kept[2]
        state: str | None = None
        place = "unknown here"
        if self.lookup is not None:
            try:
                view = await self.lookup(job_id)
            except GpulayerError as e:
                place = str(e)
            else:
                state = view.status
                place = f"on {view.where_name or view.holder_name}" if view.where_name or view.holder_name else ""
                place = f"at {view.owner_name}" if view.owner_name and not place else place  # "queued at ws-1"
        array = await self._array_of(job_id) if state is None else None
        if array is not None:  # a task not written yet: pending, or never (its array ended first)
            ended = array[1] in TERMINAL_STATES
            state, place = ("cancelled", f"its array {array[1]} before it ran") if ended else ("pending", "")
        elif self.lookup is None:
            return None, place
        self._remote[job_id] = (now, state, place)
        return state, place

    async def _release(self, row: JobRow) -> None:
        self._forget(row.id)
        self._released.add(row.id)
        # An event row: the scheduler reads the job again (now let in) with the queue's changes.
        await self._store.jobs.add_event(row.id, "dependencies satisfied", "every dependency is satisfied",
                                         now_wall=self._clock.wall())
        await self._store.jobs.set_explanation(row.id, f"{ReasonCode.PENDING.value}: dependencies satisfied", None)
        self._signals.job_changed(row.id)
        self._signals.wake()

    async def _never(self, row: JobRow, verdict: Never) -> None:
        self._forget(row.id)
        reason = f"{ReasonCode.DEPENDENCY_NEVER_SATISFIED.value}: {verdict.after.job_id} {verdict.status}"
        if verdict.after.condition.value != "ok":
            reason += f" (after {verdict.after})"
        await self._jobs.apply(row.id, claims.CancelRequested(reason=reason, stimulus_id=f"dependency-{row.id}"),
                               kind="dependency never satisfied")
        log.info("job_id=%s: %s", row.id, reason)

    async def _wait(self, row: JobRow, verdict: Waiting, states: dict[str, str | None],
                    where: dict[str, str]) -> None:
        dep = verdict.after.job_id
        state = states.get(dep)
        words = " ".join(w for w in (state or "state unknown", where.get(dep, "")) if w)
        cond = "" if verdict.after.condition.value == "ok" else f":{verdict.after.condition.value}"
        reason = f"{ReasonCode.DEPENDENCY.value}: after {dep}{cond} ({words})"
        if self._reasons.get(row.id) != reason:
            self._reasons[row.id] = reason
            await self._store.jobs.set_explanation(row.id, reason, None)
            self._signals.job_changed(row.id)

    def _forget(self, job_id: str) -> None:
        self._waiting.pop(job_id, None)
        self._reasons.pop(job_id, None)

