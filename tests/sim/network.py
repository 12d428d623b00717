"""The simulated building network, and each daemon's place on it (its transport and directory port).

:class:`SimNetwork` carries every peer call between the daemons of a simulation. A call's
body and reply go through JSON (nothing is shared; their sizes are counted) and are
delivered to the target's real peer router (:class:`gpulayerd.api.peer.PeerRouter`: the
route table's role check in :class:`gpulayerd.app.roles.PeerRoles`, then the handler).
Per call, seeded by the simulation:

- **latency**: each direction takes a log-normal time (median ``latency_s``, sigma 0.5),
  so messages sent close together may arrive in another order (reordering);
- **loss**: each direction is lost with probability ``loss``; a lost call waits for the
  caller's timeout (``call_timeout_s``) and fails as a timeout does;
- **partitions**: a call between two groups that are cut off is lost;
- **crashes**: a call to a daemon that is down is refused at once (connection refused);
  calls in flight to or from one that crashes fail (connection reset);
- **pauses** (SIGSTOP): a paused daemon handles nothing until it resumes; its callers
  time out meanwhile;
- **CPU** (``charge_cpu``, off unless asked for): each handler is charged the CPU time its own steps
  took here (``time.thread_time``, step by step, so what other coroutines ran while it waited is not
  counted): its reply leaves that much simulated time later, and a daemon handles one thing at a
  time (a handler that ends while an earlier one's charge runs waits for it), so latencies include
  the daemons' work, not only the network's timers. Measured CPU differs from run to run, so a
  charged run is not reproduced exactly by its seed: the invariant runs leave it off.

Every message is counted per node and per kind (:data:`KIND`): messages and bytes sent and
received. A message's bytes are its JSON plus :data:`HEADER_BYTES` for the HTTP request or
status line and headers (TLS records and TCP/IP headers are not counted).

:class:`SimNode` is one daemon's :class:`~gpulayerd.app.common.ports.Directory` and
:class:`~gpulayerd.net.transport.PeerTransport`: what :class:`gpulayerd.app.cluster.node.ClusterNode`
is in production, without TLS, mDNS or the revocation files (which cannot run here).
Membership is the real :class:`gpulayerd.net.peers.PeerTable` fed by real heartbeats
(:class:`~gpulayerd.net.wire.Heartbeat` every ``heartbeat_interval_s`` to every peer, all to
all, holdings included; capabilities fetched when their digest changes), as
``ClusterNode.async_heartbeat_loop`` does; every node is announced to every other at the
start (one mDNS domain).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import types
from collections import Counter
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from gpulayerd.app.cluster.node import PeerSnapshots
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core.fairshare import credible_holdings
from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.errors import PeerBadRequest, PeerCallError, PeerRefused
from gpulayerd.models import Capabilities, PeerView
from gpulayerd.net.peers import Peer, PeerTable
from gpulayerd.net.transport import CAPABILITIES, HEARTBEAT, PeerDispatch, PeerRoute, Sender
from gpulayerd.net.wire import Heartbeat, HeartbeatReply, new_msg_id

from .clock import NodeClock, SimTime

__all__ = ["HEADER_BYTES", "KIND", "SimNetwork", "SimNode", "Traffic"]

Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)

HEADER_BYTES = 150
"""Bytes counted per message beside its JSON body: the HTTP request/status line and headers."""

KIND = {"heartbeat": "heartbeats", "capabilities": "heartbeats", "offer": "offers", "claim": "claims",
        "report": "leases", "kill": "leases", "hold": "gangs", "release": "gangs", "commit": "gangs"}
"""The kind each peer route's traffic is counted under (others: ``other``)."""

CLUSTER = "simcluster000000"


@dataclass
class Traffic:
    """One node's traffic: messages and bytes, sent and received, by kind (see :data:`KIND`)."""

    sent_msgs: Counter[str] = field(default_factory=Counter)
    sent_bytes: Counter[str] = field(default_factory=Counter)
    recv_msgs: Counter[str] = field(default_factory=Counter)
    recv_bytes: Counter[str] = field(default_factory=Counter)

    def add(self, other: Traffic) -> None:
        """Add ``other``'s counts to these."""
        for mine, theirs in ((self.sent_msgs, other.sent_msgs), (self.sent_bytes, other.sent_bytes),
                             (self.recv_msgs, other.recv_msgs), (self.recv_bytes, other.recv_bytes)):
            mine.update(theirs)


class SimNetwork:
    """The daemons of one simulation and the network between them (see the module docstring).

    Args:
        time: the true simulated time.
        rng: the network's seeded random source (latencies, losses).
        latency_s: median one-way latency (seconds).
        call_timeout_s: the caller's limit for one call (seconds; the peer client's timeout).
    """

    def __init__(self, time: SimTime, rng: random.Random, *, latency_s: float = 0.001,
                 call_timeout_s: float = 5.0, charge_cpu: bool = False) -> None:
        self.charge_cpu = charge_cpu
        self.cpu_charged_s: dict[str, float] = {}  # node id -> handler CPU charged there (seconds)
        self._busy_until: dict[str, float] = {}  # node id -> simulated time its charged work ends
        self.time = time
        self.rng = rng
        self.latency_s = latency_s
        self.call_timeout_s = call_timeout_s
        self.loss = 0.0
        self.nodes: dict[str, SimNode] = {}
        self.groups: dict[str, int] = {}  # node id -> partition group (0: with everyone)
        self.traffic: dict[str, Traffic] = {}
        self.errors: list[str] = []  # handler exceptions (a run should end with none)
        self.calls = 0
        self._inflight: dict[str, set[asyncio.Task[Any]]] = {}  # node id -> handlers running there

    # ------------------------------------------------------------------ faults

    def partition(self, group: set[str]) -> None:
        """Cut ``group`` off from everyone else (calls across are lost) until :meth:`heal`."""
        for n in group:
            self.groups[n] = 1

    def heal(self) -> None:
        """End every partition."""
        self.groups.clear()

    def _cut(self, a: str, b: str) -> bool:
        return self.groups.get(a, 0) != self.groups.get(b, 0)

    def crash(self, node_id: str) -> None:
        """``node_id`` is down: calls to it are refused; its handlers running now die."""
        self.nodes.pop(node_id, None)
        for t in self._inflight.pop(node_id, set()):
            t.cancel()

    # ------------------------------------------------------------------ carrying calls

    def _delay(self) -> float:
        return self.latency_s * math.exp(0.5 * self.rng.gauss(0.0, 1.0))

    def _lost(self, a: str, b: str) -> bool:
        return self._cut(a, b) or (self.loss > 0 and self.rng.random() < self.loss)

    def _traffic(self, node: str) -> Traffic:
        t = self.traffic.get(node)
        if t is None:
            t = self.traffic[node] = Traffic()
        return t

    def _count(self, sender: str, target: str, kind: str, size: int) -> None:
        s = self._traffic(sender)
        s.sent_msgs[kind] += 1
        s.sent_bytes[kind] += size
        t = self._traffic(target)
        t.recv_msgs[kind] += 1
        t.recv_bytes[kind] += size

    async def call(self, sender: str, target: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Carry one call and its reply (see the module docstring).

        Raises:
            PeerRefused: the target refused it (403: the sender lacks the route's role).
            PeerCallError: refused, timed out, reset, a 400, or the handler failed.
        """
        self.calls += 1
        if target not in self.nodes:
            raise PeerCallError(f"cannot connect to {target[:12]}: connection refused")
        kind = KIND.get(route.name, "other")
        raw = b"" if body is None else body.model_dump_json().encode()
        self._count(sender, target, kind, len(raw) + HEADER_BYTES)
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        start = self.time.now
        if not self._lost(sender, target):
            self.time.call_at(start + self._delay(),
                              lambda: self._arrive(sender, target, route, raw, answer, kind))

        def expire() -> None:
            if not answer.done():
                answer.set_exception(PeerCallError(f"{target[:12]} did not answer within {self.call_timeout_s:g} s"))

        timeout = self.time.call_at(start + self.call_timeout_s, expire)
        try:
            out = await answer  # raises the call's error
        finally:
            timeout.cancel()  # answered (or the caller was cancelled): no step at the timeout
        me = self.nodes.get(sender)
        if me is not None:
            await me.clock.running()  # a paused caller takes its answer only when it runs again
        return route.reply.model_validate_json(out)

    def _arrive(self, sender: str, target: str, route: PeerRoute[Any, Any], raw: bytes,
                answer: asyncio.Future[bytes], kind: str) -> None:
        node = self.nodes.get(target)
        if node is None:
            if not answer.done():
                answer.set_exception(PeerCallError(f"connection to {target[:12]} reset"))
            return
        cpu = _Cpu(self.charge_cpu)
        handling = self._handle(node, sender, route, raw, answer, kind, cpu)
        try:  # its first step now: most handlers (a heartbeat's) never wait, and need no task
            waits_on = cpu.step(handling.send, None)
        except StopIteration:
            return
        task = asyncio.get_running_loop().create_task(_go_on(handling, waits_on, cpu))
        running = self._inflight.setdefault(target, set())
        running.add(task)
        task.add_done_callback(running.discard)

    async def _handle(self, node: SimNode, sender: str, route: PeerRoute[Any, Any], raw: bytes,
                      answer: asyncio.Future[bytes], kind: str, cpu: _Cpu) -> None:
        await node.clock.running()  # a paused daemon reads its socket when it runs again
        copy = None if not raw else route.request.model_validate_json(raw)
        caller = self.nodes.get(sender)
        who = Sender(sender, *((caller.mode, caller.user) if caller is not None else ("personal", "")), sender)
        error: PeerCallError | None = None
        reply = b""
        try:
            result = await node.router.dispatch(route, who, copy)
            reply = result.model_dump_json().encode()
        except asyncio.CancelledError:
            error = PeerCallError(f"connection to {node.node_id[:12]} reset")
        except PeerRefused as e:
            error = PeerRefused(f"{route.path} on {node.node_id[:12]}: HTTP 403: {e.reason}", e.reason)
        except PeerBadRequest as e:
            error = PeerCallError(f"{route.path} on {node.node_id[:12]}: HTTP 400: {e}")
        except Exception as e:
            self.errors.append(f"{route.path} on {node.node_id[:12]} from {sender[:12]}: {type(e).__name__}: {e}")
            error = PeerCallError(f"{route.path} on {node.node_id[:12]} failed: 500 {type(e).__name__}")
        self._count(node.node_id, sender, kind, len(reply) + HEADER_BYTES)
        if error is None and self._lost(node.node_id, sender):
            return  # the reply is lost: the caller times out
        delay = self._delay()

        def deliver() -> None:
            if answer.done():
                return
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(reply)

        self.time.call_at(self._charged(node.node_id, cpu.so_far()) + delay, deliver)

    def _charged(self, node_id: str, cost_s: float) -> float:
        """When a handler of ``node_id`` that took ``cost_s`` of CPU is done, in simulated time (now
        without ``charge_cpu``): after the node's earlier charged work, then its own."""
        if not self.charge_cpu:
            return self.time.now
        done = max(self.time.now, self._busy_until.get(node_id, 0.0)) + cost_s
        self._busy_until[node_id] = done
        self.cpu_charged_s[node_id] = self.cpu_charged_s.get(node_id, 0.0) + cost_s
        return done

    def close(self) -> None:
        """Cancel every handler still running."""
        for tasks in self._inflight.values():
            for t in tasks:
                t.cancel()
        self._inflight.clear()


class SimNode:
    """One daemon on a :class:`SimNetwork`: its peer transport, directory and membership (see the module docstring).

    Args:
        network: the network. node_id, name: this daemon's. clock: its clock.
        router: its peer router (the route table's dispatcher). machine: its machine (capabilities).
        usage: its fair-share book (holdings go out in heartbeats and come in from them).
        signals: its signals (peers changed, wake the scheduler).
        heartbeat_interval_s, suspect_after_s, down_after_s: its membership settings.
    """

    def __init__(self, network: SimNetwork, node_id: str, name: str, *, clock: NodeClock, router: PeerDispatch,
                 machine: Machine, usage: UsageService, signals: Signals, heartbeat_interval_s: float,
                 suspect_after_s: float, down_after_s: float) -> None:
        self.network = network
        self.node_id = node_id
        self.name = name
        self.clock = clock
        self.router = router
        self.machine = machine
        self.usage = usage
        self.signals = signals
        self.heartbeat_interval_s = heartbeat_interval_s
        self.table = PeerTable(node_id, CLUSTER, suspect_after_s=suspect_after_s, down_after_s=down_after_s)
        self.mode = "personal"
        self.user = ""
        self.ep = f"{network.rng.getrandbits(32):08x}"
        self._snapshots = PeerSnapshots(usage)  # ClusterNode's: the GPUs each user holds there included

    def announce(self, others: list[SimNode]) -> None:
        """mDNS: ``others`` are seen (untrusted until a heartbeat answers)."""
        for o in others:
            self.table.seen_mdns(o.node_id, o.name, [o.node_id], 1, CLUSTER, "1", o.ep)

    # ------------------------------------------------------------------ PeerTransport

    async def call(self, node_id: str, route: PeerRoute[Req, Rep], body: Req | None) -> Rep:
        """Call ``route`` on ``node_id`` over the simulated network."""
        return await self.network.call(self.node_id, node_id, route, body)

    # ------------------------------------------------------------------ membership (ClusterNode's)

    async def heartbeat_loop(self) -> None:
        """Heartbeat every peer every ``heartbeat_interval_s`` (``ClusterNode.async_heartbeat_loop``)."""
        while True:
            targets = self.table.targets()
            if targets:
                await asyncio.gather(*(self._beat(t.key, t.node_id) for t in targets))
            await self.clock.sleep(self.heartbeat_interval_s)

    def _message(self) -> Heartbeat:
        return Heartbeat(msg_id=new_msg_id(), node_id=self.node_id, name=self.name, version="sim", cluster=CLUSTER,
                         port=1, addresses=[self.node_id], ep=self.ep, caps_digest=self.machine.caps_digest(),
                         holdings=self.usage.own_holdings(), revoked=None)

    async def _beat(self, key: str, node_id: str | None) -> None:
        was_up = self._is_up(node_id)
        try:
            reply = await self.call(key, HEARTBEAT, self._message())
        except PeerCallError:
            self.table.heartbeat_failed(key)
            if was_up:
                self.signals.peers_changed()
            return
        p = self.table.heartbeat_ok(key, key, reply, key, self.clock.monotonic(), self.clock.wall())
        if p is None:
            return
        p.proven_mode, p.proven_user = self._proof(key)
        self._take_holdings(Sender(key, p.proven_mode, p.proven_user), reply.holdings, p.name)
        if p.caps_digest != p.fetched_digest or p.caps is None:
            try:
                p.caps = await self.call(key, CAPABILITIES, None)
                p.fetched_digest = p.caps_digest
                self.signals.peer_wake()
            except PeerCallError:
                pass
        if not was_up:
            self.signals.peer_wake()
        self.signals.peers_changed()

    def _proof(self, node_id: str) -> tuple[str, str]:
        peer = self.network.nodes.get(node_id)  # what its certificate would prove
        return (peer.mode, peer.user) if peer is not None else ("personal", "")

    async def heartbeat(self, sender: Sender, msg: Heartbeat) -> HeartbeatReply:
        """Peer route ``heartbeat`` (``ClusterNode.heartbeat``): the sender is seen; its holdings count."""
        self.table.seen_mdns(sender.node_id, msg.name, [sender.node_id], msg.port, msg.cluster, msg.version, msg.ep)
        known = self.table.get(sender.node_id)
        if known is not None and sender.mode:
            known.proven_mode, known.proven_user = sender.mode, sender.user
        self._take_holdings(sender, msg.holdings, msg.name)
        return HeartbeatReply(node_id=self.node_id, name=self.name, version="sim", cluster=CLUSTER, port=1,
                              addresses=[self.node_id], ep=self.ep, caps_digest=self.machine.caps_digest(),
                              holdings=self.usage.own_holdings(), revoked=None)

    def _take_holdings(self, sender: Sender, holdings: dict[str, tuple[int, int]] | None, name: str) -> None:
        if holdings is None:
            return
        gpus, slots = self.table.advertised(sender.node_id)
        kept, _ = credible_holdings(holdings, sender_mode=sender.mode, sender_user=sender.user,
                                    gpus_advertised=gpus, slots_advertised=slots)
        self.usage.report(sender.node_id, kept, name)

    def _is_up(self, node_id: str | None) -> bool:
        if node_id is None:
            return False
        p = self.table.get(node_id)
        return p is not None and self.table.state(p, self.clock.monotonic()) == "up"

    # ------------------------------------------------------------------ Directory (ClusterNode's)

    @property
    def cluster_id(self) -> str:
        """The simulated cluster's id."""
        return CLUSTER

    @property
    def port(self) -> int:
        """No TCP port."""
        return 1

    @property
    def addresses(self) -> list[str]:
        """127.0.0.1 (a gang's rendezvous address)."""
        return ["127.0.0.1"]

    @property
    def interface(self) -> str | None:
        """None."""
        return None

    @property
    def removed(self) -> bool:
        """Never removed."""
        return False

    def worker_snapshots(self) -> list[WorkerSnapshot]:
        """Every trusted peer with known capabilities, offline ones marked so."""
        now = self.clock.monotonic()
        return [self._snapshot(p, p.caps, now) for p in self.table.trusted_peers() if p.caps is not None]

    def snapshot_of(self, node_id: str) -> WorkerSnapshot | None:
        """One trusted peer's snapshot; None if not known."""
        p = self.table.get(node_id)
        if p is None or p.caps is None or not p.trusted:
            return None
        return self._snapshot(p, p.caps, self.clock.monotonic())

    def _snapshot(self, p: Peer, caps: Capabilities, now: float) -> WorkerSnapshot:
        return self._snapshots.get(p, caps, online=self.table.state(p, now) == "up")

    def name_of(self, node_id: str) -> str | None:
        """A peer's name."""
        p = self.table.get(node_id)
        return p.name if p is not None else None

    def trusted_ids(self) -> list[str]:
        """Every trusted peer."""
        return [p.key for p in self.table.trusted_peers()]

    def up_ids(self) -> list[str]:
        """The trusted peers that answer heartbeats now."""
        now = self.clock.monotonic()
        return [p.key for p in self.table.trusted_peers() if self.table.state(p, now) == "up"]

    def views(self) -> list[PeerView]:
        """Every peer, for ``gpulayer peers``."""
        return self.table.views(self.clock.monotonic())


class _Cpu:
    """The CPU time (``time.thread_time``) of one handler's own steps, the running one included; nothing
    is measured unless ``measured`` (the network charges no CPU: no clock read per step)."""

    def __init__(self, measured: bool) -> None:
        self.measured = measured
        self.total = 0.0
        self._step_began: float | None = None

    def step(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)`` (one step of the handler), its CPU time counted."""
        if not self.measured:
            return fn(arg)
        self._step_began = time.thread_time()
        try:
            return fn(arg)
        finally:
            self.total += time.thread_time() - self._step_began
            self._step_began = None

    def so_far(self) -> float:
        """Seconds of CPU the handler's steps took, the one running now up to now."""
        running = 0.0 if self._step_began is None else time.thread_time() - self._step_began
        return self.total + max(running, 0.0)


@types.coroutine
def _go_on(coro: Coroutine[Any, Any, None], waits_on: Any, cpu: _Cpu) -> Generator[Any, Any, None]:
    """The rest of ``coro``, whose first step (run by the caller) yielded ``waits_on``: what
    ``yield from coro`` would do from there, so that a task can run it (cancellation included);
    each step's CPU time counted in ``cpu``."""
    while True:
        try:
            sent = yield waits_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # thrown in by the task (a cancel): passed on
            try:
                waits_on = cpu.step(coro.throw, e)
            except StopIteration:
                return
        else:
            try:
                waits_on = cpu.step(coro.send, sent)
            except StopIteration:
                return


def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A task named ``name`` (the simulation's loops)."""
    return asyncio.get_running_loop().create_task(coro, name=name)
