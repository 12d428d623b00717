"""The CLI's stat cache of ``--ship`` (like git's index): a file whose status is unchanged since it was
hashed is not read again.

Kept per user (the CLI runs as the submitting user) and per workdir, as a JSON file 0600 in
platformdirs' user cache dir (``~/.cache/gpulayer/ship/``). An entry maps a relative path to the
file's (size in bytes, ``st_mtime_ns``, ``st_ctime_ns``, inode, device) when it was hashed and its
SHA-256; it is used only when all five are the same now. The change time cannot be set by a user
(any write, ``utime`` or ``chmod`` sets it to the clock), so a file rewritten with the same size and
its modification time put back is hashed again. A file changed within :data:`RACY_S` seconds
before it was hashed is not remembered (a later write in the same clock tick could leave every
stamp as it was: git's "racily clean" entries), nor one whose status changed while it was read.

It is kept only in a directory of the user's that no other account can write (its parent and
grandparent too, e.g. ``~/.cache``), opened without following a link: a CLI run as root with another
user's ``HOME`` or ``XDG_CACHE_HOME`` hashes every file and writes nothing there.

This cache only saves reading: the owner daemon verifies every uploaded content against its SHA-256,
and the worker every content before a job runs on it. A cache that cannot be read or written is
ignored (every file is hashed). Standard library only: the CLI's ``--ship`` path stays fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["MAX_WORKDIRS", "RACY_S", "Stamp", "StatCache", "default_dir", "stamp"]

RACY_S = 2.0
"""A file whose change or modification time is this close (seconds) to when it was hashed is not remembered."""

MAX_WORKDIRS = 64
"""The most workdirs whose cache files are kept (the least recently written dropped first)."""

Stamp = tuple[int, int, int, int, int]
"""A file's (size in bytes, ``st_mtime_ns``, ``st_ctime_ns``, inode, device)."""


def stamp(st: os.stat_result) -> Stamp:
    """The :data:`Stamp` of a status."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def default_dir() -> Path:
    """Where the CLI keeps its stat caches: ``<platformdirs' user cache dir>/ship`` (on Linux
    ``$XDG_CACHE_HOME/gpulayer/ship``, else ``~/.cache/gpulayer/ship``, worked out here: platformdirs'
    import costs the CLI several ms)."""
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.expanduser("~/.cache")
        return Path(base) / "gpulayer" / "ship"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("gpulayer")) / "ship"


class StatCache:
    """The stat cache of one workdir (see the module docstring).

    Args:
        directory: where cache files are kept (None: nothing is kept, every file is hashed).
        workdir: the workdir the relative paths are under (its absolute path names the cache file).
        racy_s: a file changed this close (seconds) to when it was hashed is not remembered.
    """

    def __init__(self, directory: Path | None, workdir: Path, racy_s: float = RACY_S) -> None:
        self._dir = directory
        self._racy_ns = int(racy_s * 1e9)
        self._workdir = str(workdir)
        self._old: dict[str, list[object]] = {}
        self._new: dict[str, list[object]] = {}
        self.hits = 0
        """How many lookups found the file unchanged (for tests and timing notes)."""
        if directory is not None:
            self._old = self._load()

    @property
    def path(self) -> Path | None:
        """The cache file of this workdir (None: none is kept)."""
        if self._dir is None:
            return None
        return self._dir / (hashlib.sha256(self._workdir.encode("utf-8", "surrogateescape")).hexdigest()[:32]
                            + ".json")

    def _load(self) -> dict[str, list[object]]:
        path = self.path
        assert path is not None
        dir_fd = _open_dir(path.parent, create=False)
        if dir_fd is None:
            return {}
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                         dir_fd=dir_fd)
            with open(fd, "rb") as f:
                if not _mine(os.fstat(f.fileno()), stat.S_ISREG):
                    return {}
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        finally:
            os.close(dir_fd)
        if not isinstance(data, dict) or data.get("workdir") != self._workdir:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        """The SHA-256 of file ``rel`` when its status ``st`` (an ``lstat`` taken now) is the one it had
        when it was hashed; else None (hash it)."""
        row = self._old.get(rel)
        if not isinstance(row, list) or len(row) != 6 or row[:5] != list(stamp(st)):
            return None
        digest = row[5]
        if not isinstance(digest, str) or len(digest) != 64:
            return None
        self._new[rel] = row
        self.hits += 1
        return digest

    def remember(self, rel: str, before: os.stat_result, after: os.stat_result, digest: str, began_ns: int) -> None:
        """Remember ``digest`` for file ``rel``, whose status was ``before`` when it was opened and ``after``
        when it was read to its end, the reading having begun at ``began_ns`` (``time.time_ns()``).
        Nothing is remembered when the status changed meanwhile or it changed within ``racy_s``
        seconds of ``began_ns``."""
        if stamp(before) != stamp(after):
            return
        recent = began_ns - self._racy_ns
        if before.st_mtime_ns >= recent or before.st_ctime_ns >= recent:
            return
        self._new[rel] = [*stamp(before), digest]

    def save(self) -> None:
        """Write the entries looked up or remembered since this cache was made (the files of this
        snapshot only), atomically, 0600; drop the oldest cache files past :data:`MAX_WORKDIRS`.
        Failures are ignored (the next submit hashes again)."""
        path = self.path
        if path is None or self._new == self._old:
            return
        dir_fd = _open_dir(path.parent, create=True)
        if dir_fd is None:
            return
        try:
            tmp = f"{path.name}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                         0o600, dir_fd=dir_fd)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump({"workdir": self._workdir, "entries": self._new}, f, separators=(",", ":"))
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            others = sorted((n for n in os.listdir(dir_fd) if n.endswith(".json")), key=lambda n: _mtime(dir_fd, n))
            for old in others[:max(len(others) - MAX_WORKDIRS, 0)]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old, dir_fd=dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)


def _mtime(dir_fd: int, name: str) -> float:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _mine(st: os.stat_result, kind: Callable[[int], bool]) -> bool:
    """Whether ``st`` is of ``kind`` (``stat.S_ISDIR``, ...), owned by this process's account and
    writable by no other account (group-writable only for this account's own private group, as a
    umask of 002 leaves it)."""
    if not kind(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o002:
        return False
    return not st.st_mode & 0o020 or _private_group(st.st_gid)


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this process's group with no other member listed (a user private group)."""
    if gid != os.getegid():
        return False
    try:
        import grp
        import pwd

        me = pwd.getpwuid(os.geteuid()).pw_name
        return not [m for m in grp.getgrgid(gid).gr_mem if m != me]
    except (ImportError, KeyError):
        return False


def _trusted(path: Path) -> bool:
    """Whether ``path`` is a directory of :func:`_mine`, reached through a link only of this account."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != os.geteuid():
                return False
            st = os.stat(path)
    except OSError:
        return False
    return _mine(st, stat.S_ISDIR)


def _open_dir(directory: Path, create: bool) -> int | None:
    """A descriptor of the cache directory ``directory`` (created 0700 with ``create``), or None (no cache
    is kept) unless it, its parent and its grandparent, those that exist, and the nearest existing
    directory above it when it is missing (on Linux by default ``~/.cache``, ``gpulayer``, ``ship``) are
    directories of this account that no other can write: a CLI run as root with another user's ``HOME``
    or ``XDG_CACHE_HOME`` never reads hashes that user wrote, nor writes or removes files where that
    user's links point."""
    levels = [directory, *directory.parents]
    nearest = next((p for p in levels if os.path.lexists(p)), None)
    if nearest is None:
        return None
    checked = {p for p in levels[:3] if os.path.lexists(p)} | {nearest}
    if not all(_trusted(p) for p in checked):
        return None
    missing = levels[:levels.index(nearest)]
    if missing and not create:
        return None
    try:
        for p in reversed(missing):
            os.mkdir(p, 0o700)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if not _mine(os.fstat(fd), stat.S_ISDIR):
        os.close(fd)
        return None
    return fd
