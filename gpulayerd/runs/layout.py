"""The run directory of one job attempt: where it is and what files it holds.

``runs_dir/JOB/ATTEMPT/`` (mode 0700) holds, written by the daemon (:mod:`.runner`) or the
watchdog (:mod:`.watchdog`); JSON files are written atomically (:func:`write_json`):

- ``launch.json`` (daemon): ``argv``, ``env`` (the job's full environment), ``cwd``,
  ``grace_s``, ``poll_interval_s``, ``kill_timeout_s``, ``lock_fds``, ``deadline`` (the
  first one).
- ``deadline`` (daemon, written once a lease renewal moves the deadline): a
  ``time.monotonic()`` value as text, or ``none``.
- ``watchdog.json`` (the claim: created exclusively, complete, by whoever comes first: the
  watchdog, with who it is, or a daemon that gives up on the attempt, ``{"abandoned": true}``).
- ``job.json`` (watchdog): who the job is.
- ``exit.json`` (watchdog, last): how the attempt ended.
- ``stdout.log``, ``stderr.log`` (the job's output) and ``watchdog.log``, each created when
  its first byte is written (``watchdog.log`` up front when the watchdog was started with
  ``python -m``, not by the zygote): a job that prints nothing leaves no log file (read as empty).

Every file is a new inode on the state disk, and on some file systems (ext4 without a
journal) allocating one scans past every inode deleted in the last minutes: a trivial job
started through the zygote makes six (two directories, ``launch.json``, ``watchdog.json``,
``job.json``, ``exit.json``), and the runs directory spreads the jobs' directories over the disk
(:func:`spread_job_dirs`).

Standard library only (and :mod:`gpulayerd.host.atomic`, standard library only too): the watchdog
imports this module.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gpulayerd.host import filelocks
from gpulayerd.host.atomic import create_exclusive, write_atomic

__all__ = [
    "ABANDONED",
    "CANCEL_SIGNAL_FILE",
    "DEADLINE_FILE",
    "EXIT_FILE",
    "JOB_FILE",
    "LAUNCH_FILE",
    "LEGACY_CLAIM_FILE",
    "STDERR_LOG",
    "STDOUT_LOG",
    "WATCHDOG_FILE",
    "WATCHDOG_LOG",
    "abandon_run_dir",
    "claim_run_dir",
    "is_abandoned",
    "log_path",
    "read_json",
    "run_dir",
    "spread_job_dirs",
    "write_file",
    "write_json",
]

LAUNCH_FILE = "launch.json"
WATCHDOG_FILE = "watchdog.json"
"""The claim: created exclusively by whichever comes first, the watchdog before it starts the
job (with its process record, :func:`claim_run_dir`), or a daemon that gives up on an attempt
whose watchdog never showed up (``{"abandoned": true}``: after a restart, or when the start timed
out; :func:`abandon_run_dir`). Only one of them can
create it, so an abandoned attempt can never start later."""
ABANDONED: Mapping[str, object] = MappingProxyType({"abandoned": True})
"""``watchdog.json`` of an attempt the daemon gave up on before any watchdog claimed it (after a
restart, or when the start timed out)."""
LEGACY_CLAIM_FILE = "claim"
"""The claim of gpulayer before watchdog.json was the claim: still honoured (:func:`claim_run_dir`,
:func:`abandon_run_dir`)."""
JOB_FILE = "job.json"
EXIT_FILE = "exit.json"
DEADLINE_FILE = "deadline"
CANCEL_SIGNAL_FILE = "cancel_signal"
"""The name of the signal a cancel sends first (``gpulayer cancel --signal``), written before the cancel."""
STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
WATCHDOG_LOG = "watchdog.log"

_FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long), linux/fs.h
_FS_IOC_SETFLAGS = 0x40086602  # _IOW('f', 2, long)
_FS_TOPDIR_FL = 0x00020000  # chattr's T: "top of directory hierarchies"
_FLAGS = struct.Struct("i")  # the kernel reads and writes an int, whatever the macro says

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


def spread_job_dirs(runs_dir: Path) -> bool:
    """Mark ``runs_dir`` the top of a directory hierarchy for ext4's Orlov allocator (``chattr +T``):
    each job's directory (and the files in it) is then placed in a block group with few
    directories, instead of next to every other job's in the runs directory's group.

    Why: ext4 looks for a free inode from the start of the group's inode bitmap, and without a
    journal it reads and skips every free inode deleted in the last 60 s (360 s while its inode
    table block is still dirty). After thousands of old run directories were deleted nearby, each
    file a job's start creates paid a scan of them: ~0.5 ms a file, a third of this 2-core
    machine's CPU at 100 jobs/s (perf: ``recently_deleted``, ``find_inode_bit``; source:
    ``fs/ext4/ialloc.c``). Job directories spread by Orlov land away from such a crowd.

    Linux only and best effort: new subdirectories only; False (nothing changed) on other
    systems, on file systems without the flag (tmpfs, or where the ioctl is refused) or when
    ``runs_dir`` cannot be opened.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        fd = os.open(runs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        (flags,) = _FLAGS.unpack(filelocks.ioctl(fd, _FS_IOC_GETFLAGS, _FLAGS.pack(0)))
        if not flags & _FS_TOPDIR_FL:
            filelocks.ioctl(fd, _FS_IOC_SETFLAGS, _FLAGS.pack(flags | _FS_TOPDIR_FL))
            (flags,) = _FLAGS.unpack(filelocks.ioctl(fd, _FS_IOC_GETFLAGS, _FLAGS.pack(0)))
        return bool(flags & _FS_TOPDIR_FL)
    except OSError:
        return False
    finally:
        os.close(fd)


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
    """Replace ``path`` with ``data`` (UTF-8, mode 0600) atomically, without fsync
    (:func:`gpulayerd.host.atomic.write_atomic` with ``durable=False``).

    A reader sees the old file or the new one, never a part, and the file survives a crash
    of any process; not a crash of the machine (then the job is gone too, and the store,
    written durably, is the truth). Five files per attempt with two fsyncs each cost more than
    the start of a trivial job.

    Raises:
        OSError: it cannot be written (the temporary file is removed).
    """
    write_atomic(path, data, 0o600, durable=False)


def read_json(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``, or None if it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def claim_run_dir(run_dir: Path, record: Mapping[str, object]) -> bool:
    """The watchdog's claim: create ``RUN_DIR/watchdog.json`` holding ``record``, unless it exists;
    True if this caller created it (it wins).

    The file appears complete or not at all (:func:`gpulayerd.host.atomic.create_exclusive`, without
    fsync, like :func:`write_file`). A missing run directory counts as won: nothing can start
    there. A ``claim`` file (:data:`LEGACY_CLAIM_FILE`) counts as a claim already made.

    Raises:
        OSError: it cannot be written (no temporary file is left).
    """
    if (run_dir / LEGACY_CLAIM_FILE).exists():
        return False
    try:
        return create_exclusive(run_dir / WATCHDOG_FILE, json.dumps(dict(record), sort_keys=True) + "\n", 0o600,
                                durable=False)
    except FileNotFoundError:
        return True


def abandon_run_dir(run_dir: Path) -> bool:
    """The daemon's give-up: claim the attempt in ``run_dir`` as :data:`ABANDONED` so that no
    watchdog ever starts it; True if no watchdog had claimed it (a missing run directory counts).

    It creates :data:`LEGACY_CLAIM_FILE` first (an older version's watchdog, started before an
    upgrade, checks that one), then ``watchdog.json``. When the record cannot be written for want
    of space, an empty ``watchdog.json`` stands for it (it needs an inode, no data block;
    :func:`is_abandoned` reads both).

    Raises:
        OSError: not even an empty file can be created (no inode left).
    """
    try:
        os.close(os.open(run_dir / LEGACY_CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False  # an older watchdog claimed it
    except FileNotFoundError:
        return True
    path = run_dir / WATCHDOG_FILE
    try:
        return create_exclusive(path, json.dumps(dict(ABANDONED), sort_keys=True) + "\n", 0o600, durable=False)
    except OSError:  # a full disk: an empty watchdog.json needs only an inode
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
        except FileExistsError:
            return False
        return True


def is_abandoned(run_dir: Path) -> bool:
    """Whether a daemon gave up on the attempt in ``run_dir`` before any watchdog claimed it
    (``watchdog.json`` is :data:`ABANDONED`, or empty: written so on a full disk)."""
    path = run_dir / WATCHDOG_FILE
    try:
        if path.stat().st_size == 0:
            return True
    except OSError:
        return False
    return read_json(path) == dict(ABANDONED)
