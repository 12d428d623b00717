"""``gpulayer``: the command-line interface.

Exit codes: 0 ok, 1 failure, 2 usage error (bad flags, bad job spec, bad input file).
Every command that prints a table takes ``--json``.

One module per group of subcommands (:mod:`~gpulayerd.cli.devices`, :mod:`~gpulayerd.cli.jobs`,
:mod:`~gpulayerd.cli.run`, :mod:`~gpulayerd.cli.users`, :mod:`~gpulayerd.cli.profiles`,
:mod:`~gpulayerd.cli.cluster`, :mod:`~gpulayerd.cli.service`, :mod:`~gpulayerd.cli.tui`,
:mod:`~gpulayerd.cli.completion`, :mod:`~gpulayerd.cli.logs` (``fetch``; and the helper of ``logs``); helpers:
:mod:`~gpulayerd.cli.http`,
:mod:`~gpulayerd.cli.jobs_table`, :mod:`~gpulayerd.cli.render`, :mod:`~gpulayerd.cli.exits`); each adds
its parsers and raises :class:`~gpulayerd.cli.exits.UsageError` or
:class:`~gpulayerd.cli.exits.CommandFailed`, which :func:`main` turns into exit codes.

Start-up is kept short (``gpulayer --help`` within ~40 ms of ``python -c pass``): :data:`COMMANDS`
lists each command with its help line and module, :func:`main` first parses with a parser whose
commands are stubs (that one prints ``gpulayer --help``), then imports only the module of the
chosen command and parses again with that module's real parsers. A command module imports what it
uses (HTTP client, models, probe) when it runs. :func:`build_parser` builds every command (for
shell completion and tests).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

from gpulayerd import __version__
from gpulayerd.cli.exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CommandFailed, UsageError

TYPE_CHECKING = False  # typing costs ~2 ms of `gpulayer --help`; mypy reads this name as true
if TYPE_CHECKING:
    from typing import Any

__all__ = ["COMMANDS", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError", "build_parser",
           "main"]

COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("devices", "devices, Python environments and probe health: the whole cluster, or this machine", "devices"),
    ("peers", "the gpulayerd peers this daemon knows: trusted or foreign, last heartbeat", "devices"),
    ("explain", "why a job fits or not: the worker x requirement table and the verdict", "devices"),
    ("submit", "submit a job: -f JOB.toml, or flags -- CMD...", "jobs"),
    ("jobs", "the job queue of every user: id, name, user, state, where, age, reason", "jobs"),
    ("show", "one job: spec, state, attempts, history, why it waits", "jobs"),
    ("logs", "a job's output", "jobs"),
    ("cancel", "cancel a job (running: SIGTERM or --signal NAME, grace, SIGKILL to its process group)", "jobs"),
    ("fetch", "files of a finished attempt of a shipped job, from the worker that ran it", "logs"),
    ("run", "submit a job and wait: stream its output, exit with its exit code", "run"),
    ("tui", "the terminal UI: devices, jobs, job detail, peers, live", "tui"),
    ("cluster", "this machine's cluster membership: init, join, token, remove, signer, show", "cluster"),
    ("service", "install gpulayerd as a systemd user service (Linux) or a launchd agent (macOS); --system: as "
     "the machine's system service (lab install)", "service"),
    ("users", "fair share: each user's decayed usage, priority, jobs and what they hold now", "users"),
    ("history", "finished jobs over a period: when they ended, how, where", "users"),
    ("report", "accounting over a period: jobs, GPU-hours, CPU slot-hours, failures, median wait", "users"),
    ("profiles", "runtime profiles x worker environments: which machines run which stack", "profiles"),
    ("completion", "print a shell completion script (bash, zsh or fish)", "completion"),
)
"""Every ``gpulayer`` command in the order ``--help`` lists them: (name, help line, module under
``gpulayerd.cli``). A module adds all of its commands at once (``add_parsers``, or ``add_parser``
for one), in this order; the help line must be the one the module gives (a test compares them)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``gpulayer`` argument parser: global flags and every subcommand (each sets ``func``).

    Imports every command module (~45 ms); :func:`main` builds only the chosen command's parsers.
    """
    return _parser(None)


def _parser(modules: Collection[str] | None) -> argparse.ArgumentParser:
    """The ``gpulayer`` parser with the real parsers of the commands of ``modules`` (None: all) and a
    stub (its help line only, no options) for every other command."""
    p = _ArgumentParser(
        prog="gpulayer",
        description="GPU compute sharing for a lab's workstations: submit jobs that run on any machine of "
        "the cluster that fits, see every device, job and user, and why a job waits, runs where it does, or "
        "how it ended.",
        allow_abbrev=False,
    )
    p.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    p.add_argument("--state-dir", type=Path, metavar="DIR", default=_env_path("GPULAYER_STATE_DIR"),
                   help="talk to the gpulayerd using this state dir (env GPULAYER_STATE_DIR)")
    p.add_argument("--socket", type=Path, metavar="PATH", default=_env_path("GPULAYER_SOCKET"),
                   help="the daemon's unix socket (env GPULAYER_SOCKET); default: from --state-dir, else "
                   "your personal daemon's (user runtime dir) if one answers there, else the system daemon's "
                   "(/run/gpulayer/gpulayerd.sock) if there is one")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    added: set[str] = set()
    for name, help_line, module in COMMANDS:
        if modules is not None and module not in modules:
            sub.add_parser(name, help=help_line, add_help=False)
        elif module not in added:
            added.add(module)
            mod = importlib.import_module(f"gpulayerd.cli.{module}")
            (getattr(mod, "add_parsers", None) or mod.add_parser)(sub)
    _no_abbreviations(p)
    return p


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width (:func:`gpulayerd.text.terminal_columns`)
    instead of importing ``shutil`` for it (~2 ms of every start: argparse makes one per option)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            from gpulayerd.text import terminal_columns

            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class _ArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help uses :class:`_HelpFormatter`; its subparsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _env_path(name: str) -> Path | None:
    """The path in environment variable ``name``, or None when it is unset or empty
    (:func:`gpulayerd.cli.http.env_path`, without importing that module)."""
    value = os.environ.get(name)
    return Path(value) if value else None


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's prefix matching everywhere: ``--token`` must not silently mean
    ``--token-file`` (and echo a secret in an error)."""
    parser.allow_abbrev = False
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpulayer``; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        # Stubs first: prints `gpulayer --help`, --version and top-level usage errors, and names the
        # command; then the chosen command's module alone (its options, its own --help).
        chosen = _parser(()).parse_known_args(words)[0].command
        args = _parser([m for name, _, m in COMMANDS if name == chosen]).parse_args(words)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if isinstance(getattr(args, "job", None), str) and not args.job.strip():
        print("gpulayer: the job id must not be empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except UsageError as e:
        print(f"gpulayer: {_visible(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as e:
        print(f"gpulayer: {_visible(str(e))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    return code


def _visible(message: str) -> str:
    """An error message as the terminal should show it: each line's control characters made visible
    (a path or name the user typed may hold a NUL or an escape sequence); lines stay lines."""
    from gpulayerd.text import escape

    return "\n".join(escape(line) for line in message.split("\n"))
