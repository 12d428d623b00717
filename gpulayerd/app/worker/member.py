"""The gang member: the worker side of multi-host jobs (hold, release, commit of one rank).

A hold reserves devices, CPU slots and a port for ``ttl_s`` (kept in the :class:`Ledger`,
so the matcher sees them as taken); a commit starts this machine's rank under the hold
through the :class:`Starter`; the run is then watched and renewed by the worker service.
Whether a hold is kept, released, committed or expired is decided by the pure worker core
(:mod:`gpulayerd.core.protocol.worker`, its state kept by the ledger); this service does the I/O.
"""

from __future__ import annotations

import logging
import random
import socket

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import HeldResources, Ledger
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.starter import GangRank, Starter, device_grants
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.protocol import worker as core
from gpulayerd.core.types import Accelerator, SupportMatrix
from gpulayerd.models import JobSpec, PlacementModel, SpecError, job_spec_from_mapping
from gpulayerd.net.transport import Sender
from gpulayerd.net.wire import Ack, Commit, Hold, HoldReply, Release
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import RunnerError
from gpulayerd.store import RemoteRunRow, Store

__all__ = ["GangMember"]

log = logging.getLogger(__name__)


class GangMember:
    """Worker side of gang placement: holds, release, commit of one rank."""

    def __init__(self, *, node_id: str, store: Store, ledger: Ledger, locks: DeviceLocks, machine: Machine,
                 starter: Starter, worker: WorkerService, directory: Directory | None, support: SupportMatrix,
                 signals: Signals, clock: Clock, max_hold_ttl_s: float = 10.0) -> None:
        self.node_id = node_id
        self._max_hold_ttl_s = max_hold_ttl_s  # this worker's hold_ttl_s: no owner keeps a hold longer
        self._store = store
        self._ledger = ledger
        self._locks = locks
        self._machine = machine
        self._starter = starter
        self._worker = worker
        self._directory = directory
        self._support = support
        self._signals = signals
        self._clock = clock

    async def hold(self, sender: Sender, msg: Hold) -> HoldReply:
        """Peer route ``hold`` (role: the job's owner, which vouches for its user, and the hold id,
        if kept, is its own for that job): reserve devices/CPU slots and a port for one member of a
        gang, for ``ttl_s``.

        Args:
            sender: the gang's owner, as its certificate proves it (this node for its own gangs).
            msg: the hold.

        Returns:
            ``held=False`` with the reason, nothing kept, unless that user's jobs run here (as for
            offers) and the member fits here now.
        """
        owner = sender.node_id
        h = self._ledger.held(msg.hold_id)
        if h is not None:
            return HoldReply(held=True, address=h.address, interface=h.interface, port=h.port)
        checked, refused = await self._machine.accounts.vet(msg.spec, sender.mode, sender.user)
        if refused is not None:
            log.info("job_id=%s: hold %s from %s refused: %s", msg.job_id, msg.hold_id, owner[:12], refused)
            return HoldReply(held=False, reason=refused)
        try:
            # The owner resolved the workdir: base_dir only spares a Path.cwd() on the event loop.
            spec = job_spec_from_mapping(checked, source=f"hold for {msg.job_id}", base_dir="/")
        except SpecError as e:
            return HoldReply(held=False, reason=str(e))
        req = spec.to_core(msg.job_id)
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=[(req.user, req.workdir)])
        ev = evaluate(req, worker, self._support)
        if ev.placement is None:
            return HoldReply(held=False, reason=ev.rejections[0].message if ev.rejections else "does not fit")
        uuids = [u for u in ev.placement.device_uuids if u]
        fds = await self._locks.async_try_acquire(uuids) if uuids else []
        if fds is None:
            return HoldReply(held=False, reason="a device was taken by another gpulayerd on this machine")
        d = self._directory
        address = d.addresses[0] if d is not None and d.addresses else "127.0.0.1"
        interface = (d.interface if d is not None else None) or "lo"
        ttl_s = min(msg.ttl_s, self._max_hold_ttl_s)
        actions = self._ledger.apply(core.HoldPlaced(msg.hold_id, owner, msg.job_id, frozenset(uuids), ttl_s),
                                     self._clock.monotonic())
        kept = next((a for a in actions if isinstance(a, core.KeepHold)), None)
        if kept is None:
            self._locks.release(fds)
            refused = next((a.reason for a in actions if isinstance(a, core.RefuseHold)), "refused")
            return HoldReply(held=False, reason=refused)
        try:
            port = _free_port(address)
        except BaseException:
            self._drop(self._ledger.apply(core.HoldReleased(msg.hold_id, owner), self._clock.monotonic()), fds)
            raise
        nproc = spec.distributed.nproc_per_node if spec.distributed is not None else 1
        self._ledger.hold(msg.hold_id, HeldResources(
            owner=owner, job_id=msg.job_id, spec=spec, placement=ev.placement, fds=fds,
            expires_at=kept.expires_at, address=address, interface=interface, port=port,
            cpu_slots=nproc if spec.requirements.accelerator is Accelerator.CPU else 0))
        return HoldReply(held=True, address=address, interface=interface, port=port)

    def _drop(self, actions: list[core.Action], fds: list[int] | None = None) -> None:
        """Carry out the core's DropHold actions: forget the hold, unlock its devices."""
        for a in actions:
            if isinstance(a, core.DropHold):
                h = self._ledger.release(a.hold_id)
                held_fds = h.fds if h is not None else fds or []
                self._locks.release(held_fds)
                if a.reason == "expired" and h is not None:
                    log.info("hold %s for job %s expired", a.hold_id, h.job_id)
                self._signals.wake()

    async def release(self, sender: Sender, msg: Release) -> Ack:
        """Peer route ``release`` (role: the owner of the hold): drop a hold (its devices and slots are
        free again)."""
        owner = sender.node_id
        self._drop(self._ledger.apply(core.HoldReleased(msg.hold_id, owner), self._clock.monotonic()))
        return Ack(ok=True)

    async def commit(self, sender: Sender, msg: Commit) -> Ack:
        """Peer route ``commit`` (role: the owner of the hold, for that job): start our rank of a gang
        job under the hold."""
        owner = sender.node_id
        key = (msg.job_id, msg.attempt)
        actions = self._ledger.apply(core.HoldCommitted(msg.hold_id, owner, key, msg.lease_s),
                                     self._clock.monotonic())
        self._drop(actions)
        if not any(isinstance(a, core.StartRun) for a in actions):
            return Ack(ok=False, reason=next((a.reason for a in actions if isinstance(a, core.RefuseCommit)),
                                             "no such hold (expired?)"))
        h = self._ledger.release(msg.hold_id)  # the run has what the hold had
        if h is None:
            self._ended(key, owner)
            return Ack(ok=False, reason="no such hold (expired?)")
        placement = h.placement
        try:  # the hold went without environment values (tokens): they come with the commit
            spec = _with_env(h.spec, msg.spec.get("env"), msg.job_id)
        except SpecError as e:
            self._locks.release(h.fds)
            self._ended(key, owner)
            return Ack(ok=False, reason=str(e))
        started = False
        try:
            row = RemoteRunRow(owner=owner, job_id=msg.job_id, attempt=msg.attempt,
                               spec_json=spec.model_dump_json(),
                               placement_json=PlacementModel.from_core(placement).model_dump_json(),
                               lease_s=msg.lease_s, run_dir=str(self._starter.run_dir(msg.job_id, msg.attempt)),
                               state="running", started_at=self._clock.wall())
            if not await self._store.runs.insert_remote_run(row, device_grants(placement), self._clock.wall(),
                                                            node_id=self.node_id):
                self._ended(key, owner)
                return Ack(ok=False, reason="devices taken meanwhile")
            rank = GangRank(nnodes=msg.nnodes, node_rank=msg.node_rank, master_addr=msg.master_addr,
                            master_port=msg.master_port, interface=h.interface)
            self._ledger.starting(key, spec)
            try:
                handle = await self._starter.start(msg.job_id, msg.attempt, spec, placement, msg.lease_s, h.fds,
                                                   gang=rank)
            except RunnerError as e:
                self._ledger.not_started(key)
                await self._store.runs.end_remote_run(owner, msg.job_id, msg.attempt, "exited", None, str(e),
                                                      self._clock.wall())
                self._ended(key, owner)
                return Ack(ok=False, reason=f"could not start: {e}")
            started = True
        finally:
            self._locks.release(h.fds)
            if not started and key in self._ledger.state.runs:  # cancelled or failed on the way
                self._ledger.not_started(key)
                self._ended(key, owner)
        self._worker.track(key, handle, spec, owner, msg.lease_s)
        self._signals.devices_changed()
        self._signals.spawn(self._report_started(owner, key))
        return Ack(ok=True)

    def _ended(self, key: tuple[str, int], owner: str) -> None:
        """A committed rank that did not start: the commit's answer tells the owner (no end report)."""
        self._ledger.apply(core.RunEnded(key, owner, "exited", report=False), self._clock.monotonic())

    async def _report_started(self, owner: str, key: tuple[str, int]) -> None:
        await self._worker.report(owner, key, "started", None, "")

    def expire_holds(self) -> None:
        """Drop holds past their TTL."""
        self._drop(self._ledger.apply(core.HoldsChecked(), self._clock.monotonic()))


def _with_env(held: JobSpec, env: object, job_id: str) -> JobSpec:
    """The held spec with the environment values of the commit: the same names the hold had
    (their values were sent empty), checked as at submit.

    Raises:
        SpecError: ``env`` is not a mapping of those names to text that can reach ``exec``.
    """
    if env is None:
        env = {}
    if not isinstance(env, dict) or set(env) != set(held.env):
        raise SpecError(f"commit for {job_id}: env must carry the values of exactly the held names "
                        f"({', '.join(sorted(held.env)) or 'none'})")
    data = held.model_dump(mode="json")
    data["env"] = env
    return job_spec_from_mapping(data, source=f"commit for {job_id}", base_dir="/")


def _free_port(address: str) -> int:
    """A TCP port free on ``address`` now, outside the ephemeral range (a gang's master binds it soon after).

    A port from the ephemeral range (``bind(0)``) may be taken, before torchrun binds it, as the
    local port of any outgoing connection of this host (heartbeats, offers): the master then
    fails with EADDRINUSE and the whole gang with it. So the port is drawn at random from
    ``_MASTER_PORTS`` minus the range in ``/proc/sys/net/ipv4/ip_local_port_range``, and
    checked by binding it; ``bind(0)`` is the fallback when no drawn port is free.

    Raises:
        OSError: ``address`` cannot be bound at all.
    """
    low, high = _EPHEMERAL
    candidates = [p for p in range(*_MASTER_PORTS) if not low <= p <= high]
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for port in _RANDOM.sample(candidates, min(32, len(candidates))):
        with socket.socket(family) as sock:
            try:
                sock.bind((address, port))
            except OSError:
                continue
            return port
    with socket.socket(family) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


_MASTER_PORTS = (20000, 32768)  # half-open; below Linux's default ephemeral range 32768-60999
_RANDOM = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux ``ip_local_port_range``); macOS's default elsewhere."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


_EPHEMERAL = _ephemeral_range()  # read once at import, not on the event loop
