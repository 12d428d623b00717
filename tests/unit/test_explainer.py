"""State-aware explanations (issue 13): ``explain`` of a job that is not waiting says where it is, never "fits".

The builder is pure (rows in, models out); the service tests run the real owner and worker
services over the loopback network (tests/fakes), with a job running on w1 for the owner.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulayerd.app.common.requester import Requester
from gpulayerd.app.owner import explainer
from gpulayerd.app.owner.explainer import TAIL_BYTES, TAIL_LINES, Tail, build_state, state_explanation, tail_of
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models import ExplanationModel, LogChunk
from gpulayerd.store import JobRow
from gpulayerd.store.rows import AttemptRow, EventRow
from tests.fakes.daemons import OWNER, W1, Lab, d
from tests.unit.test_services_authz import running_on_w1

NAMES = {"w1-node-id-0000000000": "gpu-box", "owner-node-id": "desk"}


def name_of(node: str | None) -> str | None:
    return None if node is None else NAMES.get(node, node[:12])


def row(status: JobStatus, *, attempt: int = 1, exit_code: int | None = None, reason: str = "",
        cancel_requested: bool = False) -> JobRow:
    return JobRow(id="j1", spec_json="{}", status=status, lease_s=30.0, submitted_at=100.0, updated_at=200.0,
                  attempt=attempt, holder="w1-node-id-0000000000", exit_code=exit_code, reason=reason,
                  cancel_requested=cancel_requested)


def attempt(*, started: float | None = 110.0, ended: float | None = None, code: int | None = None,
            gang: list[str] | None = None) -> AttemptRow:
    placement = {"worker": "w1-node-id-0000000000", "environment": "/usr/bin/python3", "accelerator": "cuda",
                 "device_indices": [0, 2], "device_uuids": [None, None]}
    if gang:
        placement["gang"] = gang
    return AttemptRow(job_id="j1", attempt=1, worker="w1-node-id-0000000000", placement_json=json.dumps(placement),
                      state="exited" if ended else "running", started_at=started, ended_at=ended, exit_code=code)


def event(seq: int, at: float, kind: str, src: JobStatus | None, dst: JobStatus | None, reason: str = "") -> EventRow:
    return EventRow(seq=seq, job_id="j1", at=at, kind=kind, from_status=src, to_status=dst, attempt=1,
                    reason=reason, stimulus_id="")


HISTORY = [event(1, 100.0, "state", None, JobStatus.QUEUED), event(2, 105.0, "state", JobStatus.QUEUED,
                                                                   JobStatus.CLAIMED),
           event(3, 110.0, "state", JobStatus.CLAIMED, JobStatus.RUNNING)]


def test_a_running_job_says_where_since_when_and_its_lease() -> None:
    state = build_state(row(JobStatus.RUNNING), [attempt()], HISTORY, owner_name="desk", name_of=name_of,
                        lease_expires_at=140.0)
    assert (state.status, state.attempt, state.node, state.node_name) == (
        "running", 1, "w1-node-id-0000000000", "gpu-box")
    assert (state.gpus, state.environment, state.since, state.lease_expires_at) == (
        [0, 2], "/usr/bin/python3", 110.0, 140.0)
    assert state.outcome is None and state.stderr_tail is None
    e = state_explanation("j1", state)
    assert (e.verdict, e.summary) == ("running", "running on gpu-box GPU 0,2 with /usr/bin/python3, attempt 1")
    assert e.workers == [] and e.placement is None
    assert "fits" not in e.model_dump_json()
    rows = dict(state.rows())
    assert rows["on"] == "gpu-box GPU 0,2" and rows["attempt"] == "1" and rows["node"] == "w1-node-id-0"


def test_a_failed_job_has_its_exit_code_duration_and_stderr_tail() -> None:
    tail = Tail(["Traceback", "boom"])
    done = [*HISTORY, event(4, 113.5, "state", JobStatus.RUNNING, JobStatus.FAILED, "exited 3")]
    state = build_state(row(JobStatus.FAILED, exit_code=3, reason="exited 3"), [attempt(ended=113.5, code=3)], done,
                        owner_name="desk", name_of=name_of, lease_expires_at=999.0, tail=tail)
    assert (state.outcome, state.exit_code, state.signal, state.duration_s) == ("exited 3", 3, None, 3.5)
    assert (state.since, state.lease_expires_at, state.stderr_tail) == (113.5, None, ["Traceback", "boom"])
    e = state_explanation("j1", state)
    assert e.verdict == "failed: exited 3"
    assert e.summary == "exited 3 on gpu-box GPU 0,2 after 3s (attempt 1)"
    assert ExplanationModel.model_validate_json(e.model_dump_json()) == e  # the wire round trip


def test_a_job_killed_by_a_signal_names_the_signal() -> None:
    state = build_state(row(JobStatus.FAILED, exit_code=-9), [attempt(ended=120.0, code=-9)], HISTORY,
                        owner_name="desk", name_of=name_of)
    assert (state.outcome, state.signal, state.exit_code) == ("killed by signal 9", 9, -9)
    assert state_explanation("j1", state).verdict == "failed: killed by signal 9"
    assert ("signal", "9") in state.rows()


def test_a_succeeded_job_never_says_fits() -> None:
    state = build_state(row(JobStatus.SUCCEEDED, exit_code=0, reason="exited 0"), [attempt(ended=111.0, code=0)],
                        HISTORY, owner_name="desk", name_of=name_of)
    e = state_explanation("j1", state)
    assert (e.verdict, state.outcome, state.exit_code) == ("succeeded", "exited 0", 0)
    assert "fits" not in e.model_dump_json() and "fits" not in e.summary


def test_a_cancelled_job_names_who_cancelled_it() -> None:
    history = [*HISTORY, event(4, 115.0, "cancel requested by alice", JobStatus.RUNNING, JobStatus.RUNNING,
                               "cancel requested; stopping attempt 1 on w1"),
               event(5, 116.0, "state", JobStatus.RUNNING, JobStatus.CANCELLED, "cancelled by user (exit by signal 15)")]
    state = build_state(row(JobStatus.CANCELLED, exit_code=-15, reason="cancelled by user (exit by signal 15)"),
                        [attempt(ended=116.0, code=-15)], history, owner_name="desk", name_of=name_of)
    assert (state.by, state.since, state.signal) == ("alice", 116.0, 15)
    e = state_explanation("j1", state)
    assert (e.verdict, e.summary) == ("cancelled", "cancelled by alice: cancelled by user (exit by signal 15)")


def test_a_lost_job_says_why_and_a_rejected_one_keeps_its_rejections() -> None:
    reason = "attempt 1 lost: no lease renewal from w1-node-id-0000000000 for 30 s + 5 s grace; lost"
    state = build_state(row(JobStatus.LOST, reason=reason), [attempt()], HISTORY, owner_name="desk",
                        name_of=name_of, readable=lambda s: s.replace("w1-node-id-0000000000", "gpu-box"))
    assert (state.outcome, state.by) == ("lost", "desk (its owner: the lease ran out)")
    assert state.reason == "attempt 1 lost: no lease renewal from gpu-box for 30 s + 5 s grace; lost"

    stored = ExplanationModel.model_validate({
        "job_id": "j1", "verdict": "fits nowhere we know", "summary": "x",
        "rejections": [{"code": "UNSUPPORTED", "requirement": "accelerator", "wanted": "rocm", "found": "-",
                        "worker": "", "message": "rocm is not supported"}]})
    rejected = build_state(row(JobStatus.REJECTED, attempt=0, reason="rocm is not supported"), [], HISTORY[:1],
                           owner_name="desk", name_of=name_of)
    e = state_explanation("j1", rejected, stored)
    assert (e.verdict, rejected.by, rejected.node) == ("rejected", "desk (its owner, at submit)", None)
    assert [r.message for r in e.rejections] == ["rocm is not supported"]


def test_the_tail_is_bounded_by_lines_and_bytes() -> None:
    many = "".join(f"line {i}\n" for i in range(100)).encode()
    t = tail_of(many, whole=True)
    assert t.lines == [f"line {i}" for i in range(100 - TAIL_LINES, 100)]
    assert t.note == f"the last {TAIL_LINES} lines of stderr"
    long = b"x" * (3 * TAIL_BYTES) + b"\nend\n"
    t = tail_of(long, whole=True)  # the cut first line is dropped, the tail stays within the bytes
    assert t == Tail(["end"], "the last 1 line of stderr")
    wide = ("é" * TAIL_BYTES + "\n" + "é" * 10 + "\n").encode()  # cut inside a character: still text
    assert tail_of(wide, whole=True).lines == ["é" * 10]
    assert tail_of(b"", whole=True) == Tail([], "stderr is empty")
    assert tail_of(b"only\n\n", whole=True) == Tail(["only"], "")


@pytest.mark.asyncio
async def test_a_remote_tail_reads_only_the_end_when_the_worker_tells_the_size() -> None:
    log = ("".join(f"row {i}\n" for i in range(3000))).encode()
    offsets: list[int] = []

    async def fetch(offset: int) -> LogChunk:
        offsets.append(offset)
        data = log[offset:offset + 8192]
        return LogChunk(job_id="j1", attempt=1, stream="stderr", offset=offset, next_offset=offset + len(data),
                        data=data.decode(), complete=offset + len(data) >= len(log), size=len(log))

    t = await explainer.remote_tail(fetch)
    assert offsets == [0, len(log) - TAIL_BYTES]
    assert t.lines is not None and t.lines[-1] == "row 2999" and len(t.lines) == TAIL_LINES


# ---------------------------------------------------------------------- through the services


async def write_stderr(lab: Lab, job: str, text: str) -> None:
    run = await d(lab, "w1").store.runs.remote_run(OWNER, job, 1)
    assert run is not None
    Path(run.run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run.run_dir) / "stderr.log").write_text(text)


@pytest.mark.asyncio
async def test_explain_of_a_job_running_on_a_worker_then_failing_there(lab: Lab) -> None:
    owner, w1 = d(lab, "owner"), d(lab, "w1")
    job = await running_on_w1(lab)
    e = await owner.services.owner.explain(job)
    assert e.state is not None and e.verdict == "running", e
    assert (e.state.node, e.state.attempt, e.state.lease_expires_at is not None) == (W1, 1, True)
    assert e.workers == [] and "fits" not in e.model_dump_json()

    await write_stderr(lab, job, "loading\nboom\n")
    w1.runner.exit(job, 1, 3)
    await lab.settle()
    await lab.step()
    assert (await lab.job(owner, job)).status == "failed"
    e = await owner.services.owner.explain(job)  # the tail comes from w1 through the peer logs route
    assert e.state is not None and e.verdict == "failed: exited 3", e
    assert (e.state.exit_code, e.state.node, e.state.stderr_tail) == (3, W1, ["loading", "boom"])

    user = (await lab.job(owner, job)).spec.user or (await lab.job(owner, job)).submitted_by or ""
    other = await owner.services.owner.explain(job, Requester(uid=4242, user="mallory-" + user))
    assert other.state is not None and other.state.stderr_tail is None
    assert other.state.stderr_note is not None and other.state.stderr_note.startswith("hidden: only")
    assert other.state.exit_code == 3  # the state itself is for everyone


@pytest.mark.asyncio
async def test_a_local_tail_of_a_job_that_wrote_nothing_is_empty_and_of_no_run_dir_is_missing(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "j" / "1"
    run_dir.mkdir(parents=True)
    empty = await explainer.local_tail(run_dir / "stderr.log")  # a silent job leaves no file
    assert empty == tail_of(b"", whole=True) and empty.lines == []
    (run_dir / "stderr.log").write_bytes(b"boom\n")
    assert (await explainer.local_tail(run_dir / "stderr.log")).lines == ["boom"]
    gone = await explainer.local_tail(tmp_path / "runs" / "k" / "1" / "stderr.log")
    assert gone == Tail(None, "no stderr log on this machine")
