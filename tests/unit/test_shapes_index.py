"""The incremental judgement (core.matching.shapes.ShapeBook) and the indexed fit-only matcher (core.matching.index)
decide exactly what a full :func:`explain` pass decides."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayerd.core.matching.evaluate import evaluate, explain
from gpulayerd.core.matching.index import WorkerIndex, fit_only
from gpulayerd.core.matching.requirements import _choose_environment, choose_environment
from gpulayerd.core.matching.shapes import ShapeBook, shape_key
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Check, FitState, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.unit.test_properties import jobs, near_job, pairs, workers

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _gpu(index: int, mem_gb: int, granted: str | None = None) -> DeviceSnapshot:
    return DeviceSnapshot(Accelerator.CUDA, index, f"GPU-{index}", "NVIDIA A100", mem_gb * GB, 0,
                          MemoryKind.DEDICATED, (8, 0), "580.126.09", True, True, granted_to=granted)


# ----------------------------------------------------------------- event sequences

EVENTS = ("submit", "exit", "grant", "free", "join", "leave", "caps", "slots")


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[WorkerSnapshot], list[tuple[str, object]]]:
    start = [draw(workers(f"node-{i:02d}")) for i in range(draw(st.integers(1, 3)))]
    steps: list[tuple[str, object]] = []
    for n in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(EVENTS))
        if kind == "submit":
            base = draw(st.sampled_from(start))
            job = draw(near_job(base) if draw(st.booleans()) else jobs())
            steps.append((kind, replace(job, job_id=f"j{n}")))
        elif kind == "join":
            steps.append((kind, draw(workers(f"node-{50 + n:02d}"))))
        else:
            steps.append((kind, draw(st.integers(0, 99))))
    return start, steps


def _apply(kind: str, arg: object, ws: dict[str, WorkerSnapshot], queue: dict[str, JobRequest]) -> None:
    """One event on the cluster as the scheduler sees it."""
    if kind == "submit":
        assert isinstance(arg, JobRequest)
        queue[arg.job_id] = arg
        return
    if kind == "join":
        assert isinstance(arg, WorkerSnapshot)
        ws[arg.node_id] = arg
        return
    assert isinstance(arg, int)
    if kind == "exit" and queue:
        del queue[sorted(queue)[arg % len(queue)]]
        return
    if not ws:
        return
    node = sorted(ws)[arg % len(ws)]
    w = ws[node]
    if kind == "leave":
        del ws[node]
    elif kind in ("grant", "free") and w.devices:
        k = arg % len(w.devices)
        devs = list(w.devices)
        devs[k] = replace(devs[k], granted_to=f"job-x{arg}" if kind == "grant" else None, foreign_pids=())
        ws[node] = replace(w, devices=tuple(devs))
    elif kind == "caps":
        ws[node] = replace(w, environments=w.environments[1:], online=not w.online)
    elif kind == "slots":
        total = w.cpu_slots_total or 4
        ws[node] = replace(w, cpu_slots_total=total, cpu_slots_free=arg % (total + 1))


@pytest.mark.slow
@SETTINGS
@given(histories())
def test_the_incremental_book_decides_what_a_full_pass_decides(
        history: tuple[list[WorkerSnapshot], list[tuple[str, object]]]) -> None:
    start, steps = history
    ws = {w.node_id: w for w in start}
    queue: dict[str, JobRequest] = {}
    book = ShapeBook(SUPPORT_MATRIX)
    for kind, arg in steps:
        _apply(kind, arg, ws, queue)
        current = list(ws.values())
        book.observe(current)
        for job in queue.values():
            assert book.explanation(job, current) == explain(job, current, SUPPORT_MATRIX)
            for w in current:
                assert book.row(job, w) == evaluate(job, w, SUPPORT_MATRIX)
        book.retain(queue)


def test_a_pass_with_nothing_changed_judges_nothing_and_a_freed_device_rejudges_one_worker() -> None:
    a = WorkerSnapshot("node-a", devices=(_gpu(0, 80, granted="job-1"),), environments=ENV)
    b = WorkerSnapshot("node-b", devices=(_gpu(0, 24),), environments=ENV)
    queue = [JobRequest(job_id=f"j{m}", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=m * GB)
             for m in (40, 40, 16)]
    book = ShapeBook(SUPPORT_MATRIX)
    book.observe([a, b])
    first = [book.explanation(j, [a, b]) for j in queue]
    assert book.evaluations == 4  # two shapes x two workers
    assert [e.verdict for e in first] == [Verdict.FITS_BUT_BUSY, Verdict.FITS_BUT_BUSY, Verdict.FITS_NOW]
    assert book.observe([a, b]) == set()
    assert [book.explanation(j, [a, b]) for j in queue] == first
    assert book.evaluations == 4
    freed = replace(a, devices=(_gpu(0, 80),))
    assert book.observe([freed, b]) == {"node-a"}
    assert book.explanation(queue[1], [freed, b]).placement.worker == "node-a"  # type: ignore[union-attr]
    assert book.evaluations == 5  # only node-a's row of the 40 GB shape
    assert shape_key(queue[0]) == shape_key(queue[1]) != shape_key(queue[2])


# ----------------------------------------------------------------- the indexed matcher


@pytest.mark.slow  # (hypothesis: 0.5-1.2 s on a loaded 2-core machine)
@SETTINGS
@given(pairs())
def test_the_prefilter_never_drops_a_worker_the_full_judgement_accepts(
        pair: tuple[JobRequest, WorkerSnapshot]) -> None:
    job, w = pair
    kept = dict((c.node_id, now) for c, now in WorkerIndex([w]).candidates(job))
    row = evaluate(job, w, SUPPORT_MATRIX)
    if row.state is not FitState.NO_FIT:
        assert w.node_id in kept
    if row.state is FitState.FITS_NOW:
        assert kept[w.node_id] is True


@pytest.mark.slow
@SETTINGS
@given(st.lists(workers(), min_size=1, max_size=4, unique_by=lambda w: w.node_id), st.data())
def test_fit_only_gives_explains_verdict_and_placement(ws: list[WorkerSnapshot], data: st.DataObject) -> None:
    index = WorkerIndex(ws)
    for _ in range(3):
        job = data.draw(near_job(data.draw(st.sampled_from(ws))) | jobs())
        e = explain(job, ws, SUPPORT_MATRIX)
        d = fit_only(job, index, SUPPORT_MATRIX)
        assert (d.verdict, d.placement) == (e.verdict, e.placement)


def test_the_index_drops_workers_by_accelerator_memory_and_count_without_judging_them() -> None:
    small = WorkerSnapshot("node-1", devices=(_gpu(0, 16), _gpu(1, 16)), environments=ENV)
    big = WorkerSnapshot("node-2", devices=(_gpu(0, 80, granted="job-9"), _gpu(1, 80)), environments=ENV)
    cpu = WorkerSnapshot("node-3", cpu_slots_total=2, cpu_slots_free=0, environments=ENV)
    index = WorkerIndex([cpu, big, small])
    two_big = JobRequest(accelerator=Accelerator.CUDA, gpu_count=2, gpu_memory_bytes=40 * GB)
    assert [(w.node_id, now) for w, now in index.candidates(two_big)] == [("node-2", False)]
    assert fit_only(two_big, index, SUPPORT_MATRIX).verdict is Verdict.FITS_BUT_BUSY
    one = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=16 * GB)
    d = fit_only(one, index, SUPPORT_MATRIX)
    assert d.placement is not None and d.placement.worker == "node-1" and d.evaluated == 1
    assert [(w.node_id, now) for w, now in index.candidates(JobRequest())] == [
        ("node-1", True), ("node-2", True), ("node-3", False)]


# ----------------------------------------------------------------- kept answers (issue 17)


@pytest.mark.slow
@SETTINGS
@given(st.lists(workers(), min_size=1, max_size=3, unique_by=lambda w: w.node_id), st.data())
def test_kept_decisions_of_jobs_in_one_memory_bucket_or_unchecked_workdir_are_explains(
        ws: list[WorkerSnapshot], data: st.DataObject) -> None:
    """One index, many variants of a job (memory requests around every device's memory, workdirs
    the workers did and did not check): each kept decision is what explain says for that job."""
    index = WorkerIndex(ws)
    mems = sorted({d.memory_total_bytes for w in ws for d in w.devices if d.memory_total_bytes is not None})
    paths = sorted({p for w in ws for p in (w.existing_paths or ())} | {"/nowhere/a", "/nowhere/b"})
    base = data.draw(near_job(data.draw(st.sampled_from(ws))) | jobs())
    for k in range(8):
        mem = data.draw(st.sampled_from([None, 1, *(m + dm for m in mems for dm in (-1, 0, 1))]))
        job = replace(base, job_id=f"j{k}", gpu_memory_bytes=mem if base.gpu_count > 0 else base.gpu_memory_bytes,
                      workdir=data.draw(st.sampled_from([None, *paths])))
        e = explain(job, ws, SUPPORT_MATRIX)
        d = fit_only(job, index, SUPPORT_MATRIX)
        assert (d.job_id, d.verdict, d.placement) == (job.job_id, e.verdict, e.placement)


@SETTINGS
@given(pairs(), st.data())
def test_the_kept_environment_choice_is_the_fresh_one(pair: tuple[JobRequest, WorkerSnapshot],
                                                      data: st.DataObject) -> None:
    job, w = pair
    for _ in range(2):  # the second call answers from the kept entry
        job = replace(job, gpu_memory_bytes=data.draw(st.sampled_from([None, GB, 80 * GB])))
        fresh_checks: list[Check] = []
        kept_checks: list[Check] = []
        assert choose_environment(job, w, kept_checks) == _choose_environment(job, w, fresh_checks)
        assert kept_checks == fresh_checks


def test_a_shape_id_is_never_reused_after_the_book_forgets_a_shape() -> None:
    book = ShapeBook(SUPPORT_MATRIX)
    a = JobRequest(job_id="a", accelerator=Accelerator.CUDA, gpu_count=1)
    b = JobRequest(job_id="b", accelerator=Accelerator.CUDA, gpu_count=2)
    sa, sb = book.shape_of(a), book.shape_of(b)
    book.retain(["b"])
    c = JobRequest(job_id="c", accelerator=Accelerator.CUDA, gpu_count=3)
    assert book.shape_of(c) not in (sa, sb) and book.shape_of(b) == sb


def test_a_change_of_free_cpu_slots_rejudges_cpu_shapes_only() -> None:
    w = WorkerSnapshot("node-1", devices=(_gpu(0, 16),), environments=ENV, cpu_slots_total=4, cpu_slots_free=4)
    gpu_job = JobRequest(job_id="g", accelerator=Accelerator.CUDA, gpu_count=1)
    cpu_job = JobRequest(job_id="c")
    book = ShapeBook(SUPPORT_MATRIX)
    book.observe([w])
    book.explanation(gpu_job, [w])
    book.explanation(cpu_job, [w])
    assert book.evaluations == 2
    busy = replace(w, cpu_slots_free=0)
    book.observe([busy])
    assert book.explanation(gpu_job, [busy]) == explain(gpu_job, [busy], SUPPORT_MATRIX)
    assert book.explanation(cpu_job, [busy]) == explain(cpu_job, [busy], SUPPORT_MATRIX)
    assert book.evaluations == 3  # the CPU job's row only


def test_freeze_answers_a_tuple_seen_lately_by_identity_and_never_a_new_tuple_from_the_cache() -> None:
    from gpulayerd.core.matching.shapes import freeze

    envs = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
    first = freeze(envs)
    assert freeze(envs) is first  # the same tuple again: no walk
    other = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.12.1"),)
    assert freeze(other) != first  # another tuple (even were its id reused) is frozen afresh
    again = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
    assert freeze(again) == first and freeze(again) is not first


def test_a_memo_keeps_what_each_round_reuses_however_many_and_lets_go_of_the_rest() -> None:
    from gpulayerd.core.matching.shapes import _SEEN_MAX, FreezeMemo, freeze

    memo = FreezeMemo()
    many = [(EnvironmentSnapshot(interpreter=f"/opt/py{i}/bin/python", python_version="3.11.7"),)
            for i in range(2 * _SEEN_MAX)]  # more than the module's cache holds
    first = [freeze(t, memo) for t in many]
    assert first == [freeze(t) for t in many]  # the same answers as without a memo
    memo.turn()
    assert all(freeze(t, memo) is f for t, f in zip(many, first, strict=True))  # a round later: all kept
    memo.turn()
    memo.turn()  # two rounds without them
    assert all(freeze(t, memo) is not f for t, f in zip(many[:3], first, strict=False))


def test_a_memo_freezes_a_snapshot_once_per_object_and_a_changed_one_afresh() -> None:
    from gpulayerd.core.matching.shapes import FreezeMemo, freeze

    memo = FreezeMemo()
    w = WorkerSnapshot(node_id="w1", name="one", devices=(), cpu_slots_free=4, gpus_held_by_user={"alice": 1})
    first = freeze(w, memo)
    assert first == freeze(w)  # the answer without a memo
    assert freeze(w, memo) is first  # the same object: no walk
    changed = replace(w, cpu_slots_free=3)
    assert freeze(changed, memo) != first and freeze(changed, memo) == freeze(changed)
    same = replace(w)  # another object equal by value: frozen afresh, equal
    assert freeze(same, memo) == first and freeze(same, memo) is not first
