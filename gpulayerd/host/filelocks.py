"""File locks (``flock``) and file-system flags (``ioctl``): the one importer of fcntl (a contract
in pyproject.toml). The machine lock, the state-dir lock, device locks, the identity dir's lock and
the runs dir's ``chattr +T`` use these.
"""

from __future__ import annotations

import errno
import fcntl

__all__ = ["ioctl", "lock", "unlock"]

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
