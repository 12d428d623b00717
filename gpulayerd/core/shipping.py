"""The pure rules of shipping a job's workdir (``--ship``): which paths a snapshot or an output may
name, what a manifest must not hold, and the words of a refusal over a cap.

A snapshot is a manifest of entries (a relative path, a kind ``file`` or ``link``, a size in bytes,
a SHA-256 for a file, a target for a link). These rules are checked where a manifest is made (the
CLI), where it is stored (the owner) and again where it is unpacked (the worker): a worker never
trusts the owner's manifest more than the owner trusted the user's.

MB here is 10^6 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["BLOB_CHUNK_BYTES", "MAX_ENTRIES", "MAX_PATH_BYTES", "MB", "Entry", "cap_refusal", "glob_problem", "largest",
           "manifest_problem", "path_problem", "unique_bytes"]

MB = 1_000_000
"""A megabyte: 10^6 bytes."""

BLOB_CHUNK_BYTES = 1 << 20
"""The most bytes of one upload or fetch chunk (1 MiB: a peer message stays under its 4 MiB limit in base64)."""

MAX_PATH_BYTES = 4096
"""The longest relative path a snapshot or an output may name, UTF-8 bytes."""

MAX_ENTRIES = 200_000
"""The most entries one manifest may hold."""

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a manifest, as the rules see it.

    Attributes:
        path: relative, ``/``-separated.
        kind: ``file`` or ``link``.
        size: bytes (a link: 0).
        sha256: the file's content hash, 64 lowercase hex digits ("" for a link).
        target: a link's target, as written ("" for a file).
    """

    path: str
    kind: str
    size: int = 0
    sha256: str = ""
    target: str = ""


def path_problem(path: str) -> str | None:
    """Why ``path`` cannot name an entry of a snapshot (None when it can).

    A path is relative and ``/``-separated: not empty, not absolute, no empty, ``.`` or ``..``
    component, no NUL or backslash, at most :data:`MAX_PATH_BYTES` bytes, each component at most
    255 bytes.
    """
    if not path:
        return "an empty path"
    if "\0" in path:
        return "a path with a NUL byte"
    if path.startswith("/"):
        return f"an absolute path ({path[:80]!r})"
    if "\\" in path:
        return f"a path with a backslash ({path[:80]!r})"
    try:
        size = len(path.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return "a path that is not text"
    if size > MAX_PATH_BYTES:
        return f"a path of {size} bytes (at most {MAX_PATH_BYTES})"
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return f"a path with an empty, '.' or '..' component ({path[:80]!r})"
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            return f"a path component over 255 bytes ({part[:40]!r}...)"
    return None


def glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be an ``--output`` glob (None when it can): it is relative to the
    workdir, so not empty, not absolute, no ``..`` component (``.`` and empty components are
    tolerated: ``./results/*.json``)."""
    if not pattern or not pattern.strip():
        return "an empty pattern"
    if "\0" in pattern:
        return "a pattern with a NUL byte"
    if pattern.startswith("/") or pattern.startswith("~"):
        return f"{pattern!r} is absolute: give a pattern relative to the workdir (e.g. results/*.json)"
    if ".." in pattern.split("/"):
        return f"{pattern!r} climbs out of the workdir ('..'): give a pattern inside it"
    if len(pattern.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        return f"a pattern over {MAX_PATH_BYTES} bytes"
    return None


def manifest_problem(entries: Sequence[Entry]) -> str | None:
    """Why ``entries`` cannot be a manifest (None when they can).

    Each path passes :func:`path_problem`; no path twice; no entry under a link (``a`` a link and
    ``a/b`` an entry) or under a file; a file has a 64-hex SHA-256 and a size of 0 or more; a link a
    target without a NUL (it may point anywhere: it is created as a link, never followed when
    unpacking); at most :data:`MAX_ENTRIES` entries.
    """
    if len(entries) > MAX_ENTRIES:
        return f"{len(entries)} entries (at most {MAX_ENTRIES})"
    kinds: dict[str, str] = {}
    for e in entries:
        problem = path_problem(e.path)
        if problem is not None:
            return problem
        if e.path in kinds:
            return f"{e.path!r} is listed twice"
        kinds[e.path] = e.kind
        if e.kind == "file":
            if len(e.sha256) != 64 or not set(e.sha256) <= _HEX:
                return f"{e.path!r}: not a SHA-256 (64 lowercase hex digits)"
            if e.size < 0:
                return f"{e.path!r}: a negative size"
        elif e.kind == "link":
            if not e.target or "\0" in e.target or len(e.target.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
                return f"{e.path!r}: a link without a usable target"
        else:
            return f"{e.path!r}: unknown kind {e.kind!r} (file or link)"
    for path in kinds:
        parts = path.split("/")
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if above in kinds:
                what = "a link" if kinds[above] == "link" else "a file"
                return f"{path!r} lies under {above!r}, which is {what}"
    return None


def unique_bytes(entries: Iterable[Entry]) -> int:
    """The bytes of the distinct contents of ``entries`` (a content listed twice counts once)."""
    seen: dict[str, int] = {}
    for e in entries:
        if e.kind == "file":
            seen[e.sha256] = e.size
    return sum(seen.values())


def largest(entries: Iterable[Entry], n: int = 5) -> list[Entry]:
    """The ``n`` largest files of ``entries``, largest first (ties by path)."""
    files = [e for e in entries if e.kind == "file"]
    return sorted(files, key=lambda e: (-e.size, e.path))[:n]


def cap_refusal(what: str, wanted_bytes: int, cap_bytes: int, entries: Iterable[Entry], hint: str) -> str:
    """The words of a refusal over a cap: what, how much against how much (MB), the largest files, and
    what to do (``hint``)."""
    top = largest(entries)
    named = ", ".join(f"{e.path} ({e.size / MB:.1f} MB)" for e in top)
    return (f"snapshot refused: {what}: {wanted_bytes / MB:.1f} MB > {cap_bytes / MB:.1f} MB; largest files: "
            f"{named or 'none'}; {hint}")
