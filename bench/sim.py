"""Figures for a simulated department: ``python bench/sim.py --nodes 100 --minutes 10 --seed 1``.

Runs N real daemons (``tests/sim``: daemon.build, real services, route table and role checks;
simulated network with 1 ms median latency, clock, runner and in-memory store) with 2 GPUs
each and today's protocol and default timings, phase by phase, and prints each figure beside
the department target (the issue's, set for 500 nodes). With several ``--nodes`` it prints the
growth exponent of each figure with N (least-squares slope of log figure over log N).

Phases (seconds of simulated time; ``--minutes`` is the simulated span asked for):

1. idle: 10 s to settle, then an idle window: messages and bytes each node sends per second,
   by kind (heartbeats include capability fetches; "gossip" is the part of the heartbeat
   bytes that carries fair-share holdings, which ride in every heartbeat and reply);
2. failure detection: one daemon is killed; seconds until each other daemon stops counting
   it up (it leaves "up" after ``suspect_after_s``: then it is no longer offered jobs);
3. burst: 1,000 one-GPU jobs of ``--burst-job-s`` (10 s) submitted at once from 10 machines
   onto the idle cluster, time until the last starts, beside the ideal given the free GPUs
   ((ceil(1000 / GPUs) - 1) x the job's length); then its last jobs end;
4. load: the lab mix (1- and 2-GPU jobs of 1-5 minutes, 70 % of the GPUs busy on average)
   for the rest of the span: traffic per node per second, submit->start p50/p99 (simulated
   seconds, jobs started in the window), claim conflicts per placement (claims denied by
   owners over claims granted).

Memory per simulated daemon: the process's resident set growth while the daemons were built
and ran, divided by N (each has its own services, store and peer table). With one ``--nodes``
N, a smaller N (``--compare``, 20) runs first, so that the growth of each figure with N is
measured and extrapolated to N=500 beside the targets. The real-time budget (``--budget-s``)
is shared by the Ns (by N squared, at least 60 s each); the load window ends where the budget
does and says so: that is the first limit met (the cost of simulating all-to-all heartbeats).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sim.workload import burst, copy_traffic, detection_time, lab_mix, percentile, traffic_per_node_s
from tests.sim.world import Sim


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _fmt(traffic: dict[str, tuple[float, float]]) -> str:
    total_b = sum(b for _, b in traffic.values())
    total_m = sum(m for m, _ in traffic.values())
    parts = ", ".join(f"{k} {m:.1f} msg {b / 1e3:.2f} KB" for k, (m, b) in traffic.items())
    return f"{total_m:.1f} msg/s {total_b / 1e3:.2f} KB/s ({parts})"


async def measure(n: int, minutes: float, seed: int, budget_s: float, burst_job_s: float = 10.0,
                  with_burst: bool = True, charge_cpu: bool = True) -> dict[str, float]:
    """Every figure for ``n`` daemons (see the module docstring); NaN for a phase cut short."""
    out: dict[str, float] = {}
    t_real = time.perf_counter()

    def left() -> float:
        return budget_s - (time.perf_counter() - t_real)

    with tempfile.TemporaryDirectory() as td:
        rss0 = _rss_bytes()
        sim = Sim(Path(td), seed=seed, n=n, skew_ppm=100, charge_cpu=charge_cpu)
        await sim.start()
        span = minutes * 60
        await sim.run_for(10)
        # 1. idle
        idle_s = 10.0 if n >= 100 else 20.0
        before, t0 = copy_traffic(sim), time.perf_counter()
        await sim.run_for(idle_s)
        per_sim_s = (time.perf_counter() - t0) / idle_s
        idle = traffic_per_node_s(before, copy_traffic(sim), n, idle_s)
        out["idle_bytes"] = sum(b for _, b in idle.values())
        out["idle_msgs"] = sum(m for m, _ in idle.values())
        hb_msg = sim.daemons["n000"].node
        gossip = len(hb_msg._message().model_dump_json(include={"holdings", "revoked"})) if hb_msg else 0
        print(f"N={n}: real seconds per simulated second (idle): {per_sim_s:.3g}")
        if charge_cpu:
            charged = sum(sim.net.cpu_charged_s.values()) / max(len(sim.net.cpu_charged_s), 1)
            print(f"N={n}: handlers' CPU charged in simulated time (replies leave that much later; one "
                  f"handler at a time per daemon): {charged * 1e3:.0f} ms per daemon over the first {10 + idle_s:g} "
                  f"simulated s (--no-charge-cpu: timers only)")
        print(f"N={n}: idle traffic per node: {_fmt(idle)}; of each heartbeat, {gossip} B are holdings/revocations "
              f"(gossip)   [target <= 2 KB/s at N=500]")
        # 2. failure detection
        seen = await detection_time(sim, sorted(sim.daemons)[-1], limit_s=20.0)
        out["detect_p50"] = percentile(seen, 50)
        out["detect_max"] = max(seen) if seen else math.nan
        print(f"N={n}: dead daemon no longer up for the others after p50 {out['detect_p50']:.2f} s, "
              f"max {out['detect_max']:.2f} s   [target <= 10 s]")
        # 3. burst onto the idle cluster (right after the detection: nothing runs, no wait)
        gpus = sum(d.gpus for d in sim.daemons.values() if d.services)
        out["burst_ratio"] = math.nan
        t0s = sim.time.now
        ids = set(await burst(sim, 1000, duration_s=burst_job_s)) if with_burst else set()  # (none on the dead one)
        t0 = time.perf_counter()
        ideal = (math.ceil(len(ids) / gpus) - 1) * burst_job_s
        while with_burst and sim.time.now - t0s < 4 * ideal + 120 and left() > 0.45 * budget_s:  # (then the load)
            await sim.run_for(0.5)
            if all(sim.jobs[j].started is not None for j in ids):
                break
        burst_per_s = (time.perf_counter() - t0) / max(sim.time.now - t0s, 1e-9)
        starts = [t for t in (sim.jobs[j].started for j in ids) if t is not None]
        if not with_burst:
            print(f"N={n}: no burst at this N (--compare: the budget goes to the other phases)")
        elif not ids or len(starts) < len(ids):  # no figure (max() over NaNs would answer the first one)
            cut = sim.time.now - t0s
            by_then = min(len(ids), gpus * (math.floor(cut / burst_job_s) + 1))  # the ideal's starts by then
            print(f"N={n}: 1,000-job burst cut short after {cut:.1f} simulated s (real-time budget or 4x ideal + "
                  f"120 s): {len(starts)} of {len(ids)} started, the ideal would have started {by_then} by then "
                  f"(ideal for all: {ideal:.0f} s on {gpus} GPUs)   [target <= 2x ideal]")
            # The rest is cancelled: the load then runs beside the started ones only (the workers' offers
            # of cancelled jobs still come as claims, denied: they count in the load's claim conflicts).
            for j in sorted(ids):
                job = sim.jobs[j]
                d = sim.daemons[job.owner]
                if job.started is None and d.services is not None:
                    await d.services.owner.cancel(j)
                    del sim.jobs[j]  # ended: no longer a job waiting for the idle check
            await sim.run_for(2)  # the workers' offers of cancelled jobs: claimed, denied, dropped
        else:
            placed = max(starts) - t0s
            out["burst_ratio"] = placed / ideal if ideal > 0 else math.nan
            print(f"N={n}: 1,000-job burst ({burst_job_s:g} s jobs) placed in {placed:.1f} s, ideal {ideal:.0f} s "
                  f"({gpus} GPUs free): {out['burst_ratio']:.2f}x   [target <= 2x]")
        if with_burst:
            print(f"N={n}: real seconds per simulated second (burst): {burst_per_s:.3g}")
        if with_burst and left() > burst_per_s * (burst_job_s + 2) + 30:
            await sim.run_for(burst_job_s + 2)  # the burst's last jobs end: the load starts on an idle cluster
        elif with_burst:
            print(f"N={n}: the burst's jobs not yet ended stay (real-time budget): the load starts beside them")
        # 4. load: the lab mix for the rest of the span, as far as the real-time budget goes
        load_s = max(30.0, span - (sim.time.now - 10))
        granted0 = sum(d.services.signals.stats["claim_requests_granted"] for d in sim.daemons.values() if d.services)
        denied0 = sum(d.services.signals.stats["claim_requests_denied"] for d in sim.daemons.values() if d.services)
        before, start = copy_traffic(sim), sim.time.now
        task = asyncio.ensure_future(lab_mix(sim, load_s, util=0.7))
        t0, ran = time.perf_counter(), 0.0
        while ran < load_s:
            chunk = min(10.0, load_s - ran)
            if ran and left() - 5 < (time.perf_counter() - t0) / ran * chunk:  # (the first chunk always runs)
                print(f"N={n}: load window cut to {ran:.0f} of {load_s:.0f} simulated s (real-time budget)")
                break
            await sim.run_for(chunk)
            ran += chunk
        task.cancel()
        print(f"N={n}: real seconds per simulated second (load): {(time.perf_counter() - t0) / ran:.3g}")
        load = traffic_per_node_s(before, copy_traffic(sim), n - 1, ran)
        waits = [j.started - j.submitted for j in sim.jobs.values() if j.started is not None and j.submitted >= start]
        granted = sum(d.services.signals.stats["claim_requests_granted"] for d in sim.daemons.values()
                      if d.services) - granted0
        denied = sum(d.services.signals.stats["claim_requests_denied"] for d in sim.daemons.values()
                     if d.services) - denied0
        out["load_bytes"] = sum(b for _, b in load.values())
        out["load_msgs"] = sum(m for m, _ in load.values())
        out["start_p50_ms"] = percentile(waits, 50) * 1e3
        out["start_p99_ms"] = percentile(waits, 99) * 1e3
        out["conflicts"] = denied / granted if granted else math.nan
        print(f"N={n}: load traffic per node: {_fmt(load)}   [target <= 20 KB/s at N=500]")
        print(f"N={n}: submit->start ({len(waits)} jobs) p50 {out['start_p50_ms']:.0f} ms, "
              f"p99 {out['start_p99_ms']:.0f} ms (simulated, 1 ms latency)   [target p50 <= 100 ms]")
        if len(waits) < 20:
            print(f"N={n}:   (only {len(waits)} jobs started in the {ran:.0f} s load window: these percentiles say "
                  "little; a longer --minutes leaves the lab mix more time after the burst)")
        print(f"N={n}: claim conflicts per placement {out['conflicts']:.3f} ({denied} denied / {granted} granted)")
        out["mem_per_daemon"] = (_rss_bytes() - rss0) / n
        print(f"N={n}: memory per simulated daemon {out['mem_per_daemon'] / 2**20:.1f} MiB (RSS growth / N"
              + ("; below N=50 the allocator's arenas and the collector's timing swing it by MiBs)" if n < 50 else ")"))
        print(f"N={n}: {sim.net.calls} calls, {sim.steps} steps, {time.perf_counter() - t_real:.0f} s real; "
              f"handler errors {len(sim.net.errors)}")
        await sim.close()
    return out


def _slope(xs: list[float], ys: list[float]) -> float:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=False) if y > 0 and not math.isnan(y)]
    if len(pts) < 2:
        return math.nan
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else math.nan


def _one_faulty_seed(seed: int, n: int, minutes: float) -> tuple[int, str, float]:
    """One seed of ``--seeds`` (in its own process): (seed, what it found, real seconds)."""
    from tests.sim.invariants import Violation
    from tests.sim.test_sim import faulty_department

    logging.getLogger("gpulayerd.store.db").setLevel(logging.ERROR)
    logging.getLogger("gpulayerd").setLevel(logging.ERROR)  # refusals of stale kills etc.: expected under faults
    t0 = time.perf_counter()

    async def run() -> str:
        with tempfile.TemporaryDirectory() as td:
            sim, settle_s, counts = await faulty_department(Path(td), seed, n, minutes=minutes)
            return (f"ok: {len(sim.jobs)} jobs {counts}, all ended {settle_s:.0f} s after the last fault healed "
                    f"and the last submission, {sim.checker.checked} starts checked, {sim.steps} steps, "
                    f"{sim.net.calls} calls")

    try:
        what = asyncio.run(run())
    except Violation as v:
        what = f"VIOLATION: {v}"
    except Exception as e:  # a handler error or a crash of the simulation: reported, not a pass
        what = f"ERROR: {type(e).__name__}: {e}"
    return seed, what, time.perf_counter() - t0


def faulty_seeds(seeds: list[int], n: int, minutes: float, jobs: int) -> int:
    """Run ``tests/sim/test_sim.py``'s faulty department for each seed (``jobs`` processes at a time); prints
    each seed's result as it ends; the count of seeds that broke an invariant or failed."""
    import concurrent.futures
    import multiprocessing

    bad, t0 = 0, time.perf_counter()
    print(f"{len(seeds)} seeds, N={n}, {minutes:g} simulated minutes each, with faults, {jobs} at a time")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                                max_tasks_per_child=1) as pool:
        futures = [pool.submit(_one_faulty_seed, s, n, minutes) for s in seeds]
        for f in concurrent.futures.as_completed(futures):
            seed, what, real_s = f.result()
            bad += not what.startswith("ok")
            print(f"seed {seed}: {what} ({real_s:.0f} s real)")
    print(f"{len(seeds) - bad} of {len(seeds)} seeds held every invariant; {bad} did not "
          f"({time.perf_counter() - t0:.0f} s real)")
    return bad


def _seed_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    """Parse the flags, run each N, print the figures and their growth with N (or, with ``--faults``, the seeds)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="100", help="N, or N1,N2,... (growth exponents)")
    ap.add_argument("--minutes", type=float, default=10.0, help="simulated span per N (minutes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=540.0, help="real seconds for all N together")
    ap.add_argument("--compare", type=int, default=20,
                    help="with one --nodes N: also run this smaller N first, for the growth with N (0: none)")
    ap.add_argument("--burst-job-s", type=float, default=10.0, help="the burst's jobs' length (simulated s)")
    ap.add_argument("--faults", action="store_true",
                    help="instead of the figures: the invariants of --seeds runs with faults (N = --nodes)")
    ap.add_argument("--seeds", default="1-20", help="with --faults: seeds, e.g. 1-20 or 1,4,7")
    ap.add_argument("--jobs", type=int, default=1, help="with --faults: seeds run at a time (processes)")
    ap.add_argument("--no-charge-cpu", action="store_true",
                    help="figures on timers alone: handlers' CPU time is not charged in simulated time")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # each figure as soon as it is known
    logging.getLogger("gpulayerd.store.db").setLevel(logging.ERROR)
    if args.faults:
        sys.exit(1 if faulty_seeds(_seed_list(args.seeds), int(args.nodes), args.minutes, args.jobs) else 0)
    ns = [int(x) for x in args.nodes.split(",")]
    if len(ns) == 1 and 0 < args.compare < ns[0]:
        ns = [args.compare, *ns]  # a second N for the growth with N
    elif len(ns) == 1:
        print(f"(no growth with N: --compare {args.compare} is not a smaller N than {ns[0]}; "
              "give --compare a smaller N or --nodes N1,N2,...)")
    weights = [n * n for n in ns]
    budgets = [max(60.0, args.budget_s * w / sum(weights)) for w in weights]
    budgets[-1] = max(60.0, args.budget_s - sum(budgets[:-1]))  # the largest N gets what the others leave
    results = {}
    for n, budget in zip(ns, budgets, strict=True):
        results[n] = asyncio.run(measure(n, args.minutes, args.seed, budget, args.burst_job_s,
                                         with_burst=n == ns[-1] or len(ns) == len(args.nodes.split(",")),
                                         charge_cpu=not args.no_charge_cpu))
    if len(ns) > 1:
        growth(ns, results)


TARGETS = {"idle_bytes": (2000.0, "B/s per node idle"), "load_bytes": (20000.0, "B/s per node under load"),
           "start_p50_ms": (100.0, "ms submit->start p50"), "detect_max": (10.0, "s to detect a dead daemon"),
           "burst_ratio": (2.0, "x ideal to place a 1,000-job burst")}
"""The department's targets at N=500 (the issue's): figure -> (at most, what it measures)."""


def growth(ns: list[int], results: dict[int, dict[str, float]]) -> None:
    """Print each figure's growth with N (least-squares exponent), and where a target is, the figure
    extrapolated to N=500 and the N at which the target is missed."""
    print("growth with N (exponent of N, least squares over " + ", ".join(map(str, ns)) + "):")
    top = ns[-1]
    for key in results[ns[0]]:
        k = _slope([float(n) for n in ns], [results[n][key] for n in ns])
        no_exponent = "; ".join(f"N={n}: {'no figure' if math.isnan(results[n][key]) else f'{results[n][key]:g}'}"
                                for n in ns if not results[n][key] > 0)  # (an exponent needs log N and log x)
        line = f"  {key}: " + ("no exponent" if math.isnan(k) else f"N^{k:.2f}") + \
            (f" (left out: {no_exponent})" if no_exponent else "") + "   " + \
            "  ".join(f"N={n}: {results[n][key]:.4g}" for n in ns)
        if key in TARGETS:
            limit, what = TARGETS[key]
            at = results[top][key]
            if math.isnan(at):
                line += f"   [target at N=500: <= {limit:g} {what}; not extrapolated: no figure at N={top}]"
            elif math.isnan(k):
                verdict = "met" if at <= limit else "missed"
                line += f"   [target <= {limit:g} {what}: {verdict} at N={top}; not extrapolated to N=500: no exponent]"
            else:
                at500 = at * (500 / top) ** k
                verdict = "met" if at500 <= limit else "missed"
                if at500 > limit and at > limit:
                    verdict += f" (already at N={top})"
                elif at500 > limit and k > 0:
                    verdict += f" from N~{top * (limit / at) ** (1 / k):.0f}"
                line += f"   -> N=500: {at500:.4g} [target <= {limit:g} {what}: {verdict}]"
        print(line)

if __name__ == "__main__":
    main()
