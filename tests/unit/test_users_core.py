"""The pure user rules (gpulayerd.core.users): who vouches for a user name, and whose jobs a worker runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core.matching.evaluate import evaluate, explain
from gpulayerd.core.types import EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.users import account_rejection, vouch_refusal, vouches
from gpulayerd.core.verdict import FitState, RejectionCode, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX

names = st.sampled_from(["alice", "bob", "root", "carol"])
modes = st.sampled_from(["personal", "system", "", "other"])


def worker(name: str = "ws-3", **kw: object) -> WorkerSnapshot:
    env = EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.9")
    return replace(WorkerSnapshot(node_id=f"id-{name}", name=name, environments=(env,), cpu_count=8,
                                  cpu_slots_total=2, cpu_slots_free=2), **kw)


# ------------------------------------------------------------------ vouches


@pytest.mark.parametrize(("mode", "bound", "job_user", "ok"), [
    ("system", "", "alice", True),
    ("system", "", "root", True),
    ("personal", "bob", "bob", True),
    ("personal", "bob", "alice", False),
    ("personal", "", "alice", False),  # a certificate from before modes: vouches for nobody
    ("personal", "", "", False),
    ("system", "", "", False),  # a job must name its user
    ("weird", "alice", "alice", False),
])
def test_vouches(mode: str, bound: str, job_user: str, ok: bool) -> None:
    assert vouches(mode, bound, job_user) is ok
    assert (vouch_refusal(mode, bound, job_user, "ws-1") is None) is ok


def test_vouch_refusal_names_the_sender_and_its_user() -> None:
    assert vouch_refusal("personal", "bob", "alice", "ws-1") == (
        "ws-1 is bob's personal-mode node: it cannot send jobs of 'alice' "
        "(only a system-mode node vouches for other users)")
    assert vouch_refusal("personal", "", "alice", "ws-1") == (
        "ws-1's certificate is bound to no user: it cannot send jobs of 'alice' (re-join it to the cluster)")


@given(modes, names, names)
def test_a_personal_node_vouches_only_for_its_own_user(mode: str, bound: str, job_user: str) -> None:
    if vouches(mode, bound, job_user):
        assert mode == "system" or (mode == "personal" and bound == job_user)
    if mode == "system":
        assert vouches(mode, bound, job_user)


# ------------------------------------------------------------------ account_rejection


def test_missing_account_is_named() -> None:
    r = account_rejection("alice", worker(mode="system", missing_accounts=frozenset({"alice"})))
    assert r is not None
    assert r.code is RejectionCode.NO_ACCOUNT
    assert r.message == "no account 'alice' on ws-3"
    assert r.worker == "id-ws-3"


def test_personal_worker_runs_only_its_users_jobs() -> None:
    r = account_rejection("alice", worker(user="bob"))
    assert r is not None
    assert r.code is RejectionCode.OTHER_USERS_WORKER
    assert r.message == "gpulayerd on ws-3 runs only bob's jobs"
    assert account_rejection("bob", worker(user="bob")) is None


def test_root_jobs_only_where_allowed() -> None:
    r = account_rejection("root", worker(mode="system"))
    assert r is not None and r.code is RejectionCode.ROOT_JOBS_NOT_ALLOWED
    assert account_rejection("root", worker(mode="system", allow_root_jobs=True)) is None
    assert account_rejection("root", worker(user="root")) is None  # a personal daemon running as root


def test_job_without_user_and_worker_without_user_are_not_judged() -> None:
    assert account_rejection("", worker(user="bob", missing_accounts=frozenset({"bob"}))) is None
    assert account_rejection("alice", worker()) is None  # a personal worker from before users says no user


@given(names, modes, names, st.booleans(), st.frozensets(names))
def test_account_rejection_properties(job_user: str, mode: str, wuser: str, allow_root: bool,
                                      missing: frozenset[str]) -> None:
    w = worker(mode=mode, user="" if mode == "system" else wuser, allow_root_jobs=allow_root,
               missing_accounts=missing)
    r = account_rejection(job_user, w)
    if job_user in missing:
        assert r is not None and r.code is RejectionCode.NO_ACCOUNT
    elif mode == "system":
        assert (r is None) == (job_user != "root" or allow_root)
    elif r is not None:
        assert r.code is RejectionCode.OTHER_USERS_WORKER and wuser != job_user
    else:
        assert wuser == job_user


# ------------------------------------------------------------------ in the matcher


def test_explain_shows_the_account_rejection_per_worker() -> None:
    job = JobRequest(job_id="j1", user="alice")
    ws3 = worker("ws-3", mode="system", missing_accounts=frozenset({"alice"}))
    ws2 = worker("ws-2", mode="system")
    ws4 = worker("ws-4", user="bob")
    e = explain(job, [ws3, ws2, ws4], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW
    assert e.placement is not None and e.placement.worker == "id-ws-2"
    rows = {r.worker: r for r in e.workers}
    assert rows["id-ws-3"].state is FitState.NO_FIT
    assert [x.message for x in rows["id-ws-3"].rejections] == ["no account 'alice' on ws-3"]
    assert [x.message for x in rows["id-ws-4"].rejections] == ["gpulayerd on ws-4 runs only bob's jobs"]
    user_checks = [c for c in rows["id-ws-2"].checks if c.requirement == "user"]
    assert [(c.wanted, c.found, c.ok) for c in user_checks] == [("alice", "ok", True)]


def test_a_job_without_user_gets_no_user_row() -> None:
    ev = evaluate(JobRequest(job_id="j1"), worker(user="bob"), SUPPORT_MATRIX)
    assert ev.state is FitState.FITS_NOW
    assert all(c.requirement != "user" for c in ev.checks)


def test_account_rejection_is_static_even_when_busy() -> None:
    busy = worker(mode="system", missing_accounts=frozenset({"alice"}), cpu_slots_free=0)
    ev = evaluate(JobRequest(job_id="j1", user="alice"), busy, SUPPORT_MATRIX)
    assert ev.state is FitState.NO_FIT
    assert RejectionCode.NO_ACCOUNT in {r.code for r in ev.rejections}
