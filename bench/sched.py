"""Figures for the incremental scheduler and the indexed matcher: ``python bench/sched.py``.

Prints each figure beside its target (issue 17); asserts nothing.

- matcher (in-process): fit-only decisions for 64 workers x 10,000 all-distinct jobs
  (:func:`gpulayerd.core.matching.index.fit_only`), and one job's full explanation at 64 workers.
- daemon: a gpulayerd with ``--cpu-slots 2`` on a temporary state dir; a CPU job's
  submit->start with an empty queue, then 10,000 waiting CUDA jobs of 8,000 shapes (this
  machine has no GPU that fits them, so they wait), the daemon's CPU (with its children)
  and RSS over ``--idle-s`` seconds (60 s in the target; 25 s by default), and a new CPU
  job's submit->start behind them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from bench_report import line
from local import TRIVIAL, LocalDaemon, wait_started
from match import distinct_queue, make_queue, make_shapes, make_workers

from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.matching.index import WorkerIndex, fit_only
from gpulayerd.gpu.support import SUPPORT_MATRIX


def bench_matcher() -> None:
    workers = make_workers(64)
    jobs = distinct_queue(make_queue(10_000, make_shapes(30)))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        index = WorkerIndex(workers)
        decisions = [fit_only(j, index, SUPPORT_MATRIX) for j in jobs]
        times.append(time.perf_counter() - t0)
    judged = sum(d.evaluated for d in decisions)
    line("fit-only 64 workers x 10,000 all-distinct jobs (best of 3)", min(times) * 1e3, "ms", 500)
    print(f"  ({len(index.decisions)} decision classes (shape x memory bucket of the index) for "
          f"{len(jobs)} jobs; {judged} full (job, worker) judgements in all, of {64 * len(jobs)} pairs)")
    one = []
    for j in jobs[:200]:
        t0 = time.perf_counter()
        explain(j, workers, SUPPORT_MATRIX)
        one.append(time.perf_counter() - t0)
    line("one job's full explanation at 64 workers (median of 200 jobs)", statistics.median(one) * 1e3, "ms", 2,
         fmt=".2f")


def cuda_spec(n: int, workdir: str) -> dict[str, object]:
    """The n-th waiting job: 8,000 shapes (memory x compute capability), repeated past 8,000."""
    k = n % 8000
    return {"command": ["true"], "workdir": workdir,
            "requirements": {"accelerator": "cuda", "gpu_count": 1 + k % 2,
                             "gpu_memory_gb": 1 + (k // 8) / 10,
                             "min_cuda_compute_capability": ["7.0", "8.0", "8.6", "9.0"][(k // 2) % 4]}}


async def cpu_start_ms(d: LocalDaemon, n: int) -> float:
    spec = {"command": TRIVIAL, "workdir": str(d.workdir)}
    out = []
    async with d.client() as c:
        for _ in range(n):
            sent = time.time()
            job_id = (await c.submit(spec)).id
            out.append(((await wait_started(d, [job_id], 60.0))[job_id] - sent) * 1e3)
            await asyncio.sleep(0.3)
    return statistics.median(out)


async def fill(d: LocalDaemon, n_jobs: int, n_clients: int = 8) -> float:
    counter = iter(range(n_jobs))

    async def one_client() -> None:
        async with d.client() as c:
            for n in counter:
                await c.submit(cuda_spec(n, str(d.workdir)))

    t0 = time.monotonic()
    await asyncio.gather(*(one_client() for _ in range(n_clients)))
    return time.monotonic() - t0


def usage(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


async def bench_daemon(n_jobs: int, idle_s: float) -> None:
    with tempfile.TemporaryDirectory(prefix="gpulayer-sched-") as tmp:
        d = LocalDaemon(Path(tmp), cpu_slots=2)
        await d.start()
        try:
            assert d.proc is not None
            proc = psutil.Process(d.proc.pid)
            await asyncio.sleep(2.0)
            empty_rss = proc.memory_info().rss / 1e6
            empty = await cpu_start_ms(d, 7)
            line("empty daemon RSS", empty_rss, "MB", 80)
            line("CPU job submit->start, empty queue (p50 of 7)", empty, "ms")
            took = await fill(d, n_jobs)
            print(f"  ({n_jobs} CUDA jobs of {min(n_jobs, 8000)} shapes submitted in {took:.1f} s)")
            await asyncio.sleep(8.0)  # the passes that follow the submits settle
            before, t0, rss = usage(proc), time.monotonic(), proc.memory_info().rss
            while time.monotonic() - t0 < idle_s:
                await asyncio.sleep(1.0)
                rss = max(rss, proc.memory_info().rss)
            cpu = (usage(proc) - before) / (time.monotonic() - t0) * 100
            line(f"daemon + children CPU, {n_jobs} waiting, over {idle_s:g} s", cpu, "% of a core", 0.5,
                 fmt=".2f")
            line(f"daemon RSS (max) with {n_jobs} waiting", rss / 1e6, "MB", 100)
            behind = await cpu_start_ms(d, 7)
            line("CPU job submit->start behind them (p50 of 7)", behind, "ms", empty + 10)
        finally:
            d.stop()
            d.kill_leftovers()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--idle-s", type=float, default=25.0)
    ap.add_argument("--no-daemon", action="store_true")
    args = ap.parse_args()
    bench_matcher()
    if not args.no_daemon:
        asyncio.run(bench_daemon(args.jobs, args.idle_s))


if __name__ == "__main__":
    main()
