"""``gpulayer run`` (submit, stream, exit code, Ctrl-C cancels) and ``gpulayer jobs`` at 80 columns,
against one real CPU daemon shared by the module."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from gpulayerd import text
from tests.integration.conftest import GPULAYER, Daemon, clean_env

CJK = "訓練ジョブ長い名前の実験その一二三四五六七八九十"


def _run(d: Daemon, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([GPULAYER, "--state-dir", str(d.state_dir), "run", *args], cwd=d.work,
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_streams_the_output_and_exits_with_the_jobs_exit_code(cpu_daemon: Daemon) -> None:
    p = _run(cpu_daemon, "--", sys.executable, "-c", "import sys; print(1); sys.exit(3)")
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (3, "1\n"), err
    assert "ran on" in err or "runs on" in err, err
    assert "failed: exited 3" in err


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "cancel requested"),
                                                    (signal.SIGTERM, 143, "SIGTERM: job")])
def test_sigint_or_sigterm_cancels_the_job(cpu_daemon: Daemon, sig: signal.Signals, code: int, said: str) -> None:
    p = _run(cpu_daemon, "--name", "sleeper", "--", sys.executable, "-c",
             "import time; print('started', flush=True); time.sleep(60)")
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == "started\n"  # it runs, and gpulayer run streams it
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    job_id = next(line.split()[3] for line in err.splitlines() if "submitted" in line)
    assert cpu_daemon.job(job_id).status == "cancelled"
    assert said in err


def test_jobs_at_80_columns_and_a_name_with_an_escape(cpu_daemon: Daemon) -> None:
    r = cpu_daemon.cli("submit", "--name", "a\x1b[31mb", "--", "true")
    assert r.returncode == 2, r.stderr
    assert "name: must not contain control characters" in r.stderr and "\x1b" not in r.stderr
    for name in ("n" * 70, CJK):  # wants a GPU: stays queued with its reason
        cpu_daemon.submit("--name", name, "--accelerator", "cuda", "--", "python", "train.py")
    env = {**clean_env(), "COLUMNS": "80"}
    r = subprocess.run([GPULAYER, "--state-dir", str(cpu_daemon.state_dir), "jobs"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) >= 3
    assert [line for line in lines if text.width(line) > 80] == []
    assert sum("Accelerator:" in line for line in lines) >= 2  # the reason's code survives the cut


def test_jobs_says_how_many_older_finished_jobs_it_hides(cpu_daemon: Daemon) -> None:
    """Finished jobs beyond the 20 latest are hidden from `gpulayer jobs`, and it says how many."""
    ids = [cpu_daemon.submit("--name", f"done-{i}", "--", "true") for i in range(22)]
    for job_id in ids:
        cpu_daemon.wait_status(job_id, {"succeeded"}, timeout_s=60)
    finished = [j for j in cpu_daemon.cli_json("jobs", "--all", "--json")
                if j["status"] in ("succeeded", "failed", "cancelled", "rejected", "lost")]
    r = cpu_daemon.cli("jobs")
    assert r.returncode == 0, r.stderr
    hidden = len(finished) - 20
    assert f"{hidden} older jobs hidden (--all)" in r.stderr, r.stderr
    assert "done-0 " not in r.stdout and "done-21" in r.stdout  # the oldest hidden, the latest shown
    assert "hidden" not in cpu_daemon.cli("jobs", "--all").stderr
