"""MIG instances and lost GPUs from nvidia-smi's text: pure functions, tested on recorded output.

Sources (NVIDIA's documented formats):

- ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,mig.mode.current --format=csv,noheader,nounits``:
  each GPU's bus id and current MIG mode (``Enabled``, ``Disabled``, ``[N/A]``).
- ``nvidia-smi -L``: ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`` and, under a GPU in MIG
  mode, one ``  MIG 4g.40gb     Device  0: (UUID: MIG-...)`` line per MIG device.
- ``nvidia-smi -q -d MEMORY,PIDS``: per ``GPU 00000000:41:00.0`` block, ``MIG Devices`` /
  ``MIG Device`` blocks (``Index``, ``GPU Instance ID``, ``Compute Instance ID``, ``FB Memory
  Usage`` ``Total``/``Used`` in MiB) and a ``Processes`` block (``GPU instance ID``, ``Compute
  instance ID``, ``Process ID`` per process).

A MIG device's ``Index`` is the ``Device N`` of ``-L``; its processes are those whose GPU
instance (and compute instance) ids are its own. Memory is the MIG device's ``FB Memory
Usage`` total (MiB * 2^20); when that is unreadable, the profile's ``<N>gb`` (N * 10^9 bytes,
approximate, said in a note).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpulayerd.core.types import DeviceKind, DeviceSnapshot, DeviceState

__all__ = [
    "MIG_INDEX_BASE",
    "MIG_MODE_FIELDS",
    "GpuTopology",
    "ListedGpu",
    "ListedMig",
    "LostGpu",
    "MigDevice",
    "QueriedGpu",
    "lost_device",
    "lost_gpus",
    "mig_devices",
    "mig_index",
    "normalise_bus_id",
    "parse_list_gpus",
    "parse_mig_modes",
    "parse_query",
]

MIG_MODE_FIELDS: tuple[str, ...] = ("index", "uuid", "pci.bus_id", "mig.mode.current", "compute_mode", "pstate")
"""The ``--query-gpu`` fields of the second, small query: bus id, MIG mode, compute mode and one
live field (``pstate``; after an Xid it reads ``[GPU requires reset]`` while identity and memory
still read fine)."""

MIG_INDEX_BASE = 1000
"""A MIG device's ``index`` is ``MIG_INDEX_BASE * (parent index + 1) + Device N`` (GPU 0's
``Device 2`` is 1002): unique beside whole-GPU indices, never used in ``CUDA_VISIBLE_DEVICES``
(a MIG device is granted by its ``MIG-...`` uuid)."""

MIB = 2**20

_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\b")
_GPU_INDEX = re.compile(r"\bGPU\s*#?(\d+)\b(?!:[0-9A-Fa-f]{2}:)", re.IGNORECASE)
_TROUBLE = re.compile(r"unable|error|lost|fail|fallen off|not accessible|timed? ?out", re.IGNORECASE)
_LIST_GPU = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")
_LIST_MIG = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")
_Q_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(.*?)\s+:\s*(.*)$")
_ROW_START = re.compile(r"^\d+\s*,")
_PROFILE_GB = re.compile(r"(\d+)gb\b", re.IGNORECASE)
_MIB_VALUE = re.compile(r"^(\d+)\s*MiB$", re.IGNORECASE)


def normalise_bus_id(text: str) -> str | None:
    """``00000000:41:00.0`` and ``0000:41:00.0`` both become ``0000:41:00.0`` (lower case); None if none."""
    m = _BUS.search(text)
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """One row of the MIG-mode query.

    Attributes:
        index: nvidia-smi index.
        uuid: ``GPU-...``; None if unreadable.
        bus_id: normalised PCI bus id; None if unreadable.
        mig_enabled: ``mig.mode.current`` is Enabled (True) or Disabled (False); None for
            ``[N/A]`` (a GPU without MIG) or unreadable.
        compute_mode: ``compute_mode`` as printed (``Default``, ``Exclusive_Process``,
            ``Prohibited``); None if not asked or unreadable.
        fault: fields of this row that read a fault placeholder, with the tool's words
            (:func:`gpulayerd.gpu.nvidia.parse.fault_placeholder`).
    """

    index: int
    uuid: str | None
    bus_id: str | None
    mig_enabled: bool | None
    compute_mode: str | None = None
    fault: tuple[tuple[str, str], ...] = ()


def parse_mig_modes(rows: Sequence[Mapping[str, str | None]],
                    faults: Sequence[Mapping[str, str]] = ()) -> dict[int, GpuTopology]:
    """Type the rows of the MIG-mode query (already split by ``parse_nvidia_csv``; ``faults`` its
    fault placeholders, row by row), by index."""
    out: dict[int, GpuTopology] = {}
    faults = list(faults) or [{} for _ in rows]
    for row, fault in zip(rows, faults, strict=True):
        index = row.get("index")
        if index is None or not index.strip().isdigit():
            continue
        mode = (row.get("mig.mode.current") or "").strip().lower()
        bus = row.get("pci.bus_id")
        out[int(index)] = GpuTopology(
            index=int(index),
            uuid=row.get("uuid"),
            bus_id=normalise_bus_id(bus) if bus else None,
            mig_enabled=True if mode == "enabled" else False if mode == "disabled" else None,
            compute_mode=_compute_mode(row.get("compute_mode")),
            fault=tuple(fault.items()),
        )
    return out


_COMPUTE_MODES = {m.lower().replace(" ", "_"): m
                  for m in ("Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process")}


def _compute_mode(text: str | None) -> str | None:
    """nvidia-smi's ``compute_mode`` in its canonical spelling (``Exclusive_Process``; older tools
    print ``Exclusive Process``); an unknown word is kept as printed."""
    if text is None:
        return None
    return _COMPUTE_MODES.get(text.strip().lower().replace(" ", "_"), text.strip())


@dataclass(frozen=True, slots=True)
class ListedMig:
    """One ``MIG <profile> Device <n>: (UUID: MIG-...)`` line of ``nvidia-smi -L``."""

    profile: str
    device: int
    uuid: str


@dataclass(frozen=True, slots=True)
class ListedGpu:
    """One ``GPU <n>: <name> (UUID: GPU-...)`` line of ``nvidia-smi -L`` with its MIG lines."""

    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


def parse_list_gpus(stdout: str) -> dict[str, ListedGpu]:
    """Parse ``nvidia-smi -L`` into parent uuid -> GPU with its MIG devices; other lines are skipped."""
    out: dict[str, ListedGpu] = {}
    current: ListedGpu | None = None
    for line in stdout.splitlines():
        g = _LIST_GPU.match(line.strip())
        if g is not None:
            current = ListedGpu(int(g.group(1)), g.group(2), g.group(3))
            out[current.uuid] = current
            continue
        m = _LIST_MIG.match(line)
        if m is not None and current is not None:
            current = replace(current, migs=(*current.migs, ListedMig(m.group(1), int(m.group(2)), m.group(3))))
            out[current.uuid] = current
    return out


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One ``MIG Device`` block of ``nvidia-smi -q``; None where unreadable."""

    index: int
    gpu_instance: int | None = None
    compute_instance: int | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None


@dataclass(frozen=True, slots=True)
class QueriedGpu:
    """One ``GPU <bus id>`` block of ``nvidia-smi -q -d MEMORY,PIDS``.

    Attributes:
        migs: MIG device ``Index`` -> its block.
        processes: (GPU instance id, compute instance id, pid) per process; ids None when N/A.
    """

    migs: dict[int, MigDevice] = field(default_factory=dict)
    processes: list[tuple[int | None, int | None, int]] = field(default_factory=list)


def parse_query(stdout: str) -> dict[str, QueriedGpu]:
    """Parse ``nvidia-smi -q -d MEMORY,PIDS`` into normalised bus id -> :class:`QueriedGpu`."""
    out: dict[str, QueriedGpu] = {}
    gpu: QueriedGpu | None = None
    stack: list[tuple[int, str]] = []
    mig: dict[str, int | None] | None = None
    proc: dict[str, int | None] = {}

    def close_mig() -> None:
        nonlocal mig
        if mig is not None and gpu is not None and mig.get("index") is not None:
            idx = mig["index"]
            assert idx is not None
            gpu.migs[idx] = MigDevice(idx, mig.get("gi"), mig.get("ci"), mig.get("total"), mig.get("used"))
        mig = None

    for raw in stdout.splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        line = raw.strip()
        head = _Q_GPU.match(line)
        if head is not None and indent == 0:
            close_mig()
            gpu = QueriedGpu()
            out[normalise_bus_id(head.group(1)) or head.group(1)] = gpu
            stack, proc = [], {}
            continue
        if gpu is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        kv = _KV.match(line)
        if kv is None:
            if line == "MIG Device":
                close_mig()
                mig = {}
            elif line == "Processes":
                close_mig()
            stack.append((indent, line))
            continue
        key, value = kv.group(1).strip().lower(), kv.group(2).strip()
        sections = [name for _, name in stack]
        if "Processes" in sections:
            if key == "gpu instance id":
                proc = {"gi": _int(value)}
            elif key == "compute instance id":
                proc["ci"] = _int(value)
            elif key == "process id" and _int(value) is not None:
                pid = _int(value)
                assert pid is not None
                gpu.processes.append((proc.get("gi"), proc.get("ci"), pid))
                proc = {}
            continue
        if mig is not None and "MIG Device" in sections:
            if key == "index" and "Device Attributes" not in sections:
                mig["index"] = _int(value)
            elif key == "gpu instance id":
                mig["gi"] = _int(value)
            elif key == "compute instance id":
                mig["ci"] = _int(value)
            elif sections and sections[-1] == "FB Memory Usage" and key in ("total", "used"):
                m = _MIB_VALUE.match(value)
                mig[key] = int(m.group(1)) if m else None
    close_mig()
    return out


def _int(value: str) -> int | None:
    text = value.strip()
    return int(text) if text.isdigit() else None


def mig_index(parent_index: int, device: int) -> int:
    """The ``index`` of MIG ``Device device`` of GPU ``parent_index`` (see :data:`MIG_INDEX_BASE`)."""
    return MIG_INDEX_BASE * (parent_index + 1) + device


def mig_devices(
    parent: DeviceSnapshot,
    listed: ListedGpu | None,
    queried: QueriedGpu | None,
    pids_by_uuid: Mapping[str, tuple[int, ...]],
    notes: list[str],
) -> tuple[DeviceSnapshot, ...]:
    """The MIG devices of ``parent`` (a GPU in MIG mode), one snapshot each.

    Args:
        parent: the whole GPU's snapshot (name, compute capability, driver are copied).
        listed: its ``-L`` entry; None when ``-L`` failed (then no instance is known).
        queried: its ``-q -d MEMORY,PIDS`` block; None when that failed: then each instance's
            processes are unknown (never free by default) and memory comes from the profile.
        pids_by_uuid: ``--query-compute-apps`` pids per uuid (a MIG uuid's pids join its own).
        notes: where approximations and unknowns are said.
    """
    if listed is None:
        notes.append(f"GPU {parent.index} is in MIG mode but its MIG devices are unknown (nvidia-smi -L)")
        return ()
    out: list[DeviceSnapshot] = []
    for m in listed.migs:
        block = queried.migs.get(m.device) if queried is not None else None
        total = None if block is None or block.memory_total_mib is None else block.memory_total_mib * MIB
        if total is None:
            gb = _PROFILE_GB.search(m.profile)
            total = int(gb.group(1)) * 10**9 if gb else None
            notes.append(f"GPU {parent.index} MIG {m.profile} device {m.device}: memory from the profile "
                         f"name ({'unknown' if total is None else f'{total // 10**9} GB, approximate'})")
        pids: set[int] = set(pids_by_uuid.get(m.uuid, ()))
        known = queried is not None
        if queried is not None and block is not None and block.gpu_instance is not None:
            pids.update(pid for gi, ci, pid in queried.processes
                        if gi == block.gpu_instance
                        and (ci is None or block.compute_instance is None or ci == block.compute_instance))
        elif queried is not None:
            known = False
            notes.append(f"GPU {parent.index} MIG device {m.device}: GPU instance unknown, "
                         "so its processes are unknown")
        used = None if block is None or block.memory_used_mib is None else block.memory_used_mib * MIB
        out.append(replace(
            parent,
            index=mig_index(parent.index, m.device),
            uuid=m.uuid,
            memory_total_bytes=total,
            memory_used_bytes=used,
            foreign_pids=tuple(sorted(pids)),
            kind=DeviceKind.MIG,
            parent_uuid=parent.uuid,
            mig_profile=m.profile,
            mig_enabled=None,
            processes_known=known,
        ))
    if not out:
        notes.append(f"GPU {parent.index} is in MIG mode with no MIG device: nothing on it can be granted")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LostGpu:
    """A GPU nvidia-smi named in a diagnostic line instead of a row.

    Attributes:
        line: the tool's words, verbatim.
        bus_id: the normalised PCI bus id it named; None if it named an index.
        index: the index it named, else its place among the per-GPU lines of the output.
    """

    line: str
    bus_id: str | None
    index: int | None


def lost_gpus(stdout: str) -> tuple[LostGpu, ...]:
    """Diagnostic lines of a ``--query-gpu`` answer (``index`` first) that name one GPU, by bus
    id or index, in trouble (unable, error, lost, failed, fallen off the bus, ...).

    A GPU named by bus id gets the index of its place among the per-GPU lines (nvidia-smi
    prints one line per GPU in index order: a row, which starts with its index and a comma,
    or a line about it).
    """
    out: list[LostGpu] = []
    position = 0
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _ROW_START.match(line):
            position += 1
            continue
        if not _TROUBLE.search(line):
            continue
        bus = normalise_bus_id(line)
        idx_match = _GPU_INDEX.search(line) if bus is None else None
        if bus is None and idx_match is None:
            continue
        out.append(LostGpu(line, bus, int(idx_match.group(1)) if idx_match else position))
        position += 1
    return tuple(out)


def lost_device(lost: LostGpu, index: int, uuid: str | None, template: DeviceSnapshot) -> DeviceSnapshot:
    """A ``lost`` device for ``lost`` (never granted), with ``template``'s accelerator and support."""
    return DeviceSnapshot(
        accelerator=template.accelerator,
        index=index,
        uuid=uuid,
        execution_supported=template.execution_supported,
        pci_bus_id=lost.bus_id,
        state=DeviceState.LOST,
        state_reason=lost.line,
        processes_known=False,
    )
