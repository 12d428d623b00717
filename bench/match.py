"""Figures for the matcher and the environment probe: ``python bench/match.py``.

Prints timings against the targets; it asserts nothing. The workers and the queue are
synthetic but shaped like a lab's: a few CPU boxes, CUDA workstations of several
generations, a Mac, a ROCm box, a couple of workers offline, some GPUs already granted,
and a queue whose jobs repeat about 30 requirement shapes (one person submits a sweep).
"""

from __future__ import annotations

import gc
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from gpulayerd.core.matching.evaluate import explain, explain_many, job_signature
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    DistributedRequest,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.gpu.support import SUPPORT_MATRIX

MiB = 2**20
RUNS = 3

# (name, memory.total MiB, compute capability, float64)
GPU_MODELS = [
    ("NVIDIA GeForce RTX 2080 Ti", 11264, (7, 5), True),
    ("NVIDIA GeForce RTX 3090", 24576, (8, 6), True),
    ("NVIDIA GeForce RTX 4090", 24564, (8, 9), True),
    ("NVIDIA RTX A6000", 49140, (8, 6), True),
    ("NVIDIA A100-SXM4-40GB", 40960, (8, 0), True),
    ("NVIDIA A100-SXM4-80GB", 81920, (8, 0), True),
    ("NVIDIA H100 80GB HBM3", 81559, (9, 0), True),
    ("NVIDIA B200", 183359, (10, 0), True),
    ("NVIDIA GeForce RTX 5090", 32607, (12, 0), True),
]


def _env(interpreter: str, python: str, torch: str | None, *, cuda: bool = False, mps: bool = False,
         extra: dict[str, str] | None = None) -> EnvironmentSnapshot:
    fws = {"numpy": FrameworkVersion("numpy", "1.26.4", "numpy")}
    if torch is not None:
        fws["torch"] = FrameworkVersion("torch", torch, "torch")
    for name, version in (extra or {}).items():
        fws[name] = FrameworkVersion(name, version, name)
    return EnvironmentSnapshot(
        interpreter=interpreter,
        python_version=python,
        frameworks=fws,
        torch_cuda=cuda if torch is not None else None,
        torch_mps=mps if torch is not None else None,
        distributed_backends=(("gloo", "nccl") if cuda else ("gloo",)) if torch is not None else None,
    )


def make_workers(n: int, seed: int = 1) -> list[WorkerSnapshot]:
    """``n`` workers: ~1/8 CPU-only, one Mac, one ROCm box, a DGX Spark, the rest CUDA."""
    rng = random.Random(seed)
    out: list[WorkerSnapshot] = []
    for i in range(n):
        node = f"node-{i:03d}"
        kind = i % 8
        envs = [_env("/usr/bin/python3", rng.choice(["3.10.12", "3.11.7", "3.12.3"]), None)]
        devices: list[DeviceSnapshot] = []
        health: list[ProbeHealth] = []
        if kind == 0:  # CPU-only box
            envs.append(_env("/opt/venv/bin/python", "3.11.7", "2.5.1+cpu"))
        elif i == 1:  # a Mac
            devices.append(DeviceSnapshot(
                Accelerator.MPS, 0, "mps-0", "Apple M2 Max", 64 * 2**30, None, MemoryKind.UNIFIED, None,
                None, True, False))
            envs = [_env("/opt/homebrew/bin/python3", "3.12.3", "2.5.1", mps=True, extra={"mlx": "0.21.0"})]
            health.append(ProbeHealth("apple", ProbeStatus.OK))
        elif i == 2:  # a ROCm box: detection only
            devices.extend(DeviceSnapshot(
                Accelerator.ROCM, k, f"rocm-{i}-{k}", "AMD Instinct MI210", 64 * GB, None, MemoryKind.DEDICATED,
                None, None, False, True) for k in range(2))
            envs.append(_env("/opt/rocm-venv/bin/python", "3.11.7", "2.5.1+rocm6.2"))
            health.append(ProbeHealth("rocm-smi", ProbeStatus.OK))
        elif i == 3:  # a DGX Spark: unified memory, memory.total [N/A]
            devices.append(DeviceSnapshot(
                Accelerator.CUDA, 0, f"GPU-{i:03d}-0", "NVIDIA GB10", None, None, MemoryKind.UNIFIED, (12, 1),
                "580.95.05", True, True))
            envs.append(_env("/opt/venv/bin/python", "3.12.3", "2.9.0+cu130", cuda=True))
            health.append(ProbeHealth("nvidia-smi", ProbeStatus.OK))
        else:  # a CUDA workstation or server
            name, mib, cc, f64 = rng.choice(GPU_MODELS)
            count = rng.choice([1, 1, 2, 2, 4, 8])
            for k in range(count):
                busy = rng.random()
                devices.append(DeviceSnapshot(
                    Accelerator.CUDA, k, f"GPU-{i:03d}-{k}", name, mib * MiB, rng.randrange(0, 2000) * MiB,
                    MemoryKind.DEDICATED, cc, "580.126.09", True, f64,
                    granted_to=f"job-{i}-{k}" if busy < 0.25 else None,
                    foreign_pids=(4242,) if 0.25 <= busy < 0.3 else ()))
            torch = rng.choice(["2.1.0+cu121", "2.4.1", "2.5.1+cu124", "2.6.0.dev20241112"])
            envs.append(_env("/opt/venv/bin/python", rng.choice(["3.10.12", "3.11.7", "3.12.3"]), torch,
                             cuda=True, extra={"jax": "0.4.30"} if rng.random() < 0.5 else None))
            if rng.random() < 0.4:
                envs.append(_env("/home/lab/miniconda3/envs/tf/bin/python", rng.choice(["3.10.12", "3.11.7"]), None,
                                 extra={"tensorflow": "2.16.1"}))
            health.append(ProbeHealth("nvidia-smi", ProbeStatus.OK))
        out.append(WorkerSnapshot(
            node_id=node, name=f"ws-{i:03d}", online=i not in (5, n - 3), devices=tuple(devices),
            environments=tuple(envs), cpu_count=rng.choice([16, 32, 64]), memory_total_bytes=128 * 2**30,
            health=tuple(health), existing_paths=None,
            cpu_slots_total=16, cpu_slots_free=rng.randrange(0, 17),
        ))
    return out


def make_shapes(n: int = 30, seed: int = 2) -> list[JobRequest]:
    """``n`` distinct requirement shapes, as a lab's people would write them."""
    rng = random.Random(seed)
    shapes: dict[tuple[object, ...], JobRequest] = {}
    people = ["ana", "bo", "chen", "dee", "eli", "fay", "gus"]
    while len(shapes) < n:
        r = rng.random()
        workdir = f"/home/{rng.choice(people)}/proj{rng.randrange(3)}"
        if r < 0.2:
            job = JobRequest(accelerator=Accelerator.CPU, frameworks=rng.choice([{}, {"numpy": "<2"}]),
                             python=rng.choice([None, ">=3.10"]), workdir=workdir,
                             distributed=DistributedRequest(1, 4, "gloo") if rng.random() < 0.3 else None)
        elif r < 0.3:
            job = JobRequest(accelerator=Accelerator.MPS, gpu_count=1, frameworks={"torch": ">=2.1"},
                             gpu_memory_kind=MemoryKind.UNIFIED, workdir=workdir)
        elif r < 0.33:
            job = JobRequest(accelerator=Accelerator.ROCM, gpu_count=1, workdir=workdir)
        else:
            count = rng.choice([1, 1, 1, 2, 2, 4, 8])
            mem_gb = rng.choice([None, 11, 16, 24, 40, 80])
            job = JobRequest(
                accelerator=Accelerator.CUDA,
                gpu_count=count,
                gpu_memory_bytes=None if mem_gb is None else mem_gb * GB,
                min_cuda_compute_capability=rng.choice([None, None, (7, 0), (8, 0), (8, 6), (9, 0)]),
                frameworks=rng.choice([{"torch": ">=2.1"}, {"torch": ">=2.4,<3"}, {"torch": "==2.1.*"},
                                       {"jax": ">=0.4"}, {"tensorflow": "~=2.16"}, {}]),
                python=rng.choice([None, ">=3.10", ">=3.11"]),
                requires_float64=rng.random() < 0.1,
                distributed=DistributedRequest(1, count, "nccl") if count > 1 and rng.random() < 0.5 else None,
                workdir=workdir,
            )
        shapes.setdefault(job_signature(job), job)
    return list(shapes.values())


def make_queue(n_jobs: int, shapes: list[JobRequest], seed: int = 3) -> list[JobRequest]:
    """A queue drawn from ``shapes`` with a skew: a few sweeps make most of the jobs."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) for k in range(len(shapes))]
    picks = rng.choices(range(len(shapes)), weights=weights, k=n_jobs)
    return [replace(shapes[p], job_id=f"job-{n:05d}") for n, p in enumerate(picks)]


def distinct_queue(queue: list[JobRequest]) -> list[JobRequest]:
    """The worst case: every job its own signature (a memory request differing by bytes)."""
    out = []
    for n, job in enumerate(queue):
        if job.accelerator is Accelerator.CPU:  # a CPU job has no memory request; vary the workdir
            out.append(replace(job, workdir=f"{job.workdir}/run{n}"))
        else:
            out.append(replace(job, gpu_memory_bytes=(job.gpu_memory_bytes or GB) + n))
    return out


def best_of(fn: Callable[[], object], runs: int = RUNS, budget_s: float = 10.0) -> list[float]:
    """Wall times of up to ``runs`` calls, in seconds; stops early once ``budget_s`` is spent."""
    times: list[float] = []
    while len(times) < runs and sum(times) < budget_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def verdict(value_s: float, target_s: float | None) -> str:
    if target_s is None:
        return "[no target]"
    ok = "ok" if value_s <= target_s else "MISSED"
    return f"[target <= {_ms(target_s)}: {ok}, {value_s / target_s:.2f}x target]"


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def _explain_each(jobs: list[JobRequest], workers: list[WorkerSnapshot]) -> None:
    """Explain each job on its own, dropping its table before the next (as `gpulayer explain` does)."""
    for job in jobs:
        explain(job, workers, SUPPORT_MATRIX)


def bench_explain() -> None:
    shapes = make_shapes(30)
    for n_workers, n_jobs, target_s in ((16, 1_000, 0.050), (64, 10_000, 0.500)):
        workers = make_workers(n_workers)
        queue = make_queue(n_jobs, shapes)
        n_shapes = len({job_signature(j) for j in queue})
        worst = distinct_queue(queue)
        assert len({job_signature(j) for j in worst}) == n_jobs
        # All distinct: every job gets its full table (what `explain` of each would print). The
        # scheduler never does this: its fit-only figure (64 x 10,000 <= 500 ms) is in bench/sched.py.
        # The target here is issue 17's "one job's full explanation at 64 workers <= 2 ms", per job,
        # on the first 1,000 jobs.
        worst = worst[:1_000]
        for label, jobs in ((f"{n_shapes} shapes", queue), ("all distinct, full tables", worst)):
            times = best_of(partial(explain_many, jobs, workers, SUPPORT_MATRIX))
            best = min(times)
            runs = "" if len(times) == RUNS else f", {len(times)} run{'s' if len(times) > 1 else ''} only"
            if label.startswith("all distinct"):
                # The target is one job's explanation (what `gpulayer explain JOB` computes): each job
                # explained on its own, its table dropped before the next. The batch figure above it
                # keeps all 1,000 tables alive, so it also pays the collector walking them.
                one = min(best_of(partial(_explain_each, jobs, workers))) / len(jobs)
                print(f"explain {n_workers} workers x {len(jobs)} jobs ({label}): {_ms(best)} in one batch "
                      f"(tables kept), {_ms(best / len(jobs))} per job; one job at a time: {_ms(one)} per job's "
                      f"table, {one / n_workers * 1e6:.2f} us/(job x worker){runs}  "
                      f"{verdict(one, 0.002 if n_workers == 64 else None)}")
                continue
            print(
                f"explain {n_workers} workers x {n_jobs} jobs ({label}): {_ms(best)} total, "
                f"{best / n_jobs * 1e6:.1f} us/job, {best / (n_jobs * n_workers) * 1e6:.2f} us/(job x worker)"
                f"{runs}  {verdict(best, target_s)}"
            )
    workers = make_workers(16)
    placed = explain_many(make_queue(1_000, shapes), workers, SUPPORT_MATRIX)
    counts: dict[str, int] = {}
    for e in placed:
        counts[e.verdict.value] = counts.get(e.verdict.value, 0) + 1
    print("  (16 x 1000 verdicts: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + ")")


def _far_shapes() -> list[JobRequest]:
    """Jobs that fit nowhere (or only busy workers) in :func:`make_workers`, one per kind of hint."""
    cuda = partial(JobRequest, accelerator=Accelerator.CUDA, gpu_count=1, workdir="/home/ana/proj0")
    return [
        cuda(gpu_memory_bytes=200 * GB),  # numeric: no card that large
        cuda(frameworks={"torch": ">=2.6,<2.9"}),  # version: 2.6.0.dev... is a pre-release of 2.6
        cuda(frameworks={"torch": "==2.3.*"}),  # version: nobody has 2.3
        cuda(min_cuda_compute_capability=(11, 0)),  # numeric: no such GPU
        cuda(gpu_count=16),  # numeric: no host has 16
        JobRequest(accelerator=Accelerator.MPS, gpu_count=1, requires_float64=True,
                   workdir="/home/ana/proj0"),  # flag: Apple GPUs have no float64
        cuda(gpu_memory_kind=MemoryKind.UNIFIED, gpu_memory_bytes=100 * GB),  # kind + numeric
        cuda(os="darwin"),  # accelerator: only the Mac runs darwin
        cuda(min_driver_version="590.0"),  # profile item: no driver that new
        cuda(cuda_runtime=">=13.1"),  # profile item: no build that new
    ]


def bench_hints() -> None:
    """The cost of nearest-miss hints per job that does not fit now, 64 workers; and the fit-only
    path (explain_many, what the scheduler's passes use) before and after, which never computes them."""
    from gpulayerd.core.matching import hints as hints_module
    from gpulayerd.core.matching.evaluate import explain
    from gpulayerd.core.verdict import Verdict

    workers = make_workers(64)
    queue = distinct_queue(make_queue(1_000, make_shapes(30)))
    before = min(best_of(partial(explain_many, queue, workers, SUPPORT_MATRIX)))
    judged = [(j, explain(j, workers, SUPPORT_MATRIX)) for j in [*make_shapes(200, seed=5), *_far_shapes()]]
    missing = [(j, e) for j, e in judged if e.verdict is not Verdict.FITS_NOW]
    found: list[int] = []

    def all_hints() -> None:
        found[:] = [len(hints_module.nearest_misses(j, workers, SUPPORT_MATRIX, e)) for j, e in missing]

    best = min(best_of(all_hints)) / len(missing)
    worst = max(min(best_of(partial(hints_module.nearest_misses, j, workers, SUPPORT_MATRIX, e), 3, 1.0))
                for j, e in missing)
    nowhere = sum(1 for _, e in missing if e.verdict is Verdict.FITS_NOWHERE)
    print(f"hints 64 workers x {len(missing)} jobs not fitting now ({nowhere} nowhere, "
          f"{len(missing) - nowhere} busy/offline; {sum(found)} hints, {sum(1 for n in found if n)} jobs with one): "
          f"{_ms(best)} per job, worst job {_ms(worst)}  {verdict(best, 0.002)}")
    gc.collect()  # the hints' garbage is not the fit-only path's cost
    after = min(best_of(partial(explain_many, queue, workers, SUPPORT_MATRIX)))
    root = Path(__file__).resolve().parents[1] / "gpulayerd"
    importers = [p.name for p in (root / "core" / "matching" / "evaluate.py", root / "app" / "owner" / "scheduler.py")
                 if "core.matching.hints" in p.read_text(encoding="utf-8")]
    print(f"fit-only path (explain_many 64 workers x 1000 distinct jobs): {_ms(before)} before hints, "
          f"{_ms(after)} after ({after / before:.2f}x); modules of the fit-only path that use hints: "
          f"{', '.join(importers) or 'none'}")


def bench_probe() -> None:
    try:
        from gpulayerd.gpu.environments import EnvironmentProber
    except ImportError as e:
        print(f"environment probe: not available ({e})")
        return
    interpreter = sys.executable
    with tempfile.TemporaryDirectory(prefix="gpulayer-bench-") as tmp:
        cache_dir = Path(tmp)
        prober = EnvironmentProber(timeout_s=60.0, cache_dir=cache_dir)
        snap = prober.probe(interpreter, use_cache=False, torch_check=True)
        torch = snap.frameworks.get("torch")
        print(
            f"environment probe of {interpreter}: ok={snap.ok}, python {snap.python_version}, "
            f"{len(snap.frameworks)} frameworks, torch {torch.version if torch else 'absent'}, "
            f"torch_cuda={snap.torch_cuda}"
        )
        cases: list[tuple[str, Callable[[], object], int, float | None]] = [
            # the import-based torch check runs in the background (bench/probe.py: the daemon's
            # first answer, metadata only, has the <= 300 ms target)
            ("cold, with torch check (background)",
             lambda: prober.probe(interpreter, use_cache=False, torch_check=True), 3, None),
            ("cold, metadata only (no torch)",
             lambda: prober.probe(interpreter, use_cache=False, torch_check=False), 5, 0.300),
            ("cached, same prober", lambda: prober.probe(interpreter, torch_check=True), 50, 0.005),
            ("cached, same prober, metadata only", lambda: prober.probe(interpreter, torch_check=False),
             50, 0.005),
            ("cached, fresh prober on the cache dir",
             lambda: EnvironmentProber(timeout_s=60.0, cache_dir=cache_dir).probe(interpreter, torch_check=True),
             50, 0.005),
        ]
        prober.probe(interpreter, torch_check=False)  # fill the metadata-only entry
        for label, fn, runs, target_s in cases:
            times = best_of(fn, runs)
            best, median = min(times), statistics.median(times)
            print(
                f"probe {label}: best {_ms(best)}, median {_ms(median)} of {runs}  {verdict(median, target_s)}"
            )


def main() -> None:
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}".rstrip()
        + f", {os.cpu_count()} CPUs, Python {platform.python_version()} ({sys.executable})"
    )
    print(f"timings: time.perf_counter, best of {RUNS} for explain; median shown against probe targets")
    bench_explain()
    gc.collect()
    bench_hints()
    bench_probe()


if __name__ == "__main__":
    main()
