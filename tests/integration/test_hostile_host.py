"""No connection flood, full disk or restart loses a job; a job gets each signal once (issue 24).

Real daemons (tests/integration/conftest.py), real accounts (tests/fakes/accounts.py), real floods:

- 2,000 idle and 2,000 slowloris connections to the local socket from one user: another user's
  submit and the job's start succeed within 5 s, root's ``gpulayer jobs`` answers within 3 s, and
  the daemon's log grows by less than 100 KB;
- a job submitted while the daemon holds more than 1,100 descriptors starts and succeeds (no
  ``select()``: descriptors past 1024 are as good as any);
- a job running while the state disk is full for longer than its lease ends ``succeeded`` with its
  exit code once space returns;
- a job whose SIGTERM handler saves a checkpoint for 2 s, cancelled: one handler run, complete, and
  its own exit code recorded;
- after 10 kill -9s of the daemon during a storm of jobs, no gpulayer process is left whose daemon
  is gone (beyond the watchdogs of jobs still running) once the daemon is stopped normally.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gpulayerd.api.client import DaemonClient
from tests.fakes.accounts import Accounts, SharedPython

from .conftest import TERMINAL, Lab, wait_until
from .test_full_disk import fill
from .test_local_users import open_to_everyone

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: accounts, tmpfs, other users' connections")

# Holds IDLE connections that never send a byte and SLOW ones that send a request head one byte every
# 2 s (slowloris) to a unix socket, reopening each one the daemon closes (at most 400 a second) until
# the deadline; prints "ready" once all were opened once, then a JSON summary.
FLOOD = r"""
import collections, json, resource, selectors, socket, sys, time
path, idle, slow, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
sel = selectors.DefaultSelector()
HEAD = b"GET /v1/jobs HTTP/1.1\r\nHost: gpulayerd\r\nX-Slow: " + b"a" * 200
count = {"opened": 0, "closed_by_server": 0, "refused_at_once": 0}

def open_one(kind):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        s.close()
        count["refused_at_once"] += 1
        pending.append(kind)
        return
    sel.register(s, selectors.EVENT_READ, [kind, 0])
    count["opened"] += 1

pending = collections.deque()
for _ in range(idle):
    open_one("idle")
for _ in range(slow):
    open_one("slow")
print("ready", flush=True)
end = time.monotonic() + duration
budget, last, drip = 0.0, time.monotonic(), time.monotonic()
while time.monotonic() < end:
    for key, _ in sel.select(0.05):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data or data.startswith(b"HTTP/1.1 503"):
            sel.unregister(s)
            s.close()
            count["closed_by_server"] += 1
            pending.append(key.data[0])
    now = time.monotonic()
    if now - drip >= 2.0:  # the slow ones send one more byte of their head
        drip = now
        for key in list(sel.get_map().values()):
            kind, sent = key.data
            if kind == "slow" and sent < len(HEAD):
                try:
                    key.fileobj.send(HEAD[sent:sent + 1])
                    key.data[1] = sent + 1
                except OSError:
                    pass
    budget, last = min(400.0, budget + 400.0 * (now - last)), now
    while pending and budget >= 1:
        budget -= 1
        open_one(pending.popleft())
print(json.dumps(count), flush=True)
"""


def test_a_flood_of_the_local_socket_by_one_user_starves_nobody(lab: Lab, accounts: Accounts,
                                                               shared_python: SharedPython) -> None:
    mallory, bob = accounts.user("mallory"), accounts.user("bob")
    d = lab.daemon(cpu_slots=2, mode="system", local_request_timeout_s=3.0)
    sock = open_to_everyone(d)
    log_before = d.log_path.stat().st_size
    flood = subprocess.Popen([shared_python.python, "-c", FLOOD, str(sock), "2000", "2000", "9"],
                             user=mallory.name, env=shared_python.env(mallory), cwd=str(mallory.home),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready", flood.stderr
        time.sleep(4.0)  # the slow heads have been dripping for longer than the request timeout
        daemon = psutil.Process(d.proc.pid if d.proc is not None else 0)
        t0 = time.monotonic()
        r = shared_python.cli(bob, "--socket", str(sock), "submit", "--json", "--", "sh", "-c", "echo bob-ran")
        assert r.returncode == 0, (r.stdout, r.stderr)
        job = json.loads(r.stdout)["id"]
        d.wait_status(job, {"succeeded"}, timeout_s=5.0)
        bob_s = time.monotonic() - t0
        t0 = time.monotonic()
        jobs = d.cli("jobs")
        root_s = time.monotonic() - t0
        assert jobs.returncode == 0 and job in jobs.stdout, jobs
        fds = daemon.num_fds()
        # Mallory is told why, in one line, when over her limit.
        refused = shared_python.cli(mallory, "--socket", str(sock), "jobs")
    finally:
        out, _ = flood.communicate(timeout=60)
    summary = json.loads(out.strip().splitlines()[-1])
    assert bob_s < 5.0 and root_s < 3.0, (bob_s, root_s)
    assert summary["closed_by_server"] > 2000, summary  # refused at accept, and slow heads closed after 3 s
    assert fds < 64 + 64 + 200, fds  # her share, a few of ours, the store and the zygote
    if refused.returncode != 0:
        assert "connections open to gpulayerd (at most 64 per user" in refused.stderr, refused.stderr
    grown = d.log_path.stat().st_size - log_before
    assert grown < 100_000, f"the daemon's log grew by {grown} bytes during the flood"
    assert d.stop() == 0


def test_a_job_starts_while_the_daemon_holds_more_than_1100_descriptors(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=2, local_max_connections=4000, local_max_connections_per_user=3000,
                   local_request_timeout_s=120.0, local_idle_timeout_s=120.0)
    assert d.proc is not None
    daemon = psutil.Process(d.proc.pid)
    held = []
    try:
        import socket

        for _ in range(1200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(d.socket_path))
            held.append(s)
        wait_until(lambda: daemon.num_fds() > 1100, 10.0, "the daemon to hold more than 1,100 descriptors")
        job = d.submit("--", "sh", "-c", "echo past-1024")
        done = d.wait_status(job, TERMINAL, timeout_s=20.0)
        assert (done.status, done.exit_code) == ("succeeded", 0), (done.reason, d.log_tail())
        assert d.cli_ok("logs", job) == "past-1024\n"
        assert daemon.num_fds() > 1100
    finally:
        for s in held:
            s.close()
    assert "filedescriptor out of range" not in d.log_path.read_text(errors="replace")


def test_a_job_outlives_a_full_state_disk_longer_than_its_lease(lab: Lab) -> None:
    d = lab.daemon(start=False, lease_grace_s=1.0)
    d.state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(d.state_dir)], check=True)
    try:
        d.start()
        flag = d.work / "go"
        job = d.submit("--lease-s", "3", "--", "sh", "-c",
                       f"echo start; while [ ! -e {flag} ]; do sleep 0.1; done; echo end")
        d.wait_status(job, {"running"})
        filler = fill(d.state_dir)
        time.sleep(7.0)  # more than twice the lease (3 s) and its grace: renewals cannot be written meanwhile
        assert d.job(job).status == "running", d.log_tail()
        filler.unlink()
        flag.touch()
        done = d.wait_status(job, TERMINAL, timeout_s=30.0)
        assert (done.status, done.exit_code) == ("succeeded", 0), (done.reason, d.log_tail())
        assert d.cli_ok("logs", job) == "start\nend\n"
        assert [a.state for a in done.attempts] == ["exited"], done.attempts
        assert "renewed through a signal to its watchdog" in d.log_path.read_text(errors="replace")
    finally:
        d.stop()
        subprocess.run(["umount", "-l", str(d.state_dir)], check=False)


CHECKPOINTING = r"""
import signal, sys, time
def save(signum, frame):
    print("saving checkpoint", flush=True)
    time.sleep(2.0)
    print("checkpoint saved", flush=True)
    sys.exit(5)
signal.signal(signal.SIGTERM, save)
print("training", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_cancelled_job_gets_one_sigterm_and_its_own_exit_code_is_recorded(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=2, cancel_grace_s=10.0)
    job = d.submit("--", sys.executable, "-c", CHECKPOINTING)
    d.wait_reason(job, lambda j: j.status == "running" and d.cli_ok("logs", job).startswith("training"), 20.0)
    d.cli_ok("cancel", job)
    done = d.wait_status(job, TERMINAL, timeout_s=30.0)
    log = d.cli_ok("logs", job)
    assert log == "training\nsaving checkpoint\ncheckpoint saved\n", log  # one handler run, complete
    assert (done.status, done.exit_code) == ("cancelled", 5), (done.status, done.exit_code, done.reason)


def _ours(lab: Lab) -> list[psutil.Process]:
    """gpulayer processes of this lab (zygotes, spares, watchdogs): their command line names its root."""
    found = []
    for p in psutil.process_iter(["cmdline", "pid"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(lab.root) in cmd and ("gpulayerd.runs." in cmd):
            found.append(p)
    return found


def test_no_gpulayer_process_outlives_its_daemon_after_a_storm_of_kill_9s(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=6)  # (CPU slots, not cores: the jobs sleep)
    assert d.proc is not None
    submitted = 0
    spec = {"command": ["sleep", "0.1"], "workdir": str(d.work)}

    async def thirty(c: DaemonClient) -> int:
        done = await asyncio.gather(*(c.submit(spec) for _ in range(30)), return_exceptions=True)
        return sum(not isinstance(j, BaseException) for j in done)

    for round_ in range(10):
        submitted += d.call(thirty)
        time.sleep(0.2 + 0.05 * round_)  # jobs are starting and running when the kill comes
        d.kill()  # SIGKILL mid-storm
        d.start()
    assert submitted >= 280
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        jobs = d.all_jobs()
        if jobs and all(j["status"] in TERMINAL for j in jobs):
            break
        time.sleep(0.5)
    assert any("zygote" in " ".join(p.cmdline()) for p in _ours(lab)), "the running daemon's zygote is seen"
    assert all(j["status"] in TERMINAL for j in jobs), "jobs still not ended"
    assert len(jobs) == submitted, (len(jobs), submitted)  # every acknowledged submit is stored, once
    assert d.stop() == 0

    def strays() -> list[tuple[int, str, str]]:
        found = []
        for p in _ours(lab):
            try:
                if not any(c.is_running() for c in p.children(recursive=True)):
                    found.append((p.pid, p.name(), " ".join(p.cmdline())))
            except psutil.Error:
                continue
        return found

    # The zygote goes when the daemon closes its end (or, after a kill -9, within its 2 s parent
    # check); its spare goes with it.
    deadline = time.monotonic() + 5.0
    while strays() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = strays()
    assert left == [], f"gpulayer processes left without a daemon or a running job: {left}"

# ------------------------------------------------------------------------------ install traps

# In a private mount namespace whose /etc/systemd/system is an empty tmpfs: whatever the install does
# stays there, and the listing after it shows what it wrote.
INSTALL_IN_NAMESPACE = r"""
mkdir -p /etc/systemd/system && mount -t tmpfs tmpfs /etc/systemd/system
"$@"
echo "exit $?"
echo "written: $(ls -A /etc/systemd/system | tr '\n' ' ')"
"""


def test_a_system_install_whose_interpreter_others_cannot_run_is_refused(
        lab: Lab, shared_python: SharedPython) -> None:
    # A lab venv every account can use (its python and gpulayerd), and a --python in a 0700 directory
    # (like root's pyenv) that the jobs would run with.
    venv = Path(tempfile.mkdtemp(prefix="glvenv-", dir="/tmp"))
    try:
        os.chmod(venv, 0o755)
        (venv / "bin").mkdir()
        (venv / "bin" / "python3").symlink_to(shared_python.python)
        (venv / "bin" / "gpulayerd").write_text("#!/bin/sh\nexit 0\n")
        os.chmod(venv / "bin" / "gpulayerd", 0o755)
        closed = venv / "pyenv"
        (closed / "bin").mkdir(parents=True)
        os.chmod(closed, 0o700)
        python = closed / "bin" / "python3"
        python.symlink_to(shared_python.python)
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", INSTALL_IN_NAMESPACE,
                            "sh", str(venv / "bin" / "python3"), "-m", "gpulayerd.cli", "service", "install",
                            "--system", "--os", "linux", "--python", str(python)],
                           env=shared_python.env(), capture_output=True, text=True, timeout=60, check=False)
        assert "exit 1\n" in r.stdout and "written: \n" in r.stdout, (r.stdout, r.stderr)
        assert (f"not installing the system service: the interpreter {python} cannot be run by other accounts: "
                f"{closed} is closed to them") in r.stderr, r.stderr
        assert "make the lab's venv from /usr/bin/python3" in r.stderr.lower(), r.stderr
        # The daemon makes the same check when it starts in system mode, before it serves anything.
        d = subprocess.run([str(venv / "bin" / "python3"), "-m", "gpulayerd", "--system", "--python", str(python),
                            "--no-mdns", "--state-dir", str(lab.root / "sys"), "--runtime-dir",
                            str(lab.root / "sysrun"), "--device-lock-dir", str(lab.root / "locks")],
                           env=shared_python.env(), capture_output=True, text=True, timeout=60, check=False)
        assert d.returncode == 1, (d.stdout, d.stderr)
        assert f"{closed} is closed to them" in d.stderr and "Traceback" not in d.stderr, d.stderr
        assert not (lab.root / "sysrun" / "gpulayerd.sock").exists()
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_roots_job_is_rejected_at_submit_when_no_worker_runs_roots_jobs(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=2, mode="system")  # allow_root_jobs is off by default
    r = d.cli("run", "--", "id", timeout_s=30.0)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "allow_root_jobs" in r.stderr + r.stdout, (r.stdout, r.stderr)
    job = d.all_jobs()[-1]
    assert job["status"] == "rejected" and "allow_root_jobs" in job["reason"], job  # stored with its reason
    r = d.cli("submit", "--", "id")
    assert r.returncode == 1 and "allow_root_jobs is off on" in r.stdout, (r.stdout, r.stderr)


def test_a_chunked_body_is_refused_so_no_request_escapes_its_timer(lab: Lab) -> None:
    """A chunked body could be dribbled forever (each chunk looks like progress): the local API takes
    Content-Length bodies only (every client of it sends those) and answers 411 at once."""
    import socket

    d = lab.daemon(cpu_slots=1, local_request_timeout_s=2.0)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(d.socket_path))
    s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: gpulayerd\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n2\r\n\r\n\r\n")
    answer = b""
    while chunk := s.recv(4096):
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 411 Length Required") and b'"code": "length_required"' in answer, answer
    assert d.cli("jobs").returncode == 0 and d.all_jobs() == []


# A job whose main process ignores SIGTERM and whose N children each run a fork chain: fork, the child
# starts a session of its own, the parent exits, with no pause; the chain touches BEAT while it lives.
CHAIN = r"""
import os, signal, sys, time
beat, n = sys.argv[1], int(sys.argv[2])
open(beat, "a").close()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(n):
    if os.fork() == 0:
        t0 = time.time()
        while time.time() - t0 < 60:
            if os.fork() != 0:
                os._exit(0)
            os.setsid()
            os.utime(beat)
        os._exit(0)
print("chains started", flush=True)
while True:
    time.sleep(1)
"""


def test_no_fork_chain_outlives_its_cancelled_job(lab: Lab) -> None:
    """A scan of /proc misses a process that forks and exits faster than the scan: the watchdog, a
    subreaper, kills its direct children (every orphan ends up one) until it has none (issue 24
    review: 8 of 17 cancels left a chain running, re-parented to pid 1)."""
    d = lab.daemon(cpu_slots=3, cancel_grace_s=0.5)
    beats = [d.work / f"beat{i}" for i in range(3)]
    jobs = [d.submit("--", sys.executable, "-c", CHAIN, str(b), "2") for b in beats]
    for job in jobs:
        d.wait_reason(job, lambda j: j.status == "running", 20.0)
    wait_until(lambda: all(b.exists() for b in beats), 10.0, "the chains to start")
    for job in jobs:
        d.cli_ok("cancel", job)
    for job in jobs:
        assert d.wait_status(job, TERMINAL, timeout_s=30.0).status == "cancelled"
    time.sleep(0.5)
    before = [b.stat().st_mtime_ns for b in beats]
    time.sleep(1.0)
    after = [b.stat().st_mtime_ns for b in beats]
    assert before == after, "a fork chain of a cancelled job still runs (its heartbeat moved)"
