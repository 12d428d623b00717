"""Machine-wide device locks: two users' daemons on one machine never grant the same GPU.

One lock file per device, ``<lock_dir>/<sanitised uuid>.lock``, locked with
``flock(LOCK_EX | LOCK_NB)``. ``lock_dir`` is shared by every user of the machine
(created sticky and world-writable, 0o1777, like /tmp; lock files 0o666), and must be
on a local file system.

A flock belongs to the open file description, not to a process: it lives as long as
any descriptor for it is open, in whichever process. The daemon passes its descriptors
to the job's watchdog (``pass_fds``) and then closes its own copies, so the lock lives
exactly as long as the watchdog holds it, even if the daemon is killed. For the same
reason :meth:`DeviceLocks.release` only closes: an explicit ``LOCK_UN`` would unlock
the description for the watchdog too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpulayerd.host import filelocks

__all__ = ["DeviceLockError", "DeviceLocks"]

LOCK_DIR_MODE = 0o1777
LOCK_FILE_MODE = 0o666
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME_CHARS = 120


class DeviceLockError(Exception):
    """A lock file cannot be created or opened (permissions, a symlink planted in its place)."""


class DeviceLocks:
    """Per-device exclusive locks shared by every process on this machine.

    Args:
        lock_dir: the shared directory, e.g. ``/tmp/gpulayer-locks``; created on first
            use if missing.
    """

    def __init__(self, lock_dir: Path) -> None:
        self._lock_dir = Path(lock_dir)

    def path_for(self, uuid: str) -> Path:
        """The lock file of device ``uuid`` (characters other than ``A-Za-z0-9._-`` become ``_``)."""
        name = _UNSAFE.sub("_", uuid)
        if len(name) > _MAX_NAME_CHARS or name.strip(".") == "":
            digest = hashlib.sha256(uuid.encode()).hexdigest()[:16]
            name = f"{name[:_MAX_NAME_CHARS - 17].strip('.')}-{digest}"
        return self._lock_dir / f"{name}.lock"

    def try_acquire(self, uuids: Sequence[str]) -> list[int] | None:
        """Lock every device in ``uuids``, or none of them.

        Returns:
            The open descriptors holding the locks (one per distinct uuid, in order), or
            None if any device is locked by someone else (or by this process through
            another descriptor); then nothing stays locked.

        Raises:
            DeviceLockError: a lock file cannot be opened.
        """
        fds: list[int] = []
        try:
            for uuid in dict.fromkeys(uuids):
                fd = self._open(uuid)
                fds.append(fd)
                if not _try_lock(fd):
                    self.release(fds)
                    return None
        except BaseException:
            self.release(fds)
            raise
        return fds

    async def async_try_acquire(self, uuids: Sequence[str]) -> list[int] | None:
        """:meth:`try_acquire` in a thread (it opens files and may create the lock dir).

        A caller cancelled meanwhile leaks nothing: the locks taken are released when the
        thread is done.
        """
        task = asyncio.ensure_future(asyncio.to_thread(self.try_acquire, uuids))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._release_result)
            raise

    def _release_result(self, task: asyncio.Future[list[int] | None]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.release(task.result() or [])

    def release(self, fds: Iterable[int]) -> None:
        """Close ``fds``; a device's lock ends when its last descriptor anywhere is closed."""
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def is_locked_elsewhere(self, uuid: str) -> bool:
        """True if some open descriptor (in any process, this one included) holds the device's lock.

        Probes by locking without waiting and unlocking at once.

        Raises:
            DeviceLockError: the lock file cannot be opened.
        """
        fd = self._open(uuid)
        try:
            if not _try_lock(fd):
                return True
            filelocks.unlock(fd)
            return False
        finally:
            os.close(fd)

    async def async_locked_elsewhere(self, uuids: Iterable[str]) -> set[str]:
        """Those of ``uuids`` whose lock some descriptor holds (:meth:`is_locked_elsewhere`, in a thread).

        Raises:
            DeviceLockError: a lock file cannot be opened.
        """
        wanted = list(uuids)
        return await asyncio.to_thread(lambda: {u for u in wanted if self.is_locked_elsewhere(u)})

    def _open(self, uuid: str) -> int:
        self._ensure_dir()
        path = self.path_for(uuid)
        flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, LOCK_FILE_MODE)
        except OSError as e:
            raise DeviceLockError(f"cannot open lock file {path}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != LOCK_FILE_MODE:
                os.fchmod(fd, LOCK_FILE_MODE)  # the umask cut it down; other users must open it
        except OSError as e:
            os.close(fd)
            raise DeviceLockError(f"cannot set the mode of lock file {path}: {e.strerror}") from e
        return fd

    def _ensure_dir(self) -> None:
        if self._lock_dir.is_dir():
            return
        self._lock_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock_dir.mkdir(mode=LOCK_DIR_MODE)
        except FileExistsError:
            return  # another daemon made it first
        except OSError as e:
            raise DeviceLockError(f"cannot create lock directory {self._lock_dir}: {e.strerror}") from e
        os.chmod(self._lock_dir, LOCK_DIR_MODE)  # mkdir's mode is cut by the umask


def _try_lock(fd: int) -> bool:
    try:
        return filelocks.lock(fd, wait=False)
    except OSError as e:
        raise DeviceLockError(f"cannot lock descriptor {fd}: {e.strerror}") from e
    return True
