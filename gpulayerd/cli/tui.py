"""``gpulayer tui``: starts the terminal UI, the separate package ``gpulayer_tui``.

gpulayerd never imports that package statically: it is looked up at run time, so a missing or
broken TUI install is a clear error here and nothing else of the CLI depends on it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError
from gpulayerd.cli.http import socket_path

__all__ = ["KEYS", "TUI_MODULE", "add_parser"]

TUI_MODULE = "gpulayer_tui.launch"
"""The module whose ``run(socket_path)`` runs the TUI (``python -m gpulayer_tui`` starts the same)."""

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result

KEYS: tuple[tuple[str, str], ...] = (
    ("?, F1", "help: every key of the view shown, grouped (?, F1, esc or q close it)"),
    ("q, F10, ctrl+c", "quit (q and esc close a detail or a question first; ctrl+c copies in the filter box)"),
    ("1 2 3 4 (d p e)", "Devices, Jobs, Peers, Environments views; Tab moves the focus"),
    ("j/k up/down", "move the cursor (PgUp/PgDn, Home/End: by pages, to the ends)"),
    ("g G", "to the first, the last row (or the top, the bottom of a pane)"),
    ("ctrl+f ctrl+b", "a page down, up; ctrl+d ctrl+u: half a page"),
    ("enter, l", "the job's detail (why it waits, timeline), or its log"),
    ("c, F9", "cancel the job (asks first; only jobs that have not finished, yours unless you are an admin)"),
    ("x", "an array's tasks under its row, or folded back (an array is one row: its tasks counted by state)"),
    ("s, S", "sort by the next column (its header shows ▲/▼), reverse the order"),
    ("a", "all finished jobs, again only the latest 20 (older ones are hidden, as in gpulayer jobs)"),
    ("/", "filter: state:queued acc:cuda user:alice code:Busy name: id: where: reason: plus words; esc clears"),
    ("esc", "back from a detail, clear the filter"),
    ("w t l e", "in a detail: why, timeline, log, stdout/stderr"),
    ("in a log: g G F", "line 1 (also Home); the end, following it like less +F (also End)"),
    ("  PgUp PgDn", "by pages, as do ctrl+b ctrl+f b space as in less; ctrl+u ctrl+d by half pages; j/k "
                    "up/down and the wheel by lines; scrolling up pauses following"),
    ("  / n N", "search forward; the next match, the previous one"),
)
"""The TUI's keys as ``gpulayer tui --help`` lists them (tests check them against the app's bindings)."""

_DESCRIPTION = (
    "The terminal UI: the local daemon's devices, jobs (with why each waits) and peers, live.\n"
    "Needs a terminal; NO_COLOR and 16-colour terminals are honoured."
)


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``tui`` to the ``gpulayer`` subcommands."""
    width = max(len(k) for k, _ in KEYS) + 3  # a clear gap between the keys and what they do
    keys = "\n".join(f"  {k:<{width}}{what}" for k, what in KEYS)
    t = sub.add_parser("tui", help="the terminal UI: devices, jobs, job detail, peers, live",
                       description=_DESCRIPTION, epilog=f"keys:\n{keys}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
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
