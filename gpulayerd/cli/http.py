"""The CLI's synchronous client of the local API: HTTP/1.1 over the daemon's unix socket, stdlib only.

A ``gpulayer`` command makes one or a few requests and exits, so it needs no event loop: this
module imports no aiohttp, pydantic or asyncio (a CLI process starts in a few ms more than
``python -c pass``). JSON in, JSON out: answers are decoded into :class:`Record` (a dict whose
keys also read as attributes, nested too), so the CLI's renderers read ``job.status`` as they
read the API's pydantic views; a command that needs the models themselves validates the
decoded JSON with them (imported then).

Which socket (:func:`socket_path`: the global flags, then the personal daemon's, then the system
one) and one call per command with its errors turned into the CLI's (:func:`call_daemon`) are
here too. The asynchronous client (:mod:`gpulayerd.api.client`) stays the TUI's and the tests'.

Errors: :class:`DaemonUnreachable` (no socket, nothing listening, the connection broke),
:class:`DaemonTimeout` (no answer within the timeout: env ``GPULAYER_TIMEOUT``, seconds,
default 30), :class:`ApiRequestError` (an error reply, with the API's stable ``code``).
"""

from __future__ import annotations

import _socket  # the C module: `socket` adds ~3 ms (its enums, selectors) to every CLI start
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote, urlencode

from gpulayerd.cli.exits import CommandFailed, UsageError
from gpulayerd.routes import LOCAL, local_path

TYPE_CHECKING = False  # `typing` costs ~2 ms of every CLI start; mypy reads this name as true
if TYPE_CHECKING:
    import argparse
    from typing import Any, TypeVar

    _T = TypeVar("_T")

__all__ = ["DEFAULT_TIMEOUT_S", "ApiRequestError", "BadTimeout", "DaemonTimeout", "DaemonUnreachable", "Record",
           "SyncClient", "call_daemon", "env_path", "socket_path", "timeout_from_env", "try_daemon"]

DEFAULT_TIMEOUT_S = 30.0
"""Seconds a CLI request waits for the daemon's answer (env ``GPULAYER_TIMEOUT``)."""


class BadTimeout(ValueError):
    """Env ``GPULAYER_TIMEOUT`` is set to something that is not a positive number of seconds."""


def timeout_from_env() -> float:
    """The request timeout in seconds: env ``GPULAYER_TIMEOUT`` (a number of seconds, more than 0
    and less than 10^6), 30 when it is unset or empty.

    Raises:
        BadTimeout: any other value (``abc``, ``0``, ``-1``, ``nan``), naming the variable and
            what it accepts: a typo must not silently mean 30 s.
    """
    raw = os.environ.get("GPULAYER_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1e6:  # nan fails too
        raise BadTimeout(f"GPULAYER_TIMEOUT={raw!r} is not a number of seconds: give one above 0 and below "
                         "1000000, e.g. 60 or 2.5 (unset: 30)")
    return value


class DaemonUnreachable(Exception):
    """Nothing answers on the daemon's socket (or the connection broke before the answer)."""

    def __init__(self, socket_path: str, cause: str) -> None:
        super().__init__(f"cannot reach gpulayerd at {socket_path}: {cause}")
        self.socket_path = socket_path


class DaemonTimeout(Exception):
    """The daemon accepted the connection but did not answer within ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"gpulayerd did not answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


class ApiRequestError(Exception):
    """The daemon answered with an error: HTTP ``status``, the API's ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Record(dict[str, "Any"]):  # quoted: typing is not imported at run time
    """A decoded JSON object whose keys read as attributes too (``job.status``); a missing key
    raises AttributeError. Nested objects are Records as well (``json.loads(object_hook=Record)``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _Disconnected(Exception):
    """The daemon closed a kept-alive connection before answering (a GET is sent again on a new one)."""


class SyncClient:
    """One keep-alive HTTP/1.1 connection to the local gpulayerd; methods mirror
    :class:`gpulayerd.api.client.DaemonClient`.

    Use as ``with SyncClient(path) as c:``. Every method returns the decoded JSON answer
    (:class:`Record` or a list of them) and raises the errors of the module docstring. The HTTP
    is written here (a request line, headers, a ``Content-Length`` or chunked body): the stdlib's
    ``http.client`` costs 15-20 ms of imports (``email.parser``) at every CLI start.
    """

    def __init__(self, socket_path: str | os.PathLike[str], timeout_s: float | None = None) -> None:
        self.socket_path = os.fspath(socket_path)
        self.timeout_s = timeout_from_env() if timeout_s is None else timeout_s
        self._sock: _socket.socket | None = None
        self._buf = b""
        self._headers: dict[str, str] = {}

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""

    def header(self, name: str) -> str | None:
        """A header of the last answer (any case), or None."""
        return self._headers.get(name.lower())

    def request(self, method: str, path: str, body: object = None,
                params: Sequence[tuple[str, str]] | None = None, raw_body: bytes | None = None) -> Any:
        """One request; the decoded JSON answer (None for an empty body). ``raw_body``: bytes sent as they
        are instead of ``body`` as JSON.

        A GET whose kept-alive connection the daemon had closed is sent once more on a new one.
        """
        url = path + ("?" + urlencode(list(params)) if params else "")
        data = raw_body if raw_body is not None else b"" if body is None else json.dumps(
            body, separators=(",", ":"), ensure_ascii=False).encode()
        deadline = time.monotonic() + self.timeout_s
        for again in (False, True):
            reused = self._sock is not None
            try:
                status, raw = self._exchange(method, url, data, deadline)
                break
            except _Disconnected as e:
                self.close()
                if again or method != "GET" or not reused:
                    raise DaemonUnreachable(self.socket_path, "the connection broke before the answer") from e
            except TimeoutError as e:
                self.close()
                raise DaemonTimeout(self.timeout_s) from e
            except (FileNotFoundError, NotADirectoryError) as e:
                self.close()
                raise DaemonUnreachable(self.socket_path, "no socket (is gpulayerd running?)") from e
            except ConnectionRefusedError as e:
                self.close()
                raise DaemonUnreachable(self.socket_path, "nothing answers on the socket (a daemon that died "
                                        "leaves it behind)") from e
            except OSError as e:
                self.close()
                raise DaemonUnreachable(self.socket_path, e.strerror or str(e)) from e
        if status >= 400:
            raise _api_error(status, raw)
        return json.loads(raw, object_hook=Record) if raw else None

    def _exchange(self, method: str, url: str, data: bytes, deadline: float) -> tuple[int, bytes]:
        """Send one request and read its answer: (status, body). Raises OSError, TimeoutError, _Disconnected."""
        if self._sock is None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                sock.connect(self.socket_path)
            except BaseException:
                sock.close()
                raise
            self._sock = sock
        head = f"{method} {url} HTTP/1.1\r\nHost: gpulayerd\r\n"
        if data or method != "GET":
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:  # noqa: SIM105 (contextlib is one more import at every CLI start)
            self._sock.sendall(head.encode("ascii") + b"\r\n" + data)
        except (BrokenPipeError, ConnectionResetError):
            # The daemon may have answered and closed before reading the request (a connection over
            # its limits gets one 503 line): that answer is still there to read; if not, _Disconnected.
            pass
        header_end = self._read_until(b"\r\n\r\n", deadline, first=True)
        lines = self._take(header_end + 4).decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as e:
            raise OSError(f"not an HTTP answer: {lines[0][:80]!r}") from e
        self._headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                self._headers[name.strip().lower()] = value.strip()
        if "content-length" in self._headers:
            raw = self._read_exactly(int(self._headers["content-length"]), deadline)
        elif self._headers.get("transfer-encoding", "").lower() == "chunked":
            raw = self._read_chunked(deadline)
        else:  # the body ends with the connection
            while self._recv(deadline):
                pass
            raw, self._buf = self._buf, b""
            self.close()
        if self._headers.get("connection", "").lower() == "close":
            self.close()
        return status, raw

    def _recv(self, deadline: float) -> bool:
        """Read what the socket has into the buffer; False at the end of the stream."""
        assert self._sock is not None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(1 << 16)
        except ConnectionResetError as e:
            raise _Disconnected() from e
        self._buf += chunk
        return bool(chunk)

    def _read_until(self, marker: bytes, deadline: float, first: bool = False) -> int:
        """The index of ``marker`` in the buffer, reading until it comes."""
        while (i := self._buf.find(marker)) < 0:
            if not self._recv(deadline):
                if first and not self._buf:
                    raise _Disconnected()
                raise OSError("the connection closed in the middle of the answer")
        return i

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            if not self._recv(deadline):
                raise OSError("the connection closed in the middle of the answer")
        return self._take(n)

    def _take(self, n: int) -> bytes:
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _read_chunked(self, deadline: float) -> bytes:
        parts: list[bytes] = []
        while True:
            end = self._read_until(b"\r\n", deadline)
            size = int(self._take(end + 2)[:end].split(b";")[0], 16)
            if size == 0:
                self._read_exactly(self._read_until(b"\r\n", deadline) + 2, deadline)  # no trailers expected
                return b"".join(parts)
            parts.append(self._read_exactly(size, deadline))
            self._read_exactly(2, deadline)

    # ------------------------------------------------------------------ the API (paths from the route table)

    def _call(self, name: str, job_ref: str = "", body: object = None,
              params: Sequence[tuple[str, str]] | None = None) -> Any:
        """Local route ``name`` of :data:`gpulayerd.routes.LOCAL_ROUTES` (``job_ref`` fills ``{job}``)."""
        return self.request(LOCAL[name].method, local_path(name, quote(job_ref, safe="")), body, params=params)

    def health(self) -> Any:
        """``GET /v1/health``."""
        return self._call("health")

    def devices(self) -> Any:
        """``GET /v1/devices``: this machine's capabilities with grant state."""
        return self._call("devices")

    def peers(self) -> Any:
        """``GET /v1/peers``: every gpulayerd known, this one first, with capabilities."""
        return self._call("peers")

    def users(self) -> Any:
        """``GET /v1/users``: fair share, every user known in priority order."""
        return self._call("users")

    def report(self, since_s: float, by: str, scope: str) -> Any:
        """``GET /v1/report``: accounting over the last ``since_s`` seconds by ``by``, this daemon's or the lab's."""
        return self._call("report", params=[("since", str(int(since_s))), ("by", by), ("scope", scope)])

    def submit(self, spec: dict[str, Any], path: str = "", key: str = "") -> Any:
        """``POST /v1/jobs``: the spec as a mapping (workdir resolved), the submitter's ``PATH`` and
        the submission ``key`` (a retry with the same key answers the job stored the first time)."""
        body: dict[str, Any] = {"spec": spec, "path": path}
        if key:
            body["key"] = key
        return self._call("submit", body=body)

    def snapshot(self, manifest: dict[str, Any], commit: bool) -> Any:
        """``POST /v1/snapshots``: offer (or commit) a shipped workdir's manifest; the contents to upload."""
        return self._call("snapshot", body={"manifest": manifest, "commit": commit})

    def snapshot_blob(self, digest: str, offset: int, data: bytes) -> Any:
        """``POST /v1/snapshots/blobs``: a chunk (at most 1 MiB) of a content the offer found missing."""
        return self.request(LOCAL["snapshot_blob"].method, local_path("snapshot_blob"),
                            params=[("digest", digest), ("offset", str(offset))], raw_body=data)

    def fetch(self, job_ref: str, patterns: Sequence[str], offset: int, attempt: int | None = None) -> Any:
        """``POST /v1/jobs/{id}/fetch``: a chunk (base64) of the stream of files of a finished attempt."""
        body: dict[str, Any] = {"patterns": list(patterns), "offset": offset}
        if attempt is not None:
            body["attempt"] = attempt
        return self._call("fetch", job_ref, body=body)

    def jobs(self, states: Sequence[str] | None = None, limit: int | None = None, scope: str = "local",
             user: str | None = None, finished: int | None = None, fields: Sequence[str] | None = None) -> Any:
        """``GET /v1/jobs`` in submission order, filtered by the daemon (see the route's docstring):
        ``states``, ``user``, at most ``finished`` finished jobs (the latest), the last ``limit``,
        only ``fields`` of each job (None: all of them)."""
        params = [("state", s) for s in states or ()]
        if limit is not None:
            params.append(("limit", str(limit)))
        if scope != "local":
            params.append(("scope", scope))
        if user is not None:
            params.append(("user", user))
        if finished is not None:
            params.append(("finished", str(finished)))
        if fields is not None:
            params.append(("fields", ",".join(fields)))
        return self._call("jobs", params=params)

    def job(self, job_ref: str) -> Any:
        """``GET /v1/jobs/{id}`` (a unique id prefix works)."""
        return self._call("job", job_ref)

    def explain(self, job_ref: str) -> Any:
        """``GET /v1/jobs/{id}/explain``."""
        return self._call("explain", job_ref)

    def cancel(self, job_ref: str, signal: str = "") -> Any:
        """``POST /v1/jobs/{id}/cancel`` (``signal``: the name of the signal the job gets first)."""
        return self._call("cancel", job_ref, params=[("signal", signal)] if signal else None)

    def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0,
             attempt: int | None = None, rank: int | None = None, limit: int | None = None) -> Any:
        """``GET /v1/jobs/{id}/logs``: text from byte ``offset`` (``rank``: a multi-host job's node rank;
        ``limit``: at most that many bytes, None: up to 1 MiB)."""
        params = [("stream", stream), ("offset", str(offset))]
        if limit is not None:
            params.append(("limit", str(limit)))
        if attempt is not None:
            params.append(("attempt", str(attempt)))
        if rank is not None:
            params.append(("rank", str(rank)))
        return self._call("logs", job_ref, params=params)


def _api_error(status: int, raw: bytes) -> ApiRequestError:
    """The error of an error reply: the API's ``{code, message}`` body, else the status and the raw text."""
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return ApiRequestError(status, str(body.get("code") or "http_error"), body["message"])
    except ValueError:
        pass
    from gpulayerd.text import http_error  # a sentence, e.g. for aiohttp's plain-text 413

    return ApiRequestError(status, "http_error", http_error(status, raw))


# ------------------------------------------------------------------ which daemon, one call


def env_path(name: str) -> Path | None:
    """The path in environment variable ``name``, or None when it is unset or empty."""
    value = os.environ.get(name)
    return Path(value) if value else None


def socket_path(args: argparse.Namespace) -> Path:
    """The daemon's unix socket, in this order:

    1. ``--socket`` (env ``GPULAYER_SOCKET``);
    2. the one of ``--state-dir`` (env ``GPULAYER_STATE_DIR``): ``<state dir>/run/gpulayerd.sock``;
    3. this user's personal daemon's (the user runtime dir), if something answers there;
    4. the system daemon's, ``/run/gpulayer/gpulayerd.sock``, if it exists;
    5. else the personal one again (so that "not running" names it).
    """
    from gpulayerd.host.sockets import SYSTEM_SOCKET_PATH, socket_path_for

    if args.socket is not None:
        return Path(args.socket)
    if args.state_dir is not None:
        return socket_path_for(args.state_dir)
    personal = socket_path_for(None)
    if _answers(personal) or not SYSTEM_SOCKET_PATH.exists():
        return personal
    return SYSTEM_SOCKET_PATH


def _answers(path: Path) -> bool:
    """Whether something accepts a connection on the unix socket at ``path`` (one connect, 1 s at most)."""
    import _socket  # the C module: `socket` costs ~3 ms of start-up

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


def call_daemon(args: argparse.Namespace, call: Callable[[SyncClient], _T], on_timeout: str = "") -> _T:
    """Run ``call`` with a synchronous client of the local daemon (:mod:`gpulayerd.cli.http`) and return its result.

    ``on_timeout``: what to add to the one-line message when the daemon does not answer in time
    (default: how to check on it). The timeout is env ``GPULAYER_TIMEOUT`` (seconds, default 30;
    another value than a positive number is a usage error).

    Raises:
        CommandFailed: no daemon answers (with the command that starts one), it did not answer in
            time (one line, never a traceback), or it failed the call.
        UsageError: a bad ``GPULAYER_TIMEOUT``; the daemon refused the request as bad input (HTTP 400,
            404, 422) or as a conflict (409: a submission key reused with another spec).
    """
    try:
        timeout_s = timeout_from_env()
    except BadTimeout as e:
        raise UsageError(str(e)) from None
    sock = socket_path(args)
    try:
        with SyncClient(sock, timeout_s) as client:
            return call(client)
    except DaemonTimeout as e:
        hint = on_timeout or "it may be stopped or overloaded (gpulayer service status), or try again"
        raise CommandFailed(f"gpulayerd did not answer within {e.timeout_s:g} s; {hint}") from None
    except DaemonUnreachable as e:
        if args.state_dir or args.socket:
            hint = f"gpulayerd --state-dir {args.state_dir} &" if args.state_dir else "gpulayerd &"
        else:
            from gpulayerd.host.sockets import SYSTEM_SOCKET_PATH

            hint = (f"gpulayerd & (a personal daemon), or on a lab machine ask its admin to start the system "
                    f"one (sudo gpulayer service install --system; socket {SYSTEM_SOCKET_PATH})")
        raise CommandFailed(f"gpulayerd is not running ({e}). Start it with: {hint}") from None
    except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as surrogates: JSON/URLs cannot carry them
        bad = e.object[e.start:e.end] if isinstance(e.object, str) else ""
        byte = f" (byte 0x{ord(bad[0]) - 0xDC00:02x})" if bad and 0xDC80 <= ord(bad[0]) <= 0xDCFF else ""
        raise UsageError(f"an argument is not valid UTF-8 text{byte}: gpulayerd takes UTF-8 only") from None
    except ApiRequestError as e:  # the message may quote peers' or users' text: escaped, line by line
        from gpulayerd.text import escape

        message = "\n".join(escape(line) for line in e.message.split("\n"))
        if e.status in (400, 404, 409, 422):
            raise UsageError(message) from None
        raise CommandFailed(message) from None


def try_daemon(args: argparse.Namespace, call: Callable[[SyncClient], _T]) -> _T | None:
    """Like :func:`call_daemon`, but None when the call fails (e.g. no daemon answers)."""
    try:
        return call_daemon(args, call)
    except CommandFailed:
        return None
