"""A :class:`~gpulayerd.net.transport.PeerTransport` that answers calls to this node itself locally.

A gang's owner is often one of its members, and a worker may report to itself: those
messages go through this daemon's own peer dispatcher (the same role checks and handlers
the peer API serves), while calls to other nodes go over the cluster's mutual-TLS client.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from gpulayerd.errors import PeerCallError
from gpulayerd.net.transport import PeerDispatch, PeerRoute, PeerTransport, Sender

__all__ = ["SelfFirstTransport"]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


class SelfFirstTransport:
    """Calls to ``me`` go to the local dispatcher; the rest to ``remote`` (None outside a cluster).

    Args:
        me: this node as its own certificate names it (node id, mode, bound user).
        remote: the cluster's transport, or None outside a cluster.
        local: the peer router that answers this node (the daemon's; served once the services exist).
    """

    def __init__(self, me: Sender, remote: PeerTransport | None, local: PeerDispatch) -> None:
        self.me = me
        self.node_id = me.node_id
        self._remote = remote
        self._local = local

    async def call(self, node_id: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Send ``body`` on ``route`` to ``node_id`` (see :class:`~gpulayerd.net.transport.PeerTransport`).

        Raises:
            PeerRefused: this node lacks the route's role (here or there).
            PeerCallError: no such route here, not in a cluster, the remote call failed, or this
                node's handler failed (its error chained: nothing is left half-told).
        """
        if node_id == self.node_id:
            try:
                return await self._local.dispatch(route, self.me, body)
            except PeerCallError:
                raise  # (PeerRefused: this node lacks the route's role)
            except Exception as e:  # a handler's failure (a full disk, say) is a failed call, as a peer's 5xx is
                raise PeerCallError(f"{route.path} on this node: {type(e).__name__}: {e}") from e
        if self._remote is None:
            raise PeerCallError("not in a cluster")
        return await self._remote.call(node_id, route, body)
