"""Live device metrics, sampled only while someone watches (``GET /v1/metrics``).

:class:`MetricsService` runs one long-lived ``nvidia-smi --query-gpu=... -lms N`` process
(:class:`gpulayerd.gpu.metrics.NvidiaSampler`) while a watcher holds a lease: each
:meth:`MetricsService.view` (the TUI polls it about every second while its Devices view is
shown) renews the lease for ``grace_s`` seconds; when no view was asked for that long the
process is killed. With no watcher, no nvidia-smi metrics process runs. Beside it, while
sampling, ``--query-compute-apps`` runs every ``apps_every_s`` seconds and each process is
named: a gpulayer job (by name and user) or a foreign pid with its account.

:meth:`MetricsService.latest` gives the newest sample per GPU to whoever else wants it
(e.g. a re-probe), without starting anything.


(Same name as :mod:`gpulayerd.gpu.metrics` (reading the samples) and :mod:`gpulayerd.models.metrics`
(their wire shape): one idea at three layers; this is the service.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger, process_trees
from gpulayerd.core.types import ProbeStatus
from gpulayerd.gpu.metrics import ComputeApp, GpuSample, NvidiaSampler, async_compute_apps, pid_user
from gpulayerd.models import Capabilities
from gpulayerd.models.metrics import GpuMetricsView, GpuProcessView, MetricsView
from gpulayerd.models.stored import spec_name, spec_user
from gpulayerd.store import Store

__all__ = ["JobLabel", "JobSource", "MetricsService", "StoreJobs", "nvidia_path"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class JobLabel:
    """A gpulayer job as people know it: ``name`` (None: unnamed) and ``user``."""

    job_id: str
    name: str | None = None
    user: str | None = None


class JobSource(Protocol):
    """The jobs on this machine's devices, for naming what runs on each GPU."""

    async def grants(self) -> dict[str, JobLabel]:
        """Device uuid -> the job that holds it (granted or held for a gang)."""
        ...

    async def run_pids(self) -> dict[int, JobLabel]:
        """Pid -> job, for every process of every attempt running here (watchdog trees)."""
        ...


class StoreJobs:
    """:class:`JobSource` over the store's grants and runs and the ledger's watchdogs."""

    def __init__(self, store: Store, ledger: Ledger) -> None:
        """Read grants and run specs from ``store``, running attempts from ``ledger``."""
        self._store = store
        self._ledger = ledger

    async def _labels(self) -> dict[str, JobLabel]:
        labels: dict[str, JobLabel] = {}
        for run in await self._store.runs.remote_runs(active=True):
            labels[run.job_id] = JobLabel(run.job_id, spec_name(run.spec_json), spec_user(run.spec_json) or None)
        # jobs owned here run without a remote_runs row: their own row names them
        for _, entry in self._ledger.runs():
            job_id = entry.handle.job_id
            if job_id not in labels:
                row = await self._store.jobs.get_job(job_id)
                if row is not None:
                    labels[job_id] = JobLabel(job_id, row.name, row.submitted_by)
        return labels

    async def grants(self) -> dict[str, JobLabel]:
        """Device uuid -> job, from the grants table and gang holds, named from the runs' specs."""
        labels = await self._labels()
        out: dict[str, JobLabel] = {}
        for uuid, held in self._ledger.held_devices().items():
            job_id = held.removesuffix(" (held)")
            out[uuid] = labels.get(job_id, JobLabel(job_id))
        for g in await self._store.runs.grants():
            out[g.device_uuid] = labels.get(g.job_id, JobLabel(g.job_id))
        return out

    async def run_pids(self) -> dict[int, JobLabel]:
        """Every process under each running attempt's watchdog (reads /proc in a thread)."""
        labels = await self._labels()
        runs = [(key[0], entry.handle.watchdog_pid) for key, entry in self._ledger.runs()]
        trees = await asyncio.to_thread(lambda: [(job, process_trees([pid])) for job, pid in runs])
        return {pid: labels.get(job, JobLabel(job)) for job, pids in trees for pid in pids}


def nvidia_path(caps: Capabilities) -> str | None:
    """The nvidia-smi that last probed fine on this machine, or None (no NVIDIA GPU, or a broken tool).

    A degraded probe (some GPUs answered, a lost one did not) counts as fine: the sampler reads
    the GPUs that answer, and the lost one's diagnostic line is skipped.
    """
    health = next((h for h in caps.health if h.source == "nvidia-smi"), None)
    if health is None or health.status not in (ProbeStatus.OK, ProbeStatus.DEGRADED) or not health.path:
        return None
    return health.path


class MetricsService:
    """Samples this machine's GPUs while someone watches; see the module docstring.

    Args:
        clock: time for the watch lease and the compute-apps period.
        locate: the nvidia-smi to run, or None when there is none that works (asked at each start).
        jobs: names the processes and grants.
        interval_ms: milliseconds between samples (nvidia-smi's ``-lms``).
        grace_s: seconds a watch lasts after the last :meth:`view`.
        apps_every_s: seconds between ``--query-compute-apps`` calls while sampling.
        history: utilisation samples kept per GPU (the sparkline).
        retry_s: after nvidia-smi failed or exited by itself, seconds before it is started again.
        user_of: pid -> account (reads /proc; default :func:`gpulayerd.gpu.metrics.pid_user`).
        sampler: makes the sampler for a path and interval (default :class:`NvidiaSampler`).
    """

    def __init__(self, *, clock: Clock, locate: Callable[[], Awaitable[str | None]], jobs: JobSource,
                 interval_ms: int = 1000, grace_s: float = 5.0, apps_every_s: float = 2.0, history: int = 30,
                 apps_timeout_s: float = 10.0, retry_s: float = 60.0,
                 user_of: Callable[[int], str | None] = pid_user,
                 sampler: Callable[[str, int], NvidiaSampler] = NvidiaSampler) -> None:
        self._clock = clock
        self._locate = locate
        self._jobs = jobs
        self._interval_ms = interval_ms
        self._grace_s = grace_s
        self._apps_every_s = apps_every_s
        self._history = history
        self._apps_timeout_s = apps_timeout_s
        self._retry_s = retry_s
        self._user_of = user_of
        self._make_sampler = sampler
        self._watched_at = float("-inf")
        self._retry_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._sampler: NvidiaSampler | None = None
        self._latest: dict[int, GpuSample] = {}
        self._taken_at: float | None = None
        self._util: dict[int, deque[float | None]] = {}
        self._procs: dict[str, list[GpuProcessView]] = {}
        self._grants: dict[str, JobLabel] = {}
        self._message = ""
        self.starts = 0
        """How many sampler processes were started (for tests)."""

    # ------------------------------------------------------------------ public

    @property
    def sampling(self) -> bool:
        """A sampler task runs now."""
        return self._task is not None and not self._task.done()

    @property
    def sampler_pid(self) -> int | None:
        """The nvidia-smi sampler's pid while it runs."""
        return None if self._sampler is None else self._sampler.pid

    def latest(self) -> Mapping[int, GpuSample]:
        """The newest sample of each GPU by index (empty before any sampling); starts nothing."""
        return dict(self._latest)

    async def view(self) -> MetricsView:
        """This machine's GPUs now; renews the watch lease and starts the sampler if it is not running."""
        self.watch()
        gpus = []
        for index, s in sorted(self._latest.items()):
            grant = self._grants.get(s.uuid or "")
            gpus.append(GpuMetricsView(
                index=index, uuid=s.uuid, utilization_pct=s.utilization_pct, temperature_c=s.temperature_c,
                power_draw_w=s.power_draw_w, power_limit_w=s.power_limit_w, memory_used_bytes=s.memory_used_bytes,
                memory_total_bytes=s.memory_total_bytes, utilization_history=list(self._util.get(index, ())),
                processes=list(self._procs.get(s.uuid or "", ())),
                granted_to=None if grant is None else grant.job_id,
                granted_name=None if grant is None else grant.name,
                granted_user=None if grant is None else grant.user))
        return MetricsView(available=not self._message, sampling=self.sampling, message=self._message,
                           taken_at=self._taken_at, interval_s=self._interval_ms / 1000, gpus=gpus)

    def watch(self) -> None:
        """Someone watches: keep sampling for ``grace_s`` more seconds (start it if needed)."""
        now = self._clock.monotonic()
        self._watched_at = now
        if self.sampling or now < self._retry_at:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpu-metrics")

    async def close(self) -> None:
        """Stop sampling now (daemon shutdown)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ----------------------------------------------------------------- private

    async def _run(self) -> None:
        path = await self._locate()
        if path is None:
            self._message = "no working nvidia-smi on this machine"
            self._retry_at = self._clock.monotonic() + self._retry_s
            return
        self._message = ""
        sampler = self._sampler = self._make_sampler(path, self._interval_ms)
        self.starts += 1
        helpers = [asyncio.create_task(self._expire(sampler)), asyncio.create_task(self._apps_loop(path))]
        got = False
        try:
            async for sample in sampler.samples():
                got = True
                self._put(sample)
        except OSError as e:
            self._message = f"cannot run {path}: {e}"
        finally:
            for t in helpers:
                t.cancel()
            for t in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await sampler.stop()
            self._sampler = None
        if self._clock.monotonic() - self._watched_at <= self._grace_s:  # it ended by itself while watched
            if not got and not self._message:
                self._message = f"{path} printed no GPU sample"
            self._retry_at = self._clock.monotonic() + self._retry_s
            log.info("gpu metrics: %s ended by itself; next try in %g s", path, self._retry_s)

    async def _expire(self, sampler: NvidiaSampler) -> None:
        """Stop ``sampler`` once nobody watched for ``grace_s`` seconds."""
        step = max(0.1, min(1.0, self._grace_s / 2))
        while self._clock.monotonic() - self._watched_at <= self._grace_s:
            await self._clock.sleep(step)
        await sampler.stop()

    async def _apps_loop(self, path: str) -> None:
        while True:
            try:
                await self._refresh_apps(path)
            except Exception:  # naming processes is best effort; the samples go on
                log.exception("gpu metrics: listing compute processes failed")
            await self._clock.sleep(self._apps_every_s)

    async def _refresh_apps(self, path: str) -> None:
        apps = await async_compute_apps(path, self._apps_timeout_s)
        self._grants = await self._jobs.grants()
        if apps is None:
            return
        ours = await self._jobs.run_pids()
        users = await asyncio.to_thread(lambda: {a.pid: self._user_of(a.pid) for a in apps})
        self._procs = _processes(apps, ours, users)

    def _put(self, sample: GpuSample) -> None:
        self._latest[sample.index] = sample
        self._taken_at = self._clock.wall()
        hist = self._util.get(sample.index)
        if hist is None:
            hist = self._util[sample.index] = deque(maxlen=self._history)
        hist.append(sample.utilization_pct)


def _processes(apps: tuple[ComputeApp, ...], ours: Mapping[int, JobLabel],
               users: Mapping[int, str | None]) -> dict[str, list[GpuProcessView]]:
    out: dict[str, list[GpuProcessView]] = {}
    for a in apps:
        job = ours.get(a.pid)
        out.setdefault(a.gpu_uuid, []).append(GpuProcessView(
            pid=a.pid, used_memory_bytes=a.used_memory_bytes, user=users.get(a.pid),
            job_id=None if job is None else job.job_id, job_name=None if job is None else job.name,
            job_user=None if job is None else job.user))
    for procs in out.values():
        procs.sort(key=lambda p: p.pid)
    return out
