"""The head of a job's detail: who, what, where, and the reason of its last change."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from gpulayer_tui.widgets.jobs_table import STATE_STYLES, job_cells
from gpulayerd import text as fmt
from gpulayerd.models import JobView, Requirements

__all__ = ["JobSummary", "wants"]


def wants(r: Requirements) -> str:
    """What a job asks for, in one line: "cuda x1, >= 24 GB, cc >= 8.0, torch>=2.4"."""
    parts = [r.accelerator.value + (f" x{r.effective_gpu_count}" if r.effective_gpu_count else "")]
    if r.gpu_memory_gb:
        parts.append(f">= {r.gpu_memory_gb:g} GB" + (f" {r.gpu_memory_kind.value}" if r.gpu_memory_kind else ""))
    elif r.gpu_memory_kind:
        parts.append(f"{r.gpu_memory_kind.value} memory")
    if r.min_cuda_compute_capability:
        parts.append(f"cc >= {r.min_cuda_compute_capability}")
    parts += [f"{k}{v}" for k, v in sorted(r.frameworks.items())]
    if r.python:
        parts.append(f"python{r.python}")
    if r.requires_float64:
        parts.append("float64")
    return ", ".join(parts)


class JobSummary(Static):
    """The job in :attr:`job` (None: not read yet)."""

    DEFAULT_CSS = """
    JobSummary {
        height: auto;
        padding: 0 1;
    }
    """

    job: reactive[JobView | None] = reactive(None, init=False)
    """The job shown."""

    def __init__(self, *, clock: Callable[[], float], id: str | None = None) -> None:
        """A job summary.

        Args:
            clock: wall time now (seconds since the epoch), for the age.
            id: the widget id.
        """
        super().__init__("reading the job…", id=id)
        self._clock = clock

    def watch_job(self, job: JobView | None) -> None:
        if job is None:
            return
        row = job_cells(job, self._clock())
        name, user, state, where, age = row.name, row.user, row.state, row.where, row.age
        spec = job.spec
        text = Text()
        text.append(f"job {job.id}", style="bold")
        if job.name:
            text.append(f" ({name})")
        text.append("  ")
        text.append(state, style=STATE_STYLES.get(state, ""))
        text.append(f"  by {user}  on {where}  age {age}")
        if job.exit_code is not None:
            text.append(f"  exit {job.exit_code}")
        if job.spec_hidden:  # another user's job: no command, workdir or environment
            text.append(f"\ncommand: (hidden: only {user} and admins see it)")
        else:
            text.append(f"\ncommand: {fmt.escape(shlex.join(spec.command))}")
            text.append(f"\nworkdir: {fmt.escape(fmt.text(spec.workdir))}")
        text.append(f"\nwants:   {wants(spec.requirements)}")
        if spec.distributed is not None:
            d = spec.distributed
            text.append(f"; torch.distributed nnodes {d.nnodes} x nproc {d.nproc_per_node}")
        if spec.env:
            text.append("\nenv:     " + fmt.escape(" ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))))
        if spec.policy.retries:
            text.append(f"\npolicy:  retries {spec.policy.retries}, lease {spec.policy.lease_s:g} s")
        text.append(f"\nreason:  {fmt.escape(row.reason) if row.reason else fmt.DASH}")
        if job.position is not None:  # where it stands (the daemon's show): position, holders, estimate
            held = ", ".join(f"{fmt.escape(h.id)} ({fmt.escape(h.user or '?')})" for h in job.holders) or fmt.DASH
            text.append(f"\nqueue:   position {job.position}; held by {held}")
            text.append(f"\nstart:   {fmt.escape(job.estimate or 'unknown')}")
        elif job.usual_duration_s is not None:
            text.append(f"\nusually: {fmt.age(job.usual_duration_s)} ({job.usual_runs} earlier runs)")
        self.update(text)
