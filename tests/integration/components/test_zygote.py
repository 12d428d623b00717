"""The zygote: watchdogs forked from one long-lived parent, its death, and what it refuses."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpulayerd.runs import layout
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import Runner, RunnerError, RunState
from gpulayerd.runs.zygote import SPARES, ZygoteLaunch, ZygoteRefused, check_run_dir
from tests.integration.components.test_runner import (
    GRACE_S,
    POLL_S,
    _kill_leftovers,
    dead,
    job_env,
    new_job_id,
    wait_status,
    wait_until,
)


@pytest.fixture
def runs_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "runs"
    try:
        yield path
    finally:
        _kill_leftovers(path)


@pytest.fixture
def zrunner(runs_dir: Path) -> Iterator[Runner]:
    runner = Runner(runs_dir, grace_s=GRACE_S, poll_interval_s=POLL_S, use_zygote=True)
    try:
        yield runner
    finally:
        runner.close()


def _prepare(runs_dir: Path, job_id: str) -> Path:
    """A run directory with a launch.json, as Runner.start leaves it before the launch."""
    run_dir = layout.run_dir(runs_dir, job_id, 1)
    run_dir.parent.mkdir(mode=0o700, parents=True)
    run_dir.mkdir(mode=0o700)
    layout.write_json(run_dir / layout.LAUNCH_FILE, {"argv": ["/bin/true"], "env": {}, "cwd": None})
    return run_dir


def test_a_watchdog_forked_by_the_zygote_runs_the_job_detached_with_its_locks(
        zrunner: Runner, tmp_path: Path) -> None:
    locks = DeviceLocks(tmp_path / "locks")
    fds = locks.try_acquire(["GPU-aaa"])
    assert fds is not None
    job_id = new_job_id()
    try:
        handle = zrunner.start(job_id, 1, ["sh", "-c", "echo hi; while [ ! -e go ]; do sleep 0.02; done; exit 3"],
                               job_env(job_id), tmp_path, None, fds)
    finally:
        locks.release(fds)
    assert zrunner.zygote is not None and zrunner.zygote.starts == 1
    assert os.getsid(handle.watchdog_pid) == handle.watchdog_pid  # detached: a session of its own
    assert os.getsid(handle.job_pid) == handle.job_pid
    assert locks.is_locked_elsewhere("GPU-aaa")
    assert {int(fd) for fd in os.listdir(f"/proc/{handle.job_pid}/fd")} <= {0, 1, 2}
    (tmp_path / "go").touch()
    status = wait_status(zrunner, handle)
    assert (status.state, status.exit_code, status.reason) == (RunState.EXITED, 3, "exited")
    # Released right after exit.json is written (the locks are the attempt's until its end is recorded).
    wait_until(lambda: not locks.is_locked_elsewhere("GPU-aaa"), 10.0, "the device locks to be released")
    assert (handle.run_dir / "stdout.log").read_text() == "hi\n"


def test_a_command_not_found_through_the_zygote_is_reported(zrunner: Runner) -> None:
    job_id = new_job_id()
    with pytest.raises(RunnerError) as info:
        zrunner.start(job_id, 1, ["no-such-command-xyz"], job_env(job_id))
    assert info.value.status is not None
    assert (info.value.status.exit_code, info.value.status.reason) == (127, "start_failed")


def test_the_zygote_killed_loses_no_job_and_is_started_again(zrunner: Runner, tmp_path: Path) -> None:
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"],
                           job_env(job_id), tmp_path)
    assert zrunner.zygote is not None and zrunner.zygote.pid is not None
    first = zrunner.zygote.pid
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: psutil.Process(first).status() == psutil.STATUS_ZOMBIE, 5.0, "the zygote to die")
    assert zrunner.poll(handle).state is RunState.RUNNING  # its watchdog goes on
    second_id = new_job_id()
    second = zrunner.start(second_id, 1, ["true"], job_env(second_id))
    assert zrunner.zygote.starts == 2 and zrunner.zygote.pid != first
    assert wait_status(zrunner, second).exit_code == 0
    (tmp_path / "go").touch()
    assert wait_status(zrunner, handle).exit_code == 0


def test_a_symlinked_run_dir_is_refused_and_nothing_starts(zrunner: Runner, runs_dir: Path) -> None:
    real = _prepare(runs_dir, new_job_id())
    fake = new_job_id()
    (runs_dir / fake).symlink_to(real.parent)
    assert zrunner.zygote is not None
    with pytest.raises(ZygoteRefused, match="symlink"):
        zrunner.zygote.launch(fake, 1, [])
    assert not (real / layout.WATCHDOG_FILE).exists()


@pytest.mark.parametrize("case", ["outside", "mode", "no-launch"])
def test_check_run_dir_refuses_unsafe_directories(runs_dir: Path, case: str) -> None:
    job_id = new_job_id()
    run_dir = _prepare(runs_dir, job_id)
    if case == "outside":
        job_id = "../" + job_id
    elif case == "mode":
        run_dir.chmod(0o755)
    else:
        (run_dir / layout.LAUNCH_FILE).unlink()
    with pytest.raises(ZygoteRefused):
        check_run_dir(runs_dir, job_id, 1, os.geteuid())


def test_check_run_dir_accepts_the_runners_layout(runs_dir: Path) -> None:
    job_id = new_job_id()
    run_dir = _prepare(runs_dir, job_id)
    assert check_run_dir(runs_dir, job_id, 1, os.geteuid()) == run_dir


def test_a_request_from_another_uid_is_refused(zrunner: Runner, runs_dir: Path) -> None:
    job_id = new_job_id()
    run_dir = _prepare(runs_dir, job_id)
    zygote = zrunner.zygote
    assert zygote is not None and zygote.start()
    sock = zygote._sock  # the daemon's end of the control channel, as a stolen descriptor would give
    assert sock is not None
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock.sendmsg([json.dumps({"job_id": job_id, "attempt": 1, "locks": 0}).encode()],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [write_fd]))])
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reply = json.loads(sock.recv(4096))
    assert reply["ok"] is False and "uid 65534" in reply["error"]
    os.close(read_fd)
    assert not (run_dir / layout.WATCHDOG_FILE).exists()


def test_a_launch_is_lost_only_when_the_pipe_ended_without_a_claim(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    launch = ZygoteLaunch(read_fd, tmp_path)
    assert not launch.lost() and launch.poll() is None
    os.close(write_fd)
    launch.pause(1.0)
    assert launch.poll() == 0 and launch.lost()
    assert layout.claim_run_dir(tmp_path, {"pid": 1})
    assert not launch.lost()  # a watchdog claimed it: wait for it, never start it again
    launch.close()


def test_a_silent_job_makes_only_the_files_it_needs(zrunner: Runner) -> None:
    """Every file is an inode on the state disk: a job that prints nothing and ends normally
    leaves the launch, the claim, the job and its exit; no log file (read as empty)."""
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["/bin/true"], job_env(job_id), None, None)
    status = wait_status(zrunner, handle)
    assert (status.exit_code, status.reason) == (0, "exited")
    assert sorted(os.listdir(handle.run_dir)) == ["exit.json", "job.json", "launch.json", "watchdog.json"]
    assert sorted(os.listdir(handle.run_dir.parent)) == ["1"]


def test_a_watchdog_that_logs_creates_its_log(zrunner: Runner) -> None:
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["sh", "-c", "echo oops >&2; exit 4"], job_env(job_id), None, None)
    status = wait_status(zrunner, handle)
    assert (status.exit_code, status.reason) == (4, "exited")
    assert (handle.run_dir / "stderr.log").read_text() == "oops\n"
    assert not (handle.run_dir / "stdout.log").exists()
    assert not (handle.run_dir / layout.WATCHDOG_LOG).exists()  # a normal end logs at DEBUG
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["sleep", "1000"], job_env(job_id), None, None)
    zrunner.cancel(handle)
    status = wait_status(zrunner, handle)
    assert status.reason == "cancelled"
    text = (handle.run_dir / layout.WATCHDOG_LOG).read_text()
    assert f"watchdog[{handle.watchdog_pid}] INFO job ended: exit_code=-15 reason=cancelled" in text
    assert os.stat(handle.run_dir / layout.WATCHDOG_LOG).st_mode & 0o777 == 0o600


def test_the_claim_is_won_once_and_an_abandoned_attempt_never_starts(zrunner: Runner, runs_dir: Path) -> None:
    run_dir = _prepare(runs_dir, new_job_id())
    assert layout.abandon_run_dir(run_dir)
    assert not layout.claim_run_dir(run_dir, {"pid": 1})  # the first one stays
    assert layout.read_json(run_dir / layout.WATCHDOG_FILE) == {"abandoned": True}
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert zrunner.adopt(run_dir) is None  # no watchdog behind it
    assert layout.claim_run_dir(run_dir / "missing", {"pid": 1})  # nothing can start there
    job_id = run_dir.parent.name
    assert zrunner.zygote is not None
    launch = zrunner.zygote.launch(job_id, 1, [])
    assert launch is not None
    with launch:
        wait_until(lambda: (launch.pause(0.05), launch.poll() == 0)[1], 10.0, "the watchdog to give up")
        assert not launch.lost()  # claimed (by the daemon): never start it again
    # The watchdog found the claim taken and went without starting anything or writing a record.
    assert sorted(os.listdir(run_dir)) == ["claim", "launch.json", "watchdog.json"]
    assert layout.read_json(run_dir / layout.WATCHDOG_FILE) == {"abandoned": True}


def _children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE]


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _started_with_spare(runner: Runner) -> tuple[int, psutil.Process]:
    """Start the runner's zygote; (its pid, the spare watchdog the next start goes to: the first of the
    SPARES it forked ahead)."""
    assert runner.zygote is not None and runner.zygote.start()
    zygote = runner.zygote.pid
    assert zygote is not None
    def ready() -> bool:  # forked and set up (its own session): not caught in the moment after the fork
        kids = _children(zygote)
        return len(kids) == SPARES and all(os.getsid(k.pid) == k.pid for k in kids)

    wait_until(ready, 10.0, "the spare watchdogs")
    return zygote, min(_children(zygote), key=lambda p: (p.create_time(), p.pid))


def test_a_start_goes_to_the_spare_forked_ahead_which_leaves_with_the_zygote(zrunner: Runner) -> None:
    zygote, spare = _started_with_spare(zrunner)
    assert os.getsid(spare.pid) == spare.pid  # already detached, before any start
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["/bin/true"], job_env(job_id), None, None)
    assert handle.watchdog_pid == spare.pid
    status = wait_status(zrunner, handle)
    assert (status.exit_code, status.reason) == (0, "exited")
    def spares_again() -> bool:  # the used spare (now the job's watchdog) may still be leaving; one more is forked
        kids = _children(zygote)  # once the requests pause (FORK_AFTER_S)
        return len(kids) == SPARES and spare.pid not in {k.pid for k in kids}

    wait_until(spares_again, 10.0, "the spares again")
    following = _children(zygote)
    zrunner.close()
    wait_until(lambda: all(_gone(p) for p in following), 10.0, "the spares to leave with the zygote")


def test_a_dead_spare_costs_a_fork_not_a_start(zrunner: Runner) -> None:
    _, spare = _started_with_spare(zrunner)
    spare.kill()
    wait_until(lambda: _gone(spare), 10.0, "the spare to die")
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["sh", "-c", "exit 5"], job_env(job_id), None, None)
    assert handle.watchdog_pid != spare.pid
    status = wait_status(zrunner, handle)
    assert (status.exit_code, status.reason) == (5, "exited")
    assert zrunner.zygote is not None and zrunner.zygote.starts == 1  # the same zygote


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (/proc/self/mounts, longest mount point)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1].replace("\\040", " ")
        if str(path.resolve()).startswith(mount.rstrip("/") + "/") and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _has_topdir_flag(path: Path) -> bool:
    out = subprocess.run(["lsattr", "-d", str(path)], capture_output=True, text=True, check=False)
    return out.returncode == 0 and "T" in out.stdout.split()[0]


def test_the_runs_dir_spreads_job_dirs_where_the_file_system_can(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    spread = layout.spread_job_dirs(runs)
    if _fs_type(runs) in ("ext2", "ext3", "ext4"):
        assert spread  # chattr +T: Orlov places each job's directory on its own
    assert spread == _has_topdir_flag(runs)
    assert layout.spread_job_dirs(runs) == spread  # again: nothing changes
    assert not layout.spread_job_dirs(tmp_path / "missing")
    (tmp_path / "link").symlink_to(runs)
    assert not layout.spread_job_dirs(tmp_path / "link")  # never through a symlink
    if Path("/dev/shm").is_dir() and _fs_type(Path("/dev/shm/x")) == "tmpfs":
        assert not layout.spread_job_dirs(Path("/dev/shm"))  # tmpfs has no such flag


def test_a_claim_file_of_an_older_version_is_honoured_both_ways(runs_dir: Path) -> None:
    """Across an upgrade: an older watchdog claimed with ``claim`` (then wrote watchdog.json, which
    replaces); an older daemon gave up with ``claim`` alone. Neither attempt can be taken again."""
    older_watchdog = _prepare(runs_dir, new_job_id())
    (older_watchdog / layout.LEGACY_CLAIM_FILE).write_text("watchdog")
    assert not layout.abandon_run_dir(older_watchdog)  # it is starting: do not give up
    assert not layout.is_abandoned(older_watchdog)
    assert not layout.claim_run_dir(older_watchdog, {"pid": 1})
    given_up = _prepare(runs_dir, new_job_id())
    assert layout.abandon_run_dir(given_up)
    assert (given_up / layout.LEGACY_CLAIM_FILE).exists()  # an older watchdog cannot claim it either
    assert layout.is_abandoned(given_up) and not layout.claim_run_dir(given_up, {"pid": 1})


def test_a_watchdog_log_that_cannot_be_created_never_stops_the_watchdog(zrunner: Runner, tmp_path: Path) -> None:
    """Its first line comes mid-job (at the deadline): when watchdog.log cannot be created (here a
    symlink in its place; no inode left is the same), the line is dropped and the watchdog still
    stops the job and records its end, without following the link."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    job_id = new_job_id()
    handle = zrunner.start(job_id, 1, ["sleep", "1000"], job_env(job_id), None, time.monotonic() + 1.0)
    (handle.run_dir / layout.WATCHDOG_LOG).symlink_to(victim)
    status = wait_status(zrunner, handle)
    assert (status.reason, status.killed_by_watchdog) == ("deadline", True)
    assert (handle.run_dir / layout.EXIT_FILE).exists()
    assert victim.read_text() == "untouched\n"
    wait_until(lambda: dead(handle.job_pid), 10.0, "the job to be gone")


def test_an_output_log_is_never_written_through_a_symlink(zrunner: Runner, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    job_id = new_job_id()
    flag = tmp_path / "go"
    handle = zrunner.start(job_id, 1, ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.02; done; echo out; echo err >&2"],
                           job_env(job_id), None, None)
    (handle.run_dir / "stdout.log").symlink_to(victim)  # before the job's first byte
    flag.touch()
    status = wait_status(zrunner, handle)
    assert (status.exit_code, status.reason) == (0, "exited")
    assert victim.read_text() == "untouched\n"
    assert (handle.run_dir / "stderr.log").read_text() == "err\n"
    assert os.stat(handle.run_dir / "stderr.log").st_mode & 0o777 == 0o600
