"""The daemon's state on disk: removed under it, readable by others, shared, damaged (issue 12, items 6-8).

Real gpulayerd processes on real files:

- ``rm -rf`` of the state dir while the daemon runs: once it has returned, every submit fails
  or the daemon has exited (nothing is acknowledged into a deleted database);
- a state dir that existed with mode 0755 ends 0700, the database files 0600;
- a world-writable runtime dir (1777) or a state dir of another account is refused, unchanged;
- a damaged or truncated database: one clear message with a recovery hint, exit 1, no traceback.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
import subprocess
import threading
import time
from pathlib import Path

from gpulayerd.api.client import DaemonClient

from .conftest import GPULAYERD, SETTINGS, Daemon, Lab, clean_env, wait_until

DB_NAME = "gpulayer.sqlite3"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class RuntimeDirDaemon(Daemon):
    """A :class:`Daemon` whose socket lives outside its state dir (``runtime_dir`` in its TOML file)."""

    def __init__(self, lab: Lab, runtime_dir: Path) -> None:
        settings: dict[str, object] = {**SETTINGS, "runtime_dir": str(runtime_dir)}  # written as TOML
        super().__init__(lab.root / f"rt{len(lab.daemons)}", lock_dir=lab.lock_dir, cpu_slots=2, fake=None,
                         settings=settings)  # type: ignore[arg-type]
        self.runtime_dir = runtime_dir
        lab.daemons.append(self)

    @property
    def socket_path(self) -> Path:
        return self.runtime_dir / "gpulayerd.sock"


def run_daemon_once(state_dir: Path, lab: Lab, *extra: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Start gpulayerd expecting it to refuse at start-up; a daemon still running after ``timeout_s`` fails."""
    argv = [GPULAYERD, "--state-dir", str(state_dir), "--device-lock-dir", str(lab.lock_dir), "--no-mdns",
            "--cpu-slots", "1", *extra]
    try:
        return subprocess.run(argv, env=clean_env(), cwd=lab.root, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"gpulayerd did not refuse: still running after {timeout_s} s\n{e.stderr!r}") from e


# ------------------------------------------------------------------- rm -rf of the state dir


def test_after_rm_rf_of_the_state_dir_no_submit_is_acknowledged(lab: Lab) -> None:
    d = RuntimeDirDaemon(lab, lab.root / "sock").start()
    d.work.mkdir(parents=True, exist_ok=True)
    spec = {"command": ["true"], "workdir": str(d.work)}
    assert d.call(lambda c: c.submit(spec)).status == "queued"

    # Submits from another thread, while the state dir is removed: each records when it began.
    results: list[tuple[float, bool, str]] = []
    removed_at: list[float] = []
    stop = threading.Event()

    def submitter() -> None:
        async def go() -> None:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    async with DaemonClient(d.socket_path, timeout_s=10.0) as c:
                        job = await c.submit(spec)
                    results.append((began, True, job.id))
                except Exception as e:  # refused, 500, or the daemon is gone
                    results.append((began, False, f"{type(e).__name__}: {e}"))
                    await asyncio.sleep(0.02)

        asyncio.run(go())

    t = threading.Thread(target=submitter)
    t.start()
    try:
        wait_until(lambda: len(results) >= 3, 20, "submits before the removal")
        # rm -rf: again if the daemon made a file in a directory being removed (a job's run dir).
        for _ in range(20):
            shutil.rmtree(d.state_dir, ignore_errors=True)
            if not d.state_dir.exists():
                break
        assert not d.state_dir.exists()
        removed_at.append(time.monotonic())
        wait_until(lambda: sum(1 for r in results if r[0] > removed_at[0]) >= 5 or (
            d.proc is not None and d.proc.poll() is not None), 20, "submits after the removal")
    finally:
        stop.set()
        t.join(30)
    after = [r for r in results if r[0] > removed_at[0]]
    acknowledged = [r for r in after if r[1]]
    assert not acknowledged, f"acknowledged after rm -rf returned: {acknowledged}\n{d.log_tail()}"

    # The daemon stops on its own, with one clear error, exit code 1.
    assert d.proc is not None
    d.proc.wait(20)
    assert d.proc.returncode == 1, d.log_tail()
    log = d.log_tail(20000)
    assert "the database file was removed" in log and "nothing more is acknowledged" in log, log


# ----------------------------------------------------------------------------- modes


def test_a_0755_state_dir_ends_0700_with_database_files_0600(lab: Lab) -> None:
    d = lab.daemon(start=False)
    d.state_dir.mkdir(parents=True, mode=0o755)
    os.chmod(d.state_dir, 0o755)
    (d.state_dir / "runs").mkdir(mode=0o755)
    os.chmod(d.state_dir / "runs", 0o755)
    # A database left by an earlier life, readable by everyone (SQLite's default 0644).
    con = sqlite3.connect(d.state_dir / DB_NAME)
    con.execute("CREATE TABLE left_over (x)")
    con.commit()
    con.close()
    os.chmod(d.state_dir / DB_NAME, 0o644)

    d.start()
    d.submit("--", "true")  # a commit: the -wal and -shm files exist
    assert mode_of(d.state_dir) == 0o700
    assert mode_of(d.state_dir / "runs") == 0o700
    assert mode_of(d.socket_path.parent) == 0o700
    files = {p.name: mode_of(p) for p in d.state_dir.iterdir() if p.name.startswith(DB_NAME)}
    assert files == {DB_NAME: 0o600, DB_NAME + "-wal": 0o600, DB_NAME + "-shm": 0o600}


def test_a_world_writable_runtime_dir_is_refused_and_left_unchanged(lab: Lab) -> None:
    shared = lab.root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    state = lab.root / "state"
    r = run_daemon_once(state, lab, "--runtime-dir", str(shared))
    assert r.returncode == 1, r.stderr
    assert f"refusing {shared}: anyone may write to it (mode 1777)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert mode_of(shared) == 0o1777
    assert list(shared.iterdir()) == []
    assert not state.exists(), "nothing is created when a directory is refused"


def test_a_state_dir_of_another_account_is_refused_and_left_unchanged(lab: Lab) -> None:
    assert os.geteuid() == 0, "the suite runs as root (scripts/test): a directory of another account needs it"
    state = lab.root / "theirs"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    os.chown(state, 65534, 65534)
    r = run_daemon_once(state, lab)
    assert r.returncode == 1, r.stderr
    assert f"refusing {state}: it is owned by uid 65534" in r.stderr, r.stderr
    st = os.stat(state)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, 65534)
    assert list(state.iterdir()) == []


# ---------------------------------------------------------------------- damaged store


def _stopped_store(lab: Lab) -> Daemon:
    """A daemon that stored a job and stopped, its database grown by a filler table of ~100 pages."""
    d = lab.daemon()
    d.submit("--", "true")
    assert d.stop() == 0
    con = sqlite3.connect(d.state_dir / DB_NAME)
    con.execute("CREATE TABLE filler (x)")
    con.executemany("INSERT INTO filler VALUES (?)", [("x" * 3000,) for _ in range(100)])
    con.commit()
    con.close()
    return d


def _assert_refused_as_damaged(d: Daemon, lab: Lab) -> None:
    r = run_daemon_once(d.state_dir, lab)
    db = d.state_dir / DB_NAME
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpulayerd:")]
    assert len(errors) == 1, r.stderr
    assert errors[0].startswith(f"gpulayerd: the store {db} is damaged ("), errors[0]
    assert f"sqlite3 {db} .recover" in errors[0] and "aside" in errors[0], errors[0]


def test_a_damaged_database_is_refused_with_a_recovery_hint(lab: Lab) -> None:
    d = _stopped_store(lab)
    db = d.state_dir / DB_NAME
    size = db.stat().st_size
    with open(db, "r+b") as f:  # the last page, a leaf of the filler table: start-up reads never touch it
        f.seek(size - 4096)
        f.write(b"\x0d" + b"\xff" * 4095)
    _assert_refused_as_damaged(d, lab)


def test_a_truncated_database_is_refused_with_a_recovery_hint(lab: Lab) -> None:
    d = _stopped_store(lab)
    db = d.state_dir / DB_NAME
    os.truncate(db, db.stat().st_size // 2)
    _assert_refused_as_damaged(d, lab)


def test_a_zero_length_or_headerless_database_is_refused_with_a_recovery_hint(lab: Lab) -> None:
    """Issue 24: an emptied database is not silently re-created (all history gone) when the state dir
    is not new (it has the node's identity); a new state dir still starts with an empty store."""
    d = _stopped_store(lab)
    db = d.state_dir / DB_NAME
    os.truncate(db, 0)
    _assert_refused_as_damaged(d, lab)
    assert db.stat().st_size == 0, "the refused file is left as it was for recovery"
    db.write_bytes(b"\0" * 8192)  # no "SQLite format 3" header
    _assert_refused_as_damaged(d, lab)
    fresh = lab.daemon()  # a new state dir: no identity, no database yet
    assert fresh.submit("--", "true")


def test_a_symlinked_state_dir_is_refused_and_its_target_untouched(lab: Lab) -> None:
    target = lab.root / "roots-dir"
    target.mkdir()
    os.chmod(target, 0o755)
    (target / "keep").write_text("precious")
    link = lab.root / "state-link"
    link.symlink_to(target)
    r = run_daemon_once(link, lab)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"refusing {link}: it is a symbolic link" in r.stderr, r.stderr
    assert mode_of(target) == 0o755 and sorted(p.name for p in target.iterdir()) == ["keep"]


def test_a_symlink_planted_as_the_machine_lock_is_refused_and_its_target_untouched(lab: Lab) -> None:
    lab.lock_dir.mkdir(mode=0o1777, exist_ok=True)
    os.chmod(lab.lock_dir, 0o1777)
    victim = lab.root / "victim"
    victim.write_text("precious")
    (lab.lock_dir / "gpulayerd.lock").symlink_to(victim)
    r = run_daemon_once(lab.root / "state", lab)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"refusing the machine lock {lab.lock_dir}/gpulayerd.lock: it is a symbolic link (to {victim})" in r.stderr, r.stderr
    assert victim.read_text() == "precious" and mode_of(victim) == 0o644
