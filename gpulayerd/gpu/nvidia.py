"""NVIDIA GPUs through ``nvidia-smi``: query, parse the CSV, classify failures.

The parsers and the failure classifier are pure functions over the tool's output, so
recorded outputs test them directly. :class:`NvidiaSmi` runs the tool through a
:class:`~gpulayerd.gpu.discovery.CommandRunner` and remembers, per binary, which query
fields that binary rejects.

Units: ``memory.total`` and ``memory.used`` come in MiB (``nounits``) and leave as bytes
(MiB * 2^20). An unknown reading is None, never a placeholder string.
"""

from __future__ import annotations

import csv
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    SupportMatrix,
)
from gpulayerd.models import parse_compute_capability

if TYPE_CHECKING:
    from gpulayerd.gpu.discovery import CommandRunner

__all__ = [
    "COMPUTE_APPS_FIELDS",
    "MIB",
    "NVIDIA_QUERY_FIELDS",
    "NVIDIA_SMI_SEARCH_DIRS",
    "UNIFIED_MEMORY_NAME_PATTERNS",
    "ComputeApps",
    "NvidiaCsv",
    "NvidiaFailure",
    "NvidiaGpu",
    "NvidiaProbe",
    "NvidiaSmi",
    "classify_nvidia_failure",
    "is_placeholder",
    "nvidia_devices",
    "nvidia_gpus",
    "parse_compute_apps",
    "parse_nvidia_csv",
    "query_compute_apps",
]

logger = logging.getLogger(__name__)

SOURCE = "nvidia-smi"
MIB = 2**20
"""Bytes in one MiB, the unit of nvidia-smi's memory fields."""

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

COMPUTE_APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")
"""The ``--query-compute-apps`` fields the daemon asks for."""

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

UNIFIED_MEMORY_NAME_PATTERNS: tuple[str, ...] = (
    r"\bGB10\b",
    r"\bJetson\b",
    r"\bOrin\b",
    r"\bThor\b",
    r"\bXavier\b",
    r"\bTegra\b",
    r"\bnvgpu\b",
)
"""Regexes (case-insensitive) on ``name`` for integrated parts whose memory is system RAM."""

_FORMAT = "--format=csv,noheader,nounits"
_MISMATCH = re.compile(r"driver/library version mismatch", re.IGNORECASE)
_NVML_VERSION = re.compile(r"NVML library version:\s*([0-9][0-9A-Za-z.\-]*)")
_DRIVER_UNAVAILABLE = re.compile(
    r"NVIDIA (?:display |kernel )?driver|driver not loaded|libnvidia-ml", re.IGNORECASE
)
_NO_DEVICES = re.compile(r"no devices were found", re.IGNORECASE)
_UNSUPPORTED_FIELD = re.compile(r"is not a valid field to query", re.IGNORECASE)
_FIELD_NAME = re.compile(r"Field\s+\"?([A-Za-z0-9_.]+)\"?\s+is not a valid field", re.IGNORECASE)
_NO_PROCESSES = re.compile(r"no running (?:compute )?processes found", re.IGNORECASE)
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]$")


def is_placeholder(value: str) -> bool:
    """True if an nvidia-smi field holds no reading.

    Covers ``[N/A]``, ``[Not Supported]``, ``[Insufficient Permissions]``,
    ``[Unknown Error]``, any other bracketed token, a bare ``N/A`` and an empty field.
    """
    text = value.strip()
    return not text or text.upper() == "N/A" or (text.startswith("[") and text.endswith("]"))


@dataclass(frozen=True, slots=True)
class NvidiaCsv:
    """nvidia-smi CSV split into rows and everything else.

    Attributes:
        rows: one mapping per line with exactly the requested number of fields, field
            name -> stripped text, or None where the tool printed a placeholder.
        diagnostics: non-blank lines that are not rows (messages, truncated lines),
            verbatim, in output order.
    """

    rows: tuple[Mapping[str, str | None], ...] = ()
    diagnostics: tuple[str, ...] = ()


def parse_nvidia_csv(stdout: str, fields: Sequence[str]) -> NvidiaCsv:
    """Parse ``--format=csv,noheader,nounits`` output for the given field list.

    Blank lines are skipped, and so is a header line naming the fields (``csv``
    without ``noheader``). A line with any other number of fields than ``fields`` is a
    diagnostic, never a row. Placeholders set their one field to None; the row stays.
    """
    rows: list[Mapping[str, str | None]] = []
    diagnostics: list[str] = []
    names = [f.strip().lower() for f in fields]
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            values = [v.strip() for v in next(csv.reader([line], skipinitialspace=True))]
        except csv.Error:
            diagnostics.append(line.strip())
            continue
        if len(values) != len(fields):
            diagnostics.append(line.strip())
            continue
        if [_UNIT_SUFFIX.sub("", v).lower() for v in values] == names:
            continue
        rows.append({f: (None if is_placeholder(v) else v) for f, v in zip(fields, values, strict=True)})
    return NvidiaCsv(rows=tuple(rows), diagnostics=tuple(diagnostics))


@dataclass(frozen=True, slots=True)
class NvidiaGpu:
    """One GPU row of ``nvidia-smi --query-gpu``, typed. None means unknown or not asked.

    Attributes:
        index: ``index``, the PCI bus order nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID use.
        uuid: ``uuid`` (``GPU-...``).
        name: ``name``, the product name (may contain spaces).
        memory_total_mib: ``memory.total`` in MiB; None on unified-memory parts.
        memory_used_mib: ``memory.used`` in MiB.
        compute_capability: ``compute_cap`` as (major, minor).
        driver_version: ``driver_version``, kept as the string the tool printed.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None


def nvidia_gpus(parsed: NvidiaCsv) -> tuple[tuple[NvidiaGpu, ...], tuple[str, ...]]:
    """Type the rows of a ``--query-gpu`` answer.

    Returns:
        (GPUs in output order, notes). A row without an integer ``index`` is not a GPU
        and becomes a note; an unreadable number in another field becomes None and a note.
    """
    gpus: list[NvidiaGpu] = []
    notes: list[str] = []
    for row in parsed.rows:
        index = _parse_int(row.get("index"), "index", notes)
        if index is None:
            notes.append(f"nvidia-smi row without a usable index ignored: {dict(row)!r}")
            continue
        cc_text = row.get("compute_cap")
        try:
            cc = parse_compute_capability(cc_text)
        except ValueError:
            notes.append(f"GPU {index}: compute_cap {cc_text!r} is not major.minor; treated as unknown")
            cc = None
        gpus.append(
            NvidiaGpu(
                index=index,
                uuid=row.get("uuid"),
                name=row.get("name"),
                memory_total_mib=_parse_int(row.get("memory.total"), f"GPU {index} memory.total", notes),
                memory_used_mib=_parse_int(row.get("memory.used"), f"GPU {index} memory.used", notes),
                compute_capability=cc,
                driver_version=row.get("driver_version"),
            )
        )
    return tuple(gpus), tuple(notes)


def nvidia_devices(
    gpus: Sequence[NvidiaGpu],
    support: SupportMatrix,
    system_memory_bytes: int | None,
    pids_by_uuid: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[tuple[DeviceSnapshot, ...], tuple[str, ...]]:
    """Turn typed GPU rows into device snapshots.

    A part whose ``name`` matches :data:`UNIFIED_MEMORY_NAME_PATTERNS` has unified
    memory: when nvidia-smi gives no ``memory.total`` it is ``system_memory_bytes``
    (system RAM). Any other card is dedicated, and an unknown total stays None.

    Args:
        gpus: typed rows, any order.
        support: the support matrix; the CUDA row decides ``execution_supported``.
        system_memory_bytes: system RAM in bytes; None if unknown.
        pids_by_uuid: compute processes per GPU uuid (becomes ``foreign_pids``).

    Returns:
        (devices in input order, notes about unknown values).
    """
    schedulable = _schedulable(support, Accelerator.CUDA)
    pids = pids_by_uuid or {}
    devices: list[DeviceSnapshot] = []
    notes: list[str] = []
    for gpu in gpus:
        unified = gpu.name is not None and any(
            re.search(p, gpu.name, re.IGNORECASE) for p in UNIFIED_MEMORY_NAME_PATTERNS
        )
        total = None if gpu.memory_total_mib is None else gpu.memory_total_mib * MIB
        if total is None and unified:
            total = system_memory_bytes
            if total is None:
                notes.append(f"GPU {gpu.index} ({gpu.name}): unified memory, but system RAM is unknown")
        elif total is None:
            notes.append(f"GPU {gpu.index} ({gpu.name}): memory.total unknown")
        if gpu.compute_capability is None:
            notes.append(f"GPU {gpu.index} ({gpu.name}): compute capability unknown")
        devices.append(
            DeviceSnapshot(
                accelerator=Accelerator.CUDA,
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_bytes=total,
                memory_used_bytes=None if gpu.memory_used_mib is None else gpu.memory_used_mib * MIB,
                memory_kind=MemoryKind.UNIFIED if unified else MemoryKind.DEDICATED,
                compute_capability=gpu.compute_capability,
                driver_version=gpu.driver_version,
                execution_supported=schedulable,
                float64=True,
                foreign_pids=pids.get(gpu.uuid, ()) if gpu.uuid else (),
            )
        )
    return tuple(devices), tuple(notes)


@dataclass(frozen=True, slots=True)
class NvidiaFailure:
    """Why an nvidia-smi call gave no GPU.

    Attributes:
        status: the outcome; ERROR when nothing more specific fits.
        message: the tool's own line that says what went wrong, verbatim (our words
            only when the tool printed nothing).
        nvml_library_version: the ``NVML library version:`` a driver/library mismatch
            names; None when not printed.
        unsupported_fields: query fields the tool rejected as not valid to query.
    """

    status: ProbeStatus
    message: str
    nvml_library_version: str | None = None
    unsupported_fields: tuple[str, ...] = ()


def classify_nvidia_failure(
    stdout: str,
    stderr: str,
    returncode: int | None,
    timed_out: bool,
    timeout_s: float | None = None,
) -> NvidiaFailure:
    """Classify an nvidia-smi call that produced no GPU row.

    Decided from the text first, the exit status last: "No devices were found" is
    NO_DEVICES whatever the status, and so is a clean exit with no output at all.

    Args:
        stdout: what the tool printed (nvidia-smi prints its errors here).
        stderr: its standard error.
        returncode: exit status; None if it did not exit by itself or never started.
        timed_out: the call was killed at its timeout.
        timeout_s: the timeout, for the message.
    """
    if timed_out:
        after = f" after {timeout_s:g} s" if timeout_s is not None else ""
        message = f"nvidia-smi timed out{after}; its process group was killed"
        return NvidiaFailure(ProbeStatus.TIMEOUT, message)
    lines = [ln.strip() for ln in (stdout + "\n" + stderr).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    for line in lines:
        if _UNSUPPORTED_FIELD.search(line):
            rejected = tuple(m.group(1) for ln in lines for m in _FIELD_NAME.finditer(ln))
            return NvidiaFailure(ProbeStatus.ERROR, line, unsupported_fields=rejected or ("compute_cap",))
    for line in lines:
        if _MISMATCH.search(line):
            version = next((m.group(1) for ln in lines if (m := _NVML_VERSION.search(ln))), None)
            return NvidiaFailure(ProbeStatus.DRIVER_LIBRARY_MISMATCH, line, nvml_library_version=version)
    for line in lines:
        if _DRIVER_UNAVAILABLE.search(line):
            return NvidiaFailure(ProbeStatus.DRIVER_UNAVAILABLE, line)
    for line in lines:
        if _NO_DEVICES.search(line):
            return NvidiaFailure(ProbeStatus.NO_DEVICES, line)
    if returncode is None:
        return NvidiaFailure(ProbeStatus.ERROR, first or "nvidia-smi could not be run")
    if returncode != 0:
        return NvidiaFailure(ProbeStatus.ERROR, first or f"nvidia-smi exited with status {returncode}")
    if first:
        return NvidiaFailure(ProbeStatus.ERROR, first)
    return NvidiaFailure(ProbeStatus.NO_DEVICES, "nvidia-smi listed no GPU")


@dataclass(frozen=True, slots=True)
class ComputeApps:
    """Compute processes per GPU from ``--query-compute-apps``.

    Attributes:
        pids_by_uuid: ``gpu_uuid`` -> sorted ``pid``s; None if the query failed.
        message: the failure in the tool's words, empty when it worked.
    """

    pids_by_uuid: Mapping[str, tuple[int, ...]] | None
    message: str = ""


def parse_compute_apps(stdout: str) -> dict[str, tuple[int, ...]]:
    """Parse ``--query-compute-apps=gpu_uuid,pid,used_memory`` CSV into uuid -> sorted pids.

    "No running processes found" and blank output give an empty mapping; lines that
    are not rows, or have no integer pid, are skipped.
    """
    found: dict[str, set[int]] = {}
    for row in parse_nvidia_csv(stdout, COMPUTE_APPS_FIELDS).rows:
        uuid, pid_text = row.get("gpu_uuid"), row.get("pid")
        if uuid is None or pid_text is None or not pid_text.isdigit():
            continue
        found.setdefault(uuid, set()).add(int(pid_text))
    return {uuid: tuple(sorted(pids)) for uuid, pids in sorted(found.items())}


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


def _schedulable(support: SupportMatrix, accelerator: Accelerator) -> bool:
    try:
        return support.row(accelerator).schedulable
    except KeyError:
        return False


def _parse_int(value: str | None, what: str, notes: list[str]) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if number.is_integer():
        return int(number)
    notes.append(f"{what} {value!r} is not a whole number; treated as unknown")
    return None
