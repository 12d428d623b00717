"""In-process daemons calling each other: a loopback :class:`PeerTransport` and :class:`Directory`.

A :class:`LoopbackNetwork` joins the daemons of one test (one event loop). Each daemon's
:class:`LoopbackNode` is its peer transport, its directory and its peer API: a call to
another node id is delivered to that daemon's services, as the mutual-TLS peer API would
(``sender`` is the caller's node id, and offers, holds and job requests get the caller's
``mode`` and ``user`` as its certificate would give them; the message and the reply go through JSON so
that nothing is shared). Faults, per node, for calls to and from it:

- ``refuse``: the call fails at once (a host that is down: connection refused);
- ``hang``: the call is never answered; it fails with a timeout once the fake clock has
  moved ``call_timeout_s`` past its start (the client's timeout), like a host that stopped
  answering without closing its connections.

:meth:`LoopbackNetwork.crash` removes a node: every call to it fails, and calls hung on it
fail too (connections reset). :meth:`LoopbackNetwork.heartbeat` is one heartbeat round:
every node fetches the capabilities of every node it can reach; a node is up for another
while its last answered heartbeat is at most ``suspect_after_s`` old.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel

from gpulayerd.api.peer import PeerBadRequest, PeerCallError, PeerForbidden, request_problem
from gpulayerd.app.machine import Machine
from gpulayerd.app.member import GangMember
from gpulayerd.app.owner import OwnerService
from gpulayerd.app.remote_jobs import RemoteJobs
from gpulayerd.app.worker import WorkerService
from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.models import Capabilities, PeerView
from gpulayerd.net.wire import JOB_ACTIONS, Claim, Commit, Hold, JobRequest, Kill, LogRequest, Offer, Release, RunReport

from .clock import FakeClock

__all__ = ["Call", "Fault", "LoopbackNetwork", "LoopbackNode"]

M = TypeVar("M", bound=BaseModel)

Fault = Literal["refuse", "hang"]

_BODIES: dict[str, type[BaseModel]] = {
    "/v1/peer/offer": Offer, "/v1/peer/claim": Claim, "/v1/peer/report": RunReport, "/v1/peer/kill": Kill,
    "/v1/peer/logs": LogRequest, "/v1/peer/hold": Hold, "/v1/peer/release": Release, "/v1/peer/commit": Commit,
    "/v1/peer/job/find": JobRequest, **{f"/v1/peer/job/{a}": JobRequest for a in JOB_ACTIONS},
}


@dataclass(frozen=True)
class Call:
    """One call made over the network (for assertions): who, to whom, what, and how it ended."""

    sender: str
    target: str
    path: str
    body: BaseModel | None
    outcome: str  # "ok", "refused", "timed out", "reset", "error: ..."


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

    def node(self, node_id: str, name: str) -> LoopbackNode:
        """The node ``node_id`` joins (or re-joins, after a restart) the network."""
        node = LoopbackNode(self, node_id, name)
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
        return [fut for *_, fut in self._hung if not fut.done()]

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

    async def deliver(self, sender: str, target: str, path: str, body: BaseModel | None, reply: type[M]) -> M:
        """Carry one call (see the module docstring for the faults).

        Raises:
            PeerCallError: refused, timed out, reset, or the handler failed (an error reply).
        """
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
        node = self.nodes[target]
        copy = None if body is None else type(body).model_validate_json(body.model_dump_json())
        caller = self.nodes.get(sender)
        who = (caller.mode, caller.user) if caller is not None else ("personal", "")
        try:
            answer = await node.dispatch(sender, path, copy, *who)
        except (PeerForbidden, PeerBadRequest) as e:  # a refusal (403 / 400): an error reply, not a failure
            status = 403 if isinstance(e, PeerForbidden) else 400
            self.calls.append(Call(sender, target, path, body, f"{status}: {e}"))
            raise PeerCallError(f"{path} on {target[:12]}: HTTP {status}: {e}") from e
        except Exception as e:
            self.errors.append(f"{path} on {target[:12]} from {sender[:12]}: {type(e).__name__}: {e}")
            self.calls.append(Call(sender, target, path, body, f"error: {e}"))
            raise PeerCallError(f"{path} on {target[:12]} failed: 500 {type(e).__name__}") from e
        self.calls.append(Call(sender, target, path, body, "ok"))
        return reply.model_validate_json(answer.model_dump_json())

    def close(self) -> None:
        """Fail every call still hung (at the end of a test)."""
        for *_, fut in self._hung:
            if not fut.done():
                fut.set_exception(PeerCallError("network closed"))
        self._hung = []


class LoopbackNode:
    """One daemon on a :class:`LoopbackNetwork`: its PeerTransport, Directory and peer API."""

    def __init__(self, network: LoopbackNetwork, node_id: str, name: str) -> None:
        self.network = network
        self.node_id = node_id
        self.name = name
        self.seen: dict[str, tuple[Capabilities, str, float]] = {}  # peer -> caps, name, when (monotonic)
        # What this node's certificate would say: its mode and (personal) bound user.
        self.mode = "personal"
        self.user = ""
        self.machine: Machine | None = None
        self._owner: OwnerService | None = None
        self._worker: WorkerService | None = None
        self._member: GangMember | None = None
        self._jobs: RemoteJobs | None = None

    def bind_jobs(self, jobs: RemoteJobs) -> None:
        """Who answers this node's ``/v1/peer/job/...`` routes."""
        self._jobs = jobs

    def bind(self, *, machine: Machine, owner: OwnerService, worker: WorkerService, member: GangMember) -> None:
        """The services that answer this node's peer API."""
        self.machine, self._owner, self._worker, self._member = machine, owner, worker, member

    # ------------------------------------------------------------------ PeerTransport

    async def call(self, node_id: str, path: str, body: BaseModel | None, reply: type[M]) -> M:
        """Call ``path`` on ``node_id`` over the network (see :meth:`LoopbackNetwork.deliver`)."""
        return await self.network.deliver(self.node_id, node_id, path, body, reply)

    # ------------------------------------------------------------------ peer API

    async def dispatch(self, sender: str, path: str, body: BaseModel | None, sender_mode: str = "personal",
                       sender_user: str = "") -> BaseModel:
        """Answer one peer message as the peer API does (``sender_mode``/``sender_user``: the
        caller's certificate's mode and bound user).

        Raises:
            LookupError: no such path. Whatever the handler raises.
        """
        assert self.machine and self._owner and self._worker and self._member, "LoopbackNode.bind() not called"
        url = urlsplit(path)
        if url.path == "/v1/peer/capabilities":
            return await self.machine.capabilities()
        if url.path == "/v1/peer/jobs":
            return await self._owner.peer_jobs(sender, parse_qs(url.query).get("status"))
        expected = _BODIES.get(url.path)
        if expected is None:
            raise LookupError(f"no route {url.path}")
        assert isinstance(body, expected), f"{url.path} takes {expected.__name__}, got {type(body).__name__}"
        for field in ("owner", "worker"):
            if hasattr(body, field) and url.path != "/v1/peer/logs":
                assert getattr(body, field) == sender, f"{url.path}: {field} is not the sender"
        problem = request_problem(body)  # as the peer API checks every message
        if problem is not None:
            raise PeerBadRequest(problem)
        handlers: dict[str, Callable[[], BaseModel | Awaitable[BaseModel]]] = {
            "/v1/peer/offer": lambda: self._worker_().offer(sender, _as(body, Offer), sender_mode, sender_user),
            "/v1/peer/claim": lambda: self._owner_().claim(sender, _as(body, Claim)),
            "/v1/peer/report": lambda: self._owner_().report(sender, _as(body, RunReport)),
            "/v1/peer/kill": lambda: self._worker_().kill(sender, _as(body, Kill)),
            "/v1/peer/logs": lambda: self._worker_().logs(sender, _as(body, LogRequest)),
            "/v1/peer/hold": lambda: self._member_().hold(sender, _as(body, Hold), sender_mode, sender_user),
            "/v1/peer/release": lambda: self._member_().release(sender, _as(body, Release)),
            "/v1/peer/commit": lambda: self._member_().commit(sender, _as(body, Commit)),
        }
        jobs = self._jobs
        if jobs is not None and isinstance(body, JobRequest):
            handlers["/v1/peer/job/find"] = lambda: jobs.find(sender, _as(body, JobRequest))
            for action in JOB_ACTIONS:
                handlers[f"/v1/peer/job/{action}"] = functools.partial(
                    jobs.answer, sender, action, _as(body, JobRequest), sender_mode, sender_user)
        answer = handlers[url.path]()
        return await answer if inspect.isawaitable(answer) else answer

    def _owner_(self) -> OwnerService:
        assert self._owner is not None
        return self._owner

    def _worker_(self) -> WorkerService:
        assert self._worker is not None
        return self._worker

    def _member_(self) -> GangMember:
        assert self._member is not None
        return self._member

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

    def _up(self, peer: str) -> bool:
        entry = self.seen.get(peer)
        return entry is not None and self.network.clock.monotonic() - entry[2] <= self.network.suspect_after_s

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every peer seen, with its capabilities as of its last answered heartbeat."""
        out = []
        for peer, (caps, name, _) in sorted(self.seen.items()):
            c = caps.model_copy(update={"node_id": peer, "hostname": name, "online": self._up(peer)})
            out.append(c.to_core())
        return out

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


def _as(body: BaseModel | None, model: type[M]) -> M:
    assert isinstance(body, model)
    return body
