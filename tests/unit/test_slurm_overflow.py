"""``[slurm] prefer = "overflow-after = D"`` in the pure core: a Slurm worker takes a job only once it has waited D
since its submit (the queue record's ``submitted_at``, the pass's wall-clock time): before, its row is "fits but
busy" and says why; passes go on meanwhile; after, the job's request carries ``waited_s`` (a new shape) and it
is claimed there (this machine the gateway) or offered there (a peer the gateway)."""

from __future__ import annotations

from dataclasses import replace

from gpulayerd.core import scheduling as core
from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.scheduling.judging import overflow_waits
from gpulayerd.core.types import EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, RejectionCode, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.slurm.settings import SlurmConfig

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7", ok=True),)
GATEWAY = WorkerSnapshot(node_id="n0", name="login1", environments=ENV, cpu_slots_total=2, cpu_slots_free=2,
                         kind="slurm", slurm_partitions=("gpu",), slurm_overflow_after_s=600.0)
WS = WorkerSnapshot(node_id="n1", name="ws-1", environments=ENV, cpu_slots_total=1, cpu_slots_free=0)
WAIT = "login1 is a Slurm worker: it takes jobs that waited 10m ([slurm] prefer = overflow-after = 10m)"


def test_the_setting_is_read_in_seconds() -> None:
    assert SlurmConfig(prefer="overflow-after = 10m").overflow_after_s == 600.0
    assert SlurmConfig().overflow_after_s is None


def test_a_slurm_worker_row_waits_until_the_job_waited_long_enough() -> None:
    e = explain(JobRequest(job_id="j"), [GATEWAY, WS], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_BUT_BUSY and e.placement is None
    row = next(r for r in e.workers if r.name == "login1")
    assert row.state is FitState.FITS_BUT_BUSY and [r.message for r in row.rejections] == [WAIT]
    assert row.rejections[0].code is RejectionCode.SLURM_LAST
    late = explain(JobRequest(job_id="j", waited_s=600.0), [GATEWAY, WS], SUPPORT_MATRIX)
    assert late.verdict is Verdict.FITS_NOW and late.placement is not None and late.placement.worker == "n0"
    last = explain(JobRequest(job_id="j"), [replace(GATEWAY, slurm_overflow_after_s=None), WS], SUPPORT_MATRIX)
    assert last.verdict is Verdict.FITS_NOW  # prefer = last: no workstation fits now, the cluster takes it


def test_waits_move_only_at_the_thresholds() -> None:
    jobs = [core.QueuedJob("a", 1, "", submitted_at=1000.0), core.QueuedJob("b", 2, "", submitted_at=1500.0),
            core.QueuedJob("c", 3, "")]
    reqs = {"a": JobRequest(job_id="a"), "b": JobRequest(job_id="b"), "c": JobRequest(job_id="c")}
    read = core.MachineRead(GATEWAY, (WS,), None, 0.0, wall=1700.0)
    assert overflow_waits(jobs, reqs.__getitem__, read) == ({"a": 600.0}, True)
    reqs["a"] = JobRequest(job_id="a", waited_s=600.0)
    assert overflow_waits(jobs, reqs.__getitem__, replace(read, wall=2200.0)) == ({"b": 600.0}, False)
    assert overflow_waits(jobs, reqs.__getitem__, replace(read, local=replace(GATEWAY, slurm_overflow_after_s=None)))\
        == ({}, False)
    assert overflow_waits(jobs, reqs.__getitem__, replace(read, wall=None)) == ({}, False)


def _pass(c: core.SchedulerCore, job: core.QueuedJob, wall: float,
          first: bool) -> tuple[list[core.Claim], list[Explanation]]:
    """One pass of ``c`` on the gateway (this machine) with ``job`` queued; its claims and the explanations of the
    reasons it wrote."""
    claims: list[core.Claim] = []
    reasons: list[Explanation] = []
    steps, answer = c.run_pass(), None
    while True:
        try:
            action = steps.send(answer)
        except StopIteration:
            return claims, reasons
        answer = core.Resume()
        if isinstance(action, core.ReadChanges):
            answer = core.QueueChanges(1, 1, ((job, True),) if first else ())
        elif isinstance(action, core.ReadQueue):
            answer = core.QueueLoaded(1, (job,))
        elif isinstance(action, core.ReadMachine):
            answer = core.MachineRead(GATEWAY if action.local else None, (WS,), None, wall, wall=wall)
        elif isinstance(action, core.Claim):
            claims.append(action)
            answer = core.ClaimAnswered(True, replace(GATEWAY, cpu_slots_free=1))
        elif isinstance(action, core.StoreReasons):
            reasons += [e for _, _, e in action.items]


def test_the_gateway_claims_a_job_only_once_it_waited_long_enough() -> None:
    c = core.SchedulerCore("n0", SUPPORT_MATRIX, offer_interval_s=5.0)
    job = core.QueuedJob("j", 1, "", JobRequest(job_id="j", user="alice"), submitted_at=1000.0)
    claims, explained = _pass(c, job, 1100.0, first=True)
    assert claims == [] and len(explained) == 1 and explained[0].verdict is Verdict.FITS_BUT_BUSY, explained
    assert [r.message for w in explained[0].workers if w.worker == "n0" for r in w.rejections] == [WAIT]
    assert not c.idle([WS], None)  # passes go on: the clock alone changes the answer
    claims, _ = _pass(c, replace(job, request=None), 1599.0, first=False)
    assert claims == []
    claims, _ = _pass(c, replace(job, request=None), 1600.0, first=False)
    assert [(cl.job.id, cl.placement.worker) for cl in claims] == [("j", "n0")]
