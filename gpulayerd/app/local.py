"""The local API's service: what ``gpulayer`` and the TUI ask this daemon, answered by the services."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from gpulayerd import routes
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.feed import ChangeFeed
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.requester import PeerCredentials, Requester, Requesters
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.openmetrics import OpenMetrics
from gpulayerd.app.owner.accounting import Accounting
from gpulayerd.app.owner.idempotency import Submitted
from gpulayerd.app.owner.owner import OwnerService
from gpulayerd.app.owner.ship_server import ShipServer
from gpulayerd.app.remote_jobs import RemoteJobs
from gpulayerd.app.roles import LocalRoles
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.metrics import MetricsService
from gpulayerd.core.job_facts import job_user
from gpulayerd.errors import BadRequest
from gpulayerd.models import (
    Capabilities,
    ExplanationModel,
    HealthView,
    JobView,
    LogChunk,
    PeerView,
    ReportView,
    SubmitRequest,
    UserUsageView,
)
from gpulayerd.models.jobs_query import JobsQuery
from gpulayerd.models.metrics import MetricsView
from gpulayerd.models.snapshots import BlobView, FetchChunk, FetchRequest, SnapshotRequest, SnapshotView

__all__ = ["LocalApi"]


Loop = Callable[[], Awaitable[None]]
"""A background loop the daemon supervises."""


class LocalApi:
    """Implements :class:`gpulayerd.api.server.LocalService` over the owner, the machine and the cluster."""

    def __init__(self, *, node_id: str, hostname: str, version: str, state_dir: str, owner: OwnerService,
                 machine: Machine, directory: Directory | None, signals: Signals, clock: Clock, roles: LocalRoles,
                 requesters: Requesters | None = None, remote: RemoteJobs | None = None,
                 usage: UsageService | None = None, names: Names | None = None,
                 metrics: MetricsService | None = None, shipping: ShipServer | None = None,
                 accounting: Accounting | None = None, openmetrics: OpenMetrics | None = None) -> None:
        """Args beyond the obvious: ``remote``: job control across the cluster (None: this machine's
        jobs only); ``usage`` and ``names``: the fair-share book ``GET /v1/users`` reads (None: no
        users listed); ``metrics``: the sampler ``GET /v1/metrics`` reads (None: "samples no metrics");
        ``shipping``: snapshots of shipped jobs (None: ``--ship`` is refused)."""
        self._shipping = shipping
        self.accounting = accounting
        self.openmetrics = openmetrics
        self._remote = remote
        self._usage = usage
        self._names = names
        self._metrics = metrics
        self._node_id = node_id
        self._hostname = hostname
        self._version = version
        self._state_dir = state_dir
        self._owner = owner
        self._machine = machine
        self._directory = directory
        self._signals = signals
        self._clock = clock
        self._requesters = requesters or Requesters(mode="personal", admin_group="")
        self._roles = roles

    @property
    def feed(self) -> ChangeFeed:
        """What changed, for ``GET /v1/events``."""
        return self._signals.feed

    def health(self) -> HealthView:
        """Liveness and identity, with the protocol counters."""
        return HealthView(ok=True, version=self._version, node_id=self._node_id, hostname=self._hostname,
                          pid=os.getpid(), state_dir=self._state_dir, counters=dict(self._signals.stats),
                          ship_default=self._shipping is not None and self._shipping.ship_default)

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
        if self._directory.removed:
            me.state = "removed"  # members refuse this node: `gpulayer cluster show` says what to do
        return [me, *self._directory.views()]

    async def async_requester(self, creds: PeerCredentials) -> Requester:
        """Who ``creds`` (the kernel's answer for the connecting process) is; see :meth:`Requesters.resolve`.

        Raises:
            Forbidden: personal mode, and another account than the daemon's.
        """
        return await self._requesters.resolve(creds)

    async def async_authorize(self, route: routes.Route, requester: Requester, job_ref: str | None) -> None:
        """THE role check of the local routes (see :class:`~gpulayerd.app.roles.LocalRoles`).

        Raises:
            Forbidden: ``job <id> belongs to <user>``.
        """
        await self._roles.check(route, requester, job_ref)

    async def async_submit(self, request: SubmitRequest, requester: Requester) -> Submitted:
        """See :meth:`OwnerService.submit_keyed`; a shipped spec's snapshot must be the requester's
        (:meth:`ShipServer.vet_submit`).

        Raises:
            BadRequest: ``ship`` without a snapshot of the requester stored here, or a multi-host job.
        """
        if request.spec.get("ship") not in (None, False):
            if self._shipping is None:
                raise BadRequest("job spec: ship: this daemon does not take shipped jobs")
            dist = request.spec.get("distributed")
            if isinstance(dist, dict) and dist.get("nnodes", 1) != 1:
                raise BadRequest("job spec: ship: a multi-host job (distributed.nnodes > 1) is not shipped yet")
            request = request.model_copy(update={"spec": await self._shipping.vet_submit(request.spec, requester)})
        return await self._owner.submit_keyed(request, requester)

    async def async_snapshot(self, request: SnapshotRequest, requester: Requester) -> SnapshotView:
        """See :meth:`ShipServer.snapshot`. Raises BadRequest: over a cap, or no shipping here."""
        if self._shipping is None:
            raise BadRequest("this daemon does not take shipped jobs")
        return await self._shipping.snapshot(request, requester)

    async def async_snapshot_blob(self, requester: Requester, digest: str, offset: int, data: bytes) -> BlobView:
        """See :meth:`ShipServer.snapshot_blob`. Raises BadRequest: not offered, a wrong offset or hash."""
        if self._shipping is None:
            raise BadRequest("this daemon does not take shipped jobs")
        return await self._shipping.snapshot_blob(requester, digest, offset, data)

    async def async_prometheus(self) -> bytes:
        """This daemon in the Prometheus text format (:mod:`gpulayerd.app.openmetrics`).

        Raises:
            BadRequest: no exporter here.
        """
        if self.openmetrics is None:
            raise BadRequest("this daemon exports no metrics")
        return await self.openmetrics.render()

    def background(self) -> list[tuple[str, Loop]]:
        """The loops the API's parts need: the history's retention."""
        return [("history", self.accounting.retention_loop)] if self.accounting is not None else []

    async def async_report(self, since_s: float, by: str, scope: str) -> ReportView:
        """See :meth:`Accounting.report` (``scope`` ``lab``: :meth:`Accounting.lab_report`).

        Raises:
            BadRequest: a ``by`` or ``since_s`` it refuses; no accounting here.
        """
        if self.accounting is None:
            raise BadRequest("this daemon keeps no accounting")
        try:
            if scope == "lab":
                return await self.accounting.lab_report(since_s, by)
            return await self.accounting.report(since_s, by)
        except ValueError as e:
            raise BadRequest(str(e)) from None

    async def async_fetch(self, job_ref: str, request: FetchRequest, requester: Requester) -> FetchChunk:
        """See :meth:`ShipServer.files`. Raises BadRequest: no shipping here (and see there)."""
        if self._shipping is None:
            raise BadRequest("this daemon does not take shipped jobs")
        return await self._shipping.files(requester, job_ref, request)

    async def async_list_jobs(self, statuses: list[str] | None, limit: int | None,
                              scope: str = "local", requester: Requester | None = None,
                              query: JobsQuery | None = None) -> list[JobView]:
        """See :meth:`OwnerService.list_jobs` (``query``: the daemon-side filters, see there); with
        ``scope="cluster"`` also the runs held here whose owner did not answer (as this machine
        knows them), so the machine running a job lists it even while its owner is down."""
        jobs = await self._owner.list_jobs(statuses, limit, scope, requester, query=query)
        remote = self._remote_jobs()
        if scope != "cluster" or remote is None:
            return jobs
        held = await remote.held_views({j.id for j in jobs}, requester)
        held = [j for j in held if (not statuses or j.status in statuses)
                and (query is None or query.user is None or job_user(j.spec.user, j.submitted_by) == query.user)
                and (query is None or query.ids is None or j.id in query.ids)]
        return jobs + held

    # Any job of the cluster (RemoteJobs): a job owned elsewhere is asked of its owner, or of a
    # worker that holds a run of it when the owner does not answer.

    def _remote_jobs(self) -> RemoteJobs | None:
        return self._remote

    async def async_get_job(self, job_ref: str, requester: Requester | None = None) -> JobView:
        """See :meth:`OwnerService.get_job` and :meth:`RemoteJobs.show` (any job of the cluster)."""
        remote = self._remote_jobs()
        if remote is not None:
            return await remote.show(job_ref, requester)
        return await self._owner.get_job(job_ref, requester)

    async def async_explain(self, job_ref: str, requester: Requester | None = None) -> ExplanationModel:
        """See :meth:`OwnerService.explain` and :meth:`RemoteJobs.explain` (any job of the cluster)."""
        remote = self._remote_jobs()
        if remote is not None:
            return await remote.explain(job_ref, requester)
        return await self._owner.explain(job_ref, requester)

    async def async_cancel(self, job_ref: str, requester: Requester | None = None, signal: str = "") -> JobView:
        """See :meth:`OwnerService.cancel` and :meth:`RemoteJobs.cancel` (any job of the cluster)."""
        remote = self._remote_jobs()
        if remote is not None:
            return await remote.cancel(job_ref, requester, signal)
        return await self._owner.cancel(job_ref, requester, signal)

    async def async_logs(self, job_ref: str, stream: str, offset: int, attempt: int | None,
                         requester: Requester | None = None, rank: int | None = None,
                         limit: int | None = None) -> LogChunk:
        """See :meth:`OwnerService.logs` and :meth:`RemoteJobs.logs` (any job of the cluster)."""
        remote = self._remote_jobs()
        if remote is not None:
            return await remote.logs(job_ref, stream, offset, attempt, requester, rank=rank, limit=limit)
        return await self._owner.logs(job_ref, stream, offset, attempt, requester, rank=rank, limit=limit)

    # ------------------------------------------------------------------ fair share (GET /v1/users)

    async def async_metrics(self) -> MetricsView:
        """See :meth:`MetricsService.view`; unbound: no metrics, said so."""
        metrics = self._metrics
        if metrics is None:
            return MetricsView(available=False, message="this daemon samples no metrics")
        return await metrics.view()

    async def async_users(self) -> list[UserUsageView]:
        """Every user known to fair share, in priority order (see :meth:`UsageService.views`)."""
        usage = self._usage
        if usage is None:
            return []
        jobs = await self._owner.list_jobs(["queued", "running"], None)
        names = self._names
        return usage.views([(j.submitted_by or "", j.status) for j in jobs if j.array is None],  # tasks, not arrays
                           names.name_of if names is not None else lambda _n: None)
