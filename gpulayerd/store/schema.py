"""The store's schema: numbered, forward-only migrations tracked with ``PRAGMA user_version``.

Times: ``*_at`` columns are wall-clock seconds since the epoch, except
``jobs.lease_expires_at``, which is on the owner's monotonic clock (it is the core's
:attr:`JobRecord.lease_expires_at`). ``*_s`` are durations in seconds.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import aiosqlite

from gpulayerd.store.rows import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

logger = logging.getLogger(__name__)

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY NOT NULL,
            name TEXT,
            submitted_by TEXT,
            spec_json TEXT NOT NULL,
            status TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            holder TEXT,
            retries_left INTEGER NOT NULL DEFAULT 0,
            lease_s REAL NOT NULL,
            lease_expires_at REAL,  -- owner's monotonic clock
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            reason TEXT NOT NULL DEFAULT '',
            explanation_json TEXT,
            exit_code INTEGER,
            submitted_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            seq INTEGER  -- submission order
        );
        CREATE UNIQUE INDEX jobs_seq ON jobs (seq);
        CREATE INDEX jobs_status_seq ON jobs (status, seq);

        CREATE TABLE attempts (
            job_id TEXT NOT NULL REFERENCES jobs (id),
            attempt INTEGER NOT NULL,
            worker TEXT NOT NULL,
            placement_json TEXT NOT NULL,
            state TEXT NOT NULL,  -- claimed | running | exited | lost
            run_dir TEXT,
            watchdog_pid INTEGER,
            watchdog_create_time REAL,
            job_pgid INTEGER,
            started_at REAL,
            ended_at REAL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (job_id, attempt)
        );
        CREATE INDEX attempts_state ON attempts (state);

        CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            from_status TEXT,
            to_status TEXT,
            attempt INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            stimulus_id TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX events_job_seq ON events (job_id, seq);

        CREATE TABLE grants (
            device_uuid TEXT PRIMARY KEY NOT NULL,
            device_index INTEGER NOT NULL,
            accelerator TEXT NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            granted_at REAL NOT NULL
        );
        CREATE INDEX grants_job_attempt ON grants (job_id, attempt);
        """,
    ),
    (
        2,
        """
        CREATE TABLE remote_runs (
            owner TEXT NOT NULL,
            job_id TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            spec_json TEXT NOT NULL,
            placement_json TEXT NOT NULL,
            lease_s REAL NOT NULL,
            run_dir TEXT NOT NULL,
            state TEXT NOT NULL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            reported INTEGER NOT NULL DEFAULT 0,
            started_at REAL,
            ended_at REAL,
            PRIMARY KEY (owner, job_id, attempt)
        );
        CREATE INDEX remote_runs_state ON remote_runs (state, reported);

        CREATE TABLE peers (
            node_id TEXT PRIMARY KEY NOT NULL,
            name TEXT NOT NULL DEFAULT '',
            addresses_json TEXT NOT NULL DEFAULT '[]',
            port INTEGER NOT NULL,
            last_seen_at REAL
        );
        """,
    ),
    (
        3,
        """
        CREATE TABLE gangs (
            job_id TEXT PRIMARY KEY NOT NULL,
            attempt INTEGER NOT NULL,
            hold_id TEXT NOT NULL,
            members_json TEXT NOT NULL,  -- node ids in rank order
            master TEXT NOT NULL,  -- rank 0's address:port
            lease_s REAL NOT NULL,
            grace_s REAL NOT NULL,
            started_json TEXT NOT NULL DEFAULT '[]',
            exits_json TEXT NOT NULL DEFAULT '{}',
            lost_json TEXT NOT NULL DEFAULT '{}',
            first_failure_json TEXT,
            killed INTEGER NOT NULL DEFAULT 0,
            verdict_json TEXT,
            updated_at REAL NOT NULL
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE submission_keys (
            user TEXT NOT NULL,
            key TEXT NOT NULL,  -- made by the client (gpulayer submit: a uuid4)
            job_id TEXT NOT NULL,
            PRIMARY KEY (user, key)
        );
        """,
    ),
    (
        5,
        """
        -- Worker-side grants are keyed by (owner node, job id, attempt); '' is this daemon's own job.
        ALTER TABLE grants ADD COLUMN owner TEXT NOT NULL DEFAULT '';
        UPDATE grants SET owner = COALESCE((SELECT r.owner FROM remote_runs r WHERE r.job_id = grants.job_id
            AND r.attempt = grants.attempt AND r.state = 'running' LIMIT 1), '');
        DROP INDEX grants_job_attempt;
        CREATE INDEX grants_owner_job_attempt ON grants (owner, job_id, attempt);
        CREATE INDEX remote_runs_job ON remote_runs (job_id, attempt);
        """,
    ),
    (
        6,
        """
        -- Fair share: each user's decayed usage as of ``at`` (Unix s), kept across restarts.
        CREATE TABLE usage (
            user TEXT PRIMARY KEY,
            gpu_s REAL NOT NULL,
            cpu_slot_s REAL NOT NULL,
            at REAL NOT NULL
        );
        """,
    ),
    (
        7,
        """
        -- Retries on failure (issue 33): the job's retry policy as JSON (core.limits.RetryPolicy; ''
        -- = retry lost attempts only), the wall-clock time before which a retry is not claimed (its
        -- backoff), and the worker a retry avoids (--retry-elsewhere).
        ALTER TABLE jobs ADD COLUMN retry_json TEXT NOT NULL DEFAULT '';
        ALTER TABLE jobs ADD COLUMN retry_at REAL;
        ALTER TABLE jobs ADD COLUMN avoid_worker TEXT;
        """,
    ),
    (
        8,
        """
        -- Job arrays: the array is a job row of its own (never scheduled); its tasks are job rows
        -- (id ARRAY_INDEX) written as they are materialized, with the cursor, in one transaction.
        ALTER TABLE jobs ADD COLUMN array_id TEXT;
        CREATE INDEX jobs_array_status ON jobs (array_id, status) WHERE array_id IS NOT NULL;
        CREATE TABLE arrays (
            id TEXT PRIMARY KEY NOT NULL REFERENCES jobs (id),
            expr TEXT NOT NULL,  -- as submitted: 0-99:2%8
            total INTEGER NOT NULL,  -- tasks in all
            materialized INTEGER NOT NULL DEFAULT 0  -- positions materialized so far (the cursor)
        );
        """,
    ),
    (
        9,
        """
        -- Pre-flight checks (issue 35): the workers on which a job's pre-flight check failed, space-separated.
        ALTER TABLE jobs ADD COLUMN preflight_failed_on TEXT NOT NULL DEFAULT '';
        """,
    ),
    (
        10,
        """
        -- A Slurm worker (issue 36): where its attempt runs besides the worker (the Slurm node), for WHERE.
        ALTER TABLE attempts ADD COLUMN place TEXT NOT NULL DEFAULT '';
        """,
    ),
)
"""(version, SQL script) pairs, applied in order, each in its own transaction. Append only."""

SCHEMA_VERSION = MIGRATIONS[-1][0]
"""The schema version this code writes."""


async def _user_version(db: aiosqlite.Connection) -> int:
    rows = list(await db.execute_fetchall("PRAGMA user_version"))
    return int(rows[0][0])


async def migrate(db: aiosqlite.Connection, path: Path) -> None:
    """Bring the database on ``db`` (the file at ``path``) to :data:`SCHEMA_VERSION`.

    Each migration runs in its own ``BEGIN IMMEDIATE`` transaction; a failed one changes nothing.

    Raises:
        StoreError: the file was written by newer code, or a migration failed.
    """
    try:
        version = await _user_version(db)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {path} has schema version {version}, newer than this gpulayerd knows "
                f"({SCHEMA_VERSION}); upgrade gpulayer or use another state directory"
            )
        for target, script in MIGRATIONS:
            if target <= version:
                continue
            try:
                await db.execute("BEGIN IMMEDIATE")
                if await _user_version(db) < target:  # another process may have got there first
                    for statement in _statements(script):
                        await db.execute(statement)
                    await db.execute(f"PRAGMA user_version = {target:d}")
                await db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    await db.execute("ROLLBACK")
                raise
            logger.info("store %s: migrated to schema version %d", path, target)
    except sqlite3.Error as e:
        raise StoreError(f"cannot migrate store {path}: {e}") from e


def _statements(script: str) -> Iterable[str]:
    """Split an SQL script into statements (executescript would commit the open transaction)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement != ";":
                yield statement
    if pending.strip(" \n\t;"):
        raise StoreError(f"incomplete SQL statement in migration: {pending.strip()[:80]!r}")
