"""The daemon's SQLite store: jobs it owns, their attempts and history, devices it granted.

The only package that imports aiosqlite. :class:`Store` owns the one connection
(:mod:`~gpulayerd.store.db`; migrations in :mod:`~gpulayerd.store.schema`, row types in
:mod:`~gpulayerd.store.rows`) and exposes one object per group of tables:

- ``store.jobs`` (:class:`JobsTable`, :mod:`~gpulayerd.store.jobs`): ``jobs``, ``attempts`` and ``events``;
- ``store.runs`` (:class:`RunsTable`, :mod:`~gpulayerd.store.runs`): ``grants`` and ``remote_runs``;
- ``store.peers`` (:class:`PeersTable`, :mod:`~gpulayerd.store.peers`): ``peers``;
- ``store.gangs`` (:class:`GangsTable`, :mod:`~gpulayerd.store.gangs`): ``gangs`` (the owner's
  multi-host attempts);
- ``store.usage`` (:class:`UsageTable`, :mod:`~gpulayerd.store.usage_book`): ``usage`` (fair-share
  usage kept across restarts);
- ``store.arrays`` (:class:`ArraysTable`, :mod:`~gpulayerd.store.array_table`): ``arrays`` (job arrays'
  cursors) and the array tasks in ``jobs``;
- ``store.history`` (:class:`HistoryTable`, :mod:`~gpulayerd.store.history`): accounting's reads of
  ``jobs`` and ``attempts``, and the retention of finished jobs.

A method that returns has committed its write (WAL, ``synchronous=FULL``). The schema grows
only through the numbered, forward-only :data:`MIGRATIONS`, tracked with ``PRAGMA user_version``.
The files are 0600; a damaged file is refused at open (:class:`StoreDamaged`); a file removed or
replaced while open is found after the next commit, before its caller is answered (:class:`StoreGone`).
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from gpulayerd.store.array_table import ArrayRow, ArraysTable, Materialized
from gpulayerd.store.db import Connect, Database, StoreDamaged, StoreGone
from gpulayerd.store.gangs import GangRow, GangsTable
from gpulayerd.store.history import AttemptUsage, EndedJob, HistoryTable
from gpulayerd.store.jobs import JobsTable
from gpulayerd.store.peers import PeersTable
from gpulayerd.store.rows import (
    AmbiguousJobId,
    AttemptRow,
    AttemptState,
    EventRow,
    GrantRow,
    JobNotFound,
    JobRow,
    RemoteRunRow,
    StoreError,
    StoreFull,
    retry_json,
)
from gpulayerd.store.runs import RunsTable
from gpulayerd.store.schema import MIGRATIONS, SCHEMA_VERSION
from gpulayerd.store.usage_book import UsageTable

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AmbiguousJobId",
    "ArrayRow",
    "ArraysTable",
    "AttemptRow",
    "AttemptState",
    "AttemptUsage",
    "Connect",
    "EndedJob",
    "EventRow",
    "GangRow",
    "GangsTable",
    "GrantRow",
    "HistoryTable",
    "JobNotFound",
    "JobRow",
    "JobsTable",
    "Materialized",
    "PeersTable",
    "RemoteRunRow",
    "RunsTable",
    "Store",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreGone",
    "UsageTable",
    "retry_json",
]


class Store:
    """The daemon's durable state. Open with :meth:`open`; close with :meth:`close`.

    Attributes:
        jobs: jobs this daemon owns, their attempts and history (and :meth:`JobsTable.claim`).
        runs: device grants and attempts run here for other owners.
        peers: remembered peers.
        gangs: the current attempt of each multi-host job owned here.
        usage: every user's fair-share usage, as last saved.
        arrays: job arrays owned here (cursors, their tasks' counts).
        history: what accounting reads of the jobs owned here; the retention of finished ones.
    """

    def __init__(self, db: Database) -> None:
        """Wrap an open, migrated database; use :meth:`open` instead."""
        self._db = db
        self.jobs = JobsTable(db)
        self.runs = RunsTable(db)
        self.peers = PeersTable(db)
        self.gangs = GangsTable(db)
        self.usage = UsageTable(db)
        self.arrays = ArraysTable(db)
        self.history = HistoryTable(db)

    @classmethod
    async def open(cls, path: Path, *, busy_timeout_s: float = 5.0, empty_ok: bool = True,
                   connect: Connect | None = None) -> Store:
        """Open (creating if needed) the store at ``path`` and migrate it to :data:`SCHEMA_VERSION`.

        Args:
            path: the SQLite file; its directory must exist.
            busy_timeout_s: how long a statement waits for another process's lock.
            empty_ok: whether an existing empty file may be taken for a new store (see
                :meth:`Database.open`; the daemon allows it only in a new state dir).
            connect: the SQLite driver (default: aiosqlite; a simulation runs statements in its loop).

        Raises:
            StoreDamaged: the file is damaged (``PRAGMA quick_check``), truncated or not SQLite;
                the message says how to recover it or move it aside.
            StoreError: the file cannot be opened or migrated, is another account's, or it was
                written by newer code (its schema version is above :data:`SCHEMA_VERSION`).
        """
        return cls(await Database.open(path, busy_timeout_s=busy_timeout_s, empty_ok=empty_ok, connect=connect))

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._db.path

    @property
    def gone(self) -> str | None:
        """Why the file can no longer be trusted (removed or replaced while open), or None."""
        return self._db.gone

    async def wait_gone(self) -> str:
        """Wait until a commit finds the file removed or replaced (every call then raises
        :class:`StoreGone`); returns why, for the daemon to stop with."""
        return await self._db.wait_gone()

    async def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        await self._db.close()

    async def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check``: "ok" when the file is sound, else its findings."""
        rows = await self._db.fetch_all("PRAGMA integrity_check", ())
        return "\n".join(str(r[0]) for r in rows)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
