"""A full disk while a job exits (issue 12, item 9): the job still ends as "exited 1", never "lost".

A real gpulayerd whose state dir is a small tmpfs (root only: the test mounts it). The job waits for
a flag file outside the state dir; the test fills the tmpfs to the last byte, lets the job exit with
code 1, keeps the disk full for a few seconds (longer than the daemon's lease checks need to notice
a dead watch task), then frees the space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayerd.runs.layout import claim_run_dir, is_abandoned
from gpulayerd.runs.runner import Runner, RunnerError, RunState

from .conftest import TERMINAL, Lab, is_dead, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "8m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a filler file in ``directory`` until the file system has no byte left; its path."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            while True:
                try:
                    f.write(block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return filler


def test_a_job_that_exits_while_the_disk_is_full_ends_exited_1(lab: Lab) -> None:
    d = lab.daemon(start=False, lease_grace_s=1.0)
    d.state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(d.state_dir)], check=True)
    try:
        d.start()
        flag = d.work / "go"
        job_id = d.submit("--lease-s", "3", "--", "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; echo bye; exit 1")
        d.wait_status(job_id, {"running"})
        filler = fill(d.state_dir)
        flag.touch()
        # The job exits now; its end cannot be written (exit.json, the database) while the disk is full.
        time.sleep(6.0)  # several lease periods: a lost watch task would have the attempt declared lost
        assert d.job(job_id).status not in TERMINAL - {"failed"}, d.log_tail()
        filler.unlink()
        wait_until(lambda: d.job(job_id).status in TERMINAL, 20, "the job's end")
        job = d.job(job_id)
        assert (job.status, job.exit_code) == ("failed", 1), (job, d.log_tail())
        assert "exited 1" in (job.reason or "") or "code 1" in (job.reason or ""), job
        assert d.stop() == 0
        log = d.log_path.read_text(encoding="utf-8", errors="replace")
        assert "Task exception was never retrieved" not in log, log[-6000:]
        assert "background task" not in log, log[-6000:]
    finally:
        d.stop()
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(d.state_dir)], check=True)


def test_the_watchdog_keeps_the_exit_status_and_the_output_copy_survives_a_full_disk(lab: Lab) -> None:
    """Runner + watchdog on a full tmpfs: output written meanwhile is dropped (and the gap marked), the
    exit status reaches the runner without any disk, and the watchdog goes once told it is recorded."""
    with small_tmpfs(lab.root / "runs") as runs:
        runner = Runner(runs, grace_s=0.5, poll_interval_s=0.05)
        flag1, flag2 = lab.root / "go1", lab.root / "go2"
        script = (f"echo before; while [ ! -e {flag1} ]; do head -c 8192 /dev/zero | tr '\\0' x; echo; sleep 0.05; done; echo kept;"
                  f"while [ ! -e {flag2} ]; do sleep 0.05; done; exit 1")
        handle = runner.start("fulldisk", 1, ["sh", "-c", script], {"PATH": os.environ["PATH"]}, lab.root)
        stdout = handle.run_dir / "stdout.log"
        wait_until(lambda: stdout.exists() and b"before" in stdout.read_bytes(), 10, "the job's first line")
        filler = fill(runs)
        time.sleep(0.3)  # the job writes lines of 8 KiB into a full disk
        filler.unlink()
        flag1.touch()
        wait_until(lambda: b"kept" in stdout.read_bytes(), 10, "output after the space came back")
        assert runner.poll(handle).state is RunState.RUNNING
        filler = fill(runs)
        flag2.touch()  # the job exits 1; exit.json cannot be written
        wait_until(lambda: runner.poll(handle).state is not RunState.RUNNING, 10, "the kept exit status")
        status = runner.poll(handle)
        assert (status.state, status.exit_code, status.reason) == (RunState.EXITED, 1, "exited")
        assert not (handle.run_dir / "exit.json").exists()
        assert not is_dead(handle.watchdog_pid)  # it keeps the status (and its device locks)
        runner.recorded(handle)
        wait_until(lambda: is_dead(handle.watchdog_pid), 10, "the watchdog to exit once the end is recorded")
        filler.unlink()
        lines = stdout.read_bytes().decode().splitlines()
        assert lines[0] == "before" and lines[-1] == "kept", lines
        gap = [x for x in lines if x.startswith("[gpulayer: ")]
        assert len(gap) == 1 and gap[0].endswith("bytes of output dropped: No space left on device]"), lines


def test_a_full_disk_at_the_claim_starts_nothing_and_leaves_no_temporary_file(lab: Lab) -> None:
    """No data block left: a watchdog cannot write its claim (its record), so it starts nothing and
    records nothing; the daemon's give-up still lands (an empty watchdog.json needs only an inode)."""
    with small_tmpfs(lab.root / "runs") as runs:
        runner = Runner(runs, grace_s=0.5, poll_interval_s=0.05, start_timeout_s=2.0, use_zygote=True)
        try:
            flag = lab.root / "ran"
            filler = fill(runs)
            os.truncate(filler, filler.stat().st_size - 4096)  # one page: launch.json fits, the claim not
            with pytest.raises(RunnerError, match="did not start the job within"):
                runner.start("fullclaim", 1, ["touch", str(flag)], {"PATH": os.environ["PATH"]}, lab.root)
            run_dir = runner.run_dir("fullclaim", 1)
            time.sleep(0.5)  # a watchdog that would start the job late has had its chance
            assert not flag.exists()  # the job never ran
            assert sorted(p.name for p in run_dir.iterdir()) == ["claim", "launch.json", "watchdog.json",
                                                                  "watchdog.log"]
            assert is_abandoned(run_dir) and runner.adopt(run_dir) is None
            assert runner.give_up_if_unstarted(run_dir)  # after a restart: still given up
            assert not claim_run_dir(run_dir, {"pid": 1})  # no watchdog can claim it any more
            filler.unlink()
            assert not claim_run_dir(run_dir, {"pid": 1})
            assert runner.poll(run_dir).state is RunState.GONE
        finally:
            runner.close()


def test_a_claim_that_cannot_be_written_leaves_no_temporary_file(lab: Lab) -> None:
    with small_tmpfs(lab.root / "runs") as runs:
        runner = Runner(runs, grace_s=0.5, poll_interval_s=0.05)
        filler = fill(runs)
        with pytest.raises(RunnerError, match=r"cannot write its run directory .*No space left"):
            runner.start("nospace", 1, ["true"], {"PATH": os.environ["PATH"]}, lab.root)
        filler.unlink()
        run_dir = runs / "job" / "1"
        run_dir.mkdir(parents=True)
        filler = fill(runs)
        with pytest.raises(OSError, match="No space left"):
            claim_run_dir(run_dir, {"pid": 1, "create_time": 1.0})
        assert list(run_dir.iterdir()) == []
        filler.unlink()
        assert claim_run_dir(run_dir, {"pid": 1, "create_time": 1.0})
        assert sorted(p.name for p in run_dir.iterdir()) == ["watchdog.json"]


def test_a_submit_on_a_full_state_disk_exits_1_and_nothing_is_acknowledged(lab: Lab) -> None:
    """Issue 24: SQLITE_FULL becomes HTTP 507 ``state_disk_full``; the CLI says so, exit 1; once space
    returns, the job list holds no trace of the refused submit and the next submit is stored."""
    d = lab.daemon(start=False)
    d.state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(d.state_dir)], check=True)
    try:
        d.start()
        before = {j["id"] for j in d.all_jobs()}
        filler = fill(d.state_dir)
        # Enough text that the write-ahead log must grow (free pages it kept from before cannot hold it).
        r = d.cli("submit", "--name", "on-a-full-disk", "--env", "PAD=" + "x" * 60_000, "--", "true")
        filler.unlink()
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "state disk is full: nothing was stored" in r.stderr and r.stdout == "", (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert {j["id"] for j in d.all_jobs()} == before
        job = d.submit("--", "true")
        assert d.wait_status(job, {"succeeded"}).status == "succeeded"
    finally:
        d.stop()
        subprocess.run(["umount", "-l", str(d.state_dir)], check=False)


def test_a_first_start_on_a_full_disk_leaves_nothing_that_refuses_the_next_one(lab: Lab) -> None:
    """A first start that stops on a full disk used to leave a node key and a 0-byte database: every
    later start then refused the state dir as damaged (issue 24 review). The store is made before the
    identity, and a store file the failed start made is removed."""
    from .test_state_safety import run_daemon_once

    state = lab.root / "first"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)], check=True)
    try:
        (state / "runs").mkdir(mode=0o700)
        filler = fill(state)
        os.truncate(filler, max(0, filler.stat().st_size - 2 * 4096))  # two pages: no room for a database
        r = run_daemon_once(state, lab)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert not (state / "identity" / "node.key").exists(), sorted(p.name for p in state.rglob("*"))
        assert not (state / "gpulayer.sqlite3").exists() or (state / "gpulayer.sqlite3").stat().st_size > 0
        filler.unlink()
        d = lab.daemon(start=False)
        d.state_dir = state
        d.start()
        assert d.submit("--", "true")
        assert d.stop() == 0
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)
