"""Several daemons' real services in one event loop, on a fake clock, a loopback network and fake runners.

:class:`Lab` builds each daemon with :func:`gpulayerd.daemon.build`: its own state dir and
real SQLite store, the real services, a machine whose capabilities are given (never
probed), a :class:`~tests.fakes.runner.FakeRunner` (its "watchdogs", which outlive the
daemon), the shared :class:`~tests.fakes.clock.FakeClock`, and a
:class:`~tests.fakes.loopback.LoopbackNode` as its peer transport and directory.

Time moves only in :meth:`Lab.step`: advance the clock, fail the calls that timed out,
end the runs whose deadline passed, then what the daemons' loops would do in one tick
(a heartbeat round, each daemon's lease tick, each daemon's scheduling pass), letting the
background work finish after each part (:meth:`Lab.settle`). Nothing sleeps for real:
:meth:`Lab.settle` only waits for work already under way (SQLite, threads) to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayerd import daemon
from gpulayerd.config import DaemonConfig
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, EnvironmentModel, FrameworkModel, JobView, SubmitRequest
from gpulayerd.net.identity import Identity
from gpulayerd.store import Store

from .clock import FakeClock
from .loopback import LoopbackNetwork, LoopbackNode
from .runner import FakeRunner

__all__ = ["OWNER", "W1", "W2", "W3", "FakeDaemon", "Lab", "caps_for", "d", "start_gang", "three_daemons", "view"]

LEASE_S = 10.0
GRACE_S = 5.0

# Node ids of the usual lab (node-id order: owner < w1 < w2 < w3).
OWNER = "a" * 52
W1 = "b" * 52
W2 = "c" * 52
W3 = "d" * 52


def caps_for(node_id: str, name: str, taken_at: float) -> Capabilities:
    """A CPU machine with one interpreter that has torch (gloo): fits CPU and distributed CPU jobs."""
    env = EnvironmentModel(interpreter=sys.executable, python_version="3.11.9",
                           frameworks={"torch": FrameworkModel(version="2.4.0", distribution="torch")},
                           torch_cuda=False, torch_mps=False, distributed_backends=["gloo"])
    return Capabilities(node_id=node_id, hostname=name, platform="linux", machine="x86_64", cpu_count=8,
                        memory_total_bytes=16 * 2**30, environments=[env], taken_at=taken_at)


@dataclass
class FakeDaemon:
    """One daemon of a :class:`Lab`: its machine (runner) outlives its services."""

    name: str
    node_id: str
    config: DaemonConfig
    runner: FakeRunner
    store: Store
    node: LoopbackNode
    services: daemon.Services
    alive: bool = True

    @property
    def owner(self) -> Any:
        """The owner service (typed loosely: other helpers may reshape the services)."""
        return self.services.owner


class Lab:
    """Daemons sharing one fake clock and one loopback network (see the module docstring).

    Args:
        root: a fresh directory (each daemon gets ``root/<name>/``; jobs run in ``root/work``).
        seed: seeds every daemon's random source (job ids, gang backoff).
    """

    def __init__(self, root: Path, seed: int = 1) -> None:
        self.root = root
        self.workdir = root / "work"
        self.clock = FakeClock()
        self.net = LoopbackNetwork(self.clock, call_timeout_s=3.0, suspect_after_s=3.0)
        self.daemons: dict[str, FakeDaemon] = {}
        self._seed = seed

    # ------------------------------------------------------------------ daemons

    async def add(self, name: str, node_id: str, *, cpu_slots: int = 2, **settings: Any) -> FakeDaemon:
        """Build and start (recover) the daemon ``name``; ``settings`` are :class:`DaemonConfig` fields."""
        base = self.root / name
        await asyncio.to_thread(_mkdirs, [base / "state" / "runs", base / "locks", self.workdir])
        config = DaemonConfig(
            state_dir=base / "state", device_lock_dir=base / "locks", cpu_slots=cpu_slots,
            interpreters=[sys.executable], mdns=False, lease_grace_s=GRACE_S, peer_timeout_s=3.0,
            offer_interval_s=2.0, hold_ttl_s=10.0, schedule_interval_s=1.0, **settings)
        runner = FakeRunner(config.runs_dir, self.clock)
        d = await self._build(name, node_id, config, runner)
        self.daemons[name] = d
        return d

    async def _build(self, name: str, node_id: str, config: DaemonConfig, runner: FakeRunner) -> FakeDaemon:
        store = await Store.open(config.db_path)
        identity = Identity(node_id=node_id, state_dir=config.state_dir,
                            key_path=config.state_dir / "identity" / "node.key")
        nodes: list[LoopbackNode] = []

        def peers(parts: daemon.PeerParts) -> LoopbackNode:
            nodes.append(self.net.node(node_id, name, router=parts.router, machine=parts.machine, usage=parts.usage))
            return nodes[-1]

        services = daemon.build(
            config, identity, store, SUPPORT_MATRIX, clock=self.clock,
            rng=random.Random(f"{self._seed}-{name}-{len(self.daemons)}"), runner=runner,
            capabilities=caps_for(node_id, name, self.clock.wall()), peers=peers, hostname=name)
        d = FakeDaemon(name=name, node_id=node_id, config=config, runner=runner, store=store, node=nodes[0],
                       services=services)
        # Its certificate's word: enrolled in its configured mode, bound to the daemon's own user.
        d.node.mode, d.node.user = services.machine.accounts.mode, services.machine.accounts.user
        # What daemon.run() does before serving: recover the runs, then the gangs (once they persist).
        await services.recovery.recover()
        recover_gangs = getattr(services.gangs, "recover", None)
        if recover_gangs is not None:
            await recover_gangs()
        if services.usage is not None:
            await services.usage.load()
        await self.settle()
        return d

    async def stop(self, d: FakeDaemon) -> None:
        """The daemon stops (or is killed): its services and store go; its runs go on under their watchdogs.

        Calls to it are refused until :meth:`restart`.
        """
        if not d.alive:
            return
        d.alive = False
        self.net.crash(d.node_id)
        await d.services.signals.close()
        await d.services.worker.close()
        d.services.machine.close()
        await d.store.close()

    async def restart(self, d: FakeDaemon) -> FakeDaemon:
        """Stop ``d`` if it runs, then build it again on the same state dir and machine (recovery runs)."""
        await self.stop(d)
        fresh = await self._build(d.name, d.node_id, d.config, d.runner)
        self.daemons[d.name] = fresh
        return fresh

    async def crash_host(self, d: FakeDaemon) -> list[tuple[str, int]]:
        """The whole host dies (``kill -9`` of the daemon, its watchdogs and jobs): returns the runs it had."""
        lost = d.runner.crash()
        await self.stop(d)
        return lost

    def alive(self) -> list[FakeDaemon]:
        """The daemons running now, by node id."""
        return sorted((d for d in self.daemons.values() if d.alive), key=lambda d: d.node_id)

    # ------------------------------------------------------------------ time

    async def step(self, dt: float = 1.0, *, schedule: bool = True) -> None:
        """``dt`` seconds pass; then one heartbeat round, lease tick and (``schedule``) scheduling pass each."""
        self.clock.advance(dt)
        self.net.expire_calls()
        for d in self.daemons.values():
            d.runner.check_deadlines()
        await self.settle()
        await self.net.heartbeat()
        for d in self.alive():
            await d.services.leases.tick()
        await self.settle()
        if schedule:
            for d in self.alive():
                await d.services.scheduler.run_once()
            await self.settle()

    async def run_for(self, seconds: float, dt: float = 1.0) -> None:
        """:meth:`step` until ``seconds`` have passed."""
        for _ in range(round(seconds / dt)):
            await self.step(dt)

    async def run_until(self, what: str, check: Callable[[], Awaitable[bool]], limit_s: float = 60.0) -> float:
        """:meth:`step` (one second) until ``await check()`` is true; returns the fake seconds it took.

        Raises:
            AssertionError: not within ``limit_s`` fake seconds.
        """
        start = self.clock.monotonic()
        for _ in range(int(limit_s) + 1):
            if await check():
                return self.clock.monotonic() - start
            await self.step()
        raise AssertionError(f"not {what} within {limit_s:g} s of fake time")

    async def schedule(self) -> None:
        """A heartbeat round and one scheduling pass on every daemon, no time passing."""
        await self.net.heartbeat()
        for d in self.alive():
            await d.services.scheduler.run_once()
        await self.settle()

    async def settle(self, limit_s: float = 10.0) -> None:
        """Let background work run until every task waits on something only the test can end.

        Idle waits: a fake run still running, a hung call, a fake-clock sleep. Anything
        else (SQLite, a thread, a ready task) is waited for.

        Raises:
            AssertionError: work still busy after ``limit_s`` of real time (a bug or a real wait).
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + limit_s
        quiet = 0
        while quiet < 3:
            await asyncio.sleep(0)
            busy = self._busy()
            if busy:
                quiet = 0
                if loop.time() > end:
                    raise AssertionError(f"still busy after {limit_s} s: {sorted(t.get_name() for t in busy)}")
                await asyncio.wait(busy, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            else:
                quiet += 1

    def _busy(self) -> set[asyncio.Task[Any]]:
        me = asyncio.current_task()
        tasks = {t for t in asyncio.all_tasks() if t is not me and not t.done()}
        idle: set[Any] = set(self.clock.sleepers()) | set(self.net.idle_futures())
        for d in self.daemons.values():
            idle.update(d.runner.idle_futures())
        released = _wait_for_sources(tasks)
        changed = True
        while changed:
            changed = False
            for t in tasks:
                if t not in idle and _waits_on_idle(t, idle, released):
                    idle.add(t)
                    changed = True
        return tasks - idle

    # ------------------------------------------------------------------ jobs

    async def submit(self, d: FakeDaemon, *, retries: int = 0, lease_s: float = LEASE_S, nnodes: int | None = None,
                     cpus: int = 1, name: str | None = None) -> str:
        """Submit a CPU job on ``d`` (a gang of ``nnodes`` hosts with ``cpus`` ranks each if given)."""
        spec: dict[str, Any] = {"command": ["python", "train.py"], "workdir": str(self.workdir),
                                "policy": {"retries": retries, "lease_s": lease_s}}
        if name is not None:
            spec["name"] = name
        if nnodes is not None or cpus > 1:
            spec["distributed"] = {"nnodes": nnodes or 1, "nproc_per_node": cpus}
        view = await d.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))
        await self.settle()
        return view.id

    async def job(self, d: FakeDaemon, job_id: str) -> JobView:
        """The job as its owner ``d`` shows it (attempts and events included)."""
        return await d.services.owner.get_job(job_id)

    async def close(self) -> None:
        """Stop every daemon and fail the calls still hung."""
        self.net.close()
        for d in self.daemons.values():
            await self.stop(d)


def _mkdirs(paths: Iterable[Path]) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------- idle detection (CPython asyncio)

_RELEASE_WAITER = getattr(asyncio.tasks, "_release_waiter", None)  # wait_for's waiter (Python < 3.12)


def _callbacks(fut: asyncio.Future[Any]) -> list[Any]:
    return [cb for cb, *_ in (getattr(fut, "_callbacks", None) or [])]


def _wait_for_sources(tasks: set[asyncio.Task[Any]]) -> dict[int, asyncio.Future[Any]]:
    """id(wait_for's waiter) -> the future it waits for (a gather of ``tasks``, or one of them)."""
    sources: set[asyncio.Future[Any]] = set(tasks)
    for t in tasks:  # a gather's children hold it in their done-callback's closure
        for cb in _callbacks(t):
            for cell in getattr(cb, "__closure__", None) or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    if isinstance(cell.cell_contents, asyncio.Future):
                        sources.add(cell.cell_contents)
    out: dict[int, asyncio.Future[Any]] = {}
    for src in sources:
        for cb in _callbacks(src):
            if isinstance(cb, functools.partial) and cb.func is _RELEASE_WAITER and cb.args:
                out[id(cb.args[0])] = src
    return out


def _waits_on_idle(t: asyncio.Task[Any], idle: set[Any], released: dict[int, asyncio.Future[Any]]) -> bool:
    waiter = getattr(t, "_fut_waiter", None)
    return waiter is not None and _future_idle(waiter, idle, released, depth=0)


def _future_idle(f: asyncio.Future[Any], idle: set[Any], released: dict[int, asyncio.Future[Any]],
                 depth: int) -> bool:
    if f in idle:
        return True
    if depth > 8:
        return False
    children = getattr(f, "_children", None)  # asyncio.gather's future
    if children is not None:
        return all(c.done() or _future_idle(c, idle, released, depth + 1) for c in children)
    if isinstance(f, asyncio.Task):
        return False  # not idle yet (the fixed point in Lab._busy adds it when it is)
    src = released.get(id(f))
    return src is not None and _future_idle(src, idle, released, depth + 1)


@contextlib.asynccontextmanager
async def three_daemons(tmp_path: Path) -> AsyncIterator[Lab]:
    """The usual lab: an owner with 1 CPU slot and workers w1, w2 with 2 each, all up.

    On exit it closes every daemon and checks that no handler failed (a refusal is an
    answer, never a handler failure).
    """
    lab = Lab(tmp_path)
    await lab.add("owner", OWNER, cpu_slots=1)
    await lab.add("w1", W1, cpu_slots=2)
    await lab.add("w2", W2, cpu_slots=2)
    await lab.net.heartbeat()
    try:
        yield lab
    finally:
        await lab.close()
    assert lab.net.errors == []


def d(lab: Lab, name: str) -> FakeDaemon:
    """The daemon called ``name`` in ``lab``."""
    return lab.daemons[name]


async def view(lab: Lab, job_id: str) -> JobView:
    """The owner's view of ``job_id``."""
    return await lab.job(d(lab, "owner"), job_id)


async def start_gang(lab: Lab, retries: int = 0) -> str:
    """Submit a 2-host job from the owner and step until both ranks run on w1 and w2; returns its id."""
    job = await lab.submit(d(lab, "owner"), nnodes=2, cpus=2, retries=retries)

    async def both_running() -> bool:
        v = await view(lab, job)
        return (v.status == "running" and d(lab, "w1").runner.get(job, v.attempt) is not None
                and d(lab, "w2").runner.get(job, v.attempt) is not None)

    await lab.run_until("both ranks running", both_running, limit_s=10)
    return job
