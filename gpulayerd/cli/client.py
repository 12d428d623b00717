"""How CLI commands reach the local gpulayerd: the socket from the global flags, one call per run.

Commands call the daemon through :mod:`gpulayerd.cli.http` (synchronous, stdlib only): a
``gpulayer`` process imports no aiohttp, pydantic or asyncio unless its command needs them.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from gpulayerd.cli.exits import CommandFailed, UsageError

TYPE_CHECKING = False  # `typing` costs ~2 ms of every CLI start; mypy reads this name as true
if TYPE_CHECKING:
    from typing import TypeVar

    from gpulayerd.cli.http import SyncClient

    _T = TypeVar("_T")

__all__ = ["call_daemon", "env_path", "socket_path", "try_daemon"]


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
    from gpulayerd.cli.http import (
        ApiRequestError,
        BadTimeout,
        DaemonTimeout,
        DaemonUnreachable,
        SyncClient,
        timeout_from_env,
    )

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
