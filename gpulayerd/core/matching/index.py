"""Fit-only decisions from per-requirement indexes over workers.

:class:`WorkerIndex` holds, per accelerator kind, each worker's devices sorted by memory with
their compute capability, float64 support and free state, its CPU slots and the framework
names of its environments. :meth:`WorkerIndex.candidates` is a conservative prefilter: it
drops only workers the full judgement (:func:`gpulayerd.core.matching.evaluate.evaluate`) would
certainly reject for this job (no such accelerator, fewer devices than asked that could
qualify, too few CPU slots in all, a framework none of its environments has). Unknown facts
(memory, compute capability, float64 reported as None) never drop a worker.

:func:`fit_only` then runs the full judgement on the remaining candidates only, in node-id
order, workers that may fit now first, and stops at the first answer that settles the
verdict; it returns what :func:`~gpulayerd.core.matching.evaluate.explain` would return as verdict
and placement, without the table (``explain`` and the TUI's Why tab still build it).

Decisions are kept per *decision class* in the index (:meth:`WorkerIndex.decision_key`): jobs
that differ only in a memory request falling between the same two device memories of the
sorted memory index (every known device memory in the cluster), or only in a workdir none of
the workers has checked, get the same verdict and placement from every worker, so one full
judgement serves the whole class (an autocluster over the index's buckets).

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.matching.evaluate import evaluate, explain, validate
from gpulayerd.core.types import Accelerator, DeviceSnapshot, JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.core.verdict import FitState, Placement, Verdict

__all__ = ["FitDecision", "WorkerIndex", "fit_only"]

_INF = float("inf")

_SIGNATURE_FIELDS = frozenset({
    "job_id", "accelerator", "gpu_count", "gpu_memory_bytes", "gpu_memory_kind", "min_cuda_compute_capability",
    "frameworks", "python", "requires_float64", "distributed", "workdir", "user", "min_driver_version",
    "cuda_runtime", "os", "worker", "slurm",
})
"""The fields :func:`_rest` reads by name; a field added to JobRequest falls back to a generic key."""
_GENERIC = {f.name for f in dataclasses.fields(JobRequest)} != _SIGNATURE_FIELDS
_NOWHERE = object()  # the workdir class of a path no worker has checked


@dataclass(frozen=True, slots=True)
class FitDecision:
    """The verdict and placement :func:`~gpulayerd.core.matching.evaluate.explain` would give (no table).

    Attributes:
        job_id: the job's id.
        verdict: the four-way verdict.
        placement: the lowest node id that fits now, when ``verdict`` is FITS_NOW.
        evaluated: how many workers got the full judgement.
    """

    job_id: str
    verdict: Verdict
    placement: Placement | None
    evaluated: int = 0


@dataclass(frozen=True, slots=True)
class _Dev:
    memory: float  # total bytes; inf when unknown (never drops a worker)
    cc: tuple[int, int] | None
    float64: bool | None
    busy: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    worker: WorkerSnapshot
    by_acc: dict[Accelerator, tuple[_Dev, ...]]  # execution-supported devices, sorted by memory
    mems: dict[Accelerator, tuple[float, ...]]  # their memories, same order (for bisect)
    free_from: dict[Accelerator, tuple[int, ...]]  # [k]: free devices among devices k.. (suffix counts)
    frameworks: frozenset[str]


def _dev(d: DeviceSnapshot) -> _Dev:
    mem = float(d.memory_total_bytes) if d.memory_total_bytes is not None else _INF
    return _Dev(mem, d.compute_capability, d.float64, d.busy)


class WorkerIndex:
    """Per-requirement indexes over ``workers`` (built once per set of snapshots, O(devices))."""

    def __init__(self, workers: Sequence[WorkerSnapshot]) -> None:
        self.workers = tuple(sorted(workers, key=lambda w: w.node_id))
        self._entries: list[_Entry] = []
        self._by_acc: dict[Accelerator, list[int]] = {}  # accelerator -> entries that have one
        for i, w in enumerate(self.workers):
            by_acc: dict[Accelerator, list[_Dev]] = {}
            for d in w.devices:
                if d.execution_supported:
                    by_acc.setdefault(d.accelerator, []).append(_dev(d))
            sorted_acc = {a: tuple(sorted(ds, key=lambda x: x.memory)) for a, ds in by_acc.items()}
            fws = frozenset(name for e in w.environments for name in e.frameworks)
            mems = {a: tuple(x.memory for x in ds) for a, ds in sorted_acc.items()}
            free_from = {a: _suffix_free(ds) for a, ds in sorted_acc.items()}
            self._entries.append(_Entry(w, sorted_acc, mems, free_from, fws))
            for a in sorted_acc:
                self._by_acc.setdefault(a, []).append(i)
        self._mems = sorted({d.memory_total_bytes for w in self.workers for d in w.devices
                             if d.memory_total_bytes is not None})
        self._paths: set[str] = set()  # every path some worker answered about
        for w in self.workers:
            self._paths.update(w.existing_paths or ())
            self._paths.update(w.unanswered_paths)
            self._paths.update(p for _, p in w.denied_paths)
        self.decisions: dict[Hashable, FitDecision] = {}
        """Decisions kept per :meth:`decision_key` (valid for this index's snapshots)."""

    def decision_key(self, job: JobRequest) -> Hashable:
        """``job``'s decision class: equal keys get equal verdicts and placements from every worker.

        The memory request becomes the index of the smallest known device memory >= it (a device
        of known memory qualifies for ``m`` exactly when it qualifies for that memory; unknown
        memory never depends on ``m``); a workdir no worker answered about becomes one class
        (missing wherever it is checked); every other field is kept as it is.
        """
        mem = job.gpu_memory_bytes
        bucket = None if mem is None else bisect.bisect_left(self._mems, mem)
        wd = job.workdir
        where: object = wd if wd is None or wd in self._paths else _NOWHERE
        return (_rest(job), bucket, where)

    def candidates(self, job: JobRequest) -> list[tuple[WorkerSnapshot, bool]]:
        """Workers the full judgement might accept for ``job``, in node-id order, each with
        whether it may fit *now* (False: it certainly does not fit now, e.g. offline or too
        few free devices; it may still fit later). Every worker left out is certainly rejected."""
        out: list[tuple[WorkerSnapshot, bool]] = []
        wanted_fw = tuple(job.frameworks)
        if job.gpu_count == 0:
            need = job.distributed.nproc_per_node if job.distributed is not None else 1
            for e in self._entries:
                w = e.worker
                if wanted_fw and not all(f in e.frameworks for f in wanted_fw):
                    continue
                if w.cpu_slots_total is not None and w.cpu_slots_free is not None and need > w.cpu_slots_total:
                    continue
                now = w.online and (w.cpu_slots_free is None or w.cpu_slots_total is None
                                    or need <= w.cpu_slots_free)
                out.append((w, now))
            return out
        acc = job.accelerator
        mem = job.gpu_memory_bytes
        plain = job.min_cuda_compute_capability is None and not job.requires_float64
        for i in self._by_acc.get(acc, ()):
            e = self._entries[i]
            if wanted_fw and not all(f in e.frameworks for f in wanted_fw):
                continue
            devs = e.by_acc[acc]
            start = bisect.bisect_left(e.mems[acc], mem) if mem is not None else 0
            if len(devs) - start < job.gpu_count:
                continue
            if plain:  # memory is the only device filter: counts from the sorted index
                free = e.free_from[acc][start]
            else:
                qual = [d for d in devs[start:] if _qualifies(job, d)]
                if len(qual) < job.gpu_count:
                    continue
                free = sum(1 for d in qual if not d.busy)
            out.append((e.worker, e.worker.online and free >= job.gpu_count))
        return out


def _suffix_free(devs: tuple[_Dev, ...]) -> tuple[int, ...]:
    out = [0] * (len(devs) + 1)
    for k in range(len(devs) - 1, -1, -1):
        out[k] = out[k + 1] + (0 if devs[k].busy else 1)
    return tuple(out)


def _qualifies(job: JobRequest, d: _Dev) -> bool:
    cc = job.min_cuda_compute_capability
    if cc is not None and d.cc is not None and d.cc < cc:
        return False
    return not (job.requires_float64 and d.float64 is False)


def fit_only(job: JobRequest, index: WorkerIndex, support: SupportMatrix) -> FitDecision:
    """``explain(job, index.workers)``'s verdict and placement, judging only the candidates.

    Multi-host jobs (``nnodes > 1``) take the full :func:`explain` (they need the count of
    workers at each state, not the first). Kept in ``index.decisions`` per
    :meth:`WorkerIndex.decision_key` (a kept answer has ``evaluated`` 0).
    """
    key = index.decision_key(job)
    kept = index.decisions.get(key)
    if kept is not None:
        return replace(kept, job_id=job.job_id, evaluated=0)
    d = index.decisions[key] = _fit_only(job, index, support)
    return d


def _rest(job: JobRequest) -> Hashable:
    """Every field of ``job`` but its id, memory request and workdir, hashable."""
    if _GENERIC:
        from gpulayerd.core.matching.shapes import freeze  # shapes imports matching, not index
        return freeze(replace(job, job_id="", gpu_memory_bytes=None, workdir=None))
    return (job.accelerator, job.gpu_count, job.gpu_memory_kind, job.min_cuda_compute_capability,
            tuple(sorted(job.frameworks.items())), job.python, job.requires_float64, job.distributed, job.user,
            job.min_driver_version, job.cuda_runtime, job.os, job.worker, job.slurm)


def _fit_only(job: JobRequest, index: WorkerIndex, support: SupportMatrix) -> FitDecision:
    if validate(job, support):
        return FitDecision(job.job_id, Verdict.FITS_NOWHERE, None)
    if (job.distributed is not None and job.distributed.nnodes > 1) or any(w.kind == "slurm" for w in index.workers):
        e = explain(job, index.workers, support)  # (a Slurm worker comes last: targeting.prefer_workstations)
        return FitDecision(job.job_id, e.verdict, e.placement, len(index.workers))
    cands = index.candidates(job)
    n = 0
    busy = False
    for w, now in cands:  # the lowest node id that fits now wins
        if not now:
            continue
        n += 1
        state = (row := evaluate(job, w, support, table=False)).state
        if state is FitState.FITS_NOW:
            return FitDecision(job.job_id, Verdict.FITS_NOW, row.placement, n)
        busy = busy or state is FitState.FITS_BUT_BUSY
    if busy:
        return FitDecision(job.job_id, Verdict.FITS_BUT_BUSY, None, n)
    offline = False
    for w, now in cands:  # nothing fits now: busy beats offline beats nowhere
        if now:
            continue  # judged above: neither fits now nor busy
        n += 1
        state = evaluate(job, w, support, table=False).state
        if state is FitState.FITS_BUT_BUSY:
            return FitDecision(job.job_id, Verdict.FITS_BUT_BUSY, None, n)
        offline = offline or state is FitState.FITS_OFFLINE
    return FitDecision(job.job_id, Verdict.FITS_ONLY_OFFLINE if offline else Verdict.FITS_NOWHERE, None, n)
