"""The services' clock: the only place they read time from or sleep on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")

__all__ = ["Clock"]


class Clock:
    """Monotonic time for deadlines and leases, wall time for records (both in seconds).

    Tests give the services a subclass whose time they move by hand.
    """

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (``time.monotonic``)."""
        return time.monotonic()

    def wall(self) -> float:
        """Seconds since the Unix epoch (``time.time``), for what is stored and shown."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        await asyncio.sleep(seconds)

    async def wait_for(self, awaitable: Awaitable[_T], timeout_s: float) -> _T:
        """``awaitable``'s result, or :class:`asyncio.TimeoutError` after ``timeout_s`` seconds of this
        clock (``asyncio.wait_for`` here; a simulated clock times out in its own time)."""
        return await asyncio.wait_for(awaitable, timeout_s)
