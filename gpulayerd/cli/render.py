"""The human-readable reports of ``gpulayer devices``, ``explain`` and ``show``.

Pure functions from API models to text; unknown values print as :data:`gpulayerd.text.DASH`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulayerd import text as fmt

if TYPE_CHECKING:
    from gpulayerd.models import Capabilities, ExplanationModel, JobView

__all__ = ["render_capabilities", "render_explanation", "render_job"]


def render_capabilities(caps: Capabilities) -> str:
    """The ``gpulayer devices`` report of one machine: devices, probe health, Python environments, notes."""
    out = [
        f"{caps.hostname}  node {caps.node_id[:12]}  {fmt.text(caps.platform)}/{fmt.text(caps.machine)}",
        f"CPU: {fmt.text(caps.cpu_count)} logical cores   RAM: {fmt.gb(caps.memory_total_bytes)}",
        "",
        "Devices:",
    ]
    if caps.devices:
        rows = [
            [d.index, d.accelerator.value, d.name, fmt.memory(d.memory_total_bytes, d.memory_used_bytes,
                                                             None if d.memory_kind is None else d.memory_kind.value),
             d.compute_capability, d.driver_version, "yes" if d.execution_supported else "no (detection only)",
             fmt.device_state(d.granted_to, d.foreign_pids)]
            for d in caps.devices
        ]
        out.append(fmt.table(["IDX", "KIND", "NAME", "MEMORY", "CC", "DRIVER", "SCHEDULED", "STATE"], rows, "  "))
    else:
        out.append("  none (CPU only)")
    out += ["", "Probe health:"]
    out.append(fmt.table(["SOURCE", "STATUS", "MESSAGE"],
                         [[h.source, h.status.value, h.message or None] for h in caps.health], "  "))
    out += ["", "Python environments:"]
    for e in caps.environments:
        out.append(f"  {e.interpreter}")
        if not e.ok:
            out.append(f"    broken: {'; '.join(e.notes)}")
            continue
        out.append(f"    python {fmt.text(e.python_version)}")
        for name, f in sorted(e.frameworks.items()):
            extra = "" if f.distribution == name else f" (from {f.distribution})"
            bad = "" if f.valid else "  [not a PEP 440 version]"
            out.append(f"    {name} {f.version}{extra}{bad}")
        if "torch" in e.frameworks:
            out.append(f"    torch.cuda: {_avail(e.torch_cuda)}   torch.mps: {_avail(e.torch_mps)}   "
                       f"distributed: {_backends(e.distributed_backends)}")
    if caps.notes:
        out += ["", "Notes:", *(f"  - {n}" for n in caps.notes)]
    return "\n".join(out)


def _avail(v: bool | None) -> str:
    return "unknown" if v is None else ("available" if v else "not available")


def _backends(v: Sequence[str] | None) -> str:
    if v is None:
        return "unknown"
    return ", ".join(f"{b} available" for b in v) if v else "no backends"


def render_explanation(e: ExplanationModel, title: str) -> str:
    """The human-readable explanation: per worker, each requirement observed vs wanted, then the verdict."""
    out = [title, ""]
    if e.rejections:
        out.append("Rejected before matching (no worker can ever run it):")
        out += [f"  ✗ {r.requirement}: {r.message}" for r in e.rejections]
    for w in e.workers:
        label = w.name if w.name == w.worker else f"{w.name} ({w.worker[:12]})"
        out.append(f"worker {label}: {w.state.replace('_', ' ')}")
        rows = [[fmt.mark(c.ok), c.requirement, c.wanted, c.found] for c in w.checks]
        out.append(fmt.table(["", "REQUIREMENT", "WANTED", "FOUND"], rows, "  "))
        for r in w.rejections:
            out.append(f"  why: {r.message}")
        if w.placement is not None:
            devs = ", ".join(str(i) for i in w.placement.device_indices) or "none (CPU)"
            out.append(f"  would run with {w.placement.environment} on devices: {devs}")
        out.append("")
    verdict = f"verdict: {e.verdict}"
    if e.placement is not None:
        devs = ",".join(str(i) for i in e.placement.device_indices)
        name = next((w.name for w in e.workers if w.worker == e.placement.worker), e.placement.worker)
        verdict += f" -> {name}" + (f" GPU {devs}" if devs else "")
    out.append(verdict)
    return "\n".join(out)


def render_job(job: JobView) -> str:
    """``gpulayer show``: user, state, spec, attempts, history and (waiting) the explanation.

    Another user's job (``spec_hidden``) shows no command, workdir or environment.
    """
    r = job.spec.requirements
    user = job.spec.user or job.submitted_by
    if job.spec_hidden:
        hidden = f"(hidden: only {user or 'its user'} and admins see it)"
        command, workdir = hidden, hidden
    else:
        command, workdir = shlex.join(job.spec.command), fmt.text(job.spec.workdir)
    out = [
        f"job {job.id}" + (f" ({job.name})" if job.name else ""),
        f"  user:      {user or fmt.DASH}",
        f"  state:     {job.status}" + (" (cancel requested)" if job.cancel_requested else ""),
        f"  reason:    {job.reason or fmt.DASH}",
        f"  command:   {command}",
        f"  workdir:   {workdir}",
        f"  wants:     {r.accelerator.value}"
        + (f" x{r.effective_gpu_count}" if r.effective_gpu_count else "")
        + (f", >= {r.gpu_memory_gb:g} GB" if r.gpu_memory_gb else "")
        + (f", cc >= {r.min_cuda_compute_capability}" if r.min_cuda_compute_capability else "")
        + "".join(f", {k}{v}" for k, v in sorted(r.frameworks.items()))
        + (f", python{r.python}" if r.python else ""),
        f"  submitted: {fmt.clock(job.submitted_at)} by {job.submitted_by or fmt.DASH}",
        f"  exit code: {fmt.text(job.exit_code)}",
    ]
    if job.spec.distributed is not None:
        d = job.spec.distributed
        out.append(f"  torch.distributed: nnodes {d.nnodes}, nproc_per_node {d.nproc_per_node}, "
                   f"backend {d.backend or 'default'}")
    if job.attempts:
        out.append("attempts:")
        for a in job.attempts:
            devs = ",".join(str(i) for i in a.placement.device_indices) if a.placement else ""
            where = a.worker_name or a.worker[:12]
            if a.gang:
                where = "hosts " + ", ".join(m[:12] for m in a.gang) + " (node ranks in this order)"
            out.append(f"  #{a.attempt} on {where} {a.state}" + (f" GPU {devs}" if devs else "")
                       + f", exit {fmt.text(a.exit_code)}" + (f" ({a.reason})" if a.reason else ""))
            if a.run_dir:
                out.append(f"     logs: {a.run_dir}")
    if job.events:
        out.append("history:")
        for e in job.events:
            move = f"{e.from_status or ''} -> {e.to_status}" if e.to_status != e.from_status else e.kind
            out.append(f"  {fmt.clock(e.at)}  {move:<22} {e.reason}")
    if job.explanation is not None and job.status in ("queued", "rejected"):
        out += ["", render_explanation(job.explanation, title="why it waits:")]
    return "\n".join(out)
