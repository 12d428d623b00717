"""Validation, matching and explanation: does a job fit a worker, and if not, why.

Pure functions of their arguments: no I/O, no clock, no randomness. Every peer that
sees the same inputs reaches the same answer. Rejections are values, never
exceptions; their messages read well alone ("GPU 1 has 16.0 GB < 24 GB required").

Memory is compared in bytes; "GB" in messages and job specs is 10^9 bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    SupportMatrix,
    WorkerSnapshot,
)
from gpulayerd.core.versions import VersionCheck, check_version

__all__ = [
    "Check",
    "Explanation",
    "FitState",
    "Placement",
    "Rejection",
    "RejectionCode",
    "Verdict",
    "WorkerExplanation",
    "evaluate",
    "explain",
    "explain_many",
    "job_signature",
    "match",
    "validate",
]

HEALTH_SOURCE = {
    Accelerator.CUDA: "nvidia-smi",
    Accelerator.ROCM: "rocm-smi",
    Accelerator.MPS: "apple",
}
"""Which probe source reports devices of each accelerator."""


class RejectionCode(str, enum.Enum):
    """Why a requirement is not met."""

    UNSUPPORTED_ACCELERATOR = "UNSUPPORTED_ACCELERATOR"
    DISTRIBUTED_UNSUPPORTED = "DISTRIBUTED_UNSUPPORTED"
    BACKEND_MISMATCH = "BACKEND_MISMATCH"
    ACCELERATOR_MISMATCH = "ACCELERATOR_MISMATCH"
    EXECUTION_UNSUPPORTED = "EXECUTION_UNSUPPORTED"
    PROBE_UNHEALTHY = "PROBE_UNHEALTHY"
    NOT_ENOUGH_DEVICES = "NOT_ENOUGH_DEVICES"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
    MEMORY_KIND_MISMATCH = "MEMORY_KIND_MISMATCH"
    COMPUTE_CAPABILITY_TOO_LOW = "COMPUTE_CAPABILITY_TOO_LOW"
    FLOAT64_UNSUPPORTED = "FLOAT64_UNSUPPORTED"
    UNKNOWN_METRIC = "UNKNOWN_METRIC"
    ENVIRONMENT_BROKEN = "ENVIRONMENT_BROKEN"
    PYTHON_VERSION = "PYTHON_VERSION"
    FRAMEWORK_MISSING = "FRAMEWORK_MISSING"
    FRAMEWORK_VERSION = "FRAMEWORK_VERSION"
    INVALID_VERSION = "INVALID_VERSION"
    TORCH_BACKEND_UNAVAILABLE = "TORCH_BACKEND_UNAVAILABLE"
    WORKDIR_MISSING = "WORKDIR_MISSING"
    RESERVED = "RESERVED"
    FOREIGN_PROCESS = "FOREIGN_PROCESS"
    WORKER_OFFLINE = "WORKER_OFFLINE"


BUSY_CODES = frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS})
"""Codes that mean "fits, but not now"."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One requirement a worker does not meet.

    Attributes:
        code: why.
        requirement: the job-spec field, e.g. ``gpu_memory_gb`` or ``frameworks.torch``.
        wanted: what the job asks for, as text.
        found: what the worker has, as text ("unknown" when not known).
        worker: node id ("" for job-level validation).
        device: device index, when the rejection is about one device.
        environment: interpreter path, when it is about one environment.
        message: one self-contained sentence for people.
    """

    code: RejectionCode
    requirement: str
    wanted: str
    found: str
    worker: str
    message: str
    device: int | None = None
    environment: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: a worker, one of its environments and the granted devices.

    Attributes:
        worker: node id.
        environment: interpreter path used for ``python`` commands.
        device_indices: granted device indices (nvidia-smi order), ascending; empty for CPU.
        device_uuids: the same devices' uuids, in the same order.
        accelerator: the accelerator of the devices (cpu for CPU jobs).
    """

    worker: str
    environment: str
    device_indices: tuple[int, ...]
    device_uuids: tuple[str | None, ...]
    accelerator: Accelerator


class FitState(str, enum.Enum):
    """How one worker relates to one job."""

    FITS_NOW = "fits_now"
    FITS_BUT_BUSY = "fits_but_busy"
    FITS_OFFLINE = "fits_offline"
    NO_FIT = "no_fit"


class Verdict(str, enum.Enum):
    """The overall answer of :func:`explain`, best state over all workers."""

    FITS_NOW = "fits now"
    FITS_BUT_BUSY = "fits but busy"
    FITS_ONLY_OFFLINE = "fits only an offline worker"
    FITS_NOWHERE = "fits nowhere we know"


@dataclass(frozen=True, slots=True)
class Check:
    """One cell row of the worker x requirement table.

    Attributes:
        requirement: job-spec field name.
        wanted: what the job asks for.
        found: what the worker has (per device where it matters).
        ok: True met, False not met, None not checked here (e.g. workdir, checked at claim).
    """

    requirement: str
    wanted: str
    found: str
    ok: bool | None


@dataclass(frozen=True, slots=True)
class WorkerExplanation:
    """One worker's row group in an explanation."""

    worker: str
    name: str
    online: bool
    state: FitState
    checks: tuple[Check, ...]
    rejections: tuple[Rejection, ...]
    placement: Placement | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer of :func:`explain`.

    Attributes:
        job_id: the job.
        verdict: the four-way verdict.
        placement: the best placement now (lowest node id among workers that fit now);
            None unless the verdict is "fits now".
        rejections: job-level rejections from :func:`validate` (then ``workers`` is empty).
        workers: one entry per worker, ordered by node id.
        hosts_needed: workers the job needs at once (``nnodes`` of a multi-host job).
    """

    job_id: str
    verdict: Verdict
    placement: Placement | None
    rejections: tuple[Rejection, ...]
    workers: tuple[WorkerExplanation, ...]
    hosts_needed: int = 1

    @property
    def summary(self) -> str:
        """One line for a job list: the verdict and the first reason."""
        if self.rejections:
            return f"rejected: {self.rejections[0].message}"
        if self.verdict is Verdict.FITS_NOW:
            return "fits now" if self.hosts_needed == 1 else f"fits now on {self.hosts_needed} hosts"
        if not self.workers:
            return "no worker known"
        if self.hosts_needed > 1:
            now = sum(1 for w in self.workers if w.state is FitState.FITS_NOW)
            return f"{self.verdict.value}: needs {self.hosts_needed} hosts at once, {now} fit now"
        reasons = [r.message for w in self.workers for r in w.rejections]
        return f"{self.verdict.value}: {reasons[0]}" if reasons else self.verdict.value


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
            _rej(
                RejectionCode.UNSUPPORTED_ACCELERATOR, "accelerator", acc, row.independent.value, "",
                f"{acc} is {row.independent.value} in gpulayer's support matrix: "
                "such devices are reported but never scheduled",
            )
        )
    if job.accelerator is not Accelerator.CPU and job.gpu_count < 1:
        out.append(
            _rej(
                RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", ">= 1", str(job.gpu_count), "",
                f"a {acc} job needs gpu_count >= 1",
            )
        )
    dist = job.distributed
    if dist is not None:
        if not row.distributed_allowed:
            out.append(
                _rej(
                    RejectionCode.DISTRIBUTED_UNSUPPORTED, "distributed", "distributed job",
                    f"{acc}: distributed {row.distributed.value}", "",
                    f"distributed jobs on {acc} are unsupported (one process per device only)",
                )
            )
        elif dist.backend not in row.distributed_backends:
            allowed = ", ".join(row.distributed_backends) or "none"
            out.append(
                _rej(
                    RejectionCode.BACKEND_MISMATCH, "distributed.backend", dist.backend, allowed, "",
                    f"backend {dist.backend} cannot run on {acc} (allowed on {acc}: {allowed})",
                )
            )
        if dist.nnodes > 1 and not row.multi_host:
            out.append(
                _rej(
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


def evaluate(job: JobRequest, worker: WorkerSnapshot, support: SupportMatrix) -> WorkerExplanation:
    """Full evaluation of one worker: fit state, table rows, rejections, placement."""
    job_level = validate(job, support)
    if job_level:
        rejs = tuple(_with_worker(r, worker.node_id) for r in job_level)
        return WorkerExplanation(worker.node_id, worker.name, worker.online, FitState.NO_FIT, (), rejs, None)

    checks: list[Check] = []
    static: list[Rejection] = []
    busy: list[Rejection] = []

    chosen, dev_static, dev_busy = _choose_devices(job, worker, checks)
    static.extend(dev_static)
    busy.extend(dev_busy)
    env, env_rejs = _choose_environment(job, worker, checks)
    static.extend(env_rejs)
    static.extend(_check_workdir(job, worker, checks))

    checks.append(Check("online", "yes", "yes" if worker.online else "no (offline)", worker.online))
    if static:
        state = FitState.NO_FIT
    elif not worker.online:
        state = FitState.FITS_OFFLINE
        static.append(
            _rej(
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
        worker.node_id, worker.name, worker.online, state, tuple(checks), rejections, placement
    )


def explain(job: JobRequest, workers: Iterable[WorkerSnapshot], support: SupportMatrix) -> Explanation:
    """The worker x requirement table and the four-way verdict for ``job``.

    Deterministic: workers are ordered by node id, devices by uuid; the placement is
    the lowest node id among workers that fit now.
    """
    job_level = validate(job, support)
    if job_level:
        return Explanation(job.job_id, Verdict.FITS_NOWHERE, None, tuple(job_level), ())
    rows = tuple(evaluate(job, w, support) for w in sorted(workers, key=lambda w: w.node_id))
    # A multi-host job needs nnodes workers at once: the verdict is the best state that
    # enough workers reach (counting each worker at its own state or better).
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
    return Explanation(job.job_id, verdict, placement, (), rows, need)


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


def _rej(
    code: RejectionCode,
    requirement: str,
    wanted: str,
    found: str,
    worker: str,
    message: str,
    device: int | None = None,
    environment: str | None = None,
) -> Rejection:
    return Rejection(code, requirement, wanted, found, worker, message, device, environment)


def _with_worker(r: Rejection, worker: str) -> Rejection:
    return Rejection(r.code, r.requirement, r.wanted, r.found, worker, r.message, r.device, r.environment)


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / GB:.1f} GB"


def _gb_wanted(n_bytes: int) -> str:
    return f"{n_bytes / GB:g} GB"


def _cc(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _dev_label(d: DeviceSnapshot) -> str:
    return f"GPU {d.index}" if d.accelerator is not Accelerator.MPS else "Apple GPU"


# --- environments


def _env_requirements(job: JobRequest) -> list[tuple[str, str]]:
    reqs: list[tuple[str, str]] = []
    if job.python is not None:
        reqs.append(("python", job.python))
    reqs.extend((f"frameworks.{n}", s) for n, s in sorted(job.frameworks.items()))
    return reqs


def _needs_torch(job: JobRequest) -> bool:
    return "torch" in job.frameworks or job.distributed is not None


def _env_rejections(job: JobRequest, env: EnvironmentSnapshot, worker: str) -> list[Rejection]:
    where = env.interpreter
    if not env.ok:
        why = "; ".join(env.notes) or "probe failed"
        return [
            _rej(
                RejectionCode.ENVIRONMENT_BROKEN, "environment", "a working interpreter", "broken", worker,
                f"environment {where} could not be probed: {why}", environment=where,
            )
        ]
    out: list[Rejection] = []
    if job.python is not None:
        out.extend(_version_rejection("python", "Python", env.python_version, job.python, worker, where))
    for name, spec in sorted(job.frameworks.items()):
        fw = env.frameworks.get(name)
        if fw is None:
            out.append(
                _rej(
                    RejectionCode.FRAMEWORK_MISSING, f"frameworks.{name}", spec, "not installed", worker,
                    f"{name} is not installed in {where}", environment=where,
                )
            )
            continue
        version = fw.version if fw.valid else None
        if not fw.valid:
            out.append(
                _rej(
                    RejectionCode.INVALID_VERSION, f"frameworks.{name}", spec, fw.version, worker,
                    f"{name} in {where}: installed version {fw.version!r} is not PEP 440", environment=where,
                )
            )
            continue
        out.extend(_version_rejection(f"frameworks.{name}", name, version, spec, worker, where))
    out.extend(_torch_rejections(job, env, worker))
    return out


def _version_rejection(
    requirement: str, label: str, version: str | None, spec: str, worker: str, where: str
) -> list[Rejection]:
    result = check_version(version, spec)
    if result is VersionCheck.OK:
        return []
    if result is VersionCheck.UNKNOWN:
        return [
            _rej(
                RejectionCode.UNKNOWN_METRIC, requirement, spec, "unknown", worker,
                f"{label} version in {where} is unknown, so {spec} cannot be confirmed", environment=where,
            )
        ]
    if result is VersionCheck.INVALID:
        return [
            _rej(
                RejectionCode.INVALID_VERSION, requirement, spec, str(version), worker,
                f"{label} in {where}: installed version {version!r} is not PEP 440", environment=where,
            )
        ]
    code = RejectionCode.PYTHON_VERSION if requirement == "python" else RejectionCode.FRAMEWORK_VERSION
    return [
        _rej(
            code, requirement, spec, str(version), worker,
            f"{label} {version} in {where} does not satisfy {spec}", environment=where,
        )
    ]


def _torch_rejections(job: JobRequest, env: EnvironmentSnapshot, worker: str) -> list[Rejection]:
    if not _needs_torch(job):
        return []
    where = env.interpreter
    if "torch" not in env.frameworks:
        if "torch" in job.frameworks:
            return []  # already reported as FRAMEWORK_MISSING
        return [
            _rej(
                RejectionCode.FRAMEWORK_MISSING, "frameworks.torch", "installed (distributed job)",
                "not installed", worker, f"torch is not installed in {where}; distributed jobs need it",
                environment=where,
            )
        ]
    out: list[Rejection] = []
    for acc, attr in ((Accelerator.CUDA, "torch_cuda"), (Accelerator.MPS, "torch_mps")):
        if job.accelerator is not acc:
            continue
        avail: bool | None = getattr(env, attr)
        name = f"torch.{acc.value}"
        if avail is None:
            out.append(
                _rej(
                    RejectionCode.UNKNOWN_METRIC, name, "available", "unknown", worker,
                    f"whether torch can use {acc.value} in {where} is unknown", environment=where,
                )
            )
        elif not avail:
            out.append(
                _rej(
                    RejectionCode.TORCH_BACKEND_UNAVAILABLE, name, "available", "not available", worker,
                    f"torch in {where} reports {acc.value} unavailable", environment=where,
                )
            )
    if job.distributed is not None:
        backend = job.distributed.backend
        have = env.distributed_backends
        if have is None:
            out.append(
                _rej(
                    RejectionCode.UNKNOWN_METRIC, "distributed.backend", backend, "unknown", worker,
                    f"torch.distributed backends in {where} are unknown", environment=where,
                )
            )
        elif backend not in have:
            found = ", ".join(have) or "none"
            out.append(
                _rej(
                    RejectionCode.BACKEND_MISMATCH, "distributed.backend", backend, found, worker,
                    f"torch in {where} has no {backend} backend (has: {found})", environment=where,
                )
            )
    return out


def _choose_environment(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check]
) -> tuple[EnvironmentSnapshot | None, list[Rejection]]:
    envs = worker.environments
    if not envs:
        checks.append(Check("environment", "a Python environment", "none reported", False))
        return None, [
            _rej(
                RejectionCode.ENVIRONMENT_BROKEN, "environment", "a Python environment", "none",
                worker.node_id, f"worker {worker.name or worker.node_id} reports no Python environment",
            )
        ]
    per_env = [(e, _env_rejections(job, e, worker.node_id)) for e in envs]
    chosen = next((e for e, rs in per_env if not rs), None)
    # Table rows: one per environment requirement, ok if any environment meets it.
    for requirement, wanted in [*_env_requirements(job), *_torch_rows(job)]:
        found_parts = []
        ok = False
        for e, rs in per_env:
            mine = [r for r in rs if r.requirement in (requirement, "environment")]
            ok = ok or not mine
            found_parts.append(_env_found(requirement, e) + ("" if len(envs) == 1 else f" ({e.interpreter})"))
        checks.append(Check(requirement, wanted, "; ".join(found_parts), ok))
    if chosen is not None:
        return chosen, []
    return None, [r for _, rs in per_env for r in rs]


def _torch_rows(job: JobRequest) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if _needs_torch(job) and job.accelerator in (Accelerator.CUDA, Accelerator.MPS):
        rows.append((f"torch.{job.accelerator.value}", "available"))
    if job.distributed is not None:
        rows.append(("distributed.backend", job.distributed.backend))
    return rows


def _env_found(requirement: str, e: EnvironmentSnapshot) -> str:
    if not e.ok:
        return "environment broken"
    if requirement == "python":
        return e.python_version or "unknown"
    if requirement.startswith("frameworks."):
        fw = e.frameworks.get(requirement.split(".", 1)[1])
        return "not installed" if fw is None else fw.version
    if requirement in ("torch.cuda", "torch.mps"):
        v = e.torch_cuda if requirement == "torch.cuda" else e.torch_mps
        return "unknown" if v is None else ("available" if v else "not available")
    if requirement == "distributed.backend":
        return "unknown" if e.distributed_backends is None else (", ".join(e.distributed_backends) or "none")
    return "—"


# --- devices


def _device_rejections(job: JobRequest, d: DeviceSnapshot, worker: str) -> list[Rejection]:
    label = _dev_label(d)
    out: list[Rejection] = []

    def rej(code: RejectionCode, req: str, wanted: str, found: str, msg: str) -> None:
        out.append(_rej(code, req, wanted, found, worker, msg, device=d.index))

    if not d.execution_supported:
        rej(
            RejectionCode.EXECUTION_UNSUPPORTED, "accelerator", job.accelerator.value, "detection only",
            f"{label} ({d.accelerator.value}) is detection-only: gpulayer never schedules on it",
        )
        return out
    if job.gpu_memory_kind is not None:
        want = job.gpu_memory_kind.value
        if d.memory_kind is None:
            rej(RejectionCode.UNKNOWN_METRIC, "gpu_memory_kind", want, "unknown",
                f"{label} memory kind is unknown, so {want} memory cannot be confirmed")
        elif d.memory_kind is not job.gpu_memory_kind:
            rej(RejectionCode.MEMORY_KIND_MISMATCH, "gpu_memory_kind", want, d.memory_kind.value,
                f"{label} has {d.memory_kind.value} memory, {want} required")
    if job.gpu_memory_bytes is not None:
        want = _gb_wanted(job.gpu_memory_bytes)
        if d.memory_total_bytes is None:
            rej(RejectionCode.UNKNOWN_METRIC, "gpu_memory_gb", f">= {want}", "unknown",
                f"{label} memory is unknown, so {want} cannot be confirmed")
        elif d.memory_total_bytes < job.gpu_memory_bytes:
            rej(RejectionCode.INSUFFICIENT_MEMORY, "gpu_memory_gb", f">= {want}", _gb(d.memory_total_bytes),
                f"{label} has {_gb(d.memory_total_bytes)} < {want} required")
    if job.min_cuda_compute_capability is not None:
        want = _cc(job.min_cuda_compute_capability)
        if d.compute_capability is None:
            rej(RejectionCode.UNKNOWN_METRIC, "min_cuda_compute_capability", f">= {want}", "unknown",
                f"{label} compute capability is unknown, so >= {want} cannot be confirmed")
        elif d.compute_capability < job.min_cuda_compute_capability:
            have = _cc(d.compute_capability)
            rej(RejectionCode.COMPUTE_CAPABILITY_TOO_LOW, "min_cuda_compute_capability", f">= {want}", have,
                f"{label} has compute capability {have} < {want} required")
    if job.requires_float64:
        if d.float64 is None:
            rej(RejectionCode.UNKNOWN_METRIC, "requires_float64", "yes", "unknown",
                f"{label} float64 support is unknown")
        elif not d.float64:
            rej(RejectionCode.FLOAT64_UNSUPPORTED, "requires_float64", "yes", "no",
                f"{label} ({d.accelerator.value}) has no 64-bit floats")
    return out


def _busy_rejection(d: DeviceSnapshot, worker: str) -> Rejection:
    label = _dev_label(d)
    if d.granted_to is not None:
        return _rej(RejectionCode.RESERVED, "free devices", "free", f"granted to {d.granted_to}", worker,
                    f"{label} is granted to job {d.granted_to}", device=d.index)
    pids = ", ".join(str(p) for p in d.foreign_pids)
    return _rej(RejectionCode.FOREIGN_PROCESS, "free devices", "free", f"pids {pids}", worker,
                f"{label} is busy with processes gpulayer did not start (pid {pids})", device=d.index)


def _objective(d: DeviceSnapshot) -> tuple[int, str, int]:
    # Best fit: the smallest device that satisfies the job, then uuid, then index.
    return (d.memory_total_bytes or 0, d.uuid or "", d.index)


def _choose_devices(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check]
) -> tuple[list[DeviceSnapshot] | None, list[Rejection], list[Rejection]]:
    acc = job.accelerator
    wid = worker.node_id
    if job.gpu_count == 0:
        checks.append(Check("accelerator", acc.value, "cpu", True))
        return _cpu_slots(job, worker, checks)
    kind = sorted((d for d in worker.devices if d.accelerator is acc), key=lambda d: d.sort_key)
    supported = [d for d in kind if d.execution_supported]
    found_acc = f"{len(supported)} x {acc.value}" if supported else _no_device_found(worker)
    checks.append(Check("accelerator", acc.value, found_acc, bool(supported)))
    if not kind:
        health = next((h for h in worker.health if h.source == HEALTH_SOURCE.get(acc)), None)
        if health is not None and health.status not in (ProbeStatus.OK, ProbeStatus.NOT_FOUND,
                                                        ProbeStatus.NO_DEVICES):
            msg = f"{health.source} failed ({health.status.value}): {health.message}".rstrip(": ")
            return None, [_rej(RejectionCode.PROBE_UNHEALTHY, "accelerator", acc.value,
                               health.status.value, wid, f"{acc.value} devices unknown: {msg}")], []
        kinds = sorted({d.accelerator.value for d in worker.devices})
        has = f"it has {', '.join(kinds)}" if kinds else "it is CPU-only"
        return None, [_rej(RejectionCode.ACCELERATOR_MISMATCH, "accelerator", acc.value,
                           _no_device_found(worker), wid,
                           f"worker {worker.name or wid} has no {acc.value} device ({has})")], []

    per_dev = [(d, _device_rejections(job, d, wid)) for d in kind]
    fit = [d for d, rs in per_dev if not rs]
    free = [d for d in fit if not d.busy]
    _device_rows(job, per_dev, checks)
    want_n = job.gpu_count
    checks.append(Check("gpu_count", f">= {want_n}", f"{len(fit)} qualify, {len(free)} free",
                        len(free) >= want_n if len(fit) >= want_n else False))
    if len(fit) < want_n:
        rejs = [r for _, rs in per_dev for r in rs]
        rejs.append(_rej(RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", str(want_n), str(len(fit)), wid,
                         f"needs {want_n} qualifying {acc.value} device(s), worker "
                         f"{worker.name or wid} has {len(fit)}"))
        return None, rejs, []
    if len(free) < want_n:
        return None, [], [_busy_rejection(d, wid) for d in fit if d.busy]
    chosen = sorted(free, key=_objective)[:want_n]
    return chosen, [], []


def _cpu_slots(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check]
) -> tuple[list[DeviceSnapshot] | None, list[Rejection], list[Rejection]]:
    need = job.distributed.nproc_per_node if job.distributed is not None else 1
    total, free = worker.cpu_slots_total, worker.cpu_slots_free
    if total is None or free is None:
        return [], [], []
    wid = worker.node_id
    checks.append(Check("cpu slots", f">= {need}", f"{free} free of {total}", need <= free))
    if need > total:
        return None, [_rej(RejectionCode.NOT_ENOUGH_DEVICES, "cpu slots", str(need), str(total), wid,
                           f"needs {need} CPU slots, worker {worker.name or wid} has {total} in all")], []
    if need > free:
        return None, [], [_rej(RejectionCode.RESERVED, "cpu slots", str(need), f"{free} free", wid,
                               f"needs {need} CPU slots, {total - free} of {total} are in use by other jobs")]
    return [], [], []


def _no_device_found(worker: WorkerSnapshot) -> str:
    kinds = sorted({d.accelerator.value for d in worker.devices})
    return "none (has: " + ", ".join(kinds) + ")" if kinds else "none (cpu only)"


def _device_rows(
    job: JobRequest, per_dev: Sequence[tuple[DeviceSnapshot, list[Rejection]]], checks: list[Check]
) -> None:
    rows: list[tuple[str, str]] = []
    if job.gpu_memory_kind is not None:
        rows.append(("gpu_memory_kind", job.gpu_memory_kind.value))
    if job.gpu_memory_bytes is not None:
        rows.append(("gpu_memory_gb", f">= {_gb_wanted(job.gpu_memory_bytes)}"))
    if job.min_cuda_compute_capability is not None:
        rows.append(("min_cuda_compute_capability", f">= {_cc(job.min_cuda_compute_capability)}"))
    if job.requires_float64:
        rows.append(("requires_float64", "yes"))
    for requirement, wanted in rows:
        found = []
        n_ok = 0
        for d, rs in per_dev:
            mine = [r for r in rs if r.requirement in (requirement, "accelerator")]
            n_ok += not mine
            found.append(f"{_dev_label(d)}: {_device_value(requirement, d)}")
        checks.append(Check(requirement, wanted, ", ".join(found), n_ok >= job.gpu_count))


def _device_value(requirement: str, d: DeviceSnapshot) -> str:
    if requirement == "gpu_memory_gb":
        if d.memory_total_bytes is None:
            return "unknown"
        kind = f" {d.memory_kind.value}" if d.memory_kind is not None else ""
        return f"{_gb(d.memory_total_bytes)}{kind}"
    if requirement == "gpu_memory_kind":
        return d.memory_kind.value if d.memory_kind is not None else "unknown"
    if requirement == "min_cuda_compute_capability":
        return _cc(d.compute_capability) if d.compute_capability is not None else "unknown"
    if requirement == "requires_float64":
        return "unknown" if d.float64 is None else ("yes" if d.float64 else "no")
    return "—"


# --- workdir


def _check_workdir(job: JobRequest, worker: WorkerSnapshot, checks: list[Check]) -> list[Rejection]:
    if job.workdir is None:
        return []
    if worker.existing_paths is None:
        checks.append(Check("workdir", job.workdir, "checked when the worker claims", None))
        return []
    if job.workdir in worker.existing_paths:
        checks.append(Check("workdir", job.workdir, "exists", True))
        return []
    checks.append(Check("workdir", job.workdir, "missing", False))
    return [_rej(RejectionCode.WORKDIR_MISSING, "workdir", job.workdir, "missing", worker.node_id,
                 f"workdir {job.workdir} does not exist on {worker.name or worker.node_id}")]
