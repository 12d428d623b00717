"""One gpulayerd per machine: ``<device_lock_dir>/gpulayerd.lock``, held for the daemon's life.

The lock dir is the machine-wide one of the device locks (:mod:`gpulayerd.runs.devicelock`,
default ``/tmp/gpulayer-locks``, sticky and world-writable like /tmp), so a system-mode daemon
(root) and every user's personal one meet on the same file. The file is 0666 like the device
lock files: any account's daemon must be able to open it, lock it and write who it is.

Who holds it is written into the file as one JSON object (pid, mode, socket, state dir, uid),
so that a second daemon can say which one runs and how to reach it. The file is only opened
with ``O_NOFOLLOW``, must be a regular file with one link, and is never created over an
existing one (``O_EXCL``: a file of another account in a sticky directory cannot be opened with
``O_CREAT`` under ``fs.protected_regular``). Any local account can open the file and hold the
lock (``flock`` needs no write access), so a lock is only believed when its holder is a
gpulayerd: the kernel names the process holding it (``/proc/locks``), and its command line
must be a gpulayerd's. A system-mode daemon (root) finding the lock held by anything else
starts anyway, with a warning naming the process: no account can keep the lab's daemon from
starting by holding a file. (A real personal gpulayerd does stop it, as the issue asks: an
admin sees which one, and whose, in the message.)

Blocking file work: call these in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpulayerd.host import filelocks

__all__ = ["LOCK_NAME", "Holder", "MachineLocked", "acquire_machine_lock", "acquire_system_lock", "check_system_lock",
           "lock_holder_pids", "read_holder", "release_machine_lock"]

log = logging.getLogger(__name__)

LOCK_NAME = "gpulayerd.lock"
_LOCK_DIR_MODE = 0o1777
_LOCK_FILE_MODE = 0o666
_MAX_INFO_BYTES = 64 * 1024


class MachineLocked(RuntimeError):
    """Another gpulayerd holds the machine lock; the message names it and how to reach it.

    Attributes:
        holder: what the running daemon wrote about itself (None when unreadable).
    """

    def __init__(self, message: str, holder: Holder | None) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True, slots=True)
class Holder:
    """The daemon holding the machine lock, as it describes itself.

    Attributes:
        pid: its process id.
        mode: ``personal`` or ``system``.
        socket: its local API's unix socket (absolute path).
        state_dir: its state dir.
        uid: the account it runs as.
    """

    pid: int
    mode: str
    socket: str
    state_dir: str
    uid: int

    def describe(self) -> str:
        """``pid 1234, system mode, socket /run/gpulayer/gpulayerd.sock``."""
        return f"pid {self.pid}, {self.mode} mode, socket {self.socket}"


def _ensure_dir(lock_dir: Path, strict_owner: bool = False) -> None:
    """Make the lock dir (1777) if missing; refuse a symbolic link there (root would follow it), and,
    with ``strict_owner``, a directory owned by another account than root or ours (its owner may
    delete the lock files of everybody in it, sticky bit or not).

    Raises:
        OSError: ``lock_dir`` is a symbolic link, another account's, or cannot be made.
    """
    if lock_dir.is_symlink():
        raise OSError(errno.ELOOP, f"refusing the lock dir {lock_dir}: it is a symbolic link (to "
                      f"{os.readlink(lock_dir)}); remove it, or set device_lock_dir to a real directory")
    if lock_dir.is_dir():
        owner = lock_dir.lstat().st_uid
        if strict_owner and owner not in (0, os.geteuid()):
            raise OSError(errno.EPERM, f"refusing the lock dir {lock_dir}: it is owned by uid {owner}, who may "
                          "delete any lock file in it; remove it (root recreates it), or set device_lock_dir to a "
                          "directory of root's or your own")
        return
    lock_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        lock_dir.mkdir(mode=_LOCK_DIR_MODE)
    except FileExistsError:
        return
    os.chmod(lock_dir, _LOCK_DIR_MODE)  # mkdir's mode is cut by the umask


def _open(path: Path) -> tuple[int, bool]:
    """Open (or create) the lock file: (descriptor, whether it was opened for writing)."""
    base = os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(5):
        try:
            return os.open(path, os.O_RDWR | base), True
        except PermissionError:
            return os.open(path, os.O_RDONLY | base), False  # someone else's file, not writable: lock only
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | base, _LOCK_FILE_MODE)
        except FileExistsError:
            continue  # another daemon made it first: open theirs
        with contextlib.suppress(OSError):
            os.fchmod(fd, _LOCK_FILE_MODE)  # the umask cut it down; other accounts must open it
        return fd, True
    raise OSError(errno.EAGAIN, f"cannot open {path}: it keeps appearing and disappearing")


def read_holder(path: Path) -> Holder | None:
    """What the holder of the lock file at ``path`` wrote about itself, or None (missing, empty, garbled)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _parse(os.read(fd, _MAX_INFO_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)


def _parse(raw: bytes) -> Holder | None:
    try:
        data: Any = json.loads(raw.decode("utf-8"))
        return Holder(pid=int(data["pid"]), mode=str(data["mode"]), socket=str(data["socket"]),
                      state_dir=str(data["state_dir"]), uid=int(data["uid"]))
    except (ValueError, KeyError, TypeError):
        return None


def lock_holder_pids(fd: int, proc_locks: Path = Path("/proc/locks")) -> list[int]:
    """Pids of the processes holding a ``flock`` on the file open at ``fd``, from the kernel.

    ``/proc/locks`` lines read ``1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF``: the pid and
    ``major:minor:inode`` (hex device numbers) of each lock. [] where there is no such file
    (not Linux) or no lock on this inode.
    """
    st = os.fstat(fd)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        text = proc_locks.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    pids = []
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        try:
            kind_at = fields.index("FLOCK")
            pid, where = int(fields[kind_at + 3]), fields[kind_at + 4]
            major, minor, inode = where.split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                pids.append(pid)
        except (ValueError, IndexError):
            continue
    return pids


def _is_gpulayerd(pid: int) -> bool:
    """Whether process ``pid`` is a gpulayerd (its command line runs ``gpulayerd``); True when unknowable."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except FileNotFoundError:
        return False  # gone meanwhile
    except OSError:
        return True  # cannot tell (not Linux): believe the lock
    return any(Path(a.decode(errors="replace")).name in ("gpulayerd", "gpulayerd.__main__") or a == b"gpulayerd"
               for a in argv[:4])


def _link_target(path: Path) -> str:
    """Where the symbolic link ``path`` points, for a message (``?`` when it cannot be read)."""
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def acquire_machine_lock(lock_dir: Path, me: Holder, *, strict_owner: bool = False) -> int:
    """Take this machine's gpulayerd lock in ``lock_dir`` without waiting, and write ``me`` into it.

    Args:
        lock_dir: the machine-wide device lock dir (created 1777 if missing).
        me: this daemon, as the next one to start will be told.
        strict_owner: refuse a lock dir owned by another account than root or this one (a personal
            daemon: the lock dir's owner could delete its lock file and let a second daemon start).

    Returns:
        The descriptor holding the lock; close it (:func:`release_machine_lock`) to let go.

    Raises:
        MachineLocked: another daemon holds it (message: which one, how to reach it).
        OSError: the lock dir or file cannot be made or opened, or the file is not a plain file.
    """
    _ensure_dir(lock_dir, strict_owner)
    path = lock_dir / LOCK_NAME
    try:
        fd, writable = _open(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"refusing the machine lock {path}: it is a symbolic link (to "
                          f"{_link_target(path)}), which gpulayerd never follows; remove it "
                          f"(rm {path})") from e
        raise OSError(e.errno, f"cannot open the machine lock {path}: {e.strerror or e} (every gpulayerd "
                      "on this machine must be able to open it: check the mode of its directory)") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EINVAL, f"refusing the machine lock {path}: not a plain file with one link; "
                          "remove it")
        if not filelocks.lock(fd, wait=False):
            holder = _parse(os.pread(fd, _MAX_INFO_BYTES, 0))
            pids = lock_holder_pids(fd)
            if me.mode == "system" and pids and not any(_is_gpulayerd(p) for p in pids):
                log.warning("the machine lock %s is held by pid %s, which is not a gpulayerd: starting anyway "
                            "(a process holding the file cannot keep the system daemon from starting)",
                            path, ",".join(map(str, pids)))
                return fd  # held open without the lock: released like a lock at shutdown
            who = holder.describe() if holder is not None else f"its details are not in {path}"
            raise MachineLocked(f"gpulayerd is already running on this machine ({who}); use it, or stop it "
                                "first", holder)
        if writable:
            body = json.dumps(asdict(me), separators=(",", ":")).encode() + b"\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, body, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release_machine_lock(fd: int) -> None:
    """Clear what this daemon wrote (when it may) and let go of the lock."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    with contextlib.suppress(OSError):
        os.close(fd)


def acquire_system_lock(run_dir: Path, me: Holder) -> int:
    """Take the system daemon's lock ``<run_dir>/gpulayerd.lock`` (root's runtime dir, ``/run/gpulayer``
    by default, 0755: no other account can plant or replace anything in it), and write ``me`` into it.

    The file is 0644: any account's daemon opens it read-only, and ``flock`` works on a read-only
    descriptor, so a personal daemon sees the system one (:func:`check_system_lock`).

    Returns:
        The descriptor holding the lock (:func:`release_machine_lock` lets go).

    Raises:
        MachineLocked: another system daemon holds it.
        OSError: the file is a symbolic link, not a plain file, or cannot be made.
    """
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"refusing the machine lock {path}: it is a symbolic link (to "
                          f"{_link_target(path)}), which gpulayerd never follows; remove it (rm {path})") from e
        raise OSError(e.errno, f"cannot open the machine lock {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            raise OSError(errno.EINVAL, f"refusing the machine lock {path}: not a plain file of this account with "
                          "one link; remove it")
        os.fchmod(fd, 0o644)
        if not filelocks.lock(fd, wait=False):
            holder = _parse(os.pread(fd, _MAX_INFO_BYTES, 0))
            who = holder.describe() if holder is not None else f"its details are not in {path}"
            raise MachineLocked(f"gpulayerd is already running on this machine ({who}); use it, or stop it first",
                                holder)
        body = json.dumps(asdict(me), separators=(",", ":")).encode() + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, body, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_system_lock(run_dir: Path) -> None:
    """Stop a personal daemon when the system daemon runs: its lock ``<run_dir>/gpulayerd.lock`` is held.

    Opened read-only without following a link (a missing file, or one this account may not open,
    means no system daemon can be told apart: nothing is refused); a shared ``flock`` that would
    block means the system daemon holds it.

    Raises:
        MachineLocked: the system daemon runs (the message names it and its socket).
    """
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            held_elsewhere = not filelocks.lock(fd, shared=True, wait=False)
        except OSError:
            return
        if held_elsewhere:
            holder = _parse(os.pread(fd, _MAX_INFO_BYTES, 0))
            who = holder.describe() if holder is not None else f"system mode, lock {path}"
            raise MachineLocked(f"gpulayerd is already running on this machine ({who}); use it, or stop it first",
                                holder)
    finally:
        os.close(fd)
