"""A fake local daemon for TUI tests and the TUI benchmark: :class:`FakeDaemonClient`.

It has the methods of :class:`gpulayerd.api.client.DaemonClient` that the TUI calls,
answers from memory, records every call, and streams the changes a test pushes (one at a
time, or at a steady rate with :meth:`FakeDaemonClient.feed`). It can "go down" (every call
raises DaemonUnreachable, open event streams break) and come back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpulayerd.api.client import ApiRequestError, ChangeEvent, DaemonUnreachable
from gpulayerd.app.common.logread import whole_chars
from gpulayerd.models import (
    LOG_CHUNK_BYTES,
    ApiErrorBody,
    Capabilities,
    CheckModel,
    ExplanationModel,
    HealthView,
    JobSpec,
    JobView,
    LogChunk,
    PeerView,
    RejectionModel,
    RequesterView,
    WorkerExplanationModel,
    job_user,
)
from gpulayerd.models.jobs_query import MAX_IDS
from gpulayerd.models.metrics import GpuMetricsView, GpuProcessView, MetricsView

WORKERS_DIR = Path(__file__).resolve().parents[1] / "data" / "workers"
NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC: the fixed clock of the TUI tests
FAKE_SOCKET = Path("/nonexistent/gpulayerd.sock")
ALICE_ADMIN = RequesterView(uid=1000, user="alice", admin=True)
"""The TUI's user by default: alice on her personal daemon, where she is the admin (cancels every job)."""


def load_caps(name: str) -> Capabilities:
    """Capabilities from tests/data/workers/NAME.json."""
    return Capabilities.model_validate_json((WORKERS_DIR / f"{name}.json").read_bytes())


def make_peer(name: str, *, state: str = "up", trusted: bool = True, addresses: Iterable[str] = ("10.0.0.7",),
              last_heartbeat_at: float | None = NOW - 3, version: str = "0.1.0") -> PeerView:
    """A peer whose capabilities come from tests/data/workers/NAME.json."""
    caps = load_caps(name)
    return PeerView(node_id=caps.node_id, name=caps.hostname, addresses=list(addresses), port=7443,
                    version=version, cluster="lab" if trusted else "elsewhere", trusted=trusted, state=state,
                    last_heartbeat_at=last_heartbeat_at, capabilities=caps)


def make_job(job_id: str, status: str = "queued", *, age_s: float = 60.0, name: str | None = None,
             owner: str = "alice", holder_name: str | None = None, reason: str = "waiting for the scheduler",
             requirements: dict[str, Any] | None = None, command: Iterable[str] = ("python", "train.py"),
             now: float = NOW) -> JobView:
    """A job as the API shows it, submitted ``age_s`` before ``now``."""
    spec = JobSpec.model_validate({"command": list(command), "workdir": "/home/alice/proj",
                                   "requirements": requirements or {}, "name": name})
    return JobView(id=job_id, name=name, submitted_by=owner, status=status, attempt=1 if holder_name else 0,
                   holder="n" * 52 if holder_name else None, holder_name=holder_name, reason=reason,
                   submitted_at=now - age_s, updated_at=now - age_s / 2, spec=spec)


def waiting_explanation(job_id: str) -> ExplanationModel:
    """Why a 40 GB CUDA job waits on lab-ws-02 (3090s, 24 GB) and dgx-spark (unified memory)."""
    return ExplanationModel(
        job_id=job_id,
        verdict="fits_nowhere",
        summary="fits nowhere we know: no worker has a CUDA GPU with >= 40.0 GB dedicated memory",
        workers=[
            WorkerExplanationModel(
                worker="w" * 52, name="lab-ws-02", online=True, state="no_fit",
                checks=[CheckModel(requirement="accelerator", wanted="cuda", found="cuda x2", ok=True),
                        CheckModel(requirement="gpu_memory", wanted=">= 40.0 GB", found="24.0 GB", ok=False),
                        CheckModel(requirement="frameworks", wanted="torch>=2.4", found="torch 2.5.1", ok=True)],
                rejections=[RejectionModel(code="INSUFFICIENT_MEMORY", requirement="gpu_memory",
                                           wanted=">= 40.0 GB", found="24.0 GB", worker="w" * 52,
                                           message="GPU 0 (NVIDIA GeForce RTX 3090) has 24.0 GB, the job "
                                                   "needs 40.0 GB")],
            ),
            WorkerExplanationModel(
                worker="s" * 52, name="dgx-spark", online=True, state="no_fit",
                checks=[CheckModel(requirement="accelerator", wanted="cuda", found="cuda x1", ok=True),
                        CheckModel(requirement="memory_kind", wanted="dedicated", found="unified", ok=False),
                        CheckModel(requirement="frameworks", wanted="torch>=2.4", found="not checked",
                                   ok=None)],
                rejections=[RejectionModel(code="CAPABILITY_MISMATCH", requirement="memory_kind",
                                           wanted="dedicated", found="unified", worker="s" * 52,
                                           message="GPU 0 (NVIDIA GB10) has unified memory, the job needs "
                                                   "dedicated")],
            ),
        ],
    )


def lab_metrics() -> MetricsView:
    """Live metrics of lab-ws-02 (tests/data/workers): GPU 0 runs job j-4711 "sweep-lr-3e-4" of bob,
    GPU 1 is used by a foreign process of carol; readings include nvidia-smi placeholders (None)."""
    caps = load_caps("lab-ws-02")
    uuids = [d.uuid for d in caps.devices]
    gib = 2**30
    return MetricsView(available=True, sampling=True, taken_at=NOW, interval_s=1.0, gpus=[
        GpuMetricsView(index=0, uuid=uuids[0], utilization_pct=87, temperature_c=71, power_draw_w=251.3,
                       power_limit_w=350, memory_used_bytes=18 * gib, memory_total_bytes=24 * gib,
                       utilization_history=[10, 40, 75, 90, 87, None, 87],
                       processes=[GpuProcessView(pid=4242, used_memory_bytes=17 * gib, user="bob", job_id="j-4711",
                                                 job_name="sweep-lr-3e-4", job_user="bob")],
                       granted_to="j-4711", granted_name="sweep-lr-3e-4", granted_user="bob"),
        GpuMetricsView(index=1, uuid=uuids[1], utilization_pct=3, temperature_c=None, power_draw_w=None,
                       power_limit_w=None, memory_used_bytes=2 * gib, memory_total_bytes=24 * gib,
                       utilization_history=[0, 3],
                       processes=[GpuProcessView(pid=31337, used_memory_bytes=gib, user="carol")]),
    ])


class FakeDaemonClient:
    """An in-memory daemon with the DaemonClient methods the TUI uses."""

    def __init__(self, *, jobs: Iterable[JobView] = (), peers: Iterable[PeerView] = (),
                 explanations: dict[str, ExplanationModel] | None = None, hostname: str = "lab-ws-02",
                 metrics: MetricsView | None = None, requester: RequesterView | None = ALICE_ADMIN) -> None:
        self.jobs_by_id: dict[str, JobView] = {j.id: j for j in jobs}
        self.peer_list: list[PeerView] = list(peers)
        self.explanations: dict[str, ExplanationModel] = dict(explanations or {})
        self.logs_by_job: dict[tuple[str, str], str] = {}
        self.log_attempt: dict[str, int] = {}
        """The attempt a job's log belongs to (default: the job's attempt, at least 1)."""
        self.bytes_served = 0
        """Bytes of logs answered so far."""
        self._encoded: dict[tuple[str, str], tuple[str, bytes]] = {}
        self.complete: set[str] = set()
        self.hostname = hostname
        self.requester = requester
        """Who the TUI runs as (health's answer); cancel refuses other users' jobs unless admin, as the daemon."""
        self.reachable = True
        self.calls: list[tuple[str, ...]] = []
        self.metrics_view = metrics or MetricsView(available=False, message="no working nvidia-smi on this machine")
        self.closed = 0
        self._streams: list[asyncio.Queue[ChangeEvent | None]] = []

    # ---- test controls

    def put_job(self, job: JobView, notify: bool = True) -> None:
        """Store ``job`` and (by default) tell the open streams it changed."""
        self.jobs_by_id[job.id] = job
        if notify:
            self.push("job", job.id)

    def push(self, kind: str, key: str = "") -> None:
        """Send a change to every open event stream."""
        for q in self._streams:
            q.put_nowait(ChangeEvent(kind=kind, key=key))

    async def feed(self, jobs: Sequence[JobView], per_s: float, pushed: list[float] | None = None) -> list[float]:
        """Put each of ``jobs`` (and tell the streams) at a steady ``per_s`` changes a second.

        Args:
            pushed: filled as the changes go out (read it while the feed runs); default: a new list.

        Returns:
            ``pushed``: when each was pushed (``time.perf_counter()`` seconds), in the order of ``jobs``.
        """
        pushed = [] if pushed is None else pushed
        start = time.perf_counter()
        while len(pushed) < len(jobs):
            now = time.perf_counter()
            due = min(len(jobs), int((now - start) * per_s) + 1)
            for job in jobs[len(pushed):due]:
                self.put_job(job)
                pushed.append(now)
            await asyncio.sleep(min(0.005, 1 / per_s))
        return pushed

    def go_down(self) -> None:
        """Stop answering: calls raise DaemonUnreachable, open streams break."""
        self.reachable = False
        for q in self._streams:
            q.put_nowait(None)

    def come_back(self) -> None:
        """Answer again."""
        self.reachable = True

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def count(self, method: str) -> int:
        return sum(1 for c in self.calls if c[0] == method)

    # ---- the client API

    def _call(self, *call: str) -> None:
        self.calls.append(call)
        if not self.reachable:
            raise DaemonUnreachable(FAKE_SOCKET, "no socket (is gpulayerd running?)")

    @staticmethod
    def _not_found(job_ref: str) -> ApiRequestError:
        return ApiRequestError(404, ApiErrorBody(code="not_found", message=f"no job {job_ref}"))

    async def health(self) -> HealthView:
        self._call("health")
        return HealthView(ok=True, version="0.1.0", node_id="n" * 52, hostname=self.hostname, pid=4242,
                          state_dir="/home/alice/.local/state/gpulayer", requester=self.requester)

    async def peers(self) -> list[PeerView]:
        self._call("peers")
        return list(self.peer_list)

    async def jobs(self, statuses: list[str] | None = None, limit: int | None = None,
                   scope: str = "local", ids: Collection[str] | None = None) -> list[JobView]:
        """The listing; with ``ids`` (recorded as the call ``jobs?ids``) only those, gone ones left out."""
        if ids is not None:
            self._call("jobs?ids", *ids)
            if len(ids) > MAX_IDS:
                raise ApiRequestError(400, ApiErrorBody(code="bad_request", message=f"ids: at most {MAX_IDS}"))
            wanted = set(ids)
            return [j for j in self.jobs_by_id.values() if j.id in wanted and (not statuses or j.status in statuses)]
        self._call("jobs")
        jobs = [j for j in self.jobs_by_id.values() if not statuses or j.status in statuses]
        return jobs[:limit] if limit is not None else jobs

    async def job(self, job_ref: str) -> JobView:
        self._call("job", job_ref)
        try:
            return self.jobs_by_id[job_ref]
        except KeyError:
            raise self._not_found(job_ref) from None

    async def explain(self, job_ref: str) -> ExplanationModel:
        self._call("explain", job_ref)
        if job_ref not in self.jobs_by_id:
            raise self._not_found(job_ref)
        if job_ref not in self.explanations:
            raise ApiRequestError(500, ApiErrorBody(code="internal", message="internal error: probe failed"))
        return self.explanations[job_ref]

    async def cancel(self, job_ref: str) -> JobView:
        self._call("cancel", job_ref)
        job = self.jobs_by_id.get(job_ref)
        if job is None:
            raise self._not_found(job_ref)
        if self.requester is not None and not self.requester.may_manage(job_user(job.spec.user, job.submitted_by)):
            raise ApiRequestError(403, ApiErrorBody(code="forbidden", message=f"job {job_ref} is not yours"))
        done = job.model_copy(update={"status": "cancelled", "reason": "cancelled by the user"})
        self.put_job(done)
        return done

    async def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0,
                   attempt: int | None = None, limit: int | None = None) -> LogChunk:
        """Up to ``limit`` bytes (default and at most LOG_CHUNK_BYTES, as the daemon) from ``offset``,
        cut on whole characters; counts the bytes served (:attr:`bytes_served`)."""
        self._call("logs", job_ref, stream, str(offset), str(limit))
        job = self.jobs_by_id.get(job_ref)
        if job is None:
            raise self._not_found(job_ref)
        data = self.log_bytes(job_ref, stream)
        part = whole_chars(data[offset:offset + min(limit or LOG_CHUNK_BYTES, LOG_CHUNK_BYTES)])
        nxt = offset + len(part)
        self.bytes_served += len(part)
        return LogChunk(job_id=job_ref, attempt=self.log_attempt.get(job_ref, max(job.attempt, 1)),
                        stream="stderr" if stream == "stderr" else "stdout", offset=offset, next_offset=nxt,
                        data=part.decode(errors="replace"), complete=job_ref in self.complete and nxt >= len(data),
                        size=len(data))

    def log_bytes(self, job_ref: str, stream: str) -> bytes:
        """The log as bytes, encoded once per version of its text (a test may hold 1,000,000 lines)."""
        text = self.logs_by_job.get((job_ref, stream), "")
        cached = self._encoded.get((job_ref, stream))
        if cached is None or cached[0] is not text:
            cached = (text, text.encode())
            self._encoded[(job_ref, stream)] = cached
        return cached[1]

    async def metrics(self) -> MetricsView:
        self._call("metrics")
        return self.metrics_view

    async def events(self) -> AsyncIterator[ChangeEvent]:
        self._call("events")
        q: asyncio.Queue[ChangeEvent | None] = asyncio.Queue()
        self._streams.append(q)
        try:
            yield ChangeEvent(kind="resync")
            while True:
                change = await q.get()
                if change is None:
                    raise DaemonUnreachable(FAKE_SOCKET, "Server disconnected")
                yield change
        finally:
            self._streams.remove(q)

    async def close(self) -> None:
        self.closed += 1
