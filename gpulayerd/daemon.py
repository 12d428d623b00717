"""The composition root of gpulayerd: builds every part, runs the loops, shuts down in order.

Start-up: take the machine lock (one daemon per machine, :mod:`gpulayerd.host.machinelock`; before anything
is created or changed, so a second daemon leaves the first one's socket and state alone), lock the state dir,
open the store, re-adopt or account for the runs of the previous life, serve the local API, then run the loops
(probe, schedule, lease, the socket check that re-creates a deleted socket, the history's retention) under one
supervisor. Shutdown (SIGTERM/SIGINT): stop the API, cancel the loops, close the store, remove the pid file.
Jobs keep running under their watchdogs; a daemon restarted before their lease deadline re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpulayerd import __version__
from gpulayerd.api.peer import PeerRouter, TlsNetwork
from gpulayerd.api.server import LocalSocket, make_local_app, metrics_loops, start_unix_site
from gpulayerd.api.unixsite import LocalSocketSettings, socket_answers
from gpulayerd.app.cluster.node import ClusterNode
from gpulayerd.app.cluster.self_first import SelfFirstTransport
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.requester import Requesters
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.stopper import AttemptStopper
from gpulayerd.app.common.supervisor import supervise
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.leases import LeaseLoop
from gpulayerd.app.local import LocalApi
from gpulayerd.app.openmetrics import OpenMetrics
from gpulayerd.app.owner.accounting import Accounting
from gpulayerd.app.owner.array_book import ArrayBook
from gpulayerd.app.owner.dependency_gate import DependencyGate
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.app.owner.notifier import Notifier
from gpulayerd.app.owner.owner import OwnerService
from gpulayerd.app.owner.scheduler import Scheduler
from gpulayerd.app.owner.ship_server import ShipServer
from gpulayerd.app.remote_jobs import RemoteJobs
from gpulayerd.app.roles import LocalRoles, PeerRoles
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.member import GangMember
from gpulayerd.app.worker.metrics import MetricsService, StoreJobs, nvidia_path
from gpulayerd.app.worker.recovery import Recovery
from gpulayerd.app.worker.ship_client import ShipClient
from gpulayerd.app.worker.slurm_worker import attach_slurm
from gpulayerd.app.worker.starter import Starter
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.config import SYSTEM_SOCKET_PATH, DaemonConfig
from gpulayerd.core.types import SupportMatrix
from gpulayerd.gpu.discovery import DiscoveryConfig
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.nvidia.query import NvidiaSmi
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.host import filelocks
from gpulayerd.host.machinelock import (
    Holder,
    MachineLocked,
    acquire_machine_lock,
    acquire_system_lock,
    check_system_lock,
    release_machine_lock,
)
from gpulayerd.host.notify import notify_ready, notify_stopping
from gpulayerd.host.privdirs import make_private_dirs, make_public_dir
from gpulayerd.host.service_system import shared_install_problem
from gpulayerd.host.subids import SubordinateIds
from gpulayerd.models import Capabilities
from gpulayerd.net.identity import NODE_KEY, Identity, check_mode, identity_dir, load_or_create_identity
from gpulayerd.net.limits import soft_file_limit
from gpulayerd.net.transport import PeerDispatch, PeerHandler, PeerNetwork, PeerTransport, Sender
from gpulayerd.runs import layout
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.runner import Runner
from gpulayerd.store import Store, StoreError

__all__ = ["DaemonAlreadyRunning", "PeerNode", "PeerNodeFactory", "PeerParts", "Services", "SharedInstallProblem",
           "StateLost", "build", "peer_handlers", "run"]

log = logging.getLogger(__name__)

_PACKAGE_DIR = str(Path(__file__).resolve().parent)


class DaemonAlreadyRunning(RuntimeError):
    """Another gpulayerd runs on this machine (the machine lock) or holds this state dir."""


class StateLost(RuntimeError):
    """The daemon's database was removed or replaced while it ran; it stopped acknowledging and exited."""


def _lock_state_dir(config: DaemonConfig) -> int:
    """Create the state dir and lock it (one daemon per state dir). Blocking: call in a thread.

    The state, runs and socket dirs are made private first (0700, whatever they were); an unsafe
    one (another account's, or world-writable) is refused before anything is created or changed.

    Returns:
        The descriptor holding the lock (closed by :func:`_unlock_state_dir`).

    Raises:
        UnsafeDirectory: one of those directories is another account's or world-writable.
        DaemonAlreadyRunning: another daemon holds the lock.
    """
    private = [config.state_dir, config.runs_dir]
    if config.mode != "system":  # system mode: a 0755 socket dir, made with the socket (start_unix_site)
        private.append(config.socket_path.parent)
    make_private_dirs(private)
    path = config.state_dir / "gpulayerd.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(e.errno, f"refusing {path}: it is a symbolic link; remove it") from e
        raise
    if not filelocks.lock(fd, wait=False):
        os.close(fd)
        pid = "?"
        with contextlib.suppress(OSError):
            pid = config.pid_path.read_text().strip()
        raise DaemonAlreadyRunning(f"another gpulayerd (pid {pid}) is running with state dir {config.state_dir}")
    return fd


def _lock_machine(config: DaemonConfig) -> list[int]:
    """Take the machine lock. Blocking: call in a thread.

    System mode: the shared one in the device-lock dir when it can be taken (a personal daemon holding
    it stops this one; a symbolic link or a file planted there in a directory every account may write
    to only costs a warning: no account can keep the system daemon from starting), then its own
    ``<socket dir>/gpulayerd.lock`` (``/run/gpulayer``, root's). Personal mode: first a check that no
    system daemon holds ``/run/gpulayer/gpulayerd.lock``, then ``<device_lock_dir>/gpulayerd.lock`` (a
    lock dir of another account than root's or its own is refused).

    Returns:
        The descriptors holding the locks (each closed by :func:`~gpulayerd.host.machinelock.release_machine_lock`).

    Raises:
        DaemonAlreadyRunning: another gpulayerd runs on this machine (the message names it and its socket).
        UnsafeDirectory: the system socket dir is a link, another account's or world-writable.
        OSError: a lock dir or file cannot be made or opened, or is a symbolic link.
    """
    me = Holder(pid=os.getpid(), mode=config.mode, socket=str(config.socket_path.absolute()),
                state_dir=str(config.state_dir.absolute()), uid=os.geteuid())
    if config.isolated:  # beside another daemon: only its own lock dir (it uses no GPU, joins no cluster)
        try:
            return [acquire_machine_lock(config.device_lock_dir, me, strict_owner=True)]
        except MachineLocked as e:
            raise DaemonAlreadyRunning(str(e)) from e
    if config.mode == "system":
        run_dir = config.socket_path.parent
        fds: list[int] = []
        try:
            fds.append(acquire_machine_lock(config.device_lock_dir, me))
        except MachineLocked as e:
            raise DaemonAlreadyRunning(str(e)) from e
        except OSError as e:  # a link or a file planted in a lock dir every account may write to
            log.warning("the shared machine lock in %s cannot be taken (%s): going on with %s", config.device_lock_dir,
                        e.strerror or e, run_dir / "gpulayerd.lock")
        try:
            make_public_dir(run_dir)
            fds.append(acquire_system_lock(run_dir, me))
        except BaseException as e:
            for fd in fds:
                release_machine_lock(fd)
            if isinstance(e, MachineLocked):
                raise DaemonAlreadyRunning(str(e)) from e
            raise
        return fds
    try:
        check_system_lock(SYSTEM_SOCKET_PATH.parent)
    except MachineLocked as e:
        raise DaemonAlreadyRunning(str(e)) from e
    if config.socket_path != SYSTEM_SOCKET_PATH and SYSTEM_SOCKET_PATH.exists() and socket_answers(SYSTEM_SOCKET_PATH):
        # A system daemon of an older version (it held no lock in /run/gpulayer).
        raise DaemonAlreadyRunning(f"gpulayerd is already running on this machine (system mode, socket "
                                   f"{SYSTEM_SOCKET_PATH}); use it, or stop it first")
    try:
        return [acquire_machine_lock(config.device_lock_dir, me, strict_owner=True)]
    except MachineLocked as e:
        raise DaemonAlreadyRunning(str(e)) from e


def _release_all(fds: list[int]) -> None:
    for fd in fds:
        release_machine_lock(fd)


def _prepare_state_dir(config: DaemonConfig) -> bool:
    """The runs dir; whether the state dir is new. Blocking: call in a thread.

    New: no node key there yet. The store is opened (made, on a first start) before the node's
    identity is created, so an empty store file beside a node key is an emptied store (refused),
    while a first start that stopped early (a full disk) leaves no key and starts anew next time.
    """
    config.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    layout.spread_job_dirs(config.runs_dir)
    return not (identity_dir(config.state_dir) / NODE_KEY).exists()


def _write_pid(path: Path) -> None:
    """The pid file, written without following a symbolic link. Blocking: call in a thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def _unlock_state_dir(config: DaemonConfig, lock_fd: int) -> None:
    """Remove the pid file, then release the state dir. Blocking: call in a thread.

    The socket is removed by :meth:`LocalSocket.close`, and only if it is this daemon's.
    """
    with contextlib.suppress(OSError):
        config.pid_path.unlink()
    os.close(lock_fd)


class _Admins:
    """Who may use the local socket's reserved connections: root, this daemon's account and the admins
    (``admin_group``); and whose account a subordinate uid (``/etc/subuid``) counts for. Both re-read
    every minute (in a thread: the user database may be LDAP)."""

    def __init__(self, requesters: Requesters) -> None:
        self._requesters = requesters
        self._uids: frozenset[int] = frozenset()
        self._me = os.geteuid()
        self._subids = SubordinateIds()

    def __call__(self, uid: int) -> bool:
        return uid in (0, self._me) or uid in self._uids

    def account_of(self, uid: int) -> int:
        """The account ``uid``'s connections count for (see :class:`~gpulayerd.host.subids.SubordinateIds`)."""
        return self._subids.owner_of(uid)

    async def refresh(self) -> None:
        """Read the admins' uids and the subordinate uid ranges again."""
        self._uids = await asyncio.to_thread(self._requesters.admin_uids)
        self._subids = await asyncio.to_thread(SubordinateIds.load)

    async def keep(self, interval_s: float = 60.0) -> None:
        """Forever: :meth:`refresh` every ``interval_s`` seconds."""
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh()


def _socket_settings(config: DaemonConfig, privileged: Callable[[int], bool],
                     account_of: Callable[[int], int] = lambda uid: uid) -> LocalSocketSettings:
    """The local socket's limits from ``config``; the total at most a quarter of the open-files limit (the
    rest stays for the store, job logs, the peer port and outgoing calls)."""
    soft = soft_file_limit()
    total = max(2, min(config.local_max_connections, soft // 4))
    if total < config.local_max_connections:
        log.warning("local API: at most %d open connections (not %d): the open files limit is %d", total,
                    config.local_max_connections, soft)
    return LocalSocketSettings(max_connections=total, max_per_user=config.local_max_connections_per_user,
                               reserved=config.local_reserved_connections,
                               request_timeout_s=config.local_request_timeout_s,
                               idle_timeout_s=config.local_idle_timeout_s, privileged=privileged,
                               account_of=account_of)


async def _wait_stop_or_lost(stop: asyncio.Event, store: Store) -> str | None:
    """Wait for ``stop``, or for the store to find its file gone (returns why; None on ``stop``)."""
    stopping = asyncio.create_task(stop.wait(), name="stop")
    gone = asyncio.create_task(store.wait_gone(), name="store-gone")
    try:
        await asyncio.wait({stopping, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (stopping, gone):
            t.cancel()
        await asyncio.gather(stopping, gone, return_exceptions=True)
    return store.gone


class PeerNode(PeerTransport, Directory, Protocol):
    """This daemon's place in a cluster: how it calls peers, what it knows of them, who answers them.

    :class:`ClusterNode` in production (mDNS, heartbeats, mutual TLS); a loopback one in unit tests.
    """


@dataclass(frozen=True)
class PeerParts:
    """What a :class:`PeerNode` is made of: the daemon's signals, the network layer, the peer router
    that answers this node (empty until :meth:`PeerRouter.serve`), this machine and the fair-share book."""

    signals: Signals
    network: PeerNetwork
    router: PeerDispatch
    machine: Machine
    usage: UsageService


PeerNodeFactory = Callable[[PeerParts], PeerNode]
"""Makes the :class:`PeerNode` of a daemon being built from its :class:`PeerParts`."""


@dataclass
class Services:
    """The daemon's services, wired (see :func:`build`)."""

    signals: Signals
    machine: Machine
    worker: WorkerService
    recovery: Recovery
    scheduler: Scheduler
    leases: LeaseLoop
    api: LocalApi
    cluster: ClusterNode | None
    owner: OwnerService
    jobs: OwnedJobs
    gangs: GangCoordinator
    member: GangMember
    ledger: Ledger
    usage: UsageService | None = None
    runner: Runner | None = None
    metrics: MetricsService | None = None
    router: PeerRouter | None = None
    remote_jobs: RemoteJobs | None = None
    requesters: Requesters | None = None


def peer_handlers(*, machine: Machine, owner: OwnerService, worker: WorkerService, member: GangMember,
                  remote_jobs: RemoteJobs, cluster: ClusterNode | None, heartbeat: PeerHandler | None = None,
                  more: dict[str, PeerHandler] | None = None) -> dict[str, PeerHandler]:
    """Every peer route's handler by the name the route table gives it (``heartbeat`` only in a cluster:
    the :class:`ClusterNode`'s, else ``heartbeat``, a given :class:`PeerNode`'s own membership; ``more``:
    the shipping and accounting routes' handlers)."""

    handlers: dict[str, PeerHandler] = {
        "machine.capabilities": lambda sender, msg: machine.capabilities(),
        "jobs.listing": remote_jobs.listing,
        "worker.offer": worker.offer,
        "owner.claim": owner.claim,
        "owner.report": owner.report,
        "worker.kill": worker.kill,
        "worker.logs": worker.logs,
        "member.hold": member.hold,
        "member.release": member.release,
        "member.commit": member.commit,
        "jobs.find": remote_jobs.find,
        "jobs.peer_show": remote_jobs.peer_show,
        "jobs.peer_explain": remote_jobs.peer_explain,
        "jobs.peer_logs": remote_jobs.peer_logs,
        "jobs.peer_cancel": remote_jobs.peer_cancel,
        **(more or {}),
    }
    if (beat := cluster.heartbeat if cluster is not None else heartbeat) is not None:
        handlers["cluster.heartbeat"] = beat
    return handlers


def build(config: DaemonConfig, identity: Identity, store: Store, support: SupportMatrix, *,
          clock: Clock | None = None, rng: random.Random | None = None, runner: Runner | None = None,
          capabilities: Capabilities | None = None, peers: PeerNodeFactory | None = None,
          hostname: str | None = None) -> Services:
    """Build every service and wire them together (no I/O, nothing started).

    The keyword arguments replace the parts that touch the world, for tests that build
    several daemons in one event loop; left out, each is what the daemon uses.

    Args:
        clock: the services' time (default: the system's :class:`Clock`).
        rng: their random source (job ids, gang backoff, the mDNS token; default ``random.SystemRandom``).
        runner: starts and watches attempts (default: a :class:`Runner` of watchdog processes).
        capabilities: this machine as given, never probed (default: probed by ``Machine.probe_loop``).
        peers: makes the cluster part (default: a :class:`ClusterNode` when the identity is in a
            cluster, else none); :attr:`Services.cluster` is set only for a :class:`ClusterNode`. A
            node it makes that has a ``heartbeat`` method answers the heartbeat route with it (the
            simulator's membership, ``tests/sim``).
        hostname: this machine's name for people (default: ``socket.gethostname()``).
    """
    clock = clock or Clock()
    rng = rng or random.SystemRandom()
    signals = Signals(clock)
    node_id = identity.node_id
    hostname = hostname or socket.gethostname()
    # THE peer dispatcher, made first and empty (the network and this node's own calls use it; handlers later).
    router = PeerRouter(stats=signals.stats, logger=logging.getLogger("gpulayerd.app.roles"))
    network = TlsNetwork(router)
    ledger = Ledger()
    # Fair share: a peer's report counts for a few heartbeats (a peer that stops answering stops counting).
    usage = UsageService(node_id=node_id, ledger=ledger, clock=clock, half_life_s=config.fairshare_half_life_s,
                         stale_after_s=max(30.0, 3 * config.down_after_s), table=store.usage)
    locks = DeviceLocks(config.device_lock_dir)
    runner = runner or Runner(config.runs_dir, grace_s=config.cancel_grace_s, use_zygote=True,
                              poll_interval_s=config.watchdog_poll_interval_s, log_cap_bytes=config.log_cap_bytes)
    starter = Starter(config, runner, clock)
    machine = Machine(
        config=config, node_id=node_id, store=store, ledger=ledger, locks=locks,
        prober=EnvironmentProber(timeout_s=config.env_probe_timeout_s,
                                 cache_dir=config.state_dir / "cache" / "environments"),
        discovery=DiscoveryConfig(nvidia_smi_timeout_s=config.nvidia_smi_timeout_s, use_gpus=not config.isolated,
                                  allow_virtual_mps=config.allow_virtual_mps),
        nvidia=NvidiaSmi(), support=support, signals=signals, clock=clock)
    starter.activation_of, starter.preflight_recent = machine.activation_of, machine.preflight_recent
    if capabilities is not None:
        machine.use_capabilities(capabilities)
    cluster: ClusterNode | None = None
    node: PeerNode | None = None
    if peers is not None:
        node = peers(PeerParts(signals=signals, network=network, router=router, machine=machine, usage=usage))
    elif identity.in_cluster and not config.isolated:
        node = cluster = ClusterNode(config=config, identity=identity, store=store, signals=signals,
                                     version=__version__, hostname=hostname, clock=clock, rng=rng, network=network,
                                     machine=machine, usage=usage)
    names = Names(node_id, hostname, node)
    # This node's own messages to itself go through the same dispatcher, as its certificate names it.
    transport = SelfFirstTransport(Sender(node_id, machine.accounts.mode, machine.accounts.user), node, router)
    stopper = AttemptStopper(node_id=node_id, transport=transport, signals=signals)
    jobs = OwnedJobs(store=store, signals=signals, clock=clock, runs=stopper, node_id=node_id)
    jobs.on_persisted = Notifier(jobs=jobs, signals=signals, mode=config.mode,
                                 allow_root_jobs=config.allow_root_jobs).persisted
    worker = WorkerService(config=config, node_id=node_id, store=store, runner=runner, starter=starter, ledger=ledger,
                           locks=locks, machine=machine, jobs=jobs, transport=transport, support=support,
                           signals=signals, clock=clock, usage=usage)
    attach_slurm(machine, config.slurm, worker, runner, ledger, config.state_dir / "cache")  # a login node's
    gangs = GangCoordinator(config=config, node_id=node_id, store=store, jobs=jobs, transport=transport,
                            directory=node, names=names, support=support, signals=signals, clock=clock, rng=rng)
    member = GangMember(node_id=node_id, store=store, ledger=ledger, locks=locks, machine=machine, starter=starter,
                        worker=worker, directory=node, support=support, signals=signals, clock=clock,
                        max_hold_ttl_s=config.hold_ttl_s)
    arrays = ArrayBook(store=store, jobs=jobs, gate=DependencyGate(store=store, jobs=jobs, signals=signals,
                                                                   clock=clock),
                       signals=signals, clock=clock, max_array_size=config.max_array_size)
    owner = OwnerService(node_id=node_id, store=store, jobs=jobs, gangs=gangs, machine=machine, starter=starter,
                         transport=transport, directory=node, names=names, support=support, signals=signals,
                         clock=clock, rng=rng, max_time_limit_s=config.max_time_limit, arrays=arrays)
    requesters = Requesters(mode=config.mode, admin_group=config.admin_group)
    # Any job id of the cluster, on any of its machines (show/explain/logs/cancel).
    remote_jobs = RemoteJobs(node_id=node_id, owner=owner, store=store, transport=transport, directory=node,
                             names=names, requesters=requesters, time_limit_s=min(3.0, config.peer_timeout_s))
    arrays.gate.lookup = owner.queue.lookup = lambda ref: remote_jobs.show(ref, None)  # any job of the cluster
    roles = PeerRoles(node_id=node_id, store=store, jobs=jobs, gangs=gangs, ledger=ledger, directory=node,
                      requesters=requesters, support=support, clock=clock, names=names,
                      own=lambda: machine.snapshot(refresh_apps=False))
    shipping = ShipServer(config=config, jobs=jobs, store=store, clock=clock, transport=transport)  # --ship
    starter.shipping = trees = ShipClient(config=config, node_id=node_id, transport=transport, store=store)
    roles.listed = shipping.listed
    accounting = Accounting(store=store, clock=clock, node_id=node_id, name_of=names.name_of, machine=machine,
                            keep_days=config.history_keep_days, directory=node, transport=transport)
    more: dict[str, PeerHandler] = {"shipping.fetch": shipping.fetch, "shipping.output": shipping.output,
                                    "trees.files": trees.files, "accounting.peer_report": accounting.peer_report}
    router.serve(peer_handlers(machine=machine, owner=owner, worker=worker, member=member, remote_jobs=remote_jobs,
                               cluster=cluster, heartbeat=getattr(node, "heartbeat", None), more=more), roles)

    async def locate_nvidia_smi() -> str | None:
        return nvidia_path(await machine.capabilities())

    # Live GPU metrics (GET /v1/metrics): one nvidia-smi -lms process, only while someone watches.
    metrics = MetricsService(clock=clock, locate=locate_nvidia_smi, jobs=StoreJobs(store, ledger))
    return Services(
        signals=signals, machine=machine, worker=worker, cluster=cluster, owner=owner, jobs=jobs, gangs=gangs,
        member=member, ledger=ledger, usage=usage, runner=runner, router=router, remote_jobs=remote_jobs,
        requesters=requesters, metrics=metrics,
        recovery=Recovery(node_id=node_id, store=store, runner=runner, jobs=jobs, worker=worker, clock=clock),
        scheduler=Scheduler(config=config, node_id=node_id, store=store, jobs=jobs, machine=machine, worker=worker,
                            gangs=gangs, transport=transport, directory=node, support=support, signals=signals,
                            clock=clock, usage=usage, arrays=arrays),
        leases=LeaseLoop(worker=worker, owner=owner, gangs=gangs, member=member, grace_s=config.lease_grace_s,
                         clock=clock, usage=usage),
        api=LocalApi(node_id=node_id, hostname=hostname, version=__version__, state_dir=str(config.state_dir),
                     owner=owner, machine=machine, directory=node, signals=signals, clock=clock,
                     requesters=requesters, roles=LocalRoles(store=store, jobs=jobs), remote=remote_jobs,
                     usage=usage, names=names, metrics=metrics, shipping=shipping, accounting=accounting,
                     openmetrics=OpenMetrics(store=store, machine=machine, signals=signals, usage=usage)),
    )


class SharedInstallProblem(RuntimeError):
    """System mode with a workload interpreter other accounts cannot run (the message names the place)."""


async def run(config: DaemonConfig, *, support: SupportMatrix = SUPPORT_MATRIX,
              stop: asyncio.Event | None = None, ready: asyncio.Event | None = None,
              check_shared_install: bool = False) -> None:
    """Run the daemon until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is None).

    Raises:
        DaemonAlreadyRunning: another daemon runs on this machine (machine lock) or holds the state dir.
        UnsafeDirectory: the state, runs or socket dir is another account's or world-writable.
        StoreError: the store cannot be opened (:class:`~gpulayerd.store.StoreDamaged`: damaged).
        StateLost: the database file was removed or replaced while the daemon ran.
        SharedInstallProblem: ``check_shared_install`` (``gpulayerd --system``) and a workload
            interpreter other accounts cannot run.
        ModeMismatch: this node's certificate was enrolled in another mode than ``config.mode``.
        OSError: the socket or state dir cannot be created.
    """
    # File work (state dir, its lock, identity, pid file) runs in a thread: nothing blocks the event loop,
    # not even at start-up. The machine lock comes first: a second daemon stops before it changes anything.
    machine_fds = await asyncio.to_thread(_lock_machine, config)
    try:
        if check_shared_install:
            problem = await asyncio.to_thread(shared_install_problem, config.interpreters, _PACKAGE_DIR)
            if problem is not None:
                raise SharedInstallProblem(problem)
        lock_fd = await asyncio.to_thread(_lock_state_dir, config)
    except BaseException:
        await asyncio.to_thread(_release_all, machine_fds)
        raise
    stop_event = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_event.set)
    store: Store | None = None
    api_socket: LocalSocket | None = None
    tasks: list[asyncio.Task[None]] = []
    services: Services | None = None
    try:
        new_state_dir = await asyncio.to_thread(_prepare_state_dir, config)
        await asyncio.to_thread(lambda: config.effective_cpu_slots)  # reads affinity/cgroups once, cached
        store = await Store.open(config.db_path, empty_ok=new_state_dir)  # first: see _prepare_state_dir
        identity = await asyncio.to_thread(load_or_create_identity, config.state_dir)
        check_mode(identity, config.mode)  # ModeMismatch (a ValueError): enrolled in another mode
        services = build(config, identity, store, support)
        if services.runner is not None and services.runner.zygote is not None:
            # Warm before the first job (its Python start-up is paid once, here).
            await asyncio.to_thread(services.runner.zygote.start)
        await services.recovery.recover()
        await services.gangs.recover()
        if services.usage is not None:
            await services.usage.load()  # fair share: everyone's usage before the restart, decayed since
        if services.cluster is not None:
            await services.cluster.async_start()
        else:
            log.info("not in a cluster (gpulayer cluster init / join): this machine only")
        admins = _Admins(services.requesters or Requesters(mode=config.mode, admin_group=config.admin_group))
        await admins.refresh()
        api_socket = await start_unix_site(make_local_app(services.api), config.socket_path,
                                           public=config.mode == "system",
                                           settings=_socket_settings(config, admins, admins.account_of))
        await asyncio.to_thread(_write_pid, config.pid_path)
        log.info("gpulayerd %s node %s serving %s", __version__, identity.node_id[:12], config.socket_path)
        loops: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("probe", services.machine.probe_loop), ("schedule", services.scheduler.loop),
            ("lease", services.leases.loop), ("socket", api_socket.keep), ("admins", admins.keep),
            *services.api.background(), *metrics_loops(config.metrics_listen, config.metrics_token_file,
                                                      services.api.async_prometheus)]
        if services.cluster is not None:
            loops.append(("heartbeat", services.cluster.async_heartbeat_loop))
        tasks = [asyncio.create_task(supervise(name, fn), name=name) for name, fn in loops]
        if ready is not None:
            ready.set()
        notify_ready(f"serving {config.socket_path}")
        lost = await _wait_stop_or_lost(stop_event, store)
        if lost is not None:
            notify_stopping()
            raise StateLost(f"{lost}; stopping (restart gpulayerd to start again on a new store)")
        log.info("gpulayerd stopping")
        notify_stopping()
    finally:
        # Shutdown order: stop taking requests, stop the loops, stop watching runs (the jobs go on), close the store.
        if api_socket is not None:
            await api_socket.close()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if services is not None:
            if services.cluster is not None:
                await services.cluster.async_close()
            await services.signals.close()
            if services.metrics is not None:
                await services.metrics.close()
            await services.worker.close()
            services.machine.close()
            if services.runner is not None:
                await asyncio.to_thread(services.runner.close)
            if services.usage is not None and store is not None and store.gone is None:
                with contextlib.suppress(StoreError):
                    await services.usage.save()  # (a full disk: the last periodic save stands)
        if store is not None:
            await store.close()
        if stop is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        await asyncio.to_thread(_unlock_state_dir, config, lock_fd)
        await asyncio.to_thread(_release_all, machine_fds)
