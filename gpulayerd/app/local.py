"""The local API's service: what ``gpulayer`` and the TUI ask this daemon, answered by the services."""

from __future__ import annotations

import os

from gpulayerd.app.clock import Clock
from gpulayerd.app.machine import Machine
from gpulayerd.app.owner import OwnerService
from gpulayerd.app.ports import Directory
from gpulayerd.app.signals import Signals
from gpulayerd.feed import ChangeFeed
from gpulayerd.models import Capabilities, ExplanationModel, HealthView, JobView, LogChunk, PeerView, SubmitRequest

__all__ = ["LocalApi"]


class LocalApi:
    """Implements :class:`gpulayerd.api.server.LocalService` over the owner, the machine and the cluster."""

    def __init__(self, *, node_id: str, hostname: str, version: str, state_dir: str, owner: OwnerService,
                 machine: Machine, directory: Directory | None, signals: Signals, clock: Clock) -> None:
        self._node_id = node_id
        self._hostname = hostname
        self._version = version
        self._state_dir = state_dir
        self._owner = owner
        self._machine = machine
        self._directory = directory
        self._signals = signals
        self._clock = clock

    @property
    def feed(self) -> ChangeFeed:
        """What changed, for ``GET /v1/events``."""
        return self._signals.feed

    def health(self) -> HealthView:
        """Liveness and identity, with the protocol counters."""
        return HealthView(ok=True, version=self._version, node_id=self._node_id, hostname=self._hostname,
                          pid=os.getpid(), state_dir=self._state_dir, counters=dict(self._signals.stats))

    async def async_capabilities(self) -> Capabilities:
        """This machine's capabilities with the current grant state of each device."""
        return await self._machine.capabilities()

    async def async_peers(self) -> list[PeerView]:
        """Every gpulayerd known, this one first."""
        caps = await self._machine.capabilities()
        me = PeerView(node_id=self._node_id, name=self._hostname, version=self._version, trusted=True,
                      state="self", last_heartbeat_at=self._clock.wall(), capabilities=caps)
        if self._directory is None:
            return [me]
        me.addresses = list(self._directory.addresses)
        me.port = self._directory.port
        me.cluster = self._directory.cluster_id
        return [me, *self._directory.views()]

    async def async_submit(self, request: SubmitRequest) -> JobView:
        """See :meth:`OwnerService.submit`."""
        return await self._owner.submit(request)

    async def async_list_jobs(self, statuses: list[str] | None, limit: int | None,
                              scope: str = "local") -> list[JobView]:
        """See :meth:`OwnerService.list_jobs`."""
        return await self._owner.list_jobs(statuses, limit, scope)

    async def async_get_job(self, job_ref: str) -> JobView:
        """See :meth:`OwnerService.get_job`."""
        return await self._owner.get_job(job_ref)

    async def async_explain(self, job_ref: str) -> ExplanationModel:
        """See :meth:`OwnerService.explain`."""
        return await self._owner.explain(job_ref)

    async def async_cancel(self, job_ref: str) -> JobView:
        """See :meth:`OwnerService.cancel`."""
        return await self._owner.cancel(job_ref)

    async def async_logs(self, job_ref: str, stream: str, offset: int, attempt: int | None) -> LogChunk:
        """See :meth:`OwnerService.logs`."""
        return await self._owner.logs(job_ref, stream, offset, attempt)
