"""Host detection: NVIDIA GPUs (nvidia-smi), the Apple GPU, AMD GPUs (rocm-smi), CPU and RAM.

:func:`discover_host` is the entry point; it never raises for a missing, broken or hung
tool: every source reports a :class:`~gpulayerd.core.types.ProbeHealth` instead, so a
broken probe never looks like "no GPU". Every external command runs through a
:class:`~gpulayerd.gpu.command.CommandRunner` (default
:func:`~gpulayerd.gpu.command.run_command`): ``LC_ALL=C``, its own process group, a hard
timeout after which the whole group is killed. Tests pass their own runner
or put fake tools on the search path through :class:`DiscoveryConfig`.

Timeouts and search paths come in through :class:`DiscoveryConfig`; nothing here is a
module setting that tests must patch.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import shutil
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.types import Accelerator, DeviceSnapshot, DeviceState, ProbeHealth, ProbeStatus, SupportMatrix
from gpulayerd.gpu.apple import AppleFacts, apple_devices, probe_apple, read_apple_facts
from gpulayerd.gpu.command import CommandRunner, run_command
from gpulayerd.gpu.nvidia.mig import normalise_bus_id
from gpulayerd.gpu.nvidia.parse import classify_nvidia_failure, parse_compute_apps, parse_nvidia_csv
from gpulayerd.gpu.nvidia.query import NVIDIA_SMI_SEARCH_DIRS, NvidiaSmi, query_compute_apps
from gpulayerd.gpu.rocm import ROCM_SMI_SEARCH_DIRS, probe_rocm
from gpulayerd.host import sysinfo

__all__ = [
    "DEVICE_NODE_GLOBS",
    "NVIDIA_SMI_SEARCH_DIRS",
    "ROCM_SMI_SEARCH_DIRS",
    "AppleFacts",
    "DiscoveryConfig",
    "HostInventory",
    "NvidiaSmi",
    "apple_devices",
    "classify_nvidia_failure",
    "discover_host",
    "driver_state_of",
    "driver_unsettled",
    "find_executable",
    "find_nvidia_smi",
    "find_rocm_smi",
    "parse_compute_apps",
    "parse_meminfo_total_bytes",
    "parse_nvidia_csv",
    "query_compute_apps",
    "read_apple_facts",
    "with_last_known",
]

logger = logging.getLogger(__name__)

DEVICE_NODE_GLOBS: tuple[str, ...] = ("/dev/nvidia*", "/dev/kfd")
"""The GPU drivers' character devices (NVIDIA's ``/dev/nvidia0``, ``nvidiactl``, ``nvidia-uvm``; ROCm's
``/dev/kfd``): made when the driver loads, so their identity tells a driver (re)load."""

HEALTH_SOURCE_OF = {Accelerator.CUDA: "nvidia-smi", Accelerator.ROCM: "rocm-smi", Accelerator.MPS: "apple"}


def find_executable(name: str, path_env: str | None, extra_dirs: Sequence[str]) -> str | None:
    """Find ``name`` on ``path_env`` (os.pathsep-separated), then in ``extra_dirs``.

    Args:
        name: the executable's file name.
        path_env: a PATH value; None means this process's PATH.
        extra_dirs: directories tried in order after PATH.

    Returns:
        The absolute path of the first executable file found, or None.
    """
    if path_env is None:
        path_env = os.environ.get("PATH", os.defpath)
    found = shutil.which(name, path=path_env) if path_env else None
    if found:
        return os.path.abspath(found)
    for directory in extra_dirs:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def find_nvidia_smi(path_env: str | None, extra_dirs: Sequence[str] = NVIDIA_SMI_SEARCH_DIRS) -> str | None:
    """Find nvidia-smi: PATH first, then WSL2's and common install directories."""
    return find_executable("nvidia-smi", path_env, extra_dirs)


def find_rocm_smi(path_env: str | None, extra_dirs: Sequence[str] = ROCM_SMI_SEARCH_DIRS) -> str | None:
    """Find rocm-smi: PATH first, then ``/opt/rocm/bin`` and common install directories."""
    return find_executable("rocm-smi", path_env, extra_dirs)


def parse_meminfo_total_bytes(text: str) -> int | None:
    """``MemTotal`` of a ``/proc/meminfo`` text in bytes (its kB are KiB); None if absent."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "b"
                return int(parts[0]) * (1024 if unit == "kb" else 1)
    return None


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    """How to look for hardware. Defaults suit a real host.

    Attributes:
        nvidia_smi_timeout_s: limit for each nvidia-smi call, in seconds.
        rocm_smi_timeout_s: limit for the rocm-smi call, in seconds.
        apple_timeout_s: limit for each macOS command (sysctl, sw_vers, uname), in seconds.
        path_env: PATH to search for tools; None means this process's PATH.
        extra_search_dirs: directories tried for nvidia-smi after PATH.
        rocm_search_dirs: directories tried for rocm-smi after PATH.
        system: ``platform.system()`` value to assume; None means this host's.
        machine: ``platform.machine()`` value to assume; None means this host's.
        meminfo_path: Linux ``/proc/meminfo``, read for system RAM; when it is None or
            unreadable, psutil gives system RAM.
        query_compute_apps: also ask nvidia-smi which processes use each GPU.
        use_gpus: look for GPUs at all; False (a daemon run beside another one on this machine,
            ``isolated``) reports none, with a health entry saying why: CPU slots only.
        allow_virtual_mps: schedule the Apple GPU of a macOS virtual machine (else it is ``excluded``).
        device_node_globs: the driver's device nodes, whose identity is part of
            :attr:`HostInventory.driver_state` (they are made anew when the driver loads).
    """

    nvidia_smi_timeout_s: float = 20.0
    rocm_smi_timeout_s: float = 20.0
    apple_timeout_s: float = 10.0
    path_env: str | None = None
    extra_search_dirs: tuple[str, ...] = NVIDIA_SMI_SEARCH_DIRS
    rocm_search_dirs: tuple[str, ...] = ROCM_SMI_SEARCH_DIRS
    system: str | None = None
    machine: str | None = None
    meminfo_path: str | None = "/proc/meminfo"
    query_compute_apps: bool = True
    use_gpus: bool = True
    device_node_globs: tuple[str, ...] = DEVICE_NODE_GLOBS
    allow_virtual_mps: bool = False


@dataclass(frozen=True, slots=True)
class HostInventory:
    """Everything discovery found on this host, taken at one time.

    Attributes:
        devices: accelerator devices, sorted by accelerator then index.
        health: one entry for nvidia-smi, one for rocm-smi, and one for the Apple GPU
            on macOS.
        cpu_count: logical CPUs; None if unknown.
        memory_total_bytes: system RAM in bytes; None if unknown.
        hostname: this host's name.
        platform: ``platform.system()`` (``Linux``, ``Darwin``).
        machine: ``platform.machine()`` (``x86_64``, ``arm64``, ``aarch64``).
        notes: unknown values, skipped output lines, retried queries, in words.
        driver_cuda: the newest CUDA the NVIDIA driver supports, from nvidia-smi's ``CUDA Version:``
            header (else the driver -> CUDA table); None without an NVIDIA GPU.
        driver_state: what an import-based framework check depends on, in one string: each GPU
            tool's probe status and driver versions, and the identity (inode, device number) of the
            driver's device nodes (``/dev/nvidia*``, ``/dev/kfd``). It changes when the driver
            becomes ready, is upgraded or reloaded; the environment prober keys its torch answers on it.
    """

    devices: tuple[DeviceSnapshot, ...]
    health: tuple[ProbeHealth, ...]
    cpu_count: int | None
    memory_total_bytes: int | None
    hostname: str
    platform: str
    machine: str
    notes: tuple[str, ...] = ()
    driver_cuda: str | None = None
    driver_state: str = ""


_REMEMBERED = ("name", "memory_total_bytes", "memory_kind", "compute_capability", "driver_version", "float64")
"""The facts of a GPU that a lost or unusable one keeps from its last good reading (never its use)."""


def with_last_known(devices: Sequence[DeviceSnapshot], last_good: dict[str, DeviceSnapshot]
                    ) -> tuple[DeviceSnapshot, ...]:
    """``devices`` with each lost or unusable GPU's unknown facts (name, total memory and its kind,
    compute capability, driver, float64) taken from its last good reading, found by PCI bus id, else
    uuid; ``last_good`` (bus id or uuid -> device, updated in place) remembers every device read fine.

    A GPU that falls off the bus keeps what it is, so a job it could never run (too little memory,
    too low a compute capability) is not told it waits for it (issue 28); its use (memory used,
    processes) is never carried over.
    """
    out = []
    for d in devices:
        keys = [k for k in ((normalise_bus_id(d.pci_bus_id) if d.pci_bus_id else None), d.uuid) if k]
        if d.state is DeviceState.OK:
            for k in keys:
                last_good[k] = d
            out.append(d)
            continue
        known = next((last_good[k] for k in keys if k in last_good), None)
        if d.state not in (DeviceState.LOST, DeviceState.UNUSABLE) or known is None:
            out.append(d)
            continue
        fill = {f: getattr(known, f) for f in _REMEMBERED if getattr(d, f) is None and getattr(known, f) is not None}
        out.append(replace(d, **fill) if fill else d)
    return tuple(out)


def driver_state_of(health: Sequence[ProbeHealth], devices: Sequence[DeviceSnapshot],
                    node_globs: Sequence[str]) -> str:
    """:attr:`HostInventory.driver_state` from a probe's health, its devices and the device nodes on disk:
    ``"nvidia-smi=ok 550.54.15;rocm-smi=not_found;nodes=nvidia0:1234:195,0 ..."``. Never raises."""
    parts = []
    for h in sorted(health, key=lambda h: h.source):
        drivers = sorted({d.driver_version for d in devices
                          if d.driver_version and HEALTH_SOURCE_OF.get(d.accelerator) == h.source})
        parts.append(f"{h.source}={h.status.value}{' ' + ','.join(drivers) if drivers else ''}")
    nodes = []
    for pattern in node_globs:
        for path in sorted(glob.glob(pattern)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                nodes.append(f"{os.path.basename(path)}:{st.st_ino}:{os.major(st.st_rdev)},{os.minor(st.st_rdev)}")
    return ";".join([*parts, "nodes=" + " ".join(nodes)])


_UNSETTLED = frozenset({ProbeStatus.DRIVER_UNAVAILABLE, ProbeStatus.DRIVER_LIBRARY_MISMATCH, ProbeStatus.TIMEOUT,
                        ProbeStatus.ERROR})


def driver_unsettled(health: Sequence[ProbeHealth]) -> bool:
    """True while a GPU tool exists but cannot reach its driver (not loaded yet, a driver/library
    mismatch, hung): framework answers taken then are not worth keeping across a restart."""
    return any(h.source in ("nvidia-smi", "rocm-smi") and h.status in _UNSETTLED for h in health)


def discover_host(
    config: DiscoveryConfig,
    support: SupportMatrix,
    runner: CommandRunner = run_command,
    nvidia: NvidiaSmi | None = None,
) -> HostInventory:
    """Detect this host's accelerators, CPUs and RAM; tool failures become health entries.

    Blocking (it runs tools, each under its own timeout): call it from a thread, not
    from the event loop.

    Args:
        config: timeouts, search paths and platform overrides.
        support: the support matrix; decides each device's ``execution_supported``.
        runner: runs every external command.
        nvidia: keeps what each nvidia-smi binary rejects across calls; pass the same
            one on every probe (a fresh one is made when None).

    Returns:
        The inventory. Devices carry ``foreign_pids`` for every compute process
        nvidia-smi lists; the caller removes the pids of its own jobs.
    """
    system = config.system or platform.system()
    machine = config.machine or platform.machine()
    path_env = config.path_env if config.path_env is not None else os.environ.get("PATH", os.defpath)
    memory_bytes = _system_memory_bytes(config.meminfo_path)
    devices: list[DeviceSnapshot] = []
    health: list[ProbeHealth] = []
    notes: list[str] = []
    if memory_bytes is None:
        notes.append("system RAM unknown")

    if not config.use_gpus:
        health.append(ProbeHealth("gpus", ProbeStatus.OK, "GPUs not used: this daemon runs beside another "
                                  "gpulayerd of this machine (isolated): CPU slots only", None))
        return HostInventory(devices=(), health=tuple(health), cpu_count=sysinfo.cpu_count(logical=True),
                             memory_total_bytes=memory_bytes, hostname=socket.gethostname(), platform=system,
                             machine=machine, notes=tuple(notes))
    smi = nvidia if nvidia is not None else NvidiaSmi()
    nvidia_path = find_nvidia_smi(path_env, config.extra_search_dirs)
    driver_cuda: str | None = None
    try:
        nv = smi.probe(
            nvidia_path,
            runner,
            config.nvidia_smi_timeout_s,
            support,
            memory_bytes,
            query_apps=config.query_compute_apps,
        )
        devices.extend(nv.devices)
        health.append(nv.health)
        notes.extend(nv.notes)
        driver_cuda = nv.driver_cuda
    except Exception as e:
        logger.exception("nvidia-smi probe failed")
        health.append(ProbeHealth("nvidia-smi", ProbeStatus.ERROR, f"probe failed: {e!r}", nvidia_path))

    rocm_path = find_rocm_smi(path_env, config.rocm_search_dirs)
    try:
        rocm = probe_rocm(rocm_path, runner, config.rocm_smi_timeout_s, support)
        devices.extend(rocm.devices)
        health.append(rocm.health)
        notes.extend(rocm.notes)
    except Exception as e:
        logger.exception("rocm-smi probe failed")
        health.append(ProbeHealth("rocm-smi", ProbeStatus.ERROR, f"probe failed: {e!r}", rocm_path))

    if system == "Darwin":
        try:
            facts = read_apple_facts(
                runner,
                config.apple_timeout_s,
                machine=config.machine,
                uname=find_executable("uname", path_env, ("/usr/bin", "/bin")) or "/usr/bin/uname",
                sysctl=find_executable("sysctl", path_env, ("/usr/sbin", "/sbin")) or "/usr/sbin/sysctl",
                sw_vers=find_executable("sw_vers", path_env, ("/usr/bin",)) or "/usr/bin/sw_vers",
            )
            apple = probe_apple(facts, support, config.allow_virtual_mps)
            devices.extend(apple.devices)
            health.append(apple.health)
            notes.extend(apple.notes)
            if memory_bytes is None:
                memory_bytes = facts.memory_total_bytes
        except Exception as e:
            logger.exception("Apple GPU probe failed")
            health.append(ProbeHealth("apple", ProbeStatus.ERROR, f"probe failed: {e!r}"))

    order = list(Accelerator)
    return HostInventory(
        devices=tuple(sorted(devices, key=lambda d: (order.index(d.accelerator), d.index))),
        health=tuple(health),
        cpu_count=sysinfo.cpu_count(logical=True),
        memory_total_bytes=memory_bytes,
        hostname=socket.gethostname(),
        platform=system,
        machine=machine,
        notes=tuple(notes),
        driver_cuda=driver_cuda,
        driver_state=driver_state_of(health, devices, config.device_node_globs),
    )


def _system_memory_bytes(meminfo_path: str | None) -> int | None:
    if meminfo_path is not None:
        try:
            with open(meminfo_path, encoding="ascii", errors="replace") as f:
                total = parse_meminfo_total_bytes(f.read())
        except OSError:
            total = None
        if total is not None:
            return total
    try:
        return int(sysinfo.virtual_memory().total)
    except Exception:  # psutil raises its own errors on exotic platforms
        logger.debug("sysinfo.virtual_memory() failed", exc_info=True)
        return None

