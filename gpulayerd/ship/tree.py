"""File trees of shipped jobs, written and read as the job's user: the per-attempt tree a snapshot is
unpacked into, the outputs collected from it, and the outputs written on the owner's machine.

These functions run in the process that has the job's user's identity: a helper started as that
user (:mod:`gpulayerd.ship.asuser`), or the daemon itself when it runs as that user. They speak a
simple stream: per entry one JSON line (``path``, ``kind`` file|link, ``size`` bytes, ``sha256``,
``executable``, ``target``), then ``size`` bytes for a file; the stream's end ends the entries.

Every path is checked by :func:`gpulayerd.core.shipping.path_problem`; each directory on the way is
opened with ``O_NOFOLLOW`` (an entry under a link is refused: the kernel answers ELOOP/ENOTDIR), a
file is created with ``O_EXCL | O_NOFOLLOW`` (never written through a link) and, unless the writer
was fed contents verified already (``verify=False``: the unpack, fed from the worker's verified cache;
outputs, which carry no hash), verified against its SHA-256 as it is written. Standard library and
the pure core only: the helper starts fast.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import stat
from typing import IO, Any

from gpulayerd.core.shipping import path_problem

__all__ = ["MAX_HEADER_BYTES", "TreeError", "collect_outputs", "header", "read_entries", "write_tree"]

MAX_HEADER_BYTES = 16384
"""The longest header line of the stream, bytes."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class TreeError(Exception):
    """A stream or a tree that cannot be written or read safely (the message says which entry and why)."""


def header(entry: dict[str, Any]) -> bytes:
    """The header line of one entry of the stream."""
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def read_entries(src: IO[bytes]) -> Any:
    """The entries of the stream ``src``: yields ``(header dict, reader)``; the caller reads exactly
    ``size`` bytes of a file with ``reader(n)`` before the next entry.

    Raises:
        TreeError: a header that is too long or not a JSON object.
    """
    while True:
        line = src.readline(MAX_HEADER_BYTES + 1)
        if not line:
            return
        if not line.endswith(b"\n"):
            raise TreeError("a stream header is too long or cut off")
        try:
            entry = json.loads(line)
        except ValueError as e:
            raise TreeError(f"a stream header is not JSON: {e}") from e
        if not isinstance(entry, dict):
            raise TreeError("a stream header is not an object")
        yield entry, src.read


def _walk_to(root_fd: int, parts: list[str], create: bool) -> int:
    """A descriptor of the directory ``parts`` under ``root_fd``, each step opened without following a
    link (created 0755 when ``create``). The caller closes it."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _copy_exact(read: Any, out_fd: int, size: int, h: Any) -> None:
    left = size
    while left > 0:
        chunk = read(min(left, 1 << 20))
        if not chunk:
            raise TreeError("the stream ended in the middle of a file")
        if h is not None:
            h.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(out_fd, view):]
        left -= len(chunk)


def write_tree(root: str, src: IO[bytes], *, verify: bool = True, replace: bool = False) -> tuple[int, int]:
    """Write the entries of the stream ``src`` under the existing directory ``root``.

    Args:
        verify: check each file against its ``sha256`` (False: outputs, which carry none, and an unpack
            fed from contents the worker's cache verified).
        replace: an entry that exists is removed first (outputs of a later attempt; a link there is
            removed, never followed); else it is an error.

    A ``{"done": true, ...}`` header (the trailer a collected stream ends with) ends the entries.

    Returns:
        (entries written, file bytes written).

    Raises:
        TreeError: a path that is refused, an entry under a link or a file, a file whose bytes do
            not hash to its ``sha256``, a cut stream. OSError: the file system refused a write.
    """
    root_fd = os.open(root, _DIR_FLAGS)
    count = total = 0
    try:
        for entry, read in read_entries(src):
            if entry.get("done"):  # the trailer (collect's note of what was left out): no entry after it
                break
            path, kind = str(entry.get("path", "")), entry.get("kind")
            problem = path_problem(path)
            if problem is not None:
                raise TreeError(f"refused: {problem}")
            *dirs, name = path.split("/")
            try:
                fd = _walk_to(root_fd, dirs, create=True)
            except OSError as e:
                raise TreeError(f"{path}: a directory on its way is a link or a file ({e.strerror})") from e
            if replace:
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    os.close(fd)
                    raise TreeError(f"{path}: cannot replace it ({e.strerror})") from e
            try:
                if kind == "link":
                    os.symlink(str(entry.get("target", "")), name, dir_fd=fd)
                elif kind == "file":
                    size = int(entry.get("size", 0))
                    mode = 0o755 if entry.get("executable") else 0o644
                    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                  | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=fd)
                    h = hashlib.sha256() if verify else None
                    try:
                        _copy_exact(read, out, size, h)
                    finally:
                        os.close(out)
                    if h is not None and h.hexdigest() != entry.get("sha256"):
                        raise TreeError(f"{path}: its bytes do not hash to the manifest's SHA-256")
                    total += size
                else:
                    raise TreeError(f"{path}: unknown kind {kind!r}")
            except FileExistsError as e:
                raise TreeError(f"{path}: listed twice") from e
            finally:
                os.close(fd)
            count += 1
    finally:
        os.close(root_fd)
    return count, total


def _open_regular(root_fd: int, rel: str) -> int | None:
    """A descriptor of the regular file ``rel`` under ``root_fd``, no link followed on the way; None when
    it is not one (a link, a directory, gone)."""
    *dirs, name = rel.split("/")
    try:
        fd = _walk_to(root_fd, dirs, create=False)
    except OSError:
        return None
    try:
        out = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        return None
    return out


def _files_under(root_fd: int, rel: str, limit: int) -> list[str]:
    """The paths (relative to the root) of the entries that are not directories under the directory
    ``rel``, dotfiles included, at most ``limit``; no link followed, on the way to ``rel`` or under it
    ([] when ``rel`` is not a directory reached that way)."""
    try:
        fd = _walk_to(root_fd, rel.split("/"), create=False)
    except OSError:
        return []
    out: list[str] = []
    try:
        for dirpath, dirs, names, _ in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            dirs.sort()
            base = rel if dirpath == "." else f"{rel}/{dirpath[2:]}"
            out.extend(f"{base}/{n}" for n in sorted(names))
            if len(out) >= limit:
                return out[:limit]
    finally:
        os.close(fd)
    return out


def collect_outputs(root: str, patterns: list[str], dst: IO[bytes], *, max_bytes: int, max_files: int) -> str:
    """Write to ``dst`` (the stream) the regular files under ``root`` that ``patterns`` (globs relative to
    ``root``, ``**`` allowed; ``*`` stays within one directory and skips dotfiles, as a shell's) match, a
    matched directory standing for every file under it, no link followed, at most ``max_files`` files
    and ``max_bytes`` bytes in all. Returns a note of what was left out ("" when nothing was)."""
    root_fd = os.open(root, _DIR_FLAGS)
    left_out: list[str] = []
    sent = files = 0
    more = False
    try:
        matched: dict[str, None] = {}
        for pattern in patterns:
            for found in sorted(glob.glob(pattern, root_dir=root, recursive=True)):
                rel = os.path.normpath(found)
                if path_problem(rel) is None:
                    matched.update(dict.fromkeys([rel, *_files_under(root_fd, rel, max_files + 1)]))
                if len(matched) > 2 * max_files + 1:  # bounded: more than can go is left out uncounted
                    more = True
                    break
        for rel in matched:
            fd = _open_regular(root_fd, rel)
            if fd is None:
                continue  # a directory, a link, something gone: never followed
            try:
                size = os.fstat(fd).st_size
                if files >= max_files or sent + size > max_bytes:
                    left_out.append(rel)
                    continue
                data = b""
                while len(data) < size and (chunk := os.read(fd, min(1 << 20, size - len(data)))):
                    data += chunk
                mode = os.fstat(fd).st_mode
            finally:
                os.close(fd)
            dst.write(header({"path": rel, "kind": "file", "size": len(data),
                              "executable": bool(mode & stat.S_IXUSR)}))
            dst.write(data)
            sent += len(data)
            files += 1
    finally:
        os.close(root_fd)
    if not left_out:
        return ""
    return (f"{len(left_out)}{' or more' if more else ''} output file(s) left out over the caps ({max_files} files, "
            f"{max_bytes / 1e6:.1f} MB): {', '.join(left_out[:5])}")
