"""Which workers a job may use at all (pure): ``--worker NAME`` and ``--no-slurm``.

- ``worker = "NAME"`` (``gpulayer submit --worker NAME``): only the worker of that name (its host
  name, as ``gpulayer peers`` shows it) may run the job; every other row of its explanation says
  ``ws-2 is not the --worker named (login1)``.
- ``slurm = false`` (``--no-slurm``): no worker backed by a Slurm cluster (``kind = "slurm"``) runs it
  (``login1 is a Slurm worker (--no-slurm)``).

Both are static rejections of the row (code ``WORKER_TARGET``, reason ``Target``): the job waits for
the workers it may use, never for the others. :func:`unknown_worker` is the submit-time check of a name.
A Slurm worker whose ``sbatch`` refused a user's job lately (no account or association, a partition's
AllowGroups) does not take that user's jobs for a while (:func:`slurm_refusal`, reason ``NotAllowed``).

A Slurm worker comes last (``[slurm] prefer = "last"``): :func:`prefer_workstations` turns its row
"fits now" into "fits but busy" (``login1 is a Slurm worker: a workstation fits now ([slurm] prefer =
last)``) while a workstation fits the job now, so the job is placed and offered there; the cluster gets
what fits no workstation now (every one busy, or none can run it). With ``prefer = "overflow-after = D"``
(:func:`overflow_row`) its row is "fits but busy" until the job has waited D since its submit (``login1 is
a Slurm worker: it takes jobs that waited 10m ([slurm] prefer = overflow-after = 10m)``), then as ``last``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from gpulayerd.core.job_policy import format_duration
from gpulayerd.core.types import JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import FitState, Rejection, RejectionCode, WorkerExplanation

__all__ = ["overflow_row", "prefer_workstations", "slurm_refusal", "target_rejection", "unknown_worker",
           "workstation_first"]


def target_rejection(job: JobRequest, worker: WorkerSnapshot) -> Rejection | None:
    """Why ``worker`` may not run ``job`` whatever it has (``--worker``, ``--no-slurm``), or None."""
    name = worker.name or worker.node_id
    if job.worker and job.worker != name:
        return Rejection(RejectionCode.WORKER_TARGET, "worker", job.worker, name, worker.node_id,
                         f"{name} is not the --worker named ({job.worker})")
    if not job.slurm and worker.kind == "slurm":
        return Rejection(RejectionCode.WORKER_TARGET, "slurm", "no Slurm worker", "a Slurm worker", worker.node_id,
                         f"{name} is a Slurm worker (--no-slurm)")
    return None


def slurm_refusal(job: JobRequest, worker: WorkerSnapshot) -> Rejection | None:
    """Slurm on ``worker`` refused a job of ``job``'s user lately (its words), or None."""
    words = worker.slurm_refused.get(job.user) if job.user else None
    if words is None:
        return None
    return Rejection(RejectionCode.SLURM_REFUSED, "user", job.user, "refused by Slurm", worker.node_id,
                     f"Slurm on {worker.name or worker.node_id} refused {job.user}'s job: {words}")


def unknown_worker(name: str, known: Iterable[str]) -> str | None:
    """Why ``--worker NAME`` is refused at submit (no known worker has that name), or None."""
    names = sorted(set(known))
    if not name or name in names:
        return None
    return f"worker: no worker named {name!r}; known workers: {', '.join(names) or 'none'}"


def prefer_workstations(rows: Sequence[WorkerExplanation]) -> Sequence[WorkerExplanation]:
    """``rows`` with each Slurm worker's "fits now" made "fits but busy" while a workstation's row fits now."""
    if not any(r.state is FitState.FITS_NOW and not r.slurm for r in rows) or not any(r.slurm for r in rows):
        return rows
    return [replace(r, state=FitState.FITS_BUT_BUSY, placement=None, rejections=(Rejection(
        RejectionCode.SLURM_LAST, "prefer", "no workstation fits now", "a workstation fits now", r.worker,
        f"{r.name or r.worker} is a Slurm worker: a workstation fits now ([slurm] prefer = last)"),))
            if r.slurm and r.state is FitState.FITS_NOW else r for r in rows]


def overflow_row(job: JobRequest, worker: WorkerSnapshot, row: WorkerExplanation) -> WorkerExplanation:
    """``row`` (``worker``'s, fits now) made "fits but busy" while ``job`` has waited less than the
    ``overflow-after`` of ``worker`` (a Slurm worker); else ``row`` itself."""
    after = worker.slurm_overflow_after_s
    if worker.kind != "slurm" or after is None or job.waited_s >= after or row.state is not FitState.FITS_NOW:
        return row
    d = format_duration(after)
    return replace(row, state=FitState.FITS_BUT_BUSY, placement=None, rejections=(Rejection(
        RejectionCode.SLURM_LAST, "prefer", f"waited {d}", "waited less", worker.node_id,
        f"{worker.name or worker.node_id} is a Slurm worker: it takes jobs that waited {d} "
        f"([slurm] prefer = overflow-after = {d})"),))


def workstation_first(worker: WorkerSnapshot, fitting_peers: Sequence[WorkerSnapshot]) -> bool:
    """Whether a job that fits this machine (``worker``) now goes to a peer instead: this machine is a Slurm
    worker and ``fitting_peers`` (the peers that fit it now) has a workstation."""
    return worker.kind == "slurm" and any(p.kind != "slurm" for p in fitting_peers)
