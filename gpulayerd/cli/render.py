"""The human-readable reports of ``gpulayer devices``, ``explain`` and ``show``.

Pure functions from API models to text; unknown values print as :data:`gpulayerd.text.DASH`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence

from gpulayerd import text as fmt
from gpulayerd.core.job_facts import JOB_STATES, job_user

TYPE_CHECKING = False  # `typing` costs ~2 ms of `gpulayer jobs`; mypy reads this name as true
if TYPE_CHECKING:
    from gpulayerd.models import AttemptView, Capabilities, DeviceModel, ExplanationModel, JobView, Requirements

# gpulayerd.core.types (~17 ms with its dataclasses) is imported by the device renderers that use it:
# `gpulayer jobs` reaches this module only for reason_cell.

__all__ = ["reason_cell", "render_capabilities", "render_explanation", "render_job"]


def render_capabilities(caps: Capabilities, wide: bool = False, limit: int | None = None,
                        label: Callable[[str], str | None] | None = None) -> str:
    """The ``gpulayer devices`` report of one machine: CPU (cores, the daemon's CPU slots), devices,
    probe health, Python environments, notes.

    A MIG instance's NAME is its profile and its parent GPU's index (``1g.10gb on GPU 0``);
    ``wide`` adds the GPU's name and the instance's ``MIG-…`` uuid (``--json`` has them too).
    ``limit``: the most terminal cells a line may take (None: no limit); when the devices table
    is wider, each device takes two lines (IDX, KIND, NAME and MEMORY, then the rest, labelled),
    and longer lines wrap. ``label``: job id -> "name (user)" for the jobs holding devices
    (:func:`gpulayerd.text.job_label`; None or an unknown id: the id).
    """
    slots = fmt.cpu_slots(caps.cpu_slots_total, caps.cpu_slots_free)
    out = [
        _e(f"{caps.hostname}  node {caps.node_id[:12]}  {fmt.text(caps.platform)}/{fmt.text(caps.machine)}"),
        f"CPU: {fmt.text(caps.cpu_count)} logical cores{f', {slots}' if slots else ''}   "
        f"RAM: {fmt.gb(caps.memory_total_bytes)}",
    ]
    if caps.kind == "slurm":  # a worker backed by a Slurm cluster: its partitions and each node's GRES
        down = next((h.message for h in caps.health if h.source == "slurm" and h.status.value == "error"), None)
        out.append(_e(f"Worker kind: slurm   partitions: {', '.join(caps.slurm_partitions) or 'none seen'}"
                      + (f"   DEGRADED (no new claims): {down}" if down is not None else "")))
        out += [_e(f"  GRES {g}") for g in caps.slurm_gres]
    out += ["", "Devices:"]
    if caps.devices:
        parents = {d.uuid: d.index for d in caps.devices if d.uuid}
        rows = [
            [d.index, _kind(d), _name(d, parents, wide), ("≈ " if d.memory_approximate else "")
             + fmt.memory(d.memory_total_bytes, d.memory_used_bytes,
                          None if d.memory_kind is None else d.memory_kind.value),
             d.compute_capability, d.driver_version, _scheduled(d), _state(d, label)]
            for d in caps.devices
        ]
        headers = ["IDX", "KIND", "NAME", "MEMORY", "CC", "DRIVER", "SCHEDULED", "STATE"]
        table = fmt.table(headers, rows, "  ")
        if limit is not None and max(fmt.width(line) for line in table.splitlines()) > limit:
            table = _two_line_devices(headers, rows, limit)
        out.append(table)
    else:
        out.append("  none (CPU only)")
    out += ["", "Probe health:"]
    out.append(fmt.table(["SOURCE", "STATUS", "MESSAGE"],
                         [[h.source, h.status.value, h.message or None] for h in caps.health], "  ", limit))
    out += ["", "Python environments:"]
    for e in caps.environments:
        out.append(f"  {_e(e.interpreter)}")
        if e.configured:  # a shim resolved once: jobs run the interpreter above, whatever their workdir says
            out.append(f"    configured as {_e(e.configured)} ({_e(e.launcher or 'launcher')}): jobs run the "
                       "interpreter above, its directory first on PATH")
        if e.activation.get("CONDA_PREFIX"):
            sets = sorted(k for k in e.activation if not k.startswith("CONDA_") and k != "PATH")
            out.append(f"    conda environment {_e(e.activation.get('CONDA_DEFAULT_ENV', '?'))}: jobs run activated"
                       + (f" (also sets {_e(', '.join(sets))})" if sets else ""))
        if not e.ok:
            out.append(f"    broken: {_e('; '.join(e.notes))}")
            continue
        arch = "" if e.machine is None else f" ({e.machine}{' under Rosetta' if e.translated else ''})"
        out.append(f"    python {_e(fmt.text(e.python_version))}{_e(arch)}")
        for name, f in sorted(e.frameworks.items()):
            extra = "" if f.distribution == name else f" (from {f.distribution})"
            bad = "" if f.valid else "  [not a PEP 440 version]"
            version = f.version if f.version is not None else f"version unknown ({f.note or 'no metadata'})"
            conflict = f"  [conflict: also {', '.join(f.others)}]" if f.others else ""
            out.append(_e(f"    {name} {version}{extra}{bad}{conflict}"))
        if "torch" in e.frameworks and e.torch_pending:
            out.append("    torch.cuda, torch.mps, distributed: pending (the torch check is still running)")
        elif "torch" in e.frameworks:
            out.append(f"    torch.cuda: {_avail(e.torch_cuda)}   torch.mps: {_avail(e.torch_mps)}   "
                       f"distributed: {_backends(e.distributed_backends)}")
    if caps.notes:
        out += ["", "Notes:", *(f"  - {_e(n)}" for n in caps.notes)]
    text = "\n".join(out)
    return text if limit is None else "\n".join(_wrap_line(line, limit) for line in text.splitlines())


def _two_line_devices(headers: Sequence[str], rows: Sequence[Sequence[object]], limit: int) -> str:
    """The devices table for a narrow terminal: IDX, KIND, NAME and MEMORY as a table, each row
    followed by an indented line with the other columns, labelled ("cc 8.6 · driver 550.54.15 ·
    scheduled yes · free"), wrapped to ``limit`` cells."""
    first = fmt.table(headers[:4], [r[:4] for r in rows], "  ", limit).splitlines()
    out = [first[0]]
    for row, line in zip(rows, first[1:], strict=True):
        cc, driver, scheduled, state = (fmt.escape(fmt.text(c)) for c in row[4:])
        rest = f"cc {cc} · driver {driver} · scheduled {scheduled} · {state}"
        out.append(line)
        out += [f"      {piece}" for piece in fmt.wrap(rest, limit - 6)]
    return "\n".join(out)


def _wrap_line(line: str, limit: int) -> str:
    """``line`` wrapped to ``limit`` cells, continuation lines indented 2 cells more than it."""
    if fmt.width(line) <= limit:
        return line
    lead = line[: len(line) - len(line.lstrip(" "))] + "  "
    pieces = fmt.wrap(line.strip(" "), max(12, limit - len(lead)))
    return "\n".join([line[: len(lead) - 2] + pieces[0], *(lead + p for p in pieces[1:])])


def _runtime_wants(r: Requirements) -> str:
    """``, cuda_runtime==12.4, driver >= 525.60.13, os linux`` for the runtime requirements that are set."""
    return ((f", cuda_runtime{r.cuda_runtime}" if r.cuda_runtime else "")
            + (f", driver >= {r.min_driver_version}" if r.min_driver_version else "")
            + (f", os {r.os}" if r.os else ""))


def _kind(d: DeviceModel) -> str:
    from gpulayerd.core.types import DeviceKind

    return fmt.device_kind(d.accelerator.value, d.kind is DeviceKind.MIG)


def _name(d: DeviceModel, parents: dict[str, int], wide: bool) -> str | None:
    """NAME (:func:`gpulayerd.text.device_name`): a MIG instance's profile and parent GPU index
    (``wide``: the GPU's name and the instance's uuid too), a lost GPU's bus id, else the device's name."""
    from gpulayerd.core.types import DeviceKind, DeviceState

    return fmt.device_name(d.name, mig=d.kind is DeviceKind.MIG, mig_profile=d.mig_profile,
                           parent_index=parents.get(d.parent_uuid or ""), lost=d.state is DeviceState.LOST,
                           pci_bus_id=d.pci_bus_id, uuid=d.uuid, wide=wide)


def _scheduled(d: DeviceModel) -> str:
    """SCHEDULED: whether gpulayer grants this device to jobs as a whole, and if not, why."""
    from gpulayerd.core.types import DeviceKind, DeviceState

    if d.state is DeviceState.LOST:
        return "no (lost)"
    if d.state is DeviceState.EXCLUDED:
        return "no (excluded)"
    if d.state is DeviceState.UNUSABLE:
        return "no (unusable)"
    if d.kind is DeviceKind.GPU and d.mig_enabled:
        return "no (MIG instances only)"
    return "yes" if d.execution_supported else "no (detection only)"


def _state(d: DeviceModel, label: Callable[[str], str | None] | None = None) -> str:
    """STATE of ``gpulayer devices``: lost or unusable (with the tool's words), excluded, MIG mode, processes
    unknown, or grants (the holding job by ``label``: "granted to NAME (user)"); an exclusive compute
    mode is added."""
    from gpulayerd.core.types import EXCLUSIVE_COMPUTE_MODES, DeviceKind

    fault = fmt.fault(d.state.value, d.state_reason)
    if fault is not None:
        return fault
    if d.kind is DeviceKind.GPU and d.mig_enabled:
        return "MIG mode"  # SCHEDULED says: no (MIG instances only)
    state = fmt.device_state(d.granted_to, d.foreign_pids, label)
    if state == "free" and d.to_core().hidden_use:
        state = "busy: memory in use by processes not visible here"
    elif not d.processes_known and state == "free":
        state = "processes unknown (busy)" if d.to_core().unknown_use else "processes unknown (idle by memory.used)"
    if d.compute_mode in EXCLUSIVE_COMPUTE_MODES:
        state += f" [{d.compute_mode}: one process at a time]"
    return state


def _e(value: str) -> str:
    """Text from the daemon, a job or a peer, made safe for a terminal (:func:`gpulayerd.text.escape`)."""
    return fmt.escape(value)


def _avail(v: bool | None) -> str:
    return "unknown" if v is None else ("available" if v else "not available")


def _backends(v: Sequence[str] | None) -> str:
    if v is None:
        return "unknown"
    return ", ".join(f"{b} available" for b in v) if v else "no backends"


def render_explanation(e: ExplanationModel, title: str, limit: int | None = None) -> str:
    """The human-readable explanation: per worker, each requirement observed vs wanted, then the verdict;
    with ``limit`` (terminal cells), a FOUND too long for the line goes on under its column.

    A job that is not waiting (``e.state``) shows where it runs or ran and how it ended
    instead, with a failed job's stderr tail when there is one.
    """
    out = [title, ""]
    if e.state is not None:
        pairs = e.state.rows()
        wide = max(len(label) for label, _ in pairs) + 1
        out += [f"  {label + ':':<{wide}} {value}" for label, value in pairs]
        tail = e.state.stderr_lines()
        if tail:
            out += ["", "stderr (last lines):", *(f"  {line}" for line in tail)]
        out.append("")
    if e.state is None and not e.workers and not e.rejections and e.summary:
        out += [f"  {_e(e.summary)}", ""]  # e.g. the owner is unreachable: what the machine running it knows
    if e.rejections:
        out.append("Rejected before matching (no worker can ever run it):")
        out += [f"  ✗ {_e(r.requirement)}: {_e(r.message)}" for r in e.rejections]
    for w in e.workers:
        out.append(_e(f"worker {w.label()}: {w.state_text()}"))
        rows = [[fmt.mark(c.ok), c.requirement, c.wanted, c.found] for c in w.checks]
        out.append(fmt.table(["", "REQUIREMENT", "WANTED", "FOUND"], rows, "  ", limit=limit))
        for r in w.rejections:
            out.append(f"  why: {_e(r.message)}")
        if w.placement is not None:
            devs = ", ".join(str(i) for i in w.placement.device_indices) or "none (CPU)"
            out.append(f"  would run with {_e(w.placement.environment)} on devices: {devs}")
        out.append("")
    verdict = f"verdict: {e.verdict}"
    if e.placement is not None:
        devs = ",".join(str(i) for i in e.placement.device_indices)
        name = next((w.name for w in e.workers if w.worker == e.placement.worker), e.placement.worker)
        verdict += f" -> {name}" + (f" GPU {devs}" if devs else "")
    out.append(_e(verdict))
    if e.hints:
        out += ["", "smallest changes that make it fit (each re-judged against the workers):"]
        out += [f"  - {h.line()}" for h in e.hints]
    if e.position is not None:  # explain's own: show prints the same under the job's reason
        out += ["", *(line.strip() for line in _queue_lines(e))]
    return "\n".join(out)


def render_job(job: JobView) -> str:
    """``gpulayer show``: user, state, spec, attempts, history and (waiting) the explanation.

    Another user's job (``spec_hidden``) shows no command, workdir or environment.
    """
    r = job.spec.requirements
    user = job_user(job.spec.user, job.submitted_by)
    if job.spec_hidden:
        hidden = f"(hidden: only {user or 'its user'} and admins see it)"
        command, workdir = hidden, hidden
    else:
        command, workdir = _e(shlex.join(job.spec.command)), _e(fmt.text(job.spec.workdir))
    out = [
        f"job {job.id}" + (f" ({_e(job.name)})" if job.name else ""),
        f"  user:      {_e(user or fmt.DASH)}",
        f"  state:     {job.status}" + (" (cancel requested)" if job.cancel_requested else ""),
        f"  reason:    {_e(job.reason or fmt.DASH)}",
        f"  command:   {command}",
        f"  workdir:   {workdir}",
        f"  wants:     {r.accelerator.value}"
        + (f" x{r.effective_gpu_count}" if r.effective_gpu_count else "")
        + (f", >= {r.gpu_memory_gb:g} GB" if r.gpu_memory_gb else "")
        + (f", cc >= {r.min_cuda_compute_capability}" if r.min_cuda_compute_capability else "")
        + _e("".join(f", {k}{v}" for k, v in sorted(r.frameworks.items())))
        + (f", python{r.python}" if r.python else "")
        + _e(_runtime_wants(r)),
        f"  submitted: {fmt.clock(job.submitted_at)} by {_e(job.submitted_by or fmt.DASH)}",
        f"  exit code: {fmt.text(job.exit_code)}",
    ]
    if not job.spec_hidden and (job.spec.profile or job.spec.requirement_origins):
        from gpulayerd.cli.profiles import origin_lines

        at = next(i for i, line in enumerate(out) if line.startswith("  wants:")) + 1
        out[at:at] = origin_lines(job.spec.requirement_origins, job.spec.profile)
    at = next(i for i, line in enumerate(out) if line.startswith("  reason:")) + 1
    out[at:at] = _queue_lines(job) + _array_lines(job)
    where = _job_where(job)
    if where is not None:
        out.insert(next(i for i, line in enumerate(out) if line.startswith("  reason:")) + 1,
                   f"  where:     {_e(where)}")
    if job.spec.distributed is not None:
        d = job.spec.distributed
        out.append(f"  torch.distributed: nnodes {d.nnodes}, nproc_per_node {d.nproc_per_node}, "
                   f"backend {d.backend or 'default'}")
    if job.attempts:
        out.append("attempts:")
        out += [line for a in job.attempts for line in _attempt_lines(job, a)]
    if job.events:
        out.append("history:")
        for e in job.events:
            move = f"{e.from_status or ''} -> {e.to_status}" if e.to_status != e.from_status else e.kind
            out.append(f"  {fmt.clock(e.at)}  {move:<22} {_e(e.reason)}")
    if job.explanation is not None and job.status in ("queued", "rejected"):
        out += ["", render_explanation(job.explanation, title="why it waits:")]
    return "\n".join(out)


def _array_lines(job: JobView) -> list[str]:
    """An array's expression and its tasks counted by state; a task's index and its array."""
    a, t = job.array, job.spec.array_task
    if a is not None:
        at_once = f", at most {a.max_running} at once" if a.max_running else ""
        order = ("running", "claimed", "queued", "pending", *JOB_STATES)  # (running first, as jobs counts them)
        counts = ", ".join(f"{n} {_e(s)}" for s, n in sorted(a.counts.items(), key=lambda c: (
            order.index(c[0]) if c[0] in order else len(order), c[0])) if n) or "no task yet"
        return [f"  array:     {_e(a.expr)}: {a.total} task{'s' if a.total != 1 else ''}{at_once}; {counts}",
                f"             (task ids {job.id}_INDEX: gpulayer jobs --tasks, show, logs, cancel)"]
    if t is not None:
        return [f"  task:      index {t.index} of array {t.array_id} ({t.count} task{'s' if t.count != 1 else ''})"]
    return []


def _queue_lines(job: JobView | ExplanationModel) -> list[str]:
    """Where a waiting job stands (position, holders, estimate); a running job's usual duration."""
    lines = []
    if job.position is not None:
        lines.append(f"  position:  {job.position} among the jobs queued here for the same devices")
        for h in job.holders:
            ran = fmt.DASH if h.elapsed_s is None else fmt.age(h.elapsed_s)
            usual = "no earlier run" if h.usual_s is None else (
                f"usually {fmt.age(h.usual_s)} ({h.runs} run{'s' if h.runs != 1 else ''})")
            lines.append(f"  held by:   job {_e(h.id)} of {_e(h.user or '?')}, running {ran}, {usual}")
        lines.append(f"  estimate:  {_e(job.estimate or 'unknown')}")
    elif getattr(job, "usual_duration_s", None) is not None:  # (a JobView's: the CLI imports no models)
        took, runs = float(getattr(job, "usual_duration_s", None) or 0), int(getattr(job, "usual_runs", None) or 0)
        lines.append(f"  usually:   {fmt.age(took)} (the median of {runs} earlier run{'s' if runs != 1 else ''} "
                     "of the same command)")
    return lines


def _job_where(job: JobView) -> str | None:
    """Where the job's latest attempt ran or runs: host and GPUs, or a multi-host job's hosts."""
    if job.where_node is None and not job.where_hosts:
        return None
    return fmt.where(job.where_name or (job.where_node or "")[:12], job.where_devices, job.where_hosts)


def _attempt_lines(job: JobView, a: AttemptView) -> list[str]:
    """One attempt of ``gpulayer show``: "#1 on ws-2 GPU 0,1 exited 0 after 12s", then its log directory."""
    devs = [str(i) for i in a.placement.device_indices] if a.placement else []
    where = a.worker_name or a.worker[:12]
    if a.gang:
        hosts = job.where_hosts if a.attempt == job.attempt and len(job.where_hosts) == len(a.gang) else [
            m[:12] for m in a.gang]
        where = "hosts " + ", ".join(hosts) + " (node ranks in this order)"
    elif devs:
        where += " GPU " + ",".join(devs)
    if a.state == "exited":
        how = f"exited {fmt.text(a.exit_code)}"
    elif a.state == "running" and a.started_at is not None:
        how = f"running since {fmt.clock(a.started_at)}"
    else:
        how = a.state
    if a.started_at is not None and a.ended_at is not None:
        how += f" after {fmt.age(a.ended_at - a.started_at)}"
    lines = [_e(f"  #{a.attempt} on {where} {how}" + (f" ({a.reason})" if a.reason else ""))]
    if a.run_dir:
        lines.append(f"     logs: {_e(a.run_dir)}")
    return lines


def reason_cell(job: JobView, width: int = 90) -> str:
    """REASON of ``gpulayer jobs``: ``"<Code>: <words>"`` on one line, cut to ``width`` characters.

    A reason stored without its code (a queued job not judged yet, a rejected job, an older
    daemon's reason) gets the view's ``reason_code`` in front; other states' reasons as they are.
    """
    reason, code = job.reason, job.reason_code
    if code and not reason.startswith(f"{code}:"):
        reason = f"{code}: {reason}" if reason else code
    return fmt.one_line(reason, width)
