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
    """The daemon's unix socket: ``--socket``, else the one of ``--state-dir`` (or the default state dir)."""
    from gpulayerd.config import socket_path_for

    if args.socket is not None:
        return Path(args.socket)
    return socket_path_for(args.state_dir)


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
        hint = f"gpulayerd --state-dir {args.state_dir} &" if args.state_dir else "gpulayerd &"
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
