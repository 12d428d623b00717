"""The CLI's side of ``--ship``: which files of the workdir a snapshot holds, and their hashes.

Run as the submitting user, in the CLI. In a git work tree the snapshot is what
``git ls-files -co --exclude-standard -z`` lists (tracked files and untracked ones not ignored);
elsewhere it is the directory minus the patterns of its ``.gpulayerignore`` (gitignore syntax,
read with the ``pathspec`` library; ``.git/`` is always left out). Symbolic links are shipped as
links (their target as written), never followed; anything that is neither a regular file nor a
link (a socket, a device) is left out. Sizes are bytes.

Standard library and the pure core only (no pydantic): the manifest is made as the JSON body the
daemon validates. With a :class:`~gpulayerd.ship.statcache.StatCache`, a file unchanged since it
was last hashed is not read again.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from gpulayerd.core.shipping import Entry, manifest_problem, path_problem
from gpulayerd.gpu.command import run_command
from gpulayerd.ship.statcache import Stamp, StatCache, stamp

__all__ = ["IGNORE_FILE", "OUTPUT_DIR", "Snapshot", "WalkError", "hash_fd", "hash_file", "list_paths",
           "make_manifest"]

IGNORE_FILE = ".gpulayerignore"
"""The file whose gitignore-syntax patterns a workdir outside git leaves out of its snapshot."""

GIT_TIMEOUT_S = 60.0
"""The longest ``git ls-files`` may take, seconds."""


class WalkError(Exception):
    """The workdir cannot be listed or read (the message names the path)."""


def _git_paths(workdir: Path) -> list[str] | None:
    """The paths git lists in ``workdir`` (relative to it), or None when it is not in a git work tree
    (one ``git`` process in a work tree; where ``ls-files`` fails, a second asks whether it is one)."""
    listed = run_command(["git", "-C", str(workdir), "ls-files", "-co", "--exclude-standard", "-z"], GIT_TIMEOUT_S)
    if listed.returncode == 0:
        return sorted({p for p in listed.stdout.split("\0") if p})
    inside = run_command(["git", "-C", str(workdir), "rev-parse", "--is-inside-work-tree"], GIT_TIMEOUT_S)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    raise WalkError(f"git ls-files in {workdir} failed: {listed.stderr.strip()[:200] or 'timed out'}")


def _ignored_walk(workdir: Path) -> list[str]:
    """Every path under ``workdir`` (files and links; directories are walked, links never followed)
    minus the patterns of its :data:`IGNORE_FILE` and ``.git/``."""
    import pathspec

    lines: list[str] = []
    try:
        lines = (workdir / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as e:
        raise WalkError(f"{workdir / IGNORE_FILE}: cannot read: {e}") from e
    spec = pathspec.GitIgnoreSpec.from_lines([".git/", *lines])
    out: list[str] = []
    for top, dirs, files in os.walk(workdir, followlinks=False):
        rel_top = os.path.relpath(top, workdir)
        rel_top = "" if rel_top == "." else rel_top + "/"
        dirs[:] = sorted(d for d in dirs if not spec.match_file(rel_top + d + "/")
                         and not os.path.islink(os.path.join(top, d)))
        linked_dirs = [d for d in os.listdir(top)
                       if os.path.islink(os.path.join(top, d)) and os.path.isdir(os.path.join(top, d))]
        for name in sorted({*files, *linked_dirs}):
            rel = rel_top + name
            if not spec.match_file(rel):
                out.append(rel)
    return sorted(out)


OUTPUT_DIR = "gpulayer-out"
"""Where outputs come back (``<workdir>/gpulayer-out/<job id>/``): never part of a snapshot."""


def list_paths(workdir: Path) -> list[str]:
    """The relative paths a snapshot of ``workdir`` holds (see the module docstring), sorted; never
    what lies under :data:`OUTPUT_DIR` (outputs of earlier jobs).

    Raises:
        WalkError: git failed, or the ignore file cannot be read.
    """
    paths = _git_paths(workdir)
    listed = _ignored_walk(workdir) if paths is None else paths
    return [p for p in listed if p != OUTPUT_DIR and not p.startswith(OUTPUT_DIR + "/")]


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def hash_fd(fd: int) -> tuple[str, int]:
    """(SHA-256 hex, bytes read) of what the open file descriptor ``fd`` reads from its offset to its end.

    Raises:
        OSError: it cannot be read.
    """
    h = hashlib.sha256()
    size = 0
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def hash_file(path: Path) -> tuple[str, int, bool]:
    """(SHA-256 hex, size in bytes, executable) of the regular file at ``path``, read without following
    a link in its last component.

    Raises:
        OSError: it cannot be opened or read (a link there: ELOOP).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        digest, size = hash_fd(fd)
        return digest, size, bool(st.st_mode & stat.S_IXUSR)
    finally:
        os.close(fd)


class Snapshot(NamedTuple):
    """What :func:`make_manifest` made of a workdir."""

    body: dict[str, Any]
    """The manifest as the JSON body of ``POST /v1/snapshots`` (``{"entries": [...]}``)."""
    sources: dict[str, Path]
    """SHA-256 -> a file holding those bytes (what an upload reads)."""
    stamps: dict[str, Stamp]
    """SHA-256 -> the :data:`~gpulayerd.ship.statcache.Stamp` that file had when its hash was taken (an
    upload refuses a file whose stamp moved since)."""


def _hash_entry(full: Path, rel: str, cache: StatCache | None) -> tuple[str, int, bool, os.stat_result]:
    """(SHA-256, size in bytes, executable, its status when opened) of the regular file ``full``,
    remembered in ``cache``.

    Raises:
        OSError: it cannot be opened or read. WalkError: it is no longer a regular file.
    """
    began = time.time_ns()
    fd = os.open(full, _READ_FLAGS)  # (non-blocking: a FIFO put there meanwhile is not waited on)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise WalkError(f"{full}: changed while it was read (no longer a regular file)")
        digest, size = hash_fd(fd)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if cache is not None and size == before.st_size:
        cache.remember(rel, before, after, digest, began)
    return digest, size, bool(before.st_mode & stat.S_IXUSR), before


def make_manifest(workdir: Path, paths: Iterable[str], cache: StatCache | None = None) -> Snapshot:
    """The manifest of ``paths`` (relative to ``workdir``) as the JSON body of ``POST /v1/snapshots``
    (``{"entries": [...]}``, each entry with every field of
    :class:`~gpulayerd.models.snapshots.ManifestEntry`, checked by
    :func:`~gpulayerd.core.shipping.manifest_problem`), where each content's bytes are and that file's
    stamp when it was hashed (:class:`Snapshot`). Paths git lists that are gone (deleted, not committed) are left out; a
    directory git lists (a submodule) is left out. A file whose status ``cache`` holds unchanged is
    not read (its remembered SHA-256); the others are hashed and remembered there.

    Raises:
        WalkError: a path that cannot be shipped (absolute, ``..``) or a file that cannot be read.
    """
    entries: list[dict[str, Any]] = []
    sources: dict[str, Path] = {}
    stamps: dict[str, Stamp] = {}
    for rel in paths:
        problem = path_problem(rel)
        if problem is not None:
            raise WalkError(f"{rel!r} cannot be shipped: {problem}")
        full = workdir / rel
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise WalkError(f"{full}: {e.strerror or e}") from e
        if stat.S_ISLNK(st.st_mode):
            entries.append({"path": rel, "kind": "link", "size": 0, "sha256": "", "executable": False,
                            "target": os.readlink(full)})
        elif stat.S_ISREG(st.st_mode):
            digest = cache.lookup(rel, st) if cache is not None else None
            if digest is not None:
                size, exe, hashed = st.st_size, bool(st.st_mode & stat.S_IXUSR), st
            else:
                try:
                    digest, size, exe, hashed = _hash_entry(full, rel, cache)
                except OSError as e:
                    raise WalkError(f"{full}: cannot read: {e.strerror or e}") from e
            entries.append({"path": rel, "kind": "file", "size": size, "sha256": digest, "executable": exe,
                            "target": ""})
            if digest not in sources:
                sources[digest], stamps[digest] = full, stamp(hashed)
    # An entry under a link (git lists a link and, from an older commit, a file under its name) cannot
    # be unpacked: leave out what lies under a link, as git would check it out.
    links = {e["path"] for e in entries if e["kind"] == "link"}
    kept = [e for e in entries if not any(e["path"].startswith(link + "/") for link in links)] if links else entries
    problem = manifest_problem([Entry(e["path"], e["kind"], e["size"], e["sha256"], e["target"]) for e in kept])
    if problem is not None:
        raise WalkError(f"the snapshot of {workdir} cannot be shipped: {problem}")
    return Snapshot({"entries": kept}, sources, stamps)
