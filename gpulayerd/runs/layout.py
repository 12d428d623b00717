"""The run directory of one job attempt: where it is and what files it holds.

``runs_dir/JOB/ATTEMPT/`` (mode 0700) holds, written by the daemon (:mod:`.runner`) or the
watchdog (:mod:`.watchdog`); JSON files are written atomically (:func:`write_json`):

- ``launch.json`` (daemon): ``argv``, ``env`` (the job's full environment), ``cwd``,
  ``grace_s``, ``poll_interval_s``, ``kill_timeout_s``, ``lock_fds``.
- ``deadline`` (daemon, moved on every lease renewal): a ``time.monotonic()`` value as text.
- ``claim`` (whoever comes first: the watchdog, or a daemon that gives up on the attempt).
- ``watchdog.json`` and ``job.json`` (watchdog): who the watchdog and the job are.
- ``exit.json`` (watchdog, last): how the attempt ended.
- ``stdout.log``, ``stderr.log`` (the job's output) and ``watchdog.log``.

Standard library only: the watchdog imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CLAIM_FILE",
    "DEADLINE_FILE",
    "EXIT_FILE",
    "JOB_FILE",
    "LAUNCH_FILE",
    "STDERR_LOG",
    "STDOUT_LOG",
    "WATCHDOG_FILE",
    "WATCHDOG_LOG",
    "claim_run_dir",
    "log_path",
    "read_json",
    "run_dir",
    "write_file",
    "write_json",
]

LAUNCH_FILE = "launch.json"
WATCHDOG_FILE = "watchdog.json"
JOB_FILE = "job.json"
EXIT_FILE = "exit.json"
CLAIM_FILE = "claim"
"""Created (O_EXCL) by whichever comes first: the watchdog, before it starts the job, or a
restarted daemon that gives up on an attempt whose watchdog never showed up. Only one of
them can create it, so an abandoned attempt can never start later."""
DEADLINE_FILE = "deadline"
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
WATCHDOG_LOG = "watchdog.log"

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def run_dir(runs_dir: Path, job_id: str, attempt: int) -> Path:
    """``runs_dir/JOB/ATTEMPT``: the run directory of one attempt.

    Raises:
        ValueError: ``job_id`` is not a plain name (letters, digits, ``._-``, at most 128
            characters, not starting with ``.``, ``_`` or ``-``) or ``attempt`` is below 1.
    """
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"job id {job_id!r} is not a plain file name")
    if attempt < 1:
        raise ValueError(f"attempt must be at least 1, not {attempt}")
    return Path(runs_dir) / job_id / str(attempt)


def log_path(runs_dir: Path, job_id: str, attempt: int, stream: str) -> Path:
    """The job's output log of an attempt: ``stream`` is ``stdout`` or ``stderr``.

    Raises:
        ValueError: as :func:`run_dir`, or ``stream`` is neither ``stdout`` nor ``stderr``.
    """
    if stream not in ("stdout", "stderr"):
        raise ValueError(f"stream must be stdout or stderr, not {stream!r}")
    return run_dir(runs_dir, job_id, attempt) / (STDOUT_LOG if stream == "stdout" else STDERR_LOG)


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Write ``data`` as JSON (sorted keys) with :func:`write_file`, mode 0600.

    Raises:
        OSError: it cannot be written.
    """
    write_file(path, json.dumps(data, sort_keys=True) + "\n")


def write_file(path: Path, data: str) -> None:
    """Replace ``path`` with ``data`` (UTF-8, mode 0600) atomically, without fsync.

    A reader sees the old file or the new one, never a part, and the file survives a crash
    of any process; not a crash of the machine (then the job is gone too, and the store,
    written durably, is the truth). Five files per attempt with two fsyncs each cost more than
    the start of a trivial job.

    Raises:
        OSError: it cannot be written (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crashed process with the same pid
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data.encode("utf-8"))
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``, or None if it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def claim_run_dir(run_dir: Path, who: str) -> bool:
    """Create ``RUN_DIR/claim`` exclusively; True if this caller created it (it wins).

    A missing run directory counts as won by the caller: nothing can start there.
    """
    try:
        fd = os.open(run_dir / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except FileNotFoundError:
        return True
    try:
        os.write(fd, who.encode())
    finally:
        os.close(fd)
    return True
