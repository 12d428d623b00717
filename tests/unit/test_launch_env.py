"""build_env and resolve_job_user: what a job's environment holds, and which account it runs as."""

from __future__ import annotations

import os
import pwd
import sys

import pytest

from gpulayerd.core.types import Accelerator
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec
from gpulayerd.runs import launch
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.launch import DEFAULT_PATH, build_env, resolve_job_user
from gpulayerd.runs.runner import RunnerError

CPU = Placement("node-a", sys.executable, (), (), Accelerator.CPU)
CUDA_0 = Placement("node-a", sys.executable, (0,), ("GPU-0",), Accelerator.CUDA)
ALICE = JobUser(name="alice", uid=1001, gid=1001, groups=(1001, 27), home="/home/alice", shell="/bin/zsh")
DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "USER": "root", "SECRET_TOKEN": "s3cr3t",
              "LANG": "de_DE.UTF-8", "LC_TIME": "en_GB.UTF-8", "NOTIFY_SOCKET": "/run/systemd/notify",
              "GPULAYER_STATE_DIR": "/var/lib/gpulayer", "PYTHONPATH": "/opt/daemon"}


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"command": ["python", "train.py"], **fields})


def test_a_job_with_a_user_gets_only_the_allowed_variables() -> None:
    job = spec(user="alice", path="/home/alice/.local/bin:/usr/bin:/bin", env={"WANDB_MODE": "offline"})
    env = build_env(DAEMON_ENV, job, CUDA_0, "job1", 2, 60.0, ALICE)
    assert env == {
        "LANG": "de_DE.UTF-8", "LC_TIME": "en_GB.UTF-8",
        "HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "SHELL": "/bin/zsh",
        "PATH": "/home/alice/.local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline",
        "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPULAYER_JOB_ID": "job1", "GPULAYER_ATTEMPT": "2", "GPULAYER_DIST_TIMEOUT_S": "60.0",
    }


def test_without_the_submitters_path_a_user_job_gets_the_default_and_a_utf8_locale() -> None:
    env = build_env({"PATH": "/sbin", "TERM": "xterm"}, spec(user="alice"), CPU, "job1", 1, 60.0, ALICE)
    assert env["PATH"] == DEFAULT_PATH
    assert env["LANG"] == "C.UTF-8"
    assert "TERM" not in env


def test_the_spec_may_override_home_and_path_but_never_the_account_name() -> None:
    job = spec(user="alice", path="/x", env={"PATH": "/y", "HOME": "/scratch/alice", "USER": "root",
                                              "LOGNAME": "root", "GPULAYER_JOB_ID": "forged"})
    env = build_env(DAEMON_ENV, job, CPU, "job1", 1, 60.0, ALICE)
    assert (env["PATH"], env["HOME"], env["USER"], env["LOGNAME"]) == ("/y", "/scratch/alice", "alice", "alice")
    assert env["GPULAYER_JOB_ID"] == "job1"


def test_a_job_without_a_user_keeps_the_daemons_environment_but_takes_the_submitters_path() -> None:
    env = build_env(DAEMON_ENV, spec(path="/home/alice/bin:/usr/bin"), CPU, "job1", 1, 60.0)
    assert env["SECRET_TOKEN"] == "s3cr3t"  # as before users
    assert env["PATH"] == "/home/alice/bin:/usr/bin"
    assert "NOTIFY_SOCKET" not in env and "GPULAYER_STATE_DIR" not in env
    assert build_env(DAEMON_ENV, spec(), CPU, "job1", 1, 60.0)["PATH"] == DAEMON_ENV["PATH"]


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def test_no_user_runs_as_the_daemon() -> None:
    assert resolve_job_user(None, "system", False) is None
    assert resolve_job_user("", "personal", False) is None


def test_a_daemon_runs_its_own_users_jobs_in_personal_mode() -> None:
    user = resolve_job_user(_me(), "personal", False)
    assert user is not None and (user.name, user.uid) == (_me(), os.geteuid())


def test_a_personal_daemon_refuses_another_users_job() -> None:
    other = next(p.pw_name for p in pwd.getpwall() if p.pw_uid != os.geteuid())
    with pytest.raises(RunnerError, match=f"runs only that user's jobs, not '{other}'"):
        resolve_job_user(other, "personal", False)


def test_a_daemon_that_is_not_root_runs_only_its_own_users_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(launch.os, "geteuid", lambda: nobody.pw_uid)
    monkeypatch.setattr("gpulayerd.runs.account.os.geteuid", lambda: nobody.pw_uid)
    with pytest.raises(RunnerError, match="runs as 'nobody' and runs only that user's jobs, not 'root'"):
        resolve_job_user("root", "system", True)
    user = resolve_job_user("nobody", "system", False)
    assert user is not None and user.uid == nobody.pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="the system-mode rule for root needs root")
def test_system_mode_as_root_runs_root_jobs_only_when_allowed() -> None:
    with pytest.raises(RunnerError, match="allow_root_jobs"):
        resolve_job_user("root", "system", False)
    user = resolve_job_user("root", "system", True)
    assert user is not None and user.uid == 0
    with pytest.raises(RunnerError, match="no account 'gl-no-such-user'"):
        resolve_job_user("gl-no-such-user", "system", False)


@pytest.mark.parametrize(("data", "field"), [
    ({"uid": -1}, "user.uid"), ({"name": 3}, "user.name"), ({"groups": "27"}, "user.groups"),
    ({"gid": True}, "user.gid"),
])
def test_a_bad_user_object_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        JobUser.from_json({**ALICE.to_json(), **data})
