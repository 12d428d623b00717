"""Slurm on this machine, the anchor for gpulayer's figures: ``python bench/slurm.py`` (as root).

Installs Slurm and munge from the distribution's packages when they are missing
(``apt-get install -y slurm-wlm munge``, non-interactive), starts the test suite's one-node
cluster (:mod:`tests.fakes.slurm_cluster`: its own ``slurm.conf`` and munge key in a temporary
directory, nothing under /etc is touched), measures, and stops it again (always).

- ``srun true`` round trip: the whole ``srun`` process, p50 of 20 (the anchor for
  ``gpulayer submit`` -> job start, whole CLI process included).
- ``sbatch`` submit -> start: from just before ``sbatch`` runs to the job's own first
  instruction (``date +%s.%N``), p50 of 10, one at a time.
- throughput: N trivial batch jobs (``true``) submitted back to back; first submit to the
  last job's end, in jobs/s (the anchor for gpulayer's jobs/s).
- through gpulayer (``main``, same cluster, same run): a gpulayerd whose worker is this cluster (``[slurm]``);
  ``gpulayer submit`` -> the job's first instruction in Slurm, p50 of 5, the whole CLI process included,
  next to ``sbatch``'s figure (target: within sbatch's + 1 s); and a job over its time limit
  (``--time 1m``, ``sleep 300``) must end ``timeout`` (Slurm enforces limits in whole minutes: a minute
  and more, so a bench, not a test; ``--no-timeout-check`` leaves it out).

Other benches call :func:`slurm_figures`: a :class:`SlurmFigures`, or a string saying why
Slurm is not available (printed as ``Slurm not available: <reason>``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import line, percentile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fakes import slurm_cluster

__all__ = ["SlurmFigures", "anchor", "slurm_figures"]

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo")


@dataclass(frozen=True)
class SlurmFigures:
    """What :func:`slurm_figures` measured.

    Attributes:
        srun_true_p50_ms: ``srun true`` round trip, whole process, p50 in ms.
        sbatch_start_p50_ms: ``sbatch`` call -> the job's first instruction, p50 in ms.
        jobs_per_s: trivial batch jobs, first submit to the last one's end, per second.
        jobs: how many jobs the throughput figure ran.
        version: ``sinfo --version``.
        gpulayer_start_p50_ms: ``gpulayer submit`` -> the job's first instruction in Slurm, p50 (None: not run).
        timeout_end: how the job over its time limit ended (its status, after how long; "": not run).
    """

    srun_true_p50_ms: float
    sbatch_start_p50_ms: float
    jobs_per_s: float
    jobs: int
    version: str
    gpulayer_start_p50_ms: float | None = None
    timeout_end: str = ""


def ensure_installed() -> str | None:
    """Install slurm-wlm and munge with apt-get when a binary is missing; None when all are there,
    else the reason they are not (no root, no apt-get, the install failed)."""
    if all(shutil.which(b) for b in DAEMONS):
        return None
    if os.geteuid() != 0:
        return "not installed, and installing needs root"
    if shutil.which("apt-get") is None:
        return "not installed, and there is no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]
    r = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:  # stale package lists: update once and retry
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, capture_output=True, timeout=600)
        r = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return f"apt-get install slurm-wlm munge failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    missing = [b for b in DAEMONS if shutil.which(b) is None]
    return f"installed, yet {', '.join(missing)} not found" if missing else None


@contextlib.contextmanager
def running_slurm(cpus: int) -> Iterator[dict[str, str]]:
    """munged, slurmctld and slurmd on a temporary config (:mod:`tests.fakes.slurm_cluster`, the test
    suite's one-node cluster, without GPUs); yields the environment for the clients.

    Raises:
        RuntimeError: a daemon did not start or the node did not come up within 30 s.
    """
    with slurm_cluster.running_slurm(cpus=cpus, gpus=0, partition="bench") as cluster:
        yield {**cluster.env, "BENCH_SLURM_DIR": str(cluster.root)}


def _tail(path: Path, n: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""


def _wait_file(path: Path, timeout_s: float) -> float:
    end = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            text = path.read_text()
            if text.endswith("\n"):
                return float(text)
        if time.monotonic() > end:
            raise RuntimeError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(0.002)


def _wait_empty(env: dict[str, str], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    squeue = ["squeue", "-h", "-o", "%i"]
    while subprocess.run(squeue, check=False, env=env, capture_output=True, text=True).stdout.strip():
        if time.monotonic() > end:
            raise RuntimeError(f"jobs still queued after {timeout_s:g} s")
        time.sleep(0.05)


def measure(env: dict[str, str], n_srun: int = 20, n_sbatch: int = 10, n_jobs: int = 100) -> SlurmFigures:
    """The three figures on a running Slurm (see the module docstring)."""
    d = Path(env["BENCH_SLURM_DIR"])
    subprocess.run(["srun", "true"], env=env, check=True, capture_output=True)  # warm up
    srun: list[float] = []
    for _ in range(n_srun):
        t0 = time.perf_counter()
        subprocess.run(["srun", "true"], env=env, check=True, capture_output=True)
        srun.append((time.perf_counter() - t0) * 1000)
    starts: list[float] = []
    for i in range(n_sbatch):
        out = d / f"start-{i}"
        sent = time.time()
        subprocess.run(["sbatch", "-Q", "-o", "/dev/null", "--wrap", f"date +%s.%N > {out}.tmp && mv {out}.tmp {out}"],
                       env=env, check=True, capture_output=True)
        starts.append((_wait_file(out, 60) - sent) * 1000)
        _wait_empty(env, 60)
    t0 = time.monotonic()
    for _ in range(n_jobs):
        subprocess.run(["sbatch", "-Q", "-o", "/dev/null", "--wrap", "true"], env=env, check=True,
                       capture_output=True)
    _wait_empty(env, 600)
    elapsed = time.monotonic() - t0
    version = subprocess.run(["sinfo", "--version"], check=False, env=env, capture_output=True,
                             text=True).stdout.strip()
    return SlurmFigures(percentile(srun, 50), percentile(starts, 50), n_jobs / elapsed, n_jobs, version)


def through_gpulayer(env: dict[str, str], n: int = 5, timeout_check: bool = True) -> tuple[float, str]:
    """A gpulayerd backed by the running cluster: ``gpulayer submit`` -> the job's first instruction in Slurm,
    p50 of ``n`` (ms), and how a ``--time 1m`` job of ``sleep 300`` ended ("" when not checked)."""
    from tests.fakes.daemon_process import TERMINAL, Lab

    d = Path(env["BENCH_SLURM_DIR"])
    lab = Lab()
    try:
        toml = (f'\n[slurm]\npartitions = ["bench"]\npoll_interval_s = 0.2\noutput_dir = "{lab.root}/slurm-out"\n'
                f'env = {{ SLURM_CONF = "{env["SLURM_CONF"]}" }}\n')
        gw = lab.daemon(toml=toml, probe_interval_s=1.0)
        gw.wait_status(gw.submit("--", "true"), {"succeeded"}, timeout_s=60)  # warm up (the proxy's imports)
        starts: list[float] = []
        for i in range(n):
            out = d / f"gl-start-{i}"
            sent = time.time()
            job = gw.submit("--", "sh", "-c", f"date +%s.%N > {out}.tmp && mv {out}.tmp {out}")
            starts.append((_wait_file(out, 60) - sent) * 1000)
            gw.wait_status(job, {"succeeded"}, timeout_s=60)
        ended = ""
        if timeout_check:
            t0 = time.monotonic()
            job = gw.submit("--time", "1m", "--", "sleep", "300")
            view = gw.wait_status(job, TERMINAL, timeout_s=240)
            said = [ln for ln in gw.cli_ok("logs", "--stderr", job).splitlines() if ln.startswith("gpulayer: ")]
            ended = (f"{view.status} after {time.monotonic() - t0:.0f} s (exit {view.exit_code}); "
                     f"{said[-1] if said else 'the proxy said nothing'}")
        return percentile(starts, 50), ended
    finally:
        lab.close()


def slurm_figures(n_srun: int = 20, n_sbatch: int = 10, n_jobs: int = 100, cpus: int = 2, gpulayer: bool = False,
                  timeout_check: bool = True) -> SlurmFigures | str:
    """Install (when missing), start, measure and stop Slurm; the figures, or why Slurm is not available.

    ``cpus``: the CPUs the single node offers (2, as gpulayer's ``--cpu-slots 2`` in the other benches).
    ``gpulayer``: measure :func:`through_gpulayer` too, on the same cluster (``timeout_check``: with its
    time-limit check).
    """
    reason = ensure_installed()
    if reason is not None:
        return reason
    try:
        with running_slurm(cpus) as env:
            figures = measure(env, n_srun, n_sbatch, n_jobs)
            if gpulayer:
                p50, ended = through_gpulayer(env, timeout_check=timeout_check)
                figures = dataclasses.replace(figures, gpulayer_start_p50_ms=p50, timeout_end=ended)
            return figures
    except (RuntimeError, AssertionError, subprocess.CalledProcessError, OSError) as e:
        detail = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) and e.stderr else ""
        return f"{e}{f' ({detail})' if detail else ''}"


def anchor(**kw: int) -> SlurmFigures | None:
    """:func:`slurm_figures` for another bench's anchor, measured now: prints one line with Slurm's
    version, or why Slurm is not available (then None)."""
    figures = slurm_figures(**kw)
    if isinstance(figures, str):
        print(f"Slurm not available: {figures}", flush=True)
        return None
    print(f"Slurm {figures.version} (anchor, this run): srun true p50 {figures.srun_true_p50_ms:.1f} ms, "
          f"{figures.jobs_per_s:.2f} trivial jobs/s", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100, help="jobs for the throughput figure (default 100)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the single node (default 2)")
    p.add_argument("--no-timeout-check", action="store_true", help="leave out the time-limit check (a minute and more)")
    args = p.parse_args(argv)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        runs.append((time.perf_counter() - t0) * 1000)
    base = percentile(runs, 50)
    figures = slurm_figures(n_jobs=args.jobs, cpus=args.cpus, gpulayer=True, timeout_check=not args.no_timeout_check)
    if isinstance(figures, str):
        print(f"Slurm not available: {figures}")
        return 1
    print(f"{figures.version}, one node with {args.cpus} CPUs (B = python -c pass: {base:.1f} ms, p50 of 5)")
    line("srun true round trip, p50 of 20", figures.srun_true_p50_ms, "ms")
    line("sbatch -> the job's first instruction, p50 of 10", figures.sbatch_start_p50_ms, "ms")
    line(f"throughput, {figures.jobs} trivial batch jobs", figures.jobs_per_s, "jobs/s", fmt=".2f")
    ok = True
    if figures.gpulayer_start_p50_ms is not None:
        line("gpulayer submit -> the job's first instruction in Slurm, p50 of 5", figures.gpulayer_start_p50_ms, "ms")
        over = figures.gpulayer_start_p50_ms - figures.sbatch_start_p50_ms
        ok = over <= 1000
        print(f"  gpulayer over sbatch: {over:+.0f} ms (target: at most +1000 ms): {'ok' if ok else 'MISSED'}")
    if figures.timeout_end:
        timed_out = figures.timeout_end.startswith("timeout ")
        ok = ok and timed_out
        print(f"a job over its time limit (--time 1m, sleep 300): {figures.timeout_end}: "
              f"{'ok' if timed_out else 'NOT timeout'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
