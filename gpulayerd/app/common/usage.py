"""Fair share as a service: every node's decayed usage per user, learned from heartbeats.

This node reports what IT holds now (attempts starting or running here and gang holds,
from the :class:`Ledger`) in every heartbeat and heartbeat reply; it takes each peer's
report under that peer's authenticated node id, so a node can only ever speak for
itself and a run is counted once, by the machine that holds it. Its own holdings are
accrued at every lease tick. The book is saved to the store every :data:`SAVE_INTERVAL_S` and at
shutdown, and restored at start decayed by the wall time between (a restart keeps everyone's
usage). The arithmetic is the pure :mod:`gpulayerd.core.fairshare`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger
from gpulayerd.core import fairshare
from gpulayerd.core.fairshare import Holding, Usage
from gpulayerd.models import UserHoldingView, UserUsageView
from gpulayerd.store import StoreError, UsageTable

__all__ = ["SAVE_INTERVAL_S", "UsageService"]

log = logging.getLogger(__name__)

SAVE_INTERVAL_S = 30.0
"""How often the book is saved (s); a restart loses at most this much usage (and a shutdown none)."""


class UsageService:
    """This node's fair-share book (see the module docstring).

    Args:
        node_id: this node (its own holdings are kept under it).
        half_life_s: usage halves every this many seconds (``fairshare_half_life_s``).
        stale_after_s: a peer's report counts this long after it arrived (a few heartbeats).
    """

    def __init__(self, *, node_id: str, ledger: Ledger, clock: Clock, half_life_s: float,
                 stale_after_s: float = 30.0, table: UsageTable | None = None,
                 save_interval_s: float = SAVE_INTERVAL_S) -> None:
        self.node_id = node_id
        self._ledger = ledger
        self._clock = clock
        self._book = fairshare.UsageBook(half_life_s=half_life_s, stale_after_s=stale_after_s, own_node=node_id)
        self._names: dict[str, str] = {}
        self._table = table
        self._save_interval_s = save_interval_s
        self._saved_at: float | None = None  # monotonic time of the last save (None: not since start)
        ledger.on_holdings_changed(self.tick)  # a run shorter than a tick counts too

    # ------------------------------------------------------------------ keeping

    async def load(self) -> None:
        """Add the usage saved by a previous life (decayed by the wall time since it was saved) to
        the book. Nothing saved, or no table: nothing changes.

        Raises:
            StoreError: the store cannot be read.
        """
        if self._table is None:
            return
        saved, at = await self._table.saved_usage()
        if at is None:
            return
        now = self._clock.monotonic()
        usage = {u: Usage(g, c) for u, (g, c) in saved.items()}
        self._book = fairshare.restored(self._book, usage, self._clock.wall() - at, now)
        self._saved_at = now
        log.info("fair share: usage of %d users restored (saved %.0f s ago)", len(usage),
                 max(0.0, self._clock.wall() - at))

    async def save(self) -> None:
        """Save every user's usage now (replacing what was saved).

        Raises:
            StoreError: the store cannot be written (a full disk: the next save tries again).
        """
        if self._table is None:
            return
        self._saved_at = self._clock.monotonic()
        usage = self.usage()
        await self._table.save_usage({u: (x.gpu_s, x.cpu_slot_s) for u, x in usage.items()}, self._clock.wall())

    async def save_if_due(self) -> None:
        """:meth:`save` when ``save_interval_s`` passed since the last one; a store error is logged
        (usage since the last save is then at stake, no job is)."""
        if self._table is None:
            return
        now = self._clock.monotonic()
        if self._saved_at is not None and now - self._saved_at < self._save_interval_s:
            return
        try:
            await self.save()
        except StoreError as e:
            log.warning("fair share: usage not saved: %s", e)

    # ------------------------------------------------------------------ feeding

    def own_holdings(self) -> dict[str, tuple[int, int]]:
        """What this node holds now: user -> (GPUs, CPU slots), at most ``MAX_REPORTED_USERS`` users."""
        held = self._ledger.holdings()
        if len(held) > fairshare.MAX_REPORTED_USERS:
            top = sorted(held, key=lambda u: (-held[u][0], -held[u][1], u))[:fairshare.MAX_REPORTED_USERS]
            held = {u: held[u] for u in top}
        return held

    def tick(self) -> None:
        """Accrue up to now and take this node's own holdings (called every lease tick and at every
        change of the ledger's holdings)."""
        self._take(self.node_id, self.own_holdings())

    def report(self, node_id: str, holdings: Mapping[str, tuple[int, int]] | None, name: str = "") -> None:
        """A peer's report of what it holds now (from its heartbeat or heartbeat reply).

        Args:
            node_id: the authenticated sender; never this node (we report ourselves).
            holdings: user -> (GPUs, CPU slots); None when the peer sent none (an older
                version): nothing is taken.
        """
        if node_id == self.node_id or holdings is None:
            return
        if name:
            self._names[node_id] = name
        self._take(node_id, holdings)

    def _take(self, node_id: str, holdings: Mapping[str, tuple[int, int]]) -> None:
        report = {u: Holding(max(0, int(g)), max(0, int(c))) for u, (g, c) in holdings.items()}
        self._book = fairshare.accrue(self._book, {node_id: report}, self._clock.monotonic())

    # ------------------------------------------------------------------ reading

    def usage(self) -> dict[str, Usage]:
        """Every user's decayed usage now."""
        return fairshare.usage_at(self._book, self._clock.monotonic())

    def held_now(self) -> dict[str, dict[str, tuple[int, int]]]:
        """user -> (node id -> (GPUs, CPU slots)): this node's holdings now, each peer's as last reported."""
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for node, report in self._book.held.items():
            if node != self.node_id:
                for user, h in report.items():
                    out.setdefault(user, {})[node] = (h.gpus, h.cpu_slots)
        for user, (g, c) in self.own_holdings().items():
            if g or c:
                out.setdefault(user, {})[self.node_id] = (g, c)
        return out

    def gpus_held_on(self, node_id: str) -> dict[str, int]:
        """user -> GPUs that user's runs hold on peer ``node_id``, as its last report (still current) said."""
        report = self._book.held.get(node_id)
        if not report or node_id == self.node_id:
            return {}
        seen = self._book.seen_at.get(node_id)
        if seen is None or self._clock.monotonic() >= seen + self._book.stale_after_s:
            return {}
        return {u: h.gpus for u, h in report.items() if h.gpus > 0}

    def name_of(self, node_id: str) -> str | None:
        """The host name a peer gave in its last heartbeat, if any."""
        return self._names.get(node_id)

    def order_offers(self, users: Sequence[str], submitted_at: Sequence[float | None],
                     below: float | None = None) -> list[int]:
        """The indices of a worker's kept offers (their ``users`` and owners' ``submitted_at``, Unix s;
        None: unknown) in fair-share order: lowest user score first, then submission time (an offer
        without one after those with, in the given order). With ``below``, only offers whose user's
        score is under it."""
        usage = self.usage()
        scores = [fairshare.score(usage, u) for u in users]
        keep = [i for i in range(len(users)) if below is None or scores[i] < below]
        return sorted(keep, key=lambda i: (scores[i], submitted_at[i] is None, submitted_at[i] or 0.0, i))

    def best_score(self, users: Iterable[str]) -> float | None:
        """The lowest fair-share score among ``users`` (None for no users)."""
        usage = self.usage()
        return min((fairshare.score(usage, u) for u in users), default=None)

    def views(self, jobs: Iterable[tuple[str, str]], name_of: Callable[[str], str | None]) -> list[UserUsageView]:
        """One row per user known (with usage, holdings, or jobs), in priority order.

        Args:
            jobs: (user, status) of the jobs to count (``queued`` and ``running`` are counted).
            name_of: a node id's host name, if known.
        """
        usage = self.usage()
        held = self.held_now()
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        for user, status in jobs:
            if status == "queued":
                queued[user] = queued.get(user, 0) + 1
            elif status == "running":
                running[user] = running.get(user, 0) + 1
        users = set(usage) | set(held) | set(queued) | set(running)
        scores = {u: fairshare.score(usage, u) for u in users}
        distinct = sorted(set(scores.values()))
        out = []
        for user in sorted(users, key=lambda u: (scores[u], u)):
            u = usage.get(user, Usage())
            holding = [UserHoldingView(node_id=n, host=name_of(n) or self.name_of(n) or n[:12], gpus=g, cpu_slots=c)
                       for n, (g, c) in sorted(held.get(user, {}).items())]
            out.append(UserUsageView(user=user, gpu_hours=u.gpu_hours, cpu_slot_hours=u.cpu_slot_hours,
                                     score=u.score, rank=distinct.index(scores[user]) + 1,
                                     jobs_queued=queued.get(user, 0), jobs_running=running.get(user, 0),
                                     holding=holding))
        return out
