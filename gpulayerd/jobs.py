"""The daemon's job service: submit, schedule, claim, run, watch, cancel, recover.

On one machine this daemon is both the owner of the jobs submitted to it and the
worker that runs them; both sides go through the pure claim state machine
(:mod:`gpulayerd.core.claims`), and the store applies its decisions with
compare-and-set, so the same code serves when owner and worker are different hosts.

A job's path: submit (validate; stored ``queued``, or ``rejected`` with reasons) ->
the scheduler matches queued jobs in submission order against this machine's fresh
snapshot (devices granted here or locked by another daemon on this machine, or busy
with foreign processes, are not free) -> claim (CAS in the store, with the device
grants, after taking the machine-wide device locks) -> the runner starts a watchdog
that starts the job -> a watch task waits for the exit and records it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import psutil
from pydantic import BaseModel

from gpulayerd.api.server import ApiError
from gpulayerd.capabilities import build_capabilities
from gpulayerd.config import DaemonConfig
from gpulayerd.core import claims
from gpulayerd.core.claims import JobRecord, JobStatus
from gpulayerd.core.matching import Explanation, Placement, evaluate, explain, job_signature, validate
from gpulayerd.core.types import (
    Accelerator,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    SupportMatrix,
    WorkerSnapshot,
)
from gpulayerd.devicelock import DeviceLocks
from gpulayerd.feed import Change, ChangeFeed
from gpulayerd.gpu.discovery import DiscoveryConfig, discover_host, run_command
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.nvidia import NvidiaSmi, query_compute_apps
from gpulayerd.models import (
    AttemptView,
    Capabilities,
    EventView,
    ExplanationModel,
    HealthView,
    JobList,
    JobSpec,
    JobView,
    LogChunk,
    PeerView,
    PlacementModel,
    SubmitRequest,
    job_spec_from_mapping,
)

if TYPE_CHECKING:
    from gpulayerd.cluster import ClusterNode
from gpulayerd.api.peer import PeerCallError
from gpulayerd.gang import Gang, GangRole, HeldResources
from gpulayerd.net.wire import (
    LogRequest,
    Offer,
)
from gpulayerd.remote import LOG_CHUNK_BYTES, RemoteRole, whole_chars
from gpulayerd.runner import RunHandle, Runner, RunnerError, RunStatus, build_argv, build_env
from gpulayerd.store import AmbiguousJobId, JobNotFound, JobRow, Store

__all__ = ["JobManager", "new_job_id"]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)

ANOTHER_DAEMON = "(another gpulayerd on this machine)"
_B32 = "0123456789abcdefghjkmnpqrstvwxyz"


def new_job_id(now_wall: float) -> str:
    """A 12-character id, sortable by submission time (Crockford base32, lower case)."""
    n = (int(now_wall * 1000) << 20) | secrets.randbits(20)
    chars = []
    for _ in range(12):
        chars.append(_B32[n & 31])
        n >>= 5
    return "".join(reversed(chars))


class JobManager(RemoteRole, GangRole):
    """Owner and worker in one: implements the local API and runs the daemon's loops."""

    def __init__(
        self,
        *,
        config: DaemonConfig,
        node_id: str,
        hostname: str,
        version: str,
        store: Store,
        runner: Runner,
        locks: DeviceLocks,
        prober: EnvironmentProber,
        discovery: DiscoveryConfig,
        nvidia: NvidiaSmi,
        support: SupportMatrix,
    ) -> None:
        self._config = config
        self.node_id = node_id
        self._hostname = hostname
        self._version = version
        self._store = store
        self._runner = runner
        self._locks = locks
        self._prober = prober
        self._discovery = discovery
        self._nvidia = nvidia
        self._support = support
        self._caps: Capabilities | None = None
        self._caps_ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._leases: dict[str, float] = {}
        self._runs: dict[tuple[str, int], RunHandle] = {}
        self._watchers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._specs: dict[str, JobSpec] = {}
        self._schedule_lock = asyncio.Lock()
        self.feed = ChangeFeed()
        self.cluster: ClusterNode | None = None
        self._remote: dict[tuple[str, int], str] = {}  # (job, attempt) we run for another owner -> owner
        self._offers: dict[tuple[str, str], tuple[Offer, float]] = {}  # (owner, job) -> offer, received
        self._offered: dict[str, tuple[str, float]] = {}  # our job -> (worker, when offered)
        self._tasks: set[asyncio.Task[None]] = set()
        self._leases_remote: dict[tuple[str, int], tuple[float, float]] = {}  # -> (deadline, lease_s)
        self._gangs: dict[str, Gang] = {}  # owner side: our multi-host jobs being run
        self._gang_busy: set[str] = set()  # owner side: jobs with a hold round in flight
        self._gang_backoff: dict[str, tuple[float, int]] = {}  # job -> (not before, failures)
        self._holds: dict[str, HeldResources] = {}  # worker side: hold id -> what it holds
        self._starting: dict[tuple[str, int], JobSpec] = {}  # claimed here, watchdog starting
        self.stats: Counter[str] = Counter()  # protocol counters, shown by /v1/health

    # ------------------------------------------------------------------ local API

    def health(self) -> HealthView:
        """Liveness and identity."""
        return HealthView(ok=True, version=self._version, node_id=self.node_id, hostname=self._hostname,
                          pid=os.getpid(), state_dir=str(self._config.state_dir), counters=dict(self.stats))

    async def async_capabilities(self) -> Capabilities:
        """This machine's capabilities with the current grant state of each device."""
        await self._caps_ready.wait()
        worker = await self._worker_snapshot(refresh_apps=False)
        assert self._caps is not None
        caps = self._caps.model_copy()
        from gpulayerd.models import DeviceModel

        caps.devices = [DeviceModel.from_core(d) for d in worker.devices]
        caps.cpu_slots_total = worker.cpu_slots_total
        caps.cpu_slots_free = worker.cpu_slots_free
        return caps

    async def async_peers(self) -> list[PeerView]:
        """Every gpulayerd known, this one first (only this one until the LAN is built)."""
        caps = await self.async_capabilities()
        me = PeerView(node_id=self.node_id, name=self._hostname, version=self._version, trusted=True,
                      state="self", last_heartbeat_at=time.time(), capabilities=caps)
        if self.cluster is None:
            return [me]
        me.addresses = list(self.cluster.addresses)
        me.port = self.cluster.port
        me.cluster = self.cluster.cluster_id
        return [me, *self.cluster.views()]

    async def async_submit(self, request: SubmitRequest) -> JobView:
        """Validate and store a job; wake the scheduler. Raises SpecError for a bad spec."""
        raw_workdir = request.spec.get("workdir")
        if not isinstance(raw_workdir, str) or not os.path.isabs(raw_workdir):
            # The daemon's own working directory means nothing to the submitter.
            raise ApiError(400, "invalid_spec", "job spec: workdir: must be an absolute path (the CLI resolves it)")
        spec = job_spec_from_mapping(request.spec, source="job spec")
        now = time.time()
        job_id = new_job_id(now)
        req = spec.to_core(job_id)
        rejections = validate(req, self._support)
        status = JobStatus.REJECTED if rejections else JobStatus.QUEUED
        if rejections:
            reason = "; ".join(r.message for r in rejections)
            explanation = ExplanationModel.from_core(explain(req, [], self._support))
        else:
            reason, explanation = "waiting for the scheduler", None
        row = JobRow(
            id=job_id, name=spec.name, submitted_by=request.submitted_by, spec_json=spec.model_dump_json(),
            status=status, attempt=0, holder=None, retries_left=spec.policy.retries, lease_s=spec.policy.lease_s,
            lease_expires_at=None, cancel_requested=False, reason=reason,
            explanation_json=None if explanation is None else explanation.model_dump_json(),
            exit_code=None, submitted_at=now, updated_at=now, seq=None,
        )
        stored = await self._store.insert_job(row, reason, stimulus_id=f"submit-{job_id}")
        self._specs[job_id] = spec
        self.feed.publish(Change("job", job_id))
        self._wake.set()
        return self._view(stored)

    async def async_list_jobs(self, statuses: list[str] | None, limit: int | None,
                              scope: str = "local") -> list[JobView]:
        """Jobs in submission order, without attempts and history.

        ``scope="cluster"`` adds the jobs every trusted peer that is up owns (asked
        concurrently; a peer that does not answer in time is left out).
        """
        local = await self._list_local(statuses, limit)
        if scope != "cluster" or self.cluster is None:
            return local
        peers = [p.key for p in self.cluster.table.trusted_peers()
                 if self.cluster.table.state(p, time.monotonic()) == "up"]
        path = "/v1/peer/jobs" + ("?" + "&".join(f"status={s}" for s in statuses) if statuses else "")
        results = await asyncio.gather(*(self.cluster.call(p, path, None, JobList) for p in peers),
                                       return_exceptions=True)
        merged = list(local)
        for peer, res in zip(peers, results, strict=True):
            if isinstance(res, JobList):
                for j in res.jobs:
                    j.owner_name = self.cluster.name_of(peer)
                merged.extend(res.jobs)
        merged.sort(key=lambda j: (j.submitted_at, j.id))
        return merged[-limit:] if limit else merged

    async def _list_local(self, statuses: list[str] | None, limit: int | None) -> list[JobView]:
        wanted = None
        if statuses:
            try:
                wanted = [JobStatus(s) for s in statuses]
            except ValueError as e:
                allowed = ", ".join(s.value for s in JobStatus)
                raise ApiError(400, "bad_request", f"status must be one of: {allowed}") from e
        rows = await self._store.list_jobs(wanted, limit)
        return [self._view(r) for r in rows]

    async def async_get_job(self, job_ref: str) -> JobView:
        """One job with its attempts and full history."""
        row = await self._row(job_ref)
        attempts = await self._store.attempts(row.id)
        events = await self._store.events(row.id)
        view = self._view(row)
        view.attempts = []
        for a in attempts:
            raw = json.loads(a.placement_json or "{}")
            placement = PlacementModel.model_validate(raw) if "worker" in raw else None
            view.attempts.append(AttemptView(
                attempt=a.attempt, worker=a.worker, worker_name=self._name_of(a.worker), state=a.state,
                placement=placement, gang=list(raw.get("gang", [])), run_dir=a.run_dir or None,
                started_at=a.started_at, ended_at=a.ended_at, exit_code=a.exit_code, reason=a.reason,
            ))
        view.events = [
            EventView(seq=e.seq, at=e.at, kind=e.kind, from_status=e.from_status, to_status=e.to_status,
                      attempt=e.attempt, reason=self._readable(e.reason), stimulus_id=e.stimulus_id)
            for e in events
        ]
        return view

    async def async_explain(self, job_ref: str) -> ExplanationModel:
        """Explain the job against this machine now."""
        row = await self._row(job_ref)
        spec = self._spec(row)
        await self._caps_ready.wait()
        worker = await self._worker_snapshot(refresh_apps=True)
        req = spec.to_core(row.id)
        workers = [self._with_paths(worker, req.workdir), *self._remote_workers()]
        return ExplanationModel.from_core(explain(req, workers, self._support))

    async def async_cancel(self, job_ref: str) -> JobView:
        """Cancel: a queued job at once; a running one by SIGTERM, grace, SIGKILL."""
        row = await self._row(job_ref)
        for _ in range(5):
            actions = claims.handle(row.record(), claims.CancelRequested(stimulus_id=f"cancel-{row.id}"),
                                    time.monotonic())
            if not actions:
                break
            if await self._run_actions(row.id, actions, kind="cancel requested"):
                break
            row = await self._row(row.id)
        return self._view(await self._row(row.id))

    async def async_logs(self, job_ref: str, stream: str, offset: int, attempt: int | None) -> LogChunk:
        """Bytes of a job's log from ``offset`` (at most 1 MiB), as text."""
        row = await self._row(job_ref)
        if attempt is not None and not 1 <= attempt <= row.attempt:
            raise ApiError(404, "not_found", f"job {row.id} has no attempt {attempt} (attempts: 1 to {row.attempt})"
                           if row.attempt else f"job {row.id} has not run yet")
        n = attempt if attempt is not None else row.attempt
        terminal = row.status in claims.TERMINAL or (attempt is not None and attempt < row.attempt)
        if n > 0 and self.cluster is not None:
            worker = next((a.worker for a in await self._store.attempts(row.id) if a.attempt == n), self.node_id)
            if worker != self.node_id:
                try:
                    chunk = await self.cluster.call(worker, "/v1/peer/logs", LogRequest(
                        job_id=row.id, attempt=n, stream=stream, offset=offset), LogChunk)
                except PeerCallError as e:
                    raise ApiError(502, "peer_unreachable", f"cannot read the log on {worker[:12]}: {e}") from e
                return chunk.model_copy(update={"complete": chunk.complete or (
                    terminal and chunk.next_offset == chunk.offset)})
        if n <= 0:
            return LogChunk(job_id=row.id, attempt=0, stream=stream, offset=0, next_offset=0, data="",
                            complete=row.status in claims.TERMINAL)
        path = self._config.runs_dir / row.id / str(n) / f"{stream}.log"
        data = b""
        size = 0
        with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            raw = f.read(LOG_CHUNK_BYTES)
            # Cut a character only where more may follow: a finished log ends where it ends.
            data = whole_chars(raw) if not terminal or offset + len(raw) < size else raw
        nxt = offset + len(data)
        return LogChunk(job_id=row.id, attempt=n, stream=stream, offset=offset, next_offset=nxt,
                        data=data.decode("utf-8", errors="replace"), complete=terminal and nxt >= size)

    # --------------------------------------------------------------------- loops

    async def async_probe_loop(self) -> None:
        """Probe hardware and environments now and every ``probe_interval_s``."""
        while True:
            await self._probe_once()
            await asyncio.sleep(self._config.probe_interval_s)

    async def async_schedule_loop(self) -> None:
        """Match queued jobs whenever something changes (or every ``schedule_interval_s``)."""
        await self._caps_ready.wait()
        while True:
            self._wake.clear()
            await self._schedule_once()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.schedule_interval_s)

    async def async_lease_loop(self) -> None:
        """Renew the leases of this worker's running attempts and check the owner's leases."""
        tick_s = 1.0
        while True:
            await asyncio.sleep(tick_s)
            await self._lease_tick()

    async def async_recover(self) -> None:
        """After a restart: re-adopt runs whose watchdog lives, account for the rest.

        Persisted leases count as renewed at restart.
        """
        now = time.monotonic()
        for a in await self._store.active_attempts():
            row = await self._store.get_job(a.job_id)
            if row is None or row.attempt != a.attempt or row.status not in claims.ACTIVE:
                await self._store.end_attempt(a.job_id, a.attempt, "lost", None, "superseded", time.time())
                continue
            self._leases[row.id] = now + row.lease_s
            self._spec(row)  # CPU slot accounting needs the spec of every live run
            if a.worker != self.node_id:
                continue  # runs on a peer: its lease counts as renewed now; it reports when it can
            handle = await self._adopt_or_give_up(a.run_dir)
            if handle is None:
                await self._lost(row.id, a.attempt, "the daemon stopped before the job started", never_started=True)
                continue
            status = self._runner.poll(handle)
            if a.state == "claimed" and (status.running or status.exit_code is not None):
                # The daemon died between starting the watchdog and recording it.
                await self._store.mark_running(row.id, a.attempt, handle.watchdog_pid, handle.watchdog_create_time,
                                               handle.job_pgid or 0, time.time())
                await self._apply_event(row.id, claims.RunStarted(a.attempt, self.node_id, f"adopt-{row.id}"))
            if status.running:
                log.info("re-adopted job %s attempt %d (watchdog pid %d)", row.id, a.attempt, handle.watchdog_pid)
                await self._store.add_event(row.id, "adopted", f"re-adopted after daemon restart "
                                            f"(watchdog pid {handle.watchdog_pid})", attempt=a.attempt,
                                            now_wall=time.time())
                self._runner.extend_deadline(handle, now + row.lease_s)
                self._track(row.id, a.attempt, handle)
            else:
                await self._finish(row.id, a.attempt, status)
        await self._settle_ended_attempts()
        for r in await self._store.remote_runs(active=True):
            handle = self._runner.adopt(Path(r.run_dir))
            key = (r.job_id, r.attempt)
            self._remote[key] = r.owner
            self._specs.setdefault(r.job_id, JobSpec.model_validate_json(r.spec_json))
            self._leases_remote[key] = (now + r.lease_s, r.lease_s)
            if handle is None:
                await self._store.end_remote_run(r.owner, r.job_id, r.attempt, "lost", None,
                                                 "the daemon stopped before the job started", time.time())
                continue
            status = self._runner.poll(handle)
            if status.running:
                self._runner.extend_deadline(handle, now + r.lease_s)
                self._track(r.job_id, r.attempt, handle)
            else:
                await self._finish(r.job_id, r.attempt, status)

    async def _adopt_or_give_up(self, run_dir: str | None) -> RunHandle | None:
        """The handle of a run after a restart, or None if its watchdog never started (and now never will)."""
        if not run_dir:
            return None
        path = Path(run_dir)
        handle = self._runner.adopt(path)
        if handle is not None or self._runner.give_up_if_unstarted(path):
            return handle
        # A watchdog claimed the run directory and is starting: give it time to say so.
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            handle = self._runner.adopt(path)
            if handle is not None:
                return handle
        return None

    async def _settle_ended_attempts(self) -> None:
        """A job still claimed/running whose current attempt already ended (a kill between the two
        commits): apply the end to the job now."""
        for row in await self._store.list_jobs([JobStatus.CLAIMED, JobStatus.RUNNING], None):
            attempt = next((a for a in await self._store.attempts(row.id) if a.attempt == row.attempt), None)
            if attempt is None or attempt.state not in ("exited", "lost"):
                continue
            if attempt.state == "exited":
                event: claims.Event = claims.RunExited(row.attempt, attempt.exit_code, "", f"settle-{row.id}")
            else:
                event = claims.RunLost(row.attempt, attempt.reason or "lost", False, f"settle-{row.id}")
            await self._apply_event(row.id, event)

    async def async_close(self) -> None:
        """Stop watching runs (the jobs keep running under their watchdogs)."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for t in self._watchers.values():
            t.cancel()
        for t in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._watchers.clear()

    # ----------------------------------------------------------------- internals

    async def _row(self, job_ref: str) -> JobRow:
        try:
            job_id = await self._store.resolve_job_id(job_ref)
        except JobNotFound as e:
            raise ApiError(404, "not_found", f"no job {job_ref!r}") from e
        except AmbiguousJobId as e:
            raise ApiError(400, "ambiguous_id", str(e)) from e
        row = await self._store.get_job(job_id)
        if row is None:
            raise ApiError(404, "not_found", f"no job {job_ref!r}")
        return row

    def _spec(self, row: JobRow) -> JobSpec:
        spec = self._specs.get(row.id)
        if spec is None:
            spec = self._specs[row.id] = JobSpec.model_validate_json(row.spec_json)
        return spec

    def _view(self, row: JobRow) -> JobView:
        return JobView(
            id=row.id, name=row.name, submitted_by=row.submitted_by, owner=self.node_id,
            owner_name=self._hostname, status=row.status.value,
            attempt=row.attempt, holder=row.holder, holder_name=self._name_of(row.holder),
            retries_left=row.retries_left, cancel_requested=row.cancel_requested,
            reason=self._readable(row.reason), exit_code=row.exit_code,
            submitted_at=row.submitted_at, updated_at=row.updated_at, spec=self._spec(row),
            explanation=(None if row.explanation_json is None
                         else ExplanationModel.model_validate_json(row.explanation_json)),
        )

    def _name_of(self, node_id: str | None) -> str | None:
        if node_id is None:
            return None
        if node_id == self.node_id:
            return self._hostname
        name = self.cluster.name_of(node_id) if self.cluster is not None else None
        return name or node_id[:12]

    def _readable(self, text: str) -> str:
        """Reasons name workers by node id; people read host names."""
        if self.node_id in text:
            text = text.replace(self.node_id, self._label(self.node_id))
        if self.cluster is not None:
            for p in self.cluster.table.trusted_peers():
                if p.key in text:
                    text = text.replace(p.key, self._label(p.key))
        return text

    def _label(self, node_id: str) -> str:
        """A host name, with the node id's start when in a cluster (host names may repeat)."""
        name = self._name_of(node_id) or node_id[:12]
        return name if self.cluster is None else f"{name} ({node_id[:8]})"

    async def _probe_once(self) -> None:
        inventory = await asyncio.to_thread(discover_host, self._discovery, self._support, nvidia=self._nvidia)
        envs: list[EnvironmentSnapshot] = []
        for interp in self._config.interpreters:
            envs.append(await self._prober.async_probe(interp))
        caps = build_capabilities(inventory, envs, self.node_id, time.time())
        changed = self._caps is None or _hardware_key(self._caps) != _hardware_key(caps)
        self._caps = caps
        self._caps_ready.set()
        if changed:
            self.feed.publish(Change("devices"))
            self._wake.set()

    async def _worker_snapshot(self, refresh_apps: bool) -> WorkerSnapshot:
        """This machine as the matcher sees it now: grants, other daemons' locks, foreign pids."""
        assert self._caps is not None
        worker = self._caps.to_core()
        grants = {g.device_uuid: g.job_id for g in await self._store.grants()}
        held = {u: f"{h.job_id} (held)" for h in self._holds.values() for u in h.placement.device_uuids if u}
        ours = self._our_pids()
        apps = await self._compute_apps(worker) if refresh_apps else None
        devices = []
        for dev in worker.devices:
            d = dev
            if apps is not None and d.accelerator is Accelerator.CUDA:
                d = replace(d, foreign_pids=apps.get(d.uuid or "", ()))
            granted_to = grants.get(d.uuid or "") or held.get(d.uuid or "")
            if granted_to is None and d.uuid and d.execution_supported and self._locks.is_locked_elsewhere(d.uuid):
                granted_to = ANOTHER_DAEMON
            foreign = tuple(p for p in d.foreign_pids if p not in ours)
            devices.append(replace(d, granted_to=granted_to, foreign_pids=foreign))
        used = sum(self._cpu_slots(k[0]) for k in [*self._runs, *self._starting] if self._is_cpu(k[0]))
        used += sum(h.cpu_slots for h in self._holds.values())
        free = max(0, self._config.effective_cpu_slots - used)
        return replace(worker, devices=tuple(devices), cpu_slots_free=free,
                       cpu_slots_total=self._config.effective_cpu_slots)

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

    def _is_cpu(self, job_id: str) -> bool:
        spec = self._specs.get(job_id)
        return spec is not None and spec.requirements.accelerator is Accelerator.CPU

    def _cpu_slots(self, job_id: str) -> int:
        spec = self._specs.get(job_id)
        if spec is None or spec.distributed is None:
            return 1
        return spec.distributed.nproc_per_node

    def _our_pids(self) -> set[int]:
        pids: set[int] = set()
        for h in self._runs.values():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(h.watchdog_pid)
                pids.add(p.pid)
                pids.update(c.pid for c in p.children(recursive=True))
        return pids

    @staticmethod
    def _with_paths(worker: WorkerSnapshot, workdir: str | None) -> WorkerSnapshot:
        if workdir is None:
            return worker
        return replace(worker, existing_paths=frozenset({workdir}) if os.path.isdir(workdir) else frozenset())

    async def _schedule_once(self) -> None:
        async with self._schedule_lock:
            queued = await self._store.list_jobs([JobStatus.QUEUED], None)
            if not queued:
                await self._take_offers()
                return
            worker = await self._worker_snapshot(refresh_apps=True)
            dir_cache: dict[str, bool] = {}
            seen: dict[tuple[object, ...], bool] = {}
            for row in queued:
                spec = self._spec(row)
                req = spec.to_core(row.id)
                wd = req.workdir or ""
                if wd not in dir_cache:
                    dir_cache[wd] = os.path.isdir(wd)
                w = replace(worker, existing_paths=frozenset({wd}) if dir_cache[wd] else frozenset())
                if req.distributed is not None and req.distributed.nnodes > 1:
                    await self._schedule_gang(row, spec, req, w)
                    continue
                sig = job_signature(req)
                if seen.get(sig) is False:
                    continue  # an identical job already did not fit in this pass
                ev = evaluate(req, w, self._support)
                if ev.placement is None:
                    if self._offer_elsewhere(row, req, spec):
                        continue
                    seen[sig] = False
                    await self._record_wait(row, req, w)
                    continue
                if await self._claim_and_start(row, spec, ev.placement):
                    worker = await self._worker_snapshot(refresh_apps=False)
                    seen.clear()
            await self._take_offers()

    async def _record_wait(self, row: JobRow, req: JobRequest, worker: WorkerSnapshot) -> None:
        e: Explanation = explain(req, [worker, *self._remote_workers()], self._support)
        summary = e.summary
        if summary != row.reason:
            model = ExplanationModel.from_core(e)
            await self._store.set_explanation(row.id, summary, model.model_dump_json())
            self.feed.publish(Change("job", row.id))

    async def _claim_and_start(self, row: JobRow, spec: JobSpec, placement: Placement) -> bool:
        """Claim (the compare-and-set, in order) and start the run in the background.

        Claims are sequential so that each scheduling decision sees the grants before it;
        starting a watchdog takes a Python start-up, so starts run concurrently, counted
        in ``_starting`` until they show up in ``_runs``.
        """
        now = time.monotonic()
        actions = claims.handle(row.record(), claims.ClaimRequested(self.node_id, f"claim-{row.id}"), now)
        persist = actions[0] if actions and isinstance(actions[0], claims.PersistJob) else None
        grant = next((a for a in actions if isinstance(a, claims.GrantClaim)), None)
        if persist is None or grant is None:
            return False
        uuids = [u for u in placement.device_uuids if u]
        fds = self._locks.try_acquire(uuids) if uuids else []
        if fds is None:
            self._wake.set()
            return False  # another daemon on this machine took a device meanwhile
        attempt = grant.attempt
        run_dir = self._config.runs_dir / row.id / str(attempt)
        grants = [(u, i, placement.accelerator.value)
                  for u, i in zip(placement.device_uuids, placement.device_indices, strict=True) if u]
        try:
            ok = await self._store.claim(persist, self.node_id, PlacementModel.from_core(placement).model_dump_json(),
                                         grants, str(run_dir), time.time())
        except BaseException:
            self._locks.release(fds)
            raise
        if not ok:
            self._locks.release(fds)
            return False
        self.feed.publish(Change("job", row.id))
        self.feed.publish(Change("devices"))
        self._leases[row.id] = now + row.lease_s
        self._starting[(row.id, attempt)] = spec
        self._spawn(self._start_run(row, spec, placement, attempt, run_dir, fds))
        return True

    async def _start_run(self, row: JobRow, spec: JobSpec, placement: Placement, attempt: int, run_dir: Path,
                         fds: list[int]) -> None:
        key = (row.id, attempt)
        try:
            nproc = spec.distributed.nproc_per_node if spec.distributed is not None else None
            argv = build_argv(spec, placement.environment, nproc, rdzv_timeout_s=self._config.rdzv_timeout_s,
                              log_dir=str(run_dir / "torchrun"))
            env = build_env(os.environ, spec, placement, row.id, attempt, self._config.dist_timeout_s)
            handle = await asyncio.to_thread(self._runner.start, row.id, attempt, argv, env, spec.workdir or "/",
                                             time.monotonic() + row.lease_s, fds)
        except RunnerError as e:
            self._starting.pop(key, None)
            code = e.status.exit_code if e.status is not None else None
            await self._store.end_attempt(row.id, attempt, "exited", code, str(e), time.time())
            await self._apply_event(row.id, claims.RunExited(attempt, code, f"could not start: {e}"))
            self._wake.set()
            return
        finally:
            if fds:
                self._locks.release(fds)
        self._track(row.id, attempt, handle)
        self._starting.pop(key, None)
        await self._store.mark_running(row.id, attempt, handle.watchdog_pid, handle.watchdog_create_time,
                                       handle.job_pgid, time.time())
        await self._apply_event(row.id, claims.RunStarted(attempt, self.node_id, f"start-{row.id}-{attempt}"))

    def _track(self, job_id: str, attempt: int, handle: RunHandle) -> None:
        key = (job_id, attempt)
        self._runs[key] = handle
        self._watchers[key] = asyncio.create_task(self._watch(job_id, attempt, handle),
                                                  name=f"watch-{job_id}-{attempt}")

    async def _watch(self, job_id: str, attempt: int, handle: RunHandle) -> None:
        status = await self._runner.async_wait(handle)
        await self._finish(job_id, attempt, status)

    async def _finish(self, job_id: str, attempt: int, status: RunStatus) -> None:
        key = (job_id, attempt)
        handle = self._runs.pop(key, None)
        self._watchers.pop(key, None)
        text = status.detail or status.reason
        if status.gone and handle is not None:
            # The watchdog died but the job may live on: stop it before the attempt is
            # declared lost, or a retry would run a second copy beside it.
            await asyncio.to_thread(self._runner.cancel, handle)
            text += "; its processes were stopped"
        owner = self._remote.pop(key, None)
        if owner is not None:
            self._leases_remote.pop(key, None)
            state = "lost" if status.gone else "exited"
            await self._store.end_remote_run(owner, job_id, attempt, state, status.exit_code, text, time.time())
            self.feed.publish(Change("devices"))
            self._wake.set()
            self._spawn(self._report_end(owner, job_id, attempt))
            return
        if status.gone:
            await self._lost(job_id, attempt, text or "the job's watchdog is gone", never_started=False)
        else:
            await self._store.end_attempt(job_id, attempt, "exited", status.exit_code, text, time.time())
            # A start failure or a watchdog error says more than the bare exit code.
            why = status.detail if status.reason in ("start_failed", "error", "deadline") else ""
            await self._apply_event(
                job_id, claims.RunExited(attempt, status.exit_code, why, f"exit-{job_id}-{attempt}"))
        self._leases.pop(job_id, None)
        self.feed.publish(Change("devices"))
        self._wake.set()

    async def _lost(self, job_id: str, attempt: int, reason: str, never_started: bool) -> None:
        await self._store.end_attempt(job_id, attempt, "lost", None, reason, time.time())
        await self._apply_event(job_id, claims.RunLost(attempt, reason, never_started, f"lost-{job_id}-{attempt}"))
        self._wake.set()

    async def _apply_event(self, job_id: str, event: claims.Event) -> None:
        for _ in range(5):
            row = await self._store.get_job(job_id)
            if row is None:
                return
            record = self._record(row)
            actions = claims.handle(record, event, time.monotonic())
            if await self._run_actions(job_id, actions):
                return

    def _record(self, row: JobRow) -> JobRecord:
        rec = row.record()
        lease = self._leases.get(row.id)
        return replace(rec, lease_expires_at=lease) if rec.status in claims.ACTIVE and lease else rec

    async def _run_actions(self, job_id: str, actions: Sequence[claims.Action], kind: str = "state") -> bool:
        """Carry out actions; False if the leading compare-and-set lost (caller retries)."""
        for action in actions:
            if isinstance(action, claims.PersistJob):
                if action.reason == "":
                    if action.record.lease_expires_at is not None:
                        self._leases[job_id] = action.record.lease_expires_at
                    continue  # a lease renewal: kept in memory (reset at restart anyway)
                same = action.record.status is action.expect_status
                if not await self._store.apply(action, time.time(), kind=kind if same else "state"):
                    return False
                self.feed.publish(Change("job", job_id))
                if action.record.status is JobStatus.QUEUED:
                    self._wake.set()
            elif isinstance(action, (claims.KillRun, claims.ReplyStale)):
                # A stale attempt (ReplyStale) must die just like a killed one.
                handle = self._runs.get((job_id, action.attempt))
                if handle is not None and (job_id, action.attempt) not in self._remote:
                    await asyncio.to_thread(self._runner.cancel, handle)
                elif isinstance(action, claims.KillRun) and action.worker and action.worker != self.node_id:
                    self._spawn(self._send_kill(action.worker, job_id, action.attempt, action.reason))
        return True

    async def _lease_tick(self) -> None:
        now = time.monotonic()
        for (job_id, attempt), handle in list(self._runs.items()):
            if (job_id, attempt) in self._remote:
                continue
            row = await self._store.get_job(job_id)
            if row is None:
                continue
            # Worker side: our run is alive, so renew with the owner (ourselves) and
            # move the watchdog's deadline.
            actions = claims.handle(self._record(row), claims.LeaseRenewed(attempt, self.node_id), now)
            await self._run_actions(job_id, actions)
            self._runner.extend_deadline(handle, now + row.lease_s)
        for job_id in list(self._leases):
            row = await self._store.get_job(job_id)
            if row is None or row.status not in claims.ACTIVE:
                self._leases.pop(job_id, None)
                continue
            actions = claims.handle(self._record(row), claims.LeaseChecked(self._config.lease_grace_s), now)
            if actions and await self._run_actions(job_id, actions):
                persist = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
                if persist is not None:
                    await self._store.end_attempt(job_id, row.attempt, "lost", None, persist.reason, time.time())
                self._leases.pop(job_id, None)
        self._expire_holds(now)
        await self._gang_lease_tick(now)
        if self._remote:
            await self._renew_remote(now)

    # ------------------------------------------------------------- the cluster

    def wake(self) -> None:
        """Ask the scheduler for a pass (peers changed)."""
        self._wake.set()

    @property
    def store(self) -> Store:
        """The daemon's store (the cluster node keeps peer hints there)."""
        return self._store

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remote_workers(self) -> list[WorkerSnapshot]:
        return self.cluster.worker_snapshots() if self.cluster is not None else []

    def gpu_counts(self) -> tuple[int | None, int | None]:
        """(schedulable GPUs, free ones) for the mDNS TXT record."""
        if self._caps is None:
            return None, None
        devs = [d for d in self._caps.devices if d.execution_supported]
        busy = {k for k in self._runs if not self._is_cpu(k[0])}
        return len(devs), max(0, len(devs) - len(busy)) if devs else 0

    def caps_digest(self) -> str:
        """Changes whenever what peers see of us (devices, grants, CPU slots) changes."""
        if self._caps is None:
            return ""
        runs = sorted(self._runs)
        return hashlib.sha256(repr((_hardware_key(self._caps), runs)).encode()).hexdigest()[:16]

def _hardware_key(caps: Capabilities) -> tuple[object, ...]:
    return (
        tuple((d.uuid, d.index, d.memory_total_bytes, d.compute_capability, d.execution_supported,
               tuple(d.foreign_pids)) for d in caps.devices),
        tuple((h.source, h.status) for h in caps.health),
        tuple((e.interpreter, e.ok, tuple(sorted(e.frameworks))) for e in caps.environments),
    )
