"""The local API's unix socket: made safely, kept, re-created when deleted, removed only if ours.

Personal mode: socket 0600 in a 0700 directory (:func:`~gpulayerd.privdirs.make_private_dirs`).
System mode (``public``): socket 0666 in a root-owned 0755 directory
(:func:`~gpulayerd.privdirs.make_public_dir`); who a request comes from is then the kernel's
answer about the connection, not the socket's mode. A path already taken (not a socket, or a
socket something answers on) is refused and left as it is, its directory too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from pathlib import Path

from aiohttp import web

from gpulayerd.privdirs import make_private_dirs, make_public_dir

__all__ = ["LocalSocket", "start_unix_site"]

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

    def __init__(self, runner: web.AppRunner, path: Path, public: bool) -> None:
        self.runner = runner
        self.path = path
        self.public = public
        self._id: tuple[int, int] | None = None
        self._warned = False

    async def _bind(self) -> None:
        """Start a new site on ``path`` (the old ones stop listening; their connections go on)."""
        for site in list(self.runner.sites):
            await site.stop()
        old_umask = os.umask(0o177)  # never wider than 0600 at bind; chmod-ed to its mode just after
        try:
            site = web.UnixSite(self.runner, str(self.path))
            await site.start()
        finally:
            os.umask(old_umask)
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


async def start_unix_site(app: web.Application, socket_path: Path, *, public: bool = False) -> LocalSocket:
    """Serve ``app`` on ``socket_path``, replacing a stale socket, refusing a live one.

    Personal mode: directory 0700, socket 0600. ``public`` (system mode): directory 0755, socket
    0666 (each request's user then comes from the kernel, not from the socket's mode).

    Returns:
        The :class:`LocalSocket`; ``await it.close()`` stops serving and removes the socket.

    Raises:
        UnsafeDirectory: the directory is another account's or world-writable (left unchanged).
        OSError: the path is not a socket, or another daemon answers on it (left unchanged).
    """
    await asyncio.to_thread(_clear_socket_path, socket_path, public)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    local = LocalSocket(runner, socket_path, public)
    try:
        await local._bind()
    except BaseException:
        await runner.cleanup()
        raise
    return local
