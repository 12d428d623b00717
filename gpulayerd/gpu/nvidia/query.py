"""NVIDIA GPUs through ``nvidia-smi``: run the queries, retry without rejected fields.

:class:`NvidiaSmi` runs the tool through a :class:`~gpulayerd.gpu.command.CommandRunner`
and remembers, per binary, which query fields that binary rejects;
:func:`query_compute_apps` asks which compute processes use each GPU. The output is
parsed and failures classified by the pure functions in :mod:`gpulayerd.gpu.nvidia.parse`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulayerd.core.types import DeviceKind, DeviceSnapshot, DeviceState, ProbeHealth, ProbeStatus, SupportMatrix
from gpulayerd.gpu.command import CommandRunner, decisive_line
from gpulayerd.gpu.nvidia.followup import finish_devices, mig_topology
from gpulayerd.gpu.nvidia.parse import (
    COMPUTE_APPS_FIELDS,
    NvidiaGpu,
    classify_nvidia_failure,
    nvidia_devices,
    nvidia_gpus,
    parse_compute_apps,
    parse_nvidia_csv,
)

__all__ = [
    "NVIDIA_QUERY_FIELDS",
    "NVIDIA_SMI_SEARCH_DIRS",
    "ComputeApps",
    "NvidiaProbe",
    "NvidiaSmi",
    "query_compute_apps",
]

logger = logging.getLogger(__name__)

SOURCE = "nvidia-smi"

NVIDIA_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "compute_cap",
    "driver_version",
)
"""The ``--query-gpu`` fields the daemon asks for, in this order."""

REQUIRED_FIELDS: frozenset[str] = frozenset({"index"})
"""Fields a query is never retried without: a GPU without an index cannot be granted."""

NVIDIA_SMI_SEARCH_DIRS: tuple[str, ...] = (
    "/usr/lib/wsl/lib",  # WSL2: the Windows driver's tools, often not on PATH
    "/usr/bin",
    "/usr/local/nvidia/bin",  # containers with the driver mounted by the runtime
    "/usr/local/bin",
    "/opt/nvidia/bin",
    "/usr/lib/nvidia/bin",
    "/run/current-system/sw/bin",  # NixOS
    "/bin",
)
"""Directories searched for nvidia-smi after PATH, in order."""

_FORMAT = "--format=csv,noheader,nounits"
_NO_PROCESSES = re.compile(r"no running (?:compute )?processes found", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ComputeApps:
    """Compute processes per GPU from ``--query-compute-apps``.

    Attributes:
        pids_by_uuid: ``gpu_uuid`` -> sorted ``pid``s; None if the query failed.
        message: the failure in the tool's words, empty when it worked.
        valid_rows: when the query failed: the pids of the rows it still printed, by
            ``gpu_uuid`` (those GPUs are busy; every other GPU's processes are unknown).
    """

    pids_by_uuid: Mapping[str, tuple[int, ...]] | None
    message: str = ""
    valid_rows: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def query_compute_apps(path: str, runner: CommandRunner, timeout_s: float) -> ComputeApps:
    """Ask nvidia-smi which compute processes run on which GPU; never raises.

    A failed query (non-zero exit, a timeout, or only diagnostics) gives ``pids_by_uuid``
    None, the decisive line of its output as ``message``, and the rows it still printed
    in ``valid_rows``.
    """
    result = runner([path, f"--query-compute-apps={','.join(COMPUTE_APPS_FIELDS)}", _FORMAT], timeout_s)
    rows = parse_compute_apps(result.stdout)
    if result.timed_out or result.not_found or result.returncode != 0:
        failure = classify_nvidia_failure(
            result.stdout, result.stderr, result.returncode, result.timed_out, timeout_s
        )
        return ComputeApps(None, failure.message, valid_rows=rows)
    parsed = parse_nvidia_csv(result.stdout, COMPUTE_APPS_FIELDS)
    odd = [d for d in parsed.diagnostics if not _NO_PROCESSES.search(d)]
    if odd:
        return ComputeApps(None, decisive_line(odd), valid_rows=rows)
    return ComputeApps(rows)


@dataclass(frozen=True, slots=True)
class NvidiaProbe:
    """The result of one nvidia-smi probe.

    Attributes:
        health: how the probe went; OK only with at least one GPU.
        devices: one CUDA device per GPU row, in nvidia-smi order.
        notes: unknown values, skipped lines, retried queries, in words.
        fields: the ``--query-gpu`` fields of the last query asked.
        nvml_library_version: from a driver/library mismatch message, when printed.
        driver_cuda: the newest CUDA the driver supports (``"12.4"``): plain nvidia-smi's
            ``CUDA Version:`` header, else the driver -> CUDA table; None without a GPU.
    """

    health: ProbeHealth
    devices: tuple[DeviceSnapshot, ...] = ()
    notes: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    nvml_library_version: str | None = None
    driver_cuda: str | None = None


class NvidiaSmi:
    """Runs nvidia-smi and remembers which query fields each binary rejects.

    A binary is its path and modification time, so an upgraded nvidia-smi is asked for
    every field again. One instance lives as long as the daemon; it is not thread-safe.
    """

    def __init__(self, fields: Sequence[str] = NVIDIA_QUERY_FIELDS) -> None:
        """Ask for ``fields`` (``--query-gpu`` names) unless a binary rejected some."""
        self._fields = tuple(fields)
        self._unsupported: dict[tuple[str, int | None], frozenset[str]] = {}
        self._driver_cuda: dict[tuple[str, int | None, str | None], str | None] = {}

    def driver_cuda(self, path: str, runner: CommandRunner, timeout_s: float,
                    driver_version: str | None) -> str | None:
        """:func:`query_driver_cuda`, asked once per binary and driver version (the header changes
        only with the driver): the first probe runs plain ``nvidia-smi`` once, later ones nothing."""
        key = (*_binary_key(path), driver_version)
        if key not in self._driver_cuda:
            self._driver_cuda[key] = query_driver_cuda(path, runner, timeout_s, driver_version)
        return self._driver_cuda[key]

    def query_fields(self, path: str) -> tuple[str, ...]:
        """The fields the next probe of the binary at ``path`` asks for."""
        rejected = self._unsupported.get(_binary_key(path), frozenset())
        return tuple(f for f in self._fields if f not in rejected)

    def probe(
        self,
        path: str | None,
        runner: CommandRunner,
        timeout_s: float,
        support: SupportMatrix,
        system_memory_bytes: int | None,
        query_apps: bool = True,
    ) -> NvidiaProbe:
        """Query the GPUs once; tool failures come back as health, never as exceptions.

        Args:
            path: the nvidia-smi executable; None when it was not found.
            runner: runs each command (with a hard timeout).
            timeout_s: limit for each nvidia-smi call, in seconds.
            support: the support matrix (decides ``execution_supported``).
            system_memory_bytes: system RAM, the memory of unified-memory parts.
            query_apps: also fill ``foreign_pids`` from ``--query-compute-apps``.
        """
        if path is None:
            return NvidiaProbe(ProbeHealth(SOURCE, ProbeStatus.NOT_FOUND, "nvidia-smi not found"))
        notes: list[str] = []
        answer = self._query_gpus(path, runner, timeout_s, notes)
        if isinstance(answer, NvidiaProbe):
            return answer
        fields, gpus, stdout = answer
        topology = mig_topology(path, runner, timeout_s, notes)
        pids: Mapping[str, tuple[int, ...]] | None = None
        apps: ComputeApps | None = None
        if query_apps:
            apps = query_compute_apps(path, runner, timeout_s)
            pids = apps.pids_by_uuid
            if pids is None:
                kept = f"; kept its {sum(map(len, apps.valid_rows.values()))} valid row(s)" if apps.valid_rows else ""
                notes.append(f"compute processes unknown (nvidia-smi --query-compute-apps: {apps.message}){kept}")
        devices, device_notes = nvidia_devices(gpus, support, system_memory_bytes, pids)
        notes.extend(device_notes)
        devices, lost = finish_devices(
            devices, stdout, topology, (apps.pids_by_uuid, apps.valid_rows) if apps is not None else None,
            path, runner, timeout_s, notes
        )
        drivers = sorted({g.driver_version for g in gpus if g.driver_version})
        message = f"{len(gpus)} GPU(s)" + (f", driver {', '.join(drivers)}" if drivers else "")
        newest = max(drivers, key=_driver_key, default=None)
        driver_cuda = self.driver_cuda(path, runner, timeout_s, newest)
        status = ProbeStatus.OK
        faulty = [d for d in devices if d.kind is DeviceKind.GPU and d.state is DeviceState.UNUSABLE
                  and d.state_reason != "compute mode Prohibited"]
        if lost or faulty:
            status = ProbeStatus.DEGRADED
            words = [gpu.line for gpu in lost] + [f"GPU {d.index}: {d.state_reason}" for d in faulty]
            message = (f"{len(gpus) - len(faulty)} GPU(s) ok, {len(lost) + len(faulty)} not: {decisive_line(words)}"
                       + (f"; driver {', '.join(drivers)}" if drivers else ""))
        return NvidiaProbe(
            ProbeHealth(SOURCE, status, message, path),
            devices=devices,
            notes=tuple(notes),
            fields=fields,
            driver_cuda=driver_cuda,
        )

    def _query_gpus(
        self, path: str, runner: CommandRunner, timeout_s: float, notes: list[str]
    ) -> tuple[tuple[str, ...], tuple[NvidiaGpu, ...], str] | NvidiaProbe:
        """Run ``--query-gpu``, dropping rejected fields; (fields, GPUs, stdout) or a failed probe."""
        fields = self.query_fields(path)
        skipped = [f for f in self._fields if f not in fields]
        if skipped:
            notes.append(f"not asking {path} for {', '.join(skipped)}: it rejected them before")
        for _ in range(len(self._fields)):
            fields = self.query_fields(path)
            result = runner([path, f"--query-gpu={','.join(fields)}", _FORMAT], timeout_s)
            if result.not_found:
                return NvidiaProbe(ProbeHealth(SOURCE, ProbeStatus.NOT_FOUND, "nvidia-smi not found", path))
            parsed = parse_nvidia_csv(result.stdout, fields)
            gpus, row_notes = nvidia_gpus(parsed)
            if gpus and not result.timed_out:
                notes.extend(row_notes)
                notes.extend(f"nvidia-smi: {line}" for line in _lines(parsed.diagnostics, result.stderr))
                if result.returncode != 0:
                    notes.append(
                        f"nvidia-smi exited with status {result.returncode} but listed {len(gpus)} GPU(s)"
                    )
                return fields, gpus, result.stdout
            failure = classify_nvidia_failure(
                result.stdout, result.stderr, result.returncode, result.timed_out, timeout_s
            )
            droppable = frozenset(f for f in failure.unsupported_fields if f in fields) - REQUIRED_FIELDS
            if droppable:
                self._remember_unsupported(path, droppable)
                notes.append(
                    f"{path} does not support --query-gpu field(s) {', '.join(sorted(droppable))} "
                    f"({failure.message!r}); asked again without them"
                )
                continue
            message = failure.message
            if failure.nvml_library_version and failure.nvml_library_version not in message:
                message = f"{message} (NVML library version: {failure.nvml_library_version})"
            notes.extend(
                f"nvidia-smi: {line}"
                for line in _lines(parsed.diagnostics, result.stderr)
                if line != failure.message
            )
            return NvidiaProbe(
                ProbeHealth(SOURCE, failure.status, message, path),
                notes=tuple(notes),
                fields=fields,
                nvml_library_version=failure.nvml_library_version,
            )
        return NvidiaProbe(
            ProbeHealth(SOURCE, ProbeStatus.ERROR, "nvidia-smi rejected every query field set", path),
            notes=tuple(notes),
            fields=fields,
        )

    def _remember_unsupported(self, path: str, rejected: frozenset[str]) -> None:
        key = _binary_key(path)
        known = self._unsupported.get(key, frozenset())
        if not rejected <= known:
            logger.info("nvidia-smi %s rejects query field(s) %s; not asking again", path, sorted(rejected))
        self._unsupported[key] = known | rejected


def _lines(diagnostics: Sequence[str], stderr: str) -> list[str]:
    return [*diagnostics, *(ln.strip() for ln in stderr.splitlines() if ln.strip())]


def _binary_key(path: str) -> tuple[str, int | None]:
    try:
        return (path, os.stat(path).st_mtime_ns)
    except OSError:
        return (path, None)


def _driver_key(version: str) -> tuple[int, ...]:
    from gpulayerd.core.matching.cuda_compat import parse_driver_version

    return parse_driver_version(version) or (0,)


_CUDA_HEADER = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


def parse_cuda_version_header(text: str) -> str | None:
    """The driver's CUDA version from plain ``nvidia-smi``'s header
    (``| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |`` -> ``"12.4"``);
    None when the header has none (``CUDA Version: N/A`` or no header)."""
    m = _CUDA_HEADER.search(text)
    return m.group(1) if m else None


def query_driver_cuda(path: str | None, runner: CommandRunner, timeout_s: float,
                      driver_version: str | None = None) -> str | None:
    """The newest CUDA the driver supports: nvidia-smi's header, else the driver -> CUDA table of
    :func:`gpulayerd.core.matching.cuda_compat.driver_cuda_version` for ``driver_version``; never raises.

    Runs ``nvidia-smi`` without arguments once (blocking, at most ``timeout_s`` seconds).
    """
    from gpulayerd.core.matching.cuda_compat import driver_cuda_version

    if path is not None:
        result = runner([path], timeout_s)
        if not (result.timed_out or result.not_found) and result.returncode == 0:
            found = parse_cuda_version_header(result.stdout)
            if found is not None:
                return found
    return driver_cuda_version(driver_version)
