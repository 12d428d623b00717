"""NVIDIA GPUs through ``nvidia-smi``: run the queries, retry without rejected fields.

:class:`NvidiaSmi` runs the tool through a :class:`~gpulayerd.gpu.command.CommandRunner`
and remembers, per binary, which query fields that binary rejects;
:func:`query_compute_apps` asks which compute processes use each GPU. The output is
parsed and failures classified by the pure functions in :mod:`gpulayerd.gpu.nvidia_parse`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulayerd.core.types import DeviceSnapshot, ProbeHealth, ProbeStatus, SupportMatrix
from gpulayerd.gpu.command import CommandRunner
from gpulayerd.gpu.nvidia_parse import (
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
    """

    pids_by_uuid: Mapping[str, tuple[int, ...]] | None
    message: str = ""


def query_compute_apps(path: str, runner: CommandRunner, timeout_s: float) -> ComputeApps:
    """Ask nvidia-smi which compute processes run on which GPU; never raises."""
    result = runner([path, f"--query-compute-apps={','.join(COMPUTE_APPS_FIELDS)}", _FORMAT], timeout_s)
    if result.timed_out or result.not_found or result.returncode != 0:
        failure = classify_nvidia_failure(
            result.stdout, result.stderr, result.returncode, result.timed_out, timeout_s
        )
        return ComputeApps(None, failure.message)
    parsed = parse_nvidia_csv(result.stdout, COMPUTE_APPS_FIELDS)
    odd = [d for d in parsed.diagnostics if not _NO_PROCESSES.search(d)]
    if odd and not parsed.rows:
        return ComputeApps(None, odd[0])
    return ComputeApps(parse_compute_apps(result.stdout))


@dataclass(frozen=True, slots=True)
class NvidiaProbe:
    """The result of one nvidia-smi probe.

    Attributes:
        health: how the probe went; OK only with at least one GPU.
        devices: one CUDA device per GPU row, in nvidia-smi order.
        notes: unknown values, skipped lines, retried queries, in words.
        fields: the ``--query-gpu`` fields of the last query asked.
        nvml_library_version: from a driver/library mismatch message, when printed.
    """

    health: ProbeHealth
    devices: tuple[DeviceSnapshot, ...] = ()
    notes: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    nvml_library_version: str | None = None


class NvidiaSmi:
    """Runs nvidia-smi and remembers which query fields each binary rejects.

    A binary is its path and modification time, so an upgraded nvidia-smi is asked for
    every field again. One instance lives as long as the daemon; it is not thread-safe.
    """

    def __init__(self, fields: Sequence[str] = NVIDIA_QUERY_FIELDS) -> None:
        """Ask for ``fields`` (``--query-gpu`` names) unless a binary rejected some."""
        self._fields = tuple(fields)
        self._unsupported: dict[tuple[str, int | None], frozenset[str]] = {}

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
        fields, gpus = answer
        pids: Mapping[str, tuple[int, ...]] | None = None
        if query_apps:
            apps = query_compute_apps(path, runner, timeout_s)
            pids = apps.pids_by_uuid
            if pids is None:
                notes.append(f"compute processes unknown (nvidia-smi --query-compute-apps: {apps.message})")
        devices, device_notes = nvidia_devices(gpus, support, system_memory_bytes, pids)
        notes.extend(device_notes)
        drivers = sorted({g.driver_version for g in gpus if g.driver_version})
        message = f"{len(gpus)} GPU(s)" + (f", driver {', '.join(drivers)}" if drivers else "")
        return NvidiaProbe(
            ProbeHealth(SOURCE, ProbeStatus.OK, message, path),
            devices=devices,
            notes=tuple(notes),
            fields=fields,
        )

    def _query_gpus(
        self, path: str, runner: CommandRunner, timeout_s: float, notes: list[str]
    ) -> tuple[tuple[str, ...], tuple[NvidiaGpu, ...]] | NvidiaProbe:
        """Run ``--query-gpu``, dropping rejected fields; (fields, GPUs) or a failed probe."""
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
                return fields, gpus
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
