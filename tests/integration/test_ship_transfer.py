"""A shipped job's transfer on the worker (issue 34), with an owner that never answers: the lease is
renewed while the transfer lasts, the transfer ends at ``ship_transfer_timeout_s`` with
``Transfer: not done within ...`` and leaves no tree; a stale answer to a renewal ends it at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.app.worker.ship_client import ShipClient, TransferFailed
from gpulayerd.config import DaemonConfig
from gpulayerd.models import JobSpec
from gpulayerd.ship.blobcache import BlobCache

SNAPSHOT = "ab" * 32


class _Silent:
    """An owner that takes every call and never answers it."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, node_id: str, route: Any, body: Any) -> Any:
        self.calls += 1
        await asyncio.Event().wait()


def _client(tmp_path: Path, timeout_s: float) -> tuple[ShipClient, _Silent]:
    owner = _Silent()
    config = DaemonConfig(state_dir=tmp_path, ship_transfer_timeout_s=timeout_s)
    return ShipClient(config=config, node_id="worker", transport=owner), owner  # type: ignore[arg-type]


SPEC = JobSpec(command=["true"], workdir="/", ship={"snapshot": SNAPSHOT})


@pytest.mark.asyncio
async def test_a_transfer_past_its_time_limit_is_a_transfer_failure_with_its_lease_renewed_meanwhile(
        tmp_path: Path) -> None:
    client, owner = _client(tmp_path, 0.7)
    renewals: list[float] = []

    async def renew() -> bool:
        renewals.append(time.monotonic())
        return True

    began = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await client.prepare("owner-node", "job1", 1, SPEC, renew, lease_s=0.6)
    assert str(failed.value) == "Transfer: not done within 0.7 s"
    assert 0.69 < time.monotonic() - began < 2.0
    assert len(renewals) >= 2 and owner.calls == 1  # renewed every lease/3 s while the manifest never came
    assert not client.tree("owner-node", "job1", 1).exists()


@pytest.mark.asyncio
async def test_a_stale_answer_to_a_renewal_ends_the_transfer(tmp_path: Path) -> None:
    client, _ = _client(tmp_path, 30.0)

    async def stale() -> bool:
        return False

    began = time.monotonic()
    with pytest.raises(TransferFailed) as failed:
        await client.prepare("owner-node", "job1", 2, SPEC, stale, lease_s=0.6)
    assert str(failed.value) == "Transfer: the owner no longer holds attempt 2 (its lease was renewed stale)"
    assert time.monotonic() - began < 5.0
    assert not client.tree("owner-node", "job1", 2).exists()


class _Owner:
    """An owner that serves a snapshot's manifest and contents (peer route ``ship_fetch``)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        import base64
        import hashlib

        from gpulayerd.models.snapshots import Manifest, ManifestEntry

        self.b64 = base64.b64encode
        self.manifest = Manifest(entries=[ManifestEntry(path=p, kind="file", size=len(d),
                                                        sha256=hashlib.sha256(d).hexdigest())
                                          for p, d in sorted(files.items())])
        self.blobs = {e.sha256: files[e.path] for e in self.manifest.entries}
        self.blobs[self.manifest.snapshot_id()] = self.manifest.canonical()
        self.fetched: list[str] = []

    async def call(self, node_id: str, route: Any, body: Any) -> Any:
        from gpulayerd.models.snapshots import ShipChunk

        self.fetched.append(body.digest)
        data = self.blobs[body.digest]
        return ShipChunk(data=self.b64(data[body.offset:body.offset + (1 << 20)]).decode(), offset=body.offset,
                         total=len(data))


@pytest.mark.asyncio
async def test_a_cached_content_is_hashed_once_per_daemon_life_and_a_corrupt_one_fails_the_transfer(
        tmp_path: Path) -> None:
    owner = _Owner({"a.py": b"print('a')\n", "data/b.bin": b"\x00" * 5000})
    spec = JobSpec(command=["true"], workdir="/", ship={"snapshot": owner.manifest.snapshot_id()})
    config = DaemonConfig(state_dir=tmp_path)
    first = ShipClient(config=config, node_id="worker", transport=owner)  # type: ignore[arg-type]
    tree = Path(await first.prepare("owner-node", "job1", 1, spec))
    assert (tree / "data" / "b.bin").read_bytes() == b"\x00" * 5000
    again = ShipClient(config=config, node_id="worker", transport=owner)  # type: ignore[arg-type]  # a new life
    blob = again.cache.path(owner.manifest.entries[1].sha256)
    blob.write_bytes(b"\x01" * 5000)  # rotted in place: same file, same size
    owner.fetched.clear()
    with pytest.raises(TransferFailed, match="the cached bytes do not hash to it"):
        await again.prepare("owner-node", "job1", 2, spec)
    assert not again.tree("owner-node", "job1", 2).exists() and not blob.exists()
    assert owner.fetched == [owner.manifest.snapshot_id()]  # the cache was believed, then checked
    tree = Path(await again.prepare("owner-node", "job1", 3, spec))  # fetched again, verified
    assert (tree / "data" / "b.bin").read_bytes() == b"\x00" * 5000


class _Interleaving(_Owner):
    """An owner whose every answer lets the other transfers in progress run first (two jobs of one
    snapshot granted to one worker at once fetch their contents side by side)."""

    async def call(self, node_id: str, route: Any, body: Any) -> Any:
        for _ in range(3):
            await asyncio.sleep(0)
        return await super().call(node_id, route, body)


@pytest.mark.asyncio
async def test_two_transfers_of_one_content_at_once_both_unpack_its_exact_bytes(tmp_path: Path) -> None:
    big = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and more: several chunks each
    owner = _Interleaving({"a.py": b"print('a')\n", "data/big.bin": big})
    spec = JobSpec(command=["true"], workdir="/", ship={"snapshot": owner.manifest.snapshot_id()})
    client = ShipClient(config=DaemonConfig(state_dir=tmp_path), node_id="worker",
                        transport=owner)  # type: ignore[arg-type]
    trees = await asyncio.gather(client.prepare("owner-node", "job1", 1, spec),
                                 client.prepare("owner-node", "job2", 1, spec))
    for tree in trees:
        assert (Path(tree) / "data" / "big.bin").read_bytes() == big
    digest = next(e.sha256 for e in owner.manifest.entries if e.path == "data/big.bin")
    assert client.cache.path(digest).read_bytes() == big  # the cache holds it once, whole
    assert owner.fetched.count(digest) == 4  # fetched by one transfer (4 chunks); the other took the cache's


class _GrowingCache(BlobCache):
    """A cache whose content grows (a writer that still holds it open, appending) once it was opened
    and checked for an unpack."""

    grown = False

    def open_content(self, digest: str, size: int) -> Any:
        f = super().open_content(digest, size)
        if self.grown:
            return f
        self.grown = True
        with open(self.path(digest), "ab") as more:
            more.write(b'{"path":"injected.py","kind":"file","size":2}\nhi')
        return f


@pytest.mark.asyncio
async def test_an_unpack_copies_exactly_each_files_size_from_the_cache(tmp_path: Path) -> None:
    owner = _Owner({"a.py": b"print('a')\n", "b.py": b"print('b')\n"})
    spec = JobSpec(command=["true"], workdir="/", ship={"snapshot": owner.manifest.snapshot_id()})
    client = ShipClient(config=DaemonConfig(state_dir=tmp_path), node_id="worker",
                        transport=owner)  # type: ignore[arg-type]
    client.cache = _GrowingCache(client.cache.root, client.cache.max_bytes)
    tree = Path(await client.prepare("owner-node", "job1", 1, spec))
    assert sorted(p.name for p in tree.iterdir()) == ["a.py", "b.py"]
    assert (tree / "a.py").read_bytes() == b"print('a')\n" and (tree / "b.py").read_bytes() == b"print('b')\n"
