"""Shipped workdirs (``--ship``): the manifest of a snapshot, a job spec's ``ship`` field, and the
bodies of the snapshot routes (local: the CLI uploads; peer: a worker fetches, sends outputs back).

A snapshot's id is the SHA-256 of its manifest's canonical JSON (:meth:`Manifest.canonical`), so a
manifest fetched from anywhere is checked against the id the job's spec records. Sizes are bytes;
MB is 10^6 bytes. The path rules are :mod:`gpulayerd.core.shipping`'s.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gpulayerd.core.shipping import BLOB_CHUNK_BYTES, Entry, glob_problem, manifest_problem

__all__ = ["BLOB_CHUNK_BYTES", "BlobView", "FetchChunk", "FetchRequest", "Manifest", "ManifestEntry", "OutputChunk",
           "ShipChunk", "ShipFetch", "ShipField", "ShipModel", "SnapshotRequest", "SnapshotView", "TreeFiles",
           "is_digest"]

MAX_OUTPUTS = 32
"""The most ``--output`` patterns of one job."""


def is_digest(text: str) -> bool:
    """True if ``text`` is a SHA-256 as 64 lowercase hex digits (what names a blob or a snapshot)."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class ManifestEntry(BaseModel):
    """One entry of a snapshot: a regular file (its SHA-256, size in bytes, whether it is executable)
    or a symbolic link (its target, shipped as written, never followed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(max_length=4096)
    kind: Literal["file", "link"]
    size: int = Field(default=0, ge=0, le=2**50)
    sha256: str = Field(default="", max_length=64)
    executable: bool = False
    target: str = Field(default="", max_length=4096)

    def to_core(self) -> Entry:
        """The entry as :mod:`gpulayerd.core.shipping` checks it."""
        return Entry(self.path, self.kind, self.size, self.sha256, self.target)


class Manifest(BaseModel):
    """A snapshot's entries, sorted by path, checked by :func:`~gpulayerd.core.shipping.manifest_problem`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entries: list[ManifestEntry]

    @model_validator(mode="after")
    def _rules(self) -> Manifest:
        problem = manifest_problem([e.to_core() for e in self.entries])
        if problem is not None:
            raise ValueError(problem)
        return self

    def canonical(self) -> bytes:
        """The manifest as canonical JSON (entries by path, keys sorted, no spaces): what its id hashes."""
        rows = [e.model_dump() for e in sorted(self.entries, key=lambda e: e.path)]
        return json.dumps({"entries": rows}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def snapshot_id(self) -> str:
        """The SHA-256 of :meth:`canonical` (64 hex digits)."""
        return hashlib.sha256(self.canonical()).hexdigest()

    def file_bytes(self) -> int:
        """The bytes of every file entry (a content listed twice counts twice)."""
        return sum(e.size for e in self.entries if e.kind == "file")

    def digests(self) -> dict[str, int]:
        """Each distinct content's SHA-256 -> its size in bytes."""
        return {e.sha256: e.size for e in self.entries if e.kind == "file"}


class ShipModel(BaseModel):
    """A job spec's ``ship``: the workdir travels with the job as a snapshot.

    ``ship = true`` in a TOML spec (or ``--ship``) asks for it; the CLI uploads the snapshot and
    fills ``snapshot``. ``outputs``: globs relative to the workdir brought back when an attempt ends
    (``--output``), written into ``output_dir`` (default ``<workdir>/gpulayer-out/<job id>/``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    snapshot: str | None = Field(default=None, max_length=64)
    outputs: list[str] = Field(default_factory=list, max_length=MAX_OUTPUTS)
    output_dir: str | None = Field(default=None, max_length=4096)
    files: int = Field(default=0, ge=0)
    """How many entries the snapshot holds (for ``show``)."""
    bytes: int = Field(default=0, ge=0)
    """How many bytes its files hold (for ``show``)."""

    @field_validator("snapshot")
    @classmethod
    def _snapshot(cls, v: str | None) -> str | None:
        if v is not None and not is_digest(v):
            raise ValueError("must be a snapshot id (64 lowercase hex digits)")
        return v

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, v: list[str]) -> list[str]:
        for pattern in v:
            problem = glob_problem(pattern)
            if problem is not None:
                raise ValueError(problem)
        return v

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or "\0" in v):
            raise ValueError("must be an absolute path (the CLI resolves it)")
        return v


def _ship_value(v: object) -> object:
    """``ship = true`` -> a :class:`ShipModel` with no snapshot yet; ``false`` -> None."""
    if v is True:
        return {}
    if v is False:
        return None
    return v


ShipField = Annotated[ShipModel | None, BeforeValidator(_ship_value)]
"""The type of :attr:`gpulayerd.models.JobSpec.ship` (``true``, ``false`` or a table)."""


class SnapshotRequest(BaseModel):
    """``POST /v1/snapshots``: a manifest the CLI made; ``commit`` stores it once nothing is missing."""

    model_config = ConfigDict(extra="forbid")

    manifest: Manifest
    commit: bool = False


class SnapshotView(BaseModel):
    """The answer to :class:`SnapshotRequest`: the contents to upload first (``missing``), or, with
    ``commit`` and nothing missing, the stored snapshot's id."""

    snapshot_id: str
    missing: list[str] = Field(default_factory=list)
    received: dict[str, int] = Field(default_factory=dict)
    """Of the ``missing`` contents, those an earlier, interrupted upload of this user began: digest ->
    the bytes held (the upload resumes there; from 0 the part is dropped and it starts again)."""
    stored: bool = False
    files: int = 0
    bytes: int = 0


class BlobView(BaseModel):
    """The answer to an upload chunk (``POST /v1/snapshots/blobs``): how many bytes of the content
    are held (the next chunk starts there) and whether it is complete and verified."""

    digest: str
    received: int
    complete: bool = False


class ShipFetch(BaseModel):
    """Worker -> owner (peer route ``ship_fetch``): a chunk of the manifest (``digest`` = the snapshot
    id) or of a file of the shipped job ``job_id``'s attempt ``attempt`` that the sender holds."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(max_length=64)
    attempt: int
    digest: str = Field(max_length=64)
    offset: int = Field(default=0, ge=0, le=2**50)


class ShipChunk(BaseModel):
    """Owner -> worker: up to :data:`BLOB_CHUNK_BYTES` bytes at ``offset`` (base64) of a content of
    ``total`` bytes."""

    data: str
    offset: int
    total: int


def _check_globs(v: list[str]) -> list[str]:
    for pattern in v:
        problem = glob_problem(pattern)
        if problem is not None:
            raise ValueError(problem)
    return v


class _FilesWindow(BaseModel):
    """A chunk, from byte ``offset``, of the stream of a kept tree's files matching ``patterns`` (globs
    relative to the tree, checked by :func:`_check_globs`; none: every file)."""

    model_config = ConfigDict(extra="forbid")

    patterns: list[str] = Field(default_factory=list, max_length=MAX_OUTPUTS)
    offset: int = Field(default=0, ge=0, le=2**50)

    @field_validator("patterns")
    @classmethod
    def _globs(cls, v: list[str]) -> list[str]:
        return _check_globs(v)


class TreeFiles(_FilesWindow):
    """Owner -> worker (peer route ``ship_files``, ``gpulayer fetch``): a chunk, from byte ``offset``, of
    the stream of the files matching ``patterns`` (globs relative to the tree; none: every file) in the
    kept tree of an ended attempt the worker ran for the sender (:mod:`gpulayerd.ship.tree`'s stream,
    as ``collect`` writes it). Answered with a :class:`ShipChunk` of that stream."""

    job_id: str = Field(max_length=64)
    attempt: int = Field(ge=1)


class FetchRequest(_FilesWindow):
    """``POST /v1/jobs/{job}/fetch``: a chunk of the files of a finished attempt of a shipped job owned
    here (``attempt`` None: the latest), from its worker's kept tree (see :class:`TreeFiles`)."""

    attempt: int | None = Field(default=None, ge=1)


class FetchChunk(BaseModel):
    """The answer to :class:`FetchRequest`: ``data`` (base64) at ``offset`` of a stream of ``total`` bytes,
    of attempt ``attempt`` on ``worker``."""

    attempt: int
    worker: str = ""
    data: str
    offset: int
    total: int


class OutputChunk(BaseModel):
    """Worker -> owner (peer route ``ship_output``): a chunk of an output file of an attempt the sender
    ran. ``path`` is relative to the job's output directory; ``last`` ends the file; ``done`` (with
    no path) ends the attempt's outputs, with ``note`` saying what was left out."""

    model_config = ConfigDict(extra="forbid")

    worker: str = Field(max_length=128)
    job_id: str = Field(max_length=64)
    attempt: int
    path: str = Field(default="", max_length=4096)
    offset: int = Field(default=0, ge=0, le=2**50)
    data: str = Field(default="", max_length=2 * BLOB_CHUNK_BYTES)
    executable: bool = False
    last: bool = False
    done: bool = False
    note: str = Field(default="", max_length=2000)

