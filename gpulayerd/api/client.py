"""Async client of the local API, used by the CLI and the TUI.

Only talks to the local daemon over its unix socket. Errors: :class:`DaemonUnreachable`
when nothing answers on the socket, :class:`ApiRequestError` for an error reply (with
the API's stable ``code``).
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from gpulayerd import routes
from gpulayerd.models import (
    ApiErrorBody,
    Capabilities,
    ExplanationModel,
    HealthView,
    JobView,
    LogChunk,
    PeerView,
    ReportView,
    SubmitRequest,
    UserUsageView,
)
from gpulayerd.models.metrics import MetricsView
from gpulayerd.models.snapshots import BlobView, FetchChunk, FetchRequest, Manifest, SnapshotRequest, SnapshotView
from gpulayerd.text import escape, http_error

__all__ = ["ApiRequestError", "ChangeEvent", "DaemonClient", "DaemonUnreachable", "connection_problem"]

_JOBS = TypeAdapter(list[JobView])
_PEERS = TypeAdapter(list[PeerView])
_USERS = TypeAdapter(list[UserUsageView])


class DaemonUnreachable(Exception):
    """Nothing answers on the daemon's socket, or the connection broke (``cause``: what happened, in words)."""

    def __init__(self, socket_path: Path, cause: str) -> None:
        super().__init__(f"cannot reach gpulayerd at {socket_path}: {cause}")
        self.socket_path = socket_path
        self.cause = cause


def connection_problem(e: BaseException) -> str:
    """What went wrong with a connection to the daemon, in words ("the daemon closed the connection"),
    never a Python repr such as ``<TransferEncodingError: 400, …>``; control characters escaped.

    Args:
        e: what aiohttp (or the socket) raised: a connect failure, a connection broken before or
            during an answer, a timeout; anything else is named by its type and message.
    """
    if isinstance(e, DaemonUnreachable):
        return e.cause
    if isinstance(e, aiohttp.ClientConnectorError):
        return _connect_failure(e.os_error)
    if isinstance(e, aiohttp.ClientPayloadError):  # TransferEncodingError, ContentLengthError: cut short
        return "the daemon closed the connection in the middle of an answer"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the daemon closed the connection"
    if isinstance(e, TimeoutError):  # aiohttp's ServerTimeoutError too
        return "no answer in time (the daemon is overloaded or stopped)"
    if isinstance(e, OSError) and e.errno is not None:  # aiohttp's ClientOSError too
        if e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
            return "the daemon closed the connection"
        return escape((e.strerror or str(e)).lower())
    if isinstance(e, aiohttp.ClientConnectionError):
        return escape(f"the connection broke ({str(e) or type(e).__name__})")
    return escape(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def _connect_failure(e: OSError) -> str:
    """Why connecting to the socket failed (no file system check: this runs on the event loop)."""
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return "no such file (is gpulayerd running?)"
    if e.errno == errno.ECONNREFUSED:
        return "connection refused: nothing listens on it (a daemon that died leaves its socket behind)"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the socket or its folder keeps this user out)"
    return escape((e.strerror or str(e)).lower())


class ApiRequestError(Exception):
    """The daemon answered with an error."""

    def __init__(self, status: int, body: ApiErrorBody) -> None:
        super().__init__(body.message)
        self.status = status
        self.code = body.code
        self.body = body


class ChangeEvent(BaseModel):
    """One server-sent event of ``GET /v1/events``.

    Attributes:
        kind: ``job`` (``key`` is the job id), ``devices``, ``peers``, or ``resync`` (re-read
            everything; always the first event of a stream).
        key: the job id for ``job``, else empty.
    """

    model_config = ConfigDict(extra="ignore")

    kind: str
    key: str = ""


class DaemonClient:
    """A connection to the local gpulayerd. Use as ``async with DaemonClient(path) as c:``."""

    def __init__(self, socket_path: Path, timeout_s: float = 30.0) -> None:
        self.socket_path = socket_path
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DaemonClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.socket_path)), timeout=self._timeout
            )
        return self._session

    async def _request(self, method: str, path: str, body: BaseModel | None = None,
                       params: dict[str, Any] | list[tuple[str, str]] | None = None,
                       raw: bytes | None = None) -> bytes:
        data: str | bytes | None = raw if raw is not None else None if body is None else body.model_dump_json()
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self._http().request(method, f"http://gpulayerd{path}", data=data, headers=headers,
                                            params=params) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    try:
                        err = ApiErrorBody.model_validate_json(raw)
                    except ValidationError:
                        err = ApiErrorBody(code="http_error", message=http_error(resp.status, raw))
                    raise ApiRequestError(resp.status, err)
                return raw
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise DaemonUnreachable(self.socket_path, connection_problem(e)) from e

    async def _call(self, name: str, job_ref: str = "", body: BaseModel | None = None,
                    params: dict[str, Any] | list[tuple[str, str]] | None = None) -> bytes:
        """Local route ``name`` of :data:`gpulayerd.routes.LOCAL_ROUTES` (``job_ref`` fills ``{job}``)."""
        return await self._request(routes.LOCAL[name].method, routes.local_path(name, quote(job_ref, safe="")), body,
                                   params=params)

    async def health(self) -> HealthView:
        """``GET /v1/health``."""
        return HealthView.model_validate_json(await self._call("health"))

    async def devices(self) -> Capabilities:
        """``GET /v1/devices``: this machine's capabilities with grant state."""
        return Capabilities.model_validate_json(await self._call("devices"))

    async def peers(self) -> list[PeerView]:
        """``GET /v1/peers``: every gpulayerd known, this one first, with capabilities."""
        return _PEERS.validate_json(await self._call("peers"))

    async def users(self) -> list[UserUsageView]:
        """``GET /v1/users``: fair share, every user known in priority order, with what each holds now."""
        return _USERS.validate_json(await self._call("users"))

    async def report(self, since_s: float, by: str = "user", scope: str = "daemon") -> ReportView:
        """``GET /v1/report``: accounting over the last ``since_s`` seconds (whole seconds), by ``user``,
        ``host`` or ``gpu-model``; ``scope`` ``daemon`` (this daemon's jobs) or ``lab`` (every owner up)."""
        params = [("since", str(int(since_s))), ("by", by), ("scope", scope)]
        return ReportView.model_validate_json(await self._call("report", params=params))

    async def prometheus(self) -> str:
        """``GET /metrics``: this daemon in the Prometheus text format."""
        return (await self._call("prometheus")).decode("utf-8")

    async def metrics(self) -> MetricsView:
        """``GET /v1/metrics``: this machine's GPUs now (utilisation, memory, temperature, power,
        processes). Each call keeps the daemon's sampler running a few seconds more: poll it
        while the metrics are shown, stop when they are not."""
        return MetricsView.model_validate_json(await self._call("metrics"))

    async def submit(self, spec: dict[str, Any], submitted_by: str = "", path: str = "") -> JobView:
        """``POST /v1/jobs``; the spec as a mapping (TOML or flags, workdir resolved).

        Args:
            spec: the job spec.
            submitted_by: ignored by the daemon (it takes the user from the kernel); kept for old callers.
            path: the submitter's ``PATH``, which the job runs with (empty: the daemon's safe default).
        """
        req = SubmitRequest(spec=spec, submitted_by=submitted_by, path=path)
        return JobView.model_validate_json(await self._call("submit", body=req))

    async def snapshot(self, manifest: Manifest, commit: bool = False) -> SnapshotView:
        """``POST /v1/snapshots``: offer (or commit) a shipped workdir's manifest (see ``gpulayer submit --ship``)."""
        return SnapshotView.model_validate_json(await self._call("snapshot", body=SnapshotRequest(
            manifest=manifest, commit=commit)))

    async def snapshot_blob(self, digest: str, offset: int, data: bytes) -> BlobView:
        """``POST /v1/snapshots/blobs``: a chunk (at most 1 MiB) of a content an offer found missing."""
        r = routes.LOCAL["snapshot_blob"]
        return BlobView.model_validate_json(await self._request(r.method, r.path, params=[
            ("digest", digest), ("offset", str(offset))], raw=data))

    async def fetch(self, job_ref: str, patterns: list[str] | None = None, offset: int = 0,
                    attempt: int | None = None) -> FetchChunk:
        """``POST /v1/jobs/{id}/fetch``: a chunk of the files of a finished attempt of a shipped job."""
        return FetchChunk.model_validate_json(await self._call("fetch", job_ref, body=FetchRequest(
            attempt=attempt, patterns=patterns or [], offset=offset)))

    async def jobs(self, statuses: list[str] | None = None, limit: int | None = None,
                   scope: str = "local", ids: Collection[str] | None = None) -> list[JobView]:
        """``GET /v1/jobs``, in submission order; ``scope="cluster"`` includes the peers' jobs.

        Args:
            ids: only these jobs (at most :data:`~gpulayerd.models.jobs_query.MAX_IDS`), each as
                the listing shows it; a job the listing does not show (gone) is left out. An
                empty collection answers ``[]`` without asking.

        Raises:
            ApiRequestError: 400 for more than ``MAX_IDS`` ids.
        """
        if ids is not None and not ids:
            return []
        params: list[tuple[str, str]] = [("status", s) for s in statuses or []]
        if limit is not None:
            params.append(("limit", str(limit)))
        if scope != "local":
            params.append(("scope", scope))
        if ids is not None:
            params.append(("ids", ",".join(ids)))
        return _JOBS.validate_json(await self._call("jobs", params=params))

    async def job(self, job_ref: str) -> JobView:
        """``GET /v1/jobs/{id}`` (a unique id prefix works)."""
        return JobView.model_validate_json(await self._call("job", job_ref))

    async def explain(self, job_ref: str) -> ExplanationModel:
        """``GET /v1/jobs/{id}/explain``."""
        return ExplanationModel.model_validate_json(await self._call("explain", job_ref))

    async def cancel(self, job_ref: str) -> JobView:
        """``POST /v1/jobs/{id}/cancel``."""
        return JobView.model_validate_json(await self._call("cancel", job_ref))

    async def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0,
                   attempt: int | None = None, rank: int | None = None, limit: int | None = None) -> LogChunk:
        """``GET /v1/jobs/{id}/logs``: text from byte ``offset`` (``rank``: a multi-host job's node rank;
        ``limit``: at most that many bytes, 1 to :data:`~gpulayerd.models.LOG_CHUNK_BYTES`; None: up to
        that). A daemon from before ``limit`` ignores it and may send more; ``size`` says how long the
        log is (None from a daemon from before ``size``)."""
        params = {"stream": stream, "offset": str(offset)}
        if limit is not None:
            params["limit"] = str(limit)
        if attempt is not None:
            params["attempt"] = str(attempt)
        if rank is not None:
            params["rank"] = str(rank)
        raw = await self._call("logs", job_ref, params=params)
        return LogChunk.model_validate_json(raw)

    async def events(self) -> AsyncIterator[ChangeEvent]:
        """``GET /v1/events``: what changed, as it happens, until the daemon closes the stream.

        The first event is always ``resync``. Close the iterator (``contextlib.aclosing``)
        to hang up early.

        Raises:
            DaemonUnreachable: nothing answers, or the connection broke mid-stream.
            ApiRequestError: the daemon answered with an error.
        """
        no_read_timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total)
        try:
            url = "http://gpulayerd" + routes.local_path("events")
            async with self._http().get(url, timeout=no_read_timeout) as resp:
                if resp.status >= 400:
                    raw = await resp.read()
                    try:
                        err = ApiErrorBody.model_validate_json(raw)
                    except ValidationError:
                        err = ApiErrorBody(code="http_error", message=http_error(resp.status, raw))
                    raise ApiRequestError(resp.status, err)
                event, data = "", ""
                async for raw_line in resp.content:
                    line = raw_line.decode("utf-8", errors="replace").rstrip("\r\n")
                    if line:
                        name, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if name == "event":
                            event = value
                        elif name == "data":
                            data = value if not data else f"{data}\n{value}"
                        continue
                    change = _change_event(event, data)
                    event, data = "", ""
                    if change is not None:
                        yield change
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise DaemonUnreachable(self.socket_path, connection_problem(e)) from e


def _change_event(event: str, data: str) -> ChangeEvent | None:
    """The event of one SSE block; None for a comment-only block or data this client cannot read."""
    if not data:
        return ChangeEvent(kind=event) if event else None
    try:
        return ChangeEvent.model_validate_json(data)
    except ValidationError:
        return None
