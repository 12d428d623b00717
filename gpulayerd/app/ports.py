"""The narrow interfaces between the services and the cluster (protocols only: no behaviour here).

The services reach other daemons through a :class:`PeerTransport` (the mutual-TLS
client in production, a loopback one in unit tests) and learn about them from a
:class:`Directory`; both are implemented by :class:`gpulayerd.app.cluster.ClusterNode`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pydantic import BaseModel

from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.models import PeerView

__all__ = ["Directory", "PeerTransport"]

M = TypeVar("M", bound=BaseModel)


class PeerTransport(Protocol):
    """Calls another daemon's peer API by node id."""

    async def call(self, node_id: str, path: str, body: BaseModel | None, reply: type[M]) -> M:
        """POST ``body`` to ``path`` on ``node_id`` and parse the answer as ``reply``.

        Raises:
            PeerCallError: unknown peer, unreachable, refused, timed out, or an error reply.
        """
        ...


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

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every trusted peer with known capabilities, offline ones marked so."""
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
