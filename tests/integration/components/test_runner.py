"""The runner and the per-job watchdog, with real processes and real signals.

Every job here carries ``GPULAYER_JOB_ID`` starting with this test session's prefix;
the ``runner`` fixture kills whatever is left of its runs (watchdogs, process groups,
tagged processes) even when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil
import pytest

from gpulayerd.core.types import Accelerator
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec
from gpulayerd.runs import runner as runner_module
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.launch import build_argv, build_env
from gpulayerd.runs.layout import claim_run_dir
from gpulayerd.runs.process import job_processes, record_of
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunState, RunStatus

REPO_ROOT = Path(__file__).resolve().parents[3]
PREFIX = f"pytest{os.getpid()}-"
GRACE_S = 0.5
POLL_S = 0.05
CPU = Placement("node-a", sys.executable, (), (), Accelerator.CPU)
CUDA_1_3 = Placement("node-a", sys.executable, (1, 3), ("GPU-1", "GPU-3"), Accelerator.CUDA)
TORCHRUN = [
    "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1", "--nnodes", "1",
    "--nproc-per-node", "2",
    "--max-restarts", "0", "--monitor-interval", "1", "--rdzv-conf", "join_timeout=60",
]
has_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


# ------------------------------------------------------------------------------ helpers


def new_job_id() -> str:
    return f"{PREFIX}{uuid.uuid4().hex[:8]}"


def spec(command: Sequence[str], **fields: object) -> JobSpec:
    return JobSpec.model_validate({"command": list(command), **fields})


def job_env(job_id: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "GPULAYER_JOB_ID": job_id, "GPULAYER_ATTEMPT": "1", **(extra or {})}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def wait_status(runner: Runner, handle: RunHandle, timeout_s: float = 10.0) -> RunStatus:
    return asyncio.run(asyncio.wait_for(runner.async_wait(handle), timeout_s))


def dead(pid: int) -> bool:
    """No such process, or only its zombie (this sandbox's pid 1 may never reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_file(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


def _kill_leftovers(runs_dir: Path) -> None:
    for wd_file in runs_dir.glob("*/*/watchdog.json"):
        run_dir = wd_file.parent
        info = json.loads(wd_file.read_text())
        if "pid" not in info:  # abandoned: no watchdog behind it
            continue
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(info["pid"])
            if abs(proc.create_time() - info["create_time"]) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE:
                proc.terminate()  # the watchdog stops its own job tree
                with contextlib.suppress(AssertionError):
                    wait_until(functools.partial(dead, proc.pid), 3.0, "the watchdog to stop")
                proc.kill()
        job_file = run_dir / "job.json"
        if job_file.exists():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(json.loads(job_file.read_text())["pgid"], signal.SIGKILL)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("GPULAYER_JOB_ID", "").startswith(PREFIX):
                proc.kill()


@pytest.fixture
def runs_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "runs"
    try:
        yield path
    finally:
        _kill_leftovers(path)


@pytest.fixture
def runner(runs_dir: Path) -> Runner:
    return Runner(runs_dir, grace_s=GRACE_S, poll_interval_s=POLL_S)


# ---------------------------------------------------------------------------- build_argv


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "train.py", "--lr", "1"], ["/env/bin/python", "train.py", "--lr", "1"]),
        (["python3", "-m", "pkg.train"], ["/env/bin/python", "-m", "pkg.train"]),
        (["python3.11", "x.py"], ["/env/bin/python", "x.py"]),
        (["/usr/bin/python3", "x.py"], ["/usr/bin/python3", "x.py"]),
        (["pythonista", "x.py"], ["pythonista", "x.py"]),
        (["sh", "-c", "echo python"], ["sh", "-c", "echo python"]),
    ],
)
def test_build_argv_replaces_only_a_bare_python(command: list[str], expected: list[str]) -> None:
    assert build_argv(spec(command), "/env/bin/python", None, rdzv_timeout_s=60) == expected


@pytest.mark.parametrize(
    ("command", "tail"),
    [
        (["python", "train.py", "--epochs", "3"], ["train.py", "--epochs", "3"]),
        (["python3", "-u", "train.py"], ["train.py"]),
        (["python", "-m", "pkg.train", "--x"], ["-m", "pkg.train", "--x"]),
        (["python", "-mpkg.train"], ["-m", "pkg.train"]),
        (["./train.sh", "a"], ["--no-python", "./train.sh", "a"]),
    ],
)
def test_build_argv_distributed_uses_standalone_torchrun(command: list[str], tail: list[str]) -> None:
    job = spec(command, distributed={"nproc_per_node": 2, "backend": "gloo"})
    assert build_argv(job, "/env/bin/python", 2, rdzv_timeout_s=60.0) == ["/env/bin/python", *TORCHRUN, *tail]


def test_build_argv_rounds_the_rendezvous_timeout_up() -> None:
    argv = build_argv(spec(["python", "t.py"]), "/py", 1, rdzv_timeout_s=0.2)
    assert argv[argv.index("--rdzv-conf") + 1] == "join_timeout=1"
    assert argv[argv.index("--nproc-per-node") + 1] == "1"


@pytest.mark.parametrize(
    ("command", "fields", "message"),
    [
        (["python", "t.py"], {"distributed": {"nnodes": 2, "nproc_per_node": 1}}, "over 2 hosts"),
        (["python", "-c", "print(1)"], {}, "python option -c"),
        (["python"], {}, "needs a script"),
        (["python", "-m"], {}, "needs a module"),
    ],
)
def test_build_argv_refuses_what_torchrun_cannot_run(
    command: list[str], fields: dict[str, object], message: str
) -> None:
    with pytest.raises(RunnerError, match=message):
        build_argv(spec(command, **fields), "/py", 2, rdzv_timeout_s=60)


# ----------------------------------------------------------------------------- build_env


def test_build_env_gpulayer_variables_win_over_the_spec() -> None:
    job = spec(["python", "x.py"], env={
        "CUDA_VISIBLE_DEVICES": "7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST", "GPULAYER_JOB_ID": "evil",
        "GPULAYER_EXTRA": "x", "FOO": "bar", "PYTHONUNBUFFERED": "0",
    })
    base = {"HOME": "/home/u", "FOO": "base", "GPULAYER_CONFIG": "/etc/x", "CUDA_VISIBLE_DEVICES": "0"}
    env = build_env(base, job, CUDA_1_3, "job1", 2, 45.0)
    assert env == {
        "HOME": "/home/u", "FOO": "bar", "PYTHONUNBUFFERED": "0", "CUDA_VISIBLE_DEVICES": "1,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "GPULAYER_JOB_ID": "job1", "GPULAYER_ATTEMPT": "2",
        "GPULAYER_DIST_TIMEOUT_S": "45.0",
    }


def test_build_env_cpu_hides_every_gpu_and_sets_unbuffered() -> None:
    env = build_env({"PATH": "/bin"}, spec(["python", "x.py"]), CPU, "job1", 1, 300)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["HIP_VISIBLE_DEVICES"] == ""
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["GPULAYER_DIST_TIMEOUT_S"] == "300.0"


# ------------------------------------------------------------------------- running jobs


@pytest.mark.parametrize(
    ("placement", "visible", "order"),
    [(CPU, "", None), (CUDA_1_3, "1,3", "PCI_BUS_ID")],
    ids=["cpu", "cuda-1-3"],
)
def test_job_sees_its_launch_env(
    runner: Runner, placement: Placement, visible: str, order: str | None
) -> None:
    job_id = new_job_id()
    job = spec(["python", "-c", "import json, os; print(json.dumps(dict(os.environ)))"])
    argv = build_argv(job, sys.executable, None, rdzv_timeout_s=60)
    env = build_env(os.environ, job, placement, job_id, 1, 30.0)
    handle = runner.start(job_id, 1, argv, env)
    status = wait_status(runner, handle)
    assert (status.state, status.exit_code, status.reason) == (RunState.EXITED, 0, "exited")
    seen = json.loads(runner.log_paths(job_id, 1)[0].read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == visible
    assert seen.get("CUDA_DEVICE_ORDER") == order
    assert (seen["GPULAYER_JOB_ID"], seen["GPULAYER_ATTEMPT"]) == (job_id, "1")
    assert (seen["GPULAYER_DIST_TIMEOUT_S"], seen["PYTHONUNBUFFERED"]) == ("30.0", "1")


def test_output_goes_to_the_logs_and_the_exit_code_is_recorded(runner: Runner, tmp_path: Path) -> None:
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sh", "-c", "echo to-out; echo to-err >&2; pwd; exit 3"],
                          job_env(job_id), tmp_path)
    status = wait_status(runner, handle)
    assert (status.state, status.exit_code, status.reason, status.killed_by_watchdog) == (
        RunState.EXITED, 3, "exited", False)
    out, err = runner.log_paths(job_id, 1)
    assert (out, err) == (handle.run_dir / "stdout.log", handle.run_dir / "stderr.log")
    assert out.read_text().splitlines() == ["to-out", str(tmp_path)]
    assert err.read_text() == "to-err\n"
    assert runner.poll(handle.run_dir) == status  # a bare run directory works too
    assert stat.S_IMODE(handle.run_dir.stat().st_mode) == 0o700  # launch.json holds the environment


def test_python_runs_with_the_interpreter_given(runner: Runner, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "envpython"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "envpython got: $*"\n')
    fake.chmod(0o755)
    job_id = new_job_id()
    argv = build_argv(spec(["python", "-c", "print(1)"]), str(fake), None, rdzv_timeout_s=60)
    handle = runner.start(job_id, 1, argv, job_env(job_id))
    assert wait_status(runner, handle).exit_code == 0
    assert runner.log_paths(job_id, 1)[0].read_text() == "envpython got: -c print(1)\n"


def test_cancel_kills_the_whole_process_group(runner: Runner, tmp_path: Path) -> None:
    job_id = new_job_id()
    script = "sleep 1000 & echo $! > child.pid; echo ready; wait"
    handle = runner.start(job_id, 1, ["sh", "-c", script], job_env(job_id), tmp_path)
    wait_until(lambda: read_file(handle.run_dir / "stdout.log") == "ready\n", 5, "the job to start its child")
    child = int((tmp_path / "child.pid").read_text())
    assert handle.job_pid is not None
    assert os.getpgid(child) == handle.job_pgid == handle.job_pid
    assert runner.poll(handle).state is RunState.RUNNING

    runner.cancel(handle)
    status = wait_status(runner, handle)
    assert (status.state, status.reason, status.killed_by_watchdog) == (RunState.EXITED, "cancelled", True)
    assert status.exit_code == -signal.SIGTERM
    # The watchdog reaped both (it is the subreaper of the job's orphans): truly gone.
    assert not psutil.pid_exists(handle.job_pid)
    assert not psutil.pid_exists(child)


@pytest.mark.parametrize("spawn", ["sleep 1000", "setsid sleep 1000"], ids=["same-group", "own-session"])
def test_leftovers_of_a_job_that_exited_are_killed(runner: Runner, tmp_path: Path, spawn: str) -> None:
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sh", "-c", f"{spawn} & echo $! > child.pid"], job_env(job_id), tmp_path)
    status = wait_status(runner, handle)
    assert (status.exit_code, status.reason, status.killed_by_watchdog) == (0, "exited", False)
    child = int((tmp_path / "child.pid").read_text())
    assert not psutil.pid_exists(child)


def test_a_job_that_ignores_sigterm_is_killed_after_grace(runner: Runner) -> None:
    job_id = new_job_id()
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready'); time.sleep(1000)"
    handle = runner.start(job_id, 1, [sys.executable, "-u", "-c", code], job_env(job_id))
    wait_until(lambda: read_file(handle.run_dir / "stdout.log") == "ready\n", 5, "the job to ignore SIGTERM")
    started = time.monotonic()
    runner.cancel(handle)
    status = wait_status(runner, handle)
    elapsed_s = time.monotonic() - started
    assert (status.reason, status.exit_code, status.killed_by_watchdog) == ("cancelled", -signal.SIGKILL, True)
    assert GRACE_S <= elapsed_s < GRACE_S + 5.0  # loose upper bound: a loaded machine is slow


def test_deadline_passed_stops_the_job(runner: Runner) -> None:
    job_id = new_job_id()
    started = time.monotonic()
    handle = runner.start(job_id, 1, ["sleep", "1000"], job_env(job_id), None, started + 1.0)
    status = wait_status(runner, handle)
    elapsed_s = time.monotonic() - started
    assert (status.reason, status.exit_code, status.killed_by_watchdog) == ("deadline", -signal.SIGTERM, True)
    assert status.detail == "deadline passed: the owner's lease was not renewed"
    assert 1.0 <= elapsed_s < 6.0  # loose upper bound: a loaded machine is slow


def test_extend_deadline_keeps_the_job_alive(runner: Runner) -> None:
    job_id = new_job_id()
    started = time.monotonic()
    # Generous margins: on a loaded 2-core machine start() alone can take most of a second.
    handle = runner.start(job_id, 1, ["sh", "-c", "sleep 3.5; exit 0"], job_env(job_id), None, started + 2.5)
    runner.extend_deadline(handle, time.monotonic() + 20.0)
    time.sleep(max(0.0, started + 3.0 - time.monotonic()))
    assert runner.poll(handle).state is RunState.RUNNING  # past the first deadline
    status = wait_status(runner, handle)
    assert (status.exit_code, status.reason, status.killed_by_watchdog) == (0, "exited", False)


DAEMON = """
import json, os, sys, time
from pathlib import Path
from gpulayerd.runs.runner import Runner
runner = Runner(Path(sys.argv[1]), grace_s=0.5, poll_interval_s=0.05)
job_id, workdir = sys.argv[2], sys.argv[3]
env = {**os.environ, "GPULAYER_JOB_ID": job_id, "GPULAYER_ATTEMPT": "1"}
script = "while [ ! -e go ]; do sleep 0.02; done; exit 7"
handle = runner.start(job_id, 1, ["sh", "-c", script], env, workdir, time.monotonic() + 60, ())
print(json.dumps({"run_dir": str(handle.run_dir), "watchdog_pid": handle.watchdog_pid,
                  "job_pid": handle.job_pid}), flush=True)
time.sleep(1000)
"""


def test_the_watchdog_survives_the_daemon_and_is_adopted(runs_dir: Path, tmp_path: Path) -> None:
    job_id = new_job_id()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen([sys.executable, "-c", DAEMON, str(runs_dir), job_id, str(tmp_path)],
                          stdout=subprocess.PIPE, env=env, text=True) as daemon:
        try:
            started = json.loads(daemon.stdout.readline() if daemon.stdout else "{}")
        finally:
            daemon.kill()  # the daemon dies with -9
            daemon.wait()
    assert psutil.Process(started["watchdog_pid"]).ppid() != daemon.pid  # detached

    fresh = Runner(runs_dir, grace_s=GRACE_S, poll_interval_s=POLL_S)
    handle = fresh.adopt(Path(started["run_dir"]))
    assert handle is not None
    assert (handle.job_id, handle.attempt) == (job_id, 1)
    assert (handle.watchdog_pid, handle.job_pid) == (started["watchdog_pid"], started["job_pid"])
    assert fresh.poll(handle).state is RunState.RUNNING
    (tmp_path / "go").touch()
    status = wait_status(fresh, handle)
    assert (status.state, status.exit_code, status.reason) == (RunState.EXITED, 7, "exited")


def test_adopt_without_a_watchdog_file_is_none(runner: Runner, tmp_path: Path) -> None:
    assert runner.adopt(tmp_path) is None
    status = runner.poll(tmp_path)
    assert (status.state, status.reason) == (RunState.GONE, "gone")


def test_gone_when_the_watchdog_dies_with_its_job(runner: Runner) -> None:
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sleep", "1000"], job_env(job_id))
    assert handle.job_pgid is not None
    os.kill(handle.watchdog_pid, signal.SIGKILL)
    os.killpg(handle.job_pgid, signal.SIGKILL)
    assert handle.job_pid is not None
    wait_until(lambda: dead(handle.job_pid), 10, "the job to die")
    status = wait_status(runner, handle)
    assert (status.state, status.exit_code, status.reason) == (RunState.GONE, None, "gone")
    assert "died without writing exit.json" in status.detail
    assert "its job is gone too" in status.detail


def test_cancel_stops_the_job_itself_when_the_watchdog_is_gone(runner: Runner) -> None:
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sleep", "1000"], job_env(job_id))
    assert handle.job_pid is not None
    os.kill(handle.watchdog_pid, signal.SIGKILL)
    wait_until(lambda: dead(handle.watchdog_pid), 5, "the watchdog to die")
    status = runner.poll(handle)
    assert status.state is RunState.GONE
    assert "is still running" in status.detail
    runner.cancel(handle)
    assert dead(handle.job_pid)
    assert "its job is gone too" in runner.poll(handle).detail


def test_a_command_that_is_not_found_is_reported(runner: Runner) -> None:
    job_id = new_job_id()
    with pytest.raises(RunnerError, match="command not found: no-such-command-xyz") as info:
        runner.start(job_id, 1, ["no-such-command-xyz", "arg"], job_env(job_id))
    assert info.value.status is not None
    assert (info.value.status.exit_code, info.value.status.reason) == (127, "start_failed")
    status = runner.poll(runner.run_dir(job_id, 1))
    assert (status.state, status.exit_code, status.detail) == (
        RunState.EXITED, 127, "command not found: no-such-command-xyz")


def test_a_missing_working_directory_is_reported(runner: Runner, tmp_path: Path) -> None:
    job_id = new_job_id()
    with pytest.raises(RunnerError, match="working directory not usable"):
        runner.start(job_id, 1, ["true"], job_env(job_id), tmp_path / "absent")


def test_a_broken_launch_file_still_ends_with_exit_json(runner: Runner, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(json.dumps({"argv": [], "env": {}}))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-m", "gpulayerd.runs.watchdog", str(run_dir)], env=env, check=True, timeout=30)
    wait_until((run_dir / "exit.json").exists, 10, "exit.json")
    status = runner.poll(run_dir)
    assert (status.state, status.exit_code, status.reason) == (RunState.EXITED, None, "error")
    assert "argv must be a non-empty list" in status.detail


@pytest.mark.parametrize("use_pidfd", [True, False], ids=["pidfd", "polling"])
def test_async_wait_does_not_block_the_loop(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, use_pidfd: bool
) -> None:
    if not use_pidfd:
        monkeypatch.setattr(runner_module, "_open_pidfd", lambda handle: None)
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sleep", "0.4"], job_env(job_id))

    async def main() -> tuple[RunStatus, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        try:
            return await asyncio.wait_for(runner.async_wait(handle), 10), ticks
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    status, ticks = asyncio.run(main())
    assert (status.exit_code, status.reason) == (0, "exited")
    assert ticks >= 15


def test_a_run_directory_is_never_reused(runner: Runner) -> None:
    job_id = new_job_id()
    wait_status(runner, runner.start(job_id, 1, ["true"], job_env(job_id)))
    with pytest.raises(RunnerError, match="earlier run"):
        runner.start(job_id, 1, ["true"], job_env(job_id))
    with pytest.raises(ValueError, match="plain file name"):
        runner.start("../escape", 1, ["true"], job_env(job_id))


def test_the_watchdog_holds_the_device_locks_until_the_job_ends(runner: Runner, tmp_path: Path) -> None:
    locks = DeviceLocks(tmp_path / "locks")
    fds = locks.try_acquire(["GPU-aaa"])
    assert fds is not None
    job_id = new_job_id()
    try:
        handle = runner.start(job_id, 1, ["sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"],
                              job_env(job_id), tmp_path, None, fds)
    finally:
        locks.release(fds)  # the daemon closes its copies
    assert locks.is_locked_elsewhere("GPU-aaa")
    job_fds = {int(fd) for fd in os.listdir(f"/proc/{handle.job_pid}/fd")}
    assert job_fds <= {0, 1, 2}  # the job itself does not inherit the locks
    (tmp_path / "go").touch()
    assert wait_status(runner, handle).exit_code == 0
    # Released right after exit.json is written (the locks are the attempt's until its end is recorded).
    wait_until(lambda: not locks.is_locked_elsewhere("GPU-aaa"), 10.0, "the device locks to be released")


# ------------------------------------------------------------------------------- torchrun

DIST_SCRIPT = """
import os, sys, time
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ["GPULAYER_DIST_TIMEOUT_S"])))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# One write(2) per line: both ranks share the log file, and print() may write text and newline apart.
os.write(1, (f"rank={rank} world={world} sum={t.item()} run={os.environ['TORCHELASTIC_RUN_ID']}" + chr(10)).encode())
if len(sys.argv) > 1:
    Path(sys.argv[1], f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(1000)
dist.destroy_process_group()
"""


def _start_dist(runner: Runner, tmp_path: Path, *args: str) -> RunHandle:
    script = tmp_path / "dist_job.py"
    script.write_text(DIST_SCRIPT)
    job = spec(["python", str(script), *args], distributed={"nproc_per_node": 2, "backend": "gloo"})
    job_id = new_job_id()
    argv = build_argv(job, sys.executable, 2, rdzv_timeout_s=60)
    return runner.start(job_id, 1, argv, build_env(os.environ, job, CPU, job_id, 1, 60.0), tmp_path)


@has_torch
@pytest.mark.slow
def test_two_torchrun_jobs_at_once_each_get_their_own_rendezvous(runner: Runner, tmp_path: Path) -> None:
    handles = [_start_dist(runner, tmp_path), _start_dist(runner, tmp_path)]

    async def both() -> list[RunStatus]:
        return list(await asyncio.gather(*(runner.async_wait(h) for h in handles)))

    statuses = asyncio.run(asyncio.wait_for(both(), 90))
    run_ids: list[str] = []
    for handle, status in zip(handles, statuses, strict=True):
        out = (handle.run_dir / "stdout.log").read_text()
        assert (status.exit_code, status.reason) == (0, "exited"), (handle.run_dir / "stderr.log").read_text()
        lines = sorted(out.splitlines())
        assert [line.rsplit(" run=", 1)[0] for line in lines] == [
            "rank=0 world=2 sum=3.0", "rank=1 world=2 sum=3.0"]
        ids = {line.rsplit(" run=", 1)[1] for line in lines}
        assert len(ids) == 1
        run_ids.extend(ids)
    assert run_ids[0] != run_ids[1]


@has_torch
@pytest.mark.slow
def test_cancelling_a_torchrun_job_kills_workers_in_their_own_sessions(runner: Runner, tmp_path: Path) -> None:
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    handle = _start_dist(runner, tmp_path, str(pids_dir))
    wait_until(lambda: len(list(pids_dir.glob("rank*.pid"))) == 2, 60, "both workers to start")
    workers = [int(p.read_text()) for p in pids_dir.glob("rank*.pid")]
    assert all(os.getsid(pid) == pid for pid in workers)  # torchrun's start_new_session=True
    runner.cancel(handle)
    status = wait_status(runner, handle, 30)
    assert (status.reason, status.killed_by_watchdog) == ("cancelled", True)
    assert handle.job_pid is not None
    assert not any(psutil.pid_exists(pid) for pid in [handle.job_pid, *workers])


def test_a_job_with_the_watchdogs_own_ids_and_groups_needs_no_switch() -> None:
    """Root's job under a root daemon: nothing to switch, so the job starts without ``preexec_fn``
    (CPython's vfork path); any other uid, gid or group set still switches."""
    from dataclasses import replace

    from gpulayerd.runs import jobstart
    from gpulayerd.runs.account import JobUser

    me = JobUser(name="me", uid=os.geteuid(), gid=os.getegid(), groups=tuple(os.getgroups()), home="/",
                 shell="/bin/sh")
    assert jobstart._is_current(me)
    assert not jobstart._is_current(replace(me, groups=(*me.groups, 54321)))
    assert not jobstart._is_current(replace(me, uid=me.uid + 1))
    assert not jobstart._is_current(replace(me, gid=me.gid + 1))


def test_the_first_deadline_comes_from_the_launch_and_none_removes_it(runner: Runner) -> None:
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sleep", "1000"], job_env(job_id), None, time.monotonic() + 600)
    assert not (handle.run_dir / "deadline").exists()  # the first deadline makes no file
    launch = read_file(handle.run_dir / "launch.json")
    assert json.loads(launch)["deadline"] > time.monotonic() + 500
    runner.extend_deadline(handle, None)
    assert read_file(handle.run_dir / "deadline") == "none\n"
    runner.extend_deadline(handle, time.monotonic() - 1.0)  # already passed: stopped at once
    status = wait_status(runner, handle)
    assert (status.reason, status.killed_by_watchdog) == ("deadline", True)
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sh", "-c", "sleep 1.5"], job_env(job_id), None, time.monotonic() + 0.5)
    runner.extend_deadline(handle, None)  # no deadline any more: it runs to its end
    status = wait_status(runner, handle)
    assert (status.exit_code, status.reason) == (0, "exited")


DIE_BEFORE_JOB_JSON = '''\
"""Test fault injection: a watchdog (python -m gpulayerd.runs.watchdog) dies right after it spawned
the job, before job.json is in place."""
import os
_replace = os.replace


def _replace_then_die(src, dst, *a, **k):
    if str(dst).endswith("/job.json"):
        import time
        wait_for = os.environ.get("INJECT_WAIT_FOR")  # the job's first deed, so that it surely had started
        end = time.monotonic() + 20
        while wait_for and not os.path.exists(wait_for) and time.monotonic() < end:
            time.sleep(0.01)
        os._exit(9)
    return _replace(src, dst, *a, **k)


with open("/proc/self/cmdline", "rb") as f:
    if b"gpulayerd.runs.watchdog" in f.read():
        os.replace = _replace_then_die
'''


def test_a_watchdog_dead_before_it_recorded_the_start_leaves_no_job_running(
        runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between spawning the job and writing job.json: the start fails and the job it had
    spawned is found by its GPULAYER_JOB_ID/ATTEMPT and killed (its retry must not run beside it)."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(DIE_BEFORE_JOB_JSON)
    monkeypatch.setenv("PYTHONPATH", str(inject))
    runner = Runner(runs_dir, grace_s=GRACE_S, poll_interval_s=POLL_S)
    job_id = new_job_id()
    marker = tmp_path / "ran"
    monkeypatch.setenv("INJECT_WAIT_FOR", str(marker))  # the watchdog dies once the job surely started
    with pytest.raises(RunnerError, match=r"died before it recorded the job's start \(the job it had spawned was killed"):
        runner.start(job_id, 1, ["sh", "-c", f"touch {marker}; exec sleep 1000"], job_env(job_id), None, None)
    assert marker.exists()  # it had started...
    handle = runner.adopt(runner.run_dir(job_id, 1))
    assert handle is not None and handle.job_pid is None
    assert job_processes(handle) == []  # ...and nothing of it runs now


def test_cancel_after_a_watchdog_died_before_job_json_finds_the_job_by_its_tag(runner: Runner, tmp_path: Path) -> None:
    job_id = new_job_id()
    run_dir = runner.run_dir(job_id, 1)
    run_dir.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    record = record_of(gone.pid)
    assert record is not None
    gone.wait()  # a watchdog that is dead now
    claim_run_dir(run_dir, {"pid": gone.pid, "create_time": record.create_time, "start_ticks": record.start_ticks})
    orphan = subprocess.Popen(["sleep", "1000"], env=job_env(job_id), start_new_session=True)
    try:
        handle = runner.adopt(run_dir)
        assert handle is not None and handle.job_pgid is None
        assert runner.poll(handle).state is RunState.GONE
        runner.cancel(handle)
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()
        orphan.wait()


def test_a_symlinked_run_directory_gets_nothing_written_through_it(runner: Runner, runs_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_id = new_job_id()
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / job_id).symlink_to(elsewhere)
    with pytest.raises(RunnerError, match="is not a directory"):
        runner.start(job_id, 1, ["true"], job_env(job_id), None, None)
    assert list(elsewhere.iterdir()) == []  # no launch.json (the job's environment) went there
    other = new_job_id()
    (runs_dir / other).mkdir(mode=0o700)
    (runs_dir / other / "1").symlink_to(elsewhere)
    with pytest.raises(RunnerError, match="is not a directory"):
        runner.start(other, 1, ["true"], job_env(other), None, None)
    assert list(elsewhere.iterdir()) == []
