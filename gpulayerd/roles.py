"""What the JobManager's roles (remote.py, gang.py) use of it, declared for type checking only."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from gpulayerd.cluster import ClusterNode
    from gpulayerd.config import DaemonConfig
    from gpulayerd.core import claims
    from gpulayerd.core.claims import JobRecord
    from gpulayerd.core.types import SupportMatrix, WorkerSnapshot
    from gpulayerd.devicelock import DeviceLocks
    from gpulayerd.feed import ChangeFeed
    from gpulayerd.gang import Gang, HeldResources
    from gpulayerd.models import JobSpec
    from gpulayerd.net.wire import Ack, Kill, Offer, RunReport, RunReportReply
    from gpulayerd.runner import RunHandle, Runner
    from gpulayerd.store import JobRow, Store

__all__ = ["ManagerState"]


class ManagerState:
    """Attributes and methods that JobManager provides to the roles mixed into it."""

    if TYPE_CHECKING:
        node_id: str
        cluster: ClusterNode | None
        feed: ChangeFeed
        _config: DaemonConfig
        _store: Store
        _runner: Runner
        _locks: DeviceLocks
        _support: SupportMatrix
        _specs: dict[str, JobSpec]
        _runs: dict[tuple[str, int], RunHandle]
        _remote: dict[tuple[str, int], str]
        _offers: dict[tuple[str, str], tuple[Offer, float]]
        _offered: dict[str, tuple[str, float]]
        _leases: dict[str, float]
        _leases_remote: dict[tuple[str, int], tuple[float, float]]
        _wake: asyncio.Event
        _caps_ready: asyncio.Event
        _gangs: dict[str, Gang]
        _gang_busy: set[str]
        _gang_backoff: dict[str, tuple[float, int]]
        _holds: dict[str, HeldResources]
        stats: Counter[str]

        def _spec(self, row: JobRow) -> JobSpec: ...
        def _record(self, row: JobRow) -> JobRecord: ...
        def _label(self, node_id: str) -> str: ...
        def _spawn(self, coro: Coroutine[object, object, None]) -> None: ...
        def _remote_workers(self) -> list[WorkerSnapshot]: ...
        def _track(self, job_id: str, attempt: int, handle: RunHandle) -> None: ...
        async def _run_actions(self, job_id: str, actions: Sequence[claims.Action], kind: str = "state") -> bool: ...
        async def _apply_event(self, job_id: str, event: claims.Event) -> None: ...
        async def _worker_snapshot(self, refresh_apps: bool) -> WorkerSnapshot: ...
        @staticmethod
        def _with_paths(worker: WorkerSnapshot, workdir: str | None) -> WorkerSnapshot: ...
        async def _gang_report(self, row: JobRow, gang: Gang, worker: str, msg: RunReport) -> RunReportReply: ...
        async def worker_kill(self, owner: str, msg: Kill) -> Ack: ...
        async def _report(self, owner: str, job_id: str, attempt: int,
                          kind: Literal["started", "renew", "exited", "lost"], exit_code: int | None, reason: str,
                          never_started: bool = False) -> RunReportReply | None: ...
