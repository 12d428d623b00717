"""Which of several installed distributions really provides a framework's files on disk.

Two distributions may install the same import package: ``onnxruntime 1.19.2`` and
``onnxruntime-gpu 1.20.1`` both list ``onnxruntime/`` in their RECORD. Installed together,
the files on disk are whichever was installed last, and only the file hashes tell which:
the version of the *other* one is not what ``import onnxruntime`` runs.

:func:`mark_files_on_disk` takes the environment probe's report (``dist_info_paths`` names
each distribution's ``*.dist-info``), reads each RECORD, picks the few smallest files
of the import package whose recorded hashes differ between the distributions (or that one
of them alone lists), hashes those on disk and sets ``files_match`` on every entry: True
for the one distribution whose hashes match, False for the others, None when the files
cannot tell (no distinguishing file, unreadable RECORD, a tie).

Blocking file I/O (RECORD files, a few package files): the daemon calls it from the
environment prober's thread.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from gpulayerd.gpu.probe import _IMPORT_NAMES

__all__ = ["MAX_HASHED_BYTES", "MAX_HASHED_FILES", "mark_files_on_disk", "read_record"]

MAX_HASHED_FILES = 4
"""At most this many package files are hashed per framework: the smallest telling ones."""

MAX_HASHED_BYTES = 64 * 1024 * 1024
"""A package file larger than this is not hashed (it cannot tell distributions apart cheaply)."""

_MAX_RECORD_BYTES = 64 * 1024 * 1024


def read_record(dist_info: Path, top: str) -> dict[str, tuple[str, str, int]] | None:
    """RECORD rows of ``dist_info`` under import package ``top``: path -> (hash algorithm, hash, size).

    Paths are relative to the directory holding ``dist_info`` (site-packages). Rows without
    a hash are left out; a row without a size counts as very large. None if RECORD cannot
    be read.
    """
    try:
        with open(dist_info / "RECORD", "rb") as fh:
            data = fh.read(_MAX_RECORD_BYTES)
    except OSError:
        return None
    out: dict[str, tuple[str, str, int]] = {}
    for row in csv.reader(io.StringIO(data.decode("utf-8", "replace"))):
        if len(row) < 2 or "=" not in row[1]:
            continue
        rel = row[0].replace("\\", "/")
        parts = rel.split("/")
        if parts[0] != top or any(p in ("", ".", "..") for p in parts):  # only files inside the package
            continue
        algo, _, digest = row[1].partition("=")
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else 1 << 62
        out[rel] = (algo, digest, size)
    return out


def _disk_hash(path: Path, algo: str) -> str | None:
    """The RECORD-style hash of the regular file at ``path`` (not followed if a symlink), or None:
    not a regular file, larger than :data:`MAX_HASHED_BYTES`, unreadable, or an unknown algorithm."""
    try:
        digest = hashlib.new(algo)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HASHED_BYTES:
                return None
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except (OSError, ValueError):
        return None
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode("ascii")


def _mark(top: str, entries: list[MutableMapping[str, object]], where: Mapping[str, object]) -> None:
    records: dict[str, dict[str, tuple[str, str, int]]] = {}
    site: Path | None = None
    for entry in entries:
        dist = entry.get("distribution")
        path = where.get(dist) if isinstance(dist, str) else None
        if not isinstance(path, str) or not isinstance(dist, str):
            return
        record = read_record(Path(path), top)
        if record is None:
            return
        records[dist] = record
        site = site or Path(path).parent
    if site is None:
        return
    paths = set().union(*records.values())
    telling = []
    for rel in paths:
        hashes = {rec[rel][1] if rel in rec else None for rec in records.values()}
        if len(hashes) > 1:
            telling.append((min(rec[rel][2] for rec in records.values() if rel in rec), rel))
    telling.sort()
    scores = dict.fromkeys(records, 0)
    checked = 0
    for _, rel in telling:
        if checked >= MAX_HASHED_FILES:
            break
        algo = next(rec[rel][0] for rec in records.values() if rel in rec)
        actual = _disk_hash(site / rel, algo)
        if actual is None:
            continue
        checked += 1
        for dist, rec in records.items():
            if rel in rec and rec[rel][:2] == (algo, actual):
                scores[dist] += 1
    best = max(scores.values(), default=0)
    winners = [d for d, score in scores.items() if score == best]
    for entry in entries:
        entry["files_match"] = None if best == 0 or len(winners) != 1 else entry["distribution"] == winners[0]


def mark_files_on_disk(report: MutableMapping[str, object]) -> None:
    """Set ``files_match`` on the entries of every framework that several distributions supply.

    Args:
        report: the probe's JSON report, changed in place; a malformed one is left alone.
    """
    frameworks, paths = report.get("frameworks"), report.get("dist_info_paths")
    if not isinstance(frameworks, MutableMapping) or not isinstance(paths, Mapping):
        return
    for key, entries in frameworks.items():
        top = _IMPORT_NAMES.get(str(key))
        where = paths.get(key)
        if top is None or not isinstance(entries, list) or len(entries) < 2 or not isinstance(where, Mapping):
            continue
        if all(isinstance(e, MutableMapping) for e in entries):
            _mark(top, entries, where)
