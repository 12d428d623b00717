"""The local API: aiohttp on a unix socket (directory 0700, socket 0600; system mode 0755 and 0666), ``/v1/``.

The routes are the route table's :data:`~gpulayerd.routes.LOCAL_ROUTES`: one aiohttp route per
declaration, and a route whose role is not public (``cancel``, ``logs``: the job's user or an
admin) is checked by :meth:`LocalService.async_authorize` before its handler runs. The socket
itself (modes, re-creation) is :mod:`gpulayerd.api.unixsite`. Handlers are thin: they parse
the request, call the daemon's :class:`LocalService` and serialise its pydantic answer. Errors
have a stable body ``{code, message, detail}`` (:class:`gpulayerd.models.ApiErrorBody`).

Who asks comes from the kernel, never from the request: a middleware reads the connecting
process's credentials from the socket (:func:`gpulayerd.app.common.requester.peer_credentials`), asks
the service who that is (:meth:`LocalService.async_requester`, which refuses other accounts
of a personal daemon with 403 ``forbidden``) and keeps the :class:`~gpulayerd.app.common.requester.Requester`
for the handlers (a context variable set around each handler). A connection without peer
credentials (not a unix socket) is refused with 403.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import BaseModel

from gpulayerd import routes
from gpulayerd.api.unixsite import LocalSocket, start_unix_site
from gpulayerd.app.common.feed import Change, ChangeFeed
from gpulayerd.app.common.requester import PeerCredentials, Requester, peer_credentials
from gpulayerd.app.owner.idempotency import REPLAYED_HEADER, Submitted
from gpulayerd.config import read_token
from gpulayerd.core.job_policy import signal_name
from gpulayerd.errors import BadRequest, GpulayerError
from gpulayerd.models import (
    LOG_CHUNK_BYTES,
    ApiErrorBody,
    Capabilities,
    ExplanationModel,
    HealthView,
    JobSpec,
    JobView,
    LogChunk,
    PeerView,
    ReportView,
    RequesterView,
    SpecError,
    SubmitRequest,
    UserUsageView,
)
from gpulayerd.models.jobs_query import MAX_IDS, JobsQuery
from gpulayerd.models.metrics import MetricsView
from gpulayerd.models.snapshots import BlobView, FetchChunk, FetchRequest, SnapshotRequest, SnapshotView
from gpulayerd.store import StoreFull

__all__ = ["PROMETHEUS_TEXT", "ApiError", "LocalService", "LocalSocket", "make_local_app", "metrics_loops",
           "start_unix_site"]

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

    async def async_requester(self, creds: PeerCredentials) -> Requester:
        """Who the connecting process is. Raises Forbidden when this daemon does not serve that account."""
        ...

    async def async_authorize(self, route: routes.Route, requester: Requester, job_ref: str | None) -> None:
        """Return if ``requester`` holds ``route.role`` (for the job ``job_ref`` names); changes nothing.

        Raises:
            Forbidden: the requester does not hold the role.
        """
        ...

    async def async_submit(self, request: SubmitRequest, requester: Requester) -> Submitted:
        """Validate and store a job of ``requester`` (or find the one its key names: ``replayed``).
        Raises SpecError for an invalid spec."""
        ...

    async def async_list_jobs(self, statuses: list[str] | None, limit: int | None,
                              scope: str = "local", requester: Requester | None = None,
                              query: JobsQuery | None = None) -> list[JobView]:
        """Jobs in submission order (without history); ``scope="cluster"`` adds the peers' jobs.

        Every user's jobs; the spec of one that is not ``requester``'s is concealed. ``query``:
        one user's, the latest finished, the last N (it sets ``query.left_out``); the route
        passes it only when asked, so services without it still serve the plain listing.
        """
        ...

    async def async_get_job(self, job_ref: str, requester: Requester | None = None) -> JobView:
        """One job with attempts and history (spec concealed unless ``requester``'s); a unique id prefix works."""
        ...

    async def async_explain(self, job_ref: str, requester: Requester | None = None) -> ExplanationModel:
        """Why the job is where it is: queued, judged against every known worker; otherwise its state.

        A failed job's stderr tail only for ``requester`` if it is the job's user or an admin.
        """
        ...

    async def async_cancel(self, job_ref: str, requester: Requester | None = None, signal: str = "") -> JobView:
        """Cancel a job (queued: at once; running: SIGTERM or ``signal``, grace, SIGKILL). Raises Forbidden: not
        ``requester``'s."""
        ...

    async def async_logs(self, job_ref: str, stream: str, offset: int, attempt: int | None,
                         requester: Requester | None = None, rank: int | None = None,
                         limit: int | None = None) -> LogChunk:
        """A chunk of a job's log from byte ``offset`` (``rank``: a multi-host job's node rank; ``limit``:
        at most that many bytes, None: :data:`~gpulayerd.models.LOG_CHUNK_BYTES`).

        Raises Forbidden: not ``requester``'s; BadRequest: no such rank.
        """
        ...

    async def async_users(self) -> list[UserUsageView]:
        """Fair share: every user known, in priority order, with usage and what each holds now."""
        ...

    async def async_prometheus(self) -> bytes:
        """This daemon in the Prometheus text format."""
        ...

    async def async_report(self, since_s: float, by: str, scope: str) -> ReportView:
        """Accounting over the last ``since_s`` seconds by ``by``; ``scope`` ``lab``: every owner that is up.
        Raises BadRequest: a bad ``by`` or ``since``."""
        ...

    async def async_metrics(self) -> MetricsView:
        """Live GPU metrics of this machine; asking renews the watch that keeps the sampler running."""
        ...

    async def async_snapshot(self, request: SnapshotRequest, requester: Requester) -> SnapshotView:
        """Offer (or commit) a manifest of a shipped workdir. Raises BadRequest: over a cap."""
        ...

    async def async_snapshot_blob(self, requester: Requester, digest: str, offset: int, data: bytes) -> BlobView:
        """A chunk of a content an offer found missing. Raises BadRequest: not offered, wrong offset or hash."""
        ...

    async def async_fetch(self, job_ref: str, request: FetchRequest, requester: Requester) -> FetchChunk:
        """A chunk of the files of a finished attempt of a shipped job owned here (``gpulayer fetch``)."""
        ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS = {"not_found": 404, "ambiguous_id": 400, "bad_request": 400, "invalid_spec": 400, "peer_unreachable": 502,
           "forbidden": 403, "key_conflict": 409}
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
    except StoreFull as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return _error(507, "state_disk_full", "gpulayerd's state disk is full: nothing was stored (free space on "
                      "the disk of its state dir and try again; running jobs go on)")
    except web.HTTPException:
        raise
    except ConnectionResetError as e:  # aiohttp's ClientConnectionResetError too
        transport = request.transport
        if transport is not None and not transport.is_closing():
            log.exception("internal error in %s %s", request.method, request.path)
            return _error(500, "internal", f"internal error: {type(e).__name__}: {e}")
        # The client went away (e.g. it timed out) before the handler read its request: not our fault.
        log.info("%s %s: the client went away before the answer (%s)", request.method, request.path, e)
        return _error(400, "client_gone", "the client closed the connection")
    except Exception as e:
        log.exception("internal error in %s %s", request.method, request.path)
        return _error(500, "internal", f"internal error: {type(e).__name__}: {e}")


def _who_asks(service: LocalService) -> Middleware:
    """The middleware that puts the kernel's answer to "who is asking" where the handlers find it."""

    @web.middleware
    async def who(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        creds = peer_credentials(None if transport is None else transport.get_extra_info("socket"))
        if creds is None:
            raise ApiError(403, "forbidden", "cannot tell who is asking: the local API answers only on its "
                           "unix socket, where the kernel names the connecting user")
        token = _REQUESTER.set(await service.async_requester(creds))
        try:
            return await handler(request)
        finally:
            _REQUESTER.reset(token)

    return who


_REQUESTER: contextvars.ContextVar[Requester] = contextvars.ContextVar("gpulayerd_requester")
"""The requester of the request being handled (set by :func:`_who_asks` around the handler, in its task)."""


def _requester(_: web.Request) -> Requester:
    return _REQUESTER.get()


def make_local_app(service: LocalService, events_keepalive_s: float = 15.0) -> web.Application:
    """The aiohttp application of the local API, bound to ``service``.

    Args:
        service: the daemon's side of the API.
        events_keepalive_s: seconds between keep-alive comments on an idle ``/v1/events`` stream
            (they also notice a client that went away).
    """
    app = web.Application(middlewares=[_errors, _who_asks(service)], client_max_size=4 * 2**20)
    closing = asyncio.Event()

    async def health(request: web.Request) -> web.Response:
        asker = _requester(request)  # the kernel's answer, never the request's
        you = RequesterView(uid=asker.uid, user=asker.user, admin=asker.admin)
        return _json(service.health().model_copy(update={"requester": you}))

    async def devices(_: web.Request) -> web.Response:
        return _json(await service.async_capabilities())

    async def peers(_: web.Request) -> web.Response:
        return _json(await service.async_peers())

    async def submit(request: web.Request) -> web.Response:
        try:
            body = SubmitRequest.model_validate_json(await request.read())
        except ValueError as e:
            raise ApiError(400, "bad_request", f"invalid request body: {e}") from e
        submitted = await service.async_submit(body, _requester(request))
        if submitted.replayed:  # the key's job, stored before (gpulayerd.app.owner.idempotency)
            resp = _json(submitted.job, status=200)
            resp.headers[REPLAYED_HEADER] = "true"
            return resp
        return _json(submitted.job, status=201)

    async def list_jobs(request: web.Request) -> web.Response:
        # ?state= (or status=, repeatable or comma-separated) &user= &finished=N (the N latest
        # finished jobs, every other kept) &limit=N (the N latest) &fields=id,status,spec.user
        # (only these of each job; absent: all) &ids=a,b (only these jobs, at most MAX_IDS, each
        # as the listing shows it; unknown ids left out). Header X-Gpulayer-Left-Out: how many
        # jobs finished/limit left out.
        q = request.query
        statuses = [s for v in [*q.getall("status", []), *q.getall("state", [])] for s in v.split(",") if s] or None
        limit = _int_param(request, "limit", None)
        scope = q.get("scope", "local")
        if scope not in ("local", "cluster"):
            raise ApiError(400, "bad_request", "scope must be one of: local, cluster")
        include = _fields_param(q.get("fields"))
        user, finished = q.get("user"), _int_param(request, "finished", None)
        ids = _ids_param(q.getall("ids", []))
        if user is None and finished is None and include is None and ids is None:
            jobs = await service.async_list_jobs(statuses, limit, scope, _requester(request))
            left_out = 0
        else:
            query = JobsQuery(ids=ids, user=user, finished=finished, limit=limit,
                              explanations=include is None or "explanation" in include)
            jobs = await service.async_list_jobs(statuses, None, scope, _requester(request), query=query)
            left_out = query.left_out
        headers = {"X-Gpulayer-Left-Out": str(left_out)}
        if include is None:
            resp = _json(jobs)
            resp.headers.update(headers)
            return resp
        body = "[" + ",".join(j.model_dump_json(include=include) for j in jobs) + "]"
        return web.Response(text=body, content_type="application/json", headers=headers)

    async def get_job(request: web.Request) -> web.Response:
        return _json(await service.async_get_job(request.match_info["job"], _requester(request)))

    async def explain(request: web.Request) -> web.Response:
        return _json(await service.async_explain(request.match_info["job"], _requester(request)))

    async def cancel(request: web.Request) -> web.Response:
        first = request.query.get("signal", "")
        if first:
            try:
                first = signal_name(first)
            except ValueError as e:
                raise BadRequest(f"signal: {e}") from e
        return _json(await service.async_cancel(request.match_info["job"], _requester(request), first))

    async def logs(request: web.Request) -> web.Response:
        stream = request.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise ApiError(400, "bad_request", "stream must be one of: stdout, stderr")
        offset = _int_param(request, "offset", 0) or 0
        attempt = _int_param(request, "attempt", None)
        rank = _int_param(request, "rank", None)
        extra: dict[str, int] = {}  # only what was asked: services from before ranks take no ``rank``
        if rank is not None:
            extra["rank"] = rank
        if "limit" in request.query:
            extra["limit"] = _log_limit(request.query["limit"])
        return _json(await service.async_logs(request.match_info["job"], stream, offset, attempt,
                                              _requester(request), **extra))

    async def snapshot(request: web.Request) -> web.Response:
        try:
            body = SnapshotRequest.model_validate_json(await request.read())
        except ValueError as e:
            raise ApiError(400, "bad_request", f"invalid snapshot request: {e}") from e
        return _json(await service.async_snapshot(body, _requester(request)))

    async def fetch(request: web.Request) -> web.Response:
        try:
            body = FetchRequest.model_validate_json(await request.read())
        except ValueError as e:
            raise ApiError(400, "bad_request", f"invalid fetch request: {e}") from e
        return _json(await service.async_fetch(request.match_info["job"], body, _requester(request)))

    async def snapshot_blob(request: web.Request) -> web.Response:
        digest = request.query.get("digest", "")
        offset = _int_param(request, "offset", 0) or 0
        return _json(await service.async_snapshot_blob(_requester(request), digest, offset, await request.read()))

    async def users(_: web.Request) -> web.Response:
        return _json(await service.async_users())

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(body=await service.async_prometheus(),
                            headers={"Content-Type": PROMETHEUS_TEXT})

    async def report(request: web.Request) -> web.Response:
        scope = request.query.get("scope", "daemon")
        if scope not in ("daemon", "lab"):
            raise ApiError(400, "bad_request", f"scope must be daemon or lab, got {scope!r}")
        since = _int_param(request, "since", 30 * 86400) or 0
        return _json(await service.async_report(float(since), request.query.get("by", "user"), scope))

    async def metrics(_: web.Request) -> web.Response:
        return _json(await service.async_metrics())

    async def events(request: web.Request) -> web.StreamResponse:
        # Server-sent events: the first is always ``resync`` (the subscription is live: read
        # the full state now), then one per change until the client or the daemon goes away;
        # a change still waiting to be sent is not sent twice (the feed coalesces).
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        async with service.feed.subscribe() as subscription:
            closed = asyncio.ensure_future(closing.wait())
            got: asyncio.Future[list[Change]] | None = None
            try:
                await resp.write(_sse(Change("resync")))
                while True:
                    if got is None:
                        got = asyncio.ensure_future(subscription.take())
                    done, _ = await asyncio.wait((got, closed), timeout=events_keepalive_s,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if closed in done:
                        break
                    if got in done:
                        changes, got = got.result(), None
                        await resp.write(b"".join(_sse(c) for c in changes))  # a burst: one write
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
    handlers: dict[str, Handler] = {
        "health": health, "devices": devices, "peers": peers, "users": users, "metrics": metrics, "events": events,
        "submit": submit, "jobs": list_jobs, "job": get_job, "explain": explain, "cancel": cancel, "logs": logs,
        "snapshot": snapshot, "snapshot_blob": snapshot_blob, "fetch": fetch, "report": report,
        "prometheus": prometheus,
    }
    if set(handlers) != set(routes.LOCAL):  # pragma: no cover - the table and the server must agree
        raise RuntimeError(f"local routes without a handler: {sorted(set(routes.LOCAL) ^ set(handlers))}")
    for route in routes.LOCAL_ROUTES:
        app.router.add_route(route.method, route.path, _guarded(service, route, handlers[route.name]))
    return app


def _guarded(service: LocalService, route: routes.Route, handler: Handler) -> Handler:
    """``handler`` behind the route's role check (public routes: the handler itself)."""
    if route.role.public:
        return handler

    async def checked(request: web.Request) -> web.StreamResponse:
        await service.async_authorize(route, _requester(request), request.match_info.get("job"))
        return await handler(request)
    return checked


def _sse(change: Change) -> bytes:
    data = json.dumps({"kind": change.kind, "key": change.key}, separators=(",", ":"))
    return f"event: {change.kind}\ndata: {data}\n\n".encode()


_JOB_FIELDS = frozenset([*JobView.model_fields, *JobView.model_computed_fields])
_SPEC_FIELDS = frozenset(JobSpec.model_fields)


def _fields_param(raw: str | None) -> dict[str, Any] | None:
    """``fields=id,status,spec.user`` as pydantic's ``include`` (``id`` always); None when absent.

    Raises:
        ApiError: 400 naming an unknown field and the known ones.
    """
    if raw is None:
        return None
    include: dict[str, Any] = {"id": True}
    for name in (n.strip() for n in raw.split(",")):
        if not name:
            continue
        top, _, sub = name.partition(".")
        if top not in _JOB_FIELDS or (sub and (top != "spec" or sub not in _SPEC_FIELDS)):
            raise ApiError(400, "bad_request", f"fields: unknown field {name!r}; fields: "
                           f"{', '.join(sorted(_JOB_FIELDS))}, spec.<{'|'.join(sorted(_SPEC_FIELDS))}>")
        if not sub:
            include[top] = True
        elif include.get(top) is not True:
            include.setdefault(top, {})[sub] = True
    return include


def _log_limit(raw: str) -> int:
    """A log read's ``limit``: 1 to :data:`LOG_CHUNK_BYTES` bytes. Raises ApiError (400) naming the field."""
    try:
        value = int(raw)
    except ValueError as e:
        raise ApiError(400, "bad_request", f"limit must be an integer number of bytes, got {raw!r}") from e
    if not 1 <= value <= LOG_CHUNK_BYTES:
        raise ApiError(400, "bad_request", f"limit must be 1 to {LOG_CHUNK_BYTES} bytes, got {value}")
    return value


def _ids_param(values: list[str]) -> frozenset[str] | None:
    """``ids=a,b&ids=c`` as a set of job ids; None when absent (an empty value names no job).

    Raises:
        ApiError: 400 when it names more than :data:`MAX_IDS` jobs.
    """
    if not values:
        return None
    ids = frozenset(i for v in values for i in v.split(",") if i)
    if len(ids) > MAX_IDS:
        raise ApiError(400, "bad_request", f"ids: at most {MAX_IDS} job ids per request, got {len(ids)}")
    return ids


def metrics_loops(listen: str | None, token_file: Path | None,
                  render: Callable[[], Awaitable[bytes]]) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
    """The Prometheus TCP listener as a daemon loop when ``listen`` (``HOST:PORT``, ``metrics_listen``) is
    set: ``GET /metrics`` answered with ``render()`` for a request with ``Authorization: Bearer <token>``
    (the token of ``token_file``, read when the loop starts), 401 without; nothing else is served."""
    if listen is None or token_file is None:
        return []
    host, _, port = listen.rpartition(":")
    file = token_file

    async def serve() -> None:
        expected = f"Bearer {read_token(file)}".encode()

        async def metrics(request: web.Request) -> web.Response:
            if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
                return web.Response(status=401, text="a bearer token is required\n",
                                    headers={"WWW-Authenticate": "Bearer"})
            return web.Response(body=await render(), headers={"Content-Type": PROMETHEUS_TEXT})

        app = web.Application(client_max_size=1024)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host.strip("[]"), int(port))
            await site.start()
            log.info("metrics: GET /metrics on %s (a bearer token is needed)", site.name)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    return [("metrics-tcp", serve)]


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


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
