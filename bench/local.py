"""Figures for one local gpulayerd: ``python bench/local.py [--idle-s 60]``.

Starts its own daemon (``--cpu-slots 8`` by default) on a temporary state dir, measures,
stops it and removes the dir. Prints figures against the targets; asserts nothing.

- submit->start latency, one job at a time: the time from just before the submit request
  leaves (:class:`DaemonClient`, unix socket) to the moment the job's own process begins,
  which the job writes itself (``sh -c 'date +%s.%N'`` into its stdout log). Each job is
  waited for before the next is submitted, so no queueing is included.
- a burst: the same jobs submitted as fast as possible by several concurrent clients;
  submits per second, job starts per second (jobs / time from the first start to the
  last), and the latency including the wait in the queue.
- throughput: one client submits ``--throughput-jobs`` (1,000) ``/bin/true`` jobs to a second
  daemon with ``--cpu-slots 2``, as fast as it is answered; jobs per second from the first
  submit to the last job's exit (the latest ``ended_at`` of the run directories' ``exit.json``).
- the pre-flight check (issue 35): submit->start of CPU jobs naming torch with the check and with
  ``--no-preflight`` (the difference is what the check adds; target <= 1.5 s), of jobs naming no
  framework (no check), and ``python -c 'import torch'`` alone as the anchor.
- the idle daemon, after the queue drained: CPU time as % of one core, and RSS.

Ctrl-C stops the daemon and cleans up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
import psutil
from bench_report import line, percentile

from gpulayerd.api.client import DaemonClient

TRIVIAL = ["sh", "-c", "date +%s.%N"]
TERMINAL = {"succeeded", "failed", "cancelled", "lost", "rejected"}
START_TIMEOUT_S = 30.0


# -------------------------------------------------------------------------- output




# -------------------------------------------------------------------------- daemon


class LocalDaemon:
    """A gpulayerd on a temporary state dir."""

    def __init__(self, root: Path, cpu_slots: int) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "gpulayerd.log"
        self.cpu_slots = cpu_slots
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "run" / "gpulayerd.sock"

    def client(self) -> DaemonClient:
        return DaemonClient(self.socket_path, timeout_s=60.0)

    def stdout_log(self, job_id: str) -> Path:
        return self.state_dir / "runs" / job_id / "1" / "stdout.log"

    async def start(self) -> None:
        script = Path(sys.executable).with_name("gpulayerd")
        argv = [str(script)] if script.exists() else [sys.executable, "-m", "gpulayerd"]
        argv += ["--state-dir", str(self.state_dir), "--device-lock-dir", str(self.root / "locks"),
                 "--cpu-slots", str(self.cpu_slots), "--log-level", "WARNING"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        end = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpulayerd exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(Exception):
                async with DaemonClient(self.socket_path, timeout_s=2.0) as c:
                    if (await c.health()).pid == self.proc.pid:
                        return
            if time.monotonic() > end:
                raise RuntimeError(f"gpulayerd did not answer within {START_TIMEOUT_S:g} s:\n{self.log_tail()}")
            await asyncio.sleep(0.02)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()

    def kill_leftovers(self) -> None:
        """Watchdogs (their command line names our run dirs) and the jobs they run."""
        me = os.getpid()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            if proc.pid != me and any(str(self.root) in a for a in proc.info.get("cmdline") or []):
                with contextlib.suppress(psutil.Error):
                    for child in proc.children(recursive=True):
                        child.kill()
                    proc.kill()

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"


def read_start(d: LocalDaemon, job_id: str) -> float | None:
    try:
        text = d.stdout_log(job_id).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


async def wait_started(d: LocalDaemon, job_ids: Sequence[str], timeout_s: float,
                       poll_s: float = 0.002) -> dict[str, float]:
    starts: dict[str, float] = {}
    end = time.monotonic() + timeout_s
    while len(starts) < len(job_ids):
        for job_id in job_ids:
            if job_id not in starts:
                t = read_start(d, job_id)
                if t is not None:
                    starts[job_id] = t
        if len(starts) == len(job_ids):
            break
        if time.monotonic() > end:
            raise RuntimeError(f"{len(job_ids) - len(starts)} jobs did not start within {timeout_s:g} s")
        await asyncio.sleep(poll_s)
    return starts


async def wait_drained(d: LocalDaemon, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    async with d.client() as c:
        while True:
            pending = await c.jobs(statuses=["queued", "claimed", "running"])
            if not pending:
                return
            if time.monotonic() > end:
                raise RuntimeError(f"{len(pending)} jobs still pending after {timeout_s:g} s")
            await asyncio.sleep(0.1)


# -------------------------------------------------------------------------- benches


async def bench_sequential(d: LocalDaemon, n: int) -> None:
    spec = {"command": TRIVIAL, "workdir": str(d.workdir)}
    latencies: list[float] = []
    async with d.client() as c:
        for _ in range(n):
            sent = time.time()
            job_id = (await c.submit(spec)).id
            start = (await wait_started(d, [job_id], 30.0))[job_id]
            latencies.append(start - sent)
    ms = [x * 1000 for x in latencies]
    print(f"one job at a time, {n} jobs (no queueing):")
    line("  submit->start latency p50 (daemon side)", percentile(ms, 50), "ms", 25)
    line("  submit->start latency p99 (daemon side)", percentile(ms, 99), "ms", 100)
    line("  submit->start latency max", max(ms), "ms")


async def bench_burst(d: LocalDaemon, n: int, n_clients: int) -> None:
    spec = {"command": TRIVIAL, "workdir": str(d.workdir)}
    sent: dict[str, float] = {}
    acked_at: list[float] = []
    counter = iter(range(n))

    async def client_loop() -> None:
        async with d.client() as c:
            for _ in counter:
                t = time.time()
                job_id = (await c.submit(spec)).id
                acked_at.append(time.time())
                sent[job_id] = t

    first_sent = time.time()
    await asyncio.gather(*(client_loop() for _ in range(n_clients)))
    submit_s = max(acked_at) - first_sent
    starts = await wait_started(d, list(sent), 120.0, poll_s=0.01)
    first, last = min(starts.values()), max(starts.values())
    ms = [(starts[j] - sent[j]) * 1000 for j in sent]
    print(f"burst, {n} jobs from {n_clients} concurrent clients, --cpu-slots {d.cpu_slots}:")
    line("  submits per second", n / submit_s, "submits/s")
    line("  job starts per second", n / (last - first) if last > first else math.inf, "starts/s")
    line("  submit->start latency p50 (incl. queueing)", percentile(ms, 50), "ms")
    line("  submit->start latency p99 (incl. queueing)", percentile(ms, 99), "ms")


async def bench_preflight(d: LocalDaemon, n: int) -> None:
    """The pre-flight check's added submit->start (issue 35): CPU jobs naming torch (the daemon's
    interpreter, this venv's torch), with the check and with ``--no-preflight``; jobs naming no
    framework get no check."""
    named = {"command": TRIVIAL, "workdir": str(d.workdir), "requirements": {"frameworks": {"torch": ""}}}
    skipped = {**named, "policy": {"preflight": False}}
    plain = {"command": TRIVIAL, "workdir": str(d.workdir)}
    async with d.client() as c:  # warm-up: a job naming torch waits for the daemon's torch check
        warm = (await c.submit(skipped)).id
    await wait_started(d, [warm], 180.0)
    figures: dict[str, list[float]] = {}
    async with d.client() as c:
        for _ in range(n):
            for label, spec in (("checked", named), ("skipped", skipped), ("plain", plain)):
                sent = time.time()
                job_id = (await c.submit(spec)).id
                figures.setdefault(label, []).append(((await wait_started(d, [job_id], 120.0))[job_id] - sent) * 1000)
    checked, unchecked, plain_ms = (percentile(figures[k], 50) for k in ("checked", "skipped", "plain"))
    first = figures["checked"][0]
    print(f"pre-flight check, {n} CPU jobs of each kind, one at a time (torch {_torch_version()}):")
    line("  submit->start, the first job naming torch (the check runs)", first, "ms")
    line("  added by that check (vs the --no-preflight p50)", first - unchecked, "ms", 1500)
    line("  submit->start p50, naming torch (a check passed within 10 min is not run again)", checked, "ms")
    line("  submit->start p50, naming torch, --no-preflight", unchecked, "ms")
    line("  added p50 (the later jobs)", checked - unchecked, "ms", 1500)
    line("  submit->start p50, naming no framework (no check runs: adds 0)", plain_ms, "ms")
    line("  anchor: `python -c 'import torch'` alone, p50 of 3 (same run)", _import_torch_ms(), "ms")


def _import_torch_ms() -> float:
    """What importing torch alone takes here (ms, p50 of 3): the floor of a check that imports it."""
    times = []
    for _ in range(3):
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, check=False)
        times.append((time.monotonic() - t) * 1000)
    return percentile(times, 50)


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "not installed"
    return str(torch.__version__)


EXIT_WINDOW = 16
"""How many pending jobs in a row :func:`wait_exits` finds without ``exit.json`` before it stops a look."""


async def wait_exits(d: LocalDaemon, job_ids: Sequence[str], timeout_s: float) -> list[float]:
    """The ``ended_at`` of each job's first attempt, once every one wrote ``exit.json``.

    Jobs end about in submit order, so each look reads the pending ones in that order and stops
    after :data:`EXIT_WINDOW` missing in a row (every 25th look reads them all): the bench's own
    polling must not take the CPU the daemon is measured on.
    """
    ends: dict[str, float] = {}
    pending = list(job_ids)
    end = time.monotonic() + timeout_s
    looks = 0
    while pending and time.monotonic() < end:
        misses, left = 0, []
        for i, job_id in enumerate(pending):
            if misses >= EXIT_WINDOW and looks % 25:
                left.extend(pending[i:])
                break
            try:
                path = d.state_dir / "runs" / job_id / "1" / "exit.json"
                ends[job_id] = float(json.loads(path.read_text())["ended_at"])
                misses = 0
            except (OSError, ValueError, KeyError):
                misses += 1
                left.append(job_id)
        pending, looks = left, looks + 1
        await asyncio.sleep(0.2)
    return list(ends.values())


async def bench_throughput(root: Path, n: int, slurm_jobs_s: float | None = None) -> None:
    """One client, ``n`` ``/bin/true`` jobs, ``--cpu-slots 2``: first submit to the last exit."""
    d = LocalDaemon(root, 2)
    try:
        await d.start()
        async with d.client() as c:  # warm-up: the first job waits for the first probe
            warm = (await c.submit({"command": ["/bin/true"], "workdir": str(d.workdir)})).id
        await wait_drained(d, 60.0)
        spec = {"command": ["/bin/true"], "workdir": str(d.workdir)}
        first = time.time()
        ids = []
        async with d.client() as c:
            for _ in range(n):
                ids.append((await c.submit(spec)).id)
        submitted = time.time()
        ends = await wait_exits(d, ids, 600.0)  # from the run directories: no load on the daemon
        await wait_drained(d, 60.0)
        assert d.proc is not None
        cpu = psutil.Process(d.proc.pid).cpu_times()
        print(f"throughput, {n} /bin/true jobs from one client, --cpu-slots 2 (warm-up job {warm}):")
        line("  submits per second", n / (submitted - first), "submits/s")
        if len(ends) < n:
            print(f"  {n - len(ends)} jobs have no exit.json", flush=True)
        if ends:
            line("  first submit to last exit", len(ends) / (max(ends) - first), "jobs/s", 100, at_most=False)
            if slurm_jobs_s is not None:
                line("  anchor: Slurm trivial jobs/s, 2 CPUs (same run)", slurm_jobs_s, "jobs/s")
        line("  daemon CPU per job (user+system, whole run)", (cpu.user + cpu.system) / (n + 1) * 1000, "ms")
        print(f"    of which user {cpu.user / (n + 1) * 1000:.1f} ms, system {cpu.system / (n + 1) * 1000:.1f} ms; "
              f"its exited children {(cpu.children_user + cpu.children_system) / (n + 1) * 1000:.1f} ms; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        if ends:
            await bench_array(d, n, len(ends) / (max(ends) - first))
    finally:
        d.stop()
        d.kill_leftovers()


async def bench_array(d: LocalDaemon, n: int, per_job_s: float) -> None:
    """One array of ``n`` ``/bin/true`` tasks on the same daemon: its submit to the last task's exit,
    in tasks per second, beside the per-job figure of the same run (target: at least 1.2x it)."""
    async with d.client() as c:
        before = (await c.health()).counters
    first = time.time()
    async with d.client() as c:
        array = (await c.submit({"command": ["/bin/true"], "workdir": str(d.workdir), "array": f"0-{n - 1}"})).id
    ends = await wait_exits(d, [f"{array}_{i}" for i in range(n)], 600.0)
    await wait_drained(d, 60.0)
    async with d.client() as c:
        after = (await c.health()).counters
    print(f"array, one submission of {n} /bin/true tasks, --cpu-slots 2 (array {array}):")
    print("  scheduling passes {}, successor claims (a task's slot to the next task, no pass) {}".format(
        *(after.get(k, 0) - before.get(k, 0) for k in ("scheduler_passes", "scheduler_successor_claims"))))
    if len(ends) < n:
        print(f"  {n - len(ends)} tasks have no exit.json", flush=True)
    if ends:
        figure = len(ends) / (max(ends) - first)
        line("  submit to last exit", figure, "tasks/s", 1.2 * per_job_s, at_most=False)
        print(f"    {figure / per_job_s:.2f}x the per-job figure above (target: at least 1.2x)")


async def bench_idle(d: LocalDaemon, idle_s: float) -> None:
    assert d.proc is not None
    proc = psutil.Process(d.proc.pid)
    await asyncio.sleep(1.0)  # let the last exits settle
    before = proc.cpu_times()
    t0 = time.monotonic()
    rss_max = proc.memory_info().rss
    while time.monotonic() - t0 < idle_s:
        await asyncio.sleep(min(1.0, max(0.0, idle_s - (time.monotonic() - t0))))
        rss_max = max(rss_max, proc.memory_info().rss)
    after = proc.cpu_times()
    wall = time.monotonic() - t0
    own = (after.user - before.user + after.system - before.system) / wall * 100
    children = (after.children_user - before.children_user
                + after.children_system - before.children_system) / wall * 100
    print(f"idle daemon over {wall:.0f} s after the queue drained (pid {proc.pid}):")
    line("  CPU", own, "% of one core", 0.5, fmt=".2f")
    line("  CPU with its exited child processes (probes)", own + children, "% of one core", 0.5, fmt=".2f")
    line("  RSS (max)", rss_max / 1e6, "MB", 80)


async def run(args: argparse.Namespace, d: LocalDaemon) -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs"
          f"{f' ({len(os.sched_getaffinity(0))} usable)' if hasattr(os, 'sched_getaffinity') else ''}, "
          f"{platform.system()} {platform.release()}, Python {platform.python_version()} ({sys.executable})")
    if args.only_throughput:
        await bench_throughput(d.root / "throughput", args.throughput_jobs, args.slurm_jobs_s)
        return
    if args.only_preflight:
        await d.start()
        await bench_preflight(d, args.preflight_jobs)
        return
    await d.start()
    print(f"gpulayerd pid {d.proc.pid if d.proc else '?'}, --cpu-slots {d.cpu_slots}, state dir {d.state_dir}")
    # Warm up: the first jobs wait for the daemon's first hardware probe.
    async with d.client() as c:
        ids = [(await c.submit({"command": TRIVIAL, "workdir": str(d.workdir)})).id for _ in range(3)]
    await wait_started(d, ids, 60.0)
    await wait_drained(d, 60.0)
    await bench_sequential(d, args.jobs)
    await wait_drained(d, 60.0)
    await bench_burst(d, args.jobs, args.clients)
    await wait_drained(d, 120.0)
    await bench_preflight(d, args.preflight_jobs)
    await wait_drained(d, 60.0)
    await bench_idle(d, args.idle_s)
    if args.throughput_jobs:
        await bench_throughput(d.root / "throughput", args.throughput_jobs, args.slurm_jobs_s)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _slurm_jobs_s() -> float | None:
    """Slurm's trivial-job throughput on 2 CPUs, measured now (bench/slurm.py), or None with the reason printed."""
    from slurm import anchor  # bench/ is on sys.path when this script runs

    figures = anchor(n_srun=5, n_sbatch=3, n_jobs=100, cpus=2)
    return None if figures is None else figures.jobs_per_s


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200, help="jobs per measurement (default 200)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients in the burst (default 8)")
    p.add_argument("--cpu-slots", type=int, default=8, help="the daemon's --cpu-slots (default 8)")
    p.add_argument("--throughput-jobs", type=int, default=1000,
                   help="/bin/true jobs for the --cpu-slots 2 throughput figure (0 skips it; default 1000)")
    p.add_argument("--only-throughput", action="store_true", help="measure only the throughput figure")
    p.add_argument("--preflight-jobs", type=int, default=10,
                   help="jobs of each kind for the pre-flight figure (default 10)")
    p.add_argument("--only-preflight", action="store_true", help="measure only the pre-flight figure")
    p.add_argument("--idle-s", type=float, default=60.0, help="idle measurement window, seconds (default 60)")
    p.add_argument("--slurm", action="store_true",
                   help="also install (when missing), start and measure Slurm (bench/slurm.py) for the throughput "
                   "anchor, in this run")
    args = p.parse_args(argv)
    args.slurm_jobs_s = _slurm_jobs_s() if args.slurm else None
    # SIGTERM (and SIGINT where the shell left it ignored) stop the bench like Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="glbench-"))
    d = LocalDaemon(root, args.cpu_slots)
    try:
        asyncio.run(run(args, d))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping gpulayerd", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        return 1
    finally:
        d.stop()
        d.kill_leftovers()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
