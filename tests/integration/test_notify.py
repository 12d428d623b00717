"""Notifications (issue 37): a system-mode gpulayerd runs a job's notify command as the job's user.

The ``gpulayer`` CLI runs as alice (``shared_python``) and reads ``notify`` from her own
``~/.config/gpulayer/config.toml``; the daemon (root) runs the command as alice, once, with the
documented variables; a notify command that fails leaves the job as it ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.accounts import Account, Accounts, SharedPython

from .conftest import TERMINAL, Lab
from .test_local_users import ok, open_to_everyone


@pytest.fixture(autouse=True)
def _as_root() -> None:
    """These tests need root (CI runs as root): a run without it fails, never passes by skipping."""
    if os.geteuid() != 0:
        pytest.fail("needs root: makes accounts and runs the CLI as them", pytrace=False)


RECORD = 'out="$HOME/notified-$GPULAYER_JOB_ID"; { id -u; env | grep ^GPULAYER_ | sort; echo pwd=$(pwd); } >> "$out"'


def write_config(who: Account, command: list[str]) -> None:
    config = who.home / ".config" / "gpulayer" / "config.toml"
    subprocess.run(["install", "-d", "-o", who.name, "-m", "0700", str(who.home / ".config"), str(config.parent)],
                   check=True)
    config.write_text(f"notify = {json.dumps(command)}\n")
    os.chown(config, who.uid, who.gid)


def wait_for(path: Path, timeout_s: float = 20.0) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith("\n") and "pwd=" in path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout_s:g} s")


def test_the_notify_command_runs_once_as_the_user_with_the_jobs_facts(
        lab: Lab, accounts: Accounts, shared_python: SharedPython) -> None:
    alice = accounts.user("alice")
    d = lab.daemon(cpu_slots=2, mode="system", admin_group=accounts.group("admin"))
    sock = open_to_everyone(d)
    write_config(alice, ["/bin/sh", "-c", RECORD])
    work = alice.home / "work"
    subprocess.run(["install", "-d", "-o", alice.name, "-m", "0700", str(work)], check=True)

    def submit(*args: str) -> str:
        r = shared_python.cli(alice, "--socket", str(sock), "submit", "--json", "--workdir", str(work), *args,
                              cwd=work)
        return str(json.loads(ok(r))["id"])

    failing = submit("--name", "will-fail", "--notify", "end,fail", "--", "sh", "-c", "exit 3")
    assert d.wait_status(failing, TERMINAL).status == "failed"
    text = wait_for(alice.home / f"notified-{failing}")
    assert text.splitlines() == [
        str(alice.uid),  # as alice, never as root
        "GPULAYER_EVENT=fail", "GPULAYER_EXIT_CODE=3", f"GPULAYER_JOB_ID={failing}",
        "GPULAYER_JOB_NAME=will-fail", "GPULAYER_JOB_STATE=failed", f"pwd={alice.home}",
    ], text
    assert (alice.home / f"notified-{failing}").stat().st_uid == alice.uid

    # A job that succeeds with only "fail" asked: nothing; with "end": once.
    quiet = submit("--notify", "fail", "--", "true")
    told = submit("--notify", "end", "--", "true")
    assert d.wait_status(quiet, TERMINAL).status == "succeeded"
    assert d.wait_status(told, TERMINAL).status == "succeeded"
    assert wait_for(alice.home / f"notified-{told}").splitlines()[1:] == [
        "GPULAYER_EVENT=end", "GPULAYER_EXIT_CODE=0", f"GPULAYER_JOB_ID={told}", "GPULAYER_JOB_NAME=",
        "GPULAYER_JOB_STATE=succeeded", f"pwd={alice.home}"]
    time.sleep(0.5)  # (a second notification would have come by now)
    assert not (alice.home / f"notified-{quiet}").exists()
    assert wait_for(alice.home / f"notified-{told}").count("GPULAYER_EVENT=") == 1

    # A notify command that fails (or is missing) never changes the job.
    write_config(alice, ["/bin/sh", "-c", "echo cannot reach the mail server >&2; exit 7"])
    broken = submit("--notify", "end", "--", "true")
    assert d.wait_status(broken, TERMINAL).status == "succeeded"
    write_config(alice, ["/nonexistent/notifier"])
    missing = submit("--notify", "end", "--", "true")
    assert d.wait_status(missing, TERMINAL).status == "succeeded"
    deadline = time.monotonic() + 10
    while "cannot reach the mail server" not in d.log_tail(20000) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"job_id={broken}: notify command exited 7: 'cannot reach the mail server'" in d.log_tail(20000)
    assert d.wait_status(broken, TERMINAL).status == "succeeded"

    # Bad input: exit 2 naming the field; a --notify without a notify command in the config file too.
    r = shared_python.cli(alice, "--socket", str(sock), "submit", "--notify", "finish", "--", "true", cwd=work)
    assert r.returncode == 2 and "--notify: unknown event 'finish'; allowed: start, end, fail" in r.stderr, r
    (alice.home / ".config" / "gpulayer" / "config.toml").unlink()
    r = shared_python.cli(alice, "--socket", str(sock), "submit", "--notify", "end", "--", "true", cwd=work)
    assert r.returncode == 2 and "--notify: no notify command" in r.stderr, r
