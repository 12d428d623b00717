"""The Apple GPU (Metal, used as ``mps``) on Apple-silicon Macs.

:func:`read_apple_facts` is the one place that asks macOS anything; :func:`probe_apple`
and :func:`apple_devices` are pure, so recorded outputs test them on any OS. The GPU
is reported whether or not a framework is installed: whether torch can use it is the
environment probe's business, not the hardware's.

Schedulable memory. The Apple GPU shares the system RAM, but Metal does not let one
process's GPU work use all of it: ``MTLDevice.recommendedMaxWorkingSetSize`` is the most a
process should keep resident for the GPU, and allocations past it page or fail. So the
``mps`` device's ``memory_total_bytes`` is that working set, labelled approximate
(``memory_approximate``), never ``hw.memsize``:

- from torch when an environment has it: ``torch.mps.recommended_max_memory()`` (the
  environment probe reports it; :func:`with_recommended_working_set` puts it on the device);
- else an admin's ``sysctl iogpu.wired_limit_mb`` (MiB, 2^20 bytes) when set (non-zero):
  macOS then uses it as the GPU's wired-memory limit;
- else the estimate macOS itself uses: 2/3 of RAM up to 36 GiB, 3/4 above
  (:func:`estimate_working_set_bytes`; a 16 GiB Mac, ``hw.memsize`` 17179869184,
  recommends 11453246122 bytes, about 11.45 GB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    DeviceState,
    EnvironmentSnapshot,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    SupportMatrix,
)
from gpulayerd.gpu.command import CommandRunner, decisive_line

__all__ = [
    "AppleFacts",
    "AppleProbe",
    "apple_devices",
    "estimate_working_set_bytes",
    "probe_apple",
    "read_apple_facts",
    "with_recommended_working_set",
]

_GiB = 2**30
_LARGE_RAM_BYTES = 36 * _GiB
"""Above this much RAM macOS recommends 3/4 of it for the GPU, up to it 2/3."""

SOURCE = "apple"
MPS_UUID = "mps-0"
"""Synthetic id of the one Apple GPU of a Mac (unique together with the node id)."""


@dataclass(frozen=True, slots=True)
class AppleFacts:
    """What macOS says about the machine. None means the command failed or said nothing.

    Attributes:
        machine: ``uname -m`` (``arm64``; ``x86_64`` on Intel or under Rosetta).
        arm64_hardware: ``sysctl -n hw.optional.arm64`` is 1 (Apple silicon, even when
            this process runs under Rosetta); None when that sysctl fails (Intel Macs).
        memory_total_bytes: ``sysctl -n hw.memsize``, system RAM in bytes.
        chip: ``sysctl -n machdep.cpu.brand_string`` (``Apple M2 Max``).
        macos_version: ``sw_vers -productVersion`` (``14.5``).
        notes: commands that failed, in words.
        wired_limit_mb: ``sysctl -n iogpu.wired_limit_mb`` (MiB) when an admin set it (non-zero);
            None when unset (0) or when the sysctl does not exist (older macOS, Intel).
        virtual: this macOS runs in a virtual machine: ``sysctl -n kern.hv_vmm_present`` is 1, or
            the chip's name says Virtual; None when neither could tell.
    """

    machine: str | None = None
    arm64_hardware: bool | None = None
    memory_total_bytes: int | None = None
    chip: str | None = None
    macos_version: str | None = None
    notes: tuple[str, ...] = ()
    wired_limit_mb: int | None = None
    virtual: bool | None = None

    @property
    def apple_silicon(self) -> bool | None:
        """True on Apple silicon, False on an Intel Mac, None if it cannot be told."""
        if self.machine == "arm64" or self.arm64_hardware is True:
            return True
        if self.machine is None and self.arm64_hardware is None:
            return None
        return False


@dataclass(frozen=True, slots=True)
class AppleProbe:
    """Devices, health and notes for the Apple GPU.

    Attributes:
        devices: the one ``mps`` device on Apple silicon, else empty.
        health: how detection went (source ``apple``).
        notes: why no device, Rosetta, unknown values.
    """

    devices: tuple[DeviceSnapshot, ...]
    health: ProbeHealth
    notes: tuple[str, ...] = ()


def read_apple_facts(
    runner: CommandRunner,
    timeout_s: float = 10.0,
    *,
    machine: str | None = None,
    uname: str = "/usr/bin/uname",
    sysctl: str = "/usr/sbin/sysctl",
    sw_vers: str = "/usr/bin/sw_vers",
) -> AppleFacts:
    """Ask macOS for the facts :func:`probe_apple` needs; never raises.

    Args:
        runner: runs each command with ``timeout_s``.
        timeout_s: limit for each command, in seconds.
        machine: the machine name when already known; else ``uname -m`` is run.
        uname: path of ``uname``.
        sysctl: path of ``sysctl``.
        sw_vers: path of ``sw_vers``.
    """
    notes: list[str] = []

    def ask(argv: list[str], quiet: bool = False) -> str | None:
        result = runner(argv, timeout_s)
        if result.returncode == 0 and not result.timed_out:
            return result.stdout
        if quiet:
            return None
        why = (
            "timed out"
            if result.timed_out
            else "not found"
            if result.not_found
            else (
                decisive_line(result.stderr.splitlines())
                if result.stderr.strip()
                else f"status {result.returncode}"
            )
        )
        notes.append(f"{' '.join(argv)}: {why}")
        return None

    if machine is None:
        machine = (ask([uname, "-m"]) or "").strip() or None
    memsize: int | None = None
    chip: str | None = None
    for line in (ask([sysctl, "-n", "hw.memsize", "machdep.cpu.brand_string"]) or "").splitlines():
        text = line.strip()
        if text.isdigit() and memsize is None:
            memsize = int(text)
        elif text and chip is None:
            chip = text
    # Intel Macs have no hw.optional.arm64, so its failure is no news.
    arm64_text = ask([sysctl, "-n", "hw.optional.arm64"], quiet=True)
    arm64 = None if arm64_text is None else arm64_text.strip() == "1"
    version = (ask([sw_vers, "-productVersion"]) or "").strip() or None
    # Absent before macOS 14 and on Intel Macs; 0 means "macOS decides".
    wired_text = (ask([sysctl, "-n", "iogpu.wired_limit_mb"], quiet=True) or "").strip()
    wired = int(wired_text) if wired_text.isdigit() and int(wired_text) > 0 else None
    vmm_text = ask([sysctl, "-n", "kern.hv_vmm_present"], quiet=True)  # absent on older macOS
    virtual = True if chip is not None and "virtual" in chip.lower() else (
        None if vmm_text is None else vmm_text.strip() == "1")
    return AppleFacts(
        machine=machine,
        arm64_hardware=arm64,
        memory_total_bytes=memsize,
        chip=chip,
        macos_version=version,
        notes=tuple(notes),
        wired_limit_mb=wired,
        virtual=virtual,
    )


def estimate_working_set_bytes(memory_total_bytes: int, wired_limit_mb: int | None = None) -> tuple[int, str]:
    """Metal's recommended working set (bytes) when torch cannot be asked, and how it was derived.

    ``iogpu.wired_limit_mb`` (MiB) when an admin set it; else 2/3 of RAM up to 36 GiB and
    3/4 above, rounded down (what macOS reports as ``recommendedMaxWorkingSetSize``).
    """
    if wired_limit_mb:
        return wired_limit_mb * 2**20, f"iogpu.wired_limit_mb = {wired_limit_mb} MiB, set by an admin"
    if memory_total_bytes <= _LARGE_RAM_BYTES:
        return memory_total_bytes * 2 // 3, f"2/3 of {_gb(memory_total_bytes)} RAM, as macOS estimates it"
    return memory_total_bytes * 3 // 4, f"3/4 of {_gb(memory_total_bytes)} RAM, as macOS estimates it"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


VIRTUAL_MPS = "virtual machine"
"""``state_reason`` of the Apple GPU of a macOS virtual machine, excluded unless ``allow_virtual_mps``."""


def probe_apple(facts: AppleFacts, support: SupportMatrix, allow_virtual: bool = False) -> AppleProbe:
    """Decide from macOS facts whether this Mac has an ``mps`` device; pure.

    In a virtual machine (:attr:`AppleFacts.virtual`) Metal is paravirtual and partial (no MPS on
    most hosts' VMs, or a slow one): the device is listed ``excluded (virtual machine)`` with a note,
    and scheduled only with ``allow_virtual`` (the config's ``allow_virtual_mps``)."""
    notes = list(facts.notes)
    silicon = facts.apple_silicon
    if silicon is None:
        return AppleProbe(
            (),
            ProbeHealth(SOURCE, ProbeStatus.ERROR, "could not tell whether this Mac has Apple silicon"),
            tuple(notes),
        )
    if not silicon:
        why = (
            f"Intel Mac ({facts.chip or facts.machine}): no mps device; gpulayer offers the Metal GPU "
            "as mps only on Apple silicon"
        )
        notes.append(why)
        return AppleProbe((), ProbeHealth(SOURCE, ProbeStatus.NO_DEVICES, why), tuple(notes))
    if facts.machine not in (None, "arm64"):
        notes.append(f"this process runs as {facts.machine} under Rosetta on Apple silicon")
    working_set: int | None = None
    if facts.memory_total_bytes is None:
        notes.append("Apple GPU: unified memory size unknown (sysctl hw.memsize failed)")
    else:
        working_set, how = estimate_working_set_bytes(facts.memory_total_bytes, facts.wired_limit_mb)
        notes.append(
            f"Apple GPU: schedulable memory about {_gb(working_set)} ({working_set} bytes), Metal's "
            f"recommended working set estimated from {how}; system RAM {_gb(facts.memory_total_bytes)}"
        )
    if facts.chip is None:
        notes.append("Apple GPU: chip name unknown (sysctl machdep.cpu.brand_string failed)")
    try:
        schedulable = support.row(Accelerator.MPS).schedulable
    except KeyError:
        schedulable = False
    device = DeviceSnapshot(
        accelerator=Accelerator.MPS,
        index=0,
        uuid=MPS_UUID,
        name=facts.chip,
        memory_total_bytes=working_set,
        memory_kind=MemoryKind.UNIFIED,
        execution_supported=schedulable,
        float64=False,
        memory_approximate=working_set is not None,
    )
    if facts.virtual:
        notes.append("Apple GPU in a virtual machine (kern.hv_vmm_present = 1): Metal there is paravirtual; "
                     + ("scheduled for mps because allow_virtual_mps is set" if allow_virtual else
                        "not scheduled for mps unless allow_virtual_mps = true in the daemon's config"))
        if not allow_virtual:
            device = replace(device, state=DeviceState.EXCLUDED, state_reason=VIRTUAL_MPS)
    words = [facts.chip or "Apple silicon"]
    if facts.macos_version:
        words.append(f"macOS {facts.macos_version}")
    message = ", ".join(words) + ": Metal GPU as mps, unified memory"
    if working_set is not None:
        message += f", about {_gb(working_set)} for GPU work (approximate)"
    return AppleProbe((device,), ProbeHealth(SOURCE, ProbeStatus.OK, message), tuple(notes))


def apple_devices(facts: AppleFacts, support: SupportMatrix) -> tuple[DeviceSnapshot, ...]:
    """The ``mps`` device of an Apple-silicon Mac (memory = estimated working set), or none; pure."""
    return probe_apple(facts, support).devices


def with_recommended_working_set(
    devices: Sequence[DeviceSnapshot], environments: Sequence[EnvironmentSnapshot]
) -> tuple[DeviceSnapshot, ...]:
    """Put torch's ``recommended_max_memory()`` on the ``mps`` device in place of the estimate; pure.

    The first native (not Rosetta-translated) environment whose torch answered gives it;
    the device stays labelled approximate (a recommendation, not a hard limit). Other
    devices, and the mps device when no torch answered, are returned unchanged.
    """
    value = next(
        (e.mps_recommended_max_bytes for e in environments
         if e.mps_recommended_max_bytes is not None and e.translated is not True),
        None,
    )
    if value is None:
        return tuple(devices)
    return tuple(
        replace(d, memory_total_bytes=value, memory_approximate=True) if d.accelerator is Accelerator.MPS else d
        for d in devices
    )
