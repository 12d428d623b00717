"""The local API's unix socket: made safely, kept, re-created when deleted, removed only if ours;
and bounded, so that no account can take it from the others.

Personal mode: socket 0600 in a 0700 directory (:func:`~gpulayerd.host.privdirs.make_private_dirs`).
System mode (``public``): socket 0666 in a root-owned 0755 directory
(:func:`~gpulayerd.host.privdirs.make_public_dir`); who a request comes from is then the kernel's
answer about the connection, not the socket's mode. A path already taken (not a socket, or a
socket something answers on) is refused and left as it is, its directory too.

Limits (:class:`LocalLimits`, applied by :class:`LocalListener` as each connection is accepted,
before anything is read from it): open connections per account (the kernel's ``SO_PEERCRED``)
and in total, with a share only root, the daemon's own account and admins may use, so the
admin's ``gpulayer`` always answers. A refused connection gets one HTTP answer naming the limit
(503, code ``too_many_connections``) and is closed. Then :class:`_Guarded` times each request:
its head and body must arrive within ``request_timeout_s`` of its first byte (a new connection's
first request within that of the connection), or the connection is closed: a slow or stalled
client (slowloris) holds no slot for long. An idle keep-alive connection is closed by aiohttp
after ``idle_timeout_s``. Accept errors (too many open files) are logged once a minute with a
count, and the accept loop backs off (asyncio pauses the listener for a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from gpulayerd.host.privdirs import make_private_dirs, make_public_dir
from gpulayerd.net.limits import accept_or_shed, keep_spare_descriptor, quiet_accept_errors

__all__ = ["LocalLimits", "LocalListener", "LocalSocket", "LocalSocketSettings", "start_unix_site"]

log = logging.getLogger("gpulayerd.api.server")


def socket_answers(socket_path: Path) -> bool:
    """True unless the unix socket at ``socket_path`` is certainly dead (nothing listens: refused, or gone).

    A socket whose backlog is full (``EAGAIN``), that we may not connect to (``EACCES``: another
    account's) or that is slow counts as alive: only a refused connection proves it stale.
    """
    import errno
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(str(socket_path))
        except OSError as e:
            return e.errno not in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK)
    return True


def _clear_socket_path(socket_path: Path, public: bool = False) -> None:
    """Check the socket's path, make its directory, remove a stale socket. Blocking: call in a thread.

    The path is checked before anything is changed: a path that is not a socket, or a socket
    another daemon serves on, is refused and left as it is (its directory too).

    Args:
        socket_path: where the socket goes.
        public: system mode: directory 0755 (everyone reaches the socket); else 0700.

    Raises:
        UnsafeDirectory: the directory is another account's or world-writable (left unchanged).
        OSError: the path is not a socket, or another daemon answers on it.
    """
    def stale() -> bool:
        try:
            st = socket_path.lstat()
        except FileNotFoundError:
            return False
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{socket_path} exists and is not a socket")
        if socket_answers(socket_path):
            raise OSError(f"another gpulayerd serves on {socket_path}")
        return True

    stale()
    if public:
        make_public_dir(socket_path.parent)
    else:
        make_private_dirs([socket_path.parent])
    if stale():
        socket_path.unlink()  # left behind by a daemon that died


_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LOG_EVERY_S = 60.0
_REFUSALS_PER_ACCEPT = 64


@dataclass(frozen=True, slots=True)
class LocalSocketSettings:
    """The local socket's limits (see the module docstring; :class:`~gpulayerd.config.DaemonConfig` names).

    Attributes:
        max_connections: open connections in total.
        max_per_user: open connections of one account.
        reserved: of ``max_connections``, how many only privileged accounts may use.
        request_timeout_s: a request's head and body must arrive within this many seconds.
        idle_timeout_s: an idle keep-alive connection is closed after this long.
        privileged: uid -> may use the reserved share (root, the daemon's account, admins).
        account_of: uid -> the account whose share its connections use (a uid of a subordinate
            range, as a process in a user namespace has: the range's owner; see
            :mod:`gpulayerd.host.subids`).
    """

    max_connections: int = 1024
    max_per_user: int = 64
    reserved: int = 64
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    privileged: Callable[[int], bool] = lambda uid: uid in (0, os.geteuid())
    account_of: Callable[[int], int] = lambda uid: uid


class LocalLimits:
    """Open connections of the local socket per account and in total (event-loop use only).

    Args:
        settings: the limits; the reserved share is at most half the total.
        clock: monotonic seconds (for logging once a minute).
    """

    def __init__(self, settings: LocalSocketSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.total = max(2, settings.max_connections)
        self.reserved = min(max(1, settings.reserved), self.total // 2)
        self._clock = clock
        self._open: dict[int, int] = {}
        self._open_total = 0
        self._open_unprivileged = 0
        self.refused = 0
        self._logged: dict[int, tuple[float, int]] = {}  # uid -> (last log, refusals since)

    def try_open(self, uid: int) -> str | None:
        """Take a slot for a new connection of ``uid``; None if taken, else the refusal's words."""
        privileged = self.settings.privileged(uid)
        held = self._open.get(uid, 0)
        if held >= self.settings.max_per_user and not privileged:  # (root and admins: the total only)
            why = (f"uid {uid} has {held} connections open to gpulayerd (at most {self.settings.max_per_user} per "
                   "user: local_max_connections_per_user); close some and try again")
        elif self._open_total >= self.total or (
                not privileged and self._open_unprivileged >= self.total - self.reserved):
            why = (f"gpulayerd has {self._open_total} local connections open (at most {self.total}, "
                   f"{self.reserved} of them kept for root and admins: local_max_connections); try again soon")
        else:
            self._open[uid] = held + 1
            self._open_total += 1
            self._open_unprivileged += 0 if privileged else 1
            return None
        self._refuse(uid, why)
        return why

    def closed(self, uid: int, privileged: bool) -> None:
        """Give back a slot of ``uid`` (once per :meth:`try_open` that took one)."""
        held = self._open.get(uid, 0)
        if held <= 0:
            return
        if held == 1:
            del self._open[uid]
        else:
            self._open[uid] = held - 1
        self._open_total -= 1
        self._open_unprivileged -= 0 if privileged else 1

    def open_for(self, uid: int) -> int:
        """Connections of ``uid`` open now."""
        return self._open.get(uid, 0)

    def _refuse(self, uid: int, why: str) -> None:
        self.refused += 1
        now = self._clock()
        last, since = self._logged.get(uid, (None, 0))
        if last is not None and now - last < _LOG_EVERY_S:
            self._logged[uid] = (last, since + 1)
            return
        if len(self._logged) > 4096:
            self._logged.clear()
        self._logged[uid] = (now, 0)
        more = f" ({since} more since the last message)" if since else ""
        log.warning("local API: refused a connection: %s%s; next message about uid %d in a minute at the earliest",
                    why, more, uid)


def _error_answer(status: bytes, code: str, message: str) -> bytes:
    """A whole HTTP answer with the API's error body, after which the connection closes."""
    body = json.dumps({"code": code, "message": message, "detail": {}}).encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _refusal_answer(why: str) -> bytes:
    return _error_answer(b"503 Service Unavailable", "too_many_connections", why)


class _Counted(socket.socket):
    """An accepted connection holding a slot of :class:`LocalLimits`; closing it gives the slot back."""

    _release: weakref.finalize[Any, _Counted] | None = None

    def close(self) -> None:
        if self._release is not None:
            self._release()
        super().close()


class LocalListener(socket.socket):
    """The listening unix socket whose ``accept()`` applies :class:`LocalLimits` (the event loop
    accepts on it): an over-limit connection gets one answer naming the limit and is closed."""

    _limits: LocalLimits

    @classmethod
    def wrap(cls, sock: socket.socket, limits: LocalLimits) -> LocalListener:
        """Take over ``sock`` (bound, listening; it is detached: use the returned socket only)."""
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener._limits = limits
        listener.setblocking(False)
        keep_spare_descriptor()  # now, while descriptors are plenty
        return listener

    def accept(self) -> tuple[socket.socket, object]:
        """The next admitted connection (non-blocking).

        Raises:
            BlockingIOError: none pending (over-limit ones were answered and closed).
            OSError: as ``socket.accept`` (out of descriptors: pending connections are closed
                unanswered instead, :func:`~gpulayerd.net.limits.accept_or_shed`).
        """
        for _ in range(_REFUSALS_PER_ACCEPT):
            plain, addr = accept_or_shed(self, super().accept, "local socket")
            try:
                uid = _CRED.unpack(plain.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[1]
            except OSError:
                uid = -1
            account = self._limits.settings.account_of(uid)  # (fixed now: its slot is given back to it)
            why = self._limits.try_open(account)
            if why is None:
                conn = _Counted(plain.family, plain.type, plain.proto, fileno=plain.detach())
                conn._release = weakref.finalize(conn, self._limits.closed, account,
                                                 self._limits.settings.privileged(account))
                return conn, addr
            with contextlib.suppress(OSError):
                plain.setblocking(False)
                plain.send(_refusal_answer(why))
            plain.close()
        raise BlockingIOError("over-limit connections refused; more may be pending")


class _Guarded(asyncio.Protocol):
    """aiohttp's request handler behind a timer: each request's head and body must arrive within
    ``timeout_s`` of its first byte (a new connection's first request: of the connection)."""

    def __init__(self, inner: asyncio.Protocol, timeout_s: float) -> None:
        self._inner = inner
        self._timeout_s = timeout_s
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head = b""  # the request head read so far (while in a head)
        self._body_left = 0  # body bytes still to come
        self._in_request = False
        self._refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._inner.connection_made(transport)
        self._arm()  # the first request must come within the timeout too

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._track(data):
            self._refused = True
            if self._transport is not None:
                self._transport.write(_LENGTH_REQUIRED)
                self._transport.close()
            return
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def _track(self, data: bytes) -> bool:
        """Follow request heads and bodies (each timed); False for a request with a
        ``Transfer-Encoding`` (a chunked body could be dribbled with no end in sight: the local API
        takes Content-Length bodies only, as every client of it sends)."""
        while data:
            if self._body_left:
                taken = min(self._body_left, len(data))
                self._body_left -= taken
                data = data[taken:]
                if not self._body_left:
                    self._in_request = False
                    self._disarm()
                continue
            if not self._in_request:
                self._in_request = True
                self._head = b""
                self._arm()
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > 65536:  # aiohttp answers an oversized head itself; stop buffering it
                    self._head = self._head[-4:]
                return True
            head, data = self._head[:end], self._head[end + 4:]
            self._head = b""
            length, chunked = _body_of(head)
            if chunked:
                return False
            self._body_left = length
            if not self._body_left:
                self._in_request = False
                self._disarm()
        return True


def _body_of(head: bytes) -> tuple[int, bool]:
    """(Content-Length, whether a Transfer-Encoding is named) of a request head."""
    length, coded = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            with contextlib.suppress(ValueError):
                length = max(0, int(value.strip()))
        elif key == b"transfer-encoding":
            coded = True
    return length, coded


_LENGTH_REQUIRED = _error_answer(b"411 Length Required", "length_required",
                                 "send the request body with a Content-Length (no Transfer-Encoding)")


class _LimitedUnixSite(web.BaseSite):
    """A site on a :class:`LocalListener` whose connections are :class:`_Guarded`."""

    __slots__ = ("_listener", "_timeout_s")

    def __init__(self, runner: web.BaseRunner, listener: LocalListener, timeout_s: float) -> None:
        super().__init__(runner)
        self._listener = listener
        self._timeout_s = timeout_s

    @property
    def name(self) -> str:
        return f"unix:{self._listener.getsockname()}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(server(), self._timeout_s), sock=self._listener, backlog=512)


def _socket_id(socket_path: Path) -> tuple[int, int] | None:
    """(device, inode) of the socket file at ``socket_path``, or None when there is none."""
    try:
        st = socket_path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


class LocalSocket:
    """The local API served on its unix socket (made by :func:`start_unix_site`).

    Attributes:
        runner: the aiohttp runner serving the app.
        path: the socket's path.
        public: system mode (socket 0666 in a 0755 directory) rather than personal (0600 in 0700).
    """

    def __init__(self, runner: web.AppRunner, path: Path, public: bool,
                 settings: LocalSocketSettings | None = None) -> None:
        self.runner = runner
        self.path = path
        self.public = public
        self.settings = settings or LocalSocketSettings()
        self.limits = LocalLimits(self.settings)
        self._id: tuple[int, int] | None = None
        self._warned = False

    async def _bind(self) -> None:
        """Start a new site on ``path`` (the old ones stop listening; their connections go on)."""
        for site in list(self.runner.sites):
            await site.stop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # never wider than 0600 at bind; chmod-ed to its mode just after
        try:
            sock.bind(str(self.path))
            sock.listen(512)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old_umask)
        quiet_accept_errors(asyncio.get_running_loop())
        site = _LimitedUnixSite(self.runner, LocalListener.wrap(sock, self.limits), self.settings.request_timeout_s)
        await site.start()
        await asyncio.to_thread(os.chmod, self.path, 0o666 if self.public else 0o600)
        self._id = await asyncio.to_thread(_socket_id, self.path)

    async def check(self) -> bool:
        """Re-create the socket if its file was deleted (or replaced by a dead one). Returns True if it did.

        A path now taken by something else (a file that is not a socket, another daemon's live
        socket) is left alone, with one warning.
        """
        if await asyncio.to_thread(_socket_id, self.path) == self._id:
            return False
        try:
            await asyncio.to_thread(_clear_socket_path, self.path, self.public)
        except OSError as e:
            if not self._warned:
                log.warning("the local API socket %s was replaced; not taking it back: %s", self.path, e)
                self._warned = True
            return False
        await self._bind()
        self._warned = False
        log.warning("the local API socket %s was deleted; serving on a new one", self.path)
        return True

    async def keep(self, interval_s: float = 2.0) -> None:
        """Forever: every ``interval_s`` seconds, :meth:`check` (one stat when nothing changed)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.check()

    async def close(self) -> None:
        """Stop serving and remove the socket file, only if it is still the one this daemon made."""
        await self.runner.cleanup()
        if self._id is not None:
            await asyncio.to_thread(_remove_if, self.path, self._id)
            self._id = None


def _remove_if(path: Path, ident: tuple[int, int]) -> None:
    if _socket_id(path) == ident:
        with contextlib.suppress(OSError):
            path.unlink()


async def start_unix_site(app: web.Application, socket_path: Path, *, public: bool = False,
                          settings: LocalSocketSettings | None = None) -> LocalSocket:
    """Serve ``app`` on ``socket_path``, replacing a stale socket, refusing a live one.

    Personal mode: directory 0700, socket 0600. ``public`` (system mode): directory 0755, socket
    0666 (each request's user then comes from the kernel, not from the socket's mode).
    ``settings``: the connection limits and timeouts (see the module docstring).

    Returns:
        The :class:`LocalSocket`; ``await it.close()`` stops serving and removes the socket.

    Raises:
        UnsafeDirectory: the directory is another account's or world-writable (left unchanged).
        OSError: the path is not a socket, or another daemon answers on it (left unchanged).
    """
    settings = settings or LocalSocketSettings()
    await asyncio.to_thread(_clear_socket_path, socket_path, public)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=settings.idle_timeout_s)
    await runner.setup()
    local = LocalSocket(runner, socket_path, public, settings)
    try:
        await local._bind()
    except BaseException:
        await runner.cleanup()
        raise
    return local
