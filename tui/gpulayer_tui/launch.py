"""Starting the TUI: :func:`run` for a socket path, :func:`main` for ``python -m gpulayer_tui``.

``gpulayer tui`` (in :mod:`gpulayerd.cli.tui`) finds the socket from its global flags and calls
:func:`run`, looked up at run time, so gpulayerd never imports this package statically.

A TUI whose terminal goes away ends (:class:`TerminalWatch`): on SIGHUP, and when the terminal
hangs up without one (a closed tmux session or ssh connection while SIGHUP is ignored, e.g.
under ``nohup``). Textual's input thread reads end-of-file from a hung-up terminal in a loop,
which would otherwise keep a TUI that nobody sees at 100 % of a core.

Under textual-serve's web driver (a viewer of ``gpulayer tui --serve``, :mod:`gpulayer_tui.serve`) there is
no terminal: the TUI runs on pipes, and it is always a read-only board (:mod:`gpulayer_tui.readonly`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import termios
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

__all__ = ["HANGUP_CHECK_S", "WEB_DRIVER", "TerminalWatch", "in_browser", "main", "run"]

HANGUP_CHECK_S = 0.25
"""Seconds between checks that the terminal is still there (a hung-up terminal is found within this)."""

WEB_DRIVER = "textual.drivers.web_driver:WebDriver"
"""The Textual driver textual-serve names in ``TEXTUAL_DRIVER`` for the app it runs for a browser."""


def in_browser() -> bool:
    """True when the TUI runs for a browser (textual-serve's web driver), not in a terminal."""
    return os.environ.get("TEXTUAL_DRIVER", "") == WEB_DRIVER


class Exitable(Protocol):
    """What :class:`TerminalWatch` ends: a running Textual app."""

    def exit(self) -> None:
        """Leave the app (on its event loop)."""


class TerminalWatch:
    """Ends ``app`` when its terminal goes away; use as ``with TerminalWatch(app, fd): app.run()``.

    SIGHUP exits the app cleanly (it restores the terminal when the terminal is still there).
    A thread checks every ``check_s`` seconds that ``fd`` is still a terminal
    (``tcgetattr``; a hung-up one fails with EIO) and ends the app when it is not. Whenever
    the terminal is gone, descriptors 0, 1 and 2 are pointed at ``/dev/null`` first, so the app's
    last writes and terminal settings go nowhere instead of failing. Only in the main thread
    (signal handlers); on leaving, the old SIGHUP handler is back.

    Args:
        app: the app to end.
        fd: the terminal's descriptor (the one Textual reads keys from: stdin).
        check_s: seconds between checks of the terminal.
    """

    def __init__(self, app: Exitable, fd: int, check_s: float = HANGUP_CHECK_S) -> None:
        self._app = app
        self._fd = fd
        self._check_s = check_s
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._old: signal.Handlers | object = signal.SIG_DFL
        self._thread = threading.Thread(target=self._watch, name="gpulayer-terminal-watch", daemon=True)

    @property
    def hung_up(self) -> bool:
        """True once the terminal went away (SIGHUP or a hang-up) and the app was asked to end."""
        return self._ended.is_set()

    def __enter__(self) -> TerminalWatch:
        self._old = signal.signal(signal.SIGHUP, self._on_sighup)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        signal.signal(signal.SIGHUP, self._old)  # type: ignore[arg-type]

    def _on_sighup(self, _signum: int, _frame: FrameType | None) -> None:
        # In the main thread, between two bytecodes of whatever runs there: the event loop, in the app.
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # not running yet, or any more: nothing to end cleanly
            raise SystemExit(128 + signal.SIGHUP) from None
        self._end()

    def _watch(self) -> None:
        while not self._stop.wait(self._check_s):
            if not _is_terminal(self._fd):
                self._end()
                return

    def _end(self) -> None:
        if self._ended.is_set():
            return
        self._ended.set()
        if not _is_terminal(self._fd):
            _detach_from_terminal()
        loop = self._loop
        if loop is None:  # the thread: the app's loop, once it runs (Textual keeps it in ``_loop``)
            loop = getattr(self._app, "_loop", None)
        if loop is None or loop.is_closed():
            os._exit(128 + signal.SIGHUP)  # no app to end cleanly: do not spin on a dead terminal
        loop.call_soon_threadsafe(self._app.exit)


def _is_terminal(fd: int) -> bool:
    try:
        termios.tcgetattr(fd)
    except (termios.error, OSError):
        return False
    return True


def _detach_from_terminal() -> None:
    """Point descriptors 0-2 at /dev/null: reads see end-of-file, writes and terminal settings go nowhere."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)


def run(socket_path: Path, *, read_only: bool = False) -> None:
    """Run the TUI on the daemon at ``socket_path`` until the user quits (needs a terminal, unless it runs
    for a browser: :func:`in_browser`, and then it is read-only whatever ``read_only`` says).

    Args:
        socket_path: the daemon's unix socket.
        read_only: a read-only board (:mod:`gpulayer_tui.readonly`): no cancel, no job detail, no logs.

    Raises:
        SystemExit: 129 (128 + SIGHUP) when the terminal went away (SIGHUP, or a hung-up terminal).
    """
    from gpulayer_tui.app import make_app
    from gpulayerd.api.client import DaemonClient

    browser = in_browser()
    app = make_app(DaemonClient(socket_path), read_only=read_only or browser)
    if browser:  # pipes to textual-serve, which ends the app when its websocket closes
        app.run()
        return
    with TerminalWatch(app, sys.__stdin__.fileno() if sys.__stdin__ is not None else 0) as watch:
        app.run()
    if watch.hung_up:
        raise SystemExit(128 + signal.SIGHUP)  # as a shell reports a process ended by SIGHUP


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpulayer_tui --socket PATH``; returns the exit code (2 for bad usage).

    The socket comes from ``--socket``, else ``$GPULAYER_SOCKET``. ``gpulayer tui`` knows the
    default locations (from ``--state-dir``, or the user runtime dir).
    """
    env = os.environ.get("GPULAYER_SOCKET")
    p = argparse.ArgumentParser(
        prog="python -m gpulayer_tui",
        description="The gpulayer terminal UI: devices, jobs, job detail, peers, live. "
        "'gpulayer tui' starts the same and finds the daemon's socket by itself.")
    p.add_argument("--socket", type=Path, metavar="PATH", default=Path(env) if env else None,
                   help="the gpulayerd's unix socket (env GPULAYER_SOCKET)")
    p.add_argument("--read-only", action="store_true",
                   help="a read-only board: no cancel, no job detail, no logs (always so for a browser)")
    args = p.parse_args(argv)
    if args.socket is None:
        p.error("give --socket PATH (or set GPULAYER_SOCKET), or run 'gpulayer tui'")
    if not in_browser() and not (sys.stdin.isatty() and sys.stdout.isatty()):
        p.error("needs a terminal (stdin and stdout must be a TTY)")
    run(args.socket, read_only=args.read_only)
    return 0
