"""The peer routes bound to their messages, and the narrow interfaces the services reach peers through.

:mod:`gpulayerd.routes` declares each peer route (path, role, handler name) without importing
pydantic; here each one is bound to its request and reply models as a typed
:class:`PeerRoute` (``CLAIM: PeerRoute[Claim, ClaimReply]``). Services call peers with
``transport.call(node_id, CLAIM, msg)`` and get a ``ClaimReply``: no URL string or JSON in a
service. The bindings are checked against the table at import (a model whose name is not the
declared one is an error), and :data:`BY_NAME` holds one per declared route.

Protocols (implemented above this layer, passed in by the composition root):

- :class:`PeerTransport`: calls a peer by node id (the mutual-TLS client, the self-first
  transport, the tests' loopback and simulated network).
- :class:`PeerDispatch`: answers one peer message here: THE role check, then the handler
  (:class:`gpulayerd.api.peer.PeerRouter`).
- :class:`RoleCheck`: decides whether a sender holds a route's role (:mod:`gpulayerd.app.roles`).
- :class:`PeerConnector` and :class:`PeerNetwork`: the mutual-TLS client and listeners the
  cluster service uses (:mod:`gpulayerd.api.peer`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from gpulayerd import routes
from gpulayerd.models import Capabilities, JobList, LogChunk, ReportView
from gpulayerd.models.snapshots import OutputChunk, ShipChunk, ShipFetch, TreeFiles
from gpulayerd.net.identity import PeerIdentity
from gpulayerd.net.limits import ConnectionLimits
from gpulayerd.net.wire import (
    Ack,
    Claim,
    ClaimReply,
    Commit,
    Heartbeat,
    HeartbeatReply,
    Hold,
    HoldReply,
    JobMatches,
    JobReply,
    JobRequest,
    JobsRequest,
    Kill,
    LogRequest,
    Offer,
    Release,
    RunReport,
    RunReportReply,
    UsageReportRequest,
)

__all__ = [
    "BY_NAME",
    "CAPABILITIES",
    "CLAIM",
    "COMMIT",
    "HEARTBEAT",
    "HOLD",
    "JOBS",
    "JOB_ACTION_ROUTES",
    "JOB_FIND",
    "KILL",
    "LOGS",
    "OFFER",
    "RELEASE",
    "REPORT",
    "SHIP_FETCH",
    "SHIP_FILES",
    "SHIP_OUTPUT",
    "USAGE_REPORT",
    "NoBody",
    "PeerConnector",
    "PeerDispatch",
    "PeerHandler",
    "PeerNetwork",
    "PeerRoute",
    "PeerTransport",
    "RoleCheck",
    "Sender",
]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


class NoBody(BaseModel):
    """The request type of a route that takes no body (a GET): it is never sent."""


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent a peer message, as its TLS client certificate proves it (never from the body).

    Attributes:
        node_id: SHA-256 of the certificate's public key.
        mode: ``system`` or ``personal`` (a certificate from before modes: personal, no user).
        user: the user a personal-mode certificate is bound to ("" otherwise).
        address: the connection's remote IP ("" when not known, e.g. this node itself).
    """

    node_id: str
    mode: str = ""
    user: str = ""
    address: str = ""

    @classmethod
    def of(cls, identity: PeerIdentity, address: str = "") -> Sender:
        """The sender a certificate's identity names."""
        return cls(identity.node_id, identity.mode, identity.user, address)


@dataclass(frozen=True, slots=True)
class PeerRoute(Generic[Req, Rep]):
    """A peer route of :data:`gpulayerd.routes.PEER_ROUTES` bound to its models.

    Attributes:
        route: the declaration (path, method, role, handler name).
        request: the body's model (:class:`NoBody` for a GET).
        reply: the reply's model.
    """

    route: routes.Route
    request: type[Req]
    reply: type[Rep]

    @property
    def name(self) -> str:
        """The route's name in the table."""
        return self.route.name

    @property
    def path(self) -> str:
        """The route's URL path."""
        return self.route.path


def _bind(name: str, request: type[Req], reply: type[Rep]) -> PeerRoute[Req, Rep]:
    """Route ``name`` of the table bound to its models.

    Raises:
        RuntimeError: the models are not the ones the table names (the table and the code disagree).
    """
    route = routes.PEER[name]
    req_name = "" if request is NoBody else request.__name__
    if (req_name, reply.__name__) != (route.request, route.reply):
        raise RuntimeError(f"peer route {name}: bound to ({req_name!r}, {reply.__name__!r}), the table says "
                           f"({route.request!r}, {route.reply!r})")
    return PeerRoute(route, request, reply)


HEARTBEAT = _bind("heartbeat", Heartbeat, HeartbeatReply)
CAPABILITIES = _bind("capabilities", NoBody, Capabilities)
JOBS = _bind("jobs", JobsRequest, JobList)
OFFER = _bind("offer", Offer, Ack)
CLAIM = _bind("claim", Claim, ClaimReply)
REPORT = _bind("report", RunReport, RunReportReply)
KILL = _bind("kill", Kill, Ack)
LOGS = _bind("logs", LogRequest, LogChunk)
HOLD = _bind("hold", Hold, HoldReply)
RELEASE = _bind("release", Release, Ack)
COMMIT = _bind("commit", Commit, Ack)
JOB_FIND = _bind("job_find", JobRequest, JobMatches)
JOB_ACTION_ROUTES: dict[str, PeerRoute[JobRequest, JobReply]] = {
    action: _bind(f"job_{action}", JobRequest, JobReply) for action in ("show", "explain", "logs", "cancel")}
"""``/v1/peer/job/<action>`` by action."""
SHIP_FETCH = _bind("ship_fetch", ShipFetch, ShipChunk)
SHIP_OUTPUT = _bind("ship_output", OutputChunk, Ack)
USAGE_REPORT = _bind("usage_report", UsageReportRequest, ReportView)
SHIP_FILES = _bind("ship_files", TreeFiles, ShipChunk)

_ALL: list[PeerRoute[Any, Any]] = [HEARTBEAT, CAPABILITIES, JOBS, OFFER, CLAIM, REPORT, KILL, LOGS, HOLD, RELEASE,
                                   COMMIT, JOB_FIND, *JOB_ACTION_ROUTES.values(), SHIP_FETCH, SHIP_OUTPUT,
                                   USAGE_REPORT, SHIP_FILES]
BY_NAME: dict[str, PeerRoute[Any, Any]] = {r.name: r for r in _ALL}
"""Every peer route, bound, by name."""
if set(BY_NAME) != set(routes.PEER):  # pragma: no cover - the table and the bindings must agree at import
    raise RuntimeError(f"peer routes without a binding: {sorted(set(routes.PEER) - set(BY_NAME))}")

PeerHandler = Callable[[Sender, Any], Any]
"""A peer route's handler: ``async (sender, message) -> reply`` (the message is None for a GET)."""


class PeerTransport(Protocol):
    """Calls another daemon's peer API by node id."""

    async def call(self, node_id: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Send ``body`` on ``route`` to ``node_id`` and return its reply.

        Raises:
            PeerRefused: the peer answered 403 (this node lacks the route's role there).
            PeerCallError: unknown peer, unreachable, timed out, or another error reply.
        """
        ...


class PeerDispatch(Protocol):
    """Answers one peer message on this node: the route's role is checked first, then its handler runs."""

    async def dispatch(self, route: PeerRoute[Req, Rep], sender: Sender, body: Req | None) -> Rep:
        """The reply to ``body`` from ``sender`` on ``route``.

        Raises:
            PeerRefused: the sender does not hold the route's role (nothing changed).
            PeerBadRequest: the message is malformed (ids, attempt, offset out of range).
            LookupError: no handler is bound for the route on this node.
        """
        ...


class RoleCheck(Protocol):
    """Decides whether the sender of a peer message holds the role its route needs."""

    async def check(self, route: routes.Route, sender: Sender, body: BaseModel | None) -> str | None:
        """None if ``sender`` holds ``route.role`` for ``body``; else why not (for the log and the 403).

        Reads facts only: it changes nothing, whatever it answers.
        """
        ...


class PeerConnector(Protocol):
    """The mutual-TLS client: calls a peer at an address (the peer's certificate names who answered)."""

    async def call_at(self, host: str, port: int, route: PeerRoute[Req, Rep], body: Req | None,
                      expect_node: str | None = None) -> tuple[Rep, PeerIdentity]:
        """Send ``body`` on ``route`` to ``host:port``; the reply and the answering node's identity.

        Raises:
            PeerRefused: a 403. PeerCallError: any other failure, or another node answered than ``expect_node``.
        """
        ...

    async def close(self) -> None:
        """Close pooled connections."""
        ...


class PeerNetwork(Protocol):
    """What the cluster service needs from the network layer above it: a client and two listeners."""

    def connector(self, context: ssl.SSLContext, timeout_s: float) -> PeerConnector:
        """A mutual-TLS client presenting ``context``'s certificate; each call times out after ``timeout_s``."""
        ...

    async def serve_peer(self, host: str, port: int, context: ssl.SSLContext, *, handshake_timeout_s: float,
                         limits: ConnectionLimits, is_revoked: Callable[[str], bool]) -> int:
        """Serve the peer API (every route of the table) on ``host:port`` (0: any free port); the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        ...

    async def serve_enroll(self, host: str, port: int, context: ssl.SSLContext, *, identity_dir: Path,
                           limits: ConnectionLimits, max_connection_s: float,
                           is_revoked: Callable[[str], bool]) -> int:
        """Serve a signer's enrollment listener on ``host:port`` (0: any free port); the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        ...

    def close_revoked(self, is_revoked: Callable[[str], bool]) -> int:
        """Close the open peer-API connections whose certificate names a revoked node; how many."""
        ...

    async def close(self) -> None:
        """Stop both listeners."""
        ...
