"""The peer API: aiohttp over TCP with mutual TLS against the cluster CA, ``/v1/peer/``.

Nothing from the network is trusted until authenticated: the TLS handshake requires a
client certificate signed by our cluster CA (a plain HTTP request or a wrong
certificate never reaches a handler), and every handler checks that the node id a
message claims is the node id the certificate proves. Offers, holds and job requests
(``/v1/peer/job/...``) also get the sender's mode and bound user from its certificate (who
it vouches for, DESIGN §9).

Then the message itself is checked before any service sees it (:func:`request_problem`):
ids that name files or rows (job and hold ids) must be plain tokens, attempts and log
offsets in range; anything else is a 400. The services check the sender's role (holder,
owner): a refusal they raise as :class:`PeerForbidden` is a 403, and changes nothing.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ValidationError

from gpulayerd.api.tlssite import start_tls_site
from gpulayerd.models import ApiErrorBody, Capabilities, JobList, LogChunk
from gpulayerd.net.limits import ConnectionLimits
from gpulayerd.net.tls import PeerIdentity, peer_identity, peer_node_id
from gpulayerd.net.wire import (
    JOB_ACTIONS,
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
    Kill,
    LogRequest,
    Offer,
    Release,
    RunReport,
    RunReportReply,
)

__all__ = [
    "MAX_LOG_OFFSET",
    "PeerBadRequest",
    "PeerCallError",
    "PeerClient",
    "PeerForbidden",
    "PeerService",
    "close_connections_of",
    "make_peer_app",
    "request_problem",
    "start_peer_site",
]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


class PeerService(Protocol):
    """What the peer API needs from the daemon. ``sender`` is the TLS-proven node id."""

    async def async_peer_heartbeat(self, sender: str, msg: Heartbeat, remote_ip: str) -> HeartbeatReply:
        """Membership."""
        ...

    async def async_peer_capabilities(self, sender: str) -> Capabilities:
        """Our capabilities with grant state."""
        ...

    async def async_peer_jobs(self, sender: str, statuses: list[str] | None) -> JobList:
        """The jobs we own."""
        ...

    async def async_peer_offer(self, sender: str, msg: Offer, sender_mode: str, sender_user: str) -> Ack:
        """An owner offers a job; its certificate says it is in ``sender_mode``, bound to ``sender_user``."""
        ...

    async def async_peer_claim(self, sender: str, msg: Claim) -> ClaimReply:
        """A worker claims one of our jobs."""
        ...

    async def async_peer_report(self, sender: str, msg: RunReport) -> RunReportReply:
        """A worker reports on an attempt of one of our jobs."""
        ...

    async def async_peer_kill(self, sender: str, msg: Kill) -> Ack:
        """An owner tells us to stop an attempt."""
        ...

    async def async_peer_logs(self, sender: str, msg: LogRequest) -> LogChunk:
        """An owner reads the log of an attempt we run (for it: others get PeerForbidden)."""
        ...

    async def async_peer_hold(self, sender: str, msg: Hold, sender_mode: str, sender_user: str) -> HoldReply:
        """Gang: reserve resources for a member (the sender's mode and bound user as for offers)."""
        ...

    async def async_peer_release(self, sender: str, msg: Release) -> Ack:
        """Gang: drop a hold."""
        ...

    async def async_peer_commit(self, sender: str, msg: Commit) -> Ack:
        """Gang: run a rank."""
        ...

    async def async_peer_job_find(self, sender: str, msg: JobRequest) -> JobMatches:
        """Which jobs we own (or runs we hold) have ids starting with ``msg.job_id``."""
        ...

    async def async_peer_job(self, sender: str, action: str, msg: JobRequest, sender_mode: str,
                             sender_user: str) -> JobReply:
        """Show, explain, read the logs of or cancel a job for a person on ``sender`` (``msg.user``,
        believed as far as the sender's certificate, ``sender_mode`` and ``sender_user``, vouches)."""
        ...


class PeerCallError(Exception):
    """A call to a peer failed: unreachable, TLS refused, timeout, or an error reply."""


class PeerForbidden(Exception):
    """Raised by a service: the (authenticated) sender may not do this; answered 403, nothing changed."""


class PeerBadRequest(Exception):
    """Raised by a service: the message is malformed (e.g. a log offset out of range); answered 400."""


MAX_LOG_OFFSET = 2**53
"""The largest log offset a peer may ask for (larger ones are a 400, not a failed seek)."""

MAX_ATTEMPT = 2**31 - 1
"""The largest attempt number a message may name."""

_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")


def request_problem(msg: BaseModel) -> str | None:
    """What is wrong with a peer message's ids and numbers, or None if nothing is.

    Checked on every peer message before a service sees it: ``job_id`` and ``hold_id``
    (which name rows and, for job ids, run directories) must be 1 to 64 letters, digits,
    ``_`` or ``-`` starting with a letter or digit (no ``/``, ``.``, NUL...);
    ``attempt`` must be 1 to 2**31 - 1; a log ``offset`` must be 0 to :data:`MAX_LOG_OFFSET`.
    """
    for name in ("job_id", "hold_id"):
        value = getattr(msg, name, None)
        if isinstance(value, str) and not _ID.fullmatch(value):
            return f"{name} must be 1 to 64 letters, digits, '_' or '-'"
    attempt = getattr(msg, "attempt", None)
    if isinstance(attempt, int) and not 1 <= attempt <= MAX_ATTEMPT:
        return f"attempt must be 1 to {MAX_ATTEMPT}"
    if isinstance(msg, LogRequest) and not 0 <= msg.offset <= MAX_LOG_OFFSET:
        return f"offset must be 0 to {MAX_LOG_OFFSET}"
    return None


def _sender(request: web.Request) -> PeerIdentity:
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
        if is_revoked is not None and is_revoked(_sender(request).node_id):
            resp = _bad("revoked", "this node was removed from the cluster", status=403)
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


def _reply(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


def _bad(code: str, message: str, status: int = 400) -> web.Response:
    return web.Response(text=ApiErrorBody(code=code, message=message).model_dump_json(), status=status,
                        content_type="application/json")


def make_peer_app(service: PeerService, is_revoked: Callable[[str], bool] | None = None) -> web.Application:
    """The peer API application bound to ``service``.

    ``is_revoked(node_id)``: a request whose certificate names a revoked node is answered 403
    before any route, and its connection is closed (:func:`close_connections_of`).
    """
    app = web.Application(client_max_size=4 * 2**20, middlewares=[_revocation_check(is_revoked)])

    def route(model: type[_M], call: Callable[[PeerIdentity, _M, web.Request], Awaitable[BaseModel]],
              sender_field: str | None) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            who = _sender(request)
            sender = who.node_id
            try:
                msg = model.model_validate_json(await request.read())
            except ValidationError as e:
                return _bad("bad_request", f"invalid {model.__name__}: {e.error_count()} error(s)")
            if sender_field is not None and getattr(msg, sender_field) != sender:
                return _bad("forbidden", f"{sender_field} does not match the TLS certificate", status=403)
            problem = request_problem(msg)
            if problem is not None:
                return _bad("bad_request", f"invalid {model.__name__}: {problem}")
            try:
                return _reply(await call(who, msg, request))
            except PeerForbidden as e:
                return _bad("forbidden", str(e), status=403)
            except PeerBadRequest as e:
                return _bad("bad_request", str(e))
        return handler

    async def caps(request: web.Request) -> web.Response:
        return _reply(await service.async_peer_capabilities(_sender(request).node_id))

    async def jobs(request: web.Request) -> web.Response:
        sender = _sender(request).node_id
        return _reply(await service.async_peer_jobs(sender, request.query.getall("status", []) or None))

    app.router.add_post("/v1/peer/heartbeat", route(
        Heartbeat, lambda s, m, r: service.async_peer_heartbeat(s.node_id, m, r.remote or ""), "node_id"))
    app.router.add_get("/v1/peer/capabilities", caps)
    app.router.add_get("/v1/peer/jobs", jobs)
    app.router.add_post("/v1/peer/offer", route(
        Offer, lambda s, m, r: service.async_peer_offer(s.node_id, m, s.mode, s.user), "owner"))
    app.router.add_post("/v1/peer/claim", route(
        Claim, lambda s, m, r: service.async_peer_claim(s.node_id, m), "worker"))
    app.router.add_post("/v1/peer/report", route(
        RunReport, lambda s, m, r: service.async_peer_report(s.node_id, m), "worker"))
    app.router.add_post("/v1/peer/kill", route(
        Kill, lambda s, m, r: service.async_peer_kill(s.node_id, m), "owner"))
    # A log request names no sender: the worker serves only the runs it runs for the certificate's node.
    app.router.add_post("/v1/peer/logs", route(
        LogRequest, lambda s, m, r: service.async_peer_logs(s.node_id, m), None))
    app.router.add_post("/v1/peer/hold", route(
        Hold, lambda s, m, r: service.async_peer_hold(s.node_id, m, s.mode, s.user), "owner"))
    app.router.add_post("/v1/peer/release", route(
        Release, lambda s, m, r: service.async_peer_release(s.node_id, m), "owner"))
    app.router.add_post("/v1/peer/commit", route(
        Commit, lambda s, m, r: service.async_peer_commit(s.node_id, m), "owner"))
    # Cluster-wide job control: a request names no sender; who asks is the certificate's node
    # (and, as far as its mode and bound user vouch, the user the message names).
    app.router.add_post("/v1/peer/job/find", route(
        JobRequest, lambda s, m, r: service.async_peer_job_find(s.node_id, m), None))
    for action in JOB_ACTIONS:
        app.router.add_post(f"/v1/peer/job/{action}", route(JobRequest, _job_call(service, action), None))
    return app


def _job_call(service: PeerService, action: str) -> Callable[[PeerIdentity, JobRequest, web.Request],
                                                            Awaitable[BaseModel]]:
    def call(s: PeerIdentity, m: JobRequest, r: web.Request) -> Awaitable[BaseModel]:
        return service.async_peer_job(s.node_id, action, m, s.mode, s.user)
    return call


async def start_peer_site(app: web.Application, host: str, port: int, context: ssl.SSLContext, *,
                          handshake_timeout_s: float = 5.0, limits: ConnectionLimits | None = None,
                          max_connection_s: float | None = None) -> tuple[web.AppRunner, int]:
    """Serve ``app`` with mutual TLS on ``host:port`` (port 0 picks a free one).

    Strangers can open connections without a certificate, so: a connection whose TLS handshake
    is not done within ``handshake_timeout_s`` seconds is closed, and connections over
    ``limits`` (default: 512 in total, 64 per remote address) are reset as they are accepted;
    ``max_connection_s`` (None: no limit) bounds how long any one connection stays open.

    Returns:
        The runner (``await runner.cleanup()`` stops it) and the bound port.

    Raises:
        OSError: the address cannot be bound.
    """
    if limits is None:
        limits = ConnectionLimits(512, 64, time.monotonic)
    return await start_tls_site(app, host, port, context, handshake_timeout_s=handshake_timeout_s, limits=limits,
                                max_connection_s=max_connection_s)


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


class PeerClient:
    """Calls other daemons' peer APIs with this daemon's client certificate."""

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

    async def call(self, host: str, port: int, path: str, body: BaseModel | None, reply: type[_M],
                   expect_node: str | None = None) -> tuple[_M, str]:
        """POST (or GET without a body) to a peer; return its reply and its TLS-proven node id.

        Raises:
            PeerCallError: unreachable, TLS failure, timeout, error reply, or the peer's
                certificate names another node than ``expect_node``.
        """
        h = f"[{host}]" if ":" in host else host
        url = f"https://{h}:{port}{path}"
        data = None if body is None else body.model_dump_json()
        method = "GET" if body is None else "POST"
        try:
            async with self._http().request(method, url, data=data,
                                            headers={"Content-Type": "application/json"}) as resp:
                ssl_obj = _ssl_object(resp)
                der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
                raw = await resp.read()
                if resp.status >= 400:
                    raise PeerCallError(f"{url}: HTTP {resp.status}: {raw[:200]!r}")
        except (aiohttp.ClientError, TimeoutError, OSError, ssl.SSLError) as e:
            raise PeerCallError(f"{url}: {type(e).__name__}: {e}") from e
        if not der:
            raise PeerCallError(f"{url}: no peer certificate")
        node = peer_node_id(der)
        if expect_node is not None and node != expect_node:
            raise PeerCallError(f"{url}: answered by node {node[:12]}, expected {expect_node[:12]}")
        try:
            return reply.model_validate_json(raw), node
        except ValidationError as e:
            raise PeerCallError(f"{url}: invalid {reply.__name__} reply: {e.error_count()} error(s)") from e
