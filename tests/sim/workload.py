"""What happens in a simulated department: the lab job mix, bursts, the fault plan, and the figures.

All times are seconds of true simulated time; every choice comes from the simulation's
seeded random source. :func:`lab_mix` submits 1- and 2-GPU jobs (3 in 4 want one GPU) with
exponential gaps at a rate that keeps ``util`` of the GPUs busy on average, from random
machines. :func:`fault_plan` injects, one after another: a daemon crash and restart, a
partition of one lab (a fifth of the machines) from the rest, 10 % message loss, a paused
(SIGSTOP) daemon; clocks are skewed from the start (``Sim(skew_ppm=...)``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .network import Traffic
from .world import Sim

__all__ = ["Faults", "burst", "detection_time", "fault_plan", "lab_mix", "percentile", "traffic_per_node_s"]


async def lab_mix(sim: Sim, seconds: float, *, util: float = 0.7, duration_s: tuple[float, float] = (60.0, 300.0),
                  rng: random.Random | None = None) -> list[str]:
    """Submit the lab mix for ``seconds``; the ids acknowledged."""
    rng = rng or random.Random(f"{sim.seed}-mix")
    gpus_total = sum(d.gpus for d in sim.daemons.values())
    mean_gpu_s = 1.25 * (duration_s[0] + duration_s[1]) / 2
    rate = util * gpus_total / mean_gpu_s  # jobs per second
    end = sim.time.now + seconds
    names = sorted(sim.daemons)
    out: list[str] = []
    while True:
        await sim.time.sleep(rng.expovariate(rate))
        if sim.time.now >= end:
            return out
        d = sim.daemons[rng.choice(names)]
        gpus = 1 if rng.random() < 0.75 else 2
        job = await sim.submit(d, gpus=gpus, duration_s=rng.uniform(*duration_s))
        if job is not None:
            out.append(job)


async def burst(sim: Sim, n: int, *, owners: int = 10, duration_s: float = 30.0) -> list[str]:
    """Submit ``n`` one-GPU jobs of ``duration_s`` at once from ``owners`` machines; their ids."""
    names = sorted(sim.daemons)[:owners]
    out = []
    for i in range(n):
        job = await sim.submit(sim.daemons[names[i % len(names)]], gpus=1, duration_s=duration_s)
        if job is not None:
            out.append(job)
    return out


@dataclass
class Faults:
    """The fault plan's settings (seconds of true time)."""

    start: float
    crash_s: float = 20.0
    partition_s: float = 30.0
    loss_s: float = 60.0
    pause_s: float = 15.0
    gap_s: float = 20.0

    @property
    def end(self) -> float:
        """When the last fault heals."""
        return self.start + self.crash_s + self.partition_s + self.loss_s + self.pause_s + 4 * self.gap_s


async def fault_plan(sim: Sim, plan: Faults, rng: random.Random | None = None) -> None:
    """Inject the faults one after another (see the module docstring)."""
    rng = rng or random.Random(f"{sim.seed}-faults")
    names = sorted(sim.daemons)
    await sim.time.sleep(max(0.0, plan.start - sim.time.now))
    c = sim.checker
    victim = sim.daemons[rng.choice(names)]
    c.fault_started()
    await sim.crash(victim, host=rng.random() < 0.5)
    await sim.time.sleep(plan.crash_s)
    await sim.restart(victim)
    c.fault_healed()
    await sim.time.sleep(plan.gap_s)
    lab = set(rng.sample(names, max(1, len(names) // 5)))
    c.fault_started()
    sim.note(f"partition {sorted(lab)}")
    sim.net.partition({sim.daemons[n].node_id for n in lab})
    await sim.time.sleep(plan.partition_s)
    sim.net.heal()
    sim.note("heal")
    c.fault_healed()
    await sim.time.sleep(plan.gap_s)
    c.fault_started()
    sim.note("loss 10 %")
    sim.net.loss = 0.10
    await sim.time.sleep(plan.loss_s)
    sim.net.loss = 0.0
    sim.note("loss 0")
    c.fault_healed()
    await sim.time.sleep(plan.gap_s)
    slow = sim.daemons[rng.choice(names)]
    c.fault_started()
    sim.pause(slow)
    await sim.time.sleep(plan.pause_s)
    sim.resume(slow)
    c.fault_healed()


async def detection_time(sim: Sim, victim_name: str, limit_s: float = 30.0, poll_s: float = 0.05) -> list[float]:
    """Crash ``victim_name``'s daemon; for each other daemon, seconds until it no longer counts it up."""
    victim = sim.daemons[victim_name]
    await sim.crash(victim)
    t0 = sim.time.now
    pending = {d.name for d in sim.daemons.values() if d.alive}
    seen: list[float] = []
    while pending and sim.time.now - t0 < limit_s:
        await sim.run_for(poll_s)
        for name in sorted(pending):
            node = sim.daemons[name].node
            if node is None or victim.node_id not in node.up_ids():
                pending.discard(name)
                seen.append(sim.time.now - t0)
    return seen


def traffic_per_node_s(before: dict[str, Traffic], after: dict[str, Traffic], nodes: int, seconds: float
                       ) -> dict[str, tuple[float, float]]:
    """Sent messages and bytes per node per second by kind between two copies of the counters."""
    tot_m: dict[str, float] = {}
    tot_b: dict[str, float] = {}
    for node, t in after.items():
        b = before.get(node, Traffic())
        for kind in t.sent_msgs:
            tot_m[kind] = tot_m.get(kind, 0.0) + t.sent_msgs[kind] - b.sent_msgs[kind]
            tot_b[kind] = tot_b.get(kind, 0.0) + t.sent_bytes[kind] - b.sent_bytes[kind]
    scale = 1.0 / (nodes * seconds)
    return {k: (tot_m[k] * scale, tot_b[k] * scale) for k in sorted(tot_m)}


def copy_traffic(sim: Sim) -> dict[str, Traffic]:
    """A copy of every node's counters now."""
    out = {}
    for node, t in sim.net.traffic.items():
        c = Traffic()
        c.add(t)
        out[node] = c
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100, nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]


async def run_with(sim: Sim, seconds: float, *coros: object) -> None:
    """Run ``coros`` as tasks while the simulation steps ``seconds``; they must be done by then."""
    tasks = [asyncio.ensure_future(c) for c in coros]  # type: ignore[call-overload]
    await sim.run_for(seconds)
    for t in tasks:
        if not t.done():
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
