"""Pre-flight checks (issue 35), the pure parts: the owner's decision on a failed check, the worker's
marks of broken environments, which attempts get a check, and how a failure is read."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpulayerd.app.worker.preflight_marks import MAX_MARKS, PreflightMarks
from gpulayerd.app.worker.starter import preflight_check
from gpulayerd.core.job_policy import RetryPolicy
from gpulayerd.core.protocol.claims import (
    PREFLIGHT_HOLD_S,
    PREFLIGHT_WORKERS,
    ClaimRequested,
    JobRecord,
    JobStatus,
    PersistJob,
    ReplyStale,
    RunStarted,
    handle,
    report_event,
)
from gpulayerd.core.types import Accelerator, EnvironmentSnapshot, FrameworkVersion
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec
from gpulayerd.runs.preflight import PREFLIGHT_FAILED, PREFLIGHT_STOPPED, PreflightCheck, failure

ERROR = "torch: ImportError: undefined symbol: __nvJitLinkComplete_12_4"


def persisted(actions: list[object]) -> PersistJob:
    found = [a for a in actions if isinstance(a, PersistJob)]
    assert len(found) == 1, actions
    return found[0]


def run_on(job: JobRecord, worker: str, now: float = 0.0) -> JobRecord:
    """``job`` claimed and started by ``worker``."""
    job = persisted(handle(job, ClaimRequested(worker), now)).record
    return persisted(handle(job, RunStarted(job.attempt, worker), now)).record


def preflight_failed(job: JobRecord, worker: str) -> PersistJob:
    return persisted(handle(job, report_event("lost", job.attempt, worker, reason=ERROR, preflight=True), 1.0))


def test_a_failed_check_queues_the_job_again_without_using_a_retry_and_prefers_another_worker() -> None:
    job = JobRecord("j1", JobStatus.QUEUED, retries_left=0, retry=RetryPolicy(retries=0))
    p = preflight_failed(run_on(job, "w1"), "w1")
    assert (p.record.status, p.record.holder, p.record.retries_left, p.record.avoid) == (
        JobStatus.QUEUED, None, 0, "w1")
    assert p.record.preflight_failed_on == ("w1",) and p.retry_in_s is None
    assert p.reason == f"attempt 1 preflight-failed on w1: {ERROR}; queued again for another worker"


def test_after_failures_on_k_different_workers_the_job_is_held_with_preflight_failed_naming_them() -> None:
    job = JobRecord("j1", JobStatus.QUEUED)
    workers = [f"w{i}" for i in range(1, PREFLIGHT_WORKERS + 1)]
    for n, w in enumerate(workers, start=1):
        p = preflight_failed(run_on(job, w), w)
        job = p.record
        if n < PREFLIGHT_WORKERS:
            assert p.retry_in_s is None
    assert job.preflight_failed_on == tuple(workers)
    assert p.retry_in_s == PREFLIGHT_HOLD_S  # the claim machine denies claims until then
    assert p.reason.startswith(f"PreflightFailed: the pre-flight check failed on {', '.join(workers)} (last: {ERROR})")
    # The same worker failing twice counts once.
    again = preflight_failed(run_on(JobRecord("j2", JobStatus.QUEUED, preflight_failed_on=("w1",)), "w1"), "w1")
    assert again.record.preflight_failed_on == ("w1",)


def test_a_check_failure_from_a_member_that_does_not_hold_the_attempt_changes_nothing() -> None:
    job = run_on(JobRecord("j1", JobStatus.QUEUED), "w1")
    actions = handle(job, report_event("lost", job.attempt, "w2", reason=ERROR, preflight=True), 1.0)
    assert [type(a) for a in actions] == [ReplyStale]


def test_a_cancelled_job_whose_check_failed_ends_cancelled() -> None:
    job = replace(run_on(JobRecord("j1", JobStatus.QUEUED), "w1"), cancel_requested=True)
    assert preflight_failed(job, "w1").record.status is JobStatus.CANCELLED


# ---------------------------------------------------------------------------- the worker's marks


def env(version: str = "2.5.1+cu124", python: str = "3.11.7") -> EnvironmentSnapshot:
    return EnvironmentSnapshot("/envs/a/bin/python", python_version=python,
                               frameworks={"torch": FrameworkVersion("torch", version, "torch")})


def test_a_mark_breaks_the_framework_until_the_probe_shows_the_environment_changed() -> None:
    marks = PreflightMarks()
    assert not marks.mark([env()], "/envs/other/bin/python", "torch", "x")  # no such environment here
    assert marks.mark([env()], "/envs/a/bin/python", "torch", "ImportError: boom")
    [marked] = marks.apply([env()])
    assert marked.import_errors == {"torch": "pre-flight check failed: ImportError: boom"}
    assert marked.notes == ("torch: pre-flight check failed: ImportError: boom",)
    assert marks.apply([env()])[0].import_errors == marked.import_errors  # the same probe: still broken
    [fixed] = marks.apply([env(version="2.5.2+cu124")])  # reinstalled: the mark is gone, for good
    assert fixed.import_errors == {} and fixed.notes == ()
    assert marks.apply([env()])[0].import_errors == {}


def test_marks_are_bounded() -> None:
    marks = PreflightMarks()
    envs = [replace(env(), interpreter=f"/envs/{i}/bin/python") for i in range(MAX_MARKS + 10)]
    for e in envs:
        marks.mark(envs, e.interpreter, "torch", "boom")
    assert sum(bool(e.import_errors) for e in marks.apply(envs)) == MAX_MARKS
    assert marks.apply(envs)[0].import_errors == {}  # the oldest went first


# ---------------------------------------------------------------------------- which attempts get a check


def placement(accelerator: Accelerator, environment: str = "/envs/a/bin/python") -> Placement:
    cuda = accelerator is Accelerator.CUDA
    return Placement("w1", environment, (0,) if cuda else (), ("GPU-1",) if cuda else (), accelerator)


@pytest.mark.parametrize(("spec", "where", "expected"), [
    ({"requirements": {"frameworks": {"torch": ""}}, "env": {"PYTHONPATH": "/home/u/torchfork", "X": "1"}},
     Accelerator.CPU, PreflightCheck("/envs/a/bin/python", ("torch",), "none", 60.0, ("PYTHONPATH", "X"))),
    ({"requirements": {"frameworks": {"torch": ">=2.4", "numpy": ""}}}, Accelerator.CUDA,
     PreflightCheck("/envs/a/bin/python", ("numpy", "torch"), "cuda", 60.0)),
    ({"requirements": {"frameworks": {"torch": ""}}}, Accelerator.CPU,
     PreflightCheck("/envs/a/bin/python", ("torch",), "none", 60.0)),
    ({}, Accelerator.CUDA, None),  # names no framework: no check, no cost
    ({"requirements": {"frameworks": {"torch": ""}}, "policy": {"preflight": False}}, Accelerator.CUDA, None),
])
def test_the_check_covers_the_named_frameworks_and_the_granted_device(
        spec: dict[str, object], where: Accelerator, expected: PreflightCheck | None) -> None:
    job = JobSpec.model_validate({"command": ["python", "train.py"], **spec})
    assert preflight_check(job, placement(where), 60.0) == expected


def test_a_failure_is_read_from_the_checks_last_line(tmp_path: Path) -> None:
    check = PreflightCheck("/usr/bin/python3", ("numpy", "torch"))
    log = tmp_path / "preflight.log"
    log.write_text('Traceback ...\nImportError: x\n\n{"framework": "torch", "error": "ImportError: x"}\n')
    assert failure(log, 3, check) == (PREFLIGHT_FAILED, "torch", "ImportError: x")
    assert failure(log, -9, check)[0] == PREFLIGHT_STOPPED  # its line, but killed: its user may have done it
    log.write_text("Fatal Python error: Segmentation fault\n")
    assert failure(log, -11, check) == (PREFLIGHT_STOPPED, "numpy", "the check was killed by signal 11")
    log.write_text("")
    assert failure(log, -11, check) == (PREFLIGHT_STOPPED, "numpy", "the check was killed by signal 11")
    log.write_text('{"framework": "../../etc", "error": "' + "y" * 1000 + '"}\n')  # not a framework it checked
    why, framework, line = failure(log, 3, check)
    assert (why, framework, len(line)) == (PREFLIGHT_FAILED, "numpy", 300)


@pytest.mark.parametrize(("data", "problem"), [
    ({"python": "python3", "frameworks": []}, "absolute path"),
    ({"python": "/p", "frameworks": ["torch; rm -rf /"]}, "module names"),
    ({"python": "/p", "frameworks": [], "device": "rocm"}, "cuda, mps or none"),
    ({"python": "/p", "frameworks": [], "timeout_s": 0}, "positive number"),
])
def test_a_bad_check_in_launch_json_is_refused_naming_the_field(data: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        PreflightCheck.from_json(data)


def test_a_mark_made_under_one_driver_state_is_cleared_when_the_driver_changes() -> None:
    """A device that did not initialize (the driver was not ready) is not broken for ever."""
    marks = PreflightMarks()
    assert marks.mark([env()], "/envs/a/bin/python", "torch", "RuntimeError: CUDA error", driver="GPU-1 not ready")
    assert marks.apply([env()], "GPU-1 not ready")[0].import_errors  # the same probe: still broken
    assert marks.apply([env()], "GPU-1 550.54.15")[0].import_errors == {}  # the driver came back


def test_a_passed_import_check_stands_for_ten_minutes_while_nothing_changes() -> None:
    from gpulayerd.app.worker.preflight_marks import PASS_KEEP_S

    marks = PreflightMarks()
    key = ("/envs/a/bin/python", ("torch",), "alice", ())
    assert not marks.passed_recently([env()], key, "d", 100.0)
    marks.record_pass([env()], key, "d", 100.0)
    assert marks.passed_recently([env()], key, "d", 100.0 + PASS_KEEP_S - 1)
    assert not marks.passed_recently([env()], key, "d", 100.0 + PASS_KEEP_S + 1)  # too old: checked again
    assert not marks.passed_recently([env(version="2.6.0")], key, "d", 101.0)  # reinstalled: checked again
    assert not marks.passed_recently([env()], key, "other driver", 101.0)
    assert not marks.passed_recently([env()], ("/envs/a/bin/python", ("torch",), "bob", ()), "d", 101.0)
