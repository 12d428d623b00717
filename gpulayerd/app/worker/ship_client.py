"""The worker's side of shipped jobs (``--ship``): before a granted attempt starts, fetch what the
content cache lacks from the owner over mutual TLS and unpack the snapshot as the job's user into a
fresh 0700 per-attempt tree; when the attempt ends, collect its outputs as the job's user and send
them to the owner.

The manifest is checked against the snapshot id the job's spec records (its SHA-256) and against
:func:`gpulayerd.core.shipping.manifest_problem`; each content against its SHA-256 before it enters
the cache (:class:`~gpulayerd.ship.blobcache.BlobCache`). A transfer resumes a content from the
bytes already received (its part file, kept when a transfer is cut), may be throttled
(``ship_fetch_mb_per_s``), renews the attempt's lease while it lasts (as a running attempt's is
renewed), is bounded by ``ship_transfer_timeout_s``, and on any failure leaves no tree
behind: :class:`TransferFailed`, and the job is re-queued (the attempt never started).

An ended attempt's tree is kept ``ship_keep_s`` (a marker ``<tree>.ended`` beside it dates the end;
:meth:`ShipClient.sweep` removes it later) and its files are served to the job's owner only
(peer route ``ship_files``, ``gpulayer fetch``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Protocol

from gpulayerd.config import DaemonConfig
from gpulayerd.core.shipping import MB
from gpulayerd.errors import PeerBadRequest, PeerCallError
from gpulayerd.models import JobSpec
from gpulayerd.models.snapshots import BLOB_CHUNK_BYTES, Manifest, OutputChunk, ShipChunk, ShipFetch, TreeFiles
from gpulayerd.net.transport import SHIP_FETCH, SHIP_OUTPUT, PeerTransport, Sender
from gpulayerd.ship.asuser import AsUserError, run_as, user_ids
from gpulayerd.ship.blobcache import BlobCache
from gpulayerd.ship.tree import TreeError, header, read_entries
from gpulayerd.store import Store

__all__ = ["ShipClient", "TransferFailed"]

log = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 64 * MB
"""The largest manifest a worker takes, bytes."""


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


class TransferFailed(Exception):
    """A shipped job's snapshot could not be fetched or unpacked here (nothing was started, no tree left)."""


class ShipClient:
    """Fetches, unpacks and sends back (see the module docstring).

    Args:
        config: the cache's cap, the trees' directory, the time and output limits.
        node_id: this node (the sender of output chunks).
        transport: calls the owner.
        store: the runs stored here (whose tree ``gpulayer fetch`` reads; None: not served).
    """

    def __init__(self, *, config: DaemonConfig, node_id: str, transport: PeerTransport,
                 store: Store | None = None) -> None:
        self._config = config
        self.node_id = node_id
        self._transport = transport
        self._store = store
        self._streams: OrderedDict[tuple[str, str, int, tuple[str, ...]], bytes] = OrderedDict()
        self._swept = 0.0  # monotonic time of the last sweep of kept trees
        self.cache = BlobCache(config.state_dir / "ship-cache", int(config.ship_cache_mb * MB))
        self._fetching = _PerContent()
        self.notes: dict[tuple[str, int], str] = {}
        """(job, attempt) -> what its transfer moved ("Transfer: ..."), for the ``started`` report."""
        self.shipped: dict[tuple[str, int], tuple[str, JobSpec]] = {}
        """(job, attempt) -> (owner, spec) of the shipped attempts unpacked here by this daemon's life."""

    def tree(self, owner: str, job_id: str, attempt: int) -> Path:
        """The per-attempt tree of a shipped job (from stored ids only)."""
        return self._config.trees_dir / f"{owner[:16]}-{job_id}-{attempt}"

    async def _fetch(self, owner: str, job_id: str, attempt: int, digest: str, sink: _Sink, have: int) -> int:
        """Fetch content ``digest`` from byte ``have`` into ``sink``; the bytes moved."""
        moved = 0
        offset = have
        rate = self._config.ship_fetch_mb_per_s * MB  # bytes per second, 0: no limit
        began = time.monotonic()
        while True:
            chunk = await self._transport.call(owner, SHIP_FETCH, ShipFetch(job_id=job_id, attempt=attempt,
                                                                            digest=digest, offset=offset))
            if chunk.offset != offset:
                raise TransferFailed(f"the owner answered a malformed chunk of {digest[:12]}")
            n = await asyncio.to_thread(_decode_into, sink, chunk.data)  # (1.4 MB of base64: off the loop)
            offset += n
            moved += n
            if offset >= chunk.total or not n:
                return moved
            if rate > 0:  # ship_fetch_mb_per_s: wait until this many bytes were due
                ahead = began + moved / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)

    async def prepare(self, owner: str, job_id: str, attempt: int, spec: JobSpec,
                      renew: Callable[[], Awaitable[bool]] | None = None, lease_s: float = 30.0) -> str:
        """Fetch and unpack the snapshot of ``spec``; the tree the attempt runs in.

        Args:
            renew: renews the attempt's lease at its owner (the ``renew`` report a running attempt
                sends); False when the owner answered that the attempt is stale. Called every
                ``lease_s / 3`` seconds while the transfer lasts, so a transfer longer than the lease
                is not declared lost; a stale answer ends the transfer.

        Raises:
            TransferFailed: ``Transfer: ...`` words (no tree is left behind): a failure, a stale
                answer to a renewal, or more than ``ship_transfer_timeout_s``.
        """
        assert spec.ship is not None
        sid = spec.ship.snapshot or ""
        tree = self.tree(owner, job_id, attempt)
        work = asyncio.ensure_future(asyncio.wait_for(self._prepare(owner, job_id, attempt, spec, sid, tree),
                                                      self._config.ship_transfer_timeout_s))
        keeper = asyncio.ensure_future(_keep_lease(renew, lease_s, attempt)) if renew is not None else None
        try:
            if keeper is not None:
                await asyncio.wait({work, keeper}, return_when=asyncio.FIRST_COMPLETED)
                if keeper.done() and not work.done():
                    work.cancel()
                    keeper.result()  # (raises TransferFailed: the owner no longer holds it)
            return await work
        except (TransferFailed, PeerCallError, AsUserError, OSError, ValueError, LookupError,
                asyncio.TimeoutError) as e:
            await asyncio.to_thread(shutil.rmtree, tree, True)
            why = f"not done within {self._config.ship_transfer_timeout_s:g} s" if isinstance(
                e, asyncio.TimeoutError) else str(e) or type(e).__name__
            log.info("job_id=%s attempt %d: Transfer: %s (nothing started, no tree left)", job_id, attempt, why)
            raise TransferFailed(f"Transfer: {why}") from None
        finally:
            for task in (work, keeper):
                if task is not None and not task.done():
                    task.cancel()

    async def _prepare(self, owner: str, job_id: str, attempt: int, spec: JobSpec, sid: str, tree: Path) -> str:
        began = time.monotonic()
        holder = _Buffer()
        await self._fetch(owner, job_id, attempt, sid, holder, 0)
        raw = holder.data()
        if len(raw) > MAX_MANIFEST_BYTES or hashlib.sha256(raw).hexdigest() != sid:
            raise TransferFailed(f"the manifest does not hash to snapshot {sid[:12]}")
        manifest = Manifest.model_validate_json(raw)  # (its rules checked again here)
        digests = manifest.digests()
        self.cache.pin(digests)
        fetched = unpacked = began
        try:
            lacking = await asyncio.to_thread(lambda: [d for d in sorted(digests) if not self.cache.has(d)])
            moved = files = 0
            for digest in lacking:
                async with self._fetching.hold(digest):  # one writer of a content's part file at a time
                    if self._fetching.waited(digest) and await asyncio.to_thread(self.cache.has, digest):
                        continue  # another transfer brought it meanwhile
                    sink, have = await asyncio.to_thread(self._open_part, digest)
                    try:
                        moved += await self._fetch(owner, job_id, attempt, digest, sink, have)
                    finally:
                        await asyncio.to_thread(sink.close)
                    await asyncio.to_thread(self.cache.finish, digest)
                    files += 1
            note = (f"Transfer: {files} file(s), {moved} bytes moved from the owner; "
                    f"{len(digests) - files} from this worker's cache")
            fetched = time.monotonic()
            await asyncio.to_thread(self._unpack, tree, manifest, spec)
            unpacked = time.monotonic()
        finally:
            await asyncio.to_thread(self.cache.unpin, digests)
        self.notes[(job_id, attempt)] = note
        self.shipped[(job_id, attempt)] = (owner, spec)
        log.info("job_id=%s attempt %d: %s (fetch %.0f ms, unpack %.0f ms, unpin %.0f ms)", job_id, attempt, note,
                 (fetched - began) * 1000, (unpacked - fetched) * 1000, (time.monotonic() - unpacked) * 1000)
        return str(tree)

    def _open_part(self, digest: str) -> tuple[IO[bytes], int]:
        """The cache's part file of ``digest`` opened for appending, and the bytes it holds (a transfer
        resumes there)."""
        sink = open(self.cache.partial(digest), "ab")  # noqa: SIM115 (closed by the caller)
        return sink, sink.tell()

    def _unpack(self, tree: Path, manifest: Manifest, spec: JobSpec) -> None:
        """Make ``tree`` afresh (0700, the job's user's) and unpack ``manifest`` into it as that user."""
        ids = user_ids(spec.user)
        tree.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if self._config.mode == "system" else 0o700)
        shutil.rmtree(tree, ignore_errors=True)
        os.mkdir(tree, 0o700)
        if ids is not None:
            os.chown(tree, ids[0], ids[1])

        def feed(sink: IO[bytes]) -> None:
            for e in manifest.entries:
                if e.kind != "file":
                    sink.write(header(e.model_dump()))
                    continue
                try:  # verified (its SHA-256, once per daemon life) and sized before a byte is written
                    content = self.cache.open_content(e.sha256, e.size)
                except ValueError as err:
                    raise TreeError(str(err)) from None
                with content:  # a copy of exactly its size (never more: the stream's next header): no link
                    sink.write(header(e.model_dump()))
                    _copy_exact(content, sink, e.size, e.sha256)

        run_as("unpack", [str(tree)], ids, feed=feed, timeout_s=self._config.ship_transfer_timeout_s)

    async def send_outputs(self, owner: str, job_id: str, attempt: int, spec: JobSpec, keep: bool = False) -> None:
        """Collect the attempt's outputs as the job's user and send them to the owner; then drop its tree,
        or, with ``keep`` (an attempt that ran), keep it ``ship_keep_s`` for ``gpulayer fetch``.
        Failures are logged: an attempt's end is reported whatever happens here."""
        assert spec.ship is not None
        tree = self.tree(owner, job_id, attempt)
        try:
            if spec.ship.outputs and tree.is_dir():
                await asyncio.wait_for(self._send(owner, job_id, attempt, spec, tree),
                                       self._config.ship_transfer_timeout_s)
        except (PeerCallError, AsUserError, OSError, ValueError, LookupError, asyncio.TimeoutError) as e:
            log.warning("job_id=%s attempt %d: outputs not sent back: %s", job_id, attempt, e or type(e).__name__)
        finally:
            self.notes.pop((job_id, attempt), None)
            self.shipped.pop((job_id, attempt), None)
            if keep and self._config.ship_keep_s > 0 and tree.is_dir():
                await asyncio.to_thread(_ended(tree).touch)  # kept from now on (see sweep)
            else:
                await asyncio.to_thread(shutil.rmtree, tree, True)
            await self.sweep()

    async def sweep(self, every_s: float = 60.0) -> int:
        """Remove the kept trees of attempts that ended more than ``ship_keep_s`` ago (at most one look
        every ``every_s`` seconds); how many were removed."""
        now = time.monotonic()
        if now - self._swept < every_s:
            return 0
        self._swept = now
        return await asyncio.to_thread(_sweep, self._config.trees_dir, self._config.ship_keep_s)

    async def files(self, sender: Sender, msg: TreeFiles) -> ShipChunk:
        """Peer route ``ship_files`` (role checked: the attempt ran here for the sender, its owner): a chunk
        of the stream of the files of its kept tree matching ``msg.patterns`` (every file when none),
        collected as the job's user without following links, capped at ``ship_outputs_mb``.

        Raises:
            PeerBadRequest: no such attempt here, it still runs, not shipped, its tree not kept any more.
        """
        owner = sender.node_id
        run = await self._store.runs.remote_run(owner, msg.job_id, msg.attempt) if self._store is not None else None
        if run is None:
            raise PeerBadRequest(f"no attempt {msg.attempt} of job {msg.job_id} ran here")
        if run.state == "running":
            raise PeerBadRequest(f"attempt {msg.attempt} of job {msg.job_id} still runs here")
        spec = JobSpec.model_validate_json(run.spec_json)
        tree = self.tree(owner, msg.job_id, msg.attempt)
        if spec.ship is None or not tree.is_dir():
            raise PeerBadRequest(f"the tree of attempt {msg.attempt} of job {msg.job_id} is not kept here "
                                 f"(kept {self._config.ship_keep_s:g} s after the attempt ends)")
        key = (owner, msg.job_id, msg.attempt, tuple(msg.patterns))
        stream = self._streams.get(key)
        if stream is None or msg.offset == 0:
            cap = int(self._config.ship_outputs_mb * MB)
            args = [str(tree), str(cap), "10000", *(msg.patterns or ["**"])]
            stream = await asyncio.to_thread(run_as, "collect", args,
                                             user_ids(spec.user), timeout_s=self._config.ship_transfer_timeout_s,
                                             max_out_bytes=cap + 4 * MB)
            self._streams[key] = stream
            while len(self._streams) > 4:  # a few fetches at once; a stream is read once, in order
                self._streams.popitem(last=False)
        data = stream[msg.offset:msg.offset + BLOB_CHUNK_BYTES]
        if msg.offset + len(data) >= len(stream):
            self._streams.pop(key, None)
        return ShipChunk(data=base64.b64encode(data).decode("ascii"), offset=msg.offset, total=len(stream))

    async def _send(self, owner: str, job_id: str, attempt: int, spec: JobSpec, tree: Path) -> None:
        assert spec.ship is not None
        cap = int(self._config.ship_outputs_mb * MB)
        raw = await asyncio.to_thread(run_as, "collect", [str(tree), str(cap), "1000", *spec.ship.outputs],
                                      user_ids(spec.user), timeout_s=self._config.ship_transfer_timeout_s,
                                      max_out_bytes=cap + 4 * MB)
        import io

        note = ""
        for entry, read in read_entries(io.BytesIO(raw)):
            if entry.get("done"):
                note = str(entry.get("note", ""))
                break
            size = int(entry.get("size", 0))
            data = read(size)
            for off in range(0, max(len(data), 1), BLOB_CHUNK_BYTES):
                piece = data[off:off + BLOB_CHUNK_BYTES]
                await self._transport.call(owner, SHIP_OUTPUT, OutputChunk(
                    worker=self.node_id, job_id=job_id, attempt=attempt, path=str(entry.get("path", "")), offset=off,
                    data=base64.b64encode(piece).decode("ascii"), executable=bool(entry.get("executable")),
                    last=off + BLOB_CHUNK_BYTES >= len(data)))
        await self._transport.call(owner, SHIP_OUTPUT, OutputChunk(worker=self.node_id, job_id=job_id,
                                                                   attempt=attempt, done=True, note=note[:2000]))


def _ended(tree: Path) -> Path:
    """The marker beside a kept tree: its modification time is when its attempt ended."""
    return tree.with_name(tree.name + ".ended")


def _sweep(trees_dir: Path, keep_s: float) -> int:
    """Remove the trees whose marker is older than ``keep_s`` seconds, and their markers."""
    removed = 0
    cutoff = time.time() - keep_s
    for marker in trees_dir.glob("*.ended") if trees_dir.is_dir() else []:
        try:
            if marker.lstat().st_mtime > cutoff:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(marker.with_name(marker.name[:-len(".ended")]), ignore_errors=True)
        marker.unlink(missing_ok=True)
        removed += 1
    return removed


async def _keep_lease(renew: Callable[[], Awaitable[bool]], lease_s: float, attempt: int) -> None:
    """Renew the lease every ``lease_s / 3`` seconds (at least 0.2 s apart) until cancelled.

    Raises:
        TransferFailed: the owner answered that the attempt is stale (no longer its holder's).
    """
    while True:
        await asyncio.sleep(max(lease_s / 3, 0.2))
        if not await renew():
            raise TransferFailed(f"the owner no longer holds attempt {attempt} (its lease was renewed stale)")


def _decode_into(sink: _Sink, data: str) -> int:
    """Write the base64 ``data`` of a chunk to ``sink``; its bytes.

    Raises:
        TransferFailed: it is not base64 or holds more than :data:`BLOB_CHUNK_BYTES`.
    """
    try:
        raw = binascii.a2b_base64(data)  # (what b64decode does, without its copy of the text first)
    except ValueError:
        raise TransferFailed("the owner answered a chunk that is not base64") from None
    if len(raw) > BLOB_CHUNK_BYTES:
        raise TransferFailed("the owner answered a chunk over 1 MiB")
    sink.write(raw)
    return len(raw)


def _copy_exact(src: IO[bytes], sink: IO[bytes], size: int, digest: str) -> None:
    """Copy exactly ``size`` bytes of ``src`` to ``sink`` (a content the cache checked; bytes past its
    size, should anything have appended to it since, are never copied: they would be read as the stream's
    next header).

    Raises:
        TreeError: ``src`` holds fewer bytes.
    """
    left = size
    while left > 0:
        chunk = src.read(min(left, BLOB_CHUNK_BYTES))
        if not chunk:
            raise TreeError(f"content {digest[:12]}: the cached file is shorter than its {size} bytes")
        sink.write(chunk)
        left -= len(chunk)


class _PerContent:
    """One transfer at a time per content: two jobs of one snapshot granted here at once would both
    append to its one part file (a content mixed up, the hash refusing it, both transfers failing);
    the second waits and then takes what the first put in the cache."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._waited: set[str] = set()

    @contextlib.asynccontextmanager
    async def hold(self, digest: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(digest, (asyncio.Lock(), 0))
        self._locks[digest] = (lock, users + 1)
        try:
            if lock.locked():
                self._waited.add(digest)
            async with lock:
                yield
        finally:
            lock, users = self._locks[digest]
            if users <= 1:
                del self._locks[digest]
                self._waited.discard(digest)
            else:
                self._locks[digest] = (lock, users - 1)

    def waited(self, digest: str) -> bool:
        """Whether a transfer of ``digest`` waited for another one (so the cache may hold it now)."""
        return digest in self._waited


class _Buffer:
    """A bytes sink for the manifest (bounded by :data:`MAX_MANIFEST_BYTES`)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> int:
        self._size += len(data)
        if self._size > MAX_MANIFEST_BYTES:
            raise TransferFailed(f"a manifest over {MAX_MANIFEST_BYTES} bytes")
        self._parts.append(data)
        return len(data)

    def data(self) -> bytes:
        return b"".join(self._parts)
