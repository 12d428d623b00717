"""gpulayerd end to end: real daemons, real jobs, the ``gpulayer`` CLI, fake GPUs.

CPU-only behaviour shares one daemon per module (``cpu_daemon``); every test that needs
fake GPUs or a crash gets its own ``lab``. Jobs are ``sh``/plain
``python -c`` (no torch import), and a job that must stay running waits for a "release"
file the test creates, so no test depends on a guessed duration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.cli.render import render_explanation
from gpulayerd.models import ExplanationModel, JobView
from gpulayerd.runs.devicelock import DeviceLocks

from .conftest import (
    GPULAYER,
    GPULAYERD,
    TERMINAL,
    Daemon,
    Lab,
    clean_env,
    is_dead,
    live_group_members,
    wait_until,
)

SHOW_ENV = 'import os; print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), repr(os.environ.get("CUDA_DEVICE_ORDER")))'


def hold(release: str, before: str = 'echo "$CUDA_VISIBLE_DEVICES"') -> list[str]:
    """A job that runs ``before`` and then waits until the file ``release`` exists (in its workdir)."""
    return ["--", "sh", "-c", f'{before}; while [ ! -e {release} ]; do sleep 0.05; done']


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def placement_of(job: JobView) -> tuple[list[int], list[str | None]]:
    attempt = job.attempts[-1]
    assert attempt.placement is not None, job
    return attempt.placement.device_indices, attempt.placement.device_uuids


# --------------------------------------------------------------------- submit, run, logs


def test_exit_0_succeeds_and_logs_print_stdout_and_stderr(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--name", "hello", "--", "sh", "-c", "echo hello; echo world; echo oops >&2; exit 0")
    job = d.wait_status(job_id, TERMINAL)
    assert (job.status, job.exit_code) == ("succeeded", 0)
    assert [a.exit_code for a in job.attempts] == [0]

    r = d.cli("logs", job_id)
    note = f"(stderr: 5 B: gpulayer logs --stderr {job_id})\n"  # stdout was not empty: stderr's size
    assert (r.returncode, r.stdout, r.stderr) == (0, "hello\nworld\n", note)
    r = d.cli("logs", "--stderr", job_id)
    assert (r.returncode, r.stdout, r.stderr) == (0, "oops\n", "")
    r = d.cli("logs", "-f", job_id)  # ended: -f returns at once, saying how it ended
    assert (r.returncode, r.stdout, r.stderr) == (0, "hello\nworld\n", f"{note}job {job_id} succeeded\n")

    text = d.cli_ok("show", job_id)
    assert "job " + job_id + " (hello)" in text
    assert "state:     succeeded" in text and "exit code: 0" in text
    listed = {j["id"]: j for j in d.all_jobs()}
    assert listed[job_id]["status"] == "succeeded"


def test_exit_3_fails_with_exit_code_3(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--", "sh", "-c", "echo about to fail; exit 3")
    job = d.wait_status(job_id, TERMINAL)
    assert (job.status, job.exit_code) == ("failed", 3)
    assert [(a.state, a.exit_code) for a in job.attempts] == [("exited", 3)]
    shown = d.show(job_id)
    assert (shown["status"], shown["exit_code"]) == ("failed", 3)
    assert [a["exit_code"] for a in shown["attempts"]] == [3]
    assert d.cli_ok("logs", job_id) == "about to fail\n"


def test_failed_job_logs_show_stderr_where_it_ran_and_how_it_ended(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--", "sh", "-c", "echo 'Traceback: boom' >&2; exit 3")
    assert d.wait_status(job_id, TERMINAL).status == "failed"
    # stdout is empty: the job's stderr follows (on stderr).
    r = d.cli("logs", job_id)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "Traceback: boom\n")
    r = d.cli("logs", "-f", job_id)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"Traceback: boom\njob {job_id} failed: exited 3\n")
    # WHERE is kept once the job ended: the API, the jobs table and show.
    health = d.call(lambda c: c.health())
    (listed,) = [j for j in d.all_jobs() if j["id"] == job_id]
    assert (listed["where_node"], listed["where_name"], listed["where_devices"]) == (
        health.node_id, health.hostname, [])
    row = next(line for line in d.cli_ok("jobs", "--all").splitlines() if line.startswith(job_id)).split()
    assert "failed" in row and health.hostname in row, row
    text = d.cli_ok("show", job_id)
    assert f"  where:     {health.hostname}\n" in text
    assert f"  #1 on {health.hostname} exited 3 after " in text


def test_killed_by_a_signal_fails_with_negative_exit_code(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--", "sh", "-c", "kill -KILL $$")
    job = d.wait_status(job_id, TERMINAL)
    assert (job.status, job.exit_code) == ("failed", -9)
    shown = d.cli_ok("show", job_id)
    assert "killed by signal 9 (SIGKILL)" in shown, shown  # not "exited with code -9"


def test_command_not_found_fails_with_the_reason(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--retries", "2", "--", "no-such-program-gpulayer-test")
    job = d.wait_status(job_id, TERMINAL)
    assert (job.status, job.exit_code) == ("failed", 127)  # the shell's code for a command not found
    assert job.reason == "could not start: command not found: no-such-program-gpulayer-test"  # the cause first
    assert job.attempt == 1  # not retried: it can never start
    run = d.cli("run", "--", "/nonexistent/cmd")
    assert run.returncode == 127, run
    assert run.stderr.rstrip().endswith("failed: could not start: command not found: /nonexistent/cmd (exit 127)"), \
        run.stderr


def test_logs_keep_multibyte_characters_across_chunks(cpu_daemon: Daemon) -> None:
    # The daemon serves a log in chunks of 1 MiB; a character must not be cut in two.
    d = cpu_daemon
    job_id = d.submit("--", "python", "-c", "import sys; sys.stdout.write('a' * (2**20 - 1) + 'é\\n')")
    assert d.wait_status(job_id, TERMINAL).status == "succeeded"
    out = d.cli_ok("logs", job_id)
    assert out[-3:] == "aé\n", f"the log ends with {out[-8:]!r}"
    assert out == "a" * (2**20 - 1) + "é\n", "the log differs from what the job wrote"


def test_python_command_runs_with_the_daemons_interpreter(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--", "python", "-c", "import sys; print(sys.argv[1:]); raise SystemExit(5)", "a b", "c")
    job = d.wait_status(job_id, TERMINAL)
    assert (job.status, job.exit_code) == ("failed", 5)
    assert d.cli_ok("logs", job_id) == "['a b', 'c']\n"


def test_logs_follow_prints_until_the_job_ends(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    job_id = d.submit("--", "sh", "-c",
                      "echo first; while [ ! -e release-follow ]; do sleep 0.05; done; echo second; exit 0")
    follow = subprocess.Popen([GPULAYER, "--state-dir", str(d.state_dir), "logs", "-f", job_id],
                              cwd=d.work, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        d.wait_status(job_id, {"running"})
        wait_until(lambda: d.cli_ok("logs", job_id) == "first\n", 10, "the first line in the log")
        time.sleep(1.0)
        assert follow.poll() is None, "logs -f returned while the job was still running"
        (d.work / "release-follow").touch()
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert (follow.returncode, out) == (0, "first\nsecond\n")
    assert err.endswith(f"job {job_id} succeeded\n"), err
    assert d.job(job_id).status == "succeeded"


def test_logs_follow_says_why_a_job_waits(cpu_daemon: Daemon) -> None:
    d = cpu_daemon  # two CPU slots: both held, a third job waits
    holders = [d.submit(*hold("release-waits", "true")) for _ in range(2)]
    for h in holders:
        d.wait_status(h, {"running"})
    job_id = d.submit("--", "sh", "-c", "echo done")
    follow = subprocess.Popen([GPULAYER, "--state-dir", str(d.state_dir), "logs", "-f", job_id],
                              cwd=d.work, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        waiting = d.wait_reason(job_id, lambda j: j.reason != "waiting for the scheduler")
        assert waiting.status == "queued", waiting
        time.sleep(1.0)  # logs -f polls every 0.3 s
        assert follow.poll() is None, "logs -f returned while the job waited"
        (d.work / "release-waits").touch()
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    lines = err.splitlines()
    assert (follow.returncode, out, lines[-1]) == (0, "done\n", f"job {job_id} succeeded"), err
    said = [line for line in lines[:-1] if line.startswith(f"job {job_id} queued: ")]
    assert f"job {job_id} queued: {waiting.reason}" in said, err
    assert len(said) == len(set(said)) == len(lines) - 1, err  # each reason once, nothing else


# --------------------------------------------------------------------------------- cancel


@pytest.mark.parametrize(
    "prefix",
    ["", "trap '' TERM; "],  # the second ignores SIGTERM (and so does its background child): SIGKILL after grace
    ids=["sigterm", "ignores-sigterm"],
)
def test_cancel_running_job_kills_its_whole_process_group(cpu_daemon: Daemon, prefix: str) -> None:
    d = cpu_daemon
    pidfile = d.work / f"grandchild-{len(prefix)}.pid"
    job_id = d.submit("--", "sh", "-c", f"{prefix}sleep 1000 & echo $! > {pidfile.name}; echo started; sleep 1000")
    job = d.wait_status(job_id, {"running"})
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 10, "the grandchild's pid file")
    grandchild = int(pidfile.read_text())
    run_dir = Path(job.attempts[-1].run_dir or "")
    job_rec = read_json(run_dir / "job.json")
    watchdog_rec = read_json(run_dir / "watchdog.json")
    pgid = job_rec["pgid"]
    job_pid = job_rec["pid"]
    assert os.getpgid(grandchild) == pgid  # the background child stayed in the job's group
    assert not is_dead(job_pid) and not is_dead(grandchild)

    r = d.cli("cancel", job_id)
    assert r.returncode == 0, r.stderr
    assert job_id in r.stdout
    job = d.wait_status(job_id, TERMINAL, timeout_s=20)
    assert job.status == "cancelled", (job.status, job.reason)

    wait_until(lambda: is_dead(job_pid) and is_dead(grandchild), 10, "the job and its grandchild to die")
    assert live_group_members(pgid) == []
    wait_until(lambda: is_dead(watchdog_rec["pid"]), 10, "the watchdog to exit")
    assert read_json(run_dir / "exit.json")["reason"] == "cancelled"
    assert d.cli_ok("logs", job_id) == "started\n"
    # Cancelling again is harmless and changes nothing.
    again = d.cli("cancel", "--json", job_id)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "cancelled"


def test_cancel_queued_job_never_runs(cpu_daemon: Daemon) -> None:
    d = cpu_daemon
    # A CUDA job on a CPU-only machine waits for ever; cancelling it ends it at once.
    job_id = d.submit("--accelerator", "cuda", "--", "sh", "-c", "touch must-not-exist")
    d.wait_reason(job_id, lambda j: j.reason != "waiting for the scheduler")
    assert d.job(job_id).status == "queued"
    assert d.cli("cancel", job_id).returncode == 0
    job = d.wait_status(job_id, {"cancelled"}, timeout_s=5)
    assert job.attempts == []
    assert not (d.work / "must-not-exist").exists()


# ------------------------------------------------------------------------------- rejected


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--accelerator", "rocm"], ["rocm", "detection"]),
        (["--accelerator", "mps", "--nproc", "2"], ["distributed", "mps"]),
        (["--nproc", "2", "--backend", "nccl"], ["nccl", "cpu"]),
    ],
    ids=["rocm-detection-only", "mps-distributed", "cpu-nccl"],
)
def test_rejected_at_submit_with_reason(cpu_daemon: Daemon, flags: list[str], words: list[str]) -> None:
    d = cpu_daemon
    r = d.cli("submit", *flags, "--", "python", "train.py")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "rejected" in r.stdout
    job_id = r.stdout.split()[2].rstrip(":")  # "submitted job ID: rejected"
    job = d.job(job_id)
    assert job.status == "rejected"
    for w in words:
        assert w in job.reason, job.reason

    assert job.attempts == []
    text = d.cli_ok("show", job_id)
    assert "state:     rejected" in text
    assert job.reason in text
    listed = [j for j in d.all_jobs() if j["id"] == job_id]
    assert [(j["status"], j["reason"]) for j in listed] == [("rejected", job.reason)]
    # It stays rejected: the scheduler never picks it up.
    time.sleep(0.3)
    assert d.job(job_id).status == "rejected"


# ---------------------------------------------------------------------------- fake GPUs


def test_cuda_and_cpu_jobs_see_exactly_their_devices(lab: Lab) -> None:
    fake = lab.fake_gpus([16384, 81920, 40960, 24576])  # 16, 80, 40, 24 GiB
    # The daemon's own CUDA_VISIBLE_DEVICES restricts what it schedules (GPUs 1 and 3, in nvidia-smi's
    # PCI order whatever CUDA_DEVICE_ORDER says) but never reaches a job as it is.
    d = lab.daemon(fake=fake, env={"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    devices = d.call(lambda c: c.devices())
    assert [(x.index, x.uuid) for x in devices.devices] == [(g.index, g.uuid) for g in fake.gpus]
    assert [x.state.value for x in devices.devices] == ["excluded", "ok", "excluded", "ok"]

    cpu = d.submit("--env", "CUDA_VISIBLE_DEVICES=0", "--", "python", "-c",
                   'import os; print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), '
                   'repr(os.environ.get("HIP_VISIBLE_DEVICES")))')
    one = d.submit("--accelerator", "cuda", "--", "python", "-c", SHOW_ENV)
    two = d.submit("--accelerator", "cuda", "--gpus", "2", "--gpu-memory-gb", "20", "--", "python", "-c", SHOW_ENV)

    job = d.wait_status(cpu, TERMINAL)
    assert job.status == "succeeded"
    assert d.cli_ok("logs", cpu) == "'' ''\n"
    assert placement_of(job) == ([], [])

    for job_id, count, min_bytes in ((one, 1, 0), (two, 2, 20 * 10**9)):
        job = d.wait_status(job_id, TERMINAL)
        assert job.status == "succeeded", job.reason
        shown = d.show(job_id)
        indices = shown["attempts"][-1]["placement"]["device_indices"]
        uuids = shown["attempts"][-1]["placement"]["device_uuids"]
        assert len(indices) == count
        assert uuids == [fake.uuid_of(i) for i in indices]
        assert all(fake.gpus[i].memory_mib * 2**20 >= min_bytes for i in indices)
        assert set(indices) <= {1, 3}  # never a GPU the daemon's own variable keeps out
        visible = ",".join(str(i) for i in indices)
        assert d.cli_ok("logs", job_id) == f"{visible!r} 'PCI_BUS_ID'\n"
    assert f"GPU {visible}" in d.cli_ok("show", two)


def test_two_cuda_jobs_never_share_a_gpu_on_one_gpu_host(lab: Lab) -> None:
    fake = lab.fake_gpus([24576])
    d = lab.daemon(fake=fake)
    first = d.submit("--accelerator", "cuda", "--name", "first", *hold("release-1"))
    d.wait_status(first, {"running"})
    second = d.submit("--accelerator", "cuda", "--name", "second", *hold("release-2"))
    waiting = d.wait_reason(second, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert waiting.reason.startswith("Resources: GPU 0 is granted to job ") and first in waiting.reason, waiting.reason
    assert f"job {first} (first, " in waiting.reason, waiting.reason  # the holder by its name and user too
    assert waiting.attempts == []

    # gpulayer jobs / show say why it waits.
    row = next(j for j in d.cli_json("jobs", "--json") if j["id"] == second)
    assert row["status"] == "queued" and "granted" in row["reason"]
    table = d.cli_ok("jobs")
    assert second in table and "queued" in table
    shown = d.cli_ok("show", second)
    assert "why it waits:" in shown and "granted" in shown

    # explain: the worker x requirement table and the verdict; --json is the same structure.
    r = d.cli("explain", second)
    assert r.returncode == 0, r.stderr
    for word in ("REQUIREMENT", "WANTED", "FOUND", "accelerator", "gpu_count", "verdict: fits but busy"):
        assert word in r.stdout, r.stdout
    model = ExplanationModel.model_validate_json(d.cli_ok("explain", "--json", second))
    assert model.job_id == second and model.verdict == "fits but busy"
    assert model.placement is None
    (worker,) = model.workers
    assert worker.state == "fits_but_busy"
    assert {c.requirement for c in worker.checks} >= {"accelerator", "gpu_count"}
    assert any("granted" in rej.message and first in rej.message for rej in worker.rejections)
    def steady(text: str) -> list[str]:  # (the holders' elapsed times move between the two calls)
        return [line for line in text.splitlines() if not line.startswith(("held by:", "estimate:"))]

    assert steady(r.stdout.rstrip("\n")) == steady(render_explanation(model, title=f"job {model.job_id}"))
    for check in worker.checks:
        assert check.requirement in r.stdout

    (d.work / "release-1").touch()
    assert d.wait_status(first, TERMINAL).status == "succeeded"
    job = d.wait_status(second, {"running", *TERMINAL})
    assert placement_of(job)[0] == [0]
    (d.work / "release-2").touch()
    assert d.wait_status(second, TERMINAL).status == "succeeded"
    assert d.cli_ok("logs", second) == "0\n"
    first_ended = d.job(first).attempts[-1].ended_at
    second_started = d.job(second).attempts[-1].started_at
    assert first_ended is not None and second_started is not None and second_started >= first_ended


def test_two_cuda_jobs_on_two_gpus_get_different_devices(lab: Lab) -> None:
    fake = lab.fake_gpus([24576, 24576])
    d = lab.daemon(fake=fake)
    a = d.submit("--accelerator", "cuda", *hold("release"))
    b = d.submit("--accelerator", "cuda", *hold("release"))
    ja = d.wait_status(a, {"running"})
    jb = d.wait_status(b, {"running"})
    (ia,), (ib,) = placement_of(ja)[0], placement_of(jb)[0]
    assert {ia, ib} == {0, 1}
    assert placement_of(ja)[1] != placement_of(jb)[1]
    wait_until(lambda: d.cli_ok("logs", a) != "" and d.cli_ok("logs", b) != "", 10, "both jobs' output")
    assert (d.cli_ok("logs", a), d.cli_ok("logs", b)) == (f"{ia}\n", f"{ib}\n")
    (d.work / "release").touch()
    assert d.wait_status(a, TERMINAL).status == "succeeded"
    assert d.wait_status(b, TERMINAL).status == "succeeded"
    # WHERE keeps each finished job's GPU.
    listed = {j["id"]: j["where_devices"] for j in d.all_jobs()}
    assert (listed[a], listed[b]) == ([ia], [ib])
    assert f" GPU {ia} exited 0 after " in d.cli_ok("show", a)


def test_gpu_with_a_foreign_process_is_busy(lab: Lab) -> None:
    fake = lab.fake_gpus([24576, 81920])  # GPU 0 is the best fit when free
    foreign = lab.spawn(["sleep", "1000"])
    fake.set_apps([(0, foreign.pid)])
    d = lab.daemon(fake=fake)

    first = d.submit("--accelerator", "cuda", "--", "python", "-c", SHOW_ENV)
    job = d.wait_status(first, TERMINAL)
    assert job.status == "succeeded"
    assert placement_of(job)[0] == [1]
    assert d.cli_ok("logs", first) == "'1' 'PCI_BUS_ID'\n"

    fake.set_apps([(0, foreign.pid), (1, foreign.pid)])
    second = d.submit("--accelerator", "cuda", "--", "python", "-c", SHOW_ENV)
    waiting = d.wait_reason(second, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert str(foreign.pid) in waiting.reason and "busy" in waiting.reason, waiting.reason
    model = ExplanationModel.model_validate_json(d.cli_ok("explain", "--json", second))
    assert model.verdict == "fits but busy"
    assert sum(str(foreign.pid) in r.message for w in model.workers for r in w.rejections) == 2
    assert f"pid {foreign.pid}" in d.cli_ok("explain", second)

    # The foreign process goes away: the job runs on the best fit again.
    foreign.kill()
    foreign.wait()
    fake.set_apps([])
    job = d.wait_status(second, TERMINAL)
    assert job.status == "succeeded"
    assert placement_of(job)[0] == [0]


def test_restarted_daemon_readopts_a_running_job_that_keeps_its_gpu(lab: Lab) -> None:
    fake = lab.fake_gpus([24576])
    d = lab.daemon(fake=fake)
    a = d.submit("--accelerator", "cuda", *hold("release-a"))
    job = d.wait_status(a, {"running"})
    job_pid = read_json(Path(job.attempts[-1].run_dir or "") / "job.json")["pid"]
    assert d.stop() == 0
    assert not is_dead(job_pid)  # jobs outlive their daemon, under their watchdogs

    d.start()
    job = d.job(a)
    assert job.status == "running"
    assert any(e.kind == "adopted" for e in job.events), [e.kind for e in job.events]
    b = d.submit("--accelerator", "cuda", *hold("release-b"))
    waiting = d.wait_reason(b, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued" and "granted" in waiting.reason, waiting.reason

    (d.work / "release-a").touch()
    assert d.wait_status(a, TERMINAL).status == "succeeded"
    assert placement_of(d.wait_status(b, {"running", *TERMINAL}))[0] == [0]
    (d.work / "release-b").touch()
    assert d.wait_status(b, TERMINAL).status == "succeeded"


# ------------------------------------------------------------------------ two daemons


def test_a_gpu_whose_device_lock_another_process_holds_is_not_granted_until_it_lets_go(lab: Lab) -> None:
    # One gpulayerd per machine (tests/integration/test_one_daemon.py): what else holds a device
    # lock is a job's watchdog outliving its daemon's records. A process holding the lock file
    # stands for it here.
    fake = lab.fake_gpus([24576])
    d = lab.daemon(fake=fake)
    lock_file = DeviceLocks(d.lock_dir).path_for(fake.uuid_of(0))
    holder = lab.spawn([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY "
                        "| os.O_CREAT, 0o666); fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[2], 'w').close(); "
                        "time.sleep(600)", str(lock_file), str(lab.root / "holding")])
    wait_until((lab.root / "holding").exists, 10.0, "the other process to hold the device lock")

    job = d.submit("--accelerator", "cuda", *hold("release"))
    waiting = d.wait_reason(job, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert "another gpulayerd" in waiting.reason, waiting.reason
    assert "another gpulayerd" in d.cli_ok("explain", job)
    time.sleep(1.0)  # a few scheduler passes
    assert d.job(job).status == "queued"

    holder.kill()
    holder.wait()
    running = d.wait_status(job, {"running", *TERMINAL})
    assert placement_of(running)[1] == [fake.uuid_of(0)]
    (d.work / "release").touch()
    assert d.wait_status(job, TERMINAL).status == "succeeded"


# -------------------------------------------------------------------- daemon not running

DAEMON_COMMANDS = [
    ["jobs"],
    ["jobs", "--json"],
    ["show", "abc123"],
    ["logs", "abc123"],
    ["logs", "-f", "abc123"],
    ["cancel", "abc123"],
    ["explain", "abc123"],
    ["submit", "--", "true"],
]


def assert_not_running_message(r: subprocess.CompletedProcess[str], state_dir: Path) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "not running" in lines[0]
    assert f"gpulayerd --state-dir {state_dir}" in lines[0]


@pytest.mark.parametrize("command", DAEMON_COMMANDS, ids="-".join)
def test_daemon_not_running_exits_1_with_how_to_start_it(tmp_path: Path, command: list[str]) -> None:
    state = tmp_path / "state"
    r = subprocess.run([GPULAYER, "--state-dir", str(state), *command], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=60, check=False)
    assert_not_running_message(r, state)


def test_daemon_not_running_via_env_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**clean_env(), "GPULAYER_STATE_DIR": str(state)}
    r = subprocess.run([GPULAYER, "jobs"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60, check=False)
    assert_not_running_message(r, state)


def test_crashed_daemon_leaves_a_dead_socket_still_one_line(lab: Lab) -> None:
    d = lab.daemon()
    assert d.cli("jobs").returncode == 0
    d.kill()
    assert d.socket_path.exists()  # SIGKILL leaves the socket file behind
    for command in (["jobs"], ["submit", "--", "true"]):
        assert_not_running_message(d.cli(*command), d.state_dir)
    # A restarted daemon on the same state dir serves again.
    d.start()
    assert d.cli_json("jobs", "--json", "--all") == []


def test_watchdog_killed_under_a_live_job_never_leaves_two_copies(cpu_daemon: Daemon) -> None:
    """The watchdog dies (OOM killer, kill -9) while its job runs: the daemon stops the
    orphaned job before the attempt is declared lost, so a retry never runs beside it."""
    d = cpu_daemon
    job_id = d.submit("--retries", "1", "--", "sh", "-c",
                      'echo "$GPULAYER_ATTEMPT" >> attempts.log; sleep 1000')
    job = d.wait_status(job_id, {"running"})
    run_dir = Path(job.attempts[-1].run_dir or "")
    wait_until((run_dir / "job.json").exists, 10, "job.json")
    first_job_pid = read_json(run_dir / "job.json")["pid"]
    os.kill(read_json(run_dir / "watchdog.json")["pid"], signal.SIGKILL)
    wait_until(lambda: is_dead(first_job_pid), 30, "the orphaned first attempt to be stopped")
    job = d.wait_status(job_id, {"running"}, timeout_s=30)
    wait_until(lambda: len(d.job(job_id).attempts) == 2, 30, "the retry")
    assert d.job(job_id).attempts[0].state == "lost"
    assert "stopped" in d.job(job_id).attempts[0].reason
    assert is_dead(first_job_pid)  # never two copies at once
    d.cli_ok("cancel", job_id)
    d.wait_status(job_id, {"cancelled"}, timeout_s=30)


def test_a_gpu_whose_memory_is_used_by_processes_not_listed_is_busy(lab: Lab) -> None:
    """bug-44's kind: inside a container (its own PID namespace) nvidia-smi shows GPU 0 with
    7325 MiB of 24564 MiB used and no process; it is busy (memory in use by processes not visible
    here), never granted, and free again once its memory.used is back under 512 MiB."""
    fake = lab.fake_gpus([24564, 24564])
    fake.set_used(0, 7325)
    fake.set_used(1, 1)
    d = lab.daemon(fake=fake, probe_interval_s=0.5)
    devices = d.cli_ok("devices")
    assert "busy: memory in use by processes not visible here" in devices, devices

    both = d.submit("--accelerator", "cuda", "--gpus", "2", "--gpu-memory-gb", "20", *hold("release"))
    waiting = d.wait_reason(both, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert "memory in use by processes not visible here (memory.used 7325 MiB" in waiting.reason, waiting.reason
    one = d.submit("--accelerator", "cuda", "--gpu-memory-gb", "20", *hold("release"))
    job = d.wait_status(one, {"running"})
    assert placement_of(job)[0] == [1]  # never GPU 0

    fake.set_used(0, 3)  # the other container's process ended
    (d.work / "release").touch()
    assert d.wait_status(one, TERMINAL).status == "succeeded"
    assert d.wait_status(both, TERMINAL, timeout_s=20).status == "succeeded"
    assert sorted(placement_of(d.job(both))[0]) == [0, 1]


def test_the_daemons_own_cuda_visible_devices_keeps_a_gpu_out(lab: Lab) -> None:
    """bug-45: started with CUDA_VISIBLE_DEVICES=1 (to keep a display card out), the daemon lists
    GPU 0 as excluded and never grants it; the job gets CUDA_VISIBLE_DEVICES='1'."""
    fake = lab.fake_gpus([2048, 24576])
    d = lab.daemon(fake=fake, env={"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    devices = d.cli_ok("devices")
    assert "excluded (CUDA_VISIBLE_DEVICES)" in devices and "no (excluded)" in devices, devices
    first = d.submit("--accelerator", "cuda", "--", "python", "-c", SHOW_ENV)
    job = d.wait_status(first, TERMINAL)
    assert job.status == "succeeded" and placement_of(job)[0] == [1]
    assert d.cli_ok("logs", first) == "'1' 'PCI_BUS_ID'\n"
    two = d.submit("--accelerator", "cuda", "--gpus", "2", "--", "true")
    waiting = d.wait_reason(two, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert "GPU 0 is excluded by the daemon's CUDA_VISIBLE_DEVICES" in d.cli_ok("explain", two)


def test_exclude_gpus_keeps_a_gpu_out_and_a_malformed_one_stops_the_start(lab: Lab) -> None:
    fake = lab.fake_gpus([24576, 24576])
    d = lab.daemon(fake=fake, exclude_gpus=[0])  # type: ignore[arg-type]
    assert "excluded (config)" in d.cli_ok("devices")
    job = d.wait_status(d.submit("--accelerator", "cuda", "--", "true"), TERMINAL)
    assert job.status == "succeeded" and placement_of(job)[0] == [1]
    config = lab.root / "bad.toml"
    config.write_text('exclude_gpus = ["gpu0"]\n', encoding="utf-8")
    r = subprocess.run([GPULAYERD, "--state-dir", str(lab.root / "bad-state"), "--config", str(config)],
                       check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "exclude_gpus" in r.stderr and "GPU-... or MIG-..." in r.stderr, r.stderr


def test_a_gpu_that_needs_a_reset_is_never_granted_until_it_reads_fine_again(lab: Lab) -> None:
    """bug-41: after an Xid, GPU 0 is listed with its name and memory while its live field reads
    '[GPU requires reset]'; GPU 1 is busy. The job waits and says both; after the reset it runs on GPU 0."""
    fake = lab.fake_gpus([81559, 81559])
    fake.set_state(0, pstate="[GPU requires reset]")
    fake.set_apps([(1, os.getpid())])
    d = lab.daemon(fake=fake, probe_interval_s=0.5)
    devices = d.cli_ok("devices")
    assert "unusable: GPU requires reset (pstate)" in devices and "no (unusable)" in devices, devices
    job_id = d.submit("--accelerator", "cuda", "--gpu-memory-gb", "40", "--", "true")
    waiting = d.wait_reason(job_id, lambda j: j.reason != "waiting for the scheduler")
    assert waiting.status == "queued"
    assert "GPU 1 is busy with processes gpulayer did not start" in waiting.reason, waiting.reason
    assert "GPU 0 is unusable: nvidia-smi reads 'GPU requires reset (pstate)'" in d.cli_ok("explain", job_id)
    fake.set_state(0, pstate="P0")  # nvidia-smi -r
    job = d.wait_status(job_id, TERMINAL, timeout_s=20)
    assert job.status == "succeeded" and placement_of(job)[0] == [0]
    log = d.log_path.read_text(encoding="utf-8")  # an admin's trail, as Slurm logs a drain and a resume
    assert "cuda device 0 (NVIDIA Fake 79GB) is unusable: GPU requires reset (pstate)" in log, log[-2000:]
    assert "cuda device 0 (NVIDIA Fake 79GB) is ok again" in log, log[-2000:]
