"""Shipped workdirs (issue 34), the parts without processes or network: path and glob rules, the
manifest's checks and id, the ignore rules outside git, the owner's caps (the refusal names the
largest files), uploads only of offered contents, and trees written without following links."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulayerd.core.shipping import Entry, cap_refusal, glob_problem, manifest_problem, path_problem
from gpulayerd.models import JobSpec
from gpulayerd.models.snapshots import Manifest, ManifestEntry
from gpulayerd.ship.asuser import AsUserError, run_as
from gpulayerd.ship.blobcache import BlobCache
from gpulayerd.ship.content import CapExceeded, ContentStore, NotOffered
from gpulayerd.ship.tree import TreeError, collect_outputs, header, read_entries, write_tree
from gpulayerd.ship.walk import _ignored_walk, make_manifest


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_paths_and_globs() -> None:
    assert path_problem("src/train.py") is None
    assert path_problem("/etc/passwd") == "an absolute path ('/etc/passwd')"
    assert path_problem("a/../b") == "a path with an empty, '.' or '..' component ('a/../b')"
    assert path_problem("a//b") is not None and path_problem("") == "an empty path"
    assert glob_problem("results/*.json") is None and glob_problem("./out/**/*.pt") is None
    assert glob_problem("/tmp/*.json") == "'/tmp/*.json' is absolute: give a pattern relative to the workdir " \
                                          "(e.g. results/*.json)"
    assert glob_problem("../x/*.json") == "'../x/*.json' climbs out of the workdir ('..'): give a pattern inside it"


def test_manifest_refuses_entries_under_a_link_or_a_file_and_duplicates() -> None:
    h = "ab" * 32
    assert manifest_problem([Entry("a", "link", target="/etc"), Entry("a/passwd", "file", 1, h)]) == \
        "'a/passwd' lies under 'a', which is a link"
    assert manifest_problem([Entry("a", "file", 1, h), Entry("a/b", "file", 1, h)]) == \
        "'a/b' lies under 'a', which is a file"
    assert manifest_problem([Entry("a", "file", 1, h), Entry("a", "file", 1, h)]) == "'a' is listed twice"
    assert manifest_problem([Entry("a", "file", 1, "XYZ")]) == "'a': not a SHA-256 (64 lowercase hex digits)"
    assert manifest_problem([Entry("a", "link", target="../../x"), Entry("b/c", "file", 0, h)]) is None


def test_manifest_id_is_the_hash_of_its_canonical_json_whatever_the_order() -> None:
    e1 = ManifestEntry(path="b.txt", kind="file", size=2, sha256=_sha(b"hi"))
    e2 = ManifestEntry(path="a", kind="link", target="b.txt")
    m1, m2 = Manifest(entries=[e1, e2]), Manifest(entries=[e2, e1])
    assert m1.snapshot_id() == m2.snapshot_id() == _sha(m1.canonical())
    assert m1.digests() == {_sha(b"hi"): 2}
    with pytest.raises(ValueError, match="absolute path"):
        Manifest(entries=[ManifestEntry(path="/x", kind="file", size=0, sha256=_sha(b""))])


def test_spec_ship_true_and_the_workdir_rule() -> None:
    shipped = JobSpec.model_validate({"command": ["true"], "workdir": "/w", "ship": True})
    assert shipped.ship is not None and shipped.ship.snapshot is None
    assert shipped.to_core().workdir is None  # no worker needs the workdir
    plain = JobSpec.model_validate({"command": ["true"], "workdir": "/w", "ship": False})
    assert plain.ship is None and plain.to_core().workdir == "/w"  # today's rule
    with pytest.raises(ValueError, match="climbs out"):
        JobSpec.model_validate({"command": ["true"], "ship": {"outputs": ["../secret"]}})


def test_ignore_file_outside_git(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x")
    (tmp_path / "data.bin").write_bytes(b"0" * 10)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "x.log").write_text("l")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / ".gpulayerignore").write_text("*.bin\nlogs/\n")
    os.symlink("/etc", tmp_path / "etc-link")
    assert _ignored_walk(tmp_path) == [".gpulayerignore", "etc-link", "src/a.py"]
    body, sources, _ = make_manifest(tmp_path, _ignored_walk(tmp_path))
    manifest = Manifest.model_validate(body)  # what the daemon takes, unchanged
    assert manifest.model_dump(mode="json") == body
    kinds = {e.path: (e.kind, e.target) for e in manifest.entries}
    assert kinds["etc-link"] == ("link", "/etc")  # shipped as a link, never followed
    assert sources[_sha(b"x")] == tmp_path / "src" / "a.py"


def _store(tmp_path: Path, **caps: int) -> ContentStore:
    mb = 1_000_000
    args = {"max_snapshot_bytes": 10 * mb, "user_quota_bytes": 20 * mb, "total_bytes": 30 * mb, "reserve_bytes": 0}
    args.update(caps)
    return ContentStore(tmp_path / "snapshots", **args)


def test_caps_name_the_largest_files(tmp_path: Path) -> None:
    store = _store(tmp_path, max_snapshot_bytes=1000)
    big = ManifestEntry(path="data/big.bin", kind="file", size=5000, sha256="aa" * 32)
    small = ManifestEntry(path="train.py", kind="file", size=10, sha256="bb" * 32)
    with pytest.raises(CapExceeded) as e:
        store.offer("alice", Manifest(entries=[small, big]))
    assert str(e.value).startswith("snapshot refused: this snapshot: 0.0 MB > 0.0 MB; largest files: "
                                   "data/big.bin (0.0 MB), train.py (0.0 MB)")
    quota = _store(tmp_path, user_quota_bytes=100)
    with pytest.raises(CapExceeded, match="alice's snapshots with this one"):
        quota.offer("alice", Manifest(entries=[big]))
    assert "largest files: x (5.0 MB)" in cap_refusal("w", 1, 0, [Entry("x", "file", 5_000_000, "cc" * 32)], "h")


def test_upload_only_what_was_offered_verified_then_committed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = b"print('hi')\n"
    m = Manifest(entries=[ManifestEntry(path="a.py", kind="file", size=len(data), sha256=_sha(data))])
    with pytest.raises(NotOffered):
        store.put("alice", 1000, _sha(data), 0, data)  # no offer yet
    assert store.offer("alice", m).missing == [_sha(data)]
    with pytest.raises(NotOffered):
        store.put("bob", 1001, _sha(data), 0, data)  # alice's offer, not bob's
    assert store.put("alice", 1000, _sha(data), 0, data[:4]).received == 4
    assert store.put("alice", 1000, _sha(data), 4, data[4:]).complete
    view = store.commit("alice", m)
    assert view.stored and view.snapshot_id == m.snapshot_id()
    assert store.manifest_of(view.snapshot_id, "alice") == m
    assert store.manifest_of(view.snapshot_id, "bob") is None  # bob cannot name alice's snapshot
    # bob is never told alice's content is here: he must upload it himself.
    assert store.offer("bob", m).missing == [_sha(data)]
    assert store.read(_sha(data), 6) == (data[6:], len(data))


def _stream(entries: list[tuple[dict[str, object], bytes]]) -> bytes:
    return b"".join(header(h) + body for h, body in entries)


def test_tree_written_without_following_links_and_verified(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    ok = _stream([({"path": "src/a.py", "kind": "file", "size": 2, "sha256": _sha(b"hi"), "executable": True}, b"hi"),
                  ({"path": "link", "kind": "link", "target": "/etc"}, b"")])
    assert write_tree(str(root), io.BytesIO(ok)) == (2, 2)
    assert (root / "src" / "a.py").read_bytes() == b"hi" and os.access(root / "src" / "a.py", os.X_OK)
    assert os.readlink(root / "link") == "/etc"
    under = _stream([({"path": "link/passwd", "kind": "file", "size": 1, "sha256": _sha(b"x")}, b"x")])
    with pytest.raises(TreeError, match="a directory on its way is a link"):
        write_tree(str(root), io.BytesIO(under))
    assert not (tmp_path / "passwd").exists()
    wrong = _stream([({"path": "b", "kind": "file", "size": 1, "sha256": _sha(b"y")}, b"x")])
    with pytest.raises(TreeError, match="do not hash"):
        write_tree(str(root), io.BytesIO(wrong))
    with pytest.raises(TreeError, match="refused: an absolute path"):
        write_tree(str(root), io.BytesIO(_stream([({"path": "/abs", "kind": "file", "size": 0}, b"")])))


def test_a_collected_stream_s_trailer_ends_the_entries_whatever_the_last_file_ends_with(tmp_path: Path) -> None:
    root = tmp_path / "got"
    root.mkdir()
    stream = _stream([({"path": "results/r.dat", "kind": "file", "size": 10}, b"no newline"),
                      ({"done": True, "note": "1 output file(s) left out"}, b"")])
    assert write_tree(str(root), io.BytesIO(stream), verify=False, replace=True) == (1, 10)
    assert (root / "results" / "r.dat").read_bytes() == b"no newline" and sorted(os.listdir(root)) == ["results"]


def test_outputs_collected_without_links_and_capped(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text('{"a": 1}')
    (tmp_path / "results" / "big.json").write_text("x" * 100)
    os.symlink("/etc/passwd", tmp_path / "results" / "passwd.json")
    out = io.BytesIO()
    note = collect_outputs(str(tmp_path), ["results/*.json"], out, max_bytes=50, max_files=10)
    got = {}
    for h, read in read_entries(io.BytesIO(out.getvalue())):
        got[h["path"]] = read(h["size"])
    assert got == {"results/a.json": b'{"a": 1}'}  # the link is never followed, the big one over the cap
    assert note.startswith("1 output file(s) left out over the caps") and "results/big.json" in note


def test_a_matched_directory_stands_for_every_file_under_it_no_link_followed(tmp_path: Path) -> None:
    (tmp_path / "results" / "run1").mkdir(parents=True)
    (tmp_path / "results" / "run1" / "m.json").write_text("1")
    (tmp_path / "results" / ".hidden").write_text("2")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("no")
    os.symlink(tmp_path / "outside", tmp_path / "results" / "linked")  # a link to a directory: never entered
    os.symlink(tmp_path / "outside", tmp_path / "viaLink")
    out = io.BytesIO()
    assert collect_outputs(str(tmp_path), ["results", "viaLink"], out, max_bytes=1000, max_files=10) == ""
    got = {h["path"]: read(h["size"]) for h, read in read_entries(io.BytesIO(out.getvalue()))}
    assert got == {"results/.hidden": b"2", "results/run1/m.json": b"1"}
    out = io.BytesIO()  # the file cap holds for a directory's files too
    note = collect_outputs(str(tmp_path), ["results"], out, max_bytes=1000, max_files=1)
    assert note.startswith("1 output file(s) left out over the caps (1 files")


def test_unpack_in_process_through_the_stream_and_cache(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache", max_bytes=5)
    data = b"hello"
    part = cache.partial(_sha(data))
    part.write_bytes(data)
    cache.finish(_sha(data))
    assert cache.has(_sha(data))
    bad = cache.partial("cd" * 32)
    bad.write_bytes(b"nope")
    with pytest.raises(ValueError, match="do not hash"):
        cache.finish("cd" * 32)
    tree = tmp_path / "tree"
    tree.mkdir()

    def feed(sink: io.BufferedWriter) -> None:  # type: ignore[type-arg]
        sink.write(header({"path": "m.txt", "kind": "file", "size": 5, "sha256": _sha(data)}))
        sink.write(cache.path(_sha(data)).read_bytes())

    assert run_as("unpack", [str(tree)], None, feed=feed, timeout_s=5) == b'{"entries": 1, "bytes": 5}'
    assert (tree / "m.txt").read_bytes() == data and os.stat(tree / "m.txt").st_ino != os.stat(
        cache.path(_sha(data))).st_ino  # a copy, never a link into the cache
    with pytest.raises(AsUserError, match="listed twice"):
        run_as("unpack", [str(tree)], None, feed=feed, timeout_s=5)
    (tmp_path / "cache" / ("ef" * 32)).write_bytes(b"123456")
    assert cache.trim({_sha(data)}) == 6  # over the cap: the unpinned content goes, the pinned one stays
    assert cache.has(_sha(data)) and not cache.has("ef" * 32)


class _Cut(Exception):
    """The CLI's connection cut in the middle of an upload."""


class _StoreClient:
    """The CLI's client of the local daemon, straight onto a content store; cut after ``cut_after`` chunks."""

    def __init__(self, store: ContentStore, cut_after: int | None = None) -> None:
        self.store = store
        self.cut_after = cut_after
        self.offsets: list[int] = []

    def snapshot(self, manifest: dict[str, object], commit: bool) -> object:
        m = Manifest.model_validate(manifest)
        return self.store.commit("alice", m) if commit else self.store.offer("alice", m)

    def snapshot_blob(self, digest: str, offset: int, data: bytes) -> object:
        if self.cut_after is not None and len(self.offsets) >= self.cut_after:
            raise _Cut
        self.offsets.append(offset)
        return self.store.put("alice", 1000, digest, offset, data)


def test_an_interrupted_upload_resumes_from_the_bytes_the_daemon_holds(tmp_path: Path) -> None:
    from gpulayerd.models.snapshots import BLOB_CHUNK_BYTES
    from gpulayerd.ship.upload import send_snapshot

    store = _store(tmp_path)
    data = os.urandom(2 * BLOB_CHUNK_BYTES + 1000)  # three chunks
    (tmp_path / "big.bin").write_bytes(data)
    m = Manifest(entries=[ManifestEntry(path="big.bin", kind="file", size=len(data), sha256=_sha(data))])
    body, sources = m.model_dump(mode="json"), {_sha(data): tmp_path / "big.bin"}
    first = _StoreClient(store, cut_after=1)
    with pytest.raises(_Cut):
        send_snapshot(first, body, sources)  # one chunk in, then the connection is cut
    assert store.offer("alice", m).received == {_sha(data): BLOB_CHUNK_BYTES}
    again = _StoreClient(store)
    assert send_snapshot(again, body, sources) == m.snapshot_id()
    assert again.offsets == [BLOB_CHUNK_BYTES, 2 * BLOB_CHUNK_BYTES]  # resumed: the first chunk is not sent again
    assert store.read(_sha(data), 0, len(data))[1] == len(data)
    assert store.blob_path(_sha(data)).read_bytes() == data


def test_an_upload_started_again_from_zero_drops_the_stale_part(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = b"0123456789" * 10
    m = Manifest(entries=[ManifestEntry(path="d.txt", kind="file", size=len(data), sha256=_sha(data))])
    store.offer("alice", m)
    assert store.put("alice", 1000, _sha(data), 0, b"garbage").received == 7  # an old CLI's cut upload
    assert store.put("alice", 1000, _sha(data), 0, data).complete  # from 0 again: the part is dropped, not refused
    assert store.commit("alice", m).stored
    assert store.blob_path(_sha(data)).read_bytes() == data


def test_kept_trees_are_removed_once_older_than_ship_keep_s(tmp_path: Path) -> None:
    from gpulayerd.app.worker.ship_client import _ended, _sweep

    old, new, running = tmp_path / "owner-job1-1", tmp_path / "owner-job2-1", tmp_path / "owner-job3-1"
    for tree in (old, new, running):
        (tree / "src").mkdir(parents=True)
        (tree / "src" / "a.py").write_text("x")
    _ended(old).touch()
    _ended(new).touch()
    day_ago = os.path.getmtime(_ended(new)) - 86401
    os.utime(_ended(old), (day_ago, day_ago))
    assert _sweep(tmp_path, 86400.0) == 1
    assert not old.exists() and not _ended(old).exists()
    assert (new / "src" / "a.py").read_text() == "x" and running.is_dir()  # kept; no marker: its attempt runs


def test_a_lab_default_ships_jobs_that_do_not_say_and_no_ship_overrides_it() -> None:
    from argparse import Namespace

    from gpulayerd.models.views import HealthView
    from gpulayerd.ship.upload import wants_ship

    asked: list[bool] = []

    def lab(default: bool) -> Callable[[], bool]:
        def ask() -> bool:
            asked.append(default)
            return default
        return ask

    plain = Namespace(ship=None, no_ship=None)
    assert wants_ship(plain, {"command": ["x"]}, lab(True)) is True  # the daemon's ship = true
    assert wants_ship(plain, {"command": ["x"]}, lab(False)) is False
    assert asked == [True, False]
    assert wants_ship(Namespace(ship=None, no_ship=True), {"command": ["x"]}, lab(True)) is False
    assert wants_ship(plain, {"ship": False}, lab(True)) is False  # the job's file says no
    assert wants_ship(Namespace(ship=True, no_ship=None), {}, lab(False)) is True
    assert wants_ship(plain, {"distributed": {"nnodes": 2}}, lab(True)) is False  # multi-host: not shipped yet
    assert asked == [True, False]  # asked only when nothing else decides
    assert HealthView.model_validate({"ok": True, "version": "0", "node_id": "n", "hostname": "h", "pid": 1,
                                      "state_dir": "/s", "ship_default": True}).ship_default


def _snapshot(store: ContentStore, user: str, data: bytes, at: float) -> str:
    m = Manifest(entries=[ManifestEntry(path="f.bin", kind="file", size=len(data), sha256=_sha(data))])
    store.offer(user, m)
    store.put(user, 1000, _sha(data), 0, data)
    sid = store.commit(user, m).snapshot_id
    os.utime(tmp := store.root / "manifests" / f"{sid}.json", (at, at))
    assert tmp.is_file()
    return sid


def test_old_snapshots_no_job_needs_go_and_the_quota_frees_least_recently_used_first(tmp_path: Path) -> None:
    store = _store(tmp_path, user_quota_bytes=3000)
    now = 1_000_000_000.0
    a, b, c = (os.urandom(1000) for _ in range(3))
    old = _snapshot(store, "alice", a, now - 8 * 86400)  # a week and a day old
    queued = _snapshot(store, "alice", b, now - 9 * 86400)  # older still, but a queued job names it
    recent = _snapshot(store, "alice", c, now - 3600)
    bobs = _snapshot(store, "bob", a, now - 30 * 86400)  # bob's, same content as alice's old one
    assert store.prune("alice", {queued}, 7 * 86400, now=now) == [old]
    assert store.manifest_of(old, "alice") is None and store.manifest_of(queued, "alice") is not None
    assert bobs == old and store.manifest_of(old, "bob") is not None  # the same files stored by bob: his stays
    assert store.blob_path(_sha(a)).is_file()  # bob's snapshot still lists it
    assert store.prune("bob", set(), 7 * 86400, now=now) == [bobs]
    assert not store.blob_path(_sha(a)).exists()  # listed by no snapshot any more: removed
    # Quota: alice holds b and c (2000 of 3000 bytes); two new 1000-byte files need 1000 more: the least
    # recently committed snapshot no job needs (recent) goes, the queued job's stays.
    d, e = os.urandom(1000), os.urandom(1000)
    new = Manifest(entries=[ManifestEntry(path="d.bin", kind="file", size=1000, sha256=_sha(d)),
                            ManifestEntry(path="e.bin", kind="file", size=1000, sha256=_sha(e))])
    assert store.prune("alice", {queued}, 7 * 86400, new, now=now) == [recent]
    assert store.offer("alice", new).missing == sorted([_sha(d), _sha(e)])  # fits now: no CapExceeded
    assert store.blob_path(_sha(b)).is_file() and not store.blob_path(_sha(c)).exists()
    assert store.prune("alice", {queued}, 7 * 86400, new, now=now) == []  # nothing more to remove


def test_offers_made_before_any_upload_do_not_add_up_past_the_quota_the_total_or_the_reserve(tmp_path: Path) -> None:
    """Each offer is checked against what the user holds now; a user who offers many manifests first and
    uploads afterwards must still be stopped at the quota and at the store's total (one user must not
    fill the state disk the database shares)."""
    store = _store(tmp_path, max_snapshot_bytes=100, user_quota_bytes=150, total_bytes=1000)
    blobs = [bytes([i]) * 100 for i in range(5)]
    for b in blobs:  # each offer alone fits: 100 new bytes, nothing held yet
        store.offer("mallory", Manifest(entries=[ManifestEntry(path="f", kind="file", size=100, sha256=_sha(b))]))
    kept = 0
    for b in blobs:
        try:
            store.put("mallory", 1000, _sha(b), 0, b)
            kept += 100
        except (NotOffered, CapExceeded):
            pass
    assert kept <= 150
    assert sum(p.stat().st_size for p in (store.root / "blobs").glob("*/*")) <= 150


def _walk_cached(workdir: Path, cache_dir: Path, racy_s: float = 0.0) -> tuple[dict[str, str], int]:
    """(path -> SHA-256, files the stat cache answered) of a snapshot of every file in ``workdir``."""
    from gpulayerd.ship.statcache import StatCache

    cache = StatCache(cache_dir, workdir, racy_s=racy_s)
    body = make_manifest(workdir, _ignored_walk(workdir), cache).body
    cache.save()
    return {e["path"]: e["sha256"] for e in body["entries"]}, cache.hits


def test_the_stat_cache_skips_unchanged_files_and_rehashes_one_changed_with_the_same_size_and_mtime(
        tmp_path: Path) -> None:
    wd, cache_dir = tmp_path / "wd", tmp_path / "cache"
    wd.mkdir()
    (wd / "a.txt").write_bytes(b"aaaa")
    (wd / "b.txt").write_bytes(b"bbbb")
    assert _walk_cached(wd, cache_dir) == ({"a.txt": _sha(b"aaaa"), "b.txt": _sha(b"bbbb")}, 0)
    (cache_file,) = cache_dir.iterdir()
    assert cache_file.stat().st_mode & 0o777 == 0o600
    assert _walk_cached(wd, cache_dir) == ({"a.txt": _sha(b"aaaa"), "b.txt": _sha(b"bbbb")}, 2)  # nothing read
    st = os.stat(wd / "a.txt")
    with open(wd / "a.txt", "r+b") as f:  # same inode, same size, then its mtime put back
        f.write(b"AAAA")
    os.utime(wd / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    while os.stat(wd / "a.txt").st_ctime_ns == st.st_ctime_ns:  # (a coarse clock: until its change time moves)
        time.sleep(0.005)
        os.utime(wd / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(wd / "a.txt").st_size, os.stat(wd / "a.txt").st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert _walk_cached(wd, cache_dir) == ({"a.txt": _sha(b"AAAA"), "b.txt": _sha(b"bbbb")}, 1)  # its ctime moved
    cache_file.write_text("{not json")  # a broken cache is ignored: every file hashed
    assert _walk_cached(wd, cache_dir) == ({"a.txt": _sha(b"AAAA"), "b.txt": _sha(b"bbbb")}, 0)


def test_the_stat_cache_does_not_remember_a_file_changed_just_before_it_was_hashed(tmp_path: Path) -> None:
    wd, cache_dir = tmp_path / "wd", tmp_path / "cache"
    wd.mkdir()
    (wd / "new.txt").write_bytes(b"just written")
    assert _walk_cached(wd, cache_dir, racy_s=3600.0)[1] == 0
    assert _walk_cached(wd, cache_dir, racy_s=3600.0)[1] == 0  # racily clean: read again, as git would


def test_a_file_replaced_between_hash_and_upload_is_caught(tmp_path: Path) -> None:
    from gpulayerd.ship.upload import ShipUsageError, send_snapshot

    store = _store(tmp_path)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "a.bin").write_bytes(b"first")
    body, sources, stamps = make_manifest(wd, ["a.bin"])
    (wd / "new").write_bytes(b"other")
    os.replace(wd / "new", wd / "a.bin")  # replaced (an editor's save): the same size, other bytes
    client = _StoreClient(store)
    with pytest.raises(ShipUsageError, match=r"a\.bin changed after the snapshot was made"):
        send_snapshot(client, body, sources, stamps)
    assert client.offsets == []  # refused before a byte was sent
    with pytest.raises(ValueError, match="do not hash"):  # without stamps: the daemon's own check
        send_snapshot(_StoreClient(store), body, sources)
    with open(wd / "a.bin", "r+b") as f:  # written in place, maybe within the clock tick of the hash
        f.write(b"FIRST")
    _, _, later = make_manifest(wd, ["a.bin"])
    with open(wd / "a.bin", "r+b") as f:
        f.write(b"first")
    with pytest.raises((ShipUsageError, ValueError)):  # the stamp moved (the CLI), or not (the daemon)
        send_snapshot(_StoreClient(store), {"entries": [{**body["entries"][0], "sha256": _sha(b"FIRST")}]},
                      {_sha(b"FIRST"): wd / "a.bin"}, {_sha(b"FIRST"): later[_sha(b"FIRST")]})
    assert not store.blob_path(_sha(b"FIRST")).exists()
    os.unlink(wd / "a.bin")
    os.symlink(tmp_path / "elsewhere", wd / "a.bin")  # never followed, even at upload
    (tmp_path / "elsewhere").write_bytes(b"first")
    with pytest.raises(ShipUsageError, match="cannot read"):
        send_snapshot(_StoreClient(store), body, sources, stamps)
    (wd / "a.bin").unlink()
    (wd / "a.bin").write_bytes(b"first")
    assert send_snapshot(_StoreClient(store), body, sources) == Manifest.model_validate(body).snapshot_id()


def test_a_cached_content_is_hashed_again_unless_this_life_verified_that_very_file(tmp_path: Path) -> None:
    data = b"content"
    cache = BlobCache(tmp_path / "cache", max_bytes=1000)
    cache.partial(_sha(data)).write_bytes(data)
    cache.finish(_sha(data))
    with cache.open_content(_sha(data), len(data)) as f:  # verified when it entered
        assert f.read() == data
    assert cache.has(_sha(data))  # (a use: it stays verified)
    with cache.open_content(_sha(data), len(data)) as f:
        assert f.read() == data
    blob = cache.path(_sha(data))
    ctime = blob.stat().st_ctime_ns
    with open(blob, "r+b") as f:  # rotted in place: the same file and size, a new change time
        f.write(b"CONTENT")
    while blob.stat().st_ctime_ns == ctime:  # (a coarse clock: until its change time moves)
        time.sleep(0.005)
        os.utime(blob)
    assert cache.has(_sha(data))
    with pytest.raises(ValueError, match="do not hash"):
        cache.open_content(_sha(data), len(data))
    cache.partial(_sha(data)).write_bytes(data)  # fetched again
    cache.finish(_sha(data))
    with pytest.raises(ValueError, match="the manifest says 6"):
        cache.open_content(_sha(data), 6)
    os.unlink(cache.path(_sha(data)))  # another file put under its name: hashed again, dropped
    cache.path(_sha(data)).write_bytes(b"garbage!")
    with pytest.raises(ValueError, match="do not hash"):
        cache.open_content(_sha(data), len(data))
    assert not cache.has(_sha(data))
    later = BlobCache(tmp_path / "cache", max_bytes=1000)  # a new daemon life: an old content is hashed once
    cache.partial(_sha(b"old")).write_bytes(b"old")
    cache.finish(_sha(b"old"))
    with later.open_content(_sha(b"old"), 3) as f:
        assert f.read() == b"old"


def test_an_unpack_fed_a_content_the_cache_cannot_verify_fails(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache", max_bytes=1000)
    cache.path(_sha(b"x")).parent.mkdir(parents=True, exist_ok=True)
    cache.path(_sha(b"x")).write_bytes(b"y")  # (not through finish: never verified, and wrong)
    tree = tmp_path / "tree"
    tree.mkdir()

    def feed(sink: io.BufferedWriter) -> None:  # type: ignore[type-arg]
        sink.write(header({"path": "ok.txt", "kind": "file", "size": 0, "sha256": _sha(b"")}))
        try:  # as ShipClient._unpack feeds: a content the cache refuses ends the stream as a failure
            cache.open_content(_sha(b"x"), 1)
        except ValueError as e:
            raise TreeError(str(e)) from None

    with pytest.raises(AsUserError, match="the cached bytes do not hash to it"):
        run_as("unpack", [str(tree)], None, feed=feed, timeout_s=5)
    assert not cache.path(_sha(b"x")).exists()



def test_uploads_of_one_content_at_once_never_leave_a_blob_that_does_not_hash_to_its_name(tmp_path: Path) -> None:
    """Two CLIs of one user (or a user's own requests) sending the last chunk of one content at once:
    each check of the next byte, append, hash and rename is one upload's, so the store never keeps
    bytes under a name they do not hash to (a later user's job of that content would fail its transfer)."""
    import threading

    data = bytes(range(256)) * 64
    digest = _sha(data)
    manifest = Manifest(entries=[ManifestEntry(path="a.bin", kind="file", size=len(data), sha256=digest)])
    for n in range(150):
        store = _store(tmp_path / str(n))
        store.offer("alice", manifest)
        store.put("alice", 1000, digest, 0, data[:-100])
        start = threading.Barrier(3)

        def send(tail: bytes, store: ContentStore = store, start: threading.Barrier = start) -> None:
            start.wait()
            with contextlib.suppress(NotOffered, ValueError):
                store.put("alice", 1000, digest, len(data) - 100, tail)

        threads = [threading.Thread(target=send, args=(tail,)) for tail in (data[-100:], b"X" * 100, data[-100:])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        blob = store.blob_path(digest)
        assert not blob.is_file() or _sha(blob.read_bytes()) == digest, f"round {n}"
