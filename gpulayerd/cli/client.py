"""How CLI commands reach the local gpulayerd: the socket from the global flags, one call per run.

:mod:`gpulayerd.api.client` (aiohttp) is imported only when a command calls the daemon.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpulayerd.cli.errors import CommandFailed, UsageError

if TYPE_CHECKING:
    from gpulayerd.api.client import DaemonClient

__all__ = ["call_daemon", "env_path", "socket_path", "try_daemon"]

_T = TypeVar("_T")


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
    from gpulayerd.config import SYSTEM_SOCKET_PATH, socket_path_for

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
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def call_daemon(args: argparse.Namespace, call: Callable[[DaemonClient], Awaitable[_T]]) -> _T:
    """Run one client call against the local daemon and return its result.

    Raises:
        CommandFailed: no daemon answers (with the command that starts one), or it failed the call.
        UsageError: the daemon refused the request as bad input (HTTP 400, 404, 422).
    """
    import asyncio

    from gpulayerd.api.client import ApiRequestError, DaemonClient, DaemonUnreachable

    sock = socket_path(args)

    async def go() -> _T:
        async with DaemonClient(sock) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except DaemonUnreachable as e:
        if args.state_dir or args.socket:
            hint = f"gpulayerd --state-dir {args.state_dir} &" if args.state_dir else "gpulayerd &"
        else:
            from gpulayerd.config import SYSTEM_SOCKET_PATH

            hint = (f"gpulayerd & (a personal daemon), or on a lab machine ask its admin to start the system "
                    f"one (sudo gpulayer service install --system; socket {SYSTEM_SOCKET_PATH})")
        raise CommandFailed(f"gpulayerd is not running ({e}). Start it with: {hint}") from e
    except ApiRequestError as e:
        if e.status in (400, 404, 422):
            raise UsageError(e.body.message) from e
        raise CommandFailed(e.body.message) from e


def try_daemon(args: argparse.Namespace, call: Callable[[DaemonClient], Awaitable[_T]]) -> _T | None:
    """Like :func:`call_daemon`, but None when the call fails (e.g. no daemon answers)."""
    try:
        return call_daemon(args, call)
    except CommandFailed:
        return None
