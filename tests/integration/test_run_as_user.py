"""Jobs run as their user: through the real Starter, Runner and watchdog, with real accounts.

Tests run as root (CI is root); accounts come from the ``accounts`` fixture
(tests/fakes/accounts.py) and are removed afterwards. Jobs of another account run
``/bin/sh`` and coreutils: the test venv's python lives under /root, which they cannot enter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.worker.machine import PathChecker
from gpulayerd.app.worker.starter import Starter
from gpulayerd.config import DaemonConfig
from gpulayerd.core.launch import launch_env
from gpulayerd.core.matching.requirements import check_workdir
from gpulayerd.core.types import Accelerator, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Check, Placement, RejectionCode
from gpulayerd.models import JobSpec
from gpulayerd.runs.account import JobUser, lookup_user
from gpulayerd.runs.runner import RunHandle, Runner, RunnerError, RunStatus
from tests.fakes.accounts import Account, Accounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs jobs as other accounts")

CPU = Placement("node-a", sys.executable, (), (), Accelerator.CPU)
SUBMITTER_PATH = "/opt/alice-tools/bin:/usr/local/bin:/usr/bin:/bin"
# What a job may see besides the spec's env: the account, the locale, PATH, gpulayer's own, and
# what sh itself sets.
ALLOWED = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "LANGUAGE", "PYTHONUNBUFFERED",
           "GPULAYER_DIST_TIMEOUT_S", "PWD", "OLDPWD", "SHLVL", "_", *launch_env(Accelerator.CPU, (), "j", 1)}


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def runner(state_dir: Path) -> Iterator[Runner]:
    runner = Runner(state_dir / "runs", grace_s=0.5, poll_interval_s=0.05)
    yield runner
    for run_dir in (state_dir / "runs").glob("*/*"):
        handle = runner.adopt(run_dir)
        if handle is not None and runner.poll(handle).running:
            runner.cancel(handle)


def starter(state_dir: Path, runner: Runner, **config: object) -> Starter:
    return Starter(DaemonConfig(state_dir=state_dir, mode="system", **config), runner, Clock())


def own_dir(account: Account, name: str) -> Path:
    d = account.home / name
    d.mkdir()
    os.chown(d, account.uid, account.gid)
    return d


def start(st: Starter, job_id: str, spec: JobSpec) -> RunHandle:
    return asyncio.run(st.start(job_id, 1, spec, CPU, 60.0, []))


def wait(runner: Runner, handle: RunHandle) -> RunStatus:
    return asyncio.run(asyncio.wait_for(runner.async_wait(handle), 20.0))


def processes_of(uid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.uids().real == uid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def test_a_job_runs_as_its_user_with_a_clean_environment(
    accounts: Accounts, runner: Runner, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = accounts.user("alice")
    work = own_dir(alice, "work")
    monkeypatch.setenv("GPULAYER_TEST_MARKER_XYZ", "1")
    monkeypatch.setenv("SECRET_MARKER", "daemon-only")
    spec = JobSpec(command=["sh", "-c", "id -un; id -G; echo $HOME; echo $PATH; echo ---; env; touch f"],
                   workdir=str(work), user=alice.name, path=SUBMITTER_PATH, env={"MY_SETTING": "on"})
    handle = start(starter(state_dir, runner), "alice-env", spec)
    status = wait(runner, handle)
    out = (handle.run_dir / "stdout.log").read_text()
    assert status.exit_code == 0, (out, (handle.run_dir / "stderr.log").read_text())
    head, env_text = out.split("---\n")
    name, groups, home, path = head.splitlines()
    assert name == alice.name
    assert sorted(int(g) for g in groups.split()) == sorted(set(os.getgrouplist(alice.name, alice.gid)))
    assert home == str(alice.home)
    assert path == SUBMITTER_PATH
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    assert env["MY_SETTING"] == "on" and env["USER"] == alice.name and env["SHELL"] == "/bin/sh"
    assert "SECRET_MARKER" not in env and "GPULAYER_TEST_MARKER_XYZ" not in env
    unexpected = {k for k in env if k not in ALLOWED and k != "MY_SETTING" and not k.startswith("LC_")}
    assert unexpected == set()
    assert (work / "f").stat().st_uid == alice.uid
    assert (work / "f").stat().st_gid == alice.gid


def test_a_job_that_leaves_its_session_is_still_stopped_at_cancel(
    accounts: Accounts, runner: Runner, state_dir: Path
) -> None:
    alice = accounts.user("alice")
    # One sleep in a session of its own, one orphaned too (its parent subshell exits at once).
    spec = JobSpec(command=["sh", "-c", "setsid sleep 300 & (setsid sleep 301 &); sleep 302"],
                   workdir=str(alice.home), user=alice.name)
    handle = start(starter(state_dir, runner), "alice-setsid", spec)
    end = time.monotonic() + 10
    while len([p for p in processes_of(alice.uid) if p.name() == "sleep"]) < 3:
        assert time.monotonic() < end, "the job's three sleeps did not start"
        time.sleep(0.02)
    sleeps = {p.cmdline()[-1]: p for p in processes_of(alice.uid) if p.name() == "sleep"}
    assert len({os.getsid(p.pid) for p in sleeps.values()}) == 3  # they really left the job's session
    assert sleeps["301"].ppid() == handle.watchdog_pid  # the orphan was adopted by the watchdog (subreaper)
    runner.cancel(handle)
    status = wait(runner, handle)
    assert status.reason == "cancelled"
    assert processes_of(alice.uid) == []


def test_the_watchdog_refuses_a_uid_that_no_longer_names_the_account(
    accounts: Accounts, runner: Runner, tmp_path: Path
) -> None:
    alice = accounts.user("alice")
    stale = JobUser(name="gl-gone-" + secrets.token_hex(3), uid=alice.uid, gid=alice.gid, groups=(alice.gid,),
                    home=str(alice.home), shell="/bin/sh")
    with pytest.raises(RunnerError) as err:
        runner.start("stale-uid", 1, ["true"], {"PATH": "/usr/bin:/bin"}, alice.home, user=stale)
    assert err.value.status is not None and err.value.status.reason == "start_failed"
    assert f"is now account '{alice.name}'" in err.value.status.detail


def test_a_workdir_the_user_cannot_enter_fails_the_start_even_though_root_can(
    accounts: Accounts, runner: Runner, state_dir: Path
) -> None:
    alice = accounts.user("alice")
    secret = Path(f"/tmp/gl-secret-{secrets.token_hex(3)}")
    secret.mkdir(mode=0o700)
    try:
        spec = JobSpec(command=["true"], workdir=str(secret), user=alice.name)
        with pytest.raises(RunnerError) as err:
            start(starter(state_dir, runner), "alice-denied", spec)
        assert err.value.status is not None and err.value.status.reason == "start_failed"
        assert f"{alice.name} cannot enter {secret}" in err.value.status.detail
    finally:
        shutil.rmtree(secret)


def test_root_jobs_run_only_where_allowed(runner: Runner, state_dir: Path) -> None:
    spec = JobSpec(command=["true"], workdir="/", user="root")
    with pytest.raises(RunnerError, match="allow_root_jobs"):
        start(starter(state_dir, runner), "root-refused", spec)
    handle = start(starter(state_dir, runner, allow_root_jobs=True), "root-allowed", spec)
    assert wait(runner, handle).exit_code == 0


def test_a_user_without_an_account_is_refused(runner: Runner, state_dir: Path) -> None:
    spec = JobSpec(command=["true"], workdir="/", user="gl-nobody-" + secrets.token_hex(3))
    with pytest.raises(RunnerError, match="no account"):
        start(starter(state_dir, runner), "no-account", spec)


@pytest.mark.asyncio
async def test_the_workdir_is_checked_as_the_user(accounts: Accounts) -> None:
    alice = accounts.user("alice")
    bob = accounts.user("bob")
    mine = own_dir(alice, "data")
    alice.home.chmod(0o755)  # bob may pass through alice's home, not into her 0700 data
    mine.chmod(0o700)
    secret = Path(f"/tmp/gl-secret-{secrets.token_hex(3)}")
    secret.mkdir(mode=0o700)
    checker = PathChecker(Clock(), timeout_s=5.0)
    try:
        assert await checker.check(str(mine), alice.name) == "ok"
        assert await checker.check(str(mine), bob.name) == "denied"
        assert await checker.check(str(secret), alice.name) == "denied"
        assert await checker.check(str(secret), None) == "ok"  # root can
        assert await checker.check(str(mine / "nope"), alice.name) == "missing"
        worker = await checker.with_paths(WorkerSnapshot("ws-1", name="ws-1"),
                                          [(alice.name, str(mine)), (bob.name, str(mine)), (alice.name, str(secret))])
        assert worker.existing_paths == frozenset({str(mine)})
        assert worker.denied_paths == frozenset({(bob.name, str(mine)), (alice.name, str(secret))})
        checks: list[Check] = []
        rejections = check_workdir(JobRequest(job_id="j1", workdir=str(secret), user=alice.name), worker, checks)
        assert [r.code for r in rejections] == [RejectionCode.WORKDIR_DENIED]
        assert rejections[0].message == f"{alice.name} cannot enter {secret} on ws-1"
        assert check_workdir(JobRequest(job_id="j2", workdir=str(mine), user=alice.name), worker, []) == []
        assert [r.code for r in check_workdir(JobRequest(job_id="j3", workdir=str(mine), user=bob.name), worker, [])] \
            == [RejectionCode.WORKDIR_DENIED]
    finally:
        checker.close()
        secret.rmdir()


def test_lookup_user_matches_the_user_database(accounts: Accounts) -> None:
    alice = accounts.user("alice", groups=[accounts.group("lab")])
    user = lookup_user(alice.name)
    assert (user.name, user.uid, user.gid, user.home) == (alice.name, alice.uid, alice.gid, str(alice.home))
    assert user.groups[0] == alice.gid
    assert sorted(user.groups) == sorted(set(os.getgrouplist(alice.name, alice.gid)))
    assert JobUser.from_json(user.to_json()) == user


def test_each_stream_keeps_at_most_the_log_cap(accounts: Accounts, state_dir: Path) -> None:
    alice = accounts.user("alice")
    runner = Runner(state_dir / "runs", grace_s=0.5, poll_interval_s=0.05, log_cap_bytes=4096)
    spec = JobSpec(command=["sh", "-c", "yes 0123456789 | head -c 1000000; echo done >&2"],
                   workdir=str(alice.home), user=alice.name)
    handle = start(starter(state_dir, runner), "alice-cap", spec)
    status = wait(runner, handle)
    assert status.exit_code == 0  # the job is not killed for writing too much
    out = (handle.run_dir / "stdout.log").read_bytes()
    marker = b"\n[gpulayer: log capped at 4096 bytes]\n"
    assert out == (b"0123456789\n" * 373)[:4096] + marker
    assert (handle.run_dir / "stderr.log").read_bytes() == b"done\n"
