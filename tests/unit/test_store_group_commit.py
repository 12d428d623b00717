"""Group commit: the store's transactions asked for together share one ``BEGIN IMMEDIATE`` ... ``COMMIT``
(one ``fsync``), each in a savepoint, so that one that fails leaves the others as they were.

Real SQLite files in ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import gpulayerd.store.db as db_module
from gpulayerd.store.db import Database, Rollback
from gpulayerd.store.rows import StoreError


async def _open(tmp_path: Path) -> Database:
    db = await Database.open(tmp_path / "g.db")
    await db.run(lambda c: c.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)"))
    return db


@pytest.mark.asyncio
async def test_transactions_asked_together_commit_together_and_one_that_fails_is_rolled_back_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = await _open(tmp_path)
    sizes: list[int] = []
    real = db_module._transact_group

    def counted(conn: object, group: db_module._Group) -> None:
        sizes.append(len(group.fns))
        real(conn, group)  # type: ignore[arg-type]

    monkeypatch.setattr(db_module, "_transact_group", counted)

    def insert(k: int) -> int:
        def txn(c: sqlite3.Connection) -> int:
            c.execute("INSERT INTO t (k, v) VALUES (?, ?)", (k, f"v{k}"))
            if k == 3:
                raise Rollback  # rolled back quietly: its row goes, the others stay
            if k == 5:
                raise ValueError("five")
            if k == 7:
                c.execute("INSERT INTO t (k, v) VALUES (1, 'again')")  # a constraint error of its own
            return k * 10
        return txn

    got = await asyncio.gather(*(db.run(insert(k)) for k in range(10)), return_exceptions=True)
    assert [g if isinstance(g, int) else type(g).__name__ for g in got] == [
        0, 10, 20, "Rollback", 40, "ValueError", 60, "StoreError", 80, 90]
    assert "UNIQUE constraint failed" in str(got[7])
    rows = await db.fetch_all("SELECT k, v FROM t ORDER BY k", ())
    assert [tuple(r) for r in rows] == [(k, f"v{k}") for k in (0, 1, 2, 4, 6, 8, 9)]
    assert sum(sizes) == 10 and max(sizes) > 1, sizes  # one hand-over took several
    await db.close()


@pytest.mark.asyncio
async def test_a_caller_cancelled_while_its_group_runs_leaves_its_transaction_committed(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    task = asyncio.ensure_future(db.run(lambda c: c.execute("INSERT INTO t (k, v) VALUES (1, 'kept')")))
    other = asyncio.ensure_future(db.run(lambda c: c.execute("INSERT INTO t (k, v) VALUES (2, 'also')")))
    await asyncio.sleep(0)  # both joined the group, handed over to the thread
    task.cancel()
    assert (await asyncio.gather(task, return_exceptions=True))[0].__class__ is asyncio.CancelledError
    await other  # the other caller is not cancelled with it
    rows = await db.fetch_all("SELECT k, v FROM t ORDER BY k", ())
    assert [tuple(r) for r in rows] == [(1, "kept"), (2, "also")]
    await db.close()


@pytest.mark.asyncio
async def test_reads_and_writes_after_a_commit_see_it(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    for k in range(5):  # each call waits for the one before: what it asks for runs after that one's commit
        await db.run(lambda c, k=k: c.execute("INSERT INTO t (k, v) VALUES (?, 'x')", (k,)))
        assert (await db.fetch_all("SELECT count(*) FROM t", ()))[0][0] == k + 1
        assert await db.write_one("UPDATE t SET v = 'y' WHERE k = ?", (k,)) == 1
    assert await db.read(lambda c: c.execute("SELECT group_concat(v, '') FROM t").fetchone()[0]) == "yyyyy"
    await db.close()


@pytest.mark.asyncio
async def test_a_closed_store_says_so_at_every_call(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    await db.close()
    for _ in range(3):  # (a group made for a call that failed at once must not be joined by the next)
        with pytest.raises(StoreError, match="closed"):
            await db.run(lambda c: c.execute("INSERT INTO t (k, v) VALUES (1, 'x')"))


@pytest.mark.asyncio
async def test_a_durable_commit_after_a_non_durable_one_is_full_again(tmp_path: Path) -> None:
    db = await _open(tmp_path)
    await db.run(lambda c: c.execute("INSERT INTO t (k, v) VALUES (1, 'x')"), durable=False)
    level = await db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
    assert level == 2  # FULL
    assert await db.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0], durable=False) == 1  # NORMAL
    assert await db.read(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    await db.close()
