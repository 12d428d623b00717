"""Nearest-miss hints: the smallest changes to a job that make it fit somewhere.

For a job that fits nowhere (or only a busy or an offline worker), :func:`nearest_misses`
proposes up to three changes, each verified by re-judging the changed job against the
workers with the real judgement (:func:`gpulayerd.core.matching.evaluate.evaluate`): a hint's ``fits``
lists exactly the workers the changed job reaches a better state on than the job's verdict
(fits now; or, for a job that fits nowhere, also busy or offline).

Changes are derived, never guessed, from each worker's facts and rejections:

- numeric: ``lower gpu_memory_gb to 40`` (the device's memory, floored to 0.1 GB),
  ``lower min_cuda_compute_capability to 7.5``, ``lower gpu_count to 2``,
  ``lower min_driver_version to 535.104.05``;
- versions: the specifier widened to the installed version; a pre-release of the wanted
  release says so (``2.4.0a0+3bcc3cddb5.nv24.07 is a pre-release of 2.4: write torch>=2.4.0a0``);
- accelerator: ``as mps it fits mac-1, unified 11.4 GB`` (CUDA-only items are dropped with it);
- flags and unknowns: ``without requires_float64``, ``without gpu_memory_kind``, ``without os``;
- profile items: a changed requirement that came from a profile says so
  (``lower min_driver_version to 535.104.05 (from profile torch-2.4-cu124)``).

Ranked by how few requirements change, then how little (a relative measure per item), then
the text: deterministic. Candidates are verified in rank order until three fit; a worker is
re-judged unless one of its rejections depends on no changed item (it cannot fit then).
Pure: no I/O, no clock, no randomness. GB is 10^9 bytes.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.matching.evaluate import evaluate, explain, validate
from gpulayerd.core.matching.hint_versions import distance, first_bound, widen
from gpulayerd.core.matching.runtime_checks import torch_cuda_build
from gpulayerd.core.matching.versions import VersionCheck, check_version
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceKind,
    DeviceSnapshot,
    DeviceState,
    JobRequest,
    SupportMatrix,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import (
    BUSY_CODES,
    Explanation,
    FitState,
    Rejection,
    RejectionCode,
    Verdict,
    WorkerExplanation,
)

__all__ = ["MAX_HINTS", "Hint", "nearest_misses"]

MAX_HINTS = 3
"""The most hints :func:`nearest_misses` returns."""

_MAX_TRIED = 24
"""The most candidate changes verified for one job (bounds the cost when few fit)."""

_RANK = {FitState.FITS_NOW: 0, FitState.FITS_BUT_BUSY: 1, FitState.FITS_OFFLINE: 2, FitState.NO_FIT: 3}
_VERDICT_RANK = {Verdict.FITS_NOW: 0, Verdict.FITS_BUT_BUSY: 1, Verdict.FITS_ONLY_OFFLINE: 2,
                 Verdict.FITS_NOWHERE: 3}
_DEVICE = frozenset({"accelerator", "gpu_count", "gpu_memory_gb", "gpu_memory_kind",
                     "min_cuda_compute_capability", "requires_float64"})
_ORDER = ("accelerator", "gpu_count", "gpu_memory_gb", "gpu_memory_kind", "min_cuda_compute_capability",
          "requires_float64", "python")
_TAIL = ("cuda_runtime", "min_driver_version", "os")
_CUDA_ONLY = ("min_cuda_compute_capability", "cuda_runtime", "min_driver_version")

# A change: requirement -> new value (None: the requirement dropped). Values: Accelerator,
# int (gpu_count, gpu_memory_gb in bytes), tuple (compute capability), str (specifiers, driver).
_Changes = dict[str, object]
_Key = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Hint:
    """One nearest-miss change and the workers it makes the job fit.

    Attributes:
        change: the change, as a person would make it (``lower gpu_memory_gb to 40``;
            several items joined by ``, ``).
        fits: node ids of exactly the workers the changed job fits (ascending), re-judged.
        text: the whole line: the change and where it then fits (``... → fits ws-2 GPU 1``).
        requirements: the job-spec items changed (``gpu_memory_gb``, ``frameworks.torch``).
    """

    change: str
    fits: tuple[str, ...]
    text: str
    requirements: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Candidate:
    changes: _Changes
    notes: tuple[tuple[str, str], ...]  # requirement -> why (a pre-release note)
    cost: float


def nearest_misses(
    job: JobRequest,
    workers: Sequence[WorkerSnapshot],
    support: SupportMatrix,
    explanation: Explanation | None = None,
    *,
    origins: Mapping[str, str] | None = None,
    limit: int = MAX_HINTS,
) -> tuple[Hint, ...]:
    """Up to ``limit`` smallest changes that make ``job`` fit a worker in a better state.

    Args:
        job: the job as judged.
        workers: the workers it was judged against.
        support: the support matrix.
        explanation: ``explain(job, workers, support)`` when already computed (saves one judgement).
        origins: requirement -> where it comes from (``from profile torch-2.4-cu124``); a changed
            requirement from a profile names it.
        limit: the most hints.

    Returns:
        Hints ranked by how few requirements change, then how little; empty for a job that fits
        now, a multi-host job, or when no change derived from the workers makes it fit.
    """
    if job.distributed is not None and job.distributed.nnodes > 1:
        return ()
    ordered = sorted(workers, key=lambda w: w.node_id)
    e = explanation if explanation is not None else explain(job, ordered, support)
    current = _VERDICT_RANK[e.verdict]
    if current == 0 or limit <= 0:
        return ()
    rows = {r.worker: r for r in e.workers}
    found: dict[_Key, _Candidate] = {}
    for w in ordered:
        row = rows.get(w.node_id)
        for cand in _worker_candidates(job, w, row, support, job_level=bool(e.rejections)):
            key = _key(cand.changes)
            if key and (key not in found or found[key].cost > cand.cost):
                found[key] = cand
    queue = [(len(c.changes), c.cost, _change_text(c, job, origins), k) for k, c in found.items()]
    heapq.heapify(queue)
    blockers = {w.node_id: _blockers(rows.get(w.node_id), w, current) for w in ordered}
    hints: list[Hint] = []
    tried = 0
    while queue and len(hints) < limit and tried < _MAX_TRIED:
        _, _, change, key = heapq.heappop(queue)
        tried += 1
        cand = found[key]
        hint = _verify(job, cand, change, ordered, blockers, support, current)
        if hint is not None:
            hints.append(hint)
    return tuple(hints)


# ------------------------------------------------------------------------ candidates


def _worker_candidates(job: JobRequest, w: WorkerSnapshot, row: WorkerExplanation | None,
                       support: SupportMatrix, *, job_level: bool) -> list[_Candidate]:
    """The changes that would let ``w`` take ``job``, derived from its facts and rejections."""
    if job_level or (row is not None and any(r.code is RejectionCode.ACCELERATOR_MISMATCH
                                             for r in row.rejections)):
        return _other_accelerators(job, w, support)
    if row is None:
        return []
    return _fixes(job, {}, w, row.rejections)


def _other_accelerators(job: JobRequest, w: WorkerSnapshot, support: SupportMatrix) -> list[_Candidate]:
    """``as mps``: the job on another accelerator ``w`` schedules, with what else that needs."""
    out: list[_Candidate] = []
    kinds = sorted({d.accelerator for d in w.devices if d.execution_supported and d.accelerator is not job.accelerator
                    and support.row(d.accelerator).schedulable}, key=lambda a: a.value)
    for acc in kinds:
        base: _Changes = {"accelerator": acc}
        if job.gpu_count < 1:
            base["gpu_count"] = 1
        if acc is not Accelerator.CUDA:
            for name in _CUDA_ONLY:
                if _current(job, name) is not None:
                    base[name] = None
        moved = _apply(job, base)
        if validate(moved, support):
            continue
        ev = evaluate(moved, w, support, table=False)
        for cand in _fixes(moved, base, w, ev.rejections):
            out.append(replace(cand, cost=cand.cost + 1.0 + 0.5 * (len(base) - 1)))
    return out


def _fixes(job: JobRequest, base: _Changes, w: WorkerSnapshot, rejections: Sequence[Rejection]) -> list[_Candidate]:
    """Candidates for one worker: its device fix, its host fix and one per fixable environment."""
    host: _Changes = {}
    notes: list[tuple[str, str]] = []
    cost = 0.0
    per_env: dict[str, list[Rejection]] = {}
    for r in rejections:
        if r.code in BUSY_CODES or r.code is RejectionCode.WORKER_OFFLINE:
            continue
        if r.environment is not None:
            per_env.setdefault(r.environment, []).append(r)
        elif r.device is not None or r.requirement in ("gpu_count",) or r.code is RejectionCode.NOT_ENOUGH_DEVICES:
            continue  # the device fix below reads the devices themselves
        elif r.requirement == "os":
            host["os"], cost = None, cost + 0.5
        elif r.requirement == "min_driver_version":
            have = r.found if r.code is RejectionCode.DRIVER_TOO_OLD else None
            host["min_driver_version"] = have
            cost += 0.4 if have is None else 0.2 + distance(r.wanted.removeprefix(">= "), have)
        else:
            return []  # workdir, account, probe health, no environment: no job change helps
    devices = _device_fixes(job, w)
    if devices is None:
        return []
    envs: list[tuple[_Changes, list[tuple[str, str]], float]] = [] if per_env else [({}, [], 0.0)]
    for e in w.environments:
        rs = per_env.get(e.interpreter)
        fixed = _env_fix(rs) if rs else None
        if fixed is not None:
            envs.append(fixed)
    out: list[_Candidate] = []
    for dev_changes, dev_cost in devices:
        for env_changes, env_notes, env_cost in envs:
            changes = {**base, **dev_changes, **env_changes, **host}
            out.append(_Candidate(changes, tuple(notes + env_notes), cost + dev_cost + env_cost))
    return out


def _usable(job: JobRequest, d: DeviceSnapshot) -> bool:
    if d.accelerator is not job.accelerator or not d.execution_supported or d.state is not DeviceState.OK:
        return False
    if d.kind is DeviceKind.GPU and d.mig_enabled:
        return False
    return not (d.kind is DeviceKind.MIG and job.gpu_count > 1)


def _device_change(job: JobRequest, d: DeviceSnapshot) -> tuple[_Changes, float]:
    """What ``job`` must give up for device ``d`` to qualify, and how much that is."""
    ch: _Changes = {}
    cost = 0.0
    if job.gpu_memory_kind is not None and d.memory_kind is not job.gpu_memory_kind:
        ch["gpu_memory_kind"], cost = None, cost + 0.4
    want = job.gpu_memory_bytes
    have = d.memory_total_bytes
    if want is not None and (have is None or have < want):
        lowered = None if have is None else have // (GB // 10) * (GB // 10)
        if not lowered:
            ch["gpu_memory_gb"], cost = None, cost + 0.6
        else:
            ch["gpu_memory_gb"], cost = lowered, cost + (want - lowered) / want
    cc = job.min_cuda_compute_capability
    if cc is not None:
        if d.compute_capability is None:
            ch["min_cuda_compute_capability"], cost = None, cost + 0.5
        elif d.compute_capability < cc:
            have_cc = d.compute_capability
            ch["min_cuda_compute_capability"] = have_cc
            cost += ((cc[0] * 10 + cc[1]) - (have_cc[0] * 10 + have_cc[1])) / (cc[0] * 10 + cc[1])
    if job.requires_float64 and d.float64 is not True:
        ch["requires_float64"], cost = None, cost + 0.5
    return ch, cost


def _device_fixes(job: JobRequest, w: WorkerSnapshot) -> list[tuple[_Changes, float]] | None:
    """The device changes for ``w``: the fewest over ``gpu_count`` devices, and the same among
    free devices when they differ; None when ``w`` has no usable device of the kind."""
    if job.gpu_count < 1:
        return [({}, 0.0)]
    devs = [d for d in w.devices if _usable(job, d)]
    if not devs:
        return None
    per = sorted(((*_device_change(job, d), d) for d in devs),
                 key=lambda t: (len(t[0]), t[1], t[2].busy, t[2].sort_key))
    out: list[tuple[_Changes, float]] = []
    for pool in (per, [t for t in per if not t[2].busy]):
        if not pool:
            continue
        n = job.gpu_count
        extra: _Changes = {}
        cost = 0.0
        if len(pool) < n:
            if job.distributed is not None:
                continue
            extra["gpu_count"], cost = len(pool), (n - len(pool)) / n + 0.2
            n = len(pool)
        merged = _merge([c for c, _, _ in pool[:n]])
        cost += max(c for _, c, _ in pool[:n])
        out.append(({**extra, **merged}, cost))
    return out


def _merge(changes: Sequence[_Changes]) -> _Changes:
    """The changes that satisfy every device: the lowest value, a drop over any value."""
    out: _Changes = {}
    for ch in changes:
        for k, v in ch.items():
            if k not in out or (out[k] is not None and (v is None or v < out[k])):  # type: ignore[operator]
                out[k] = v
    return out


def _env_fix(rs: Sequence[Rejection]) -> tuple[_Changes, list[tuple[str, str]], float] | None:
    """The specifier changes that let one environment qualify; None when one of its rejections
    cannot be changed by the job (a missing framework, a driver too old for its CUDA build)."""
    ch: _Changes = {}
    notes: list[tuple[str, str]] = []
    cost = 0.0
    for r in rs:
        req = r.requirement
        if r.code in (RejectionCode.PYTHON_VERSION, RejectionCode.FRAMEWORK_VERSION,
                      RejectionCode.CUDA_RUNTIME_MISMATCH) and r.found not in ("none", "unknown"):
            widened = widen(r.wanted, r.found)
            if widened is None:
                return None
            spec, note = widened
            ch[req] = spec
            cost += 0.05 if note else 0.3 + min((distance(first_bound(r.wanted), r.found)), 0.2)
            if note:
                notes.append((req, note))
        elif r.code is RejectionCode.UNKNOWN_METRIC and req == "cuda_runtime":
            ch[req], cost = None, cost + 0.6
        else:
            return None
    return ch, notes, cost


# ---------------------------------------------------------------------- verification


def _deps(r: Rejection) -> frozenset[str] | None:
    """The job items a rejection depends on (None: not known here, so never relied on)."""
    req = r.requirement
    if r.device is not None or req in _DEVICE or req == "free devices":
        return _DEVICE
    if req == "cpu slots":
        return frozenset({"accelerator", "gpu_count"})
    if req in ("python", "os", "min_driver_version", "cuda_runtime"):
        return frozenset({req, "accelerator"} if req == "cuda_runtime" else {req})
    if req.startswith("frameworks."):
        return frozenset({req, "accelerator"})
    if req in ("torch.cuda", "torch.mps"):
        return frozenset({"accelerator", "frameworks.torch"})
    if req in ("cuda_compat", "environment", "distributed.backend"):
        return frozenset({"accelerator"})
    if req in ("workdir", "user", "max_gpus_per_user", "online"):
        return frozenset({"gpu_count", "accelerator"} if req == "max_gpus_per_user" else ())
    return None


_Blockers = tuple[bool, tuple[frozenset[str], ...], tuple[tuple[frozenset[str], ...], ...]]


def _blockers(row: WorkerExplanation | None, w: WorkerSnapshot, current: int) -> _Blockers:
    """What keeps ``row``'s worker from a state better than ``current``, read once per job:
    (always, the items each worker-level rejection depends on, the same per environment)."""
    if row is None:
        return False, (), ()
    if current <= _RANK[FitState.FITS_OFFLINE] and not w.online:
        return True, (), ()
    level: list[frozenset[str]] = []
    envs: dict[str, list[frozenset[str]]] = {}
    for r in row.rejections:
        if r.code is RejectionCode.WORKER_OFFLINE:
            continue
        if r.code in BUSY_CODES and current > _RANK[FitState.FITS_BUT_BUSY]:
            continue  # busy is already better than fits nowhere
        deps = _deps(r)
        if r.environment is not None:
            envs.setdefault(r.environment, [])
            if deps is not None:
                envs[r.environment].append(deps)
        elif deps is not None:
            level.append(deps)
    per_env = tuple(tuple(v) for v in envs.values()) if len(envs) >= len(w.environments) else ()
    return False, tuple(level), per_env


def _cannot_improve(b: _Blockers, changed: frozenset[str]) -> bool:
    """True when the worker keeps a state no better than the job's whatever ``changed`` does: a
    blocking rejection that depends on no changed item (for environments: in every environment)."""
    always, level, envs = b
    if always or any(not (d & changed) for d in level):
        return True
    return bool(envs) and all(any(not (d & changed) for d in env) for env in envs)


def _devices_may_fit(job: JobRequest, w: WorkerSnapshot, *, free: bool = False) -> bool:
    """A necessary condition of fitting, checked before the full judgement: ``w`` has ``gpu_count``
    devices that meet every device requirement of ``job`` (the rules of
    :func:`gpulayerd.core.matching.requirements.choose_devices`), busy or not (``free``: free now,
    for a change that must make the job fit now)."""
    if job.gpu_count < 1:
        return True
    n = 0
    for d in w.devices:
        if free and d.busy:
            continue
        if _usable(job, d) and not _device_change(job, d)[0]:
            n += 1
            if n >= job.gpu_count:
                return True
    return False


def _envs_may_fit(job: JobRequest, w: WorkerSnapshot, changed: frozenset[str]) -> bool:
    """A necessary condition of fitting when the change rewrites environment items: one working
    environment of ``w`` meets every rewritten ``python``, ``frameworks.*`` and ``cuda_runtime``."""
    items = [c for c in changed if c in {"python", "cuda_runtime"} or c.startswith("frameworks.")]
    if not items:
        return True
    for e in w.environments:
        if not e.ok:
            continue
        for item in items:
            spec = job.python if item == "python" else job.cuda_runtime if item == "cuda_runtime" else (
                job.frameworks.get(item.split(".", 1)[1]))
            if spec is None:
                continue
            if item == "python":
                have = e.python_version
            elif item == "cuda_runtime":
                have = torch_cuda_build(e) or None
            else:
                fw = e.frameworks.get(item.split(".", 1)[1])
                have = fw.version if fw is not None and fw.valid else None
            if check_version(have, spec) is not VersionCheck.OK:
                break
        else:
            return True
    return False


def _verify(job: JobRequest, cand: _Candidate, change: str, workers: Sequence[WorkerSnapshot],
            blockers: Mapping[str, _Blockers], support: SupportMatrix, current: int) -> Hint | None:
    """Re-judge the changed job; the hint with the workers it now fits better, or None."""
    moved = _apply(job, cand.changes)
    if validate(moved, support):
        return None
    changed = frozenset(cand.changes)
    now_only = current == _RANK[FitState.FITS_BUT_BUSY]  # only fitting now is better: devices free now
    fits: list[tuple[int, str, str]] = []
    for w in workers:
        if (_cannot_improve(blockers[w.node_id], changed) or not _devices_may_fit(moved, w, free=now_only)
                or not _envs_may_fit(moved, w, changed)):
            continue
        ev = evaluate(moved, w, support, table=False)
        rank = _RANK[ev.state]
        if rank < current:
            fits.append((rank, w.node_id, _target(ev, w)))
    if not fits:
        return None
    fits.sort()
    labels = [t for _, _, t in fits[:3]] + ([f"{len(fits) - 3} more"] if len(fits) > 3 else [])
    where = "; ".join(labels)
    text = f"{change} it fits {where}" if "accelerator" in cand.changes else f"{change} → fits {where}"
    return Hint(change, tuple(sorted(n for _, n, _ in fits)), text, tuple(_sorted_items(cand.changes)))


def _target(ev: WorkerExplanation, w: WorkerSnapshot) -> str:
    """``ws-2 GPU 1``, ``mac-1, unified 11.4 GB``, ``ws-3 (busy)``, ``ws-4 (offline)``."""
    name = w.name or w.node_id
    if ev.state is FitState.FITS_BUT_BUSY:
        return f"{name} (busy)"
    if ev.state is FitState.FITS_OFFLINE:
        return f"{name} (offline)"
    p = ev.placement
    if p is None or not p.device_indices:
        return name
    if p.accelerator is Accelerator.MPS:
        d = next((d for d in w.devices if d.accelerator is Accelerator.MPS and d.index in p.device_indices), None)
        if d is not None and d.memory_total_bytes is not None:
            kind = f"{d.memory_kind.value} " if d.memory_kind is not None else ""
            return f"{name}, {kind}{d.memory_total_bytes / GB:.1f} GB"
        return name
    return f"{name} GPU {','.join(str(i) for i in p.device_indices)}"


# ---------------------------------------------------------------------------- changes


def _current(job: JobRequest, name: str) -> object:
    if name == "gpu_memory_gb":
        return job.gpu_memory_bytes
    if name.startswith("frameworks."):
        return job.frameworks.get(name.split(".", 1)[1])
    return getattr(job, name)


def _apply(job: JobRequest, changes: _Changes) -> JobRequest:
    """``job`` with ``changes`` made (a value None drops the requirement)."""
    kw: dict[str, object] = {}
    frameworks = dict(job.frameworks)
    for name, value in changes.items():
        if name == "gpu_memory_gb":
            kw["gpu_memory_bytes"] = value
        elif name == "requires_float64":
            kw[name] = bool(value)
        elif name.startswith("frameworks."):
            fw = name.split(".", 1)[1]
            if value is None:
                frameworks.pop(fw, None)
            else:
                frameworks[fw] = str(value)
            kw["frameworks"] = frameworks
        else:
            kw[name] = value
    return replace(job, **kw)  # type: ignore[arg-type]


def _sorted_items(changes: _Changes) -> list[str]:
    fws = sorted(k for k in changes if k.startswith("frameworks."))
    return [k for k in (*_ORDER, *fws, *_TAIL) if k in changes]


def _key(changes: _Changes) -> _Key:
    return tuple((k, repr(changes[k])) for k in _sorted_items(changes))


def _value_text(name: str, value: object) -> str:
    if name == "gpu_memory_gb":
        return f"{int(value) / GB:g}"  # type: ignore[call-overload]
    if name == "min_cuda_compute_capability":
        cc = value
        assert isinstance(cc, tuple)
        return f"{cc[0]}.{cc[1]}"
    return str(value)


def _change_text(cand: _Candidate, job: JobRequest, origins: Mapping[str, str] | None) -> str:
    """The change as a person writes it: ``lower gpu_memory_gb to 40, without requires_float64``."""
    notes = dict(cand.notes)
    parts: list[str] = []
    for name in _sorted_items(cand.changes):
        value = cand.changes[name]
        if name == "accelerator":
            assert isinstance(value, Accelerator)
            parts.append(f"as {value.value}")
            continue
        if value is None or name == "requires_float64":
            text = f"without {name}"
        elif name in ("gpu_count", "gpu_memory_gb", "min_cuda_compute_capability", "min_driver_version"):
            text = f"lower {name} to {_value_text(name, value)}"
        else:
            label = name.split(".", 1)[1] if name.startswith("frameworks.") else name
            text = f"write {label}{value}"
            if name in notes:
                text = f"{notes[name]}: {text}"
        origin = (origins or {}).get(name, "")
        if origin.startswith("from profile"):
            text += f" ({origin})"
        parts.append(text)
    return ", ".join(parts)
