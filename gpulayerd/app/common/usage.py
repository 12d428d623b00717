"""Fair share as a service: every node's decayed usage per user, learned from heartbeats.

This node reports what IT holds now (attempts starting or running here and gang holds,
from the :class:`Ledger`) in every heartbeat and heartbeat reply; it takes each peer's
report under that peer's authenticated node id, so a node can only ever speak for
itself and a run is counted once, by the machine that holds it. Its own holdings are
accrued at every lease tick. The arithmetic is the pure :mod:`gpulayerd.core.fairshare`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger
from gpulayerd.core import fairshare
from gpulayerd.core.fairshare import Candidate, Holding, Usage
from gpulayerd.models import UserHoldingView, UserUsageView

__all__ = ["UsageService"]


class UsageService:
    """This node's fair-share book (see the module docstring).

    Args:
        node_id: this node (its own holdings are kept under it).
        half_life_s: usage halves every this many seconds (``fairshare_half_life_s``).
        stale_after_s: a peer's report counts this long after it arrived (a few heartbeats).
    """

    def __init__(self, *, node_id: str, ledger: Ledger, clock: Clock, half_life_s: float,
                 stale_after_s: float = 30.0) -> None:
        self.node_id = node_id
        self._ledger = ledger
        self._clock = clock
        self._book = fairshare.UsageBook(half_life_s=half_life_s, stale_after_s=stale_after_s, own_node=node_id)
        self._names: dict[str, str] = {}

    # ------------------------------------------------------------------ feeding

    def own_holdings(self) -> dict[str, tuple[int, int]]:
        """What this node holds now: user -> (GPUs, CPU slots), at most ``MAX_REPORTED_USERS`` users."""
        held = self._ledger.holdings()
        if len(held) > fairshare.MAX_REPORTED_USERS:
            top = sorted(held, key=lambda u: (-held[u][0], -held[u][1], u))[:fairshare.MAX_REPORTED_USERS]
            held = {u: held[u] for u in top}
        return held

    def tick(self) -> None:
        """Accrue up to now and take this node's own holdings (called every lease tick)."""
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

    def name_of(self, node_id: str) -> str | None:
        """The host name a peer gave in its last heartbeat, if any."""
        return self._names.get(node_id)

    def order(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """``candidates`` in fair-share order (see :func:`gpulayerd.core.fairshare.order`)."""
        return fairshare.order(candidates, self.usage())

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
