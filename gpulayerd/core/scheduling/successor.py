"""A freed slot's next task, decided without a pass (pure).

When a run of an array's task, owned here and run here, ends, its slot goes at once to the job a pass
would claim first for it, when that job is sure to be the same array's next task: the first queued job
in fair-share order is a task of that array, of the only user whose jobs wait here (another user's
fair-share line names who waits: a pass writes it); a one-host job that waits for no retry's backoff,
avoids no worker and was not offered to a peer; it asks for no device (a device job's place is a
pass's: best fit across hosts, and the waiting jobs' lines name a device's holder); and it fits this
machine now, which is no Slurm worker (a peer that fits goes first there). HTCondor's schedd reuses a
claim the same way for the next job of a cluster; here the owner still grants it with the usual claim,
in the store's compare-and-set. The waiting jobs' lines stay true: this machine is as before the end.

The caller (:class:`gpulayerd.app.owner.scheduler.Scheduler`) asks only when nothing else asked for a
pass since the last one read the queue: every job that enters the queue (a submit, a retry, an array's
new tasks, a dependency satisfied) asks for one, and a peer's offer kept here is walked by a pass. Any
other answer (None) leaves the slot to a pass, which comes at once; and so does the pass the timer owes
(:class:`TimerPass`), however often tasks end.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from gpulayerd.core.arrays import split_task_id
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.scheduling.steps import Claim, QueuedJob
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot

__all__ = ["PEER_PASSES_AT_ONCE", "PEER_PASS_GAP_S", "PEER_PASS_REFILL_S", "TimerPass", "successor_claim"]


def successor_claim(ended: str, first: QueuedJob | None, request: Callable[[str], JobRequest],
                    worker: WorkerSnapshot, gang: Collection[str], offered: Collection[str],
                    users: Collection[str], support: SupportMatrix, peer_offers: bool = False) -> Claim | None:
    """The claim of ``first`` on ``worker`` for the slot that ``ended`` left, or None (see the module).

    Args:
        ended: the job whose run here ended (a task id ``ID_7``, else None is answered).
        first: the first queued job in fair-share order, as the scheduler's core keeps the queue.
        request: a queued job's requirements (its shape's: another job id, the same requirements).
        worker: this machine now (its free slots and devices, the ended run's given back); a Slurm worker's
            jobs are left to a pass (``[slurm] prefer = last``: a workstation peer that fits goes first).
        gang: queued multi-host jobs; offered: jobs offered to a peer (both left to a pass).
        users: the users with jobs queued here: ``first``'s alone, or a pass decides (its claim changes who
            waits, which every other user's fair-share line names).
        support: the support matrix jobs are judged with.
        peer_offers: whether a peer's offer is kept by this worker (a pass orders it against ``first``).
    """
    task = split_task_id(ended)
    if task is None or first is None or peer_offers:
        return None
    mine = split_task_id(first.id)
    if mine is None or mine[0] != task[0]:
        return None  # another job goes first (or an array's task after another array's)
    if first.retry_at is not None or first.avoid is not None or first.id in gang or first.id in offered:
        return None
    req = replace(request(first.id), job_id=first.id)
    if set(users) != {req.user}:
        return None
    if (req.distributed is not None and req.distributed.nnodes > 1) or req.gpu_count or worker.kind == "slurm":
        return None  # (a device job: best fit across hosts, and reasons that name a device's holder, are a pass's)
    placement = evaluate(req, worker, support, table=False).placement
    if placement is None or placement.worker != worker.node_id:
        return None
    return Claim(first, placement)


PEER_PASS_GAP_S = 0.05
"""Seconds from the end of a scheduler's turn to a paced pass only peers asked for (:meth:`TimerPass.hold`)."""
PEER_PASSES_AT_ONCE = 4
"""Passes only peers' messages asked for that run at once, unpaced, when none ran lately (:meth:`TimerPass.hold`)."""
PEER_PASS_REFILL_S = 0.25
"""Seconds after which one more such pass may run at once (up to :data:`PEER_PASSES_AT_ONCE`): 4 a second."""


class TimerPass:
    """The pass the scheduler's timer owes (pure: time as an argument): at least every ``interval_s``
    (monotonic s) since the last pass, unless the core calls a timer pass idle then. A successor claim is
    no pass: however often tasks end, a pass the core is busy for (an offer to repeat, a Slurm overflow, a
    missing workdir) still comes once ``interval_s`` has passed.

    Args:
        interval_s: the scheduler's ``schedule_interval_s``.
        now: the monotonic time it starts at (a pass comes first anyway).
    """

    def __init__(self, interval_s: float, now: float, peer_gap_s: float | None = None,
                 peer_at_once: int | None = None) -> None:
        self._interval_s = interval_s
        self._peer_gap_s = PEER_PASS_GAP_S if peer_gap_s is None else peer_gap_s  # (None: the module's, read now)
        self._peer_at_once = PEER_PASSES_AT_ONCE if peer_at_once is None else peer_at_once
        self._credit, self._credit_at = float(self._peer_at_once), now  # unpaced peers' passes left, and when counted
        self._at = now  # the last pass, or the last look at an idle core
        self._turned = now  # the end of the scheduler's last turn (a pass, successor claims or a look)

    def looked(self, now: float) -> None:
        """A pass ran at ``now``, or the timer found the core idle."""
        self._at = now

    def turned(self, now: float) -> None:
        """The scheduler's turn (a pass, successor claims, or a look at an idle core) ended at ``now``."""
        self._turned = now

    def hold(self, now: float, peers_only: bool) -> float:
        """Seconds from ``now`` that a pass asked for by peers' messages alone (``peers_only``: an offer kept,
        a peer's capabilities fetched, a peer up) still waits. A lone one waits for nothing: up to
        ``peer_at_once`` such passes run at once, one more every :data:`PEER_PASS_REFILL_S` (a token bucket).
        Past that, in a stream of them, each waits until ``peer_gap_s`` after the last turn ended, and one pass
        then takes every offer and change that came meanwhile (a lab's owners' offers in a burst come one
        message at a time). This node's own wake-ups (a submit, a slot freed) never wait."""
        if not peers_only:
            return 0.0
        self._credit = min(float(self._peer_at_once), self._credit + (now - self._credit_at) / PEER_PASS_REFILL_S)
        self._credit_at = now
        if self._credit >= 1.0:
            self._credit -= 1.0
            return 0.0
        return max(self._peer_gap_s - (now - self._turned), 0.0)

    def left(self, now: float) -> float:
        """Seconds from ``now`` until the timer's pass is owed (the scheduler's wait; at least 10 ms)."""
        return max(self._interval_s - (now - self._at), 0.01)

    def due(self, now: float, idle: Callable[[], bool]) -> bool:
        """Whether a pass is owed at ``now`` instead of successor claims; ``idle``: the core's
        :meth:`~gpulayerd.core.scheduling.passes.SchedulerCore.idle` now (asked only once the interval passed)."""
        if now - self._at < self._interval_s:
            return False
        if idle():
            self._at = now
            return False
        return True
