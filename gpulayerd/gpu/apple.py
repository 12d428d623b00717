"""The Apple GPU (Metal, used as ``mps``) on Apple-silicon Macs.

:func:`read_apple_facts` is the one place that asks macOS anything; :func:`probe_apple`
and :func:`apple_devices` are pure, so recorded outputs test them on any OS. The GPU
is reported whether or not a framework is installed: whether torch can use it is the
environment probe's business, not the hardware's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    SupportMatrix,
)
from gpulayerd.gpu.command import CommandRunner

__all__ = ["AppleFacts", "AppleProbe", "apple_devices", "probe_apple", "read_apple_facts"]

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
    """

    machine: str | None = None
    arm64_hardware: bool | None = None
    memory_total_bytes: int | None = None
    chip: str | None = None
    macos_version: str | None = None
    notes: tuple[str, ...] = ()

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
                result.stderr.strip().splitlines()[0]
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
    return AppleFacts(
        machine=machine,
        arm64_hardware=arm64,
        memory_total_bytes=memsize,
        chip=chip,
        macos_version=version,
        notes=tuple(notes),
    )


def probe_apple(facts: AppleFacts, support: SupportMatrix) -> AppleProbe:
    """Decide from macOS facts whether this Mac has an ``mps`` device; pure."""
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
    if facts.memory_total_bytes is None:
        notes.append("Apple GPU: unified memory size unknown (sysctl hw.memsize failed)")
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
        memory_total_bytes=facts.memory_total_bytes,
        memory_kind=MemoryKind.UNIFIED,
        execution_supported=schedulable,
        float64=False,
    )
    words = [facts.chip or "Apple silicon"]
    if facts.macos_version:
        words.append(f"macOS {facts.macos_version}")
    message = ", ".join(words) + ": Metal GPU as mps, unified memory"
    return AppleProbe((device,), ProbeHealth(SOURCE, ProbeStatus.OK, message), tuple(notes))


def apple_devices(facts: AppleFacts, support: SupportMatrix) -> tuple[DeviceSnapshot, ...]:
    """The ``mps`` device of an Apple-silicon Mac (memory = system RAM), or none; pure."""
    return probe_apple(facts, support).devices
