"""``squeue`` as the gateway daemon reads it: one read per poll interval, shared by every attempt that waits on it.

:class:`SlurmQueue` keeps the gpulayer jobs Slurm holds (found by their ``--comment gpulayer:<job>:<attempt>``
and their user: any cluster user may give a job of theirs another attempt's comment),
each pending one's place in its partition's queue, and when ``squeue`` last answered (a Slurm worker keeps
the leases of its attempts only while it answered within the lease; slurmctld unreachable: its words).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from gpulayerd.slurm.batch import comment_of
from gpulayerd.slurm.outputs import SlurmJob, pending_reason, queue_positions
from gpulayerd.slurm.slurmcmd import SlurmCommands, SlurmError

__all__ = ["SlurmQueue"]


class SlurmQueue:
    """The gpulayer jobs in Slurm's queue, read at most once per ``interval_s``.

    Attributes:
        pending: Slurm's reasons (sorted, distinct) for the gpulayer jobs it holds pending, as the last read
            saw them (``on_pending`` is called when they change, and when ``error`` comes or goes: the
            worker's capabilities say them, and what it refused while Slurm did not answer is offered again).
        answered_at: when ``squeue`` last answered (``clock``'s time; at the start: the start, so that the
            leases of attempts re-adopted then are renewed until a first read says otherwise).
        error: Slurm's words when the last read failed ("" when it answered).
    """

    def __init__(self, commands: SlurmCommands, interval_s: float,
                 clock: Callable[[], float] = time.monotonic, on_pending: Callable[[], None] | None = None) -> None:
        self._commands = commands
        self._interval_s = interval_s
        self._clock = clock
        self._read_at = -math.inf
        self._lock = asyncio.Lock()
        self._jobs: dict[tuple[str, int | None], SlurmJob] = {}
        self._positions: dict[str, int] = {}
        self.answered_at = clock()
        self.error = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_pending = on_pending
        self.pending: list[str] = []

    async def refresh(self) -> None:
        """Read ``squeue`` (in a thread) unless it was read within the interval."""
        async with self._lock:
            if self._clock() - self._read_at < self._interval_s:
                return
            self._read_at = self._clock()
            try:
                jobs = await asyncio.to_thread(self._commands.queue)
            except SlurmError as e:
                was, self.error = self.error, str(e)
                if not was and self._on_pending is not None:
                    self._on_pending()
                return
            was, self.error, self.answered_at = self.error, "", self._clock()
            self._jobs = {(j.comment, j.uid): j for j in jobs if j.comment.startswith("gpulayer:")}
            self._positions = queue_positions(jobs)
            pending = sorted({j.reason or "None" for j in self._jobs.values() if j.state == "PENDING"})
            if pending != self.pending or was:
                self.pending = pending
                if self._on_pending is not None:
                    self._on_pending()

    def poke(self) -> None:
        """Start a :meth:`refresh` in the background if a read is due (from code that must not wait)."""
        if self._clock() - self._read_at >= self._interval_s and not self._tasks:
            task = asyncio.get_running_loop().create_task(self.refresh())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def find(self, job_id: str, attempt: int, uid: int) -> SlurmJob | None:
        """The Slurm job of gpulayer's attempt run as ``uid`` (its comment and its user), as the last read saw
        it; None if Slurm did not list it (another user's job with that comment is not it)."""
        return self._jobs.get((comment_of(job_id, attempt), uid))

    def reason(self, job: SlurmJob) -> str:
        """``SlurmPending: Priority (partition gpu, position 2)`` for a pending job."""
        return pending_reason(job, self._positions.get(job.job_id))

    def answered_within(self, seconds: float) -> bool:
        """Whether ``squeue`` answered within the last ``seconds``."""
        return self._clock() - self.answered_at <= seconds
