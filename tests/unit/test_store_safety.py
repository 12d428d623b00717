"""The store's file and the daemon's directories: private modes, removal while open, damage (issue 12).

Real SQLite files in ``tmp_path``; async tests run under blockbuster (the checks never block the loop).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from gpulayerd.host.privdirs import UnsafeDirectory, make_private_dirs
from gpulayerd.store import Store, StoreDamaged, StoreError, StoreGone

NODE = "n" * 52


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def db_files(directory: Path) -> dict[str, int]:
    return {p.name: mode_of(p) for p in directory.iterdir() if p.name.startswith("s.db")}


# ------------------------------------------------------------------------- file modes


@pytest.mark.asyncio
async def test_a_new_store_and_its_wal_and_shm_are_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # SQLite alone would make 0644 files
    try:
        store = await Store.open(tmp_path / "s.db")
        await store.peers.save_peer(NODE, "a", ["10.0.0.1"], 7171, 1.0)
        assert db_files(tmp_path) == {"s.db": 0o600, "s.db-wal": 0o600, "s.db-shm": 0o600}
        await store.close()
    finally:
        os.umask(old)


@pytest.mark.asyncio
async def test_an_existing_0644_store_and_companions_are_made_0600(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    keep_open = sqlite3.connect(path)  # keeps -wal and -shm after the first one closes
    keep_open.execute("SELECT * FROM t").fetchall()
    con.close()
    for p in tmp_path.iterdir():
        os.chmod(p, 0o644)
    assert set(db_files(tmp_path)) == {"s.db", "s.db-wal", "s.db-shm"}
    keep_open.close()
    store = await Store.open(path)
    assert set(db_files(tmp_path).values()) == {0o600}
    await store.close()


# ----------------------------------------------------------------- removed while open


@pytest.mark.asyncio
async def test_a_write_after_the_file_was_removed_raises_and_the_store_stays_gone(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    await store.peers.save_peer(NODE, "a", ["10.0.0.1"], 7171, 1.0)
    assert store.gone is None
    for p in tmp_path.iterdir():  # what rm -rf does
        p.unlink()
    with pytest.raises(StoreGone, match="the database file was removed"):
        await store.peers.save_peer(NODE, "b", ["10.0.0.2"], 7171, 2.0)
    assert store.gone is not None and "nothing more is acknowledged" in store.gone
    assert await store.wait_gone() == store.gone
    # Every later call fails too, reads included: the daemon answers nothing from a lost file.
    with pytest.raises(StoreGone):
        await store.peers.saved_peers()
    with pytest.raises(StoreGone):
        await store.jobs.get_job("x")
    await store.close()


@pytest.mark.asyncio
async def test_a_write_after_the_file_was_replaced_raises(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = await Store.open(path)
    os.rename(path, tmp_path / "aside.db")
    sqlite3.connect(path).close()
    path.write_bytes(b"")  # another (empty) file at the path
    with pytest.raises(StoreGone, match="replaced by another file"):
        await store.peers.save_peer(NODE, "a", ["10.0.0.1"], 7171, 1.0)
    await store.close()


@pytest.mark.asyncio
async def test_writes_succeed_while_the_file_stays(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "s.db")
    for i in range(5):
        await store.peers.save_peer(NODE, f"a{i}", ["10.0.0.1"], 7171, float(i))
    assert [p[1] for p in await store.peers.saved_peers()] == ["a4"]
    assert store.gone is None
    await store.close()


# ---------------------------------------------------------------------------- damage


def _filled(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE filler (x)")
    con.executemany("INSERT INTO filler VALUES (?)", [("x" * 3000,) for _ in range(50)])
    con.commit()
    con.close()


@pytest.mark.asyncio
async def test_a_damaged_page_is_refused_with_a_recovery_hint(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await (await Store.open(path)).close()
    _filled(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size - 4096)
        f.write(b"\x0d" + b"\xff" * 4095)
    with pytest.raises(StoreDamaged) as e:
        await Store.open(path)
    assert str(e.value).startswith(f"the store {path} is damaged (")
    assert f"sqlite3 {path} .recover" in str(e.value)


@pytest.mark.asyncio
async def test_a_truncated_store_is_refused_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    await (await Store.open(path)).close()
    _filled(path)
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(StoreDamaged, match="is damaged"):
        await Store.open(path)


@pytest.mark.asyncio
async def test_a_file_that_is_not_sqlite_is_refused_as_damaged(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database, " * 200)
    with pytest.raises(StoreDamaged, match="is damaged"):
        await Store.open(path)


@pytest.mark.asyncio
async def test_a_store_file_of_another_account_is_refused(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "the suite runs as root (scripts/test): a file of another account needs it"
    path = tmp_path / "s.db"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    os.chown(path, 65534, 65534)
    with pytest.raises(StoreError, match="owned by uid 65534"):
        await Store.open(path)
    assert mode_of(path) == 0o644


# ------------------------------------------------------------------- private dirs


def test_existing_dirs_are_tightened_and_missing_ones_made_0700(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        state = tmp_path / "state"
        state.mkdir(mode=0o755)
        os.chmod(state, 0o755)
        make_private_dirs([state, state / "runs", tmp_path / "rt" / "sock"])
    finally:
        os.umask(old)
    assert (mode_of(state), mode_of(state / "runs"), mode_of(tmp_path / "rt" / "sock")) == (0o700, 0o700, 0o700)


def test_a_world_writable_dir_is_refused_and_nothing_is_changed(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafeDirectory, match=r"anyone may write to it \(mode 1777\)"):
        make_private_dirs([mine, tmp_path / "new", shared])
    assert (mode_of(mine), mode_of(shared)) == (0o755, 0o1777)
    assert not (tmp_path / "new").exists()


def test_a_dir_of_another_account_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    other = os.geteuid() + 1
    with pytest.raises(UnsafeDirectory, match=f"owned by uid {os.geteuid()}, not by this daemon's account"):
        make_private_dirs([d], uid=other)
    assert mode_of(d) == 0o755


def test_a_file_where_a_dir_belongs_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        make_private_dirs([f])
