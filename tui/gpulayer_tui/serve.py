"""``gpulayer tui --serve``: the read-only board in a browser, through ``textual-serve``.

Every viewer's websocket starts one TUI process, ``python -m gpulayer_tui --socket PATH --read-only``
(textual-serve's web driver on its pipes), which is a read-only board whatever it is asked
(:mod:`gpulayer_tui.readonly`; a TUI under the web driver is always read-only, see
:func:`gpulayer_tui.launch.run`).

The web layer (:class:`BoardServer`, on textual-serve's :class:`~textual_serve.server.Server`) adds:

- a random token, printed at start in the URL (``/?token=…``). The page needs it in its query;
  the websocket and the static files live under ``/<token>/``. Every other request, and every
  request without the token, is refused (403) before any route answers; textual-serve's own
  routes (``/ws``, ``/static``, ``/download/…``) are not served at all;
- the websocket's ``Origin`` must be the served origin (``http://HOST:PORT``; for a loopback
  host also ``localhost`` and ``127.0.0.1`` on that port), or the one given with ``--origin``
  (``ssh -L`` to another local port, a proxy): otherwise 403, so another site's page cannot
  open the board in a browser that has the URL;
- at most ``max_viewers`` websockets at once; one more is refused (503) before its TUI starts;
- 127.0.0.1 by default; no referrer is sent from the page, and it is never cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web
from textual_serve.app_service import AppService
from textual_serve.server import Server

__all__ = ["DEFAULT_HOST", "DEFAULT_MAX_VIEWERS", "DEFAULT_PORT", "BoardServer", "board_command", "run"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_MAX_VIEWERS = 8
STOP_TIMEOUT_S = 3.0
"""Seconds a viewer's TUI has to end once its websocket closed, before it is killed."""
STOPPING_TIMEOUT_S = 1.0
"""The same once the board stops: a TUI still running then (one still starting) is killed."""
SHUTDOWN_TIMEOUT_S = STOP_TIMEOUT_S + 2.0
"""Seconds the server waits for its viewers to end when it stops (then what is left is cancelled, killed)."""
MAX_MESSAGE_BYTES = 64 * 1024
"""The largest websocket message a viewer may send (keys, a resize, a ping)."""

log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def board_command(socket_path: Path) -> str:
    """The shell command textual-serve runs for each viewer: this Python, the TUI, read-only."""
    return "exec " + shlex.join([sys.executable, "-m", "gpulayer_tui", "--socket", str(socket_path), "--read-only"])


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(host: str, port: int) -> str:
    name = f"[{host}]" if ":" in host else host
    return f"http://{name}" if port == 80 else f"http://{name}:{port}"


class BoardServer(Server):
    """textual-serve's server for the board, locked down (see the module).

    Args:
        socket_path: the daemon's unix socket, for each viewer's TUI.
        host: the address to listen on (default 127.0.0.1). A wildcard (``0.0.0.0``, ``::``) needs ``origin``.
        port: the TCP port (0: any free one; :attr:`port` says which once :meth:`start` returned).
        max_viewers: websockets served at once.
        origin: the origin browsers open the board at when it is not ``http://HOST:PORT``
            (``http://labbox:8765`` for a wildcard host, ``http://localhost:9000`` for ``ssh -L 9000:…``).
        token: the secret of the URL (default: 32 random bytes, URL-safe).
        command: what each viewer runs (default :func:`board_command`; tests only).
    """

    def __init__(self, socket_path: Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 max_viewers: int = DEFAULT_MAX_VIEWERS, origin: str | None = None, token: str | None = None,
                 command: str | None = None) -> None:
        if max_viewers < 1:
            raise ValueError(f"max_viewers must be at least 1 (got {max_viewers})")
        if host in ("0.0.0.0", "::", "") and origin is None:
            raise ValueError(f"--host {host or '(every address)'} listens on every address: say with --origin "
                             "http://NAME:PORT which address browsers open (the Origin the board accepts)")
        super().__init__(command or board_command(socket_path), host=host, port=port, title="gpulayer board")
        self.token = token or secrets.token_urlsafe(32)
        self.max_viewers = max_viewers
        self.origin = origin.rstrip("/").lower() if origin else None
        self._viewers: set[web.WebSocketResponse] = set()
        self._runner: web.AppRunner | None = None
        self._services: set[AppService] = set()

    # ------------------------------------------------------------------ facts

    @property
    def viewers(self) -> int:
        """Websockets served now."""
        return len(self._viewers)

    def origins(self) -> frozenset[str]:
        """The ``Origin`` values a websocket may come with."""
        hosts = {self.host}
        if _is_loopback(self.host):
            hosts |= {"localhost", "127.0.0.1", "::1"}
        found = {_origin(h, self.port).lower() for h in hosts if h not in ("0.0.0.0", "::", "")}
        return frozenset(found | ({self.origin} if self.origin else set()))

    def url(self) -> str:
        """The board's address with its token: what the viewers open."""
        return f"{self.origin or _origin(self.host, self.port)}/?token={self.token}"

    # --------------------------------------------------------------- the web app

    async def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._require_token], client_max_size=MAX_MESSAGE_BYTES)
        aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(self.templates_path))
        app.add_routes([
            web.get("/", self._index, name="index"),
            web.get(f"/{self.token}/ws", self._websocket, name="websocket"),
            web.static(f"/{self.token}/static", self.statics_path, name="static"),
        ])
        app.on_response_prepare.append(_private_headers)
        app.on_shutdown.append(self._close_viewers)
        return app

    @web.middleware
    async def _require_token(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """Refuse (403) every request without the token: ``/?token=T`` for the page, ``/T/…`` for the rest."""
        if request.path == "/":
            allowed = _same(request.query.get("token", ""), self.token)
        else:
            allowed = _same(request.path[1:].partition("/")[0], self.token)
        if not allowed:
            return web.Response(status=403, text="forbidden: open the URL gpulayer tui --serve printed "
                                                 "(with its token)\n")
        return await handler(request)

    async def _index(self, request: web.Request) -> web.Response:
        scheme = "wss" if request.secure else "ws"
        context = {
            "font_size": max(6, min(48, _int(request.query.get("fontsize", ""), 16))),
            "app_websocket_url": f"{scheme}://{request.host}/{self.token}/ws",
            "config": {"static": {"url": f"/{self.token}/static/"}},
            "application": {"name": self.title},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        """One viewer: its Origin checked, the count of viewers too, then a read-only TUI of its own."""
        origin = request.headers.get("Origin", "").rstrip("/").lower()
        if origin not in self.origins():
            raise web.HTTPForbidden(text=f"forbidden: Origin {origin or '(none)'} is not the board's "
                                         "(start it with --origin for another address)\n")
        if len(self._viewers) >= self.max_viewers:
            raise web.HTTPServiceUnavailable(text=f"the board has {self.max_viewers} viewers already "
                                                  "(--max-viewers); try again later\n")
        websocket = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_MESSAGE_BYTES)
        self._viewers.add(websocket)  # before any await: viewers that come together are counted
        service: AppService | None = None
        try:
            await websocket.prepare(request)

            async def close() -> None:
                await websocket.close()

            service = AppService(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                                 close=close, download_manager=self.download_manager)
            self._services.add(service)
            await service.start(_cells(request.query.get("width", ""), 80), _cells(request.query.get("height", ""), 24))
            await self._process_messages(websocket, service)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception:  # a viewer's mistake (a malformed message) ends that viewer only
            log.exception("board viewer failed")
        finally:
            if service is not None:
                await _stop(service, STOP_TIMEOUT_S)
                self._services.discard(service)
            self._viewers.discard(websocket)
        return websocket

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        """textual-serve's, with a ``resize`` bounded to :data:`MAX_CELLS` a side (the browser says the size)."""
        bounded = _BoundedSize(app_service)
        await super()._process_messages(websocket, bounded)  # type: ignore[arg-type]

    async def _close_viewers(self, _app: web.Application) -> None:
        """The board stops: close every viewer (their TUIs are told to quit); kill the TUIs left after
        ``STOPPING_TIMEOUT_S``."""
        closing = [ws.close(code=1001, message=b"the board stops") for ws in self._viewers]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), STOPPING_TIMEOUT_S)
        end = asyncio.get_running_loop().time() + STOPPING_TIMEOUT_S
        while self._services and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(0.05)
        for service in list(self._services):
            _kill(service)

    # ------------------------------------------------------------------ running

    async def start(self) -> None:
        """Listen; :attr:`port` is the bound port afterwards."""
        self._runner = runner = web.AppRunner(await self._make_app(), handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await site.start()
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Close every viewer (their TUIs end) and stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def _stop(service: AppService, timeout_s: float) -> None:
    """End a viewer's TUI: ask it to quit; kill it when it has not ended within ``timeout_s``, or when the
    server stops waiting (its shutdown cancels the handlers that are left)."""
    async def quit_and_wait() -> None:
        await service.stop()  # "quit", then until its output ends
        if service._process is not None:
            await service._process.wait()  # and until it has ended (it closes its output a little before)

    try:
        await asyncio.wait_for(quit_and_wait(), timeout_s)
    except (asyncio.TimeoutError, ConnectionError):
        _kill(service)
    except asyncio.CancelledError:
        _kill(service)
        raise


def _kill(service: AppService) -> None:
    process = service._process  # textual-serve keeps it there; nothing else ends a TUI that hangs
    if process is not None and process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()


async def _private_headers(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Referrer-Policy"] = "no-referrer"  # the page's URL holds the token
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"


MAX_CELLS = 1000
"""The most columns (and rows) of a viewer's terminal: the browser says its size; a huge one would make the
board's machine draw a screen of a billion cells."""


def _cells(value: object, default: int) -> int:
    """A terminal side the browser asked for (a number or its text), within 1 and :data:`MAX_CELLS`."""
    n = value if isinstance(value, int) and not isinstance(value, bool) else _int(str(value), default)
    return max(1, min(MAX_CELLS, n))


class _BoundedSize:
    """An :class:`AppService` whose ``set_terminal_size`` is bounded (the rest passed through)."""

    def __init__(self, service: AppService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> object:
        return getattr(self._service, name)

    async def set_terminal_size(self, width: object, height: object) -> None:
        await self._service.set_terminal_size(_cells(width, 80), _cells(height, 24))


def _int(value: str, default: int) -> int:
    try:
        return int(value)
    except ValueError:
        return default


async def _serve(server: BoardServer, say: Callable[[str], None]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        say(f"gpulayer board (read-only), at most {server.max_viewers} viewers at once; open:\n"
            f"  {server.url()}\n"
            "Anyone with this URL sees the board (devices, jobs, users): share it as a password. Ctrl+C stops it.")
        await stop.wait()
    finally:
        await server.stop()


def run(socket_path: Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
        max_viewers: int = DEFAULT_MAX_VIEWERS, origin: str | None = None,
        say: Callable[[str], None] | None = None) -> None:
    """Serve the read-only board of the daemon at ``socket_path`` until SIGINT, SIGTERM or SIGHUP.

    ``say`` prints the URL (default: to stdout, flushed).

    Raises:
        ValueError: a bad ``max_viewers``, or a wildcard ``host`` without ``origin``.
        OSError: the address cannot be listened on (in use, not this machine's).
    """
    server = BoardServer(socket_path, host=host, port=port, max_viewers=max_viewers, origin=origin)
    asyncio.run(_serve(server, say or (lambda text: print(text, flush=True))))
