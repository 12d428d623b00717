"""The invariants the simulator checks, from the truth only it knows (every machine's runs).

- **one worker per attempt**: at every start, no other machine runs the same (job, attempt);
- **one attempt per device**: at every start, none of its GPUs is used by another run
  still running on that machine;
- **no idle device beside a waiting job** (checked at every step while no fault is active
  and ``settle_s`` after the last one healed): no job that wants k GPUs waits more than
  ``idle_bound_s`` while a machine its owner can reach has had k GPUs free all that time
  (a machine whose daemon is down or paused has none free: its time free starts again
  when it is back);
- **every acknowledged job ends** (:meth:`Checker.final`, after the faults healed and a quiet
  period): each job is succeeded, or ended with a recorded reason (failed, lost, cancelled).

A violation raises :class:`Violation`, whose message names the seed and the last events.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .world import Sim

__all__ = ["Checker", "Violation"]

ENDED = {"succeeded", "failed", "lost", "cancelled"}


class Violation(AssertionError):
    """An invariant broke: the message has the seed and a minimal trace."""


class Checker:
    """The invariants of one :class:`~tests.sim.world.Sim` (see the module docstring).

    Args:
        sim: the simulation.
        idle_bound_s: how long a job may wait beside k free GPUs (seconds of true time).
        settle_s: how long after faults heal before the idle check applies again (seconds).
    """

    def __init__(self, sim: Sim, idle_bound_s: float = 30.0, settle_s: float = 30.0) -> None:
        self.sim = sim
        self.idle_bound_s = idle_bound_s
        self.settle_s = settle_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.faulty_until = 0.0  # true time before which the idle check is off
        self.faults_active = 0
        self.checked = 0
        self.violation: Violation | None = None  # the first one (a start is checked in a loop callback)
        self._free_since: dict[tuple[str, int], float] = {}  # (node, k) -> since when >= k GPUs free
        self.every_s = 0.5  # the idle check's period (seconds of true time)
        self._next = 0.0

    def bind(self) -> None:
        """Take the running loop (starts are reported from threads)."""
        self.loop = asyncio.get_running_loop()

    def fault_started(self) -> None:
        """A fault begins: the idle check pauses."""
        self.faults_active += 1

    def fault_healed(self) -> None:
        """A fault ends: the idle check resumes ``settle_s`` later (once none is active)."""
        self.faults_active -= 1
        self.faulty_until = max(self.faulty_until, self.sim.time.now + self.settle_s)

    def fail(self, what: str) -> None:
        """Raise a :class:`Violation` naming the seed and the last events."""
        trace = "\n  ".join(self.sim.trace[-25:])
        v = Violation(f"INVARIANT VIOLATED (seed {self.sim.seed}, t={self.sim.time.now:.3f} s): {what}\n"
                      f"reproduce: seed={self.sim.seed}\nlast events:\n  {trace}")
        if self.violation is None:
            self.violation = v
        raise v

    # ------------------------------------------------------------------ at every start

    def started(self, node: str, job_id: str, attempt: int, devices: str) -> None:
        """A run of ``attempt`` of ``job_id`` started on ``node`` with GPUs ``devices``."""
        self.checked += 1
        for d in self.sim.daemons.values():
            if d.name == node:
                continue
            if any(j == job_id and a == attempt for j, a, _ in d.runner.live()):
                self.fail(f"job {job_id} attempt {attempt} runs on {d.name} and on {node}")
        mine = {g for g in devices.split(",") if g}
        for j, a, gs in self.sim.daemons[node].runner.live():
            if (j, a) == (job_id, attempt):
                continue
            both = mine & {g for g in gs.split(",") if g}
            if both:
                self.fail(f"GPU {sorted(both)} of {node} granted to {job_id}/{attempt} while {j}/{a} runs on it")

    # ------------------------------------------------------------------ at every step

    def step(self) -> None:
        """The idle check (see the module docstring); at most every ``every_s`` of true time."""
        now = self.sim.time.now
        if now < self._next:
            return
        self._next = now + self.every_s
        if self.faults_active or now < self.faulty_until:
            self._free_since.clear()
            return
        free: dict[str, int] = {}
        for d in self.sim.daemons.values():
            if d.services is None or d.clock.paused:
                continue
            used = sum(len([g for g in gs.split(",") if g]) for _, _, gs in d.runner.live())
            free[d.name] = d.gpus - used
        for key in [k for k in self._free_since if k[0] not in free]:
            del self._free_since[key]  # down or paused now: no longer free, and when it is back it starts over
        for name, f in free.items():
            for k in (1, 2):
                if f >= k:
                    self._free_since.setdefault((name, k), now)
                else:
                    self._free_since.pop((name, k), None)
        long_free = {k: [n for (n, kk), t in self._free_since.items() if kk == k and now - t > self.idle_bound_s]
                     for k in (1, 2)}
        if not long_free[1]:
            return
        for job in self.sim.jobs.values():
            if job.started is not None or now - job.submitted <= self.idle_bound_s:
                continue
            if job.owner not in free or not long_free.get(job.gpus):
                continue
            since = max(job.submitted, self.faulty_until)
            if now - since > self.idle_bound_s:
                nodes = long_free[job.gpus]
                self.fail(f"job {job.id} ({job.gpus} GPU, owner {job.owner}) waits {now - job.submitted:.1f} s "
                          f"while {nodes[:3]} had {job.gpus} GPU(s) free for over {self.idle_bound_s:g} s")

    # ------------------------------------------------------------------ at the end

    async def final(self) -> dict[str, int]:
        """Every acknowledged job ended (or runs): the count of each status; raises on one still waiting."""
        counts: dict[str, int] = {}
        for job in self.sim.jobs.values():
            d = self.sim.daemons[job.owner]
            if d.services is None:
                self.fail(f"owner {job.owner} of {job.id} is down at the end")
            assert d.services is not None
            view = await d.services.owner.get_job(job.id)
            counts[view.status] = counts.get(view.status, 0) + 1
            if view.status not in ENDED:
                self.fail(f"job {job.id} (owner {job.owner}) is {view.status} at the end: {view.reason}")
            if view.status != "succeeded" and not (view.reason or view.attempts):
                self.fail(f"job {job.id} ended {view.status} with no recorded reason")
        return counts
