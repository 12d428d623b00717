"""Validation, matching and explanation: does a job fit a worker, and if not, why.

Pure functions of their arguments: no I/O, no clock, no randomness. Every peer that
sees the same inputs reaches the same answer. Rejections are values, never
exceptions; their messages read well alone ("GPU 1 has 16.0 GB < 24 GB required").
The verdict's value types live in :mod:`gpulayerd.core.verdict`, the per-requirement
checks in :mod:`gpulayerd.core.matching.requirements`.

Memory is compared in bytes; "GB" in messages and job specs is 10^9 bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpulayerd.core.fairshare import gpu_cap_rejection, gpus_of
from gpulayerd.core.matching.requirements import check_workdir, choose_devices, choose_environment
from gpulayerd.core.matching.runtime_checks import check_host
from gpulayerd.core.matching.targeting import overflow_row, prefer_workstations, slurm_refusal, target_rejection
from gpulayerd.core.types import Accelerator, JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.users import account_rejection
from gpulayerd.core.verdict import (
    Check,
    Explanation,
    FitState,
    Placement,
    Rejection,
    RejectionCode,
    Verdict,
    WorkerExplanation,
)

__all__ = ["assemble", "evaluate", "explain", "explain_many", "job_signature", "match", "validate"]


# ----------------------------------------------------------------------------- public


def validate(job: JobRequest, support: SupportMatrix) -> list[Rejection]:
    """Job-level checks that no worker can ever change (run at submit).

    Returns:
        Rejections with ``worker=""``; empty if the job may run somewhere.
    """
    out: list[Rejection] = []
    row = support.row(job.accelerator)
    acc = job.accelerator.value
    if not row.schedulable:
        out.append(
            Rejection(
                RejectionCode.UNSUPPORTED_ACCELERATOR, "accelerator", acc, row.independent.value, "",
                f"{acc} is {row.independent.value} in gpulayer's support matrix: "
                "such devices are reported but never scheduled",
            )
        )
    if job.accelerator is not Accelerator.CPU and job.gpu_count < 1:
        out.append(
            Rejection(
                RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", ">= 1", str(job.gpu_count), "",
                f"a {acc} job needs gpu_count >= 1",
            )
        )
    dist = job.distributed
    if dist is not None:
        if not row.distributed_allowed:
            out.append(
                Rejection(
                    RejectionCode.DISTRIBUTED_UNSUPPORTED, "distributed", "distributed job",
                    f"{acc}: distributed {row.distributed.value}", "",
                    f"distributed jobs on {acc} are unsupported (one process per device only)",
                )
            )
        elif dist.backend not in row.distributed_backends:
            allowed = ", ".join(row.distributed_backends) or "none"
            out.append(
                Rejection(
                    RejectionCode.BACKEND_MISMATCH, "distributed.backend", dist.backend, allowed, "",
                    f"backend {dist.backend} cannot run on {acc} (allowed on {acc}: {allowed})",
                )
            )
        if dist.nnodes > 1 and not row.multi_host:
            out.append(
                Rejection(
                    RejectionCode.DISTRIBUTED_UNSUPPORTED, "distributed.nnodes", str(dist.nnodes), "1",
                    "", f"{acc} jobs cannot span several hosts",
                )
            )
    return out


def match(job: JobRequest, worker: WorkerSnapshot, support: SupportMatrix) -> Placement | list[Rejection]:
    """Place ``job`` on ``worker`` now, or say why not.

    Returns:
        A :class:`Placement` if the worker is online and has enough free qualifying
        devices and a qualifying environment; otherwise the list of rejections
        (never empty), ordered as the requirements are checked.
    """
    ev = evaluate(job, worker, support)
    if ev.placement is not None:
        return ev.placement
    return list(ev.rejections)


def evaluate(job: JobRequest, worker: WorkerSnapshot, support: SupportMatrix, *,
             table: bool = True) -> WorkerExplanation:
    """Full evaluation of one worker: fit state, table rows, rejections, placement.

    ``table`` False leaves out the per-device requirement rows of the table (the costliest text to
    build) and names only the first held device among the busy rejections, for callers that read
    only the state, the placement and the static rejections (the fit-only path, the hints'
    re-judgement); everything else is the same."""
    job_level = validate(job, support)
    if job_level:
        rejs = tuple(_with_worker(r, worker.node_id) for r in job_level)
        return WorkerExplanation(worker.node_id, worker.name, worker.online, FitState.NO_FIT, (), rejs, None)
    return _evaluate_valid(job, worker, table)


def _evaluate_valid(job: JobRequest, worker: WorkerSnapshot, table: bool = True) -> WorkerExplanation:
    """:func:`evaluate` of a job that passed :func:`validate` (checked once per job, not per worker)."""
    checks: list[Check] = []
    static: list[Rejection] = []
    busy: list[Rejection] = []

    chosen, dev_static, dev_busy = choose_devices(job, worker, checks, table=table)
    static.extend(dev_static)
    busy.extend(dev_busy)
    cap = gpu_cap_rejection(job.user, gpus_of(job), worker)  # fair share: max_gpus_per_user
    if cap is not None:
        busy.append(cap)
    env, env_rejs = choose_environment(job, worker, checks)
    static.extend(env_rejs)
    static.extend(check_workdir(job, worker, checks))
    static.extend(check_host(job, worker, checks))  # os, min_driver_version
    if job.user:  # whose account the job runs as here (gpulayerd.core.users)
        account = account_rejection(job.user, worker)
        checks.append(Check("user", job.user, "ok" if account is None else account.found, account is None))
        if account is not None:
            static.append(account)

    target = target_rejection(job, worker) or slurm_refusal(job, worker)  # --worker NAME, --no-slurm, sbatch's no
    if target is not None:
        checks.append(Check(target.requirement, target.wanted, target.found, False))
        static.append(target)
    checks.append(Check("online", "yes", "yes" if worker.online else "no (offline)", worker.online))
    if static:
        state = FitState.NO_FIT
    elif not worker.online:
        state = FitState.FITS_OFFLINE
        static.append(
            Rejection(
                RejectionCode.WORKER_OFFLINE, "online", "yes", "no", worker.node_id,
                f"worker {worker.name or worker.node_id} fits but is offline",
            )
        )
    elif busy:
        state = FitState.FITS_BUT_BUSY
    else:
        state = FitState.FITS_NOW

    placement = None
    if state is FitState.FITS_NOW and env is not None and chosen is not None:
        placement = Placement(
            worker=worker.node_id,
            environment=env.interpreter,
            device_indices=tuple(sorted(d.index for d in chosen)),
            device_uuids=tuple(d.uuid for d in sorted(chosen, key=lambda d: d.index)),
            accelerator=job.accelerator,
        )
    rejections = tuple(static + busy) if state is not FitState.FITS_NOW else ()
    return WorkerExplanation(
        worker.node_id, worker.name, worker.online, state, tuple(checks), rejections, placement, worker.kind == "slurm",
        worker.slurm_partitions, worker.slurm_pending,
    )


def explain(job: JobRequest, workers: Iterable[WorkerSnapshot], support: SupportMatrix) -> Explanation:
    """The worker x requirement table and the four-way verdict for ``job``.

    Deterministic: workers are ordered by node id, devices by uuid; the placement is
    the lowest node id among workers that fit now.
    """
    job_level = validate(job, support)
    if job_level:
        return Explanation(job.job_id, Verdict.FITS_NOWHERE, None, tuple(job_level), ())
    rows = [overflow_row(job, w, _evaluate_valid(job, w)) for w in sorted(workers, key=lambda w: w.node_id)]
    return assemble(job, rows)


def assemble(job: JobRequest, rows: Sequence[WorkerExplanation]) -> Explanation:
    """The :class:`Explanation` of ``job`` (which passed :func:`validate`) from its ``rows``, one
    per worker ordered by node id: the verdict and, when it fits now, the placement (the first
    row that has one)."""
    # A multi-host job needs nnodes workers at once: the verdict is the best state that
    # enough workers reach (counting each worker at its own state or better).
    rows = prefer_workstations(rows)  # [slurm] prefer = last: a Slurm worker only when no workstation fits now
    need = job.distributed.nnodes if job.distributed is not None else 1
    ladder = [(FitState.FITS_NOW, Verdict.FITS_NOW), (FitState.FITS_BUT_BUSY, Verdict.FITS_BUT_BUSY),
              (FitState.FITS_OFFLINE, Verdict.FITS_ONLY_OFFLINE)]
    verdict, seen = Verdict.FITS_NOWHERE, 0
    for state, candidate in ladder:
        seen += sum(1 for r in rows if r.state is state)
        if seen >= need:
            verdict = candidate
            break
    placement = None
    if verdict is Verdict.FITS_NOW:
        placement = next((r.placement for r in rows if r.placement is not None), None)
    return Explanation(job.job_id, verdict, placement, (), tuple(rows), need)


def job_signature(job: JobRequest) -> tuple[object, ...]:
    """Everything about ``job`` that matching reads, as a hashable key (no job id).

    Jobs with equal signatures get equal answers from every worker: HTCondor calls such
    a group an autocluster.
    """
    return (
        job.accelerator,
        job.gpu_count,
        job.gpu_memory_bytes,
        job.gpu_memory_kind,
        job.min_cuda_compute_capability,
        tuple(sorted(job.frameworks.items())),
        job.python,
        job.requires_float64,
        job.distributed,
        job.workdir,
        job.user,
        job.min_driver_version,
        job.cuda_runtime,
        job.os,
        job.worker,
        job.slurm,
    )


def explain_many(
    jobs: Iterable[JobRequest], workers: Sequence[WorkerSnapshot], support: SupportMatrix
) -> list[Explanation]:
    """:func:`explain` for many jobs at once, evaluating each distinct signature once.

    Returns:
        One explanation per job, in the order given; equal to calling :func:`explain`
        on each job.
    """
    seen: dict[tuple[object, ...], Explanation] = {}
    out: list[Explanation] = []
    for job in jobs:
        key = job_signature(job)
        cached = seen.get(key)
        if cached is None:
            cached = seen[key] = explain(job, workers, support)
        out.append(cached if cached.job_id == job.job_id else replace(cached, job_id=job.job_id))
    return out


# -------------------------------------------------------------------------- internals


def _with_worker(r: Rejection, worker: str) -> Rejection:
    return Rejection(r.code, r.requirement, r.wanted, r.found, worker, r.message, r.device, r.environment)

