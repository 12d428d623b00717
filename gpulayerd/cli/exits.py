"""The CLI's exit codes and the two errors its commands raise; :func:`gpulayerd.cli.main` maps them.

Every ``gpulayer`` command module imports these from here, so no command module imports the
package that wires them together.
"""

from __future__ import annotations

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TIMEOUT", "EXIT_USAGE", "CommandFailed", "UsageError"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
"""``gpulayer run``'s exit code for a job that reached its time limit (as coreutils' ``timeout``)."""
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input from the user: printed as one message, exit code 2."""


class CommandFailed(Exception):
    """The command could not do its work: printed as one message, exit code 1."""
