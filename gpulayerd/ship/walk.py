"""The CLI's side of ``--ship``: which files of the workdir a snapshot holds, and their hashes.

Run as the submitting user, in the CLI. In a git work tree the snapshot is what
``git ls-files -co --exclude-standard -z`` lists (tracked files and untracked ones not ignored);
elsewhere it is the directory minus the patterns of its ``.gpulayerignore`` (gitignore syntax,
read with the ``pathspec`` library; ``.git/`` is always left out). Symbolic links are shipped as
links (their target as written), never followed; anything that is neither a regular file nor a
link (a socket, a device) is left out. Sizes are bytes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from gpulayerd.core.shipping import path_problem
from gpulayerd.gpu.command import run_command
from gpulayerd.models.snapshots import Manifest, ManifestEntry

__all__ = ["IGNORE_FILE", "OUTPUT_DIR", "WalkError", "hash_file", "list_paths", "make_manifest"]

IGNORE_FILE = ".gpulayerignore"
"""The file whose gitignore-syntax patterns a workdir outside git leaves out of its snapshot."""

GIT_TIMEOUT_S = 60.0
"""The longest ``git ls-files`` may take, seconds."""


class WalkError(Exception):
    """The workdir cannot be listed or read (the message names the path)."""


def _git_paths(workdir: Path) -> list[str] | None:
    """The paths git lists in ``workdir`` (relative to it), or None when it is not in a git work tree."""
    inside = run_command(["git", "-C", str(workdir), "rev-parse", "--is-inside-work-tree"], GIT_TIMEOUT_S)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    listed = run_command(["git", "-C", str(workdir), "ls-files", "-co", "--exclude-standard", "-z"], GIT_TIMEOUT_S)
    if listed.returncode != 0:
        raise WalkError(f"git ls-files in {workdir} failed: {listed.stderr.strip()[:200] or 'timed out'}")
    return sorted({p for p in listed.stdout.split("\0") if p})


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


def hash_file(path: Path) -> tuple[str, int, bool]:
    """(SHA-256 hex, size in bytes, executable) of the regular file at ``path``, read without following
    a link in its last component.

    Raises:
        OSError: it cannot be opened or read (a link there: ELOOP).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            size += len(chunk)
        return h.hexdigest(), size, bool(st.st_mode & stat.S_IXUSR)
    finally:
        os.close(fd)


def make_manifest(workdir: Path, paths: Iterable[str]) -> tuple[Manifest, dict[str, Path]]:
    """The manifest of ``paths`` (relative to ``workdir``) and where each content's bytes are (SHA-256 ->
    a file holding them). Paths git lists that are gone (deleted, not committed) are left out; a
    directory git lists (a submodule) is left out.

    Raises:
        WalkError: a path that cannot be shipped (absolute, ``..``) or a file that cannot be read.
    """
    entries: list[ManifestEntry] = []
    sources: dict[str, Path] = {}
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
            entries.append(ManifestEntry(path=rel, kind="link", target=os.readlink(full)))
        elif stat.S_ISREG(st.st_mode):
            try:
                digest, size, exe = hash_file(full)
            except OSError as e:
                raise WalkError(f"{full}: cannot read: {e.strerror or e}") from e
            entries.append(ManifestEntry(path=rel, kind="file", size=size, sha256=digest, executable=exe))
            sources.setdefault(digest, full)
    # An entry under a link (git lists a link and, from an older commit, a file under its name) cannot
    # be unpacked: leave out what lies under a link, as git would check it out.
    links = {e.path for e in entries if e.kind == "link"}
    kept = [e for e in entries if not any(e.path.startswith(link + "/") for link in links)]
    try:
        return Manifest(entries=kept), sources
    except ValueError as e:
        raise WalkError(f"the snapshot of {workdir} cannot be shipped: {e}") from e
