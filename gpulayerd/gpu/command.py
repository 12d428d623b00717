"""The one way gpulayerd runs an external command: its own process group, a hard timeout.

:func:`run_bounded` is the routine: it reads stdout and stderr as they come, and on
timeout (or when stdout grows past a limit) kills the command's whole process group, so
a hung tool's children die too. :func:`run_command` wraps it for tools (nvidia-smi,
rocm-smi, sysctl, ...): ``LC_ALL=C``, text out, never raises for a tool's failure.
:class:`CommandRunner` is the shape of ``run_command``; tests pass their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["DEVNULL", "PIPE", "STDOUT", "CommandResult", "CommandRunner", "Popen", "RunOutcome", "SubprocessError",
           "TimeoutExpired", "decisive_line", "run_bounded", "run_command"]

# This module is the one importer of subprocess (a contract in pyproject.toml): the rest of the daemon
# starts processes (watchdogs, jobs, the zygote, probes) with these.
Popen = subprocess.Popen
DEVNULL = subprocess.DEVNULL
PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
TimeoutExpired = subprocess.TimeoutExpired
SubprocessError = subprocess.SubprocessError

STDERR_TAIL_BYTES = 8192
"""How much of the end of stderr :func:`run_bounded` keeps apart from its head."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one command run by :func:`run_bounded` did.

    Attributes:
        returncode: its exit status (negative N: killed by signal N); None if it could not
            be reaped.
        stdout: all of its standard output (up to the limit, then a little more).
        stderr_head: the first ``max_output_bytes`` of its standard error (all of it
            without a limit).
        stderr_tail: the last ``STDERR_TAIL_BYTES`` of its standard error.
        timed_out: it ran past its timeout and its process group was killed.
        overflowed: its stdout passed ``max_output_bytes`` and its process group was killed.
    """

    returncode: int | None
    stdout: bytes
    stderr_head: bytes
    stderr_tail: bytes
    timed_out: bool
    overflowed: bool


def run_bounded(
    argv: Sequence[str],
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
    cwd: str | None = None,
    as_ids: tuple[int, int] | None = None,
) -> RunOutcome:
    """Run ``argv`` in its own process group; kill the group on timeout or too much stdout.

    The command's stdin is ``/dev/null``. Reading stops when both pipes close (a child
    that keeps them open keeps the command running, up to the timeout).

    Args:
        argv: the program (a path, or a name looked up on PATH) and its arguments.
        timeout_s: wall-clock limit in seconds for the whole run.
        env: the command's complete environment; None inherits this process's.
        max_output_bytes: stdout beyond this many bytes kills the command, and only this
            much of stderr's head is kept; None for no limit.
        started: called with the process once it runs (its pid is its process group's id),
            e.g. to kill it early from another thread.
        cwd: the working directory; None keeps this process's.
        as_ids: (uid, gid) to run as, with no supplementary groups (needs root); None: as this process.

    Returns:
        What the command did.

    Raises:
        OSError: the program could not be started at all (FileNotFoundError when it
            does not exist).
    """
    limit = max_output_bytes
    deadline = time.monotonic() + timeout_s
    stdout, stderr_head, stderr_tail = bytearray(), bytearray(), bytearray()
    timed_out = overflowed = False
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if env is None else dict(env),
        start_new_session=True,
        cwd=cwd,
        user=None if as_ids is None else as_ids[0],
        group=None if as_ids is None else as_ids[1],
        extra_groups=None if as_ids is None else [],
    )
    try:
        if started is not None:
            started(proc)
        if proc.stdout is None or proc.stderr is None:  # pragma: no cover - PIPE always sets them
            raise OSError("no pipes to the subprocess")
        stdout_fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            selector.register(proc.stderr, selectors.EVENT_READ)
            while selector.get_map() and not overflowed:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(remaining_s):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    if key.fd == stdout_fd:
                        stdout += chunk
                        overflowed = limit is not None and len(stdout) > limit
                        continue
                    # stderr: the head holds what comes first (a checkpoint), the tail the last words
                    stderr_head += chunk if limit is None else chunk[: max(limit - len(stderr_head), 0)]
                    stderr_tail += chunk
                    if len(stderr_tail) > 2 * STDERR_TAIL_BYTES:
                        del stderr_tail[:-STDERR_TAIL_BYTES]
        if not (timed_out or overflowed):
            try:
                proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out or overflowed:
            _kill_group(proc)
            proc.wait()
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return RunOutcome(
        returncode=proc.returncode,
        stdout=bytes(stdout),
        stderr_head=bytes(stderr_head),
        stderr_tail=bytes(stderr_tail[-STDERR_TAIL_BYTES:]),
        timed_out=timed_out,
        overflowed=overflowed,
    )


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What one external command did.

    Attributes:
        stdout: its standard output, decoded as UTF-8 (bad bytes replaced).
        stderr: its standard error, decoded the same way (or why it could not start).
        returncode: its exit status; None if it timed out or never started.
        timed_out: it ran past its timeout and its process group was killed.
        not_found: the executable does not exist.
    """

    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    not_found: bool = False


class CommandRunner(Protocol):
    """Runs one external command to completion or timeout; never raises for tool failures."""

    def __call__(
        self, argv: Sequence[str], timeout_s: float, env_overrides: Mapping[str, str] | None = None
    ) -> CommandResult:
        """Run ``argv`` with at most ``timeout_s`` seconds of wall time."""
        ...


def run_command(
    argv: Sequence[str],
    timeout_s: float,
    env_overrides: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run a tool with ``LC_ALL=C`` in its own process group under a hard timeout.

    The child inherits this process's environment plus ``env_overrides``, then
    ``LC_ALL=C`` and ``LANG=C`` so numbers never come out with a locale's decimal comma.
    On timeout the whole process group gets SIGKILL (:func:`run_bounded`).

    Args:
        argv: the program (a path, or a name looked up on the child's PATH) and arguments.
        timeout_s: wall-clock limit in seconds.
        env_overrides: extra environment variables for the child.

    Returns:
        The result; a missing executable gives ``not_found=True``, any other failure to
        start gives ``returncode=None`` with the reason in ``stderr``. Output read before
        a timeout is kept.
    """
    env = dict(os.environ)
    env.update(env_overrides or {})
    env.update({"LC_ALL": "C", "LANG": "C"})
    try:
        outcome = run_bounded(argv, timeout_s, env=env)
    except FileNotFoundError as e:
        return CommandResult(stderr=str(e), not_found=True)
    except OSError as e:
        return CommandResult(stderr=str(e))
    return CommandResult(
        stdout=_decode(outcome.stdout),
        stderr=_decode(outcome.stderr_head),
        returncode=None if outcome.timed_out else outcome.returncode,
        timed_out=outcome.timed_out,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


_DECISIVE = re.compile(r"\b(error|errors|failed|failure|fail|unable)\b", re.IGNORECASE)


def decisive_line(lines: Sequence[str]) -> str:
    """The line of a tool's output that says what went wrong: the first non-blank line that
    says error/failed (or unable), else the first non-blank line; "" when there is none."""
    kept = [ln.strip() for ln in lines if ln.strip()]
    return next((ln for ln in kept if _DECISIVE.search(ln)), kept[0] if kept else "")
