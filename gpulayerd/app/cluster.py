"""This daemon on the LAN: membership (mDNS + static peers + heartbeats) and the peer API.

:class:`ClusterNode` owns the peer table, the mDNS service, the peer API server and
the client that calls other daemons; it is the services' :class:`~gpulayerd.app.ports.PeerTransport`
and :class:`~gpulayerd.app.ports.Directory`, and dispatches authenticated peer messages
to the service that handles each (owner, worker, gang member). Membership is advisory:
the owner's compare-and-set and the leases keep placement safe whatever the heartbeats say.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from gpulayerd.api.peer import PeerCallError, PeerClient, close_connections_of, make_peer_app, start_peer_site
from gpulayerd.app.clock import Clock
from gpulayerd.app.machine import Machine
from gpulayerd.app.member import GangMember
from gpulayerd.app.owner import OwnerService
from gpulayerd.app.remote_jobs import RemoteJobs
from gpulayerd.app.signals import Signals
from gpulayerd.app.trust import Trust
from gpulayerd.app.usage import UsageService
from gpulayerd.app.worker import WorkerService
from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.models import Capabilities, JobList, LogChunk, PeerView
from gpulayerd.net.peers import PeerTable
from gpulayerd.net.wire import (
    Ack,
    Claim,
    ClaimReply,
    Commit,
    Heartbeat,
    HeartbeatReply,
    Hold,
    HoldReply,
    JobMatches,
    JobReply,
    JobRequest,
    Kill,
    LogRequest,
    Offer,
    Release,
    RunReport,
    RunReportReply,
    new_msg_id,
)

if TYPE_CHECKING:
    from aiohttp import web

    from gpulayerd.config import DaemonConfig
    from gpulayerd.net.announcement import Announcement
    from gpulayerd.net.identity import Identity
    from gpulayerd.net.mdns import MdnsService
    from gpulayerd.store import Store

__all__ = ["ClusterNode"]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


class ClusterNode:
    """Membership and the peer API of one daemon in a cluster."""

    def __init__(self, *, config: DaemonConfig, identity: Identity, store: Store, signals: Signals, version: str,
                 hostname: str, clock: Clock, rng: random.Random) -> None:
        """Args: ``clock`` for heartbeat times and waits; ``rng`` for the mDNS ``ep`` (this life's token)."""
        from gpulayerd.net.tls import client_ssl_context

        assert identity.cluster_id is not None
        self._config = config
        self.identity = identity
        self.node_id = identity.node_id
        self.cluster_id = identity.cluster_id
        self._store = store
        self._signals = signals
        self._clock = clock
        self._machine: Machine | None = None
        self._owner: OwnerService | None = None
        self._worker: WorkerService | None = None
        self._member: GangMember | None = None
        self._usage: UsageService | None = None  # fair share (bind_usage)
        self._jobs: RemoteJobs | None = None  # peers' requests about jobs (bind_jobs)
        self._version = version
        self._hostname = hostname
        self.table = PeerTable(identity.node_id, identity.cluster_id,
                               suspect_after_s=config.suspect_after_s, down_after_s=config.down_after_s)
        self._client_ctx = client_ssl_context(identity)
        self.client = PeerClient(self._client_ctx, timeout_s=config.peer_timeout_s)
        self.trust = Trust(identity, clock)  # revocations, enrollment listener, certificate renewal
        self.trust.on_revoked = self._on_revoked
        self.port = 0
        self.addresses: list[str] = []
        self.interface: str | None = None
        self.ep = f"{rng.getrandbits(32):08x}"
        self._runner: web.AppRunner | None = None
        self._mdns: MdnsService | None = None
        self._announced: tuple[int | None, int | None] = (None, None)

    def bind(self, *, machine: Machine, owner: OwnerService, worker: WorkerService, member: GangMember) -> None:
        """The services that answer peer messages (set once at wiring, before :meth:`async_start`)."""
        self._machine, self._owner, self._worker, self._member = machine, owner, worker, member

    def bind_usage(self, usage: UsageService) -> None:
        """Fair share: heartbeats carry this node's holdings and feed the peers' into ``usage``."""
        self._usage = usage

    def bind_jobs(self, jobs: RemoteJobs) -> None:
        """Who answers peers' requests about jobs (``/v1/peer/job/...``; set once, at wiring)."""
        self._jobs = jobs

    def _holdings(self) -> dict[str, tuple[int, int]] | None:
        return self._usage.own_holdings() if self._usage is not None else None

    def _services(self) -> tuple[Machine, OwnerService, WorkerService, GangMember]:
        assert self._machine and self._owner and self._worker and self._member, "ClusterNode.bind() not called"
        return self._machine, self._owner, self._worker, self._member

    # ------------------------------------------------------------------ lifecycle

    async def async_start(self) -> None:
        """Serve the peer API, advertise over mDNS (unless disabled), add static peers."""
        from gpulayerd.net.interfaces import lan_addresses
        from gpulayerd.net.limits import ConnectionLimits
        from gpulayerd.net.tls import server_ssl_context

        host, _, port = self._config.listen.rpartition(":")
        await self.trust.load()
        app = make_peer_app(self, self.trust.is_revoked)
        cfg = self._config
        limits = ConnectionLimits.fitted(cfg.peer_max_connections, cfg.peer_max_connections_per_address,
                                         self._clock.monotonic)
        server_ctx = server_ssl_context(self.identity)
        self.trust.contexts = [server_ctx, self._client_ctx]
        self._runner, self.port = await start_peer_site(app, host or "0.0.0.0", int(port), server_ctx,
                                                        handshake_timeout_s=cfg.peer_handshake_timeout_s,
                                                        limits=limits)
        chosen = lan_addresses(self._config.interface)
        self.addresses = [ip for _, ip in chosen]
        self.interface = chosen[0][0] if chosen else None
        await self.trust.start_enrollment(host or "0.0.0.0", self.port, self.addresses)
        for entry in self._config.peers:
            h, _, p = entry.rpartition(":")
            self.table.add_static(h.strip("[]"), int(p))
        for node_id, _name, addresses, port_ in await self._store.peers.saved_peers():
            if node_id != self.node_id and addresses:
                self.table.add_static(addresses[0], port_)
        log.info("peer API on %s:%d (mutual TLS, cluster %s), LAN addresses %s", host or "0.0.0.0", self.port,
                 self.cluster_id, ", ".join(self.addresses) or "none")
        if self._config.mdns and self.addresses:
            await self._start_mdns()

    async def _start_mdns(self) -> None:
        from gpulayerd.net.mdns import MdnsService, MdnsUnavailable

        try:
            svc = MdnsService(self._announcement(), self.addresses, on_seen=self._on_seen, on_gone=self._on_gone)
            await svc.async_start()
        except MdnsUnavailable as e:
            log.warning("mDNS unavailable, continuing with static peers (--peer HOST:PORT): %s", e)
            return
        self._mdns = svc

    def _announcement(self) -> Announcement:
        from gpulayerd.net.announcement import Announcement

        gpus, free = self._services()[0].gpu_counts()
        self._announced = (gpus, free)
        return Announcement(node_id=self.node_id, name=self._hostname, addresses=tuple(self.addresses),
                            port=self.port, cluster=self.cluster_id, version=1, gpus=gpus, free=free, ep=self.ep)

    def _on_seen(self, a: Announcement) -> None:
        self.table.seen_mdns(a.node_id, a.name, list(a.addresses), a.port, a.cluster, str(a.version), a.ep)
        self._signals.peers_changed()

    def _on_gone(self, node_id: str) -> None:
        self.table.gone_mdns(node_id)
        self._signals.peers_changed()

    async def async_close(self) -> None:
        """Stop advertising and serving."""
        if self._mdns is not None:
            with contextlib.suppress(Exception):
                await self._mdns.async_stop()
            self._mdns = None
        await self.trust.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.client.close()

    # ------------------------------------------------------------------ loops

    async def async_heartbeat_loop(self) -> None:
        """Heartbeat every peer every ``heartbeat_interval_s``; fetch changed capabilities."""
        while True:
            if await self.trust.refresh():  # new revocations (gossip, or 'gpulayer cluster remove' here)
                await self._on_revoked()
            targets = [t for t in self.table.targets() if not self.trust.is_revoked(t.node_id or "")]
            if targets:
                await asyncio.gather(*(self._beat(t.key, t.host, t.port, t.node_id) for t in targets))
            await self._maybe_readvertise()
            await self._clock.sleep(self._config.heartbeat_interval_s)

    async def _maybe_readvertise(self) -> None:
        if self._mdns is None:
            return
        gpus, free = self._services()[0].gpu_counts()
        if (gpus, free) != self._announced:
            with contextlib.suppress(Exception):
                await self._mdns.async_update(self._announcement())

    async def _beat(self, key: str, host: str, port: int, node_id: str | None) -> None:
        msg = Heartbeat(msg_id=new_msg_id(), node_id=self.node_id, name=self._hostname, version=self._version,
                        cluster=self.cluster_id, port=self.port, addresses=self.addresses, ep=self.ep,
                        caps_digest=self._services()[0].caps_digest(), holdings=self._holdings(),
                        revoked=self.trust.entries())
        was_up = self._is_up(node_id)
        try:
            reply, proven = await self.client.call(host, port, "/v1/peer/heartbeat", msg, HeartbeatReply,
                                                   expect_node=node_id)
        except PeerCallError as e:
            self.table.heartbeat_failed(key)
            log.debug("heartbeat to %s (%s:%d) failed: %s", key[:12], host, port, e)
            if was_up:
                self._signals.peers_changed()
            return
        if reply.revoked:
            self.trust.offer(reply.revoked)
        if self.trust.is_revoked(proven):
            return
        p = self.table.heartbeat_ok(key, host, reply, proven, self._clock.monotonic(), self._clock.wall())
        if p is None:
            return
        if self._usage is not None and reply.cluster == self.cluster_id:
            self._usage.report(proven, reply.holdings, p.name)  # only what the proven sender holds itself
        if p.caps_digest != p.fetched_digest or p.caps is None:
            try:
                caps, _ = await self.client.call(host, port, "/v1/peer/capabilities", None, Capabilities,
                                                 expect_node=proven)
                p.caps = caps
                p.fetched_digest = p.caps_digest
                self._signals.wake()
            except PeerCallError as e:
                log.debug("capabilities of %s: %s", proven[:12], e)
        if not was_up:
            await self._store.peers.save_peer(proven, p.name, p.addresses, p.port, self._clock.wall())
            log.info("peer %s (%s) is up at %s:%d", p.name, proven[:12], host, port)
            self._signals.wake()
        self._signals.peers_changed()

    async def _on_revoked(self) -> None:
        """Newly revoked nodes: close their open connections to our peer port."""
        if self._runner is not None:
            n = close_connections_of(self._runner, self.trust.is_revoked)
            if n:
                log.info("closed %d connection(s) of revoked node(s)", n)
        # Pooled client connections to them stay idle until they time out: nothing calls a revoked node.
        self._signals.peers_changed()
        self._signals.wake()

    def _is_up(self, node_id: str | None) -> bool:
        if node_id is None:
            return False
        p = self.table.get(node_id)
        return p is not None and self.table.state(p, self._clock.monotonic()) == "up"

    # ------------------------------------------------------------------ queries

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every trusted peer with known capabilities, offline ones marked so."""
        now = self._clock.monotonic()
        out = []
        for p in self.table.trusted_peers():
            if p.caps is None or self.trust.is_revoked(p.key):
                continue
            # Everything the peer reports (its user fields too), under the name and id we know it by.
            out.append(dataclasses.replace(p.caps.to_core(), node_id=p.key, name=p.name,
                                           online=self.table.state(p, now) == "up"))
        return out

    def name_of(self, node_id: str) -> str | None:
        """A peer's host name."""
        p = self.table.get(node_id)
        return p.name if p is not None else None

    def views(self) -> list[PeerView]:
        """Every peer for ``gpulayer peers``."""
        return self.table.views(self._clock.monotonic())

    def trusted_ids(self) -> list[str]:
        """Node ids of every trusted peer."""
        return [p.key for p in self.table.trusted_peers() if not self.trust.is_revoked(p.key)]

    def up_ids(self) -> list[str]:
        """Node ids of the trusted peers that answer heartbeats now."""
        now = self._clock.monotonic()
        return [p.key for p in self.table.trusted_peers()
                if self.table.state(p, now) == "up" and not self.trust.is_revoked(p.key)]

    def address_of(self, node_id: str) -> tuple[str, int] | None:
        """Where to reach a trusted peer."""
        p = self.table.get(node_id)
        if p is None or not p.addresses:
            return None
        return p.addresses[0], p.port

    async def call(self, node_id: str, path: str, body: BaseModel | None, reply: type[_M]) -> _M:
        """Call a trusted peer by node id.

        Raises:
            PeerCallError: unknown peer or a failed call.
        """
        if self.trust.is_revoked(node_id):
            raise PeerCallError(f"peer {node_id[:12]} was removed from the cluster")
        where = self.address_of(node_id)
        if where is None:
            raise PeerCallError(f"peer {node_id[:12]} has no known address")
        result, _ = await self.client.call(where[0], where[1], path, body, reply, expect_node=node_id)
        return result

    # ------------------------------------------------------------------ peer API (PeerService)

    async def async_peer_heartbeat(self, sender: str, msg: Heartbeat, remote_ip: str) -> HeartbeatReply:
        """Answer a heartbeat; the sender is now a known, trusted peer."""
        if msg.revoked:
            self.trust.offer(msg.revoked)
        if msg.cluster == self.cluster_id:
            addrs = [remote_ip, *msg.addresses] if remote_ip else list(msg.addresses)
            self.table.seen_mdns(sender, msg.name, addrs, msg.port, msg.cluster, msg.version, msg.ep)
            if self._usage is not None:
                self._usage.report(sender, msg.holdings, msg.name)  # only what the TLS-proven sender holds
        return HeartbeatReply(node_id=self.node_id, name=self._hostname, version=self._version,
                              cluster=self.cluster_id, port=self.port, addresses=self.addresses, ep=self.ep,
                              caps_digest=self._services()[0].caps_digest(), holdings=self._holdings(),
                              revoked=self.trust.entries())

    async def async_peer_capabilities(self, sender: str) -> Capabilities:
        """Our capabilities with grant state."""
        return await self._services()[0].capabilities()

    async def async_peer_jobs(self, sender: str, statuses: list[str] | None) -> JobList:
        """The jobs we own (for a peer's ``gpulayer jobs``)."""
        return await self._services()[1].peer_jobs(sender, statuses)

    async def async_peer_offer(self, sender: str, msg: Offer, sender_mode: str, sender_user: str) -> Ack:
        """Keep an owner's offer (if its certificate vouches for the job's user and the account is
        here); the scheduler claims it when it fits here now."""
        return await self._services()[2].offer(sender, msg, sender_mode, sender_user)

    async def async_peer_claim(self, sender: str, msg: Claim) -> ClaimReply:
        """A worker claims one of our jobs: the owner's compare-and-set decides."""
        return await self._services()[1].claim(sender, msg)

    async def async_peer_report(self, sender: str, msg: RunReport) -> RunReportReply:
        """A worker reports on an attempt of one of our jobs."""
        return await self._services()[1].report(sender, msg)

    async def async_peer_kill(self, sender: str, msg: Kill) -> Ack:
        """An owner stops one of the attempts we run for it."""
        return await self._services()[2].kill(sender, msg)

    async def async_peer_logs(self, sender: str, msg: LogRequest) -> LogChunk:
        """Read the log of an attempt we run for ``sender`` (anyone else: PeerForbidden, a 403)."""
        return await self._services()[2].logs(sender, msg)

    async def async_peer_hold(self, sender: str, msg: Hold, sender_mode: str, sender_user: str) -> HoldReply:
        """Gang: reserve resources for a member (the sender vouching for the job's user, as for offers)."""
        return await self._services()[3].hold(sender, msg, sender_mode, sender_user)

    async def async_peer_release(self, sender: str, msg: Release) -> Ack:
        """Gang: drop a hold."""
        return await self._services()[3].release(sender, msg)

    async def async_peer_commit(self, sender: str, msg: Commit) -> Ack:
        """Gang: start our rank."""
        return await self._services()[3].commit(sender, msg)

    def _remote_jobs(self) -> RemoteJobs:
        assert self._jobs is not None, "ClusterNode.bind_jobs() not called"
        return self._jobs

    async def async_peer_job_find(self, sender: str, msg: JobRequest) -> JobMatches:
        """Which jobs we own, and runs we hold, have ids starting with ``msg.job_id``."""
        return await self._remote_jobs().find(sender, msg)

    async def async_peer_job(self, sender: str, action: str, msg: JobRequest, sender_mode: str,
                             sender_user: str) -> JobReply:
        """A person on ``sender`` asks about a job (see :meth:`RemoteJobs.answer`: the name is
        believed as far as the sender's certificate vouches)."""
        return await self._remote_jobs().answer(sender, action, msg, sender_mode, sender_user)
