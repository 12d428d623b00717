"""How nodes are named to people: host names, with the node id's start when in a cluster."""

from __future__ import annotations

from gpulayerd.app.common.ports import Directory

__all__ = ["Names"]


class Names:
    """Turns node ids into host names (reasons and views name workers by node id; people read names)."""

    def __init__(self, node_id: str, hostname: str, directory: Directory | None) -> None:
        self.node_id = node_id
        self.hostname = hostname
        self._directory = directory

    def name_of(self, node_id: str | None) -> str | None:
        """The host name of ``node_id`` (the id's first 12 characters if unknown); None for None."""
        if node_id is None:
            return None
        if node_id == self.node_id:
            return self.hostname
        name = self._directory.name_of(node_id) if self._directory is not None else None
        return name or node_id[:12]

    def worker_names(self) -> list[str]:
        """The names of every worker this node knows: its own and its trusted peers' (``--worker NAME``)."""
        peers = self._directory.worker_snapshots() if self._directory is not None else []
        return [self.hostname, *(w.name for w in peers)]

    def label(self, node_id: str) -> str:
        """A host name, with the node id's start when in a cluster (host names may repeat)."""
        name = self.name_of(node_id) or node_id[:12]
        return name if self._directory is None else f"{name} ({node_id[:8]})"

    def readable(self, text: str) -> str:
        """``text`` with every known node id replaced by its :meth:`label`."""
        if self.node_id in text:
            text = text.replace(self.node_id, self.label(self.node_id))
        if self._directory is not None:
            for key in self._directory.trusted_ids():
                if key in text:
                    text = text.replace(key, self.label(key))
        return text
