"""The CLI's stat cache of ``--ship`` (``ship/statcache``) run as root with another user's cache
directory (``sudo -E``, a ``HOME`` or ``XDG_CACHE_HOME`` kept): that user's cache file is never
believed, and no file is written or removed where that user's links point."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gpulayerd.ship.statcache import StatCache, default_dir, stamp
from gpulayerd.ship.walk import make_manifest
from tests.fakes.accounts import Accounts


@pytest.fixture(autouse=True)
def _as_root() -> None:
    """These tests need root (CI runs as root): a run without it fails, never passes by skipping."""
    if os.geteuid() != 0:
        pytest.fail("needs root: runs as root with another account's cache directory", pytrace=False)



def _chown_tree(top: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames]:
            os.lchown(os.path.join(dirpath, name), uid, gid)
    os.lchown(top, uid, gid)


def test_root_never_believes_a_stat_cache_another_user_wrote(tmp_path: Path, accounts: Accounts,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    bob = accounts.user("bob")
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "train.py").write_bytes(b"print('root wrote this')\n")
    base = bob.home / ".cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    cache = StatCache(default_dir(), wd)
    assert cache.path is not None
    cache.path.parent.mkdir(parents=True)
    forged = hashlib.sha256(b"print('bob wrote this')\n").hexdigest()
    cache.path.write_text(json.dumps({"workdir": str(wd), "entries": {
        "train.py": [*stamp(os.lstat(wd / "train.py")), forged]}}))
    _chown_tree(base, bob.uid, bob.gid)  # bob's cache, as bob would have written it

    cache = StatCache(default_dir(), wd)
    body = make_manifest(wd, ["train.py"], cache).body
    assert [e["sha256"] for e in body["entries"]] == [hashlib.sha256(b"print('root wrote this')\n").hexdigest()]
    assert cache.hits == 0


def test_root_writes_and_removes_nothing_where_another_users_link_points(tmp_path: Path, accounts: Accounts,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bob = accounts.user("bob")
    kept = tmp_path / "kept"  # a directory of root's that bob's link points at
    kept.mkdir(mode=0o700)
    for n in range(70):
        (kept / f"{n:02d}.json").write_text("{}")
    base = bob.home / ".cache" / "gpulayer"
    base.mkdir(parents=True)
    (base / "ship").symlink_to(kept)
    _chown_tree(bob.home / ".cache", bob.uid, bob.gid)
    monkeypatch.setenv("XDG_CACHE_HOME", str(bob.home / ".cache"))
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "a.py").write_bytes(b"a\n")
    os.utime(wd / "a.py", (1, 1))
    cache = StatCache(default_dir(), wd, racy_s=0.0)
    make_manifest(wd, ["a.py"], cache)
    cache.save()
    assert sorted(p.name for p in kept.iterdir()) == [f"{n:02d}.json" for n in range(70)]
