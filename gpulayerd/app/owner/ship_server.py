"""The owner's side of shipped jobs (``--ship``): snapshots uploaded by the local CLI, the contents
served to the worker that holds a shipped job, and the outputs a worker sends back.

- Local routes ``snapshot`` and ``snapshot_blob`` (any local user, as the kernel names them): the
  content store (:class:`~gpulayerd.ship.content.ContentStore`) checks the caps and keeps the blobs.
- At submit (:meth:`ShipServer.vet_submit`): a spec with ``ship`` must name a snapshot stored by
  the submitting user (no one runs, or reads, another user's files by naming their snapshot id).
- Peer route ``ship_fetch`` (role: the holder of the job's current attempt, for a content its
  manifest lists: :mod:`gpulayerd.app.roles`): a chunk of the manifest or of a file.
- Peer route ``ship_output`` (role: the holder of that attempt): output chunks are spooled here,
  root-only, capped at ``ship_outputs_mb``; at the end they are written as the job's user with
  ``O_NOFOLLOW`` into ``<workdir>/gpulayer-out/<job id>/`` (or ``output_dir``).
- Local route ``fetch`` (``gpulayer fetch``; the job's user or root): a chunk of the files of a
  finished attempt, asked of the worker that ran it (peer route ``ship_files``, answered only to
  the job's owner) from the tree it keeps for ``ship_keep_s``; the CLI writes them as the user.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.requester import Requester
from gpulayerd.config import DaemonConfig
from gpulayerd.core.job_facts import ACTIVE_STATES, job_user
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.shipping import MB, path_problem
from gpulayerd.errors import BadRequest, Forbidden, PeerBadRequest, PeerCallError, PeerRefused, PeerUnreachable
from gpulayerd.models import JobSpec
from gpulayerd.models.snapshots import (
    BlobView,
    FetchChunk,
    FetchRequest,
    OutputChunk,
    ShipChunk,
    ShipFetch,
    SnapshotRequest,
    SnapshotView,
    TreeFiles,
    is_digest,
)
from gpulayerd.net.transport import SHIP_FILES, PeerTransport, Sender
from gpulayerd.net.wire import Ack
from gpulayerd.ship.asuser import AsUserError, run_as, user_ids
from gpulayerd.ship.content import CapExceeded, ContentStore, NotOffered
from gpulayerd.ship.tree import header
from gpulayerd.store import Store

__all__ = ["ShipServer"]

log = logging.getLogger(__name__)


class ShipServer:
    """The owner's side of shipped jobs (see the module docstring).

    Args:
        config: the caps and directories.
        jobs: the jobs owned here (their specs).
        store: the job store (an event records outputs written back).
        clock: wall time of events.
        transport: calls the workers (``gpulayer fetch``; None: not served).
    """

    def __init__(self, *, config: DaemonConfig, jobs: OwnedJobs, store: Store, clock: Clock,
                 transport: PeerTransport | None = None) -> None:
        self._config = config
        self._transport = transport
        self._jobs = jobs
        self._store = store
        self._clock = clock
        self.content = ContentStore(config.snapshots_dir, max_snapshot_bytes=int(config.ship_max_snapshot_mb * MB),
                                    user_quota_bytes=int(config.ship_user_quota_mb * MB),
                                    total_bytes=int(config.ship_total_mb * MB),
                                    reserve_bytes=int(config.ship_reserve_mb * MB))
        self._listed: OrderedDict[str, frozenset[str]] = OrderedDict()  # snapshot id -> its contents (64 kept)
        self._spooled: dict[tuple[str, int], int] = {}  # (job, attempt) -> output bytes spooled

    @property
    def ship_default(self) -> bool:
        """The ``ship`` setting: jobs submitted here are shipped unless they say otherwise (told by health)."""
        return self._config.ship

    # ------------------------------------------------------------------ local routes

    async def snapshot(self, request: SnapshotRequest, requester: Requester) -> SnapshotView:
        """Local route ``snapshot``: offer (``commit`` false) or store a manifest of ``requester``.

        Raises:
            BadRequest: over a cap (the message names the cap and the largest files).
        """
        if not request.commit:  # old snapshots of this user no job needs go first (see ContentStore.prune)
            keep = await self._in_use()
            gone = await asyncio.to_thread(self.content.prune, requester.user, keep,
                                           self._config.ship_keep_days * 86400, request.manifest)
            if gone:
                log.info("removed %d old snapshot(s) of %s: %s", len(gone), requester.user,
                         ", ".join(g[:12] for g in gone[:5]))
        fn = self.content.commit if request.commit else self.content.offer
        try:
            return await asyncio.to_thread(fn, requester.user, request.manifest)
        except CapExceeded as e:
            raise BadRequest(str(e)) from None

    async def _in_use(self) -> set[str]:
        """The snapshot ids of the jobs owned here that are queued, claimed or running (kept)."""
        rows = await self._store.jobs.list_jobs({JobStatus.QUEUED, JobStatus.CLAIMED, JobStatus.RUNNING})
        out: set[str] = set()
        for row in rows:
            ship = self._jobs.spec(row).ship
            if ship is not None and ship.snapshot:
                out.add(ship.snapshot)
        return out

    async def snapshot_blob(self, requester: Requester, digest: str, offset: int, data: bytes) -> BlobView:
        """Local route ``snapshot_blob``: a chunk of a content an offer of ``requester`` found missing.

        Raises:
            BadRequest: not offered, a wrong offset, or bytes that do not hash to ``digest``.
        """
        try:
            return await asyncio.to_thread(self.content.put, requester.user, requester.uid, digest, offset, data)
        except (NotOffered, CapExceeded, ValueError) as e:
            raise BadRequest(f"snapshot upload: {e}") from None

    async def vet_submit(self, spec: Mapping[str, Any], requester: Requester) -> dict[str, Any]:
        """``spec`` (a submitted mapping) with its ``ship`` checked: a snapshot the requester stored; its
        size filled in. A spec without ``ship`` is returned as it is.

        Raises:
            BadRequest: ``ship`` without a snapshot, or a snapshot this user did not store here.
        """
        out = dict(spec)
        ship = out.get("ship")
        if ship is None or ship is False:
            return out
        if ship is True or not isinstance(ship, Mapping) or not ship.get("snapshot"):
            raise BadRequest("job spec: ship: no snapshot: gpulayer submit --ship uploads the workdir first")
        sid = str(ship.get("snapshot"))
        manifest = await asyncio.to_thread(self.content.manifest_of, sid, requester.user) if is_digest(sid) else None
        if manifest is None:
            raise BadRequest(f"job spec: ship: snapshot {sid[:16]!r} is not one {requester.user} stored here")
        out["ship"] = {**ship, "files": len(manifest.entries), "bytes": manifest.file_bytes()}
        return out

    async def files(self, requester: Requester, job_ref: str, request: FetchRequest) -> FetchChunk:
        """Local route ``fetch``: a chunk of the stream of files of a finished attempt of a shipped job
        owned here, from the tree its worker keeps.

        Raises:
            Forbidden: the requester is neither the job's user nor root.
            BadRequest: not shipped, no such attempt, it still runs, or the worker refused (its tree
                is not kept any more, say). NoSuchJob, AmbiguousJob: no job (not owned here).
            PeerUnreachable: the worker did not answer.
        """
        row = await self._jobs.row(job_ref)
        spec = self._jobs.spec(row)
        user = job_user(spec.user, row.submitted_by)
        if requester.uid != 0 and requester.user != user:
            raise Forbidden(f"job {row.id} belongs to {user or 'nobody'}: only its user (or root) fetches its files")
        if spec.ship is None:
            raise BadRequest(f"job {row.id} was not shipped: its files are in its workdir")
        n = request.attempt or row.attempt
        if not 1 <= n <= row.attempt:
            raise BadRequest(f"job {row.id} has no attempt {n}" + (f" (attempts: 1 to {row.attempt})"
                                                                    if row.attempt else ": it has not run yet"))
        if n == row.attempt and row.status in ACTIVE_STATES:
            raise BadRequest(f"attempt {n} of job {row.id} still runs: fetch its files once it ended")
        tried = next((a for a in await self._store.jobs.attempts(row.id) if a.attempt == n), None)
        if tried is None or not tried.worker or self._transport is None:
            raise BadRequest(f"attempt {n} of job {row.id} ran nowhere known")
        try:
            chunk = await self._transport.call(tried.worker, SHIP_FILES, TreeFiles(
                job_id=row.id, attempt=n, patterns=request.patterns, offset=request.offset))
        except PeerRefused as e:
            raise BadRequest(f"fetch: refused by its worker: {e.reason}") from None
        except PeerCallError as e:
            said = next((str(e).split(m, 1)[1] for m in (": HTTP 400: ", ": PeerBadRequest: ") if m in str(e)), None)
            if said is not None:  # the worker's words (its tree is not kept any more, say)
                raise BadRequest(f"fetch: its worker answered: {said[:300]}") from None
            raise PeerUnreachable(f"cannot fetch from {tried.worker[:12]}: {e}") from e
        return FetchChunk(attempt=n, worker=tried.worker, data=chunk.data, offset=chunk.offset, total=chunk.total)

    # ------------------------------------------------------------------ the role check's facts

    async def listed(self, snapshot_id: str, digest: str) -> bool:
        """Whether snapshot ``snapshot_id``'s manifest lists content ``digest`` (for the role check)."""
        contents = self._listed.get(snapshot_id)
        if contents is None:
            manifest = await asyncio.to_thread(self.content.manifest_of, snapshot_id)
            contents = frozenset(manifest.digests()) if manifest is not None else frozenset()
            self._listed[snapshot_id] = contents
            while len(self._listed) > 64:
                self._listed.popitem(last=False)
        self._listed.move_to_end(snapshot_id)
        return digest in contents

    # ------------------------------------------------------------------ peer routes

    async def fetch(self, sender: Sender, msg: ShipFetch) -> ShipChunk:
        """Peer route ``ship_fetch`` (role checked: the sender holds the job's current attempt and the
        manifest lists the content): a chunk of the manifest or of a file.

        Raises:
            PeerBadRequest: the content is not stored here (any more).
        """
        spec = await self._jobs.spec_of(msg.job_id)
        sid = spec.ship.snapshot if spec is not None and spec.ship is not None else None
        if sid is not None and msg.digest == sid:
            manifest = await asyncio.to_thread(self.content.manifest_of, sid)
            if manifest is None:
                raise PeerBadRequest(f"snapshot {sid[:12]} is not stored here any more")
            raw = manifest.canonical()
            data, total = raw[msg.offset:msg.offset + (1 << 20)], len(raw)
        else:
            try:
                data, total = await asyncio.to_thread(self.content.read, msg.digest, msg.offset)
            except (OSError, ValueError) as e:
                raise PeerBadRequest(f"content {msg.digest[:12]} is not stored here: {e}") from None
        return ShipChunk(data=base64.b64encode(data).decode("ascii"), offset=msg.offset, total=total)

    def _spool(self, job_id: str, attempt: int) -> Path:
        return self._config.snapshots_dir / "outputs" / f"{job_id}-{attempt}"  # (ids checked by the router)

    async def output(self, sender: Sender, msg: OutputChunk) -> Ack:
        """Peer route ``ship_output`` (role checked: the sender held that attempt): spool a chunk of an
        output file; ``done``: write the spooled files as the job's user, then drop the spool."""
        spool = self._spool(msg.job_id, msg.attempt)
        key = (msg.job_id, msg.attempt)
        if msg.done:
            return await self._deliver(msg, spool)
        problem = path_problem(msg.path)
        if problem is not None:
            return Ack(ok=False, reason=f"output refused: {problem}")
        try:
            data = base64.b64decode(msg.data, validate=True)
        except ValueError:
            return Ack(ok=False, reason="output chunk is not base64")
        cap = int(self._config.ship_outputs_mb * MB)
        if self._spooled.get(key, 0) + len(data) > cap:
            return Ack(ok=False, reason=f"outputs over {cap / MB:.1f} MB: the rest is left out")
        self._spooled[key] = self._spooled.get(key, 0) + len(data)
        await asyncio.to_thread(_append, spool, msg.path, msg.offset, data, msg.executable)
        return Ack(ok=True)

    async def _deliver(self, msg: OutputChunk, spool: Path) -> Ack:
        key = (msg.job_id, msg.attempt)
        self._spooled.pop(key, None)
        spec = await self._jobs.spec_of(msg.job_id)
        if spec is None or spec.ship is None or not spec.workdir:
            await asyncio.to_thread(shutil.rmtree, spool, True)
            return Ack(ok=False, reason="no shipped job of that id here")
        dest = spec.ship.output_dir or os.path.join(spec.workdir, "gpulayer-out", msg.job_id)
        try:
            n = await asyncio.to_thread(_write_back, spool, dest, spec, self._config.ship_transfer_timeout_s)
            words = f"Outputs: {n} file(s) of attempt {msg.attempt} written to {dest}"
        except (AsUserError, LookupError, OSError) as e:
            words = f"Outputs: attempt {msg.attempt}'s could not be written to {dest}: {e}"
        finally:
            await asyncio.to_thread(shutil.rmtree, spool, True)
        if msg.note:
            words += f" ({msg.note[:300]})"
        log.info("job_id=%s: %s", msg.job_id, words)
        await self._store.jobs.add_event(msg.job_id, "outputs", words, attempt=msg.attempt, now_wall=self._clock.wall())
        return Ack(ok=True)


def _append(spool: Path, rel: str, offset: int, data: bytes, executable: bool) -> None:
    """Append ``data`` to the spooled file ``rel`` (written only at ``offset`` = its size: a repeat is
    dropped). Spool files are flat (``/`` escaped), so no directory of the spool is ever a link."""
    spool.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = rel.replace("%", "%25").replace("/", "%2F")
    path = spool / name
    have = path.stat().st_size if path.exists() else 0
    if offset != have:
        return
    with open(path, "ab") as f:
        f.write(data)
    if executable:
        (spool / (name + ".x")).touch()


def _write_back(spool: Path, dest: str, spec: JobSpec, timeout_s: float) -> int:
    """Write the spooled outputs into ``dest`` as the job's user; how many files."""
    names = sorted(p.name for p in spool.iterdir() if not p.name.endswith(".x")) if spool.is_dir() else []

    def feed(sink: IO[bytes]) -> None:
        for name in names:
            data = (spool / name).read_bytes()
            rel = name.replace("%2F", "/").replace("%25", "%")
            sink.write(header({"path": rel, "kind": "file", "size": len(data),
                               "executable": (spool / (name + ".x")).exists()}))
            sink.write(data)

    run_as("write", [dest], user_ids(spec.user), feed=feed, timeout_s=timeout_s)
    return len(names)

