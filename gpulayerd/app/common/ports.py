"""The narrow interfaces between the services and the cluster (protocols only: no behaviour here).

The services reach other daemons through a :class:`~gpulayerd.net.transport.PeerTransport`
(defined below the services: the mutual-TLS client in production, a loopback one in unit
tests) and learn about them from a :class:`Directory`; both are implemented by
:class:`gpulayerd.app.cluster.node.ClusterNode`.
"""

from __future__ import annotations

from typing import Protocol

from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.models import PeerView
from gpulayerd.net.transport import PeerTransport

__all__ = ["Directory", "PeerTransport"]


class Directory(Protocol):
    """What the services know of the cluster: its members, their names, where this node listens."""

    @property
    def cluster_id(self) -> str:
        """The cluster's id."""
        ...

    @property
    def port(self) -> int:
        """The peer API's TCP port on this node."""
        ...

    @property
    def addresses(self) -> list[str]:
        """This node's LAN addresses (IP literals), best first."""
        ...

    @property
    def interface(self) -> str | None:
        """The network interface of the first LAN address (for GLOO/NCCL_SOCKET_IFNAME)."""
        ...

    @property
    def removed(self) -> bool:
        """Whether this node was removed from the cluster (members refuse it)."""
        ...

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every trusted peer with known capabilities, offline ones marked so."""
        ...

    def snapshot_of(self, node_id: str) -> WorkerSnapshot | None:
        """One trusted peer's snapshot as :meth:`worker_snapshots` gives it; None if not known."""
        ...

    def name_of(self, node_id: str) -> str | None:
        """A peer's host name, if known."""
        ...

    def trusted_ids(self) -> list[str]:
        """Node ids of every trusted peer."""
        ...

    def up_ids(self) -> list[str]:
        """Node ids of the trusted peers that answer heartbeats now."""
        ...

    def views(self) -> list[PeerView]:
        """Every peer, for ``gpulayer peers``."""
        ...
