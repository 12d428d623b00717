"""``gpulayer submit --ship``: the workdir's snapshot, made and uploaded by the CLI as the user
(called by :mod:`gpulayerd.cli.jobs` with its client of the local daemon).

The files (:func:`gpulayerd.ship.walk.list_paths`: git's list in a git work tree, else the
directory minus ``.gpulayerignore``) are hashed here (a file unchanged since the last snapshot of
this workdir is not read again: :mod:`gpulayerd.ship.statcache`), the manifest is offered to the local daemon,
which answers the contents it lacks (or refuses the snapshot over a cap, naming the largest files:
exit 2); those are uploaded in 1 MiB chunks, each from the byte the daemon says it holds already
(``received``: an interrupted upload resumes where it stopped), then the manifest is committed and
its id goes into the spec's ``ship``. A file whose stamp (size, times, inode) moved since it was
hashed is refused before it is uploaded; the daemon verifies every content's SHA-256 anyway. No
pydantic on this path (a fast start).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpulayerd.ship.statcache import Stamp

__all__ = ["ShipUsageError", "SnapshotClient", "send_snapshot", "ship_spec", "wants_ship"]


class ShipUsageError(ValueError):
    """A usage error of ``--ship`` (the CLI exits 2 with the message)."""


class SnapshotClient(Protocol):
    """What the upload needs of the CLI's client of the local API (:class:`gpulayerd.cli.http.SyncClient`)."""

    def snapshot(self, manifest: dict[str, Any], commit: bool) -> Any:
        """``POST /v1/snapshots``."""
        ...

    def snapshot_blob(self, digest: str, offset: int, data: bytes) -> Any:
        """``POST /v1/snapshots/blobs``."""
        ...

    def health(self) -> Any:
        """``GET /v1/health`` (its ``ship_default``: the daemon's lab default)."""
        ...


def _ship_table(spec: dict[str, object]) -> dict[str, object] | None:
    """The spec's ``ship`` as a table (``true`` -> ``{}``), None when it is not shipped.

    Raises:
        ShipUsageError: ``ship`` is neither a boolean nor a table.
    """
    raw = spec.get("ship")
    if raw is None or raw is False:
        return None
    if raw is True:
        return {}
    if isinstance(raw, dict):
        return dict(raw)
    raise ShipUsageError("invalid job spec\nship: must be true, false or a table")


def ship_spec(args: object, spec: dict[str, object], call: Callable[[Callable[[SnapshotClient], str]], str],
              lab_default: Callable[[], bool] | None = None) -> dict[str, object]:
    """``spec`` (workdir resolved) with its workdir snapshotted and uploaded when it is shipped
    (:func:`wants_ship`: ``--ship``, ``ship`` in the spec, or the daemon's lab default, unless
    ``--no-ship``; ``args.output``, ``args.output_dir`` add to it); as it is otherwise. ``call(fn)``
    runs ``fn`` with a client of the local daemon (the CLI's ``call_daemon``); ``lab_default()`` asks
    the daemon's ``ship`` setting (None: through ``call``).

    Raises:
        ShipUsageError: an ``--output`` that is absolute or climbs out with ``..``, ``--output`` without
            ``--ship``, a snapshot over a cap (the daemon names the largest files), a file that
            cannot be read.
        CommandFailed: the daemon failed.
    """
    from gpulayerd.core.shipping import glob_problem

    if lab_default is None:
        def lab_default() -> bool:
            return bool(getattr(call(lambda c: c.health()), "ship_default", False))
    if wants_ship(args, spec, lab_default):
        spec["ship"] = spec.get("ship") if isinstance(spec.get("ship"), dict) else True
    elif getattr(args, "no_ship", None):
        spec["ship"] = False
    table = _ship_table(spec)
    outputs = list(getattr(args, "output", None) or [])
    out_dir = getattr(args, "output_dir", None)
    if table is None:
        if outputs or out_dir:
            raise ShipUsageError("--output and --output-dir bring files back from a shipped job: add --ship")
        return spec
    patterns = [*(table.get("outputs") or []), *outputs]  # type: ignore[misc]
    for pattern in patterns:
        problem = glob_problem(str(pattern))
        if problem is not None:
            raise ShipUsageError(f"--output: {problem}")
    table["outputs"] = patterns
    if out_dir:
        table["output_dir"] = os.path.normpath(Path(os.path.expanduser(out_dir)).absolute())
    workdir = Path(str(spec["workdir"]))
    table["snapshot"] = _upload(call, workdir)
    spec["ship"] = table
    return spec


def wants_ship(args: object, spec: dict[str, object], lab_default: Callable[[], bool]) -> bool:
    """Whether the job is shipped: ``--no-ship`` says no, ``--ship`` yes, then the spec's own ``ship``,
    then the daemon's lab default (``ship = true`` in its config: ``lab_default()`` asks it), never for a
    multi-host job (not shipped yet)."""
    if getattr(args, "no_ship", None):
        return False
    if getattr(args, "ship", None):
        return True
    if "ship" in spec:
        return spec["ship"] not in (None, False)
    distributed = spec.get("distributed")
    nnodes = distributed.get("nnodes", 1) if isinstance(distributed, dict) else 1
    if isinstance(nnodes, int) and nnodes > 1:
        return False
    return lab_default()


def _upload(call: Callable[[Callable[[SnapshotClient], str]], str], workdir: Path) -> str:
    """Snapshot ``workdir`` (files unchanged since the last snapshot are not read again: the user's
    :class:`~gpulayerd.ship.statcache.StatCache`), upload what the daemon lacks, commit; the snapshot id."""
    from gpulayerd.ship.statcache import StatCache, default_dir
    from gpulayerd.ship.walk import WalkError, list_paths, make_manifest

    cache = StatCache(default_dir(), workdir)
    try:
        snap = make_manifest(workdir, list_paths(workdir), cache)
    except WalkError as e:
        raise ShipUsageError(f"--ship: {e}") from None
    cache.save()
    return call(lambda c: send_snapshot(c, snap.body, snap.sources, snap.stamps))


def send_snapshot(c: SnapshotClient, body: dict[str, Any], sources: Mapping[str, Path],
                  stamps: Mapping[str, Stamp] | None = None) -> str:
    """Offer the manifest ``body``, upload the contents the daemon lacks from ``sources`` (SHA-256 -> a
    file holding them, opened without following a link), each from the byte the daemon holds already,
    then commit; the snapshot id. A file whose stamp is no longer the one ``stamps`` holds (it was
    written, replaced or touched after it was hashed) is refused before any of it is sent; the daemon
    verifies every content's SHA-256 in any case (a change the stamps cannot see: exit 2 there).

    Raises:
        ShipUsageError: the daemon asked for a content not in the snapshot, or a file changed meanwhile.
        CommandFailed: the daemon failed (an upload cut there resumes at the next submit).
    """
    sizes = {str(e.get("sha256")): int(e.get("size", 0)) for e in body.get("entries", []) if e.get("kind") == "file"}
    offered = c.snapshot(body, commit=False)
    received = getattr(offered, "received", None) or {}
    sent = 0
    for digest in offered.missing:
        source = sources.get(digest)
        if source is None or digest not in sizes:
            raise ShipUsageError(f"--ship: the daemon asked for a content {digest[:12]} not in this snapshot")
        expected = stamps.get(digest) if stamps is not None else None
        sent += _upload_one(c, digest, sizes[digest], source, int(received.get(digest, 0)), expected)
    stored = c.snapshot(body, commit=True)
    if not stored.stored:
        raise ShipUsageError(f"--ship: the snapshot changed while it was uploaded ({len(stored.missing)} contents "
                             "missing): submit again")
    print(f"shipped {stored.files} files ({stored.bytes / 1e6:.1f} MB; {len(offered.missing)} uploaded, "
          f"{sent / 1e6:.1f} MB) as snapshot {stored.snapshot_id[:12]}", file=sys.stderr)
    return str(stored.snapshot_id)


def _upload_one(c: SnapshotClient, digest: str, size: int, source: Path, offset: int,
                expected: Stamp | None) -> int:
    """Upload content ``digest`` (``size`` bytes) from ``source`` from byte ``offset`` (what the daemon
    holds: resumed); the bytes sent.

    Raises:
        ShipUsageError: ``source`` is not a regular file, its stamp is not ``expected`` (when given), or
            it does not hold ``size`` bytes.
    """
    import stat

    from gpulayerd.core.shipping import BLOB_CHUNK_BYTES
    from gpulayerd.ship.statcache import stamp

    changed = ShipUsageError(f"--ship: {source} changed after the snapshot was made: submit again")
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ShipUsageError(f"--ship: {source}: cannot read: {e.strerror or e}") from None
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size or (expected is not None and stamp(st) != expected):
            raise changed  # (before a byte is sent)
        offset = offset if 0 <= offset <= size else 0
        f.seek(offset)
        sent = 0
        while True:
            chunk = f.read(min(BLOB_CHUNK_BYTES, size - offset))
            if chunk or offset == 0:
                c.snapshot_blob(digest, offset, chunk)
            offset += len(chunk)
            sent += len(chunk)
            if offset >= size:
                return sent
            if not chunk:
                raise changed  # (it shrank: the daemon holds a part, completed or dropped at the next upload)
