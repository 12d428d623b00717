"""The peer API, built from the route table: one dispatcher, the mutual-TLS server, the client.

Every peer message goes through :class:`PeerRouter` (the TLS server, the self-first
transport for this node's own messages, and the tests' loopback all call it), in this order:

1. the message's ids and numbers (:func:`request_problem`): job and hold ids are plain tokens,
   attempts and log offsets in range; anything else is a 400;
2. a body field that names the sender (``owner``, ``worker``, ``node_id``) must be the node id
   its certificate proves: else 403;
3. THE role check: the route's role (:mod:`gpulayerd.routes`) is decided by a
   :class:`~gpulayerd.net.transport.RoleCheck` from facts the sender cannot forge; a refusal
   is answered 403 (or, for ``report``, "stale": the sender must stop that attempt), logged
   once per sender and route, counted, and nothing changes;
4. the handler bound to the route's handler name.

Nothing from the network is trusted until authenticated: the TLS handshake requires a client
certificate signed by our cluster CA (a plain HTTP request or a wrong certificate never reaches
a handler), and a revoked node is answered 403 before any route (its connections are closed).
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ValidationError

from gpulayerd.api.tlssite import start_tls_site
from gpulayerd.errors import PeerBadRequest, PeerCallError, PeerRefused
from gpulayerd.models import LOG_CHUNK_BYTES, ApiErrorBody
from gpulayerd.net.identity import PeerIdentity
from gpulayerd.net.limits import ConnectionLimits
from gpulayerd.net.tls import peer_identity, peer_node_id
from gpulayerd.net.transport import (
    BY_NAME,
    REPORT,
    NoBody,
    PeerConnector,
    PeerHandler,
    PeerRoute,
    RoleCheck,
    Sender,
)
from gpulayerd.net.wire import LogRequest, RunReportReply

__all__ = [
    "MAX_ATTEMPT",
    "MAX_LOG_OFFSET",
    "REFUSED_STAT",
    "PeerClient",
    "PeerRouter",
    "TlsNetwork",
    "close_connections_of",
    "make_peer_app",
    "request_problem",
    "start_peer_site",
]

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

MAX_LOG_OFFSET = 2**53
"""The largest log offset a peer may ask for (larger ones are a 400, not a failed seek)."""

MAX_ATTEMPT = 2**31 - 1
"""The largest attempt number a message may name."""

REFUSED_STAT = "peer_messages_refused"
"""The stats counter (``/v1/health``) of peer messages refused for want of a role."""

_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")
_SENDER_FIELDS = ("owner", "worker", "node_id")


def request_problem(msg: BaseModel | None) -> str | None:
    """What is wrong with a peer message's ids and numbers, or None if nothing is.

    ``job_id`` and ``hold_id`` (which name rows and, for job ids, run directories) must be 1 to
    64 letters, digits, ``_`` or ``-`` starting with a letter or digit (no ``/``, ``.``, NUL...);
    ``attempt`` must be 1 to 2**31 - 1; a log ``offset`` must be 0 to :data:`MAX_LOG_OFFSET`, its
    ``limit`` 1 to :data:`~gpulayerd.models.LOG_CHUNK_BYTES`.
    """
    if msg is None:
        return None
    fields = type(msg).model_fields  # a field it lacks: no getattr (pydantic's miss is slow: a heartbeat has none)
    for name in ("job_id", "hold_id"):
        value = getattr(msg, name, None) if name in fields else None
        if isinstance(value, str) and not _ID.fullmatch(value):
            return f"{name} must be 1 to 64 letters, digits, '_' or '-'"
    attempt = getattr(msg, "attempt", None) if "attempt" in fields else None
    if isinstance(attempt, int) and not 1 <= attempt <= MAX_ATTEMPT:
        return f"attempt must be 1 to {MAX_ATTEMPT}"
    if isinstance(msg, LogRequest) and not 0 <= msg.offset <= MAX_LOG_OFFSET:
        return f"offset must be 0 to {MAX_LOG_OFFSET}"
    if isinstance(msg, LogRequest) and msg.limit is not None and not 1 <= msg.limit <= LOG_CHUNK_BYTES:
        return f"limit must be 1 to {LOG_CHUNK_BYTES} bytes"
    return None


class PeerRouter:
    """THE dispatcher of peer messages (see the module docstring for its steps).

    The composition root makes it first, empty (the network serves it and this node's own calls go
    through it), and gives it its handlers and role checks once the services exist (:meth:`serve`):
    the one cycle of the design, since the services that answer peers also call them.

    Args:
        handlers: handler name (``routes.Route.handler``) -> ``async (sender, message) -> reply``;
            with ``roles``, served at once (as :meth:`serve`).
        roles: decides each route's role.
        stats: the daemon's protocol counters: :data:`REFUSED_STAT` and ``refused_<route>`` grow
            by one per refusal.
        logger: where refusals are logged (once per sender and route at WARNING, then DEBUG).

    Raises:
        ValueError: a handler name that no route declares.
    """

    def __init__(self, handlers: Mapping[str, PeerHandler] | None = None, roles: RoleCheck | None = None, *,
                 stats: Counter[str] | None = None, logger: logging.Logger | None = None) -> None:
        self._handlers: dict[str, PeerHandler] = {}
        self._roles: RoleCheck | None = None
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self._log = logger or log
        self._seen: set[tuple[str, str]] = set()
        if handlers is not None and roles is not None:
            self.serve(handlers, roles)

    def serve(self, handlers: Mapping[str, PeerHandler], roles: RoleCheck) -> None:
        """Answer with ``handlers``, each route's role decided by ``roles`` (once, at wiring).

        A node outside a cluster gives only what its own messages to itself need.

        Raises:
            ValueError: a handler name that no route declares, or a second call.
        """
        if self._roles is not None:
            raise ValueError("PeerRouter.serve() was called already")
        declared = {r.route.handler for r in BY_NAME.values()}
        unknown = set(handlers) - declared
        if unknown:
            raise ValueError(f"handlers for no declared peer route: {sorted(unknown)}")
        self._handlers = dict(handlers)
        self._roles = roles

    def bound(self) -> set[str]:
        """The names of the routes this router answers."""
        return {name for name, r in BY_NAME.items() if r.route.handler in self._handlers}

    async def dispatch(self, route: PeerRoute[Req, Rep], sender: Sender, body: Req | None) -> Rep:
        """The reply to ``body`` from ``sender`` on ``route`` (see :class:`~gpulayerd.net.transport.PeerDispatch`).

        Raises:
            PeerBadRequest: malformed ids or numbers. PeerRefused: the sender lacks the role, or a
            body field names another node than the certificate. LookupError: no handler bound.
        """
        handler = self._handlers.get(route.route.handler)
        if handler is None or self._roles is None:
            raise LookupError(f"{route.path} is not served by this node")
        problem = request_problem(body)
        if problem is not None:
            raise PeerBadRequest(f"invalid {route.request.__name__}: {problem}")
        fields = type(body).model_fields if body is not None else {}
        for name in _SENDER_FIELDS:
            value = getattr(body, name, None) if name in fields else None
            if isinstance(value, str) and value != sender.node_id:
                self._refused(route, sender, f"{name} {value[:12]!r} is not the sender")
                raise PeerRefused(f"{name} does not match the TLS certificate")
        why = await self._roles.check(route.route, sender, body)
        if why is not None:
            self._refused(route, sender, why)
            if route is REPORT:
                return route.reply.model_validate(RunReportReply(ok=False, stale=True).model_dump())
            raise PeerRefused(why)
        reply: Rep = await handler(sender, body)
        return reply

    def _refused(self, route: PeerRoute[Any, Any], sender: Sender, why: str) -> None:
        self.stats[REFUSED_STAT] += 1
        self.stats[f"refused_{route.name}"] += 1
        first = (sender.node_id, route.name) not in self._seen
        if first:
            if len(self._seen) >= 4096:  # bounded memory: a flood of senders logs again later, never more
                self._seen.clear()
            self._seen.add((sender.node_id, route.name))
        self._log.log(logging.WARNING if first else logging.DEBUG,
                      "refused %s from peer %s (%s may call it): %s%s", route.name, sender.node_id[:12],
                      route.route.role.value, why,
                      " (further refusals of this route from this peer are logged at debug level)" if first else "")


# ---------------------------------------------------------------------------- the TLS server


def _identity(request: web.Request) -> PeerIdentity:
    """The TLS-proven node id, mode and bound user of the request's sender."""
    ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
    der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
    if not der:
        raise web.HTTPUnauthorized(text="client certificate required")
    return peer_identity(der)


def _revocation_check(is_revoked: Callable[[str], bool] | None) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if is_revoked is not None and is_revoked(_identity(request).node_id):
            resp = _error("revoked", "this node was removed from the cluster", status=403)
            resp.force_close()
            return resp
        return await handler(request)
    return check


def close_connections_of(runner: web.AppRunner, is_revoked: Callable[[str], bool]) -> int:
    """Close the open connections of ``runner``'s server whose client certificate names a
    revoked node. Returns how many were closed."""
    server = runner.server
    closed = 0
    for handler in list(getattr(server, "connections", []) if server is not None else []):
        transport = handler.transport
        ssl_obj = transport.get_extra_info("ssl_object") if transport is not None else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
        if transport is not None and der and is_revoked(peer_node_id(der)):
            transport.close()
            closed += 1
    return closed


def _error(code: str, message: str, status: int = 400) -> web.Response:
    return web.Response(text=ApiErrorBody(code=code, message=message).model_dump_json(), status=status,
                        content_type="application/json")


def make_peer_app(router: PeerRouter, is_revoked: Callable[[str], bool] | None = None) -> web.Application:
    """The peer API application: one aiohttp route per declared peer route, each through ``router``.

    ``is_revoked(node_id)``: a request whose certificate names a revoked node is answered 403
    before any route, and its connection is closed (:func:`close_connections_of`).
    """
    app = web.Application(client_max_size=4 * 2**20, middlewares=[_revocation_check(is_revoked)])
    for bound in BY_NAME.values():
        app.router.add_route(bound.route.method, bound.path, _route_handler(router, bound))
    return app


def _route_handler(router: PeerRouter, bound: PeerRoute[Any, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handle(request: web.Request) -> web.Response:
        sender = Sender.of(_identity(request), request.remote or "")
        body: BaseModel | None = None
        if bound.request is not NoBody:
            try:
                body = bound.request.model_validate_json(await request.read())
            except ValidationError as e:
                return _error("bad_request", f"invalid {bound.request.__name__}: {e.error_count()} error(s)")
        try:
            reply = await router.dispatch(bound, sender, body)
        except PeerRefused as e:
            return _error("forbidden", e.reason, status=403)
        except PeerBadRequest as e:
            return _error("bad_request", str(e))
        except LookupError as e:
            return _error("not_found", str(e), status=404)
        return web.Response(text=reply.model_dump_json(), content_type="application/json")
    return handle


async def start_peer_site(app: web.Application, host: str, port: int, context: ssl.SSLContext, *,
                          handshake_timeout_s: float = 5.0, limits: ConnectionLimits | None = None,
                          max_connection_s: float | None = None,
                          is_revoked: Callable[[str], bool] | None = None) -> tuple[web.AppRunner, int]:
    """Serve ``app`` with mutual TLS on ``host:port`` (port 0 picks a free one).

    Strangers can open connections without a certificate, so: a connection whose TLS handshake
    is not done within ``handshake_timeout_s`` seconds is closed, and connections over
    ``limits`` (default: 512 in total, 64 per remote address) are reset as they are accepted;
    ``max_connection_s`` (None: no limit) bounds how long any one connection stays open; a connection
    whose certificate names a node ``is_revoked`` reports revoked never holds a member's slot.

    Returns:
        The runner (``await runner.cleanup()`` stops it) and the bound port.

    Raises:
        OSError: the address cannot be bound.
    """
    if limits is None:
        limits = ConnectionLimits(512, 64, time.monotonic)
    return await start_tls_site(app, host, port, context, handshake_timeout_s=handshake_timeout_s, limits=limits,
                                max_connection_s=max_connection_s, is_revoked=is_revoked)


# ---------------------------------------------------------------------------- the client


def _ssl_object(resp: aiohttp.ClientResponse) -> ssl.SSLObject | None:
    """The TLS object of the connection a response came on.

    A small body is read with the headers, and aiohttp then hands the connection back
    to its pool (``resp.connection`` is None); the response's protocol still holds the
    transport, so look there too.
    """
    transport = None
    if resp.connection is not None:
        transport = resp.connection.transport
    if transport is None:
        proto = getattr(resp, "_protocol", None)
        transport = getattr(proto, "transport", None)
    obj = transport.get_extra_info("ssl_object") if transport is not None else None
    return obj if isinstance(obj, ssl.SSLObject) else None


def _refusal_text(raw: bytes) -> str:
    try:
        return ApiErrorBody.model_validate_json(raw).message
    except ValidationError:
        return raw[:200].decode("utf-8", "replace")


class PeerClient:
    """Calls other daemons' peer APIs with this daemon's client certificate (a
    :class:`~gpulayerd.net.transport.PeerConnector`): method and path come from the route table."""

    def __init__(self, context: ssl.SSLContext, timeout_s: float = 5.0) -> None:
        self._context = context
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._context, limit=64, force_close=False),
                timeout=self._timeout,
            )
        return self._session

    async def call_at(self, host: str, port: int, route: PeerRoute[Req, Rep], body: Req | None,
                      expect_node: str | None = None) -> tuple[Rep, PeerIdentity]:
        """Send ``body`` on ``route`` to ``host:port``; the reply and the answering node's identity.

        Raises:
            PeerRefused: the peer answered 403 (its reason in the message).
            PeerCallError: unreachable, TLS failure, timeout, another error reply, or the peer's
                certificate names another node than ``expect_node``.
        """
        h = f"[{host}]" if ":" in host else host
        url = f"https://{h}:{port}{route.path}"
        data = None if body is None else body.model_dump_json()
        try:
            async with self._http().request(route.route.method, url, data=data,
                                            headers={"Content-Type": "application/json"}) as resp:
                ssl_obj = _ssl_object(resp)
                der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
                raw = await resp.read()
                if resp.status == 403:
                    reason = _refusal_text(raw)
                    raise PeerRefused(f"{url}: HTTP 403: {reason}", reason)
                if resp.status >= 400:
                    raise PeerCallError(f"{url}: HTTP {resp.status}: {raw[:200]!r}")
        except (aiohttp.ClientError, TimeoutError, OSError, ssl.SSLError) as e:
            raise PeerCallError(f"{url}: {type(e).__name__}: {e}") from e
        if not der:
            raise PeerCallError(f"{url}: no peer certificate")
        who = peer_identity(der)
        if expect_node is not None and who.node_id != expect_node:
            raise PeerCallError(f"{url}: answered by node {who.node_id[:12]}, expected {expect_node[:12]}")
        try:
            return route.reply.model_validate_json(raw), who
        except ValidationError as e:
            raise PeerCallError(f"{url}: invalid {route.reply.__name__} reply: {e.error_count()} error(s)") from e


class TlsNetwork:
    """The :class:`~gpulayerd.net.transport.PeerNetwork` of a daemon: mutual-TLS clients, the peer
    API served through a :class:`PeerRouter`, and a signer's enrollment listener.

    ``router`` is the daemon's router, made before the services that answer through it
    (:meth:`PeerRouter.serve`); None: this network serves no peer API (enrollment only).
    """

    def __init__(self, router: PeerRouter | None = None) -> None:
        self.router = router
        self._peer: web.AppRunner | None = None
        self._enroll: web.AppRunner | None = None

    def connector(self, context: ssl.SSLContext, timeout_s: float) -> PeerConnector:
        """A :class:`PeerClient`."""
        return PeerClient(context, timeout_s=timeout_s)

    async def serve_peer(self, host: str, port: int, context: ssl.SSLContext, *, handshake_timeout_s: float,
                         limits: ConnectionLimits, is_revoked: Callable[[str], bool]) -> int:
        """See :class:`~gpulayerd.net.transport.PeerNetwork`."""
        if self.router is None:
            raise RuntimeError("TlsNetwork.router is not set")
        self._peer, bound = await start_peer_site(make_peer_app(self.router, is_revoked), host, port, context,
                                                  handshake_timeout_s=handshake_timeout_s, limits=limits,
                                                  is_revoked=is_revoked)
        return bound

    async def serve_enroll(self, host: str, port: int, context: ssl.SSLContext, *, identity_dir: Path,
                           limits: ConnectionLimits, max_connection_s: float,
                           is_revoked: Callable[[str], bool]) -> int:
        """See :class:`~gpulayerd.net.transport.PeerNetwork`."""
        from gpulayerd.api.enroll import make_enroll_app

        self._enroll, bound = await start_peer_site(make_enroll_app(identity_dir, is_revoked), host, port, context,
                                                    limits=limits, max_connection_s=max_connection_s)
        return bound

    def close_revoked(self, is_revoked: Callable[[str], bool]) -> int:
        """See :class:`~gpulayerd.net.transport.PeerNetwork`."""
        return close_connections_of(self._peer, is_revoked) if self._peer is not None else 0

    async def close(self) -> None:
        """Stop both listeners."""
        for runner in (self._enroll, self._peer):
            if runner is not None:
                await runner.cleanup()
        self._enroll = self._peer = None
