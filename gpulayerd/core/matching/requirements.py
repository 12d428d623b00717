"""The per-requirement checks of matching: devices, CPU slots, environments, workdir.

Each check compares one part of a job against one worker, appends its rows of the worker x
requirement table to ``checks`` and returns rejections. Pure functions of their arguments: no I/O,
no clock, no randomness. Memory is compared in bytes; "GB" in messages is 10^9 bytes.
"""

from __future__ import annotations

from dataclasses import replace

from gpulayerd.core.matching.device_state import (
    busy_rejection,
    cc_text,
    device_label,
    gb_text,
    gb_wanted,
    state_rejections,
)
from gpulayerd.core.matching.devicerows import device_rows
from gpulayerd.core.matching.runtime_checks import env_runtime_rejections, env_runtime_rows, torch_cuda_build
from gpulayerd.core.matching.versions import VersionCheck, check_version
from gpulayerd.core.types import (
    Accelerator,
    DeviceKind,
    DeviceSnapshot,
    DeviceState,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Check, Rejection, RejectionCode

__all__ = ["HEALTH_SOURCE", "check_workdir", "choose_devices", "choose_environment"]

HEALTH_SOURCE = {
    Accelerator.CUDA: "nvidia-smi",
    Accelerator.ROCM: "rocm-smi",
    Accelerator.MPS: "apple",
}
"""Which probe source reports devices of each accelerator."""



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
            Rejection(
                RejectionCode.ENVIRONMENT_BROKEN, "environment", "a working interpreter", "broken", worker,
                f"environment {where} could not be probed: {why}", environment=where,
            )
        ]
    if job.accelerator is Accelerator.MPS and env.translated is True:
        # Rosetta runs x86_64 code only: torch (or any framework) built for x86_64 macOS has no
        # Metal backend, so such an interpreter never gets the Apple GPU.
        return [
            Rejection(
                RejectionCode.ACCELERATOR_MISMATCH, "environment", "a native arm64 interpreter",
                f"{env.machine or 'x86_64'} under Rosetta", worker,
                f"environment {where} is {env.machine or 'x86_64'} code run by Rosetta on Apple silicon: "
                "it cannot use the Apple GPU (mps)", environment=where,
            )
        ]
    out: list[Rejection] = []
    if job.python is not None:
        out.extend(_version_rejection("python", "Python", env.python_version, job.python, worker, where))
    for name, spec in sorted(job.frameworks.items()):
        fw = env.frameworks.get(name)
        if fw is None:
            out.append(
                Rejection(
                    RejectionCode.FRAMEWORK_MISSING, f"frameworks.{name}", spec, "not installed", worker,
                    f"{name} is not installed in {where}", environment=where,
                )
            )
            continue
        if name == "torch" and env.torch_pending:  # whether it imports is known once the torch check lands
            out.append(
                Rejection(
                    RejectionCode.UNKNOWN_METRIC, f"frameworks.{name}", spec, "pending", worker,
                    f"whether torch imports in {where} is not known{_pending_why(env)}", environment=where,
                )
            )
            continue
        if name in env.import_errors:  # installed, but importing it fails here: no job naming it runs
            out.append(
                Rejection(
                    RejectionCode.ENVIRONMENT_BROKEN, f"frameworks.{name}", spec, "import fails", worker,
                    f"{name}: import fails: {env.import_errors[name]}", environment=where,
                )
            )
            continue
        if fw.version is None:
            why = fw.note or "no version in its metadata"
            out.append(
                Rejection(
                    RejectionCode.UNKNOWN_METRIC, f"frameworks.{name}", spec, "unknown", worker,
                    f"{name} version in {where} is unknown ({why}), so {spec} cannot be confirmed",
                    environment=where,
                )
            )
            continue
        version = fw.version if fw.valid else None
        if not fw.valid:
            out.append(
                Rejection(
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
            Rejection(
                RejectionCode.UNKNOWN_METRIC, requirement, spec, "unknown", worker,
                f"{label} version in {where} is unknown, so {spec} cannot be confirmed", environment=where,
            )
        ]
    if result is VersionCheck.INVALID:
        return [
            Rejection(
                RejectionCode.INVALID_VERSION, requirement, spec, str(version), worker,
                f"{label} in {where}: installed version {version!r} is not PEP 440", environment=where,
            )
        ]
    code = RejectionCode.PYTHON_VERSION if requirement == "python" else RejectionCode.FRAMEWORK_VERSION
    return [
        Rejection(
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
            Rejection(
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
                Rejection(
                    RejectionCode.UNKNOWN_METRIC, name, "available", _unknown(env), worker,
                    f"whether torch can use {acc.value} in {where} is unknown{_pending_why(env)}",
                    environment=where,
                )
            )
        elif not avail:
            why = f"torch in {where} reports {acc.value} unavailable"
            if acc is Accelerator.CUDA and torch_cuda_build(env) == "":
                version = env.frameworks["torch"].version
                why = (f"torch{' ' + version if version else ''} in {where} is a CPU-only build (torch.version.cuda "
                       "is None): it never uses a GPU; a CUDA wheel of torch is needed "
                       "(pip install torch --index-url https://download.pytorch.org/whl/cu124)")
            out.append(
                Rejection(
                    RejectionCode.TORCH_BACKEND_UNAVAILABLE, name, "available", "not available", worker,
                    why, environment=where,
                )
            )
    if job.distributed is not None:
        backend = job.distributed.backend
        have = env.distributed_backends
        if have is None:
            out.append(
                Rejection(
                    RejectionCode.UNKNOWN_METRIC, "distributed.backend", backend, _unknown(env), worker,
                    f"torch.distributed backends in {where} are unknown{_pending_why(env)}", environment=where,
                )
            )
        elif backend not in have:
            found = ", ".join(have) or "none"
            out.append(
                Rejection(
                    RejectionCode.BACKEND_MISMATCH, "distributed.backend", backend, found, worker,
                    f"torch in {where} has no {backend} backend (has: {found})", environment=where,
                )
            )
    return out


_EnvAnswer = tuple[EnvironmentSnapshot | None, tuple[Rejection, ...], tuple[Check, ...]]
_ENV_MEMO: dict[int, tuple[WorkerSnapshot, dict[tuple[object, ...], _EnvAnswer]]] = {}
_ENV_MEMO_WORKERS = 256  # snapshots kept at most (a daemon makes a new one of itself every pass)
_ENV_MEMO_KEYS = 4096  # environment requests kept per snapshot at most (memory stays bounded)


def _env_key(job: JobRequest) -> tuple[object, ...]:
    """What :func:`choose_environment` reads of the job: its environment fields."""
    return (job.accelerator, job.python, tuple(sorted(job.frameworks.items())), job.distributed, job.cuda_runtime)


def choose_environment(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check]
) -> tuple[EnvironmentSnapshot | None, list[Rejection]]:
    """Pick the first of ``worker``'s environments (in the order reported) that meets ``job``.

    Appends one row to ``checks`` per environment requirement (python, frameworks, torch
    backends), ok if any environment meets it.

    Kept per (worker object, the job's environment fields: :func:`_env_key`; at most
    ``_ENV_MEMO_WORKERS`` worker objects), since jobs of
    every memory or device request judge the same environments the same way; the answer is
    exactly :func:`_choose_environment`'s (a property test checks this). A kept entry holds its
    worker, so the id in the key names that object while the entry lives.

    Returns:
        ``(environment, [])`` when one qualifies, else ``(None, rejections)`` with every
        environment's rejections.
    """
    per_worker = _ENV_MEMO.get(id(worker))
    if per_worker is None or per_worker[0] is not worker:
        if len(_ENV_MEMO) >= _ENV_MEMO_WORKERS:
            _ENV_MEMO.clear()
        per_worker = _ENV_MEMO[id(worker)] = (worker, {})
    key = _env_key(job)
    kept = per_worker[1].get(key)
    if kept is None:
        if len(per_worker[1]) >= _ENV_MEMO_KEYS:
            per_worker[1].clear()
        mine: list[Check] = []
        env, rejs = _choose_environment(job, worker, mine)
        kept = per_worker[1][key] = (env, tuple(rejs), tuple(mine))
    checks.extend(kept[2])
    return kept[0], list(kept[1])


def _choose_environment(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check]
) -> tuple[EnvironmentSnapshot | None, list[Rejection]]:
    """:func:`choose_environment` without the memo."""
    envs = worker.environments
    if not envs:
        checks.append(Check("environment", "a Python environment", "none reported", False))
        return None, [
            Rejection(
                RejectionCode.ENVIRONMENT_BROKEN, "environment", "a Python environment", "none",
                worker.node_id, f"worker {worker.name or worker.node_id} reports no Python environment",
            )
        ]
    per_env = [(e, _env_rejections(job, e, worker.node_id) + env_runtime_rejections(job, e, worker)) for e in envs]
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
    checks.extend(env_runtime_rows(job, worker, envs))
    if chosen is not None:
        return chosen, []
    # The environment closest to the job first (its rejections decide the reason line): one that has
    # every framework installed (a broken import, a version off) before one that lacks some, then the
    # fewest rejections; reported order within a tie.
    closest = sorted(per_env, key=lambda p: (sum(r.code is RejectionCode.FRAMEWORK_MISSING for r in p[1]), len(p[1])))
    return None, [r for _, rs in closest for r in rs]


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
        name = requirement.split(".", 1)[1]
        fw = e.frameworks.get(name)
        if fw is not None and name in e.import_errors:
            return f"{fw.version or '?'}, import fails"
        return "not installed" if fw is None else fw.version or "unknown"
    if requirement in ("torch.cuda", "torch.mps"):
        v = e.torch_cuda if requirement == "torch.cuda" else e.torch_mps
        return _unknown(e) if v is None else ("available" if v else "not available")
    if requirement == "distributed.backend":
        return _unknown(e) if e.distributed_backends is None else (", ".join(e.distributed_backends) or "none")
    return "—"


def _unknown(e: EnvironmentSnapshot) -> str:
    """How an unknown torch runtime fact is shown: "pending" while the torch check still runs."""
    return "pending" if e.torch_pending else "unknown"


def _pending_why(e: EnvironmentSnapshot) -> str:
    return " yet: the torch check of this environment is still running" if e.torch_pending else ""


# --- devices


def _device_rejections(job: JobRequest, d: DeviceSnapshot, worker: str) -> list[Rejection]:
    label = device_label(d)
    out: list[Rejection] = []

    def rej(code: RejectionCode, req: str, wanted: str, found: str, msg: str) -> None:
        out.append(Rejection(code, req, wanted, found, worker, msg, device=d.index))

    if not d.execution_supported:
        rej(
            RejectionCode.EXECUTION_UNSUPPORTED, "accelerator", job.accelerator.value, "detection only",
            f"{label} ({d.accelerator.value}) is detection-only: gpulayer never schedules on it",
        )
        return out
    if state_rejections(job, d, label, rej):
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
        want = gb_wanted(job.gpu_memory_bytes)
        if d.memory_total_bytes is None:
            rej(RejectionCode.UNKNOWN_METRIC, "gpu_memory_gb", f">= {want}", "unknown",
                f"{label} memory is unknown, so {want} cannot be confirmed")
        elif d.memory_total_bytes < job.gpu_memory_bytes:
            approx = " (approximate: Metal's recommended working set)" if d.memory_approximate else ""
            rej(RejectionCode.INSUFFICIENT_MEMORY, "gpu_memory_gb", f">= {want}", gb_text(d.memory_total_bytes),
                f"{label} has {gb_text(d.memory_total_bytes)}{approx} < {want} required")
    if job.min_cuda_compute_capability is not None:
        want = cc_text(job.min_cuda_compute_capability)
        if d.compute_capability is None:
            rej(RejectionCode.UNKNOWN_METRIC, "min_cuda_compute_capability", f">= {want}", "unknown",
                f"{label} compute capability is unknown, so >= {want} cannot be confirmed")
        elif d.compute_capability < job.min_cuda_compute_capability:
            have = cc_text(d.compute_capability)
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


def _could_run(job: JobRequest, d: DeviceSnapshot, worker: str) -> bool:
    """Whether ``job`` might qualify for ``d`` if the probe had no trouble with it (lost, unusable): no
    objection but values the lost device no longer reports (unknown memory or compute capability)."""
    healthy = replace(d, state=DeviceState.OK, state_reason="")
    return not [r for r in _device_rejections(job, healthy, worker) if r.code is not RejectionCode.UNKNOWN_METRIC]


def _objective(d: DeviceSnapshot) -> tuple[int, str, int]:
    # Best fit: the smallest device that satisfies the job, then uuid, then index.
    return (d.memory_total_bytes or 0, d.uuid or "", d.index)


def choose_devices(
    job: JobRequest, worker: WorkerSnapshot, checks: list[Check], *, table: bool = True
) -> tuple[list[DeviceSnapshot] | None, list[Rejection], list[Rejection]]:
    """Pick ``job.gpu_count`` free qualifying devices on ``worker`` (CPU slots for a CPU job).

    Appends the accelerator, per-device requirement (unless ``table`` is False) and count rows to
    ``checks``. Without ``table``, only the first held device is named in the busy rejections (the
    callers read the state, the placement and the static rejections). Among free
    qualifying devices the best fit wins: smallest memory, then uuid, then index.

    Returns:
        ``(devices, static, busy)``: the chosen devices (empty for a CPU job) or None, the
        rejections no waiting can change, and those that mean "fits, but not now".
    """
    acc = job.accelerator
    wid = worker.node_id
    if job.gpu_count == 0:
        checks.append(Check("accelerator", acc.value, "cpu", True))
        return _cpu_slots(job, worker, checks)
    kind = sorted((d for d in worker.devices if d.accelerator is acc), key=lambda d: d.sort_key)
    supported = [d for d in kind if d.execution_supported]
    # Devices that can be granted at all: not lost, unusable or excluded, not a GPU split by MIG.
    grantable = [d for d in supported if d.state is DeviceState.OK and not (d.kind is DeviceKind.GPU and d.mig_enabled)]
    found_acc = f"{len(supported)} x {acc.value}" if supported else _no_device_found(worker)
    if supported and len(grantable) < len(supported):
        found_acc += f" ({len(grantable)} grantable)"
    checks.append(Check("accelerator", acc.value, found_acc, bool(grantable)))
    if not kind:
        health = next((h for h in worker.health if h.source == HEALTH_SOURCE.get(acc)), None)
        if health is not None and health.status not in (ProbeStatus.OK, ProbeStatus.NOT_FOUND,
                                                        ProbeStatus.NO_DEVICES):
            msg = f"{health.source} failed ({health.status.value}): {health.message}".rstrip(": ")
            return None, [Rejection(RejectionCode.PROBE_UNHEALTHY, "accelerator", acc.value,
                                    health.status.value, wid, f"{acc.value} devices unknown: {msg}")], []
        kinds = sorted({d.accelerator.value for d in worker.devices})
        # A daemon that uses no GPU by choice says so (``--isolated``: "GPUs not used: ..."), not "CPU-only".
        unused = next((h.message for h in worker.health
                       if h.source == "gpus" and h.message.startswith("GPUs not used")), None)
        has = f"it has {', '.join(kinds)}" if kinds else (unused or "it is CPU-only")
        return None, [Rejection(RejectionCode.ACCELERATOR_MISMATCH, "accelerator", acc.value,
                                _no_device_found(worker), wid,
                                f"worker {worker.name or wid} has no {acc.value} device ({has})")], []

    per_dev = [(d, _device_rejections(job, d, wid)) for d in kind]
    fit = [d for d, rs in per_dev if not rs]
    free = [d for d in fit if not d.busy]
    if table:
        device_rows(job, per_dev, checks)
    want_n = job.gpu_count
    checks.append(Check("gpu_count", f">= {want_n}", f"{len(fit)} qualify, {len(free)} free",
                        len(free) >= want_n if len(fit) >= want_n else False))
    # A process uses one MIG instance at most: a multi-device job counts whole devices only.
    # Devices that may ever be granted: not excluded, not a GPU split by MIG (lost ones may come back).
    ever = [d for d in kind if d.state is not DeviceState.EXCLUDED and not (d.kind is DeviceKind.GPU and d.mig_enabled)]
    total = len(ever) if want_n == 1 else sum(1 for d in ever if d.kind is not DeviceKind.MIG)
    if want_n > total:  # never, even with every device free and qualifying: the count decides (first)
        what = f"{acc.value} device(s)" if want_n == 1 else f"whole {acc.value} device(s)"
        count = Rejection(RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", str(want_n), f"{total} in all", wid,
                          f"needs {want_n} {what} at once, worker {worker.name or wid} has {total} in all")
        return None, [count, *(r for _, rs in per_dev for r in rs)], []
    # A device's probe trouble (lost, needs a reset) is a reason only for a job it could otherwise run.
    per_dev = [(d, [r for r in rs if r.code is not RejectionCode.PROBE_UNHEALTHY or _could_run(job, d, wid)])
               for d, rs in per_dev]
    if len(fit) < want_n:
        rejs = [r for _, rs in per_dev for r in rs]
        rejs.append(Rejection(RejectionCode.NOT_ENOUGH_DEVICES, "gpu_count", str(want_n), str(len(fit)), wid,
                              f"needs {want_n} qualifying {acc.value} device(s), worker "
                              f"{worker.name or wid} has {len(fit)}"))
        return None, rejs, []
    if len(free) < want_n:
        # A device that needs a reset (or was lost) may come back: say so beside the busy ones.
        faulty = [r for d, rs in per_dev if d.state in (DeviceState.UNUSABLE, DeviceState.LOST)
                  for r in rs if r.code is RejectionCode.PROBE_UNHEALTHY]
        held = [d for d in fit if d.busy]  # (one at least: more qualify than are free)
        return None, [], [busy_rejection(d, wid) for d in (held if table else held[:1])] + faulty
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
        return None, [Rejection(RejectionCode.NOT_ENOUGH_DEVICES, "cpu slots", str(need), str(total), wid,
                                f"needs {need} CPU slots, worker {worker.name or wid} has {total} in all")], []
    if need > free:
        return None, [], [Rejection(RejectionCode.RESERVED, "cpu slots", str(need), f"{free} free", wid,
                                    f"needs {need} CPU slots, {total - free} of {total} are in use by other jobs")]
    return [], [], []


def _no_device_found(worker: WorkerSnapshot) -> str:
    kinds = sorted({d.accelerator.value for d in worker.devices})
    return "none (has: " + ", ".join(kinds) + ")" if kinds else "none (cpu only)"


# --- workdir


def check_workdir(job: JobRequest, worker: WorkerSnapshot, checks: list[Check]) -> list[Rejection]:
    """Check that ``job.workdir`` exists on ``worker`` and the job's user can enter it, as far as
    the worker has answered.

    Appends a workdir row to ``checks`` (ok None when the worker checks only at claim).

    Returns:
        A WORKDIR_MISSING, WORKDIR_DENIED ("alice cannot enter /x on ws-1") or
        WORKDIR_UNANSWERED rejection, or nothing.
    """
    if job.workdir is None:
        return []
    if worker.existing_paths is None:
        checks.append(Check("workdir", job.workdir, "checked when the worker claims", None))
        return []
    if job.workdir in worker.unanswered_paths:
        found = f"no answer within {worker.path_timeout_s:g} s"
        checks.append(Check("workdir", job.workdir, found, False))
        return [Rejection(RejectionCode.WORKDIR_UNANSWERED, "workdir", job.workdir, found, worker.node_id,
                          f"workdir {job.workdir} did not answer within {worker.path_timeout_s:g} s on "
                          f"{worker.name or worker.node_id}")]
    if job.user and (job.user, job.workdir) in worker.denied_paths:
        found = f"{job.user} cannot enter it"
        checks.append(Check("workdir", job.workdir, found, False))
        return [Rejection(RejectionCode.WORKDIR_DENIED, "workdir", job.workdir, found, worker.node_id,
                          f"{job.user} cannot enter {job.workdir} on {worker.name or worker.node_id}")]
    if job.workdir in worker.existing_paths:
        checks.append(Check("workdir", job.workdir, "exists", True))
        return []
    checks.append(Check("workdir", job.workdir, "missing", False))
    return [Rejection(RejectionCode.WORKDIR_MISSING, "workdir", job.workdir, "missing", worker.node_id,
                      f"workdir {job.workdir} does not exist on {worker.name or worker.node_id}")]
