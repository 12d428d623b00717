"""The ``peers`` table: trusted peers' last known addresses, hints after a restart.

(Same name as :mod:`gpulayerd.net.peers`: the same idea (the peers we know), on disk here and in
memory there.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpulayerd.store.db import Database

__all__ = ["PeersTable"]


class PeersTable:
    """The peers this daemon remembers."""

    def __init__(self, db: Database) -> None:
        """Work through ``db``, shared with the other table objects."""
        self._db = db

    async def save_peer(self, node_id: str, name: str, addresses: Sequence[str], port: int, now_wall: float) -> None:
        """Remember a trusted peer's addresses (used as hints after a restart)."""
        await self._db.write_one(
            "INSERT INTO peers (node_id, name, addresses_json, port, last_seen_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(node_id) DO UPDATE SET name = excluded.name, addresses_json = excluded.addresses_json, "
            "port = excluded.port, last_seen_at = excluded.last_seen_at",
            (node_id, name, json.dumps(list(addresses)), port, now_wall))

    async def saved_peers(self) -> list[tuple[str, str, list[str], int]]:
        """(node id, name, addresses, port) of every remembered peer, by node id."""
        rows = await self._db.fetch_all("SELECT node_id, name, addresses_json, port FROM peers ORDER BY node_id", ())
        return [(r[0], r[1], list(json.loads(r[2])), int(r[3])) for r in rows]
