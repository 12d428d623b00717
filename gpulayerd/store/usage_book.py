"""The ``usage`` table: every user's decayed fair-share usage, kept across restarts.

One row per user: GPU-seconds and CPU-slot-seconds as decayed to ``at`` (the wall clock's
Unix time, s, when they were saved). The whole book is replaced at each save.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping

from gpulayerd.store.db import Database

__all__ = ["UsageTable"]


class UsageTable:
    """The saved fair-share usage of every user (:class:`gpulayerd.app.common.usage.UsageService`)."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    async def save_usage(self, usage: Mapping[str, tuple[float, float]], at_wall: float) -> None:
        """Replace the saved book by ``usage`` (user -> (GPU-seconds, CPU-slot-seconds), decayed to
        ``at_wall``, Unix s), in one transaction."""
        rows = [(u, float(g), float(c), at_wall) for u, (g, c) in sorted(usage.items())]

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM usage")
            conn.executemany("INSERT INTO usage (user, gpu_s, cpu_slot_s, at) VALUES (?, ?, ?, ?)", rows)

        await self._db.run(write)

    async def saved_usage(self) -> tuple[dict[str, tuple[float, float]], float | None]:
        """The saved book: (user -> (GPU-seconds, CPU-slot-seconds), the Unix time it was decayed to;
        None when nothing was saved). A row no save writes (a value that is not a finite number, as a
        damaged or edited file may hold) is left out."""
        rows = await self._db.fetch_all("SELECT user, gpu_s, cpu_slot_s, at FROM usage ORDER BY user", ())
        kept = [r for r in rows if all(_finite(v) for v in r[1:4])]
        if not kept:
            return {}, None
        return {str(r[0]): (float(r[1]), float(r[2])) for r in kept}, max(float(r[3]) for r in kept)


def _finite(value: object) -> bool:
    """Whether a stored value is a finite number (SQLite keeps any type in any column)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
