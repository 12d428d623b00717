"""The store's one SQLite connection: opening, configuring, transactions and single statements.

One writer connection in WAL mode with ``synchronous=FULL``: a method that returns has
committed its write, so a ``kill -9`` at any later moment loses nothing acknowledged. Every
read-modify-write runs in ``BEGIN IMMEDIATE``; an :class:`asyncio.Lock` keeps coroutines from
interleaving statements inside one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from gpulayerd.store.rows import StoreError
from gpulayerd.store.schema import migrate

__all__ = ["Database", "Params", "Rollback"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
Params = Sequence[object] | Mapping[str, object]
"""SQL parameters: positional (``?``) or named (``:name``)."""


class Rollback(Exception):
    """Raised inside :meth:`Database.transaction` to roll it back without an error."""


class Database:
    """The shared connection the table objects work through. Open with :meth:`open`."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        """Wrap an already configured and migrated connection; use :meth:`open` instead."""
        self._conn: aiosqlite.Connection | None = conn
        self._path = path
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0) -> Database:
        """Open (creating if needed) the SQLite file at ``path`` and migrate it.

        Args:
            path: the SQLite file; its directory must exist.
            busy_timeout_s: how long a statement waits for another process's lock.

        Raises:
            StoreError: the file cannot be opened, configured or migrated, or it was
                written by newer code.
        """
        try:
            conn = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open store {path}: {e}") from e
        try:
            await _configure(conn, path, busy_timeout_s)
            await migrate(conn, path)
        except BaseException:
            await conn.close()
            raise
        return cls(conn, path)

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    async def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            async with self._lock:
                await conn.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` under the lock; rolled back on any exception.

        Raise :class:`Rollback` inside to roll back quietly (it still propagates).

        Raises:
            StoreError: the store is closed, or SQLite failed (the transaction is rolled back).
        """
        async with self._lock:
            conn = self._open_conn()
            await self._settle(conn)
            try:
                # Inside the try: if cancelled while BEGIN is in flight, the ROLLBACK queued
                # behind it still closes the transaction.
                await conn.execute("BEGIN IMMEDIATE")
                yield conn
                await conn.execute("COMMIT")
            except BaseException as e:
                await self._rollback(conn)
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"store {self._path}: {e}") from e
                raise

    async def fetch_all(self, sql: str, params: Params) -> list[Any]:
        """Run one statement on its own (it is its own transaction); every row it returns.

        Raises:
            StoreError: the store is closed, or SQLite failed.
        """
        async with self._lock:
            conn = self._open_conn()
            await self._settle(conn)
            rows = await self._call(conn.execute_fetchall(sql, params))
        return list(rows)

    async def write_one(self, sql: str, params: Params) -> int:
        """Run one statement on its own (it is its own transaction); the number of rows changed.

        Raises:
            StoreError: the store is closed, or SQLite failed.
        """
        async with self._lock:
            conn = self._open_conn()
            await self._settle(conn)
            async with await self._call(conn.execute(sql, params)) as cur:
                return int(cur.rowcount)

    # ------------------------------------------------------------------- helpers

    def _open_conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise StoreError(f"store {self._path} is closed")
        return self._conn

    async def _settle(self, conn: aiosqlite.Connection) -> None:
        """Roll back a transaction left open by a coroutine cancelled inside it."""
        if conn.in_transaction:
            await self._rollback(conn)

    async def _rollback(self, conn: aiosqlite.Connection) -> None:
        # Unconditional: a statement still in flight (its awaiter cancelled) runs first on the
        # connection's thread, so in_transaction may not be up to date yet.
        try:
            await conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            logger.debug("store %s: rollback: %s", self._path, e)

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except sqlite3.Error as e:
            raise StoreError(f"store {self._path}: {e}") from e


async def _configure(conn: aiosqlite.Connection, path: Path, busy_timeout_s: float) -> None:
    try:
        await conn.execute(f"PRAGMA busy_timeout = {max(0, round(busy_timeout_s * 1000)):d}")
        rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
        await conn.execute("PRAGMA synchronous = FULL")
        await conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.Error as e:
        raise StoreError(f"cannot configure store {path}: {e}") from e
    mode = str(rows[0][0]) if rows else "?"
    if mode.lower() != "wal":
        logger.warning("store %s: journal mode is %s, not wal", path, mode)
