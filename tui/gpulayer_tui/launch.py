"""Starting the TUI: :func:`run` for a socket path, :func:`main` for ``python -m gpulayer_tui``.

``gpulayer tui`` (in :mod:`gpulayerd.cli.tui`) finds the socket from its global flags and calls
:func:`run`, looked up at run time, so gpulayerd never imports this package statically.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "run"]


def run(socket_path: Path) -> None:
    """Run the TUI on the daemon at ``socket_path`` until the user quits (needs a terminal)."""
    from gpulayer_tui.app import make_app
    from gpulayerd.api.client import DaemonClient

    make_app(DaemonClient(socket_path)).run()


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
    args = p.parse_args(argv)
    if args.socket is None:
        p.error("give --socket PATH (or set GPULAYER_SOCKET), or run 'gpulayer tui'")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        p.error("needs a terminal (stdin and stdout must be a TTY)")
    run(args.socket)
    return 0
