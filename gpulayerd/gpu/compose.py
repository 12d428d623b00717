"""Compose what this machine reports: hardware inventory + probed environments.

Used by ``gpulayer devices`` / ``gpulayer explain`` without a daemon, and by the
daemon itself. Blocking (it runs tools and subprocesses): call it from a thread in
the event loop.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from gpulayerd.core.types import EnvironmentSnapshot, SupportMatrix
from gpulayerd.gpu.apple import with_recommended_working_set
from gpulayerd.gpu.discovery import DiscoveryConfig, HostInventory, NvidiaSmi, discover_host, driver_unsettled
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.models import (
    Capabilities,
    DeviceModel,
    EnvironmentModel,
    ProbeHealthModel,
)

__all__ = ["build_capabilities", "collect_capabilities", "machine_node_id"]


def machine_node_id(hostname: str | None = None) -> str:
    """A stable id for this machine before it has a cluster key.

    SHA-256 of ``/etc/machine-id`` (or the host name when there is none), base32,
    lower case, 52 characters: it fits a DNS label.
    """
    seed = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            seed = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if seed:
            break
    seed = seed or (hostname or socket.gethostname())
    digest = hashlib.sha256(seed.encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=").lower()


def build_capabilities(
    inventory: HostInventory,
    environments: Sequence[EnvironmentSnapshot],
    node_id: str,
    taken_at: float,
) -> Capabilities:
    """Turn an inventory and probed environments into the reported :class:`Capabilities`."""
    notes = list(inventory.notes)
    for e in environments:
        notes.extend(f"{e.interpreter}: {n}" for n in e.notes)
    notes.extend(_cuda_without_smi(inventory, environments))
    return Capabilities(
        node_id=node_id,
        hostname=inventory.hostname,
        platform=inventory.platform,
        machine=inventory.machine,
        cpu_count=inventory.cpu_count,
        memory_total_bytes=inventory.memory_total_bytes,
        devices=[DeviceModel.from_core(d) for d in with_recommended_working_set(inventory.devices, environments)],
        environments=[EnvironmentModel.from_core(e) for e in environments],
        health=[ProbeHealthModel.from_core(h) for h in inventory.health],
        notes=notes,
        taken_at=taken_at,
        driver_cuda=_driver_cuda(inventory),
    )


def _cuda_without_smi(inventory: HostInventory, environments: Sequence[EnvironmentSnapshot]) -> list[str]:
    """A note when torch reports CUDA while nvidia-smi is missing (a Jetson, a container without the
    driver's tools): the GPUs exist but no device is listed, so none is scheduled."""
    from gpulayerd.core.types import Accelerator, ProbeStatus

    smi = next((h for h in inventory.health if h.source == "nvidia-smi"), None)
    if smi is None or smi.status is not ProbeStatus.NOT_FOUND or any(
            d.accelerator is Accelerator.CUDA for d in inventory.devices):
        return []
    return [f"CUDA works through torch ({e.interpreter}) but nvidia-smi is missing: devices unknown, none is "
            "scheduled" for e in environments if e.torch_cuda is True][:1]


def _driver_cuda(inventory: HostInventory) -> str | None:
    """The newest CUDA the NVIDIA driver supports: nvidia-smi's header as the probe read it, else the
    driver -> CUDA table (:func:`gpulayerd.core.matching.cuda_compat.driver_cuda_version`); None without a
    CUDA device."""
    from gpulayerd.core.matching.cuda_compat import driver_cuda_version, parse_driver_version
    from gpulayerd.core.types import Accelerator

    if inventory.driver_cuda is not None:
        return inventory.driver_cuda

    drivers = [d.driver_version for d in inventory.devices if d.accelerator is Accelerator.CUDA and d.driver_version]
    return driver_cuda_version(max(drivers, key=lambda v: parse_driver_version(v) or (0,), default=None))


def collect_capabilities(
    interpreters: Sequence[str],
    support: SupportMatrix,
    prober: EnvironmentProber,
    discovery: DiscoveryConfig | None = None,
    nvidia: NvidiaSmi | None = None,
    node_id: str | None = None,
) -> Capabilities:
    """Probe hardware and every interpreter now, and return this machine's capabilities."""
    inventory = discover_host(discovery or DiscoveryConfig(), support, nvidia=nvidia)
    prober.set_driver_state(inventory.driver_state, persist=not driver_unsettled(inventory.health))
    envs = [prober.probe(i) for i in interpreters]
    return build_capabilities(inventory, envs, node_id or machine_node_id(inventory.hostname), time.time())
