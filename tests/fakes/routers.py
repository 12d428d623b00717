"""A peer router over handlers of a test's own, with no role checks: for tests of the TLS server and client."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from gpulayerd import routes
from gpulayerd.api.peer import PeerRouter
from gpulayerd.net.transport import PeerHandler, Sender

__all__ = ["AllowAll", "router_of"]


class AllowAll:
    """A :class:`~gpulayerd.net.transport.RoleCheck` that lets every sender through (a test of transport only)."""

    async def check(self, route: routes.Route, sender: Sender, body: BaseModel | None) -> str | None:
        del route, sender, body
        return None


def router_of(handlers: Mapping[str, PeerHandler]) -> PeerRouter:
    """A :class:`PeerRouter` answering with ``handlers`` (by the route table's handler names), no role checks."""
    return PeerRouter(handlers, AllowAll())
