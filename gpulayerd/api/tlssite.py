"""Serving an aiohttp application over TLS to strangers: a handshake deadline and connection limits.

aiohttp's own sites neither take a TLS handshake timeout (asyncio's default is 60 s, during
which an idle connection holds a file descriptor) nor limit connections. Here the server is
made by hand: asyncio's ``create_server`` with ``ssl_handshake_timeout``, on a
:class:`~gpulayerd.net.limits.LimitedListener` that drops connections over the limits
before their handshake starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

from aiohttp import web

from gpulayerd.net.limits import ConnectionLimits, LimitedListener, quiet_accept_errors
from gpulayerd.net.tls import peer_node_id

__all__ = ["start_tls_site"]

_BACKLOG = 512


class _Authenticating(asyncio.Protocol):
    """aiohttp's request handler, told to the listener when its TLS handshake ended with a client
    certificate (asyncio calls ``connection_made`` once the handshake is done): the connection then
    keeps its slot (:meth:`~gpulayerd.net.limits.LimitedListener.authenticated`) - unless the
    certificate names a revoked node (``is_revoked``): that one stays a stranger's (its certificate
    still verifies against the CA, but it must not hold a member's slot; it can be evicted, and its
    requests are answered 403 "removed from the cluster")."""

    def __init__(self, inner: asyncio.Protocol, listener: LimitedListener,
                 is_revoked: Callable[[str], bool] | None) -> None:
        self._inner = inner
        self._listener = listener
        self._is_revoked = is_revoked

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_obj = transport.get_extra_info("ssl_object")
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, ValueError, AttributeError):
            der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
            revoked = der is not None and self._is_revoked is not None and self._is_revoked(peer_node_id(der))
            if der and not revoked and sock is not None:
                self._listener.authenticated(sock.fileno())
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _LimitedTlsSite(web.SockSite):
    """A TLS site on a listener whose server has a handshake deadline."""

    __slots__ = ("_handshake_timeout_s", "_is_revoked", "_listener")

    def __init__(self, runner: web.AppRunner, sock: LimitedListener, *, ssl_context: ssl.SSLContext,
                 handshake_timeout_s: float, backlog: int, is_revoked: Callable[[str], bool] | None = None) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context, backlog=backlog)
        self._handshake_timeout_s = handshake_timeout_s
        self._listener = sock
        self._is_revoked = is_revoked

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner (whose cleanup() stops it)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop)
        self._server = await loop.create_server(
            lambda: _Authenticating(server(), self._listener, self._is_revoked), sock=self._sock, ssl=self._ssl_context,
            backlog=self._backlog, ssl_handshake_timeout=self._handshake_timeout_s)


async def start_tls_site(app: web.Application, host: str, port: int, context: ssl.SSLContext, *,
                         handshake_timeout_s: float, limits: ConnectionLimits,
                         max_connection_s: float | None = None, is_revoked: Callable[[str], bool] | None = None,
                         keepalive_timeout_s: float = 60.0) -> tuple[web.AppRunner, int]:
    """Serve ``app`` over TLS on ``host:port`` (port 0 picks a free one), within ``limits``.

    A connection whose TLS handshake has not finished ``handshake_timeout_s`` seconds after it
    was accepted is closed; one over a limit of ``limits`` is reset as it is accepted; with
    ``max_connection_s``, every connection is shut down that long after it was accepted; one whose
    client certificate names a node ``is_revoked`` says is revoked is never counted as a member's
    (it can be evicted); an idle kept-alive connection is closed after ``keepalive_timeout_s``.

    Returns:
        The runner (``await runner.cleanup()`` stops serving) and the bound port.

    Raises:
        ValueError: ``handshake_timeout_s`` not positive.
        OSError: ``host`` does not resolve, or the address cannot be bound (e.g. in use).
    """
    if not handshake_timeout_s > 0:
        raise ValueError(f"handshake_timeout_s must be positive, got {handshake_timeout_s}")
    sock = await _listening_socket(host, port)
    listener = LimitedListener.wrap(sock, limits, max_connection_s)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=keepalive_timeout_s)
    try:
        await runner.setup()
        site = _LimitedTlsSite(runner, listener, ssl_context=context, handshake_timeout_s=handshake_timeout_s,
                               backlog=_BACKLOG, is_revoked=is_revoked)
        await site.start()
    except BaseException:
        listener.close()
        await runner.cleanup()
        raise
    return runner, int(listener.getsockname()[1])


async def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket on the first address ``host`` resolves to."""
    infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"{host!r} resolves to no address")
    family, type_, proto, _, address = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
