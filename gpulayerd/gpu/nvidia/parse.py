"""Parsing and classifying ``nvidia-smi`` output: pure functions over the tool's text.

Recorded outputs test these directly; :mod:`gpulayerd.gpu.nvidia.query` runs the tool and feeds
them. ``--query-gpu`` CSV becomes :class:`NvidiaGpu` rows and then device snapshots,
``--query-compute-apps`` CSV becomes pids per GPU, and a call that listed no GPU is
classified into a :class:`NvidiaFailure`.

Units: ``memory.total`` and ``memory.used`` come in MiB (``nounits``) and leave as bytes
(MiB * 2^20). An unknown reading is None, never a placeholder string.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    DeviceState,
    MemoryKind,
    ProbeStatus,
    SupportMatrix,
)
from gpulayerd.gpu.command import decisive_line
from gpulayerd.models import parse_compute_capability

__all__ = [
    "COMPUTE_APPS_FIELDS",
    "MIB",
    "UNIFIED_MEMORY_NAME_PATTERNS",
    "NvidiaCsv",
    "NvidiaFailure",
    "NvidiaGpu",
    "classify_nvidia_failure",
    "fault_placeholder",
    "fault_state",
    "is_placeholder",
    "nvidia_devices",
    "nvidia_gpus",
    "parse_compute_apps",
    "parse_nvidia_csv",
]

MIB = 2**20
"""Bytes in one MiB, the unit of nvidia-smi's memory fields."""

COMPUTE_APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")
"""The ``--query-compute-apps`` fields the daemon asks for."""

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

_MISMATCH = re.compile(r"driver/library version mismatch", re.IGNORECASE)
_NVML_VERSION = re.compile(r"NVML library version:\s*([0-9][0-9A-Za-z.\-]*)")
_DRIVER_UNAVAILABLE = re.compile(
    r"NVIDIA (?:display |kernel )?driver|driver not loaded|libnvidia-ml", re.IGNORECASE
)
_NO_DEVICES = re.compile(r"no devices were found", re.IGNORECASE)
_UNSUPPORTED_FIELD = re.compile(r"is not a valid field to query", re.IGNORECASE)
_FIELD_NAME = re.compile(r"Field\s+\"?([A-Za-z0-9_.]+)\"?\s+is not a valid field", re.IGNORECASE)
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]$")
_FAULT = re.compile(r"^\[\s*(.*(?:requires reset|unknown error|gpu is lost|gpu lost|fallen off).*?)\s*\]$",
                    re.IGNORECASE)


def fault_placeholder(value: str | None) -> str | None:
    """The tool's words if an nvidia-smi field reads a fault instead of a value, else None.

    ``[GPU requires reset]`` (NVML_ERROR_RESET_REQUIRED, after an Xid or GSP fault), ``[Unknown
    Error]`` and ``[GPU is lost]`` mean the GPU cannot run work now: ``"GPU requires reset"``.
    ``[N/A]``, ``[Not Supported]`` and ``[Insufficient Permissions]`` are not faults (None): the
    reading is merely unknown.
    """
    if value is None:
        return None
    m = _FAULT.match(value.strip())
    return m.group(1) if m else None


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
        faults: one mapping per row (same order as ``rows``): field name -> the tool's words for
            each field that read a fault placeholder (:func:`fault_placeholder`); empty when none.
    """

    rows: tuple[Mapping[str, str | None], ...] = ()
    diagnostics: tuple[str, ...] = ()
    faults: tuple[Mapping[str, str], ...] = ()


def parse_nvidia_csv(stdout: str, fields: Sequence[str]) -> NvidiaCsv:
    """Parse ``--format=csv,noheader,nounits`` output for the given field list.

    Blank lines are skipped, and so is a header line naming the fields (``csv``
    without ``noheader``). A line with any other number of fields than ``fields`` is a
    diagnostic, never a row. Placeholders set their one field to None; the row stays.
    """
    rows: list[Mapping[str, str | None]] = []
    faults: list[Mapping[str, str]] = []
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
        faults.append({f: words for f, v in zip(fields, values, strict=True)
                       if (words := fault_placeholder(v)) is not None})
    return NvidiaCsv(rows=tuple(rows), diagnostics=tuple(diagnostics), faults=tuple(faults))


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
        fault: fields that read a fault placeholder, with the tool's words
            (``(("memory.used", "GPU requires reset"),)``); empty for a healthy row.
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None
    fault: tuple[tuple[str, str], ...] = ()


def nvidia_gpus(parsed: NvidiaCsv) -> tuple[tuple[NvidiaGpu, ...], tuple[str, ...]]:
    """Type the rows of a ``--query-gpu`` answer.

    Returns:
        (GPUs in output order, notes). A row without an integer ``index`` is not a GPU
        and becomes a note; an unreadable number in another field becomes None and a note.
    """
    gpus: list[NvidiaGpu] = []
    notes: list[str] = []
    faults = parsed.faults or tuple({} for _ in parsed.rows)
    for row, fault in zip(parsed.rows, faults, strict=True):
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
                fault=tuple(fault.items()),
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
        state, reason = fault_state(gpu.fault)
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
                state=state,
                state_reason=reason,
            )
        )
    return tuple(devices), tuple(notes)


def fault_state(fault: Sequence[tuple[str, str]]) -> tuple[DeviceState, str]:
    """(``state``, ``state_reason``) of a GPU whose fields read fault placeholders: ``unusable`` with
    the tool's words and the fields (``"GPU requires reset (pstate, memory.used)"``); (ok, "") when none."""
    if not fault:
        return DeviceState.OK, ""
    words = list(dict.fromkeys(w for _, w in fault))
    return DeviceState.UNUSABLE, f"{'; '.join(words)} ({', '.join(f for f, _ in fault)})"


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
    first = decisive_line(lines)
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
