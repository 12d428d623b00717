"""``gpulayer``: the command-line interface.

Exit codes: 0 ok, 1 failure, 2 usage error (bad flags, bad job spec, bad input file).
Every command that prints a table takes ``--json``.

One module per group of subcommands (:mod:`~gpulayerd.cli.devices`, :mod:`~gpulayerd.cli.jobs`,
:mod:`~gpulayerd.cli.cluster`, :mod:`~gpulayerd.cli.service`, :mod:`~gpulayerd.cli.tui`); each adds
its parsers and raises :class:`~gpulayerd.cli.errors.UsageError` or
:class:`~gpulayerd.cli.errors.CommandFailed`, which :func:`main` turns into exit codes. Building
the parser imports no HTTP client, model or probe module: a command imports what it uses.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gpulayerd import __version__
from gpulayerd.cli import cluster, devices, jobs, service, tui, users
from gpulayerd.cli.client import env_path
from gpulayerd.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CommandFailed, UsageError

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``gpulayer`` argument parser: global flags and every subcommand (each sets ``func``)."""
    p = argparse.ArgumentParser(
        prog="gpulayer",
        description="GPU compute sharing for a lab's workstations: submit jobs that run on any machine of "
        "the cluster that fits, see every device, job and user, and why a job waits, runs where it does, or "
        "how it ended.",
        allow_abbrev=False,
    )
    p.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    p.add_argument("--state-dir", type=Path, metavar="DIR", default=env_path("GPULAYER_STATE_DIR"),
                   help="talk to the gpulayerd using this state dir (env GPULAYER_STATE_DIR)")
    p.add_argument("--socket", type=Path, metavar="PATH", default=env_path("GPULAYER_SOCKET"),
                   help="the daemon's unix socket (env GPULAYER_SOCKET); default: from --state-dir, else "
                   "your personal daemon's (user runtime dir) if one answers there, else the system daemon's "
                   "(/run/gpulayer/gpulayerd.sock) if there is one")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    devices.add_parsers(sub)
    jobs.add_parsers(sub)
    tui.add_parser(sub)
    cluster.add_parser(sub)
    service.add_parser(sub)
    users.add_parser(sub)
    _no_abbreviations(p)
    return p


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
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if isinstance(getattr(args, "job", None), str) and not args.job.strip():
        print("gpulayer: the job id must not be empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except UsageError as e:
        print(f"gpulayer: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as e:
        print(f"gpulayer: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    return code
