"""The owner's content store of shipped snapshots: blobs by SHA-256 and manifests by snapshot id, in
a directory of its own (``<state dir>/snapshots/``, never beside the database), with caps.

Layout: ``blobs/<2 hex>/<sha256>`` (a file's bytes), ``manifests/<snapshot id>.json`` (``{"users",
"manifest"}``), ``partial/<uid>-<sha256>`` (an upload in progress). Every name is built from a
checked digest and a uid, never from a request's text.

Caps (bytes; MB = 10^6 bytes), checked when the CLI offers a manifest (:meth:`ContentStore.offer`):
the snapshot's distinct contents at most ``max_snapshot_bytes``; what one user's snapshots hold at
most ``user_quota_bytes``; all blobs at most ``total_bytes``; and the disk keeps ``reserve_bytes``
free (the database shares it). A refusal names the largest files.

A user is told a content is present only when one of that user's own snapshots lists it: whether
another user stored some file is never revealed (the upload of a content present already is
verified and dropped). An upload is taken only for a content an offer of that user found missing.

Old snapshots go (:meth:`ContentStore.prune`, at each offer of their user): those no queued or
running job names, last committed more than ``ship_keep_days`` ago, and, when a new snapshot would
put the user over the quota, the least recently committed of the others until it fits.

Uploads resume: a part file an interrupted upload left stays (until the daemon restarts), the next
offer of that user says how many bytes of each missing content it holds (``received``) and the
upload goes on from there; an upload that starts again from byte 0 drops the old part first. Chunks
of one part file are taken one at a time (its next byte checked, appended, hashed and renamed under its
lock): two uploads of one content at once never keep bytes under a name they do not hash to.

Blocking file I/O: the daemon calls these methods in a thread; a lock keeps the index consistent.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

from gpulayerd.core.shipping import cap_refusal, unique_bytes
from gpulayerd.host.privdirs import make_private_dirs
from gpulayerd.models.snapshots import BLOB_CHUNK_BYTES, BlobView, Manifest, SnapshotView, is_digest
from gpulayerd.ship.walk import hash_file

__all__ = ["CapExceeded", "ContentStore", "NotOffered"]

MAX_PENDING = 100_000
"""The most contents one user may have offered and not uploaded yet."""


class CapExceeded(Exception):
    """A snapshot over one of the caps (the message names the cap and the largest files)."""


class NotOffered(Exception):
    """An upload of a content no offer of this user asked for, or at another offset than the next."""


class ContentStore:
    """Blobs and manifests of the snapshots stored here (see the module docstring).

    Args:
        root: the store's own directory (created 0700).
        max_snapshot_bytes, user_quota_bytes, total_bytes, reserve_bytes: the caps, bytes.
    """

    def __init__(self, root: Path, *, max_snapshot_bytes: int, user_quota_bytes: int, total_bytes: int,
                 reserve_bytes: int) -> None:
        self.root = root
        self.max_snapshot_bytes = max_snapshot_bytes
        self.user_quota_bytes = user_quota_bytes
        self.total_bytes = total_bytes
        self.reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._owners: dict[str, set[str]] = {}  # snapshot id -> the users who stored it (the same files: one id)
        self._user_digests: dict[str, dict[str, int]] = {}  # user -> digest -> size (their snapshots' contents)
        self._pending: dict[str, dict[str, int]] = {}  # user -> digest -> size: offered, not uploaded
        self._uids: dict[str, int] = {}  # user -> the uid their uploads came from (their part files' names)
        self._part_locks: dict[tuple[int, str], tuple[threading.Lock, int]] = {}  # (uid, digest) -> lock, users
        self._blob_bytes = 0
        self._opened = False

    # ------------------------------------------------------------------ paths (from checked names only)

    def blob_path(self, digest: str) -> Path:
        """Where content ``digest`` lies. Raises ValueError: not a SHA-256."""
        if not is_digest(digest):
            raise ValueError("not a SHA-256")
        return self.root / "blobs" / digest[:2] / digest

    def _manifest_path(self, snapshot_id: str) -> Path:
        if not is_digest(snapshot_id):
            raise ValueError("not a snapshot id")
        return self.root / "manifests" / f"{snapshot_id}.json"

    def open(self) -> None:
        """Create the directories (0700) and read the index of what is stored (once)."""
        with self._lock:
            if self._opened:
                return
            make_private_dirs([self.root, self.root / "blobs", self.root / "manifests", self.root / "partial"])
            for p in (self.root / "manifests").glob("*.json"):
                try:
                    data = json.loads(p.read_bytes())
                    manifest = Manifest.model_validate(data["manifest"])
                    users = {str(u) for u in data.get("users", [data.get("user")]) if u}
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                self._owners[p.stem] = users
                for user in users:
                    self._user_digests.setdefault(user, {}).update(manifest.digests())
            self._blob_bytes = sum(p.stat().st_size for p in (self.root / "blobs").glob("*/*") if p.is_file())
            for p in (self.root / "partial").iterdir():  # uploads a previous life left: started again
                p.unlink(missing_ok=True)
            self._opened = True

    # ------------------------------------------------------------------ the CLI's side

    def offer(self, user: str, manifest: Manifest) -> SnapshotView:
        """Check ``manifest`` of ``user`` against the caps; the contents to upload (``missing``).

        Raises:
            CapExceeded: over a cap (naming it and the largest files).
        """
        self.open()
        entries = [e.to_core() for e in manifest.entries]
        digests = manifest.digests()
        wanted = unique_bytes(entries)
        if wanted > self.max_snapshot_bytes:
            raise CapExceeded(cap_refusal("this snapshot", wanted, self.max_snapshot_bytes, entries,
                                          "leave files out (.gitignore, .gpulayerignore) or ask the admin to raise "
                                          "ship_max_snapshot_mb"))
        with self._lock:
            mine = self._user_digests.get(user, {})
            missing = sorted(d for d in digests if d not in mine or not self.blob_path(d).is_file())
            new_for_user = sum(digests[d] for d in digests if d not in mine)
            held = sum(mine.values())
            if held + new_for_user > self.user_quota_bytes:
                raise CapExceeded(cap_refusal(f"{user}'s snapshots with this one", held + new_for_user,
                                              self.user_quota_bytes, entries,
                                              "old snapshots are kept: ask the admin (ship_user_quota_mb)"))
            new_here = sum(digests[d] for d in missing if not self.blob_path(d).is_file())
            if self._blob_bytes + new_here > self.total_bytes:
                raise CapExceeded(cap_refusal("all snapshots stored here with this one",
                                              self._blob_bytes + new_here, self.total_bytes, entries,
                                              "ask the admin (ship_total_mb)"))
            free = shutil.disk_usage(self.root).free
            if free - new_here < self.reserve_bytes:
                raise CapExceeded(cap_refusal("the new contents against the state disk's free space above its "
                                              "reserve", new_here, max(free - self.reserve_bytes, 0), entries,
                                              f"gpulayerd keeps {self.reserve_bytes / 1e6:.0f} MB free for its "
                                              "database (ship_reserve_mb)"))
            pending = self._pending.setdefault(user, {})
            if len(pending) + len(missing) > MAX_PENDING:
                pending.clear()
            pending.update({d: digests[d] for d in missing})
        uid = self._uids.get(user)
        received = {}
        for d in missing if uid is not None else []:
            try:
                have = self._part(uid or 0, d).stat().st_size
            except FileNotFoundError:
                continue
            if 0 < have < digests[d]:
                received[d] = have
        return SnapshotView(snapshot_id=manifest.snapshot_id(), missing=missing, received=received,
                            files=len(manifest.entries), bytes=manifest.file_bytes())

    def _part(self, uid: int, digest: str) -> Path:
        """The part file of ``uid``'s upload of ``digest`` (checked digest, numeric uid)."""
        return self.root / "partial" / f"{int(uid)}-{digest}"

    def put(self, user: str, uid: int, digest: str, offset: int, data: bytes) -> BlobView:
        """Append ``data`` at ``offset`` to the upload of content ``digest`` by ``user`` (uid ``uid``); once
        all its bytes are in, verify its SHA-256 and keep it.

        Raises:
            NotOffered: no offer of this user found it missing, ``offset`` is not the next byte, more
                bytes than offered, or a chunk over :data:`BLOB_CHUNK_BYTES` (nothing kept).
            CapExceeded: keeping it would pass the user's quota or the store's total as they stand now
                (several offers made before any upload add up), or the disk's reserve.
            ValueError: the bytes do not hash to ``digest`` (the upload is dropped).
        """
        if not is_digest(digest):
            raise NotOffered("not a SHA-256")
        with self._lock:
            size = self._pending.get(user, {}).get(digest)
        if size is None:
            raise NotOffered(f"content {digest[:12]} was not offered by {user} (offer the manifest first)")
        if len(data) > BLOB_CHUNK_BYTES:
            raise NotOffered(f"a chunk of {len(data)} bytes (at most {BLOB_CHUNK_BYTES})")
        with self._lock:
            self._uids[user] = uid
            part_lock, users = self._part_locks.get((uid, digest), (threading.Lock(), 0))
            self._part_locks[(uid, digest)] = (part_lock, users + 1)
        try:
            with part_lock:  # one upload of a part at a time: its next byte, append, hash and rename
                return self._put(user, uid, digest, offset, data, size)
        finally:
            with self._lock:
                part_lock, users = self._part_locks[(uid, digest)]
                if users <= 1:
                    del self._part_locks[(uid, digest)]
                else:
                    self._part_locks[(uid, digest)] = (part_lock, users - 1)

    def _put(self, user: str, uid: int, digest: str, offset: int, data: bytes, size: int) -> BlobView:
        """:meth:`put` with the lock of ``uid``'s part file of ``digest`` held."""
        part = self._part(uid, digest)
        have = part.stat().st_size if part.exists() else 0
        if offset == 0 and have:  # an upload started again from 0: the part an interrupted one left goes
            part.unlink(missing_ok=True)
            have = 0
        if offset != have or have + len(data) > size:
            raise NotOffered(f"content {digest[:12]}: next byte is {have} of {size}, not {offset} (+{len(data)})")
        with self._lock:  # offers made before any upload must not add up past the caps
            self._check_caps(user, digest, size)
        if shutil.disk_usage(self.root).free - len(data) < self.reserve_bytes:
            raise CapExceeded(f"snapshot refused: the state disk keeps {self.reserve_bytes / 1e6:.0f} MB free "
                              "for its database (ship_reserve_mb)")
        with open(part, "ab") as f:
            f.write(data)
        have += len(data)
        if have < size:
            return BlobView(digest=digest, received=have)
        if hash_file(part)[0] != digest:
            part.unlink(missing_ok=True)
            raise ValueError(f"content {digest[:12]}: the bytes uploaded do not hash to it (dropped)")
        dest = self.blob_path(digest)
        dest.parent.mkdir(mode=0o700, exist_ok=True)
        with self._lock:
            try:
                self._check_caps(user, digest, size)
            except CapExceeded:
                part.unlink(missing_ok=True)
                raise
            if dest.is_file():
                part.unlink(missing_ok=True)
            else:
                os.replace(part, dest)
                self._blob_bytes += size
            self._pending.get(user, {}).pop(digest, None)
            self._user_digests.setdefault(user, {})[digest] = size  # uploaded by them: theirs to be told of
        return BlobView(digest=digest, received=have, complete=True)

    def _check_caps(self, user: str, digest: str, size: int) -> None:
        """(Lock held.) Raise :class:`CapExceeded` when keeping content ``digest`` (``size`` bytes) for
        ``user`` would put them over their quota or all blobs over the total, as they stand now."""
        mine = self._user_digests.get(user, {})
        if digest not in mine and sum(mine.values()) + size > self.user_quota_bytes:
            raise CapExceeded(f"snapshot refused: {user}'s snapshots with this content: "
                              f"{(sum(mine.values()) + size) / 1e6:.1f} MB > {self.user_quota_bytes / 1e6:.1f} MB "
                              "(ship_user_quota_mb)")
        if not self.blob_path(digest).is_file() and self._blob_bytes + size > self.total_bytes:
            raise CapExceeded(f"snapshot refused: all snapshots stored here with this content: "
                              f"{(self._blob_bytes + size) / 1e6:.1f} MB > {self.total_bytes / 1e6:.1f} MB "
                              "(ship_total_mb)")

    def commit(self, user: str, manifest: Manifest) -> SnapshotView:
        """Store ``manifest`` as ``user``'s snapshot once every content is here and theirs; else the ones
        still missing (nothing stored)."""
        view = self.offer(user, manifest)
        if view.missing:
            return view
        sid = view.snapshot_id
        path = self._manifest_path(sid)
        with self._lock:
            users = self._owners.setdefault(sid, set())
            users.add(user)
            data = json.dumps({"users": sorted(users), "manifest": manifest.model_dump(mode="json")}).encode()
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # (its time: this commit's, what prune goes by)
            self._pending.pop(user, None)
        return view.model_copy(update={"stored": True})

    # ------------------------------------------------------------------ retention

    def prune(self, user: str, keep: set[str], max_age_s: float, manifest: Manifest | None = None,
              now: float | None = None) -> list[str]:
        """Remove ``user``'s snapshots that no job needs (not in ``keep``: the snapshots of queued or
        running jobs) and were last committed more than ``max_age_s`` ago; then, when ``manifest`` would
        put the user over their quota, their other unneeded snapshots, least recently committed first,
        until it fits. Contents no snapshot left lists (and no upload in progress wants) go too.

        Returns:
            The ids of the snapshots removed.
        """
        self.open()
        now = time.time() if now is None else now
        with self._lock:
            mine = []
            for sid, owners in self._owners.items():
                if user in owners and sid not in keep:
                    try:
                        mine.append((self._manifest_path(sid).stat().st_mtime, sid))
                    except FileNotFoundError:
                        continue
            mine.sort()
            drop = {sid for at, sid in mine if now - at > max_age_s}
            if manifest is not None:
                held = self._user_digests.get(user, {})
                wanted = manifest.digests()
                over = sum(held.values()) + sum(n for d, n in wanted.items() if d not in held) - self.user_quota_bytes
                if over > 0:  # least recently committed first, until the new one fits
                    for _, sid in mine:
                        if self._bytes_without(user, drop, wanted) <= self.user_quota_bytes:
                            break
                        drop.add(sid)
            if not drop:
                return []
            for sid in drop:
                owners = self._owners.get(sid, set())
                owners.discard(user)
                if owners:  # another user stored the same files: theirs stays (and its time)
                    path = self._manifest_path(sid)
                    st = path.stat()
                    data = json.loads(path.read_bytes())
                    data["users"] = sorted(owners)
                    path.write_bytes(json.dumps(data).encode())
                    os.utime(path, (st.st_atime, st.st_mtime))
                else:
                    self._manifest_path(sid).unlink(missing_ok=True)
                    self._owners.pop(sid, None)
            self._reindex()
        return sorted(drop)

    def _listed_by(self, sids: list[str]) -> dict[str, int]:
        """Digest -> size of the contents the stored manifests ``sids`` list (unreadable ones skipped)."""
        out: dict[str, int] = {}
        for sid in sids:
            try:
                data = json.loads(self._manifest_path(sid).read_bytes())
                out.update(Manifest.model_validate(data["manifest"]).digests())
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def _bytes_without(self, user: str, dropped: set[str], wanted: dict[str, int]) -> int:
        """What ``user`` would hold with ``wanted`` added, once the snapshots ``dropped`` are gone."""
        held = self._listed_by([sid for sid, owners in self._owners.items() if user in owners and sid not in dropped])
        return sum({**held, **wanted}.values())

    def _reindex(self) -> None:
        """After manifests went (lock held): every user's contents again, and the blobs nothing lists
        (nor any upload in progress wants) removed."""
        users: dict[str, list[str]] = {}
        for sid, owners in self._owners.items():
            for owner in owners:
                users.setdefault(owner, []).append(sid)
        self._user_digests = {owner: self._listed_by(sids) for owner, sids in users.items()}
        needed = {d for digests in self._user_digests.values() for d in digests}
        needed |= {d for pending in self._pending.values() for d in pending}
        for p in (self.root / "blobs").glob("*/*"):
            if p.name not in needed and is_digest(p.name):
                try:
                    size = p.stat().st_size
                    p.unlink()
                except FileNotFoundError:
                    continue
                self._blob_bytes -= size

    # ------------------------------------------------------------------ the owner's side

    def manifest_of(self, snapshot_id: str, user: str | None = None) -> Manifest | None:
        """The manifest of snapshot ``snapshot_id`` (only if ``user`` stored it, when given); None if not here."""
        self.open()
        try:
            data = json.loads(self._manifest_path(snapshot_id).read_bytes())
        except (OSError, ValueError):
            return None
        if user is not None and user not in data.get("users", [data.get("user")]):
            return None
        try:
            return Manifest.model_validate(data["manifest"])
        except (ValueError, KeyError):
            return None

    def read(self, digest: str, offset: int, limit: int = BLOB_CHUNK_BYTES) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of content ``digest`` from ``offset``, and its size.

        Raises:
            FileNotFoundError: it is not stored here. ValueError: not a SHA-256.
        """
        with open(self.blob_path(digest), "rb") as f:
            total = os.fstat(f.fileno()).st_size
            f.seek(offset)
            return f.read(min(limit, BLOB_CHUNK_BYTES)), total
