"""The local API: aiohttp on a unix socket (directory 0700, socket 0600), ``/v1/``.

Handlers are thin: they parse the request, call the daemon's :class:`LocalService`
and serialise its pydantic answer. Errors have a stable body
``{code, message, detail}`` (:class:`gpulayerd.models.ApiErrorBody`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel

from gpulayerd.errors import GpulayerError
from gpulayerd.feed import Change, ChangeFeed
from gpulayerd.models import (
    ApiErrorBody,
    Capabilities,
    ExplanationModel,
    HealthView,
    JobView,
    LogChunk,
    PeerView,
    SpecError,
    SubmitRequest,
)
from gpulayerd.privdirs import make_private_dirs

__all__ = ["ApiError", "LocalService", "make_local_app", "start_unix_site"]

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the API reports with a status and a stable code."""

    def __init__(self, status: int, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}


class LocalService(Protocol):
    """What the local API needs from the daemon."""

    @property
    def feed(self) -> ChangeFeed:
        """What changed, for ``GET /v1/events``."""
        ...

    def health(self) -> HealthView:
        """Liveness and identity."""
        ...

    async def async_capabilities(self) -> Capabilities:
        """This machine's devices (with grant state), environments and probe health."""
        ...

    async def async_peers(self) -> list[PeerView]:
        """Every gpulayerd known (this one first), with their capabilities."""
        ...

    async def async_submit(self, request: SubmitRequest) -> JobView:
        """Validate and store a job. Raises SpecError for an invalid spec."""
        ...

    async def async_list_jobs(self, statuses: list[str] | None, limit: int | None,
                              scope: str = "local") -> list[JobView]:
        """Jobs in submission order (without history); ``scope="cluster"`` adds the peers' jobs."""
        ...

    async def async_get_job(self, job_ref: str) -> JobView:
        """One job with attempts and history; ``job_ref`` may be a unique id prefix."""
        ...

    async def async_explain(self, job_ref: str) -> ExplanationModel:
        """A fresh explanation of the job against every known worker."""
        ...

    async def async_cancel(self, job_ref: str) -> JobView:
        """Cancel a job (queued: at once; running: SIGTERM, grace, SIGKILL)."""
        ...

    async def async_logs(self, job_ref: str, stream: str, offset: int, attempt: int | None) -> LogChunk:
        """A chunk of a job's log from byte ``offset``."""
        ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS = {"not_found": 404, "ambiguous_id": 400, "bad_request": 400, "invalid_spec": 400, "peer_unreachable": 502}
"""HTTP status of each domain error code (:mod:`gpulayerd.errors`)."""

MAX_LIMIT = 100_000


def _json(model: BaseModel | list[Any], status: int = 200) -> web.Response:
    if isinstance(model, list):
        body = "[" + ",".join(m.model_dump_json() for m in model) + "]"
    else:
        body = model.model_dump_json()
    return web.Response(text=body, status=status, content_type="application/json")


def _error(status: int, code: str, message: str, detail: dict[str, Any] | None = None) -> web.Response:
    return _json(ApiErrorBody(code=code, message=message, detail=detail or {}), status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return _error(e.status, e.code, e.message, e.detail)
    except GpulayerError as e:
        return _error(_STATUS.get(e.code, 400), e.code, e.message)
    except SpecError as e:
        return _error(400, "invalid_spec", str(e))
    except web.HTTPException:
        raise
    except Exception as e:
        log.exception("internal error in %s %s", request.method, request.path)
        return _error(500, "internal", f"internal error: {type(e).__name__}: {e}")


def make_local_app(service: LocalService, events_keepalive_s: float = 15.0) -> web.Application:
    """The aiohttp application of the local API, bound to ``service``.

    Args:
        service: the daemon's side of the API.
        events_keepalive_s: seconds between keep-alive comments on an idle ``/v1/events`` stream
            (they also notice a client that went away).
    """
    app = web.Application(middlewares=[_errors], client_max_size=4 * 2**20)
    closing = asyncio.Event()

    async def health(_: web.Request) -> web.Response:
        return _json(service.health())

    async def devices(_: web.Request) -> web.Response:
        return _json(await service.async_capabilities())

    async def peers(_: web.Request) -> web.Response:
        return _json(await service.async_peers())

    async def submit(request: web.Request) -> web.Response:
        try:
            body = SubmitRequest.model_validate_json(await request.read())
        except ValueError as e:
            raise ApiError(400, "bad_request", f"invalid request body: {e}") from e
        return _json(await service.async_submit(body), status=201)

    async def list_jobs(request: web.Request) -> web.Response:
        statuses = request.query.getall("status", []) or None
        limit = _int_param(request, "limit", None)
        scope = request.query.get("scope", "local")
        if scope not in ("local", "cluster"):
            raise ApiError(400, "bad_request", "scope must be one of: local, cluster")
        return _json(await service.async_list_jobs(statuses, limit, scope))

    async def get_job(request: web.Request) -> web.Response:
        return _json(await service.async_get_job(request.match_info["job"]))

    async def explain(request: web.Request) -> web.Response:
        return _json(await service.async_explain(request.match_info["job"]))

    async def cancel(request: web.Request) -> web.Response:
        return _json(await service.async_cancel(request.match_info["job"]))

    async def logs(request: web.Request) -> web.Response:
        stream = request.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise ApiError(400, "bad_request", "stream must be one of: stdout, stderr")
        offset = _int_param(request, "offset", 0) or 0
        attempt = _int_param(request, "attempt", None)
        return _json(await service.async_logs(request.match_info["job"], stream, offset, attempt))

    async def events(request: web.Request) -> web.StreamResponse:
        # Server-sent events: the first is always ``resync`` (the subscription is live: read
        # the full state now), then one per change until the client or the daemon goes away.
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        async with service.feed.subscribe() as queue:
            closed = asyncio.ensure_future(closing.wait())
            got: asyncio.Future[Change] | None = None
            try:
                await resp.write(_sse(Change("resync")))
                while True:
                    if got is None:
                        got = asyncio.ensure_future(queue.get())
                    done, _ = await asyncio.wait((got, closed), timeout=events_keepalive_s,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if closed in done:
                        break
                    if got in done:
                        change, got = got.result(), None
                        await resp.write(_sse(change))
                    else:
                        await resp.write(b": keep-alive\n\n")
            except ConnectionError:
                pass  # the client went away
            finally:
                closed.cancel()
                if got is not None:
                    got.cancel()
        return resp

    async def close_event_streams(_: web.Application) -> None:
        closing.set()

    app.on_shutdown.append(close_event_streams)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/devices", devices)
    app.router.add_get("/v1/peers", peers)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{job}", get_job)
    app.router.add_get("/v1/jobs/{job}/explain", explain)
    app.router.add_post("/v1/jobs/{job}/cancel", cancel)
    app.router.add_get("/v1/jobs/{job}/logs", logs)
    app.router.add_get("/v1/events", events)
    return app


def _sse(change: Change) -> bytes:
    data = json.dumps({"kind": change.kind, "key": change.key}, separators=(",", ":"))
    return f"event: {change.kind}\ndata: {data}\n\n".encode()


def _int_param(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise ApiError(400, "bad_request", f"{name} must be an integer, got {raw!r}") from e
    if value < 0 or value > (MAX_LIMIT if name == "limit" else 2**62):
        raise ApiError(400, "bad_request", f"{name} out of range: {value}")
    return value


def _answers(socket_path: Path) -> bool:
    """True if something accepts connections on the unix socket."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(socket_path))
        except OSError:
            return False
    return True


def _clear_socket_path(socket_path: Path) -> None:
    """Make the socket's directory (0700) and remove a stale socket. Blocking: call in a thread.

    Raises:
        UnsafeDirectory: the directory is another account's or world-writable (left unchanged).
        OSError: the path is not a socket, or another daemon answers on it.
    """
    make_private_dirs([socket_path.parent])
    if socket_path.exists() or socket_path.is_symlink():
        if not stat.S_ISSOCK(socket_path.lstat().st_mode):
            raise OSError(f"{socket_path} exists and is not a socket")
        if _answers(socket_path):
            raise OSError(f"another gpulayerd serves on {socket_path}")
        socket_path.unlink()  # left behind by a daemon that died


async def start_unix_site(app: web.Application, socket_path: Path) -> web.AppRunner:
    """Serve ``app`` on ``socket_path``: directory 0700, socket 0600, stale socket replaced.

    Returns:
        The runner; ``await runner.cleanup()`` stops serving and removes the socket.
    """
    await asyncio.to_thread(_clear_socket_path, socket_path)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    old_umask = os.umask(0o177)
    try:
        site = web.UnixSite(runner, str(socket_path))
        await site.start()
    finally:
        os.umask(old_umask)
    await asyncio.to_thread(os.chmod, socket_path, 0o600)
    return runner
