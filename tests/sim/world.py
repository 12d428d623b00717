"""A department of daemons in one process: N real daemons on a simulated network and clock.

:class:`Sim` builds each daemon with :func:`gpulayerd.daemon.build` (the real services, the
real route table and role checks, the real SQLite schema and queries) and replaces only the
ports that cannot run here: the clock (:class:`~tests.sim.clock.NodeClock`), the peer
transport and directory (:class:`~tests.sim.network.SimNode`), the runner
(:class:`SimRunner`, a :class:`~tests.fakes.runner.FakeRunner` whose runs end when the
workload says) and the store driver (:class:`~tests.sim.store.MemoryDisk`). Each daemon runs
its real loops as tasks: the scheduler's (``Scheduler.loop``), the lease tick
(``LeaseLoop.loop``) and the heartbeats; a watchdog timer per machine ends runs whose
deadline passed.

Time is discrete-event: :meth:`Sim.run_until` lets every task run until all of them wait on
simulated time (or on the network), checks the invariants, then moves true time to the next
timer. No real time is waited for, except work already handed to a thread. A run is
reproducible from its seed (the job ids, latencies, losses, faults and workload all come
from seeded random sources; work handed to threads runs one piece at a time, in order,
and is answered before time moves, see :meth:`Sim.quiet`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import string
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulayerd import daemon
from gpulayerd.config import DaemonConfig
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, DeviceModel, EnvironmentModel, FrameworkModel, SubmitRequest
from gpulayerd.net.identity import Identity
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.runner import RunHandle
from gpulayerd.store import Store
from tests.fakes.runner import FakeRunner

from .clock import NodeClock, SimTime
from .invariants import Checker, Violation
from .network import SimNetwork, SimNode, spawn
from .store import MemoryDisk

__all__ = ["Sim", "SimDaemon", "SimRunner", "node_ids"]

_B32 = string.ascii_lowercase + "234567"

FREEZE_EVERY_S = 10.0
"""Seconds of true time between two collections of the heap (:meth:`Sim._freeze_heap`)."""


def node_ids(n: int, rng: random.Random) -> list[str]:
    """``n`` distinct node ids (52 base32 characters, as SHA-256 ones look), seeded."""
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(_B32) for _ in range(52)))
    return sorted(out)


def gpu_caps(node_id: str, name: str, gpus: int, taken_at: float) -> Capabilities:
    """A Linux workstation with ``gpus`` CUDA GPUs (24 GB) and one Python with torch."""
    env = EnvironmentModel(interpreter=sys.executable, python_version="3.11.9",
                           frameworks={"torch": FrameworkModel(version="2.4.0", distribution="torch")},
                           torch_cuda=False, torch_mps=False, distributed_backends=["gloo"])
    devices = [DeviceModel(accelerator="cuda", index=i, uuid=f"GPU-{name}-{i}", name="RTX 4090",
                           memory_total_bytes=24 * 10**9, execution_supported=True) for i in range(gpus)]
    return Capabilities(node_id=node_id, hostname=name, platform="linux", machine="x86_64", cpu_count=16,
                        memory_total_bytes=64 * 2**30, environments=[env], devices=devices, taken_at=taken_at)


class SimRunner(FakeRunner):
    """One machine's runs (:class:`FakeRunner`), reporting each start to the simulation."""

    def __init__(self, runs_dir: Path, clock: NodeClock, node: str, on_start: Callable[[str, str, int, str], None]) -> None:
        super().__init__(runs_dir, clock)  # type: ignore[arg-type]  # NodeClock reads like FakeClock
        self.node = node
        self._on_start = on_start

    def start(self, job_id: str, attempt: int, argv: Sequence[str], env: Mapping[str, str],
              cwd: str | Path | None = None, deadline_monotonic: float | None = None,
              lock_fds: Sequence[int] = (), user: JobUser | None = None,
              renew_s: float | None = None, time_limit: tuple[float, str, float] | None = None,
              preflight: object = None) -> RunHandle:
        """Start as :meth:`FakeRunner.start`, then tell the simulation (its invariants, its workload)."""
        handle = super().start(job_id, attempt, argv, env, cwd, deadline_monotonic, lock_fds, user, renew_s,
                               time_limit)
        self._on_start(self.node, job_id, attempt, env.get("CUDA_VISIBLE_DEVICES", ""))
        return handle

    def live(self) -> list[tuple[str, int, str]]:
        """(job id, attempt, CUDA_VISIBLE_DEVICES) of every run running now."""
        with self._lock:
            return [(k[0], k[1], r.env.get("CUDA_VISIBLE_DEVICES", "")) for k, r in self._runs.items()
                    if r.status.running]


@dataclass
class SimDaemon:
    """One simulated machine: its daemon (rebuilt on restart) and what outlives the daemon."""

    name: str
    node_id: str
    config: DaemonConfig
    clock: NodeClock
    runner: SimRunner
    gpus: int
    services: daemon.Services | None = None
    node: SimNode | None = None
    store: Store | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        """Whether its daemon runs (it may be paused)."""
        return self.services is not None


@dataclass
class Job:
    """A job the simulation submitted and its owner acknowledged."""

    id: str
    owner: str  # node name
    gpus: int
    duration_s: float
    submitted: float  # true time
    started: float | None = None  # true time of its first start
    starts: int = 0


class Sim:
    """A simulated department (see the module docstring).

    Args:
        root: a fresh directory (state dirs; nothing large is written: stores are in memory).
        seed: the seed of everything random.
        n: the number of machines. gpus: GPUs per machine.
        latency_s: median one-way network latency (seconds).
        skew_ppm: each machine's clock rate is 1 + u * skew_ppm / 1e6, u uniform in [-1, 1].
        charge_cpu: charge each handler its CPU time in simulated time (:class:`SimNetwork`; a run
            so charged is not reproduced exactly by its seed).
        settings: :class:`DaemonConfig` fields for every daemon (else the daemon's defaults).
    """

    def __init__(self, root: Path, *, seed: int, n: int, gpus: int = 2, latency_s: float = 0.001,
                 skew_ppm: float = 0.0, charge_cpu: bool = False, **settings: Any) -> None:
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.time = SimTime()
        self.net = SimNetwork(self.time, random.Random(f"{seed}-net"), latency_s=latency_s, charge_cpu=charge_cpu)
        self.disk = MemoryDisk(f"{seed}-{id(self):x}")
        self.workdir = root / "work"
        self.settings = settings
        self.daemons: dict[str, SimDaemon] = {}
        self.by_id: dict[str, SimDaemon] = {}
        self.jobs: dict[str, Job] = {}
        self.checker = Checker(self)
        self._n, self._gpus, self._skew_ppm = n, gpus, skew_ppm
        # Work handed to a thread, in the order it was handed: (the thread's future, the one its caller awaits).
        self._threads: list[tuple[asyncio.Future[Any], asyncio.Future[Any]]] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim")  # one: runs in that order
        self._stepping = False  # within run_until: quiet() hands the threads' results over
        self._plain: Callable[..., asyncio.Future[Any]] | None = None  # the loop's own run_in_executor
        self.steps = 0
        self._frozen_at = -1.0  # true time of the last heap freeze (see _freeze_heap)
        self._pool_threads = 1  # threads alive but for path checks (this one, pools' workers): a cheap test
        self._gc_threshold: tuple[int, int, int] | None = None  # the collector's own, while ours is set
        self.trace: list[str] = []  # the last events, for a violation's report

    # ------------------------------------------------------------------ building

    async def start(self) -> None:
        """Build and start every daemon; announce each to all (mDNS)."""
        loop = asyncio.get_running_loop()
        self.checker.bind()
        plain = self._plain = type(loop).run_in_executor.__get__(loop)  # not an earlier Sim's (same loop)

        def counted(executor: Any, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
            inner = plain(self._pool, fn, *args)
            if not self._stepping:  # outside run_until (building, a test's own await): as it comes
                return inner
            outer = loop.create_future()
            self._threads.append((inner, outer))
            return outer

        loop.run_in_executor = counted  # type: ignore[method-assign]  # to know when threads are busy
        selector = loop._selector  # type: ignore[attr-defined]
        polled = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            # A turn with callbacks ready polls the file descriptors first (a system call per turn,
            # several per step). Nothing here waits on a socket; a thread's answer is already among
            # the callbacks (call_soon_threadsafe), its wake-up byte is read at the next blocking poll.
            return [] if timeout == 0 else polled(timeout)

        selector.select = select
        await asyncio.to_thread(self.workdir.mkdir, parents=True, exist_ok=True)
        ids = node_ids(self._n, random.Random(f"{self.seed}-ids"))
        for i, node_id in enumerate(ids):
            name = f"n{i:03d}"
            rate = 1.0 + self.rng.uniform(-1, 1) * self._skew_ppm / 1e6
            clock = NodeClock(self.time, rate=rate, mono0=1000.0 + self.rng.uniform(0, 1e5),
                              wall0=1_800_000_000.0 + self.rng.uniform(-0.05, 0.05))
            base = self.root / name
            config = DaemonConfig(state_dir=base / "state", device_lock_dir=base / "locks", cpu_slots=8,
                                  interpreters=[sys.executable], mdns=False, **self.settings)
            await asyncio.to_thread(_mkdirs, [config.runs_dir, config.device_lock_dir])
            runner = SimRunner(config.runs_dir, clock, name, self._started)
            d = SimDaemon(name=name, node_id=node_id, config=config, clock=clock, runner=runner, gpus=self._gpus)
            self.daemons[name] = d
            self.by_id[node_id] = d
            await self._boot(d)
        self._announce_all()
        self._freeze_heap()
        for d in self.daemons.values():
            self._watchdog(d)

    async def _boot(self, d: SimDaemon) -> None:
        store = await Store.open(d.config.db_path, connect=self.disk.connect)  # type: ignore[arg-type]
        identity = Identity(node_id=d.node_id, state_dir=d.config.state_dir,
                            key_path=d.config.state_dir / "identity" / "node.key")
        made: list[SimNode] = []

        def peers(parts: daemon.PeerParts) -> SimNode:
            made.append(SimNode(self.net, d.node_id, d.name, clock=d.clock, router=parts.router,
                                machine=parts.machine, usage=parts.usage, signals=parts.signals,
                                heartbeat_interval_s=d.config.heartbeat_interval_s,
                                suspect_after_s=d.config.suspect_after_s, down_after_s=d.config.down_after_s))
            return made[-1]

        services = daemon.build(d.config, identity, store, SUPPORT_MATRIX, clock=d.clock,
                                rng=random.Random(f"{self.seed}-{d.name}-{self.time.now}"), runner=d.runner,
                                capabilities=gpu_caps(d.node_id, d.name, d.gpus, d.clock.wall()), peers=peers,
                                hostname=d.name)
        node = made[0]
        node.mode, node.user = services.machine.accounts.mode, services.machine.accounts.user
        self.net.nodes[d.node_id] = node
        await services.recovery.recover()
        await services.gangs.recover()
        if services.usage is not None:
            await services.usage.load()
        d.services, d.node, d.store = services, node, store
        d.tasks = [spawn(services.scheduler.loop(), f"{d.name}-schedule"),
                   spawn(services.leases.loop(), f"{d.name}-lease"),
                   spawn(node.heartbeat_loop(), f"{d.name}-heartbeat")]

    def _announce_all(self) -> None:
        nodes = [d.node for d in self.daemons.values() if d.node is not None]
        for n in nodes:
            n.announce([o for o in nodes if o is not n])

    def _watchdog(self, d: SimDaemon) -> None:
        """Every second of its clock: the machine's watchdogs end the runs whose deadline passed."""
        def tick() -> None:
            d.runner.check_deadlines()
            self.time.call_at(self.time.now + 1.0, tick)

        self.time.call_at(self.time.now + 1.0, tick)

    # ------------------------------------------------------------------ faults

    async def crash(self, d: SimDaemon, *, host: bool = False) -> None:
        """Its daemon dies (``kill -9``); with ``host``, its runs die too."""
        if d.services is None:
            return
        self.note(f"crash {d.name}{' (host)' if host else ''}")
        if host:
            d.runner.crash()
        d.clock.resume()
        self.net.crash(d.node_id)
        for t in d.tasks:
            t.cancel()
        services, store = d.services, d.store
        d.services = d.node = d.store = None
        await asyncio.gather(*d.tasks, return_exceptions=True)
        await services.signals.close()
        await services.worker.close()
        services.machine.close()
        assert store is not None
        await store.close()

    async def restart(self, d: SimDaemon) -> None:
        """Its daemon starts again on the same state (recovery runs) and is announced to all."""
        await self.crash(d)
        self.note(f"restart {d.name}")
        await self._boot(d)
        assert d.node is not None
        others = [o.node for o in self.daemons.values() if o.node is not None and o is not d]
        d.node.announce(others)
        for o in others:
            o.announce([d.node])

    def pause(self, d: SimDaemon) -> None:
        """SIGSTOP."""
        self.note(f"pause {d.name}")
        d.clock.pause()

    def resume(self, d: SimDaemon) -> None:
        """SIGCONT."""
        self.note(f"resume {d.name}")
        d.clock.resume()

    # ------------------------------------------------------------------ jobs

    async def submit(self, d: SimDaemon, *, gpus: int, duration_s: float, user: str = "sim") -> str | None:
        """Submit a ``gpus``-GPU job on ``d`` (that runs ``duration_s``); its id once acknowledged."""
        if d.services is None or d.clock.paused:
            return None
        spec: dict[str, Any] = {"command": ["python", "train.py"], "workdir": str(self.workdir),
                                "requirements": {"accelerator": "cuda", "gpu_count": gpus},
                                "policy": {"retries": 3, "lease_s": 60.0}}
        view = await d.services.owner.submit(SubmitRequest(spec=spec, submitted_by=user))
        assert view.id not in self.jobs, f"job id {view.id} acknowledged twice"
        self.note(f"submit {view.id} on {d.name} ({gpus} GPU)")
        self.jobs[view.id] = Job(view.id, d.name, gpus, duration_s, self.time.now)
        return view.id

    def _started(self, node: str, job_id: str, attempt: int, devices: str) -> None:
        """A run started (called by a :class:`SimRunner`, maybe in a thread: handed to the loop)."""
        self._loop.call_soon_threadsafe(self._on_start, node, job_id, attempt, devices)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.checker.loop is not None, "Sim.start binds the loop"
        return self.checker.loop

    def _on_start(self, node: str, job_id: str, attempt: int, devices: str) -> None:
        self.note(f"start {job_id}/{attempt} on {node} gpus {devices}")
        with contextlib.suppress(Violation):  # kept by the checker: run_until raises it
            self.checker.started(node, job_id, attempt, devices)
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.starts += 1
        if job.started is None:
            job.started = self.time.now
        d = self.daemons[node]

        def finish() -> None:
            run = d.runner.get(job_id, attempt)
            if run is not None and run.status.running:
                d.runner.exit(job_id, attempt, 0)

        self.time.call_at(self.time.now + job.duration_s, finish)

    # ------------------------------------------------------------------ time

    async def quiet(self) -> None:
        """Let every task run until all wait on simulated time, the network or nothing.

        Work handed to threads runs one piece at a time, in the order it was handed over, and
        its results reach their callers only once every task waits (in that order too): where
        the loop stood when a thread ended never shows in the run.
        """
        loop = asyncio.get_running_loop()
        if not loop._ready and not self._threads and threading.active_count() <= self._pool_threads:  # type: ignore[attr-defined]
            return  # nothing woke (a message whose handler never waits): no turn of the loop needed
        while True:
            for _ in range(10_000):
                await asyncio.sleep(0)
                if not loop._ready:  # type: ignore[attr-defined]  # CPython: the callbacks ready to run
                    break
            if self._threads and not loop._ready:  # type: ignore[attr-defined]
                handed, self._threads = self._threads, []
                await asyncio.wait([inner for inner, _ in handed])
                for inner, outer in handed:
                    if outer.done():  # its caller was cancelled
                        continue
                    if inner.cancelled():
                        outer.cancel()
                    elif inner.exception() is not None:
                        outer.set_exception(inner.exception())  # type: ignore[arg-type]
                    else:
                        outer.set_result(inner.result())
                continue
            checking = []
            if threading.active_count() > self._pool_threads:
                checking = [t for t in threading.enumerate() if t.name == "path-check"]
                if not checking:  # a pool's new worker
                    self._pool_threads = threading.active_count()
            if checking and not loop._ready:  # type: ignore[attr-defined]
                # Machine.paths checks a directory in a thread of its own: answered before time moves
                # (a local directory answers at once), one thread after another, in the order they started
                assert self._plain is not None
                for t in checking:
                    await self._plain(None, t.join)
                self._pool_threads = threading.active_count()  # the threads of the loop's own pool included
                continue
            if not self._threads and not loop._ready:  # type: ignore[attr-defined]
                return

    async def run_until(self, t_end: float) -> None:
        """Step until true time ``t_end``: quiet, check the invariants, fire the next timers.

        Raises:
            Violation: an invariant broke (the message names the seed and the last events).
        """
        self._stepping = True
        try:
            while True:
                await self.quiet()
                if self.checker.violation is not None:
                    raise self.checker.violation
                self.checker.step()
                due = self.time.next_due()
                if due is None or due > t_end:
                    self.time.advance_to(t_end)
                    await self.quiet()
                    return
                self.time.advance_to(due)
                self.steps += 1
                if due - self._frozen_at >= FREEZE_EVERY_S:
                    self._freeze_heap()
        finally:
            self._stepping = False

    async def run_for(self, seconds: float) -> None:
        """Step for ``seconds`` of true time."""
        await self.run_until(self.time.now + seconds)

    def note(self, what: str) -> None:
        """Keep ``what`` in the trace (the last 200 events)."""
        self.trace.append(f"t={self.time.now:9.3f} {what}")
        if len(self.trace) > 400:
            del self.trace[:200]

    def _freeze_heap(self) -> None:
        """Collect the objects made since the last call, then leave those still alive out of the
        garbage collector's later passes.

        N daemons in one process make a heap N times a daemon's, and CPython's full collections
        (one whenever the heap grew by a quarter) walked all of it: at N=100 they took half the
        simulator's time. So while a simulation runs there are none but these (the young
        generations are collected as usual): each walks only what was made since the last one.
        What is frozen is mostly the daemons' long-lived state; what dies later is freed by its
        reference count (a cycle among objects frozen here waits for :meth:`close`).
        """
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            gc.set_threshold(self._gc_threshold[0], self._gc_threshold[1], 1 << 30)  # no full collection but ours
        gc.collect()
        gc.freeze()
        self._frozen_at = self.time.now

    async def close(self) -> None:
        """Stop every daemon and forget the stores."""
        for d in self.daemons.values():
            await self.crash(d)
        self.net.close()
        self.disk.close()
        self._pool.shutdown(wait=True)
        with contextlib.suppress(AttributeError):
            del self._loop.run_in_executor  # type: ignore[method-assign]  # the loop's own again
        with contextlib.suppress(AttributeError):
            del self._loop._selector.select  # type: ignore[attr-defined]  # the selector's own again
        gc.unfreeze()
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None


def _mkdirs(paths: list[Path]) -> None:
    for p in paths:
        p.mkdir(parents=True, exist_ok=True)
