"""Who is asking, and may they (issue 11): several accounts on one system-mode daemon's socket.

A real gpulayerd (``mode = "system"``, an admin group of the ``accounts`` fixture) and the
real ``gpulayer`` CLI run as alice, bob and carol (an admin) through ``shared_python``. The
user of every request comes from the kernel (``SO_PEERCRED``): bob cannot cancel alice's job
or read its logs (exit 1, ``job <id> belongs to <alice>``), sees no command or environment in
``show``, and a raw request that claims to be alice in its body makes a job of bob.

Tests run as root (CI is root). The last test follows jobs of two users through the one
socket to their processes: account, groups, HOME, PATH (the submitter's), the owner of a file
the job writes, and nothing of the daemon's own environment.
"""

from __future__ import annotations

import grp
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fakes.accounts import Account, Accounts, SharedPython

from .conftest import TERMINAL, Daemon, Lab

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes accounts and runs the CLI as them")

SECRET = "hunter2-not-for-bob"

# A raw request on the socket (no gpulayer client): the body claims to be USER.
RAW_SUBMIT = r"""
import json, socket, sys
sock_path, user, workdir = sys.argv[1:4]
body = json.dumps({"spec": {"command": ["true"], "workdir": workdir, "user": user, "name": "claims-" + user},
                   "submitted_by": user}).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sock_path)
s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: gpulayerd\r\nContent-Type: application/json\r\n"
          + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode())
print(payload.decode())
"""


def open_to_everyone(d: Daemon) -> Path:
    """Let every account reach the daemon's socket; returns its path.

    The lab's daemons keep their socket under their temporary state dir (0700), not in
    ``/run/gpulayer`` as a lab install does (``--runtime-dir``, 0755 with the socket 0666:
    tests/integration/test_one_daemon.py checks those modes). So the test makes the path
    traversable by hand after the start; the daemon checks its directories at start only.
    """
    sock = d.socket_path
    for p in (d.root.parent, d.root, d.state_dir):
        os.chmod(p, 0o711)
    os.chmod(sock.parent, 0o755)
    os.chmod(sock, 0o666)
    return sock


def cli(shared: SharedPython, who: Account, sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return shared.cli(who, "--socket", str(sock), *args)


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def test_only_the_user_and_admins_may_cancel_read_logs_and_see_the_spec(
        lab: Lab, accounts: Accounts, shared_python: SharedPython) -> None:
    admins = accounts.group("admin")
    alice, bob = accounts.user("alice"), accounts.user("bob")
    carol = accounts.user("carol", groups=[admins])
    d = lab.daemon(cpu_slots=2, mode="system", admin_group=admins)
    sock = open_to_everyone(d)

    job = json.loads(ok(cli(shared_python, alice, sock, "submit", "--json", "--name", "alice-sleep",
                            "--env", f"TOKEN={SECRET}", "--", "sleep", "60")))
    job_id = job["id"]
    assert (job["submitted_by"], job["spec"]["user"]) == (alice.name, alice.name)
    assert job["spec"]["path"] == shared_python.env(alice)["PATH"]  # the CLI sends its own PATH

    refusal = f"job {job_id} belongs to {alice.name}"
    for args in (("cancel", job_id), ("logs", job_id), ("cancel", job_id[:8])):
        r = cli(shared_python, bob, sock, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.strip() == f"gpulayer: {refusal}", (args, r.stderr)
    assert not d.job(job_id).cancel_requested
    # An array task not materialized yet (%1: one task at a time) is alice's too: bob's cancel of it is
    # refused and writes nothing; alice's own cancels it.
    array = json.loads(ok(cli(shared_python, alice, sock, "submit", "--json", "--array", "0-9%1", "--",
                              "sleep", "60")))["id"]
    r = cli(shared_python, bob, sock, "cancel", f"{array}_5")
    assert (r.returncode, r.stderr.strip()) == (1, f"gpulayer: job {array}_5 belongs to {alice.name}"), r
    assert cli(shared_python, alice, sock, "show", f"{array}_5").returncode != 0  # nothing written
    assert "cancelled" in ok(cli(shared_python, alice, sock, "cancel", f"{array}_5"))
    ok(cli(shared_python, alice, sock, "cancel", array))

    shown = json.loads(ok(cli(shared_python, bob, sock, "show", "--json", job_id)))
    assert (shown["id"], shown["name"], shown["submitted_by"], shown["spec_hidden"]) == (
        job_id, "alice-sleep", alice.name, True)
    assert shown["spec"]["env"] == {} and shown["spec"]["command"] == ["<hidden>"]
    assert shown["spec"]["workdir"] is None and shown["spec"]["path"] is None
    text = ok(cli(shared_python, bob, sock, "show", job_id))
    assert f"user:      {alice.name}" in text
    assert "sleep 60" not in text and SECRET not in text and "hidden" in text
    own = json.loads(ok(cli(shared_python, alice, sock, "show", "--json", job_id)))
    assert own["spec_hidden"] is False and own["spec"]["env"] == {"TOKEN": SECRET}

    # Everyone sees every user's jobs, with a USER column; --mine and --user filter.
    table = ok(cli(shared_python, bob, sock, "jobs"))
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "USER", "STATE"]
    assert any(row.split()[:3] == [job_id, "alice-sleep", alice.name] for row in rows), table
    assert job_id not in ok(cli(shared_python, bob, sock, "jobs", "--mine"))
    assert job_id in ok(cli(shared_python, alice, sock, "jobs", "--mine"))
    assert job_id in ok(cli(shared_python, bob, sock, "jobs", "--user", alice.name))
    assert job_id not in ok(cli(shared_python, bob, sock, "jobs", "--user", carol.name))
    # The server-side filters hide what `show` hides: bob's --json listing of alice's jobs.
    listed = json.loads(ok(cli(shared_python, bob, sock, "jobs", "--json", "--user", alice.name)))
    (mine,) = [j for j in listed if j["id"] == job_id]
    assert mine["spec_hidden"] is True and mine["spec"]["env"] == {} and SECRET not in json.dumps(listed)

    # Submission keys belong to their user: bob sending alice's key gets a job of his own, and
    # alice's job and her key are untouched (her retry still finds her job).
    alice_keyed = json.loads(ok(cli(shared_python, alice, sock, "submit", "--json", "--key", "k-shared",
                                    "--name", "alice-keyed", "--", "true")))["id"]
    bobs = json.loads(ok(cli(shared_python, bob, sock, "submit", "--json", "--key", "k-shared",
                             "--name", "alice-keyed", "--", "true")))
    assert bobs["id"] != alice_keyed and bobs["spec"]["user"] == bob.name
    again = json.loads(ok(cli(shared_python, alice, sock, "submit", "--json", "--key", "k-shared",
                              "--name", "alice-keyed", "--", "true")))
    assert again["id"] == alice_keyed and d.job(alice_keyed).spec.user == alice.name

    # A job that waits: its reason and explanation name its workdir, which only alice and admins see.
    queued = json.loads(ok(cli(shared_python, alice, sock, "submit", "--json", "--workdir", str(alice.home),
                               "--accelerator", "cuda", "--gpus", "1", "--", "true")))["id"]
    assert str(alice.home) in ok(cli(shared_python, alice, sock, "explain", queued))
    for args in (("explain", queued), ("explain", "--json", queued), ("jobs", "--json"), ("show", queued)):
        assert str(alice.home) not in ok(cli(shared_python, bob, sock, *args)), args

    before = d.job(job_id).status
    out = ok(cli(shared_python, carol, sock, "cancel", job_id))  # a member of the admin group
    assert job_id in out
    if before not in TERMINAL:
        assert d.wait_status(job_id, {"cancelled"}).status == "cancelled"


def test_a_body_that_claims_another_user_makes_a_job_of_the_kernels_user(
        lab: Lab, accounts: Accounts, shared_python: SharedPython) -> None:
    alice, bob = accounts.user("alice"), accounts.user("bob")
    d = lab.daemon(cpu_slots=1, mode="system", admin_group=accounts.group("admin"))
    sock = open_to_everyone(d)
    r = subprocess.run([shared_python.python, "-c", RAW_SUBMIT, str(sock), alice.name, str(bob.home)],
                       user=bob.name, cwd=str(bob.home), env=shared_python.env(bob), capture_output=True,
                       text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    status_line, body = r.stdout.split("\n", 1)
    assert status_line.split()[1] == "201", r.stdout
    job = json.loads(body)
    assert (job["submitted_by"], job["spec"]["user"], job["name"]) == (bob.name, bob.name, f"claims-{alice.name}")
    assert job["spec"]["path"] == "/usr/local/bin:/usr/bin:/bin"  # no PATH sent: the safe default
    stored = d.job(job["id"])
    assert (stored.submitted_by, stored.spec.user) == (bob.name, bob.name)
    # And bob's job is bob's: alice may not cancel it.
    r = cli(shared_python, alice, sock, "cancel", job["id"])
    assert (r.returncode, r.stderr.strip()) == (1, f"gpulayer: job {job['id']} belongs to {bob.name}")


# What a job prints about itself; every line "key=value" (env last, one variable per line).
WHOAMI = 'echo "user=$(id -un)"; echo "groups=$(id -G)"; echo "home=$HOME"; echo "path=$PATH"; ' \
         'touch "$1/made-by-job"; echo "owner=$(stat -c %U "$1/made-by-job")"; env | sed "s/^/env:/"'
DAEMON_ONLY = "GPULAYERD_OWN_SECRET_MARKER"


def test_jobs_of_two_users_run_as_those_users_with_their_path_and_nothing_of_the_daemon(
        lab: Lab, accounts: Accounts, shared_python: SharedPython) -> None:
    team = accounts.group("team")
    alice, bob = accounts.user("alice", groups=[team]), accounts.user("bob")
    d = lab.daemon(cpu_slots=2, mode="system", admin_group=accounts.group("admin"),
                   env={DAEMON_ONLY: "daemon-environment-must-not-reach-jobs"})
    sock = open_to_everyone(d)
    seen = {}
    for who, path in ((alice, "/usr/bin:/bin:/opt/alice-tools/bin"), (bob, "/usr/local/bin:/usr/bin:/bin")):
        work = who.home / "work"
        subprocess.run(["install", "-d", "-o", who.name, "-g", str(who.gid), "-m", "0700", str(work)], check=True)
        r = shared_python.cli(who, "--socket", str(sock), "submit", "--json", "--workdir", str(work), "--",
                              "/bin/sh", "-c", WHOAMI, "sh", str(work), env={"PATH": path}, cwd=work)
        job = json.loads(ok(r))
        view = d.wait_status(job["id"], TERMINAL)
        assert view.status == "succeeded", (view.status, view.reason)
        out = ok(shared_python.cli(who, "--socket", str(sock), "logs", job["id"]))
        lines = out.splitlines()
        facts = dict(line.split("=", 1) for line in lines if not line.startswith("env:") and "=" in line)
        env = dict(line[4:].split("=", 1) for line in lines if line.startswith("env:") and "=" in line)
        seen[who.name] = (facts, env, work)
        assert facts["user"] == who.name, out
        assert sorted(int(g) for g in facts["groups"].split()) == sorted(set(who.groups)), (facts, who.groups)
        assert facts["home"] == str(who.home)
        assert facts["path"] == path  # the submitter's PATH, captured by the CLI
        assert facts["owner"] == who.name
        assert (work / "made-by-job").stat().st_uid == who.uid
        assert DAEMON_ONLY not in env, sorted(env)
        allowed = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "PWD", "SHLVL", "OLDPWD", "_", "PYTHONUNBUFFERED"}
        extra = {k for k in env if k not in allowed and not k.startswith(("LC_", "LANG", "GPULAYER_", "CUDA_", "HIP_"))}
        assert extra == set(), sorted(extra)
    team_gid = grp.getgrnam(team).gr_gid
    assert team_gid in {int(g) for g in seen[alice.name][0]["groups"].split()}
    assert team_gid not in {int(g) for g in seen[bob.name][0]["groups"].split()}
