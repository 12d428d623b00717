"""Time limits and retries on failure (issue 33), with real daemons, watchdogs and jobs.

- A job with ``--time`` and ``--signal USR1@S`` gets USR1 once at S, saves its checkpoint
  (``examples/checkpoint_train.py``) and ends ``timeout`` at its limit; ``gpulayer run`` exits 124.
- The same with the daemon killed with -9 before the warning and not restarted: the watchdog
  holds the limit itself, signals the job and ends it (its ``exit.json`` says ``timeout``); restarted
  after the limit, the daemon ends the job ``timeout`` (not ``lost``).
- ``--retries 2 --retry-on failed`` runs an exit-1 job three times, each attempt keeping its log;
  with ``--retry-elsewhere`` and no other worker, the retry runs on the same one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fakes.daemon_process import Lab

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_train.py"


def test_a_time_limit_warns_once_then_ends_the_job_timeout(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1, cancel_grace_s=1.0)
    ckpt = d.work / "ckpt.json"
    started = time.monotonic()
    r = d.cli("run", "--time", "4s", "--signal", "USR1@2", "--", "python", str(EXAMPLE), "--checkpoint", str(ckpt),
              "--steps", "100000", "--step-s", "0.05", timeout_s=30)
    took = time.monotonic() - started
    assert r.returncode == 124, f"{r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.count("got SIGUSR1") == 1, r.stdout
    assert "checkpoint saved" in r.stdout
    assert json.loads(ckpt.read_text())["step"] > 0
    assert 4.0 <= took < 12.0, took
    job = d.all_jobs()[-1]
    assert job["status"] == "timeout", job
    assert job["exit_code"] == 143  # its own exit code: at the limit it saved again on SIGTERM and exited


def test_the_watchdog_holds_the_time_limit_after_a_kill_9_of_the_daemon(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1, cancel_grace_s=1.0)
    ckpt = d.work / "ckpt.json"
    job_id = d.submit("--time", "10s", "--signal", "USR1@5", "--", "python", str(EXAMPLE), "--checkpoint", str(ckpt),
                      "--steps", "100000", "--step-s", "0.05")
    d.wait_status(job_id, {"running"})
    run_dir = d.state_dir / "runs" / job_id / "1"
    began = json.loads((run_dir / "job.json").read_text())["started_at"]
    time.sleep(max(0.0, began + 3.0 - time.time()))
    d.kill()  # and not restarted
    end = time.monotonic() + 30
    while not (run_dir / "exit.json").exists():
        assert time.monotonic() < end, "the watchdog did not end the job"
        time.sleep(0.2)
    ended = json.loads((run_dir / "exit.json").read_text())
    assert ended["reason"] == "timeout", ended
    assert ended["exit_code"] == 143, ended
    # (job.json's started_at is written just after the watchdog's clock for the limit starts)
    assert 9.8 <= ended["ended_at"] - began < 14.0, ended
    out = (run_dir / "stdout.log").read_text()
    assert out.count("got SIGUSR1") == 1, out
    assert json.loads(ckpt.read_text())["step"] > 0


def test_retries_on_failure_stop_after_the_last_attempt(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1)
    job_id = d.submit("--retries", "2", "--retry-on", "failed", "--retry-backoff", "0.2s", "--",
                      "python", "-c", "import os, sys; print('attempt', os.environ['GPULAYER_ATTEMPT']); sys.exit(1)")
    job = d.wait_status(job_id, {"failed", "succeeded", "lost", "timeout"}, timeout_s=30)
    assert job.status == "failed" and job.attempt == 3, job
    shown = d.show(job_id)
    assert [a["exit_code"] for a in shown["attempts"]] == [1, 1, 1], shown["attempts"]
    for n in (1, 2, 3):  # every attempt keeps its log
        assert f"attempt {n}" in d.cli_ok("logs", "--attempt", str(n), job_id)


def test_a_retry_elsewhere_with_no_other_worker_runs_here_again(lab: Lab) -> None:
    """``--retry-elsewhere`` prefers another worker, it does not forbid this one: alone, the retry runs here."""
    d = lab.daemon(cpu_slots=1)
    job_id = d.submit("--retries", "1", "--retry-on", "failed", "--retry-backoff", "0.2s", "--retry-elsewhere",
                      "--", "python", "-c", "import sys; sys.exit(1)")
    job = d.wait_status(job_id, {"failed", "succeeded", "lost", "timeout"}, timeout_s=30)
    assert job.status == "failed" and job.attempt == 2, job
    assert [a["exit_code"] for a in d.show(job_id)["attempts"]] == [1, 1]


def test_bad_limits_are_refused_naming_the_field(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1, start=False)
    d.settings["max_time_limit"] = "1h"  # type: ignore[assignment]
    d.start()
    for flags, field in ((["--time", "0"], "time_limit"), (["--time", "soon"], "time_limit"),
                         (["--time", "2h"], "time_limit"), (["--time", "10s", "--signal", "KILL"], "signal"),
                         (["--time", "10s", "--signal", "USR1@10"], "signal"),
                         (["--retry-exit-codes", "300"], "retry_exit_codes"), (["--retry-on", "oops"], "retry_on")):
        r = d.cli("submit", *flags, "--", "true")
        assert r.returncode == 2, (flags, r.stdout, r.stderr)
        assert field in r.stderr, (flags, r.stderr)
    assert d.all_jobs() == []


def test_a_job_whose_daemon_was_down_at_its_limit_ends_timeout_after_the_restart(lab: Lab) -> None:
    """Attack review: the daemon killed with -9 and down when the limit passes; restarted, it reads
    the watchdog's end: the job ends ``timeout`` (not ``lost``), its own exit code kept."""
    d = lab.daemon(cpu_slots=1, cancel_grace_s=1.0)
    job_id = d.submit("--time", "3s", "--", "sleep", "60")
    d.wait_status(job_id, {"running"})
    run_dir = d.state_dir / "runs" / job_id / "1"
    d.kill()
    end = time.monotonic() + 30
    while not (run_dir / "exit.json").exists():
        assert time.monotonic() < end, "the watchdog did not end the job"
        time.sleep(0.2)
    d.start()
    job = d.wait_status(job_id, {"timeout", "lost", "failed", "succeeded"}, timeout_s=30.0)
    assert job.status == "timeout", job
    assert job.attempt == 1 and job.exit_code == -15, job  # sleep died of the SIGTERM at the limit
