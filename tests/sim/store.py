"""The store-driver port for the simulator: SQLite statements run in the event loop's thread, in memory.

:mod:`gpulayerd.store.db` drives SQLite through ``aiosqlite`` (a thread per connection). In
the simulator hundreds of daemons share one loop, and a thread hop per statement would make
"everything waits on simulated time" impossible to tell from "a statement is still running".
:class:`InlineConnection` offers the part of ``aiosqlite.Connection`` the store uses, and
runs each statement at once on a :class:`sqlite3.Connection`. Each daemon's database is a
shared-cache in-memory SQLite database named after its path, kept alive by
:class:`MemoryDisk` across the daemon's crashes and restarts (the disk outlives the
process); ``synchronous`` and ``journal_mode`` have no meaning there. Everything else (the
schema, migrations, transactions, the store's queries) is the real store's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["InlineConnection", "MemoryDisk"]


class _Cursor:
    """The result of :meth:`InlineConnection.execute`: awaitable and an async context manager."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        """Rows changed by the statement."""
        return self._cur.rowcount

    async def fetchall(self) -> list[Any]:
        """Every row."""
        return self._cur.fetchall()

    async def __aenter__(self) -> _Cursor:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._cur.close()


class _Pending:
    """``await conn.execute(...)`` and ``async with await conn.execute(...)`` both work."""

    def __init__(self, cur: _Cursor) -> None:
        self._cur = cur

    def __await__(self) -> Any:
        if False:  # pragma: no cover - makes this a generator
            yield
        return self._cur


class InlineConnection:
    """The subset of ``aiosqlite.Connection`` the store uses, run synchronously in the caller's thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.statements = 0  # statements and transactions run (a measure of store work)

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open."""
        return self._conn.in_transaction

    def execute(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> _Pending:
        """Run one statement now."""
        self.statements += 1
        return _Pending(_Cursor(self._conn.execute(sql, params)))  # type: ignore[arg-type]

    async def execute_fetchall(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run one statement now; its rows."""
        self.statements += 1
        return self._conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

    async def _execute(self, fn: Callable[..., Any], *args: Any) -> Any:
        """What aiosqlite runs on its thread, run here (the store's one-hop transactions)."""
        self.statements += 1
        return fn(*args)

    async def create_function(self, name: str, narg: int, fn: Callable[..., Any]) -> None:
        """A SQL function (the store's "still linked" check)."""
        self._conn.create_function(name, narg, fn)

    async def close(self) -> None:
        """Close this connection (the disk keeps the data)."""
        self._conn.close()


class MemoryDisk:
    """Every simulated machine's database, in memory, alive for the whole simulation."""

    def __init__(self, tag: str) -> None:
        self._tag = tag
        self._keep: dict[str, sqlite3.Connection] = {}

    def _uri(self, path: Path) -> str:
        return f"file:sim-{self._tag}-{abs(hash(str(path))):x}?mode=memory&cache=shared"

    async def connect(self, path: Path) -> InlineConnection:
        """The driver port (:data:`gpulayerd.store.db.Connect`): a connection to ``path``'s database."""
        uri = self._uri(path)
        if uri not in self._keep:
            self._keep[uri] = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        return InlineConnection(conn)

    def wipe(self, path: Path) -> None:
        """Forget ``path``'s database (a disk replaced)."""
        conn = self._keep.pop(self._uri(path), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Forget every database."""
        for conn in self._keep.values():
            conn.close()
        self._keep.clear()
