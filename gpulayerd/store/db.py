"""The store's one SQLite connection: opening, configuring, transactions and single statements.

One writer connection in WAL mode with ``synchronous=FULL``: a method that returns has
committed its write, so a ``kill -9`` at any later moment loses nothing acknowledged. Every
read-modify-write runs in ``BEGIN IMMEDIATE``. Each call is one hand-over to the connection's thread (a
whole transaction there), taken in order and run back to back, without a lock.

Safety of the file itself: it and its ``-wal``/``-shm`` files are made 0600 at open (they hold
job environments); a damaged file is refused at open (``PRAGMA quick_check``) with
:class:`StoreDamaged`; and after every commit, before the caller is answered, the file is checked
to be still the one opened, at its path: once it has been removed (``rm -rf`` of the state dir) or
replaced, every call raises :class:`StoreGone` and :meth:`Database.wait_gone` returns, so that
nothing more is acknowledged into a file that vanishes at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from gpulayerd.store.rows import StoreError, StoreFull
from gpulayerd.store.schema import migrate

__all__ = ["Connect", "Database", "Params", "Rollback", "StoreDamaged", "StoreGone"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
Params = Sequence[object] | Mapping[str, object]
"""SQL parameters: positional (``?``) or named (``:name``)."""
Connect = Callable[[Path], Awaitable[aiosqlite.Connection]]
"""The store's driver port: opens the connection at a path (``aiosqlite.connect`` unless a simulation
gives one that runs the statements in the event loop's thread)."""


_FILE_MODE = 0o600
_COMPANIONS = ("-wal", "-shm", "-journal")
_CORRUPT_CODES = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB
_LINKED_FN = "gpulayer_store_linked"


class Rollback(Exception):
    """Raised inside :meth:`Database.run`'s function to roll it back without an error."""


class StoreDamaged(StoreError):
    """The SQLite file is damaged (``PRAGMA quick_check`` failed, or SQLite found it malformed).

    The message says which file, what SQLite found, and how to recover or move it aside.
    """


class StoreGone(StoreError):
    """The SQLite file was removed or replaced while open: nothing more can be stored durably."""


class Database:
    """The shared connection the table objects work through. Open with :meth:`open`."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        """Wrap an already configured and migrated connection; use :meth:`open` instead."""
        self._conn: aiosqlite.Connection | None = conn
        self._path = path
        self._gone: str | None = None
        self._gone_event = asyncio.Event()
        self._group: _Group | None = None  # the group of transactions not yet started on the thread

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0, empty_ok: bool = True,
                   connect: Connect | None = None) -> Database:
        """Open (creating if needed) the SQLite file at ``path``, check it and migrate it.

        The file and its ``-wal``/``-shm`` files are made 0600 (created so when missing).

        Args:
            path: the SQLite file; its directory must exist.
            busy_timeout_s: how long a statement waits for another process's lock.
            empty_ok: whether an existing file of 0 bytes may be taken for a new store (the daemon
                allows it only in a new state dir: elsewhere an emptied file is damage, refused
                with the recovery hint, never silently a store with no jobs).
            connect: the driver (default: ``aiosqlite.connect`` in autocommit mode).

        Raises:
            StoreDamaged: the file is damaged (``PRAGMA quick_check``), truncated or not SQLite;
                the message carries a recovery hint.
            StoreError: the file cannot be opened, configured or migrated, is another account's,
                or it was written by newer code.
        """
        *identity, created = await asyncio.to_thread(_private_files, path, empty_ok)
        try:
            conn = await (connect(path) if connect is not None else aiosqlite.connect(path, isolation_level=None))
        except sqlite3.Error as e:
            if created:
                await asyncio.to_thread(_forget_new, path)
            raise StoreError(f"cannot open store {path}: {e}") from e
        db = cls(conn, path)
        try:
            try:
                await _configure(conn, path, busy_timeout_s)
                await _quick_check(conn, path)
                await migrate(conn, path)
            except StoreError as e:
                if _is_corrupt(e.__cause__):
                    raise _damaged(path, str(e.__cause__)) from e
                raise
            except sqlite3.DatabaseError as e:
                if _is_corrupt(e):
                    raise _damaged(path, str(e)) from e
                raise StoreError(f"cannot open store {path}: {e}") from e
            await asyncio.to_thread(_private_companions, path)  # the -wal and -shm SQLite has just made
            await conn.create_function(_LINKED_FN, 0, lambda: _still_linked(path, (identity[0], identity[1])))
        except BaseException:
            await conn.close()
            if created:  # (a full disk at the first start): no empty file is left to be taken for damage later
                await asyncio.to_thread(_forget_new, path)
            raise
        return db

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    @property
    def gone(self) -> str | None:
        """Why the file can no longer be trusted (removed or replaced while open), or None."""
        return self._gone

    async def wait_gone(self) -> str:
        """Wait until the file is found removed or replaced after a commit; returns why."""
        await self._gone_event.wait()
        return self._gone or "the store is gone"

    async def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def run(self, fn: Callable[[sqlite3.Connection], _T], *, durable: bool = True) -> _T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the connection's thread, with
        the check after the commit (the file still at its path), all in one hand-over to that thread:
        a transaction of k statements costs one thread hop instead of k + 3. Transactions asked for
        while none has started on the thread yet go together (group commit, :func:`_transact_group`):
        each in a savepoint of one ``BEGIN IMMEDIATE`` ... ``COMMIT``, so that one that fails or raises
        :class:`Rollback` leaves the others as they were, and they share the commit's ``fsync``.

        ``durable=False`` (a record no user or peer is told of: a worker's own record of a run whose owner is
        this node, whose owner's records say the same) commits with ``synchronous=NORMAL`` unless a durable one
        shares its group: no ``fsync``; it survives a crash of any process (``kill -9``), and a power loss
        once any later durable commit returned (that ``fsync`` writes the whole WAL, in order).

        ``fn`` gets the plain :class:`sqlite3.Connection` and must not await or touch the event
        loop. Raise :class:`Rollback` inside to roll back quietly (it still propagates). A caller
        cancelled meanwhile does not stop ``fn``: the transaction commits or rolls back whole.

        Raises:
            StoreGone: the file was removed or replaced (checked after the commit).
            StoreError: the store is closed, or SQLite failed (the transaction is rolled back).
        """
        conn = self._open_conn()  # (first: a closed or gone store leaves no group behind)
        group, index = self._group, None
        if group is not None:
            index = group.join(fn, durable)
        if group is None or index is None:  # none waits to start on the thread: a new one, handed over next
            group = self._group = _Group()
            index = group.join(fn, durable)
            # aiosqlite's own queue to its thread (Connection._execute): its documented methods cost a hop each.
            group.done = asyncio.ensure_future(
                self._call(conn._execute(_transact_group, conn, group)))  # type: ignore[no-untyped-call]
            group.done.add_done_callback(_retrieved)
        assert index is not None and group.done is not None
        await asyncio.shield(group.done)  # (a cancelled caller leaves the group's transaction as it goes)
        ok, value = group.results[index]
        if not ok:
            assert isinstance(value, BaseException)
            raise self._store_error(value) if isinstance(value, sqlite3.Error) else value
        self._linked_or_raise(group.problem)
        return value  # type: ignore[return-value]

    async def read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run the reads in ``fn`` on the connection's thread in one hop (each statement is its
        own transaction, as :meth:`fetch_all`); ``fn`` must not write.

        Raises:
            StoreError: the store is closed, or SQLite failed.
        """
        result: _T = await self._hop(_plain, fn)
        return result

    async def fetch_all(self, sql: str, params: Params) -> list[Any]:
        """Run one statement on its own (it is its own transaction); every row it returns.

        Raises:
            StoreError: the store is closed, or SQLite failed.
        """
        rows: list[Any] = await self._hop(_fetch_all, sql, params)
        return rows

    async def write_one(self, sql: str, params: Params) -> int:
        """Run one statement on its own (it is its own transaction); the number of rows changed.

        Raises:
            StoreGone: the file was removed or replaced (checked after the commit).
            StoreError: the store is closed, or SQLite failed.
        """
        changed, problem = await self._hop(_write_one, sql, params)
        self._linked_or_raise(problem)
        return int(changed)

    # ------------------------------------------------------------------- helpers

    async def _hop(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(conn, *args)`` on the connection's thread, in one hand-over: a whole unit there (one
        transaction, or statements that are each their own), so it needs no lock: the thread runs the
        units in the order they were handed over, back to back, while the event loop is busy elsewhere."""
        return await self._call(self._open_conn()._execute(fn, self._open_conn(), *args))  # type: ignore[no-untyped-call]

    def _open_conn(self) -> aiosqlite.Connection:
        if self._gone is not None:
            raise StoreGone(self._gone)
        if self._conn is None:
            raise StoreError(f"store {self._path} is closed")
        return self._conn

    def _linked_or_raise(self, problem: str) -> None:
        """Raise :class:`StoreGone` (for good) when the check after a commit found ``problem``."""
        if not problem:
            return
        if self._gone is None:
            self._gone = (f"store {self._path}: the database file {problem} while the daemon ran; what "
                          "was written since is lost, and nothing more is acknowledged")
            logger.error("%s", self._gone)
            self._gone_event.set()
        raise StoreGone(self._gone)

    async def _call(self, awaitable: Awaitable[_T]) -> _T:
        try:
            return await awaitable
        except sqlite3.Error as e:
            raise self._store_error(e) from e
        except ValueError as e:  # aiosqlite: "Connection closed" (closed after the call was made)
            raise StoreError(f"store {self._path} is closed ({e})") from e

    def _store_error(self, e: sqlite3.Error) -> StoreError:
        """SQLite's error as the store's: :class:`StoreFull` for a full disk."""
        if getattr(e, "sqlite_errorcode", None) == _SQLITE_FULL:
            return StoreFull(f"store {self._path}: the disk is full ({e}): nothing was stored")
        return StoreError(f"store {self._path}: {e}")


def _settled(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The raw connection, on its thread, with no transaction left open (one whose ROLLBACK failed: rolled
    back here)."""
    raw = conn._conn
    if raw.in_transaction:
        raw.execute("ROLLBACK")
    return raw


def _transact(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], _T]) -> tuple[_T, str]:
    """:meth:`Database.run` on the connection's thread: (``fn``'s result, what the linked check found)."""
    raw = _settled(conn)
    raw.execute("BEGIN IMMEDIATE")
    try:
        result = fn(raw)
        raw.execute("COMMIT")
    except BaseException:
        try:
            raw.execute("ROLLBACK")
        except sqlite3.Error as e:
            logger.debug("rollback: %s", e)
        raise
    return result, _linked_problem(raw)


class _Group:
    """Transactions of :meth:`Database.run` handed over to the connection's thread together (group commit).

    Joined on the event loop's thread until the connection's thread starts it (``started``, under
    ``lock``); then ``results`` holds, for each joined function in order, ``(True, its result)`` or
    ``(False, what it raised)``, and ``problem`` what the check after the commit found ("" when fine).
    ``durable``: whether one of them asked for a durable commit (:meth:`Database.run`); ``done``: its
    hand-over to the thread, awaited by every caller that joined it.
    """

    def __init__(self) -> None:
        self.done: asyncio.Future[None] | None = None
        self.lock = threading.Lock()
        self.started = False
        self.fns: list[Callable[[sqlite3.Connection], object]] = []
        self.results: list[tuple[bool, object]] = []
        self.problem = ""
        self.durable = False

    def join(self, fn: Callable[[sqlite3.Connection], object], durable: bool = True) -> int | None:
        """Add ``fn``; its index in ``results``, or None once the group has started (join a new one)."""
        with self.lock:
            if self.started:
                return None
            self.fns.append(fn)
            self.durable = self.durable or durable
            return len(self.fns) - 1


def _transact_group(conn: aiosqlite.Connection, group: _Group) -> None:
    """:meth:`Database.run` on the connection's thread: the group's functions in one transaction, each in
    a savepoint when there are several (one that raises is rolled back alone), one commit and one check.
    If SQLite itself ends the transaction (a full disk can), or ``BEGIN`` or ``COMMIT`` fails, every function
    of the group fails with that error: nothing of the group was stored."""
    with group.lock:
        group.started = True
        fns = list(group.fns)
    # Set at every group (outside a transaction only): a level a failed restore left behind lasts one group at most.
    _settled(conn).execute("PRAGMA synchronous = FULL" if group.durable else "PRAGMA synchronous = NORMAL")
    try:
        _run_group(conn, group, fns)
    finally:
        if not group.durable:  # (a transaction a failed ROLLBACK left open is rolled back first: else refused)
            _settled(conn).execute("PRAGMA synchronous = FULL")


def _run_group(conn: aiosqlite.Connection, group: _Group, fns: list[Callable[[sqlite3.Connection], object]]) -> None:
    """:func:`_transact_group`'s transaction (:func:`_transact`): each function in a savepoint when there
    are several; when the transaction fails whole, every function fails with its error."""
    def each(raw: sqlite3.Connection) -> list[tuple[bool, object]]:
        if len(fns) == 1:  # (as a transaction of its own: no savepoint)
            return [(True, fns[0](raw))]
        results: list[tuple[bool, object]] = []
        for fn in fns:
            raw.execute("SAVEPOINT one")
            try:
                results.append((True, fn(raw)))
            except Exception as e:
                if not raw.in_transaction:  # SQLite rolled the whole transaction back: none of it stands
                    raise
                raw.execute("ROLLBACK TO one")
                results.append((False, e))
            raw.execute("RELEASE one")
        return results

    try:
        group.results, group.problem = _transact(conn, each)
    except Exception as e:
        group.results = [(False, e)] * len(fns)


def _retrieved(done: asyncio.Future[None]) -> None:
    """Read a group's outcome even when every caller was cancelled (no "never retrieved" warning)."""
    if not done.cancelled():
        done.exception()


def _plain(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], _T]) -> _T:
    """:meth:`Database.read` on the connection's thread."""
    return fn(_settled(conn))


def _fetch_all(conn: aiosqlite.Connection, sql: str, params: Params) -> list[Any]:
    """:meth:`Database.fetch_all` on the connection's thread."""
    return _settled(conn).execute(sql, params).fetchall()


def _write_one(conn: aiosqlite.Connection, sql: str, params: Params) -> tuple[int, str]:
    """:meth:`Database.write_one` on the connection's thread: (rows changed, what the linked check found)."""
    raw = _settled(conn)
    changed = raw.execute(sql, params).rowcount
    return int(changed), _linked_problem(raw)


def _linked_problem(raw: sqlite3.Connection) -> str:
    """On the connection's thread, after a commit: what the check that the file is still the one opened
    found ("" when it is)."""
    row = raw.execute(f"SELECT {_LINKED_FN}()").fetchone()
    return str(row[0]) if row and row[0] else ""


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


def _forget_new(path: Path) -> None:
    """Remove a store file this open made that never got a database in it (0 bytes), and its
    companions: the next start makes it anew. Blocking."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()
            for suffix in ("-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    path.with_name(path.name + suffix).unlink()


def _private_files(path: Path, empty_ok: bool = True) -> tuple[int, int, bool]:
    """Make the SQLite file (created if missing) and its companions 0600; its (device, inode), and
    whether this call created it.

    Blocking: call in a thread. Before SQLite opens the file only: closing a descriptor of a file
    drops every POSIX lock the process holds on it, SQLite's included. The file is opened without
    following a symbolic link.

    Raises:
        StoreDamaged: the file exists but is empty (unless ``empty_ok``) or has no SQLite header.
        StoreError: one of them is another account's, a symbolic link, or cannot be created or changed.
    """
    uid = os.geteuid()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        existed = True
    except FileNotFoundError:
        existed = False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, _FILE_MODE)
        except OSError as e:
            raise StoreError(f"cannot create store {path}: {e.strerror or e}") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(f"refusing store file {path}: it is a symbolic link (to {os.readlink(path)}); "
                             "move it aside") from e
        raise StoreError(f"cannot open store {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        _check_private_file(path, st, uid)
        if existed and st.st_size == 0 and not empty_ok:
            raise _damaged(path, "the file is empty: 0 bytes")
        if existed and st.st_size > 0 and os.pread(fd, len(_SQLITE_HEADER), 0) != _SQLITE_HEADER:
            raise _damaged(path, "it has no SQLite header: not a database file, or its start was overwritten")
        if stat.S_IMODE(st.st_mode) != _FILE_MODE:
            os.fchmod(fd, _FILE_MODE)
    except OSError as e:
        raise StoreError(f"cannot make {path} private (0600): {e.strerror or e}") from e
    finally:
        os.close(fd)
    _private_companions(path)
    return st.st_dev, st.st_ino, not existed


_SQLITE_HEADER = b"SQLite format 3\x00"
_SQLITE_FULL = 13


def _private_companions(path: Path) -> None:
    """Make the ``-wal``, ``-shm`` and ``-journal`` files next to ``path`` 0600, by path (never opened).

    Blocking: call in a thread. They sit in the daemon's 0700 state dir: no one else can swap them.

    Raises:
        StoreError: one of them is not a regular file, is another account's, or cannot be changed.
    """
    uid = os.geteuid()
    for suffix in _COMPANIONS:
        companion = path.with_name(path.name + suffix)
        try:
            st = os.lstat(companion)
            _check_private_file(companion, st, uid)
            if stat.S_IMODE(st.st_mode) != _FILE_MODE:
                os.chmod(companion, _FILE_MODE)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise StoreError(f"cannot make {companion} private (0600): {e.strerror or e}") from e


def _check_private_file(path: Path, st: os.stat_result, uid: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"refusing store file {path}: it is not a regular file")
    if st.st_uid != uid:
        raise StoreError(f"refusing store file {path}: it is owned by uid {st.st_uid}, not by this "
                         f"daemon's account (uid {uid})")


def _still_linked(path: Path, identity: tuple[int, int]) -> str:
    """Empty if the file at ``path`` is still the one opened (device and inode); else what happened.

    Runs on the connection's thread (an SQL function).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "was removed (was the state dir deleted?)"
    except OSError as e:
        return f"cannot be checked ({e.strerror or e})"
    if (st.st_dev, st.st_ino) != identity:
        return "was replaced by another file"
    return ""


async def _quick_check(conn: aiosqlite.Connection, path: Path) -> None:
    """``PRAGMA quick_check``; raises :class:`StoreDamaged` with what SQLite found."""
    rows = [str(r[0]) for r in await conn.execute_fetchall("PRAGMA quick_check")]
    if rows != ["ok"]:
        more = f" (and {len(rows) - 1} more findings)" if len(rows) > 1 else ""
        raise _damaged(path, f"quick_check: {rows[0] if rows else 'no answer'}{more}")


def _is_corrupt(e: BaseException | None) -> bool:
    return isinstance(e, sqlite3.DatabaseError) and getattr(e, "sqlite_errorcode", None) in _CORRUPT_CODES


def _damaged(path: Path, found: str) -> StoreDamaged:
    return StoreDamaged(
        f"the store {path} is damaged ({found}); gpulayerd does not start on it. To save what is left: "
        f"sqlite3 {path} .recover | sqlite3 {path}.recovered, then move {path.name} and its -wal and -shm "
        f"files aside and rename {path.name}.recovered to {path.name}. Or move those three files aside to "
        "start with an empty store (its jobs are then forgotten).")
