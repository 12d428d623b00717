"""In-process daemons calling each other: a loopback :class:`PeerTransport` and :class:`Directory`.

A :class:`LoopbackNetwork` joins the daemons of one test (one event loop). Each daemon's
:class:`LoopbackNode` is its peer transport and its directory: a call to another node id is
delivered to that daemon's peer router (:class:`gpulayerd.api.peer.PeerRouter`, built from the
route table: the role check, then the handler), as the mutual-TLS peer API would deliver it
(the sender is the caller's node id with the ``mode`` and ``user`` its certificate would give;
the message and the reply go through JSON so that nothing is shared). Faults, per node, for
calls to and from it:

- ``refuse``: the call fails at once (a host that is down: connection refused);
- ``hang``: the call is never answered; it fails with a timeout once the fake clock has
  moved ``call_timeout_s`` past its start (the client's timeout), like a host that stopped
  answering without closing its connections.

:meth:`LoopbackNetwork.lose_replies` loses the replies of the next calls on one route to one
node: the handler runs (what it decided stands) and the caller gets a connection reset.

:meth:`LoopbackNetwork.crash` removes a node: every call to it fails, and calls hung on it
fail too (connections reset). :meth:`LoopbackNetwork.heartbeat` is one heartbeat round:
every node fetches the capabilities of every node it can reach; a node is up for another
while its last answered heartbeat is at most ``suspect_after_s`` old.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.errors import PeerBadRequest, PeerCallError, PeerRefused
from gpulayerd.models import Capabilities, PeerView
from gpulayerd.net.transport import PeerDispatch, PeerRoute, Sender

from .clock import FakeClock

__all__ = ["Call", "Fault", "LoopbackNetwork", "LoopbackNode"]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

Fault = Literal["refuse", "hang"]


@dataclass(frozen=True)
class Call:
    """One call made over the network (for assertions): who, to whom, what, and how it ended."""

    sender: str
    target: str
    path: str
    body: BaseModel | None
    outcome: str  # "ok", "refused", "timed out", "reset", "403: ...", "400: ...", "error: ..."


class LoopbackNetwork:
    """The daemons of one test and the faults between them.

    Args:
        clock: the fake clock (hung calls time out on it).
        call_timeout_s: how long a hung call waits before it fails (the peer client's timeout).
        suspect_after_s: a node whose last answered heartbeat is older than this is not up.
        cluster_id: the cluster every node reports.
    """

    def __init__(self, clock: FakeClock, *, call_timeout_s: float = 3.0, suspect_after_s: float = 3.0,
                 cluster_id: str = "loopbackcluster0") -> None:
        self.clock = clock
        self.call_timeout_s = call_timeout_s
        self.suspect_after_s = suspect_after_s
        self.cluster_id = cluster_id
        self.nodes: dict[str, LoopbackNode] = {}
        self.faults: dict[str, Fault] = {}
        self.calls: list[Call] = []
        self.errors: list[str] = []  # handler exceptions (a test should end with none)
        self._hung: list[tuple[float, str, str, asyncio.Future[None]]] = []  # deadline, sender, target, future
        self._lose: dict[tuple[str, str], int] = {}  # (target, path) -> replies still to lose
        self._held: dict[tuple[str, str], asyncio.Future[None]] = {}  # (target, path) -> done when let go
        self._waiting: list[asyncio.Future[None]] = []  # the calls waiting on a hold

    def node(self, node_id: str, name: str, *, router: PeerDispatch, machine: Machine,
             usage: UsageService | None = None) -> LoopbackNode:
        """The node ``node_id`` joins (or re-joins, after a restart) the network, answered by ``router``."""
        node = LoopbackNode(self, node_id, name, router=router, machine=machine, usage=usage)
        old = self.nodes.get(node_id)
        if old is not None:
            node.seen = dict(old.seen)
        self.nodes[node_id] = node
        return node

    def fault(self, node_id: str, fault: Fault | None) -> None:
        """Set (or with None, clear) the fault of every call to and from ``node_id``."""
        if fault is None:
            self.faults.pop(node_id, None)
        else:
            self.faults[node_id] = fault

    def lose_replies(self, target: str, route: PeerRoute[Any, Any], n: int = 1) -> None:
        """The next ``n`` calls on ``route`` to ``target`` are handled there, and their replies lost."""
        self._lose[(target, route.path)] = n

    def hold(self, target: str, route: PeerRoute[Any, Any]) -> asyncio.Future[None]:
        """Calls on ``route`` to ``target`` wait (idle) until the future returned is set, then go on."""
        held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held[(target, route.path)] = held
        return held

    def crash(self, node_id: str) -> None:
        """``node_id`` is gone: calls to it fail, and calls hung on it fail now (connection reset)."""
        self.nodes.pop(node_id, None)
        for _, sender, target, fut in self._hung:
            if node_id in (sender, target) and not fut.done():
                fut.set_exception(PeerCallError(f"connection to {target[:12]} reset"))

    def expire_calls(self) -> None:
        """Fail the hung calls whose timeout passed on the fake clock (call after advancing it)."""
        now = self.clock.monotonic()
        keep = []
        for entry in self._hung:
            deadline, _, target, fut = entry
            if fut.done():
                continue
            if now >= deadline:
                fut.set_exception(PeerCallError(f"{target[:12]} did not answer within {self.call_timeout_s:g} s"))
            else:
                keep.append(entry)
        self._hung = keep

    def idle_futures(self) -> list[asyncio.Future[None]]:
        """Futures of the calls hung now (a task waiting on one is idle, not busy)."""
        return [fut for *_, fut in self._hung if not fut.done()] + [f for f in self._waiting if not f.done()]

    def reachable(self, sender: str, target: str) -> bool:
        """True if a call from ``sender`` to ``target`` would be delivered now."""
        return target in self.nodes and sender not in self.faults and target not in self.faults

    async def heartbeat(self) -> None:
        """One heartbeat round: every node learns the capabilities of every node it reaches."""
        now = self.clock.monotonic()
        for a in list(self.nodes.values()):
            for b in list(self.nodes.values()):
                if a is b or not self.reachable(a.node_id, b.node_id) or b.machine is None:
                    continue
                caps = await b.machine.capabilities()
                a.seen[b.node_id] = (Capabilities.model_validate_json(caps.model_dump_json()), b.name, now)

    async def deliver(self, sender: str, target: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Carry one call (see the module docstring for the faults).

        Raises:
            PeerRefused: the target refused it (403: the sender lacks the route's role).
            PeerCallError: refused, timed out, reset, a 400, or the handler failed (an error reply).
        """
        path = route.path
        fault = self.faults.get(sender) or self.faults.get(target)
        if fault == "refuse" or target not in self.nodes:
            self.calls.append(Call(sender, target, path, body, "refused"))
            raise PeerCallError(f"cannot connect to {target[:12]}: connection refused")
        if fault == "hang":
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._hung.append((self.clock.monotonic() + self.call_timeout_s, sender, target, fut))
            try:
                await fut
            except PeerCallError as e:
                self.calls.append(Call(sender, target, path, body, str(e)))
                raise
            raise AssertionError("a hung call is never answered")  # pragma: no cover
        held = self._held.get((target, path))
        if held is not None and not held.done():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # (idle: see idle_futures)
            held.add_done_callback(lambda _: waiter.done() or waiter.set_result(None))
            self._waiting.append(waiter)
            await waiter
        node = self.nodes[target]
        copy = None if body is None else route.request.model_validate_json(body.model_dump_json())
        caller = self.nodes.get(sender)
        who = Sender(sender, *((caller.mode, caller.user) if caller is not None else ("personal", "")))
        try:
            answer = await node.router_().dispatch(route, who, copy)
        except PeerRefused as e:  # a refusal (403): an error reply, not a failure
            self.calls.append(Call(sender, target, path, body, f"403: {e}"))
            raise PeerRefused(f"{path} on {target[:12]}: HTTP 403: {e.reason}", e.reason) from e
        except PeerBadRequest as e:
            self.calls.append(Call(sender, target, path, body, f"400: {e}"))
            raise PeerCallError(f"{path} on {target[:12]}: HTTP 400: {e}") from e
        except Exception as e:
            self.errors.append(f"{path} on {target[:12]} from {sender[:12]}: {type(e).__name__}: {e}")
            self.calls.append(Call(sender, target, path, body, f"error: {e}"))
            raise PeerCallError(f"{path} on {target[:12]} failed: 500 {type(e).__name__}") from e
        if self._lose.get((target, path), 0) > 0:
            self._lose[(target, path)] -= 1
            self.calls.append(Call(sender, target, path, body, "reply lost"))
            raise PeerCallError(f"{path} on {target[:12]}: connection reset before the reply")
        self.calls.append(Call(sender, target, path, body, "ok"))
        return route.reply.model_validate_json(answer.model_dump_json())

    def close(self) -> None:
        """Fail every call still hung (at the end of a test)."""
        for *_, fut in self._hung:
            if not fut.done():
                fut.set_exception(PeerCallError("network closed"))
        self._hung = []


class LoopbackNode:
    """One daemon on a :class:`LoopbackNetwork`: its PeerTransport and Directory; its router answers."""

    def __init__(self, network: LoopbackNetwork, node_id: str, name: str, *, router: PeerDispatch,
                 machine: Machine | None = None, usage: UsageService | None = None) -> None:
        self.network = network
        self.node_id = node_id
        self.name = name
        self.seen: dict[str, tuple[Capabilities, str, float]] = {}  # peer -> caps, name, when (monotonic)
        # What this node's certificate would say: its mode and (personal) bound user.
        self.mode = "personal"
        self.user = ""
        self.machine = machine  # its capabilities, for heartbeats
        self.usage = usage  # its fair-share book
        self.router = router  # who answers its peer messages: the route table's dispatcher
        self._cores: dict[str, tuple[Capabilities, WorkerSnapshot]] = {}

    def router_(self) -> PeerDispatch:
        return self.router

    # ------------------------------------------------------------------ PeerTransport

    async def call(self, node_id: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Call ``route`` on ``node_id`` over the network (see :meth:`LoopbackNetwork.deliver`)."""
        return await self.network.deliver(self.node_id, node_id, route, body)

    async def dispatch(self, route: PeerRoute[Req, Rep], sender: str, body: Req | None, *,
                       mode: str = "personal", user: str = "") -> Any:
        """Answer one message as this node's peer API would (``mode``/``user``: the sender's certificate's)."""
        return await self.router_().dispatch(route, Sender(sender, mode, user), body)

    # ------------------------------------------------------------------ Directory

    @property
    def cluster_id(self) -> str:
        """The network's cluster id."""
        return self.network.cluster_id

    @property
    def port(self) -> int:
        """No TCP port: 0."""
        return 0

    @property
    def addresses(self) -> list[str]:
        """127.0.0.1 (gang rendezvous addresses are real: a port is reserved there)."""
        return ["127.0.0.1"]

    @property
    def interface(self) -> str | None:
        """The loopback interface."""
        return "lo"

    @property
    def removed(self) -> bool:
        """Never removed from the loopback cluster."""
        return False

    def _up(self, peer: str) -> bool:
        entry = self.seen.get(peer)
        return entry is not None and self.network.clock.monotonic() - entry[2] <= self.network.suspect_after_s

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every peer seen, with its capabilities as of its last answered heartbeat."""
        return [s for s in (self.snapshot_of(p) for p in sorted(self.seen)) if s is not None]

    def snapshot_of(self, node_id: str) -> WorkerSnapshot | None:
        """One peer seen, as :meth:`worker_snapshots` gives it; None if never seen."""
        entry = self.seen.get(node_id)
        if entry is None:
            return None
        caps, name, _ = entry
        made = self._cores.get(node_id)
        if made is None or made[0] is not caps:  # made once per heartbeat that fetched its capabilities
            made = (caps, caps.model_copy(update={"node_id": node_id, "hostname": name}).to_core())
            self._cores[node_id] = made
        peer = self.network.nodes.get(node_id)  # its "certificate": mode and bound user, as ClusterNode proves them
        mode, user = (peer.mode, peer.user) if peer is not None else ("personal", "")
        return dataclasses.replace(made[1], online=self._up(node_id)).with_identity(mode, user)

    def name_of(self, node_id: str) -> str | None:
        """A peer's name, once seen."""
        entry = self.seen.get(node_id)
        return entry[1] if entry is not None else None

    def trusted_ids(self) -> list[str]:
        """Every peer seen."""
        return sorted(self.seen)

    def up_ids(self) -> list[str]:
        """The peers whose last heartbeat answered within ``suspect_after_s``."""
        return [p for p in sorted(self.seen) if self._up(p)]

    def views(self) -> list[PeerView]:
        """Every peer seen, for ``gpulayer peers``."""
        return [PeerView(node_id=p, name=name, cluster=self.cluster_id, trusted=True,
                         state="up" if self._up(p) else "down", capabilities=caps)
                for p, (caps, name, _) in sorted(self.seen.items())]
