"""``gpulayer tui``: starts the terminal UI, the separate package ``gpulayer_tui``; ``gpulayer tui --serve``
serves it read-only to browsers (``gpulayer_tui.serve``: a token in the URL, the Origin checked, N viewers).

gpulayerd never imports that package statically: it is looked up at run time, so a missing or
broken TUI install is a clear error here and nothing else of the CLI depends on it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError
from gpulayerd.cli.http import socket_path

__all__ = ["KEYS", "SERVE_MODULE", "TUI_MODULE", "add_parser"]

TUI_MODULE = "gpulayer_tui.launch"
"""The module whose ``run(socket_path)`` runs the TUI (``python -m gpulayer_tui`` starts the same)."""
SERVE_MODULE = "gpulayer_tui.serve"
"""The module whose ``run(socket_path, host=, port=, max_viewers=, origin=)`` serves the read-only board."""

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
    "Needs a terminal; NO_COLOR and 16-colour terminals are honoured.\n\n"
    "--serve serves a read-only board to browsers (for a screen in the lab, or through ssh -L): the\n"
    "devices and the queue with states, reasons and users; no cancel, no job detail, no logs. It prints\n"
    "a URL with a random token: only that URL opens the board."
)


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``tui`` to the ``gpulayer`` subcommands."""
    width = max(len(k) for k, _ in KEYS) + 3  # a clear gap between the keys and what they do
    keys = "\n".join(f"  {k:<{width}}{what}" for k, what in KEYS)
    t = sub.add_parser("tui", help="the terminal UI: devices, jobs, job detail, peers, live",
                       description=_DESCRIPTION, epilog=f"keys:\n{keys}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("--read-only", action="store_true",
                   help="a read-only board in this terminal: no cancel, no job detail, no logs")
    web = t.add_argument_group("serving the read-only board to browsers")
    web.add_argument("--serve", action="store_true", help="serve the board over HTTP (textual-serve) until Ctrl+C")
    web.add_argument("--host", default=None, metavar="ADDR",
                     help="the address to listen on (default 127.0.0.1: this machine only; see --origin)")
    web.add_argument("--port", type=int, default=None, metavar="N", help="the TCP port (default 8765; 0: any free)")
    web.add_argument("--max-viewers", type=int, default=None, metavar="N",
                     help="browsers served at once; one more is refused (default 8)")
    web.add_argument("--origin", default=None, metavar="URL",
                     help="the address browsers open when it is not http://ADDR:PORT (needed with --host 0.0.0.0; "
                          "e.g. http://labbox:8765, or http://localhost:9000 for ssh -L 9000:127.0.0.1:8765)")
    t.set_defaults(func=_cmd_tui)


def _cmd_tui(args: argparse.Namespace) -> int:
    web = {"host": args.host, "port": args.port, "max_viewers": args.max_viewers, "origin": args.origin}
    if args.serve:
        return _serve(args, {k: v for k, v in web.items() if v is not None})
    given = [f"--{k.replace('_', '-')}" for k, v in web.items() if v is not None]
    if given:
        raise UsageError(f"tui: {', '.join(given)} only go with --serve")
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("tui: needs a terminal (stdin and stdout must be a TTY)")
    _tui_module(TUI_MODULE).run(socket_path(args), read_only=args.read_only)
    return EXIT_OK


def _serve(args: argparse.Namespace, options: dict[str, object]) -> int:
    port, viewers = options.get("port", 0), options.get("max_viewers", 1)
    if not (isinstance(port, int) and 0 <= port <= 65535):
        raise UsageError(f"tui: --port must be 0..65535 (got {port})")
    if not (isinstance(viewers, int) and viewers >= 1):
        raise UsageError(f"tui: --max-viewers must be at least 1 (got {viewers})")
    serve = _tui_module(SERVE_MODULE)
    try:
        serve.run(socket_path(args), **options)
    except ValueError as e:
        raise UsageError(f"tui: {e}") from e
    except OSError as e:
        raise CommandFailed(f"tui: cannot serve the board: {e}") from e
    return EXIT_OK


def _tui_module(name: str) -> Any:
    """The TUI's module ``name``, looked up at run time (gpulayerd never imports the TUI statically)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in ("gpulayer_tui", name):
            raise  # something the TUI needs is missing: a bug or a broken install, with its traceback
        raise CommandFailed(f"tui: the TUI package gpulayer_tui is not installed ({e}); "
                            "reinstall gpulayer with pip") from e
