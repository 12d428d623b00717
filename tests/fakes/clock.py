"""A :class:`~gpulayerd.app.common.clock.Clock` whose time moves only when a test moves it.

``monotonic()`` and ``wall()`` start at fixed values and advance together with
:meth:`FakeClock.advance`. ``sleep(s)`` never sleeps for real: it waits until the test
has advanced the clock by ``s`` seconds (``sleep(0)`` or less only yields to the loop).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from gpulayerd.app.common.clock import Clock

__all__ = ["FakeClock"]


class FakeClock(Clock):
    """Monotonic and wall time (seconds) that move only through :meth:`advance`.

    Args:
        monotonic: the starting monotonic time.
        wall: the starting wall time (seconds since the epoch).
    """

    def __init__(self, monotonic: float = 1000.0, wall: float = 1_800_000_000.0) -> None:
        self._mono = monotonic
        self._wall = wall
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._mono

    def wall(self) -> float:
        """The fake wall time."""
        return self._wall

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock has been advanced by ``seconds`` (no real waiting)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self._mono + seconds, next(self._seq), fut))
        await fut

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds`` and wake the sleepers whose time has come.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError("a monotonic clock never goes back")
        self._mono += seconds
        self._wall += seconds
        while self._timers and self._timers[0][0] <= self._mono:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)

    def sleepers(self) -> list[asyncio.Future[None]]:
        """The futures of the sleeps not due yet (waits on them are idle, not busy)."""
        return [fut for _, _, fut in self._timers if not fut.done()]
