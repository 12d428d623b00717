"""A mount point that never answers, like a hard NFS mount whose server is gone.

:func:`hung_mount` mounts a FUSE filesystem with ``mount(2)`` and keeps the ``/dev/fuse``
descriptor in this process without ever reading it: the kernel's FUSE_INIT goes
unanswered, so every lookup, ``stat`` or ``getattr`` under the mount point blocks (in
the kernel, killable only by SIGKILL) until the connection ends. No FUSE library or
``fusermount`` is needed; it needs root (``CAP_SYS_ADMIN``) and ``/dev/fuse``.

The process that holds the descriptor must never touch the mount itself. Leaving the
context closes the descriptor, which aborts the connection (every blocked call returns
at once with ``ENOTCONN``), and then detaches the mount (``umount2(MNT_DETACH)``, what
``umount -l`` does). If this process dies, the kernel closes the descriptor too, so the
mount can go stale but never stays hung.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["HungMountError", "hung_mount"]

MNT_DETACH = 2
_MOUNT_FLAGS = 0x2 | 0x4  # MS_NOSUID | MS_NODEV


class HungMountError(RuntimeError):
    """The hung filesystem could not be mounted here (not root, no /dev/fuse, no mount(2))."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _detach(libc: ctypes.CDLL, mount_point: Path) -> None:
    if libc.umount2(os.fsencode(mount_point), MNT_DETACH) != 0:
        errno = ctypes.get_errno()
        if errno not in (22, 2):  # EINVAL: not mounted (any more); ENOENT: gone
            raise OSError(errno, f"umount2({mount_point}, MNT_DETACH): {os.strerror(errno)}")


@contextlib.contextmanager
def hung_mount(mount_point: Path) -> Iterator[Path]:
    """Mount at ``mount_point`` (an existing, empty directory) a filesystem that never answers.

    Yields ``mount_point``. Any path under it (``mount_point / "work"`` too) blocks whoever
    looks at it until the context ends.

    Raises:
        HungMountError: ``/dev/fuse`` cannot be opened or ``mount(2)`` fails (e.g. not root).
    """
    libc = _libc()
    try:
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise HungMountError(f"cannot open /dev/fuse: {e.strerror} (needs root and the fuse module)") from e
    try:
        opts = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
        if (
            libc.mount(
                b"gpulayer-hungfs", os.fsencode(mount_point), b"fuse.gpulayer-hungfs", _MOUNT_FLAGS, opts.encode()
            )
            != 0
        ):
            errno = ctypes.get_errno()
            raise HungMountError(f"mount -t fuse {mount_point}: {os.strerror(errno)} (needs root)")
    except BaseException:
        os.close(fd)
        raise
    try:
        yield mount_point
    finally:
        os.close(fd)  # aborts the connection: every blocked call now fails with ENOTCONN
        _detach(libc, mount_point)
