"""This machine as a worker: probing, capabilities, and the snapshot the matcher sees.

The snapshot is the probed capabilities with what is handed out now: device grants
(from the store), gang holds and running attempts (from the :class:`Ledger`), devices
locked by another gpulayerd on this machine, and processes on a GPU that are not ours
(fresh from ``nvidia-smi --query-compute-apps``).

Paths (job workdirs) are checked off the event loop, in a small thread pool, with a
time limit: a hung network mount makes a workdir "did not answer within N s", never
a frozen daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpulayerd.app.clock import Clock
from gpulayerd.app.ledger import Ledger, process_trees
from gpulayerd.app.signals import Signals
from gpulayerd.capabilities import build_capabilities
from gpulayerd.config import DaemonConfig
from gpulayerd.core.types import Accelerator, EnvironmentSnapshot, ProbeStatus, SupportMatrix, WorkerSnapshot
from gpulayerd.gpu.command import run_command
from gpulayerd.gpu.discovery import DiscoveryConfig, discover_host
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.nvidia import NvidiaSmi, query_compute_apps
from gpulayerd.models import Capabilities, DeviceModel
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.store import Store

__all__ = ["ANOTHER_DAEMON", "Machine", "PathChecker"]

ANOTHER_DAEMON = "(another gpulayerd on this machine)"


class PathChecker:
    """``os.path.isdir`` with a time limit, off the event loop.

    Each distinct path is checked in a thread of its own, so a path on a hung mount never
    delays the check of another. A check that does not answer within ``timeout_s`` is
    reported as unanswered; it keeps running, and a later check of the same path joins it
    instead of starting another. At most ``max_pending`` checks run at once: past that a
    new path is answered "unanswered" at once (the hung ones are what fills it up).
    """

    def __init__(self, clock: Clock, timeout_s: float, max_pending: int = 64) -> None:
        self._clock = clock
        self.timeout_s = timeout_s
        self._max_pending = max_pending
        self._pending: dict[str, tuple[asyncio.Future[bool], float]] = {}
        self._closed = False

    async def is_dir(self, path: str) -> bool | None:
        """True/False as ``os.path.isdir``; None if the file system did not answer in time."""
        now = self._clock.monotonic()
        pending = self._pending.get(path)
        if pending is None:
            if self._closed or len(self._pending) >= self._max_pending:
                return None
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[bool] = loop.create_future()
            self._pending[path] = (fut, now)
            fut.add_done_callback(functools.partial(self._forget, path))
            threading.Thread(target=_check_dir, args=(loop, fut, path), name="path-check", daemon=True).start()
        else:
            fut, since = pending
            if now - since >= self.timeout_s:
                return None  # already known not to answer: do not wait again
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except asyncio.TimeoutError:
            return None

    def _forget(self, path: str, fut: asyncio.Future[bool]) -> None:
        if self._pending.get(path, (None, 0.0))[0] is fut:
            del self._pending[path]

    async def with_paths(self, worker: WorkerSnapshot, paths: Iterable[str | None]) -> WorkerSnapshot:
        """``worker`` with ``existing_paths``/``unanswered_paths`` filled in for ``paths``."""
        wanted = sorted({p for p in paths if p})
        if not wanted:
            return worker
        answers = await asyncio.gather(*(self.is_dir(p) for p in wanted))
        return replace(worker, existing_paths=frozenset(p for p, ok in zip(wanted, answers, strict=True) if ok),
                       unanswered_paths=frozenset(p for p, ok in zip(wanted, answers, strict=True) if ok is None),
                       path_timeout_s=self.timeout_s)

    def close(self) -> None:
        """Stop taking checks (threads stuck on a hung mount are left to end on their own)."""
        self._closed = True


def _check_dir(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[bool], path: str) -> None:
    """In a thread: ``os.path.isdir(path)``, handed to ``fut`` on ``loop`` (if it still runs)."""
    result = os.path.isdir(path)

    def deliver() -> None:
        if not fut.done():
            fut.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(deliver)


class Machine:
    """Probes this machine and answers "what is free here now"."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, ledger: Ledger, locks: DeviceLocks,
                 prober: EnvironmentProber, discovery: DiscoveryConfig, nvidia: NvidiaSmi, support: SupportMatrix,
                 signals: Signals, clock: Clock) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._ledger = ledger
        self._locks = locks
        self._prober = prober
        self._discovery = discovery
        self._nvidia = nvidia
        self._support = support
        self._signals = signals
        self._clock = clock
        self._caps: Capabilities | None = None
        self._ready = asyncio.Event()
        self.paths = PathChecker(clock, config.workdir_timeout_s)

    async def wait_ready(self) -> None:
        """Wait for the first probe."""
        await self._ready.wait()

    async def probe_loop(self) -> None:
        """Probe hardware and environments now and every ``probe_interval_s``."""
        while True:
            await self.probe_once()
            await self._clock.sleep(self._config.probe_interval_s)

    async def probe_once(self) -> None:
        """Probe devices (in a thread) and every configured interpreter; publish a change if any."""
        inventory = await asyncio.to_thread(discover_host, self._discovery, self._support, nvidia=self._nvidia)
        envs: list[EnvironmentSnapshot] = []
        for interp in self._config.interpreters:
            envs.append(await self._prober.async_probe(interp))
        caps = build_capabilities(inventory, envs, self.node_id, self._clock.wall())
        changed = self._caps is None or _hardware_key(self._caps) != _hardware_key(caps)
        self._caps = caps
        self._ready.set()
        if changed:
            self._signals.devices_changed()
            self._signals.wake()

    def use_capabilities(self, caps: Capabilities) -> None:
        """Take ``caps`` as this machine's probed capabilities (for a machine that is not probed,
        e.g. one made up by a test); :meth:`probe_loop` would replace them."""
        self._caps = caps
        self._ready.set()
        self._signals.devices_changed()
        self._signals.wake()

    async def snapshot(self, refresh_apps: bool, workdirs: Iterable[str | None] = ()) -> WorkerSnapshot:
        """This machine as the matcher sees it now (after the first probe).

        Args:
            refresh_apps: ask nvidia-smi for the processes on each GPU now.
            workdirs: paths to check (see :class:`PathChecker`).
        """
        await self._ready.wait()
        assert self._caps is not None
        worker = self._caps.to_core()
        grants = {g.device_uuid: g.job_id for g in await self._store.runs.grants()}
        held = self._ledger.held_devices()
        ours = await asyncio.to_thread(process_trees, self._ledger.watchdog_pids())
        apps = await self._compute_apps(worker) if refresh_apps else None
        unclaimed = [d.uuid for d in worker.devices
                     if d.uuid and d.execution_supported and d.uuid not in grants and d.uuid not in held]
        elsewhere = await self._locks.async_locked_elsewhere(unclaimed) if unclaimed else set()
        devices = []
        for dev in worker.devices:
            d = dev
            if apps is not None and d.accelerator is Accelerator.CUDA:
                d = replace(d, foreign_pids=apps.get(d.uuid or "", ()))
            granted_to = grants.get(d.uuid or "") or held.get(d.uuid or "")
            if granted_to is None and d.uuid in elsewhere:
                granted_to = ANOTHER_DAEMON
            foreign = tuple(p for p in d.foreign_pids if p not in ours)
            devices.append(replace(d, granted_to=granted_to, foreign_pids=foreign))
        total = self._config.effective_cpu_slots
        free = max(0, total - self._ledger.cpu_slots_used())
        snap = replace(worker, devices=tuple(devices), cpu_slots_free=free, cpu_slots_total=total)
        return await self.paths.with_paths(snap, workdirs)

    async def capabilities(self) -> Capabilities:
        """This machine's capabilities with the current grant state of each device."""
        worker = await self.snapshot(refresh_apps=False)
        assert self._caps is not None
        caps = self._caps.model_copy()
        caps.devices = [DeviceModel.from_core(d) for d in worker.devices]
        caps.cpu_slots_total = worker.cpu_slots_total
        caps.cpu_slots_free = worker.cpu_slots_free
        return caps

    async def _compute_apps(self, worker: WorkerSnapshot) -> Mapping[str, tuple[int, ...]] | None:
        """Fresh ``--query-compute-apps`` (processes come and go faster than the probe interval)."""
        if not any(d.accelerator is Accelerator.CUDA for d in worker.devices):
            return None
        health = next((h for h in worker.health if h.source == "nvidia-smi"), None)
        if health is None or health.status is not ProbeStatus.OK or health.path is None:
            return None
        apps = await asyncio.to_thread(query_compute_apps, health.path, run_command,
                                       self._config.nvidia_smi_timeout_s)
        return apps.pids_by_uuid

    def gpu_counts(self) -> tuple[int | None, int | None]:
        """(schedulable GPUs, free ones) for the mDNS TXT record; (None, None) before the first probe."""
        if self._caps is None:
            return None, None
        devs = [d for d in self._caps.devices if d.execution_supported]
        return len(devs), max(0, len(devs) - self._ledger.gpu_runs()) if devs else 0

    def caps_digest(self) -> str:
        """Changes whenever what peers see of us (devices, grants, CPU slots) changes."""
        if self._caps is None:
            return ""
        runs = self._ledger.keys()
        return hashlib.sha256(repr((_hardware_key(self._caps), runs)).encode()).hexdigest()[:16]

    def close(self) -> None:
        """Release the path-check threads."""
        self.paths.close()


def _hardware_key(caps: Capabilities) -> tuple[object, ...]:
    return (
        tuple((d.uuid, d.index, d.memory_total_bytes, d.compute_capability, d.execution_supported,
               tuple(d.foreign_pids)) for d in caps.devices),
        tuple((h.source, h.status) for h in caps.health),
        tuple((e.interpreter, e.ok, tuple(sorted(e.frameworks))) for e in caps.environments),
    )
