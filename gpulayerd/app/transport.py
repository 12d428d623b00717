"""A :class:`~gpulayerd.app.ports.PeerTransport` that answers calls to this node itself locally.

A gang's owner is often one of its members, and a worker may report to itself: those
messages go straight to this daemon's own route handlers, the same handlers the peer
API serves, while calls to other nodes go over the cluster's mutual-TLS client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from gpulayerd.api.peer import PeerCallError
from gpulayerd.app.ports import PeerTransport

__all__ = ["Handler", "SelfFirstTransport"]

M = TypeVar("M", bound=BaseModel)

Handler = Callable[[str, Any], Awaitable[BaseModel]]
"""A route handler: (sender node id, message) -> reply."""


class SelfFirstTransport:
    """Calls to ``node_id`` go to local handlers; the rest to ``remote`` (None outside a cluster)."""

    def __init__(self, node_id: str, remote: PeerTransport | None) -> None:
        self.node_id = node_id
        self._remote = remote
        self._routes: dict[str, Handler] = {}

    def route(self, path: str, handler: Handler) -> None:
        """Answer local calls to ``path`` with ``handler``."""
        self._routes[path] = handler

    async def call(self, node_id: str, path: str, body: BaseModel | None, reply: type[M]) -> M:
        """Call ``path`` on ``node_id`` (see :class:`~gpulayerd.app.ports.PeerTransport`).

        Raises:
            PeerCallError: no such route here, not in a cluster, or the remote call failed.
        """
        if node_id == self.node_id:
            handler = self._routes.get(path)
            if handler is None:
                raise PeerCallError(f"{path} is not served to this node itself")
            result = await handler(self.node_id, body)
            if not isinstance(result, reply):
                raise PeerCallError(f"{path} answered {type(result).__name__}, not {reply.__name__}")
            return result
        if self._remote is None:
            raise PeerCallError("not in a cluster")
        return await self._remote.call(node_id, path, body, reply)
