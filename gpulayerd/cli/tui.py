"""``gpulayer tui``: starts the terminal UI, the separate package ``gpulayer_tui``.

gpulayerd never imports that package statically: it is looked up at run time, so a missing or
broken TUI install is a clear error here and nothing else of the CLI depends on it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gpulayerd.cli.client import socket_path
from gpulayerd.cli.errors import EXIT_OK, CommandFailed, UsageError

__all__ = ["TUI_MODULE", "add_parser"]

TUI_MODULE = "gpulayer_tui.launch"
"""The module whose ``run(socket_path)`` runs the TUI (``python -m gpulayer_tui`` starts the same)."""

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``tui`` to the ``gpulayer`` subcommands."""
    t = sub.add_parser("tui", help="the terminal UI: devices, jobs, job detail, peers, live")
    t.set_defaults(func=_cmd_tui)


def _cmd_tui(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("tui: needs a terminal (stdin and stdout must be a TTY)")
    try:
        launch = importlib.import_module(TUI_MODULE)
    except ModuleNotFoundError as e:
        if e.name not in ("gpulayer_tui", TUI_MODULE):
            raise  # something the TUI needs is missing: a bug or a broken install, with its traceback
        raise CommandFailed(f"tui: the TUI package gpulayer_tui is not installed ({e}); "
                            "reinstall gpulayer with pip") from e
    launch.run(socket_path(args))
    return EXIT_OK
