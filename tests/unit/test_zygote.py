"""The zygote: watchdogs forked from one long-lived parent, its death, and what it refuses."""

from __future__ import annotations

import array
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpulayerd.runs import layout
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import Runner, RunnerError, RunState
from gpulayerd.runs.zygote import ZygoteLaunch, ZygoteRefused, check_run_dir
from tests.unit.test_runner import (
    GRACE_S,
    POLL_S,
    _kill_leftovers,
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
    assert not locks.is_locked_elsewhere("GPU-aaa")
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
    assert not (real / layout.WATCHDOG_FILE).exists() and not (real / layout.CLAIM_FILE).exists()


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
    assert not (run_dir / layout.CLAIM_FILE).exists() and not (run_dir / layout.WATCHDOG_FILE).exists()


def test_a_launch_is_lost_only_when_the_pipe_ended_without_a_claim(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    launch = ZygoteLaunch(read_fd, tmp_path)
    assert not launch.lost() and launch.poll() is None
    os.close(write_fd)
    launch.pause(1.0)
    assert launch.poll() == 0 and launch.lost()
    assert layout.claim_run_dir(tmp_path, "watchdog")
    assert not launch.lost()  # a watchdog claimed it: wait for it, never start it again
    launch.close()
