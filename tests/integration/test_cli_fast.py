"""The CLI's fast path against a real daemon: a timeout is one line, a retry with the submission key
gets the same job (after SIGCONT and after a restart too), and ``jobs`` is filtered by the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from gpulayerd.cli.http import ApiRequestError, SyncClient

from .conftest import GPULAYER, Daemon, Lab

KEY = "6f1c2a1e-9a39-4c57-8a57-0c3a5b1f2d10"


def _cli(d: Daemon, *args: str, timeout_env: str = "5") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPULAYER_TIMEOUT": timeout_env}
    return subprocess.run([GPULAYER, "--state-dir", str(d.state_dir), *args], check=False, cwd=d.work,
                          env=env, capture_output=True, text=True, timeout=60)


def _count(d: Daemon) -> int:
    with SyncClient(d.socket_path) as c:
        return len(c.jobs())


def test_a_stopped_daemon_is_one_line_and_the_key_gets_the_same_job(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1)
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        r = _cli(d, "submit", "--key", KEY, "--name", "once", "--", "true", timeout_env="0.5")
        jobs = _cli(d, "jobs", timeout_env="0.5")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "gpulayer: gpulayerd did not answer within 0.5 s; the job may be queued: gpulayer jobs "
        f"(rerun with --key {KEY} to get it, never a second one)"]
    assert jobs.returncode == 1 and len(jobs.stderr.splitlines()) == 1 and "Traceback" not in jobs.stderr
    assert jobs.stderr.startswith("gpulayer: gpulayerd did not answer within 0.5 s; ")

    again = _cli(d, "submit", "--key", KEY, "--name", "once", "--json", "--", "true")
    assert again.returncode == 0, again.stderr
    job_id = json.loads(again.stdout)["id"]
    assert _count(d) == 1  # the stopped daemon stored the first request; the retry made no second job
    with SyncClient(d.socket_path) as c:
        with pytest.raises(ApiRequestError) as refused:  # the key names one submission: another spec is refused
            c.submit({"command": ["false"], "workdir": str(d.work)}, key=KEY)
        assert (refused.value.status, refused.value.code) == (409, "key_conflict")
        assert refused.value.message == f"key {KEY} was already used for job {job_id} with a different spec"
        assert c.submit({"command": ["true"], "workdir": str(d.work)}, key=KEY + "-2").id != job_id

        # The daemon filters and pages `jobs` and sends only the fields asked for.
        for _ in range(3):  # rejected at submit: finished at once
            c.submit({"command": ["true"], "workdir": str(d.work), "requirements": {"accelerator": "rocm"}})
        page = c.jobs(finished=2, states=["rejected"], fields=["status", "spec.user"])
        assert [set(j) for j in page] == [{"id", "status", "spec"}] * 2
        assert [j.status for j in page] == ["rejected"] * 2 and all(set(j.spec) == {"user"} for j in page)
        assert c.header("X-Gpulayer-Left-Out") == "1"
        assert c.jobs(user="nobody-such", fields=["status"]) == []
        assert [j.status for j in c.jobs(states=["rejected"], limit=1)] == ["rejected"]
