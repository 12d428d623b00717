"""Figures for the ``gpulayer`` CLI process: ``python bench/cli.py [--runs 20]``.

Starts its own daemon (bench/local.py's :class:`LocalDaemon`, ``--cpu-slots 8``) on a temporary
state dir, measures, stops it and removes the dir. Prints each figure beside its target; asserts
nothing. Targets are against B, ``python -c pass`` with the same interpreter measured in the same
run (absolute times drift on a shared machine); each figure is the p50 of ``--runs`` runs of the
whole process (spawn to exit), interleaved with B's runs so that both see the same load.

- ``gpulayer --help``: target B + 40 ms.
- ``gpulayer jobs`` with 1,000 jobs stored (800 rejected at submit, 200 that ran ``true``): target
  B + 60 ms; also ``jobs --all`` and ``jobs --json --all`` (every field of 1,000 jobs; no target).
- ``gpulayer submit -- sh -c 'date +%s.%N'`` to the job's first instruction (the time it writes
  into its stdout log), the CLI process's start-up included: target B + 40 ms; one job at a time.

Every timed process (B too) runs with bytecode caches, as an installed ``gpulayer`` does: the bench
drops ``PYTHONDONTWRITEBYTECODE``, points ``PYTHONPYCACHEPREFIX`` at its temporary dir and runs
each command once untimed first (without caches each run also compiles every module it imports
from source: ~30 ms more for ``gpulayer jobs``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from bench_report import line, percentile
from local import LocalDaemon, read_start, wait_drained

STORED = 1000
RAN = 200


def _gpulayer() -> list[str]:
    script = Path(sys.executable).with_name("gpulayer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpulayerd.cli"]


_CPU: list[float] = []
"""CPU seconds (user + system) of each process :func:`_wall` ran, in order."""


def _wall(argv: Sequence[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds from spawn to exit of one process (output discarded); raises when it fails. Its CPU
    seconds go to :data:`_CPU` (they drift less than wall time when other processes load the machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, check=False, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    _CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return dt


def _paired(label: str, argv: Sequence[str], runs: int, target_over_b_ms: float | None, env: dict[str, str],
            cwd: Path) -> None:
    """Run B and ``argv`` alternately ``runs`` times; print B, the figure and its target B + X."""
    base, fig, base_cpu, fig_cpu = [], [], [], []
    _wall([sys.executable, "-c", "pass"], env, cwd)  # untimed: write the bytecode caches
    _wall(argv, env, cwd)
    for _ in range(runs):
        base.append(_wall([sys.executable, "-c", "pass"], env, cwd))
        base_cpu.append(_CPU[-1])
        fig.append(_wall(argv, env, cwd))
        fig_cpu.append(_CPU[-1])
    b, f = 1000 * percentile(base, 50), 1000 * percentile(fig, 50)
    line(f"  B (python -c pass) beside {label}, p50", b, "ms")
    line(f"{label}, p50 of {runs}", f, "ms", None if target_over_b_ms is None else b + target_over_b_ms)
    line(f"  {label} minus B, p50", f - b, "ms", target_over_b_ms)
    bc, fc = 1000 * percentile(base_cpu, 50), 1000 * percentile(fig_cpu, 50)
    line(f"  {label}: CPU time of the CLI process minus B's, p50 ({fc:.1f} - {bc:.1f} ms)", fc - bc, "ms")


async def _fill(d: LocalDaemon) -> None:
    """Store :data:`STORED` jobs: the rejected ones at once, the ones that run 8 at a time."""
    async with d.client() as c:
        for i in range(STORED - RAN):
            await c.submit({"command": ["true"], "workdir": str(d.workdir), "name": f"rejected-{i}",
                            "requirements": {"accelerator": "rocm"}})
        for i in range(RAN):
            await c.submit({"command": ["true"], "workdir": str(d.workdir), "name": f"ran-{i}"})
    await wait_drained(d, 300.0)


def _submit_to_start(d: LocalDaemon, runs: int, env: dict[str, str], srun_ms: float | None = None) -> None:
    base, lat = [], []
    argv = [*_gpulayer(), "submit", "--", "sh", "-c", "date +%s.%N"]
    _wall([sys.executable, "-c", "pass"], env, d.workdir)  # untimed: write the bytecode caches
    _wall(argv, env, d.workdir)
    for _ in range(runs):
        base.append(_wall([sys.executable, "-c", "pass"], env, d.workdir))
        t0 = time.time()
        r = subprocess.run(argv, check=False, env=env, cwd=d.workdir, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"submit: exit {r.returncode}: {r.stderr[-500:]}")
        job_id = r.stdout.split()[2].rstrip(":")  # "submitted job ID: queued"
        end = time.monotonic() + 30.0
        while (started := read_start(d, job_id)) is None:
            if time.monotonic() > end:
                raise RuntimeError(f"job {job_id} did not start within 30 s")
            time.sleep(0.002)
        lat.append(started - t0)
        time.sleep(0.05)  # let the job end: one job at a time
    b, f = 1000 * percentile(base, 50), 1000 * percentile(lat, 50)
    line("  B (python -c pass) beside submit, p50", b, "ms")
    line(f"gpulayer submit -> job start (whole CLI process), p50 of {runs}", f, "ms", b + 40)
    line("  submit -> start minus B, p50", f - b, "ms", 40)
    line(f"gpulayer submit -> job start, p90 of {runs}", 1000 * percentile(lat, 90), "ms")
    if srun_ms is not None:
        line("  anchor: Slurm `srun true` round trip, p50 (same run)", srun_ms, "ms")
        line("gpulayer submit -> job start vs 2x `srun true`", f, "ms", 2 * srun_ms)


def _slurm_anchor() -> float | None:
    """Slurm's `srun true` p50 in ms, measured now (bench/slurm.py), or None with the reason printed."""
    from slurm import anchor  # bench/ is on sys.path when this script runs

    figures = anchor(n_sbatch=3, n_jobs=20)
    return None if figures is None else figures.srun_true_p50_ms


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI benchmarks; returns the exit code (0 unless the bench itself failed)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20, help="runs per figure (default 20)")
    p.add_argument("--no-bytecode-cache", action="store_true",
                   help="run every process with PYTHONDONTWRITEBYTECODE=1 and no cache prefix: each start compiles "
                   "the gpulayerd modules it imports (a checkout that never wrote __pycache__)")
    p.add_argument("--slurm", action="store_true",
                   help="also install (when missing), start and measure Slurm (bench/slurm.py) for the `srun true` "
                   "anchor, in this run")
    args = p.parse_args(argv)
    srun_ms = _slurm_anchor() if args.slurm else None
    root = Path(tempfile.mkdtemp(prefix="gpulayer-bench-cli-"))
    d = LocalDaemon(root, cpu_slots=8)
    env = {**os.environ, "GPULAYER_STATE_DIR": str(d.state_dir), "PYTHONPYCACHEPREFIX": str(root / "pycache")}
    env.pop("GPULAYER_SOCKET", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: modules load from bytecode caches
    if args.no_bytecode_cache:
        env.pop("PYTHONPYCACHEPREFIX")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    cli = _gpulayer()
    try:
        asyncio.run(d.start())
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.runs} runs per figure; bytecode "
              f"caches: {'none' if args.no_bytecode_cache else 'yes'}", flush=True)
        _paired("gpulayer --help", [*cli, "--help"], args.runs, 40, env, d.workdir)
        t0 = time.monotonic()
        asyncio.run(_fill(d))
        print(f"(stored {STORED} jobs in {time.monotonic() - t0:.1f} s)", flush=True)
        _paired(f"gpulayer jobs ({STORED} stored)", [*cli, "jobs"], args.runs, 60, env, d.workdir)
        _paired(f"gpulayer jobs --all ({STORED} stored)", [*cli, "jobs", "--all"], args.runs, None, env, d.workdir)
        _paired(f"gpulayer jobs --json --all ({STORED} stored)", [*cli, "jobs", "--json", "--all"], args.runs, None,
                env, d.workdir)
        _submit_to_start(d, args.runs, env, srun_ms)
    finally:
        d.stop()
        d.kill_leftovers()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
