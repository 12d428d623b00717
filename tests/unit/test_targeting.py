"""``--worker NAME``, ``--no-slurm``, ``[slurm] prefer`` and Slurm's refusals in the pure matcher (gpulayerd.core.matching.targeting): the rows
of the workers a job may not use say why, the job is placed only on the others, and an unknown name
is refused at submit naming the known workers."""

from __future__ import annotations

from dataclasses import replace

from gpulayerd.app.worker.slurm_worker import SlurmRefusals
from gpulayerd.cli.render import render_explanation
from gpulayerd.core.matching.evaluate import explain, job_signature
from gpulayerd.core.matching.index import WorkerIndex, fit_only
from gpulayerd.core.matching.shapes import ShapeBook
from gpulayerd.core.matching.targeting import target_rejection, unknown_worker
from gpulayerd.core.protocol.targets import OfferRound
from gpulayerd.core.reasons import reason_of
from gpulayerd.core.scheduling.judging import elsewhere
from gpulayerd.core.types import EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import FitState, RejectionCode, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models.explanation import ExplanationModel

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7", ok=True),)
WS1 = WorkerSnapshot(node_id="n1", name="ws-1", environments=ENV, cpu_slots_total=2, cpu_slots_free=2)
WS2 = WorkerSnapshot(node_id="n2", name="ws-2", environments=ENV, cpu_slots_total=2, cpu_slots_free=2)
LOGIN = WorkerSnapshot(node_id="n0", name="login1", environments=ENV, cpu_slots_total=2, cpu_slots_free=2,
                       kind="slurm", slurm_partitions=("gpu",))


def test_worker_named_is_the_only_placement_and_the_others_say_why() -> None:
    e = explain(JobRequest(job_id="j", worker="ws-2"), [WS1, WS2, LOGIN], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW and e.placement is not None and e.placement.worker == "n2"
    rows = {r.name: r for r in e.workers}
    assert rows["ws-2"].state is FitState.FITS_NOW
    for name in ("ws-1", "login1"):
        assert rows[name].state is FitState.NO_FIT
        assert [r.message for r in rows[name].rejections] == [f"{name} is not the --worker named (ws-2)"]
        assert ("worker", "ws-2", name, False) in [(c.requirement, c.wanted, c.found, c.ok) for c in rows[name].checks]


def test_no_slurm_skips_only_slurm_workers() -> None:
    job = JobRequest(job_id="j", slurm=False)
    assert target_rejection(job, WS1) is None
    rej = target_rejection(job, LOGIN)
    assert rej is not None and rej.code is RejectionCode.WORKER_TARGET
    assert rej.message == "login1 is a Slurm worker (--no-slurm)"
    e = explain(job, [LOGIN], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOWHERE
    assert explain(JobRequest(job_id="j"), [LOGIN], SUPPORT_MATRIX).verdict is Verdict.FITS_NOW


def test_the_fit_only_matcher_and_the_signature_know_the_target() -> None:
    index = WorkerIndex([LOGIN, WS1, WS2])
    for job, where in ((JobRequest(job_id="a", worker="ws-2"), "n2"), (JobRequest(job_id="b", slurm=False), "n1"),
                       (JobRequest(job_id="c"), "n1")):
        d = fit_only(job, index, SUPPORT_MATRIX)
        assert d.placement is not None and d.placement.worker == where, job
    assert job_signature(JobRequest(worker="ws-2")) != job_signature(JobRequest())
    assert job_signature(JobRequest(slurm=False)) != job_signature(JobRequest())


def test_an_unknown_worker_name_is_refused_naming_the_known_ones() -> None:
    assert unknown_worker("", ["ws-1"]) is None
    assert unknown_worker("ws-1", ["ws-1", "login1"]) is None
    assert unknown_worker("ws-9", ["ws-1", "login1", "ws-1"]) == \
        "worker: no worker named 'ws-9'; known workers: login1, ws-1"


BUSY_WS1 = WorkerSnapshot(node_id="n1", name="ws-1", environments=ENV, cpu_slots_total=2, cpu_slots_free=0)


def test_a_slurm_worker_comes_last_while_a_workstation_fits_now() -> None:
    e = explain(JobRequest(job_id="j"), [LOGIN, WS1], SUPPORT_MATRIX)  # login1 has the lowest node id
    assert e.verdict is Verdict.FITS_NOW and e.placement is not None and e.placement.worker == "n1"
    row = next(r for r in e.workers if r.name == "login1")
    assert row.state is FitState.FITS_BUT_BUSY and row.placement is None
    assert [r.message for r in row.rejections] == [
        "login1 is a Slurm worker: a workstation fits now ([slurm] prefer = last)"]
    # every workstation busy (or none can run it): the cluster takes it now
    e = explain(JobRequest(job_id="j"), [LOGIN, BUSY_WS1], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW and e.placement is not None and e.placement.worker == "n0"


def test_a_gateway_that_owns_the_job_leaves_it_to_a_workstation_that_fits_now() -> None:
    book = ShapeBook(SUPPORT_MATRIX)
    job = JobRequest(job_id="j")
    book.observe([LOGIN, WS1])
    here = book.row(job, LOGIN).placement
    assert here is not None
    fit = elsewhere(book, job, here, LOGIN, [WS1], OfferRound({}))
    assert fit is not None and fit.worker == "n1"
    book.observe([LOGIN, BUSY_WS1])
    assert elsewhere(book, job, here, LOGIN, [BUSY_WS1], OfferRound({})) is None  # busy: claimed here
    assert elsewhere(book, job, here, WS2, [WS1], OfferRound({})) is None  # a workstation keeps its CPU job


def test_a_user_slurm_refused_is_kept_off_that_worker_with_slurms_words() -> None:
    words = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination"
    login = WorkerSnapshot(node_id="n0", name="login1", environments=ENV, kind="slurm", slurm_refused={"alice": words})
    e = explain(JobRequest(job_id="j", user="alice"), [login], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOWHERE
    assert reason_of(e).text == f"NotAllowed: Slurm on login1 refused alice's job: {words}"
    assert explain(JobRequest(job_id="j", user="bob"), [login], SUPPORT_MATRIX).verdict is Verdict.FITS_NOW


def test_slurm_refusals_are_kept_for_a_while() -> None:
    now = [0.0]
    refusals = SlurmRefusals(keep_s=600.0, clock=lambda: now[0])
    refusals.remember("alice", "sbatch: error: Invalid account")
    now[0] = 599.0
    assert refusals.now() == {"alice": "sbatch: error: Invalid account"}
    now[0] = 600.0
    assert refusals.now() == {}


def test_explain_names_a_slurm_worker_its_partitions_and_what_slurm_holds_its_jobs_for() -> None:
    busy = replace(LOGIN, cpu_slots_free=0, slurm_pending=("Priority", "Resources"))
    text = render_explanation(ExplanationModel.from_core(explain(JobRequest(job_id="j"), [busy, WS1], SUPPORT_MATRIX)),
                              "job j")
    assert "worker login1 (n0), slurm/gpu: fits but busy (in Slurm: Priority, Resources)\n" in text, text
    assert "worker ws-1 (n1): fits now\n" in text, text
    idle = render_explanation(ExplanationModel.from_core(explain(JobRequest(job_id="j", slurm=False), [LOGIN],
                                                                 SUPPORT_MATRIX)), "job j")
    assert "worker login1 (n0), slurm/gpu: no fit\n" in idle, idle
