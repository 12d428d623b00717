"""Apple silicon: schedulable memory is Metal's recommended working set, and a Rosetta
interpreter never gets ``mps``.

A recorded probe of a 16 GiB Mac (``hw.memsize`` 17179869184, recommended working set
11453246122 bytes): a 12 GB job does not fit, an 11 GB job fits; ``devices --json`` labels
the figure approximate. A recorded environment report of an x86_64 interpreter under
Rosetta (``sysctl.proc_translated`` 1) is refused for ``mps`` jobs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gpulayerd.core.matching.evaluate import match
from gpulayerd.core.types import (
    GB,
    Accelerator,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Placement, RejectionCode
from gpulayerd.gpu.apple import estimate_working_set_bytes, probe_apple, read_apple_facts
from gpulayerd.gpu.command import CommandResult
from gpulayerd.gpu.compose import build_capabilities
from gpulayerd.gpu.discovery import HostInventory
from gpulayerd.gpu.probe_report import snapshot_from_report
from gpulayerd.gpu.support import SUPPORT_MATRIX

MEMSIZE_16_GIB = 17179869184
RECOMMENDED_16_GIB = 11453246122

MAC_16 = {
    ("uname", "-m"): CommandResult("arm64\n", "", 0),
    ("sysctl", "-n", "hw.memsize", "machdep.cpu.brand_string"): CommandResult(f"{MEMSIZE_16_GIB}\nApple M2\n", "", 0),
    ("sysctl", "-n", "hw.optional.arm64"): CommandResult("1\n", "", 0),
    ("sysctl", "-n", "iogpu.wired_limit_mb"): CommandResult("0\n", "", 0),
    ("sw_vers", "-productVersion"): CommandResult("14.6.1\n", "", 0),
}


def recorded(answers: Mapping[tuple[str, ...], CommandResult]) -> Any:
    def run(argv: Sequence[str], timeout_s: float, env_overrides: Mapping[str, str] | None = None) -> CommandResult:
        key = (os.path.basename(argv[0]), *argv[1:])
        return answers.get(key, CommandResult("", f"{key[0]}: unknown oid\n", 1))

    return run


def report(machine: str, translated: bool | None, mps: bool, recommended: int | None = None) -> dict[str, Any]:
    """An environment probe report (probe.py's JSON) of an interpreter on a Mac with torch."""
    return {
        "probe_version": 1, "python_version": "3.11.9", "torch_stage": "ran", "notes": [],
        "platform": {"system": "Darwin", "machine": machine, "mac_ver": "14.6.1", "translated": translated},
        "frameworks": {"torch": [{"distribution": "torch", "version": "2.4.1"}]},
        "torch": {"version": "2.4.1", "cuda_built": None, "hip_built": None, "cuda_available": False,
                  "cuda_device_count": 0, "mps_built": mps, "mps_available": mps,
                  "mps_recommended_max_memory": recommended, "distributed_available": True,
                  "backends": {"gloo": True, "nccl": False, "mpi": False}, "error": None},
    }


def mac_worker(answers: Mapping[tuple[str, ...], CommandResult], *envs: EnvironmentSnapshot) -> WorkerSnapshot:
    probe = probe_apple(read_apple_facts(recorded(answers), 5.0), SUPPORT_MATRIX)
    inv = HostInventory(devices=probe.devices, health=(probe.health,), cpu_count=8,
                        memory_total_bytes=MEMSIZE_16_GIB, hostname="mac", platform="Darwin", machine="arm64")
    caps = build_capabilities(inv, envs or (native(),), "mac-node", 0.0)
    return caps.to_core()


def native() -> EnvironmentSnapshot:
    return snapshot_from_report("/opt/arm/bin/python", report("arm64", False, True))


def mps_job(gb: float) -> JobRequest:
    return JobRequest(accelerator=Accelerator.MPS, gpu_count=1, gpu_memory_bytes=int(gb * GB),
                      frameworks={"torch": ">=2.1"})


def test_16_gib_mac_schedules_the_recommended_working_set() -> None:
    probe = probe_apple(read_apple_facts(recorded(MAC_16), 5.0), SUPPORT_MATRIX)
    (mps,) = probe.devices
    assert (mps.memory_total_bytes, mps.memory_approximate) == (RECOMMENDED_16_GIB, True)
    assert "about 11.45 GB for GPU work (approximate)" in probe.health.message
    assert any("2/3 of 17.18 GB RAM" in n and f"{RECOMMENDED_16_GIB} bytes" in n for n in probe.notes)
    w = mac_worker(MAC_16)
    too_big = match(mps_job(12), w, SUPPORT_MATRIX)
    assert not isinstance(too_big, Placement)
    assert RejectionCode.INSUFFICIENT_MEMORY in [r.code for r in too_big]
    assert any("Apple GPU has 11.5 GB (approximate: Metal's recommended working set) < 12 GB"
               in r.message for r in too_big)
    fits = match(mps_job(11), w, SUPPORT_MATRIX)
    assert isinstance(fits, Placement) and fits.device_uuids == ("mps-0",)


def test_devices_json_labels_the_apple_memory_approximate() -> None:
    probe = probe_apple(read_apple_facts(recorded(MAC_16), 5.0), SUPPORT_MATRIX)
    inv = HostInventory(devices=probe.devices, health=(probe.health,), cpu_count=8,
                        memory_total_bytes=MEMSIZE_16_GIB, hostname="mac", platform="Darwin", machine="arm64")
    data = json.loads(build_capabilities(inv, (), "mac-node", 0.0).model_dump_json())
    (dev,) = data["devices"]
    assert (dev["memory_total_bytes"], dev["memory_approximate"]) == (RECOMMENDED_16_GIB, True)
    assert data["memory_total_bytes"] == MEMSIZE_16_GIB  # the RAM stays the RAM


def test_torch_recommended_max_memory_wins_over_the_estimate() -> None:
    torch_says = 10_000_000_000
    env = snapshot_from_report("/opt/arm/bin/python", report("arm64", False, True, recommended=torch_says))
    assert env.mps_recommended_max_bytes == torch_says
    w = mac_worker(MAC_16, env)
    (mps,) = w.devices
    assert (mps.memory_total_bytes, mps.memory_approximate) == (torch_says, True)
    assert not isinstance(match(mps_job(11), w, SUPPORT_MATRIX), Placement)
    assert isinstance(match(mps_job(9.5), w, SUPPORT_MATRIX), Placement)


def test_admin_wired_limit_is_honoured() -> None:
    answers = {**MAC_16, ("sysctl", "-n", "iogpu.wired_limit_mb"): CommandResult("14336\n", "", 0)}
    w = mac_worker(answers)
    (mps,) = w.devices
    assert mps.memory_total_bytes == 14336 * 2**20  # MiB
    assert isinstance(match(mps_job(15), w, SUPPORT_MATRIX), Placement)


def test_estimate_above_36_gib_is_three_quarters() -> None:
    assert estimate_working_set_bytes(MEMSIZE_16_GIB) == (RECOMMENDED_16_GIB, "2/3 of 17.18 GB RAM, as macOS estimates it")
    assert estimate_working_set_bytes(36 * 2**30)[0] == 36 * 2**30 * 2 // 3
    assert estimate_working_set_bytes(64 * 2**30)[0] == 48 * 2**30


def test_rosetta_interpreter_never_gets_mps() -> None:
    rosetta = snapshot_from_report("/usr/local/bin/python3", report("x86_64", True, False))
    assert (rosetta.machine, rosetta.translated) == ("x86_64", True)
    assert any("Rosetta" in n and "never gets the Apple GPU" in n for n in rosetta.notes)
    # even if a (wrong) torch claimed mps, a translated interpreter is refused
    claims_mps = snapshot_from_report("/usr/local/bin/python3", report("x86_64", True, True))
    w = mac_worker(MAC_16, claims_mps)
    res = match(mps_job(4), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    assert [r.code for r in res] == [RejectionCode.ACCELERATOR_MISMATCH]
    assert "run by Rosetta on Apple silicon: it cannot use the Apple GPU (mps)" in res[0].message
    # a CPU job may still use it
    cpu = JobRequest(frameworks={"torch": ">=2.1"})
    assert isinstance(match(cpu, w, SUPPORT_MATRIX), Placement)
    # next to a native interpreter, the native one is chosen
    w2 = mac_worker(MAC_16, claims_mps, native())
    placed = match(mps_job(4), w2, SUPPORT_MATRIX)
    assert isinstance(placed, Placement) and placed.environment == "/opt/arm/bin/python"


def test_translation_and_architecture_survive_the_capability_json() -> None:
    env = snapshot_from_report("/usr/local/bin/python3", report("x86_64", True, False))
    w = mac_worker(MAC_16, env)
    assert (w.environments[0].machine, w.environments[0].translated) == ("x86_64", True)
    assert FrameworkVersion("torch", "2.4.1", "torch") == w.environments[0].frameworks["torch"]


MAC_VM = {**MAC_16, ("sysctl", "-n", "kern.hv_vmm_present"): CommandResult("1\n", "", 0)}


def test_a_macos_virtual_machine_gpu_is_noted_and_not_scheduled_unless_allowed() -> None:
    facts = read_apple_facts(recorded(MAC_VM), 5.0)
    assert facts.virtual is True and read_apple_facts(recorded(MAC_16), 5.0).virtual is None
    probe = probe_apple(facts, SUPPORT_MATRIX)
    (mps,) = probe.devices
    assert (mps.state.value, mps.state_reason) == ("excluded", "virtual machine")
    assert any("virtual machine (kern.hv_vmm_present = 1)" in n and "allow_virtual_mps = true" in n
               for n in probe.notes)
    inv = HostInventory(devices=probe.devices, health=(probe.health,), cpu_count=8,
                        memory_total_bytes=MEMSIZE_16_GIB, hostname="mac", platform="Darwin", machine="arm64")
    worker = build_capabilities(inv, (native(),), "mac-node", 0.0).to_core()
    refused = match(mps_job(4), worker, SUPPORT_MATRIX)
    assert not isinstance(refused, Placement)
    assert any("GPU of a macOS virtual machine" in r.message and "allow_virtual_mps" in r.message for r in refused)
    allowed = probe_apple(facts, SUPPORT_MATRIX, allow_virtual=True)
    assert allowed.devices[0].state.value == "ok"
    # A chip named Virtual says so even where the sysctl does not exist.
    named = {**MAC_16, ("sysctl", "-n", "hw.memsize", "machdep.cpu.brand_string"):
             CommandResult(f"{MEMSIZE_16_GIB}\nApple M1 (Virtual)\n", "", 0)}
    assert read_apple_facts(recorded(named), 5.0).virtual is True
