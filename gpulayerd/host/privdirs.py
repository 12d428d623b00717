"""Private directories: the daemon's state and socket dirs, 0700, owned by its account (the
system-mode socket dir: 0755, :func:`make_public_dir`).

Blocking file work: call these in a thread (``asyncio.to_thread``).

A directory given as a symbolic link is refused, and its target left unchanged (root following a
link planted by someone else would tighten, or write into, a directory that is not the daemon's).
A directory the daemon owns and keeps its state in is tightened to 0700 whatever its mode was
(a state dir made 0755 by hand would let other local users read the job environments in the
database). A directory that is owned by another account, or that anyone may write to (a shared
runtime dir such as ``/tmp``, mode 1777), is refused with :class:`UnsafeDirectory` and left as it
was: tightening it would break its other users, and using it would let them swap our files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PUBLIC_DIR_MODE", "UnsafeDirectory", "check_private_dir", "make_private_dirs",
           "make_public_dir"]

PRIVATE_DIR_MODE = 0o700
PUBLIC_DIR_MODE = 0o755


class UnsafeDirectory(OSError):
    """A directory the daemon would keep its state in is not safe to use; nothing was changed."""


def check_private_dir(path: Path, st: os.stat_result, uid: int) -> None:
    """Refuse ``path`` (already stat-ed as ``st``) unless it is a directory of ``uid`` that others cannot write.

    Raises:
        UnsafeDirectory: not a directory, owned by another account, or world-writable.
    """
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"refusing {path}: it is not a directory")
    if st.st_uid != uid:
        raise UnsafeDirectory(
            f"refusing {path}: it is owned by uid {st.st_uid}, not by this daemon's account (uid {uid}); "
            "give the daemon a directory of its own (--state-dir / --runtime-dir)")
    if st.st_mode & stat.S_IWOTH:
        raise UnsafeDirectory(
            f"refusing {path}: anyone may write to it (mode {stat.S_IMODE(st.st_mode):04o}), e.g. a shared "
            "runtime dir; give the daemon a directory of its own (--state-dir / --runtime-dir)")


def _refuse_link(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"refusing {path}: it is a symbolic link (to {os.readlink(path)}); give the daemon "
                              "a real directory (its target was left unchanged)")


def _open_dir(path: Path) -> int:
    """The directory at ``path``, opened without following a symbolic link in its last part.

    Raises:
        UnsafeDirectory: it is a symbolic link (swapped in since it was checked).
    """
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and path.is_symlink():
            raise UnsafeDirectory(f"refusing {path}: it is a symbolic link; give the daemon a real directory") from e
        raise


def make_private_dirs(paths: Sequence[Path], *, uid: int | None = None) -> None:
    """Create the missing ones of ``paths`` (and their parents) and make every one 0700.

    Every existing path is checked first: if one is refused, none is created or changed.

    Args:
        paths: directories the daemon owns and keeps its state in (state dir, runs dir, socket dir).
        uid: the account that must own them (default: this process's effective uid).

    Raises:
        UnsafeDirectory: one of them is not a directory, is owned by another account or is world-writable.
        OSError: one cannot be created or changed.
    """
    owner = os.geteuid() if uid is None else uid
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        _refuse_link(path, st)
        check_private_dir(path, st, owner)
    for path in paths:
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        # Checked again on the open directory itself: what is changed is what was checked.
        fd = _open_dir(path)
        try:
            st = os.fstat(fd)
            check_private_dir(path, st, owner)
            if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
                os.fchmod(fd, PRIVATE_DIR_MODE)
        finally:
            os.close(fd)


def make_public_dir(path: Path, *, uid: int | None = None) -> None:
    """Create ``path`` (and its parents) if missing and make it 0755: everyone may enter, only its owner write.

    The system-mode socket's directory (``/run/gpulayer``): every local account must reach the
    socket, nobody but the daemon's account may replace it. Checked like :func:`make_private_dirs`
    (an existing directory of another account, or one anyone may write to, is refused unchanged).

    Args:
        path: the directory.
        uid: the account that must own it (default: this process's effective uid).

    Raises:
        UnsafeDirectory: it is not a directory, is owned by another account or is world-writable.
        OSError: it cannot be created or changed.
    """
    owner = os.geteuid() if uid is None else uid
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        _refuse_link(path, st)
        check_private_dir(path, st, owner)
    path.mkdir(parents=True, exist_ok=True, mode=PUBLIC_DIR_MODE)
    fd = _open_dir(path)
    try:
        st = os.fstat(fd)
        check_private_dir(path, st, owner)
        if stat.S_IMODE(st.st_mode) != PUBLIC_DIR_MODE:
            os.fchmod(fd, PUBLIC_DIR_MODE)
    finally:
        os.close(fd)
