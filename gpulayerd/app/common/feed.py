"""A change feed inside the daemon: what changed, pushed to every subscriber (the TUI).

Bounded: a subscriber that falls behind by more than ``max_queue`` changes gets a
single ``resync`` change instead of an ever-growing queue, and is expected to re-read
the full state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["Change", "ChangeFeed"]


@dataclass(frozen=True, slots=True)
class Change:
    """One change: ``kind`` is ``job``, ``devices``, ``peers`` or ``resync``; ``key`` the job id."""

    kind: str
    key: str = ""


class ChangeFeed:
    """Fan-out of :class:`Change` values to any number of subscribers."""

    def __init__(self, max_queue: int = 10_000) -> None:
        self._subscribers: set[asyncio.Queue[Change]] = set()
        self._max_queue = max_queue

    def publish(self, change: Change) -> None:
        """Hand ``change`` to every subscriber (never blocks)."""
        for q in list(self._subscribers):
            try:
                q.put_nowait(change)
            except asyncio.QueueFull:
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(Change("resync"))

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Change]]:
        """A queue of changes from now on, for the duration of the ``async with``."""
        q: asyncio.Queue[Change] = asyncio.Queue(maxsize=self._max_queue)
        self._subscribers.add(q)
        try:
            yield q
        finally:
            self._subscribers.discard(q)

    @property
    def subscriber_count(self) -> int:
        """How many subscribers are connected."""
        return len(self._subscribers)
