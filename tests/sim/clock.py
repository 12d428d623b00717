"""Simulated time: one event queue for the whole department, and each daemon's own (skewed, pausable) view of it.

:class:`SimTime` is the simulator's true time (seconds): a heap of timers. Nothing waits
for real time; :meth:`SimTime.advance_to` moves time to a timer's due time and fires it.
:class:`NodeClock` is the :class:`~gpulayerd.app.common.clock.Clock` one daemon is built
with: its monotonic and wall clocks run at ``rate`` times true time (NTP keeps real clocks
within about 500 ppm: ``rate`` in 0.9995..1.0005) from its own offsets; its sleeps end
after ``seconds / rate`` of true time; while the node is paused (SIGSTOP) none of its
sleeps end (they end at the resume, as a stopped process's timers do).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpulayerd.app.common.clock import Clock

__all__ = ["NodeClock", "SimTime", "Timer"]

_T = TypeVar("_T")


class Timer:
    """A timer of :class:`SimTime`: :meth:`cancel` makes it fire nothing (and cost no step)."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """Never fire (a call's timeout once it was answered, a sleep that was cancelled)."""
        self.cancelled = True


class SimTime:
    """The true simulated time (seconds from 0) and its timers.

    Args:
        start: the true time at the start (seconds).
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self.fired = 0  # timers fired so far (a measure of simulated work)

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` (in the event loop, synchronously) once true time reaches ``when`` seconds, unless cancelled."""
        timer = Timer(fn)
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), timer))
        return timer

    def next_due(self) -> float | None:
        """The due time of the earliest timer not cancelled (seconds), or None when there is none."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def advance_to(self, when: float) -> int:
        """Move true time to ``when`` (never back) and fire every timer due by then; how many fired."""
        n = 0
        self.now = now = max(self.now, when)
        heap = self._heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)[2]
            if not timer.cancelled:
                timer.fn()
                n += 1
        self.fired += n
        return n

    def fire_next(self) -> float | None:
        """Move true time to the earliest timer and fire the timers due then; the new time, or None."""
        due = self.next_due()
        if due is None:
            return None
        self.advance_to(due)
        return due

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of true time (a cancelled sleep leaves no timer behind)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_at(self.now + max(0.0, seconds), lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            timer.cancel()


class NodeClock(Clock):
    """One daemon's clock: ``rate`` times true time from its own offsets; frozen while paused.

    Args:
        time: the true time.
        rate: this machine's clock rate (1.0: exact; NTP bounds: within 5e-4 of 1).
        mono0: its monotonic clock at true time 0 (seconds).
        wall0: its wall clock at true time 0 (seconds since the epoch).
    """

    def __init__(self, time: SimTime, rate: float = 1.0, mono0: float = 1000.0, wall0: float = 1_800_000_000.0) -> None:
        self.time = time
        self.rate = rate
        self._mono0 = mono0
        self._wall0 = wall0
        self.paused = False
        self._resumed: asyncio.Event | None = None

    def monotonic(self) -> float:
        """This machine's monotonic time (seconds)."""
        return self._mono0 + self.time.now * self.rate

    def wall(self) -> float:
        """This machine's wall time (seconds since the epoch)."""
        return self._wall0 + self.time.now * self.rate

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock (``seconds / rate`` of true time), and until the node runs."""
        if seconds > 0:
            await self.time.sleep(seconds / self.rate)
        else:
            await asyncio.sleep(0)
        await self.running()

    async def wait_for(self, awaitable: Awaitable[_T], timeout_s: float) -> _T:
        """``awaitable``'s result, or :class:`asyncio.TimeoutError` after ``timeout_s`` of this clock."""
        task = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self.time.sleep(timeout_s / self.rate))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise asyncio.TimeoutError(f"not within {timeout_s:g} s")

    # ------------------------------------------------------------------ SIGSTOP / SIGCONT

    def pause(self) -> None:
        """The daemon stops (SIGSTOP): its sleeps and handlers wait until :meth:`resume`."""
        if not self.paused:
            self.paused = True
            self._resumed = asyncio.Event()

    def resume(self) -> None:
        """The daemon runs again (SIGCONT)."""
        if self.paused:
            self.paused = False
            assert self._resumed is not None
            self._resumed.set()
            self._resumed = None

    async def running(self) -> None:
        """Return at once when the daemon runs; else when it is resumed."""
        while self._resumed is not None:
            await self._resumed.wait()
