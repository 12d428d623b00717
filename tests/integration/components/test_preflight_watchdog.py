"""The watchdog's pre-flight check (issue 35) with real processes: it runs in the job's interpreter in
``/`` before the command, and a failure, a crash, a hang or a cancel during it ends the attempt
without the command ever running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayerd.runs.preflight import PREFLIGHT_FAILED, PREFLIGHT_LOG, PREFLIGHT_STOPPED, PreflightCheck
from gpulayerd.runs.runner import RunHandle, Runner, RunState

from .test_runner import GRACE_S, POLL_S, _kill_leftovers, job_env, new_job_id, read_file, wait_status, wait_until


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    """A runner on ``tmp_path/runs``; whatever its runs left is killed afterwards."""
    try:
        yield Runner(tmp_path / "runs", grace_s=GRACE_S, poll_interval_s=POLL_S)
    finally:
        _kill_leftovers(tmp_path / "runs")


def stand_in(tmp: Path, name: str, body: str) -> Path:
    """A site dir holding module ``name`` with ``body``; returns the dir (for PYTHONPATH)."""
    site = tmp / f"site-{name}"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(body)
    return site


def start(runner: Runner, tmp_path: Path, check: PreflightCheck, pythonpath: Path | None = None,
          command: str = "echo the command ran > ran") -> tuple[str, RunHandle]:
    job_id = new_job_id()
    env = job_env(job_id, {"PYTHONPATH": str(pythonpath)} if pythonpath else None)
    handle = runner.start(job_id, 1, ["sh", "-c", command], env, tmp_path, preflight=check)
    return job_id, handle


def test_a_passing_check_runs_the_command_and_a_failing_one_does_not(runner: Runner, tmp_path: Path) -> None:
    good = stand_in(tmp_path, "fwgood", "import os, sys\nsys.stderr.write('cwd=' + os.getcwd())\n")
    _, handle = start(runner, tmp_path, PreflightCheck(sys.executable, ("fwgood",)), good)
    status = wait_status(runner, handle)
    assert (status.reason, status.exit_code) == ("exited", 0)
    assert (tmp_path / "ran").read_text() == "the command ran\n"
    assert (handle.run_dir / PREFLIGHT_LOG).read_text() == "cwd=/"  # never the workdir

    (tmp_path / "ran").unlink()
    bad = stand_in(tmp_path, "fwbad", "raise ImportError('undefined symbol: __nvJitLinkComplete_12_4')\n")
    _, handle = start(runner, tmp_path, PreflightCheck(sys.executable, ("fwbad",)), bad)
    status = wait_status(runner, handle)
    assert (status.state, status.reason, status.exit_code) == (RunState.EXITED, PREFLIGHT_FAILED, None)
    assert status.detail == "fwbad: ImportError: undefined symbol: __nvJitLinkComplete_12_4"
    assert not (tmp_path / "ran").exists()
    assert "Traceback" in (handle.run_dir / PREFLIGHT_LOG).read_text()  # the whole error is kept beside the run


def test_the_check_runs_in_a_neutral_directory_not_the_workdir(runner: Runner, tmp_path: Path) -> None:
    """A broken ``fwx/`` folder in the workdir is not what the check imports (cwd is /)."""
    stand_in(tmp_path / "wd-parent", "fwx", "raise ImportError('the workdir copy')\n")
    workdir = tmp_path / "wd-parent" / "site-fwx"
    real = stand_in(tmp_path, "fwx", "")
    job_id = new_job_id()
    handle = runner.start(job_id, 1, ["sh", "-c", "echo ok"], job_env(job_id, {"PYTHONPATH": str(real)}), workdir,
                          preflight=PreflightCheck(sys.executable, ("fwx",)))
    assert wait_status(runner, handle).reason == "exited"


def test_a_crash_and_a_hang_are_failures_too(runner: Runner, tmp_path: Path) -> None:
    crash = stand_in(tmp_path, "fwcrash", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    _, handle = start(runner, tmp_path, PreflightCheck(sys.executable, ("fwcrash",)), crash)
    status = wait_status(runner, handle)
    # A crash or a hang moves the job but marks nothing (the job's user can kill or stop its own check).
    assert (status.reason, status.detail) == (PREFLIGHT_STOPPED,
                                              f"fwcrash: the check was killed by signal {int(signal.SIGSEGV)}")

    hang = stand_in(tmp_path, "fwhang", "import time\ntime.sleep(1000)\n")
    began = time.monotonic()
    _, handle = start(runner, tmp_path, PreflightCheck(sys.executable, ("fwhang",), timeout_s=0.5), hang)
    status = wait_status(runner, handle)
    assert (status.reason, status.detail) == (PREFLIGHT_STOPPED, "fwhang: the check took over 0.5s")
    assert time.monotonic() - began < 8.0
    assert not (tmp_path / "ran").exists()


def test_a_cancel_during_the_check_cancels_the_attempt(runner: Runner, tmp_path: Path) -> None:
    slow = stand_in(tmp_path, "fwslow", "import time\nprint('importing', flush=True)\ntime.sleep(1000)\n")
    _, handle = start(runner, tmp_path, PreflightCheck(sys.executable, ("fwslow",)), slow)
    assert handle.job_pid is not None  # the check is the attempt's process meanwhile
    runner.cancel(handle)
    status = wait_status(runner, handle)
    assert (status.reason, status.killed_by_watchdog) == ("cancelled", True)
    assert "during the pre-flight check" in status.detail
    assert not (tmp_path / "ran").exists()
    wait_until(lambda: read_file(handle.run_dir / "exit.json") != "", 5, "exit.json")


def test_the_users_own_site_packages_do_not_make_the_check_fail(runner: Runner, tmp_path: Path) -> None:
    """The check runs with the job's HOME (the user's): a ``.pth`` file or a module in the user's
    ``~/.local/lib/pythonX.Y/site-packages`` must not shadow the environment's framework, or one user
    marks the environment broken for everyone."""
    python = getattr(sys, "_base_executable", sys.executable)  # a venv disables the user site; its base does not
    probe = subprocess.run([python, "-c", "import site; print(site.ENABLE_USER_SITE)"], capture_output=True,
                           text=True, env={"HOME": str(tmp_path)}, check=False)
    assert probe.stdout.strip() == "True", f"{python} has no user site: this test needs an interpreter that has one"
    home = tmp_path / "home"
    user_site = home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    user_site.mkdir(parents=True)
    evil = stand_in(tmp_path, "fwshadow", "raise ImportError('the user site copy')\n")
    (user_site / "zz.pth").write_text(f"import sys; sys.path.insert(0, {str(evil)!r})\n")
    real = stand_in(tmp_path / "env", "fwshadow", "")
    job_id = new_job_id()
    env = job_env(job_id, {"PYTHONPATH": str(real), "HOME": str(home)})
    handle = runner.start(job_id, 1, ["sh", "-c", "echo ok"], env, tmp_path,
                          preflight=PreflightCheck(python, ("fwshadow",)))
    status = wait_status(runner, handle)
    assert status.reason == "exited", status.detail
