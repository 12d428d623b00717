"""Which workers a job may use at all (pure): ``--worker NAME`` and ``--no-slurm``.

- ``worker = "NAME"`` (``gpulayer submit --worker NAME``): only the worker of that name (its host
  name, as ``gpulayer peers`` shows it) may run the job; every other row of its explanation says
  ``ws-2 is not the --worker named (login1)``.
- ``slurm = false`` (``--no-slurm``): no worker backed by a Slurm cluster (``kind = "slurm"``) runs it
  (``login1 is a Slurm worker (--no-slurm)``).

Both are static rejections of the row (code ``WORKER_TARGET``, reason ``Target``): the job waits for
the workers it may use, never for the others. :func:`unknown_worker` is the submit-time check of a name.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpulayerd.core.types import JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Rejection, RejectionCode

__all__ = ["target_rejection", "unknown_worker"]


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


def unknown_worker(name: str, known: Iterable[str]) -> str | None:
    """Why ``--worker NAME`` is refused at submit (no known worker has that name), or None."""
    names = sorted(set(known))
    if not name or name in names:
        return None
    return f"worker: no worker named {name!r}; known workers: {', '.join(names) or 'none'}"
