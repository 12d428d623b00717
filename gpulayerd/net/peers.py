"""Membership: which gpulayerd peers we know, whether they answer, what they offer.

Advisory only: safety never depends on it (leases and the owner's compare-and-set do).
Peers come from mDNS announcements and from static ``--peer HOST:PORT`` entries; a peer
counts as trusted only after a heartbeat over mutual TLS succeeded, and its node id is
the one its certificate proves. A peer announced with another cluster id is listed as
foreign and never contacted. Time comes in as arguments (monotonic seconds).


(Same name as :mod:`gpulayerd.store.peers`: the same idea (the peers we know), in memory here and on
disk there.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulayerd.core.types import Accelerator
from gpulayerd.models import Capabilities, PeerView
from gpulayerd.net.wire import HeartbeatReply

__all__ = ["Peer", "PeerTable", "Target"]


@dataclass
class Peer:
    """What we know of one peer.

    Attributes:
        key: node id, or ``static:HOST:PORT`` for a static peer not yet contacted.
        node_id: proven by its TLS certificate (None until then, for static peers).
        addresses: IP literals to reach it (the first one that answered comes first).
        last_ok_mono: monotonic time of the last successful heartbeat.
        last_ok_wall: the same in wall-clock seconds (for display).
        caps: its capabilities, fetched when ``caps_digest`` changes.
        proven_mode: its mode as its certificate proves it (``system``/``personal``; "" until a
            mutual-TLS exchange with it): whose jobs it may run is judged from this, never from
            what its capabilities say.
        proven_user: the user its (personal-mode) certificate is bound to.
    """

    key: str
    node_id: str | None
    name: str
    addresses: list[str]
    port: int
    cluster: str = ""
    version: str = ""
    ep: str = ""
    static: bool = False
    foreign: bool = False
    trusted: bool = False
    last_ok_mono: float | None = None
    last_ok_wall: float | None = None
    failures: int = 0
    caps: Capabilities | None = None
    caps_digest: str = ""
    fetched_digest: str = ""
    proven_mode: str = ""
    proven_user: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """Where to send the next heartbeat."""

    key: str
    host: str
    port: int
    node_id: str | None


@dataclass
class PeerTable:
    """All peers, keyed by node id (or by static address until the node id is known)."""

    my_node_id: str
    my_cluster: str
    suspect_after_s: float = 3.0
    down_after_s: float = 10.0
    peers: dict[str, Peer] = field(default_factory=dict)
    # node id -> (the capabilities counted, (GPUs, CPU slots) they advertise): see advertised()
    _advertised: dict[str, tuple[Capabilities, tuple[int, int | None]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    # --------------------------------------------------------------- inputs

    def add_static(self, host: str, port: int) -> None:
        """A ``--peer HOST:PORT`` entry."""
        key = f"static:{host}:{port}"
        if any(host in p.addresses and p.port == port for p in self.peers.values()):
            return
        self.peers.setdefault(key, Peer(key=key, node_id=None, name=host, addresses=[host], port=port,
                                        static=True))

    def seen_mdns(self, node_id: str, name: str, addresses: list[str], port: int, cluster: str,
                  version: str, ep: str) -> None:
        """An mDNS announcement (never trusted by itself)."""
        if node_id == self.my_node_id:
            return
        p = self.peers.get(node_id)
        if p is None:
            p = self.peers[node_id] = Peer(key=node_id, node_id=None, name=name, addresses=list(addresses),
                                           port=port)
        p.name = name or p.name
        p.addresses = _merge(addresses, p.addresses)
        p.port = port
        p.cluster = cluster
        p.version = version
        if ep and ep != p.ep:
            p.ep = ep
            p.fetched_digest = ""  # a restarted daemon: fetch its capabilities again
        p.foreign = cluster != self.my_cluster

    def gone_mdns(self, node_id: str) -> None:
        """mDNS says goodbye; liveness still comes from heartbeats, so only foreign entries go."""
        p = self.peers.get(node_id)
        if p is not None and p.foreign:
            del self.peers[node_id]

    def heartbeat_ok(self, key: str, host: str, reply: HeartbeatReply, cert_node_id: str,
                     now_mono: float, now_wall: float) -> Peer | None:
        """A heartbeat to ``key`` at ``host`` was answered by ``cert_node_id`` (proven by TLS).

        Returns:
            The peer, or None if the answer came from ourselves (a static entry pointing at us).
        """
        if cert_node_id == self.my_node_id:
            self.peers.pop(key, None)
            return None
        old = self.peers.pop(key, None)
        p = self.peers.get(cert_node_id)
        if p is None:
            p = old or Peer(key=cert_node_id, node_id=None, name=reply.name, addresses=[host], port=reply.port)
            p.key = cert_node_id
            self.peers[cert_node_id] = p
        if old is not None and old is not p:
            p.static = p.static or old.static
        p.node_id = cert_node_id
        p.name = reply.name
        p.addresses = _merge([host], _merge(reply.addresses, p.addresses))
        p.port = reply.port
        p.cluster = reply.cluster
        p.version = reply.version
        if reply.ep != p.ep:
            p.ep = reply.ep
            p.fetched_digest = ""
        p.caps_digest = reply.caps_digest
        p.trusted = True
        p.foreign = False
        p.failures = 0
        p.last_ok_mono = now_mono
        p.last_ok_wall = now_wall
        return p

    def heartbeat_failed(self, key: str) -> None:
        """A heartbeat to ``key`` failed (timeout, refused, TLS error)."""
        p = self.peers.get(key)
        if p is not None:
            p.failures += 1

    # -------------------------------------------------------------- queries

    def targets(self) -> list[Target]:
        """Peers to heartbeat now: every non-foreign peer, first address first."""
        out = []
        for p in sorted(self.peers.values(), key=lambda p: p.key):
            if p.foreign or not p.addresses:
                continue
            host = p.addresses[p.failures % len(p.addresses)] if p.failures else p.addresses[0]
            out.append(Target(p.key, host, p.port, p.node_id))
        return out

    def state(self, p: Peer, now_mono: float) -> str:
        """``foreign``, ``up``, ``suspect`` (missed beats) or ``down``."""
        if p.foreign:
            return "foreign"
        if p.last_ok_mono is None:
            return "down"
        age = now_mono - p.last_ok_mono
        if age <= self.suspect_after_s:
            return "up"
        return "suspect" if age <= self.down_after_s else "down"

    def trusted_peers(self) -> list[Peer]:
        """Peers that proved cluster membership at least once, by node id."""
        return sorted((p for p in self.peers.values() if p.trusted and p.node_id), key=lambda p: p.key)

    def get(self, node_id: str) -> Peer | None:
        """The peer with this node id, if known."""
        return self.peers.get(node_id)

    def advertised(self, node_id: str) -> tuple[int, int | None]:
        """(GPUs, CPU slots) that the node's last capabilities advertise, what a holdings report from it
        is checked against (``(0, 0)`` before any; CPU slots None: no limit set). GPUs count every
        device that is not a CPU."""
        p = self.peers.get(node_id)
        caps = p.caps if p is not None else None
        if caps is None:
            return 0, 0
        kept = self._advertised.get(node_id)  # asked at every heartbeat and reply: counted once per fetch
        if kept is None or kept[0] is not caps:
            kept = (caps, (sum(1 for d in caps.devices if d.accelerator is not Accelerator.CPU), caps.cpu_slots_total))
            self._advertised[node_id] = kept
        return kept[1]

    def views(self, now_mono: float) -> list[PeerView]:
        """Every peer as the API shows it, ordered by node id."""
        return [
            PeerView(
                node_id=p.node_id or p.key, name=p.name, addresses=list(p.addresses), port=p.port,
                version=p.version or None, cluster=p.cluster or None, trusted=p.trusted and not p.foreign,
                state=self.state(p, now_mono), last_heartbeat_at=p.last_ok_wall, capabilities=p.caps,
            )
            for p in sorted(self.peers.values(), key=lambda p: p.key)
        ]


def _merge(first: list[str], rest: list[str]) -> list[str]:
    out: list[str] = []
    for a in [*first, *rest]:
        if a and a not in out:
            out.append(a)
    return out
