"""What the services tell each other without reaching into each other: changes, wake-ups, background work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Coroutine

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.feed import Change, ChangeFeed
from gpulayerd.core.arrays import split_task_id

__all__ = ["Signals", "log_failure"]

log = logging.getLogger(__name__)


def log_failure(task: asyncio.Task[None]) -> None:
    """Done callback: log a background task that failed (nobody else awaits its exception)."""
    if not task.cancelled() and (e := task.exception()) is not None:
        log.warning("background task %s failed: %s: %s", task.get_name(), type(e).__name__, e, exc_info=e)


class Signals:
    """The change feed (for the TUI), the scheduler's wake-up, protocol counters and background tasks.

    Args:
        clock: what :meth:`wait_wake` times out on (default: the system's).

    Attributes:
        feed: every change, pushed to ``/v1/events`` subscribers.
        stats: protocol counters shown by ``/v1/health`` (offers, claims, ...).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or Clock()
        self.feed = ChangeFeed()
        self.stats: Counter[str] = Counter()
        self._wake = asyncio.Event()
        self._local = asyncio.Event()  # a wake-up asked for by this node's own events (not a peer's alone)
        self._freed: dict[str, None] = {}  # jobs owned here whose runs here ended since the scheduler's last look
        self._asked = True  # wake() called since then (a pass is asked for; the first pass too)
        self.devices_epoch = 0  # counts devices_changed(): a pass compares it to see what changed meanwhile
        self._tasks: set[asyncio.Task[None]] = set()

    def job_changed(self, job_id: str) -> None:
        """A job's row changed (a task's, ``ID_7``: its array's view too, whose counts follow its tasks)."""
        self.feed.publish(Change("job", job_id))
        if (task := split_task_id(job_id)) is not None:
            self.feed.publish(Change("job", task[0]))

    def devices_changed(self) -> None:
        """Grants, holds or capabilities of this machine changed."""
        self.devices_epoch += 1
        self.feed.publish(Change("devices"))

    def peers_changed(self) -> None:
        """Membership changed."""
        self.feed.publish(Change("peers"))

    def wake(self) -> None:
        """Ask the scheduler for a pass soon: whatever can let a queued job in or change who goes first (a
        submit, a retry, an array's new tasks, a dependency satisfied, a slot or device freed, a peer's offer
        that fits here now) asks for one (a peer's other messages through :meth:`peer_wake`)."""
        self._asked = True
        self._local.set()
        self._wake.set()

    def peer_wake(self) -> None:
        """:meth:`wake`, asked for by a peer's message alone (an offer kept that cannot fit here now, capabilities
        fetched, a peer up): a pass comes too, but the scheduler paces such passes
        (:class:`~gpulayerd.core.scheduling.successor.TimerPass`, ``hold``): a burst of offers from a lab of owners
        to a full worker is one pass, not one per offer."""
        self._asked = True
        self._wake.set()

    def slot_freed(self, job_id: str) -> None:
        """A run of ``job_id``, owned here, ended here (its end written): the scheduler may give its slot to
        the next task of the same array without a pass (:mod:`gpulayerd.core.scheduling.successor`)."""
        self._freed[job_id] = None
        self._local.set()
        self._wake.set()

    def ended_here(self) -> None:
        """A job owned here ended its attempt, which ran here (:meth:`slot_freed` tells of its slot): the
        scheduler ticks its arrays and dependencies; no pass is asked for."""
        self._local.set()
        self._wake.set()

    def take_freed(self) -> tuple[list[str], bool]:
        """The jobs :meth:`slot_freed` named since the last call, and whether :meth:`wake` was called since."""
        freed, asked = list(self._freed), self._asked
        self._freed.clear()
        self._asked = False
        return freed, asked

    async def wait_wake(self, timeout_s: float) -> None:
        """Wait for a wake-up asked for since the last :meth:`clear_wake` (or ``timeout_s``)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await self._clock.wait_for(self._wake.wait(), timeout_s)

    async def wait_local(self, timeout_s: float) -> None:
        """Wait for a wake-up of this node's own (not :meth:`peer_wake`) since the last :meth:`clear_wake`
        (or ``timeout_s``)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await self._clock.wait_for(self._local.wait(), timeout_s)

    def woken(self) -> bool:
        """Whether a wake-up was asked for since the last :meth:`clear_wake`."""
        return self._wake.is_set()

    def peers_only(self) -> bool:
        """Whether the wake-ups since the last :meth:`clear_wake` were all :meth:`peer_wake` (at least one)."""
        return self._wake.is_set() and not self._local.is_set()

    def clear_wake(self) -> None:
        """Forget wake-ups asked for before now (a pass is about to start)."""
        self._wake.clear()
        self._local.clear()

    def spawn(self, coro: Coroutine[object, object, None], name: str | None = None) -> asyncio.Task[None]:
        """Run ``coro`` in the background; it is cancelled by :meth:`close`."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(log_failure)
        return task

    async def close(self) -> None:
        """Cancel every background task and wait for them."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
