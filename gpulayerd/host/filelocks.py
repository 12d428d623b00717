"""File locks (``flock``), file-system flags (``ioctl``) and pipe sizes (``F_SETPIPE_SZ``): the one
importer of fcntl (a contract in pyproject.toml). The machine lock, the state-dir lock, device locks,
the identity dir's lock and the runs dir's ``chattr +T`` use these; the stream of a shipped job's
unpack goes through a widened pipe.
"""

from __future__ import annotations

import errno
import fcntl

__all__ = ["ioctl", "lock", "unlock", "widen_pipe"]

ioctl = fcntl.ioctl
"""``ioctl(fd, request, arg)``: file-system flags (``FS_IOC_GETFLAGS``/``SETFLAGS``)."""


def lock(fd: int, *, shared: bool = False, wait: bool = True) -> bool:
    """``flock`` ``fd``: exclusive (or ``shared``), waiting for it (or not, with ``wait`` False).

    Returns:
        True when held; False when ``wait`` is False and another descriptor holds a conflicting lock.

    Raises:
        OSError: any other failure (a bad descriptor, no locks on this file system).
    """
    how = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, how)
    except OSError as e:
        if not wait and e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def unlock(fd: int) -> None:
    """Release ``fd``'s ``flock`` (closing the last descriptor of the open file does it too)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


def widen_pipe(fd: int, size: int = 1 << 20) -> bool:
    """Give the pipe ``fd`` a buffer of ``size`` bytes (Linux ``F_SETPIPE_SZ``): a stream then moves in
    pieces that large instead of 64 KiB ones, far fewer switches between its writer and reader.

    Returns:
        True when set; False where the system has no such call or refuses it (over
        ``/proc/sys/fs/pipe-max-size`` for this account, not a pipe): the default stays. Never raises.
    """
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is None:
        return False
    try:
        fcntl.fcntl(fd, set_size, size)
    except OSError:
        return False
    return True
