"""This daemon on the LAN: membership (mDNS + static peers + heartbeats), trust, and its place in the peer API.

:class:`ClusterNode` owns the peer table, the mDNS service and the client that calls other
daemons; it is the services' :class:`~gpulayerd.net.transport.PeerTransport` and
:class:`~gpulayerd.app.common.ports.Directory`, and it answers two peer routes itself (``heartbeat``,
``capabilities``). The peer API's listener and the mutual-TLS client come from a
:class:`~gpulayerd.net.transport.PeerNetwork` (built from the route table above this layer and
passed in by the composition root); every message is dispatched, after its role check, by the
peer router (:class:`gpulayerd.api.peer.PeerRouter`). Membership is advisory: the owner's
compare-and-set and the leases keep placement safe whatever the heartbeats say.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel

from gpulayerd.app.cluster.trust import Trust
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core.fairshare import credible_holdings
from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.errors import PeerCallError, PeerRefused
from gpulayerd.models import Capabilities, PeerView
from gpulayerd.net.peers import Peer, PeerTable
from gpulayerd.net.transport import CAPABILITIES, HEARTBEAT, PeerNetwork, PeerRoute, Sender
from gpulayerd.net.wire import Heartbeat, HeartbeatReply, new_msg_id

if TYPE_CHECKING:
    from gpulayerd.config import DaemonConfig
    from gpulayerd.net.announcement import Announcement
    from gpulayerd.net.identity import Identity
    from gpulayerd.net.mdns import MdnsService
    from gpulayerd.store import Store

__all__ = ["ClusterNode", "PeerSnapshots"]

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


class ClusterNode:
    """Membership and the peer API of one daemon in a cluster.

    Args:
        network: the mutual-TLS client and listeners (:class:`gpulayerd.api.peer.TlsNetwork`).
        clock: heartbeat times and waits. rng: the mDNS ``ep`` (this life's token).
        machine: this machine (its capabilities and GPU counts, for heartbeats and mDNS).
        usage: the fair-share book heartbeats feed (None: holdings are neither sent nor taken).
    """

    def __init__(self, *, config: DaemonConfig, identity: Identity, store: Store, signals: Signals, version: str,
                 hostname: str, clock: Clock, rng: random.Random, network: PeerNetwork, machine: Machine,
                 usage: UsageService | None = None) -> None:
        from gpulayerd.net.tls import client_ssl_context

        assert identity.cluster_id is not None
        self._config = config
        self.identity = identity
        self.node_id = identity.node_id
        self.cluster_id = identity.cluster_id
        self._store = store
        self._signals = signals
        self._clock = clock
        self._network = network
        self._machine = machine  # capabilities, GPU counts
        self._usage = usage  # the fair-share book heartbeats feed
        self._version = version
        self._hostname = hostname
        self.table = PeerTable(identity.node_id, identity.cluster_id,
                               suspect_after_s=config.suspect_after_s, down_after_s=config.down_after_s)
        self._client_ctx = client_ssl_context(identity)
        self.client = network.connector(self._client_ctx, config.peer_timeout_s)
        self.trust = Trust(identity, clock, network)  # revocations, enrollment listener, certificate renewal
        self.trust.on_revoked = self._on_revoked
        self.port = 0
        self.addresses: list[str] = []
        self.interface: str | None = None
        self.ep = f"{rng.getrandbits(32):08x}"
        self._serving = False
        self._mdns: MdnsService | None = None
        self._announced: tuple[int | None, int | None] = (None, None)
        self._holdings_refused: set[str] = set()
        self._snapshots = PeerSnapshots(usage)  # each peer's snapshot, made again when it changed

    def _holdings(self) -> dict[str, tuple[int, int]] | None:
        return self._usage.own_holdings() if self._usage is not None else None

    def _machine_(self) -> Machine:
        return self._machine

    # ------------------------------------------------------------------ lifecycle

    async def async_start(self) -> None:
        """Serve the peer API, advertise over mDNS (unless disabled), add static peers."""
        from gpulayerd.net.interfaces import lan_addresses
        from gpulayerd.net.limits import ConnectionLimits
        from gpulayerd.net.tls import server_ssl_context

        host, _, port = self._config.listen.rpartition(":")
        await self.trust.load()
        cfg = self._config
        limits = ConnectionLimits.fitted(cfg.peer_max_connections, cfg.peer_max_connections_per_address,
                                         self._clock.monotonic, unauthenticated=cfg.peer_max_unauthenticated)
        server_ctx = server_ssl_context(self.identity)
        self.trust.contexts = [server_ctx, self._client_ctx]
        self.port = await self._network.serve_peer(host or "0.0.0.0", int(port), server_ctx,
                                                   handshake_timeout_s=cfg.peer_handshake_timeout_s, limits=limits,
                                                   is_revoked=self.trust.is_revoked)
        self._serving = True
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

        gpus, free = self._machine_().gpu_counts()
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
        await self._network.close()
        self._serving = False
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
        gpus, free = self._machine_().gpu_counts()
        if (gpus, free) != self._announced:
            with contextlib.suppress(Exception):
                await self._mdns.async_update(self._announcement())

    async def _beat(self, key: str, host: str, port: int, node_id: str | None) -> None:
        msg = Heartbeat(msg_id=new_msg_id(), node_id=self.node_id, name=self._hostname, version=self._version,
                        cluster=self.cluster_id, port=self.port, addresses=self.addresses, ep=self.ep,
                        caps_digest=self._machine_().caps_digest(), holdings=self._holdings(),
                        revoked=self.trust.entries())
        was_up = self._is_up(node_id)
        try:
            reply, who = await self.client.call_at(host, port, HEARTBEAT, msg, expect_node=node_id)
        except PeerCallError as e:
            if isinstance(e, PeerRefused) and "this node was removed from the cluster" in e.reason:
                await self.trust.note_removed(e.reason)
            self.table.heartbeat_failed(key)
            log.debug("heartbeat to %s (%s:%d) failed: %s", key[:12], host, port, e)
            if was_up:
                self._signals.peers_changed()
            return
        proven = who.node_id
        if reply.revoked:
            self.trust.offer(reply.revoked)
        if self.trust.is_revoked(proven):
            return
        p = self.table.heartbeat_ok(key, host, reply, proven, self._clock.monotonic(), self._clock.wall())
        if p is None:
            return
        p.proven_mode, p.proven_user = who.mode, who.user
        if reply.cluster == self.cluster_id:
            self._take_holdings(Sender.of(who, host), reply.holdings, p.name)  # only what the proven node holds
        if p.caps_digest != p.fetched_digest or p.caps is None:
            try:
                caps, _ = await self.client.call_at(host, port, CAPABILITIES, None, expect_node=proven)
                p.caps = caps
                p.fetched_digest = p.caps_digest
                self._signals.peer_wake()
            except PeerCallError as e:
                log.debug("capabilities of %s: %s", proven[:12], e)
        if not was_up:
            await self._store.peers.save_peer(proven, p.name, p.addresses, p.port, self._clock.wall())
            log.info("peer %s (%s) is up at %s:%d", p.name, proven[:12], host, port)
            self._signals.peer_wake()
        self._signals.peers_changed()

    async def _on_revoked(self) -> None:
        """Newly revoked nodes: close their open connections to our peer port."""
        if self._serving:
            n = self._network.close_revoked(self.trust.is_revoked)
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

    # ------------------------------------------------------------------ queries (Directory)

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every trusted peer with known capabilities, offline ones marked so; none once this node was
        removed from the cluster (the members refuse it: its jobs are judged against this machine alone,
        never "fits a member but it is offline")."""
        if self.trust.removed:
            return []
        now = self._clock.monotonic()
        out = []
        for p in self.table.trusted_peers():
            if p.caps is None or self.trust.is_revoked(p.key):
                continue
            out.append(self._snapshot(p, p.caps, now))
        return out

    def snapshot_of(self, node_id: str) -> WorkerSnapshot | None:
        """One trusted peer's snapshot (see :meth:`worker_snapshots`); None if not known."""
        p = self.table.get(node_id)
        if p is None or p.caps is None or not p.trusted or self.trust.is_revoked(p.key):
            return None
        return self._snapshot(p, p.caps, self._clock.monotonic())

    def _snapshot(self, p: Peer, caps: Capabilities, now: float) -> WorkerSnapshot:
        """What the peer reports (:class:`PeerSnapshots`), online if it answers heartbeats now."""
        return self._snapshots.get(p, caps, online=self.table.state(p, now) == "up")

    def name_of(self, node_id: str) -> str | None:
        """A peer's host name."""
        p = self.table.get(node_id)
        return p.name if p is not None else None

    def views(self) -> list[PeerView]:
        """Every peer for ``gpulayer peers``; one removed from the cluster is in state ``removed``."""
        return [v.model_copy(update={"state": "removed"}) if self.trust.is_revoked(v.node_id) else v
                for v in self.table.views(self._clock.monotonic())]

    @property
    def removed(self) -> bool:
        """Whether this node was removed from the cluster (:attr:`ClusterTrust.removed`)."""
        return self.trust.removed

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

    async def call(self, node_id: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Call a trusted peer by node id (the :class:`~gpulayerd.net.transport.PeerTransport`).

        Raises:
            PeerRefused: a 403. PeerCallError: unknown peer or a failed call.
        """
        if self.trust.is_revoked(node_id):
            raise PeerCallError(f"peer {node_id[:12]} was removed from the cluster")
        where = self.address_of(node_id)
        if where is None:
            raise PeerCallError(f"peer {node_id[:12]} has no known address")
        result, _ = await self.client.call_at(where[0], where[1], route, body, expect_node=node_id)
        return result

    # ------------------------------------------------------------------ peer routes (handlers)

    async def heartbeat(self, sender: Sender, msg: Heartbeat) -> HeartbeatReply:
        """Peer route ``heartbeat`` (any member): answer a heartbeat; the sender is now a known,
        trusted peer. Its holdings count for fair share only as far as they can be true
        (:func:`~gpulayerd.core.fairshare.credible_holdings`)."""
        if msg.revoked:
            self.trust.offer(msg.revoked)
        if msg.cluster == self.cluster_id:
            addrs = [sender.address, *msg.addresses] if sender.address else list(msg.addresses)
            self.table.seen_mdns(sender.node_id, msg.name, addrs, msg.port, msg.cluster, msg.version, msg.ep)
            known = self.table.get(sender.node_id)
            if known is not None and sender.mode:
                known.proven_mode, known.proven_user = sender.mode, sender.user
            self._take_holdings(sender, msg.holdings, msg.name)
        return HeartbeatReply(node_id=self.node_id, name=self._hostname, version=self._version,
                              cluster=self.cluster_id, port=self.port, addresses=self.addresses, ep=self.ep,
                              caps_digest=self._machine_().caps_digest(), holdings=self._holdings(),
                              revoked=self.trust.entries())

    def _take_holdings(self, sender: Sender, holdings: dict[str, tuple[int, int]] | None, name: str) -> None:
        """Fair share: what the TLS-proven ``sender`` says it holds, as far as it can be true."""
        if self._usage is None or holdings is None:
            return
        gpus, slots = self.table.advertised(sender.node_id)
        kept, why = credible_holdings(holdings, sender_mode=sender.mode, sender_user=sender.user,
                                      gpus_advertised=gpus, slots_advertised=slots)
        if why is not None:
            self._refused_holdings(sender.node_id, why)
        self._usage.report(sender.node_id, kept, name)

    def _refused_holdings(self, node_id: str, why: str) -> None:
        self._signals.stats["refused_holdings"] += 1
        first = node_id not in self._holdings_refused
        if first:
            if len(self._holdings_refused) > 4096:
                self._holdings_refused.clear()
            self._holdings_refused.add(node_id)
        log.log(logging.WARNING if first else logging.DEBUG, "holdings of peer %s not counted: %s%s", node_id[:12],
                why, " (further ones are logged at debug level)" if first else "")


class PeerSnapshots:
    """Each peer's :class:`~gpulayerd.core.types.WorkerSnapshot` as this node sees it, the same
    object until something it reads changed (the scheduler freezes each peer's snapshot by
    identity, see :class:`~gpulayerd.core.matching.shapes.FreezeMemo`, so an unchanged peer costs
    it a lookup per pass).

    A snapshot is what the peer reports, under the name and id we know it by, with its mode and
    user as its certificate proves them (what it says of itself decides nothing about whose jobs,
    and so whose commands and environment, it is sent: a peer not yet proven counts as a personal
    node of no user, which runs nobody's jobs). The core snapshot of its capabilities is made once
    per fetch of them; the GPUs each user holds there are what its last heartbeat reported (fair
    share and the per-user cap read them).

    Args:
        usage: the fair-share book (the GPUs each user holds on each peer); None: none held.
    """

    def __init__(self, usage: UsageService | None) -> None:
        self._usage = usage
        self._cores: dict[str, tuple[Capabilities, WorkerSnapshot]] = {}  # peer -> (its caps, their core snapshot)
        # peer -> (what its last snapshot read: core, name, online, held, mode, user; that snapshot)
        self._made: dict[str, tuple[tuple[object, ...], WorkerSnapshot]] = {}

    def get(self, p: Peer, caps: Capabilities, *, online: bool) -> WorkerSnapshot:
        """Peer ``p``'s snapshot from ``caps`` (its last fetched capabilities), ``online`` or not."""
        made = self._cores.get(p.key)
        if made is None or made[0] is not caps:
            made = (caps, caps.to_core())
            self._cores[p.key] = made
        held = self._usage.gpus_held_on(p.key) if self._usage is not None else {}
        reads = (made[1], p.name, online, held, p.proven_mode or "personal", p.proven_user)
        last = self._made.get(p.key)
        if last is not None and last[0][0] is made[1] and last[0][1:] == reads[1:]:
            return last[1]
        snapshot = dataclasses.replace(made[1], node_id=p.key, name=p.name, online=online, gpus_held_by_user=held,
                                       mode=reads[4], user=p.proven_user)
        self._made[p.key] = (reads, snapshot)
        return snapshot
