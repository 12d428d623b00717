"""Atomic file writes: a reader sees the old file or the new one, never a part.

Standard library only: the per-job watchdog imports this module and its start-up time matters.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

__all__ = ["create_exclusive", "fsync_dir", "write_atomic"]


def write_atomic(path: Path, data: bytes | str, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    The data goes to a temporary file in the same directory (created with ``mode``, never
    readable by others while it is written), is flushed and fsynced, gets ``mode`` (not cut by
    the umask), and is renamed over ``path``; then the directory is fsynced so the rename
    survives a crash. A ``str`` is written as UTF-8.

    Args:
        path: the file to replace; its directory must exist.
        data: the new content.
        mode: permission bits of the new file (default 0600).
        durable: False skips both fsyncs: still atomic for every reader and across a crash of
            any process, not across a crash of the machine.

    Raises:
        OSError: the file could not be written or renamed (the temporary file is removed).
    """
    tmp = _write_tmp(path, data.encode("utf-8") if isinstance(data, str) else data, mode, durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def create_exclusive(path: Path, data: bytes | str, mode: int = 0o600, *, durable: bool = True) -> bool:
    """Create ``path`` with ``data`` atomically unless it exists.

    Like :func:`write_atomic` (``durable`` too), but the complete file is linked into place only
    if no file of that name exists, so concurrent callers never overwrite each other.

    Returns:
        True if this call created the file, False if it existed already.

    Raises:
        OSError: the file could not be written or linked (no temporary file is left).
    """
    tmp = _write_tmp(path, data.encode("utf-8") if isinstance(data, str) else data, mode, durable)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if durable:
        fsync_dir(path.parent)
    return True


def fsync_dir(directory: Path) -> None:
    """fsync ``directory`` so renames and links in it are durable; errors are ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_tmp(path: Path, data: bytes, mode: int, durable: bool = True) -> Path:
    """Write ``data`` to a new temporary file next to ``path``, with ``mode``; fsynced if ``durable``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crashed process with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode & 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp
