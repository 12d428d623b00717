"""The composition root of gpulayerd: builds every part, runs the loops, shuts down in order.

Start-up: lock the state dir (one daemon per state dir), open the store, re-adopt or
account for the runs of the previous life, serve the local API, then run the loops
(probe, schedule, lease) under one supervisor. Shutdown (SIGTERM/SIGINT): stop the
API, cancel the loops, close the store, remove the pid file. Jobs keep running under
their watchdogs; a daemon restarted before their lease deadline re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket

from gpulayerd import __version__
from gpulayerd.api.server import make_local_app, start_unix_site
from gpulayerd.cluster import ClusterNode
from gpulayerd.config import DaemonConfig
from gpulayerd.core.types import SupportMatrix
from gpulayerd.devicelock import DeviceLocks
from gpulayerd.gpu.discovery import DiscoveryConfig
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.nvidia import NvidiaSmi
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.jobs import JobManager
from gpulayerd.net.tls import load_or_create_identity
from gpulayerd.notify import notify_ready, notify_stopping
from gpulayerd.runner import Runner
from gpulayerd.store import Store
from gpulayerd.supervisor import supervise

__all__ = ["DaemonAlreadyRunning", "run"]

log = logging.getLogger(__name__)


class DaemonAlreadyRunning(RuntimeError):
    """Another gpulayerd holds this state dir."""


def _lock_state_dir(config: DaemonConfig) -> int:
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(config.state_dir / "gpulayerd.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        os.close(fd)
        pid = "?"
        with contextlib.suppress(OSError):
            pid = config.pid_path.read_text().strip()
        raise DaemonAlreadyRunning(
            f"another gpulayerd (pid {pid}) is running with state dir {config.state_dir}"
        ) from e
    return fd


async def run(config: DaemonConfig, *, support: SupportMatrix = SUPPORT_MATRIX,
              stop: asyncio.Event | None = None, ready: asyncio.Event | None = None) -> None:
    """Run the daemon until ``stop`` is set (or SIGTERM/SIGINT when ``stop`` is None).

    Raises:
        DaemonAlreadyRunning: the state dir is locked by another daemon.
        OSError: the socket or state dir cannot be created.
    """
    lock_fd = _lock_state_dir(config)
    stop_event = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_event.set)
    store: Store | None = None
    api_runner = None
    tasks: list[asyncio.Task[None]] = []
    manager: JobManager | None = None
    cluster: ClusterNode | None = None
    try:
        config.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        identity = load_or_create_identity(config.state_dir)
        node_id = identity.node_id
        store = await Store.open(config.db_path)
        manager = JobManager(
            config=config,
            node_id=node_id,
            hostname=socket.gethostname(),
            version=__version__,
            store=store,
            runner=Runner(
                config.runs_dir,
                grace_s=config.cancel_grace_s,
                poll_interval_s=config.watchdog_poll_interval_s,
            ),
            locks=DeviceLocks(config.device_lock_dir),
            prober=EnvironmentProber(
                timeout_s=config.env_probe_timeout_s, cache_dir=config.state_dir / "cache" / "environments"
            ),
            discovery=DiscoveryConfig(nvidia_smi_timeout_s=config.nvidia_smi_timeout_s),
            nvidia=NvidiaSmi(),
            support=support,
        )
        if identity.in_cluster:
            cluster = ClusterNode(config=config, identity=identity, manager=manager, version=__version__,
                                  hostname=socket.gethostname())
            manager.cluster = cluster
        await manager.async_recover()
        if cluster is not None:
            await cluster.async_start()
        else:
            log.info("not in a cluster (gpulayer cluster init / join): this machine only")
        api_runner = await start_unix_site(make_local_app(manager), config.socket_path)
        config.pid_path.write_text(f"{os.getpid()}\n")
        log.info("gpulayerd %s node %s serving %s", __version__, node_id[:12], config.socket_path)
        tasks = [
            asyncio.create_task(supervise("probe", manager.async_probe_loop), name="probe"),
            asyncio.create_task(supervise("schedule", manager.async_schedule_loop), name="schedule"),
            asyncio.create_task(supervise("lease", manager.async_lease_loop), name="lease"),
        ]
        if cluster is not None:
            tasks.append(asyncio.create_task(supervise("heartbeat", cluster.async_heartbeat_loop), name="heartbeat"))
        if ready is not None:
            ready.set()
        notify_ready(f"serving {config.socket_path}")
        await stop_event.wait()
        log.info("gpulayerd stopping")
        notify_stopping()
    finally:
        # Shutdown order: stop taking requests, stop the loops, stop watching runs
        # (the jobs go on under their watchdogs), close the store.
        if api_runner is not None:
            await api_runner.cleanup()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if cluster is not None:
            await cluster.async_close()
        if manager is not None:
            await manager.async_close()
        if store is not None:
            await store.close()
        with contextlib.suppress(OSError):
            config.pid_path.unlink()
        with contextlib.suppress(OSError):
            config.socket_path.unlink()
        if stop is None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        os.close(lock_fd)
