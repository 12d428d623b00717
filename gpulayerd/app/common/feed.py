"""A change feed inside the daemon: what changed, pushed to every subscriber (the TUI).

Coalesced per subscriber: a change already waiting to be taken is not queued again (a job
whose reason is rewritten twice before the subscriber reads is one change), and the subscriber
takes everything waiting at once (:meth:`Subscription.take`), so a burst of changes (a
scheduler pass that rewrites every waiting job's reason) goes out as one write. Bounded: a
subscriber with more than ``max_pending`` distinct changes waiting gets a single ``resync``
instead, and is expected to re-read the full state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

__all__ = ["Change", "ChangeFeed", "Subscription"]


@dataclass(frozen=True, slots=True)
class Change:
    """One change: ``kind`` is ``job``, ``devices``, ``peers`` or ``resync``; ``key`` the job id."""

    kind: str
    key: str = ""


_RESYNC = Change("resync")


class Subscription:
    """One subscriber's changes not taken yet: each distinct change once, in the order first seen."""

    def __init__(self, max_pending: int) -> None:
        self._pending: dict[Change, None] = {}
        self._ready = asyncio.Event()
        self._max_pending = max_pending
        self.coalesced = 0
        """How many changes were dropped because the same change was already waiting."""

    def put(self, change: Change) -> None:
        """Add ``change`` unless it (or a ``resync``, which covers everything) is already waiting."""
        if change in self._pending or _RESYNC in self._pending:
            self.coalesced += 1
            return
        if len(self._pending) >= self._max_pending:
            self._pending = {_RESYNC: None}
        else:
            self._pending[change] = None
        self._ready.set()

    async def take(self) -> list[Change]:
        """Every change waiting (at least one: waits for it), oldest first; they are no longer waiting."""
        await self._ready.wait()
        self._ready.clear()
        taken, self._pending = list(self._pending), {}
        return taken

    @property
    def pending(self) -> int:
        """How many changes wait to be taken."""
        return len(self._pending)


class ChangeFeed:
    """Fan-out of :class:`Change` values to any number of subscribers."""

    def __init__(self, max_pending: int = 10_000) -> None:
        """A feed; ``max_pending``: distinct changes a subscriber may leave waiting before it gets ``resync``."""
        self._subscribers: set[Subscription] = set()
        self._max_pending = max_pending

    def publish(self, change: Change) -> None:
        """Hand ``change`` to every subscriber (never blocks)."""
        for s in list(self._subscribers):
            s.put(change)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[Subscription]:
        """The changes from now on, for the duration of the ``async with``."""
        s = Subscription(self._max_pending)
        self._subscribers.add(s)
        try:
            yield s
        finally:
            self._subscribers.discard(s)

    @property
    def subscriber_count(self) -> int:
        """How many subscribers are connected."""
        return len(self._subscribers)
