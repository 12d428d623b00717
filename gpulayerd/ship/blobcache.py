"""A worker's cache of shipped contents: blobs by SHA-256 in ``<state dir>/ship-cache/``, bounded in
bytes, the least recently used dropped first.

A content enters only verified (its bytes hash to its name), through a temporary file renamed into
place: a cut transfer leaves no partial blob under a content's name. Job trees get copies of cached
contents (:mod:`gpulayerd.ship.tree`), never hard links: a job cannot change the cache. Contents a
transfer in progress needs are pinned (never dropped while pinned). Blocking I/O: call from a thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

from gpulayerd.host.privdirs import make_private_dirs
from gpulayerd.models.snapshots import is_digest
from gpulayerd.ship.walk import hash_file

__all__ = ["BlobCache"]


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
        self._opened = False

    def _open(self) -> None:
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
            os.utime(p)
        except FileNotFoundError:
            return False
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
        if hash_file(part)[0] != digest:
            part.unlink(missing_ok=True)
            raise ValueError(f"content {digest[:12]}: the bytes received do not hash to it")
        os.replace(part, self.path(digest))

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
            total -= size
            dropped += size
        return dropped
