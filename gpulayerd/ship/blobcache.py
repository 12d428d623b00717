"""A worker's cache of shipped contents: blobs by SHA-256 in ``<state dir>/ship-cache/``, bounded in
bytes, the least recently used dropped first.

A content enters only verified (its bytes hash to its name), through a temporary file renamed into
place: a cut transfer leaves no partial blob under a content's name. Job trees get copies of cached
contents (:mod:`gpulayerd.ship.tree`), never hard links: a job cannot change the cache. A content is
read for a tree through :meth:`BlobCache.open_content`: hashed again unless this daemon's life
verified that very file (the same device, inode, size and change time) when it entered, so each content is hashed
once per daemon life, not at every unpack. Contents a transfer in progress needs are pinned (never
dropped while pinned). Blocking I/O: call from a thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from gpulayerd.host.privdirs import make_private_dirs
from gpulayerd.models.snapshots import is_digest
from gpulayerd.ship.walk import hash_fd

__all__ = ["BlobCache"]

_Key = tuple[int, int, int, int]
"""A cached file's (device, inode, size in bytes, ``st_ctime_ns``): the file a verification holds for."""


def _key(st: os.stat_result) -> _Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns)


class BlobCache:
    """The bounded content cache (see the module docstring).

    Args:
        root: its directory (created 0700).
        max_bytes: the most bytes it keeps (more only while pinned contents need it).
    """

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pins: dict[str, int] = {}
        self._verified: dict[str, _Key] = {}  # digest -> the key of the file hashed in this life
        self._opened = False

    def _open(self) -> None:
        with self._lock:  # (threads of two transfers at once: no part file of this life swept)
            if not self._opened:
                make_private_dirs([self.root])
                for p in self.root.glob("*.part*"):  # transfers a previous life cut
                    p.unlink(missing_ok=True)
                self._opened = True

    def path(self, digest: str) -> Path:
        """Where content ``digest`` lies in the cache. Raises ValueError: not a SHA-256."""
        if not is_digest(digest):
            raise ValueError("not a SHA-256")
        return self.root / digest

    def has(self, digest: str) -> bool:
        """True if ``digest`` is cached (and marks it used now)."""
        self._open()
        p = self.path(digest)
        try:
            before = os.stat(p, follow_symlinks=False)
            os.utime(p)
            after = os.stat(p, follow_symlinks=False)
        except FileNotFoundError:
            return False
        with self._lock:  # this use moved its change time: a verification of the unchanged file holds
            if self._verified.get(digest) == _key(before):
                self._verified[digest] = _key(after)
        return True

    def partial(self, digest: str) -> Path:
        """The temporary file a transfer of ``digest`` writes (resumed from its size)."""
        self._open()
        self.path(digest)
        return self.root / f"{digest}.part"

    def finish(self, digest: str) -> None:
        """Verify the transfer of ``digest`` in :meth:`partial` and keep it.

        Raises:
            ValueError: its bytes do not hash to ``digest`` (the temporary file is removed).
        """
        part = self.partial(digest)
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            if hash_fd(fd)[0] != digest:
                part.unlink(missing_ok=True)
                raise ValueError(f"content {digest[:12]}: the bytes received do not hash to it")
            os.replace(part, self.path(digest))
            st = os.fstat(fd)  # (after the rename, which moved its change time: the file verified)
        finally:
            os.close(fd)
        with self._lock:
            self._verified[digest] = _key(st)

    def open_content(self, digest: str, size: int) -> BinaryIO:
        """The cached content ``digest`` opened for reading (no link followed), checked to hold ``size``
        bytes that hash to ``digest``: hashed now unless this daemon verified that very file (device,
        inode, size, change time) when it entered (:meth:`finish`) or at an earlier open. The caller
        closes it.

        Raises:
            ValueError: it does not hold ``size`` bytes or they do not hash to ``digest`` (it is removed
                from the cache). OSError: it is not cached (FileNotFoundError) or cannot be read.
        """
        path = self.path(digest)
        f = open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)), "rb")  # noqa: SIM115
        try:
            st = os.fstat(f.fileno())
            key = _key(st)
            with self._lock:
                known = self._verified.get(digest) == key
            if not known:
                got, n = hash_fd(f.fileno())
                if got != digest or n != st.st_size:
                    path.unlink(missing_ok=True)
                    raise ValueError(f"content {digest[:12]}: the cached bytes do not hash to it (dropped)")
                f.seek(0)
                with self._lock:
                    self._verified[digest] = key
            if st.st_size != size:
                raise ValueError(f"content {digest[:12]}: {st.st_size} bytes cached, the manifest says {size}")
            return f
        except BaseException:
            f.close()
            raise

    def pin(self, digests: Iterable[str]) -> None:
        """Keep ``digests`` while a transfer or an unpack needs them (see :meth:`unpin`)."""
        with self._lock:
            for d in digests:
                self._pins[d] = self._pins.get(d, 0) + 1

    def unpin(self, digests: Iterable[str]) -> None:
        """Undo one :meth:`pin` of ``digests``; then drop the least recently used contents over the cap."""
        with self._lock:
            for d in digests:
                n = self._pins.get(d, 0) - 1
                if n > 0:
                    self._pins[d] = n
                else:
                    self._pins.pop(d, None)
            pinned = set(self._pins)
        self.trim(pinned)

    def trim(self, pinned: set[str] | None = None) -> int:
        """Drop the least recently used contents (not ``pinned``) until the cache holds at most
        ``max_bytes``; the bytes dropped."""
        self._open()
        files = []
        for p in self.root.iterdir():
            if is_digest(p.name):
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                files.append((st.st_mtime, p, st.st_size))
        total = sum(size for _, _, size in files)
        dropped = 0
        for _, p, size in sorted(files):
            if total <= self.max_bytes:
                break
            if pinned and p.name in pinned:
                continue
            p.unlink(missing_ok=True)
            with self._lock:
                self._verified.pop(p.name, None)
            total -= size
            dropped += size
        return dropped
