"""Host discovery: tool search, the command runner, compute apps, Apple, ROCm, CPU/RAM.

External tools are real subprocesses (the fake in tests/fakes/bin, copied into
``tmp_path`` and found through ``DiscoveryConfig.path_env``) or, for macOS facts,
recorded outputs fed through a runner function.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayerd.core.types import Accelerator, MemoryKind, ProbeStatus
from gpulayerd.gpu.apple import AppleFacts, probe_apple
from gpulayerd.gpu.command import CommandResult, run_command
from gpulayerd.gpu.discovery import (
    NVIDIA_SMI_SEARCH_DIRS,
    DiscoveryConfig,
    HostInventory,
    NvidiaSmi,
    apple_devices,
    classify_nvidia_failure,
    discover_host,
    find_nvidia_smi,
    parse_compute_apps,
    read_apple_facts,
)
from gpulayerd.gpu.rocm import parse_rocm_product_names
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes import COMPUTE_APPS_ARGV, MIG_MODE_ARGV, gpu_query_argv, install_fake_tool, response, smi_header

MIB = 2**20
FULL = gpu_query_argv()
TWO_GPUS = (
    "0, GPU-00000000-0000-4000-8000-000000000101, NVIDIA GeForce RTX 3090, 24576, 1200, 8.6, 550.54.15\n"
    "1, GPU-00000000-0000-4000-8000-000000000102, NVIDIA GeForce RTX 3090, 24576, 3, 8.6, 550.54.15\n"
)


def config(bin_dir: Path, **kw: Any) -> DiscoveryConfig:
    base: dict[str, Any] = {
        "path_env": str(bin_dir),
        "extra_search_dirs": (),
        "rocm_search_dirs": (),
        "system": "Linux",
        "machine": "x86_64",
        "nvidia_smi_timeout_s": 10.0,
        "rocm_smi_timeout_s": 10.0,
    }
    base.update(kw)
    return DiscoveryConfig(**base)


def health(inv: HostInventory, source: str) -> Any:
    (h,) = [h for h in inv.health if h.source == source]
    return h


# Nothing installed


def test_no_tools_reports_not_found_and_cpu_ram(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    inv = discover_host(config(tmp_path / "bin"), SUPPORT_MATRIX)
    assert inv.devices == ()
    nv = health(inv, "nvidia-smi")
    assert (nv.status, nv.message, nv.path) == (ProbeStatus.NOT_FOUND, "nvidia-smi not found", None)
    assert (health(inv, "rocm-smi").status, health(inv, "rocm-smi").message) == (
        ProbeStatus.NOT_FOUND, "rocm-smi not found")
    assert [h.source for h in inv.health] == ["nvidia-smi", "rocm-smi"]  # no "apple" off macOS
    assert inv.cpu_count == psutil.cpu_count()
    assert inv.memory_total_bytes == psutil.virtual_memory().total
    assert (inv.hostname, inv.platform, inv.machine) == (socket.gethostname(), "Linux", "x86_64")


def test_nvidia_smi_object_without_path_is_not_found() -> None:
    probe = NvidiaSmi().probe(None, run_command, 1.0, SUPPORT_MATRIX, None)
    assert (probe.health.status, probe.health.message, probe.devices) == (
        ProbeStatus.NOT_FOUND, "nvidia-smi not found", ())


# Finding nvidia-smi


def make_exe(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="ascii")
    path.chmod(mode)
    return path


def test_find_nvidia_smi_path_first_then_extra_dirs(tmp_path: Path) -> None:
    on_path = make_exe(tmp_path / "bin" / "nvidia-smi")
    wsl = make_exe(tmp_path / "usr/lib/wsl/lib" / "nvidia-smi")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_nvidia_smi(str(tmp_path / "bin"), [str(wsl.parent)]) == str(on_path)
    assert find_nvidia_smi(str(empty), [str(tmp_path / "nowhere"), str(wsl.parent)]) == str(wsl)
    assert find_nvidia_smi(str(empty), []) is None
    assert find_nvidia_smi("", [str(wsl.parent)]) == str(wsl)


def test_find_nvidia_smi_skips_non_executable(tmp_path: Path) -> None:
    make_exe(tmp_path / "a" / "nvidia-smi", mode=0o644)
    good = make_exe(tmp_path / "b" / "nvidia-smi")
    assert find_nvidia_smi(str(tmp_path / "a"), [str(tmp_path / "a"), str(tmp_path / "b")]) == str(good)


def test_default_search_dirs_cover_wsl_and_container_installs() -> None:
    assert NVIDIA_SMI_SEARCH_DIRS[0] == "/usr/lib/wsl/lib"
    assert {"/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"} <= set(NVIDIA_SMI_SEARCH_DIRS)
    assert DiscoveryConfig().extra_search_dirs == NVIDIA_SMI_SEARCH_DIRS


def test_wsl_nvidia_smi_found_off_path(tmp_path: Path) -> None:
    wsl = tmp_path / "usr" / "lib" / "wsl" / "lib"
    fake = install_fake_tool(wsl, "nvidia-smi", [response(FULL, TWO_GPUS), response(COMPUTE_APPS_ARGV, "")])
    (tmp_path / "bin").mkdir()
    inv = discover_host(config(tmp_path / "bin", extra_search_dirs=(str(wsl),)), SUPPORT_MATRIX)
    assert health(inv, "nvidia-smi").path == str(fake.path)
    assert health(inv, "nvidia-smi").status is ProbeStatus.OK
    assert [d.index for d in inv.devices] == [0, 1]
    assert inv.devices[0].memory_used_bytes == 1200 * MIB


# Compute processes


def test_parse_compute_apps() -> None:
    stdout = (
        "GPU-00000000-0000-4000-8000-000000000102, 5678, 20\n"
        "GPU-00000000-0000-4000-8000-000000000101, 4321, [N/A]\n"
        "GPU-00000000-0000-4000-8000-000000000101, 1234, 500\n"
        "\n"
    )
    assert parse_compute_apps(stdout) == {
        "GPU-00000000-0000-4000-8000-000000000101": (1234, 4321),
        "GPU-00000000-0000-4000-8000-000000000102": (5678,),
    }
    assert parse_compute_apps("No running processes found\n") == {}


def test_compute_apps_fill_foreign_pids(tmp_path: Path) -> None:
    apps = "GPU-00000000-0000-4000-8000-000000000102, 777, 1024\nGPU-00000000-0000-4000-8000-000000000102, 42, 8\n"
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [response(FULL, TWO_GPUS),
                                                             response(COMPUTE_APPS_ARGV, apps), smi_header()])
    inv = discover_host(config(tmp_path / "bin"), SUPPORT_MATRIX)
    a, b = inv.devices
    # GPU 0: no process listed, but 1200 MiB of memory.used: processes not visible here (bug-44's kind).
    assert (a.foreign_pids, a.busy, a.hidden_use) == ((), True, True)
    assert (b.foreign_pids, b.busy, b.hidden_use) == ((42, 777), True, False)
    assert fake.argvs() == [FULL, MIG_MODE_ARGV, COMPUTE_APPS_ARGV, []]  # [] = plain nvidia-smi: the CUDA header


def test_compute_apps_failure_is_a_note_not_a_failure(tmp_path: Path) -> None:
    install_fake_tool(tmp_path / "bin", "nvidia-smi", [
        response(FULL, TWO_GPUS),
        response(COMPUTE_APPS_ARGV, "Unknown Error\n", exit_code=255),
    ])
    inv = discover_host(config(tmp_path / "bin"), SUPPORT_MATRIX)
    assert health(inv, "nvidia-smi").status is ProbeStatus.OK
    assert [d.foreign_pids for d in inv.devices] == [(), ()]
    assert any("compute processes unknown" in n and "Unknown Error" in n for n in inv.notes)


def test_compute_apps_can_be_switched_off(tmp_path: Path) -> None:
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [response(FULL, TWO_GPUS), smi_header()])
    inv = discover_host(config(tmp_path / "bin", query_compute_apps=False), SUPPORT_MATRIX)
    assert len(inv.devices) == 2
    assert fake.argvs() == [FULL, MIG_MODE_ARGV, []]


def test_driver_cuda_from_the_header_once_per_driver_else_the_table(tmp_path: Path) -> None:
    """Hosts report nvidia-smi's ``CUDA Version:`` (here a header that differs from the table's 12.4
    for 550.54.15, so the source shows); without a header, the driver -> CUDA table."""
    from gpulayerd.gpu.compose import build_capabilities
    from gpulayerd.gpu.nvidia.query import NvidiaSmi

    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [response(FULL, TWO_GPUS),
                                                             smi_header("550.54.15", "12.5")])
    smi = NvidiaSmi()
    inv = discover_host(config(tmp_path / "bin", query_compute_apps=False), SUPPORT_MATRIX, nvidia=smi)
    assert inv.driver_cuda == "12.5"
    assert build_capabilities(inv, [], "n1", 0.0).driver_cuda == "12.5"
    again = discover_host(config(tmp_path / "bin", query_compute_apps=False), SUPPORT_MATRIX, nvidia=smi)
    assert again.driver_cuda == "12.5"
    assert fake.argvs().count([]) == 1  # asked once for this binary and driver

    bare = install_fake_tool(tmp_path / "bare", "nvidia-smi", [response(FULL, TWO_GPUS)])  # plain call: exit 99
    inv = discover_host(config(tmp_path / "bare", query_compute_apps=False), SUPPORT_MATRIX)
    assert inv.driver_cuda == "12.4"
    assert bare.argvs() == [FULL, MIG_MODE_ARGV, []]


# The command runner


def test_child_runs_with_c_locale_in_its_own_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [response(FULL, TWO_GPUS),
                                                             response(COMPUTE_APPS_ARGV, ""), smi_header()])
    discover_host(config(tmp_path / "bin"), SUPPORT_MATRIX)
    for call in fake.calls():
        assert (call["LC_ALL"], call["LANG"]) == ("C", "C")
        assert call["sid"] == call["pgid"] == call["pid"]
    result = run_command(["sh", "-c", 'echo "$LC_ALL $LANG $FOO"'], 5.0, {"FOO": "bar", "LC_ALL": "fr_FR"})
    assert (result.stdout, result.returncode, result.timed_out, result.not_found) == ("C C bar\n", 0, False, False)


def test_run_command_missing_executable_does_not_raise(tmp_path: Path) -> None:
    result = run_command([str(tmp_path / "no-such-tool"), "-x"], 5.0)
    assert (result.not_found, result.returncode, result.timed_out) == (True, None, False)
    plain = make_exe(tmp_path / "plain", mode=0o644)
    result = run_command([str(plain)], 5.0)
    assert (result.not_found, result.returncode) == (False, None)
    assert "Permission denied" in result.stderr


def test_run_command_timeout_kills_the_group() -> None:
    start = time.monotonic()
    result = run_command(["sh", "-c", "sleep 60 & echo started; wait"], 0.5)
    assert time.monotonic() - start < 5.0
    assert (result.timed_out, result.returncode) == (True, None)
    assert result.stdout == "started\n"


def test_run_command_reports_exit_status_and_stderr() -> None:
    result = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 5.0)
    assert (result.stdout, result.stderr, result.returncode) == ("out\n", "err\n", 3)


def test_discover_host_survives_a_runner_that_raises(tmp_path: Path) -> None:
    install_fake_tool(tmp_path / "bin", "nvidia-smi", [])
    install_fake_tool(tmp_path / "bin", "rocm-smi", [])

    def broken(argv: Sequence[str], timeout_s: float, env_overrides: Mapping[str, str] | None = None) -> CommandResult:
        raise RuntimeError("runner bug")

    inv = discover_host(config(tmp_path / "bin"), SUPPORT_MATRIX, runner=broken)
    assert [(h.source, h.status) for h in inv.health] == [
        ("nvidia-smi", ProbeStatus.ERROR), ("rocm-smi", ProbeStatus.ERROR)]
    assert all("runner bug" in h.message for h in inv.health)


# Apple silicon

APPLE_M2_MAX = {
    ("uname", "-m"): CommandResult("arm64\n", "", 0),
    ("sysctl", "-n", "hw.memsize", "machdep.cpu.brand_string"): CommandResult("68719476736\nApple M2 Max\n", "", 0),
    ("sysctl", "-n", "hw.optional.arm64"): CommandResult("1\n", "", 0),
    ("sw_vers", "-productVersion"): CommandResult("14.5\n", "", 0),
}
INTEL_MAC = {
    ("uname", "-m"): CommandResult("x86_64\n", "", 0),
    ("sysctl", "-n", "hw.memsize", "machdep.cpu.brand_string"): CommandResult(
        "34359738368\nIntel(R) Core(TM) i9-9980HK CPU @ 2.40GHz\n", "", 0),
    ("sysctl", "-n", "hw.optional.arm64"): CommandResult("", "sysctl: unknown oid 'hw.optional.arm64'\n", 1),
    ("sw_vers", "-productVersion"): CommandResult("13.6.7\n", "", 0),
}


def recorded(answers: Mapping[tuple[str, ...], CommandResult], calls: list[tuple[str, ...]]) -> Any:
    def run(argv: Sequence[str], timeout_s: float, env_overrides: Mapping[str, str] | None = None) -> CommandResult:
        key = (os.path.basename(argv[0]), *argv[1:])
        calls.append(key)
        return answers.get(key, CommandResult("", f"{key[0]}: not recorded\n", 1))

    return run


def test_apple_silicon_is_one_mps_device_with_unified_memory() -> None:
    calls: list[tuple[str, ...]] = []
    facts = read_apple_facts(recorded(APPLE_M2_MAX, calls), 5.0)
    assert facts == AppleFacts("arm64", True, 68719476736, "Apple M2 Max", "14.5")
    assert set(calls) == {*APPLE_M2_MAX, ("sysctl", "-n", "iogpu.wired_limit_mb"), ("sysctl", "-n", "kern.hv_vmm_present")}
    (mps,) = apple_devices(facts, SUPPORT_MATRIX)
    assert (mps.accelerator, mps.index, mps.name) == (Accelerator.MPS, 0, "Apple M2 Max")
    # 64 GiB of RAM: Metal recommends 3/4 of it for GPU work (tests/unit/test_cases_apple.py)
    assert (mps.memory_kind, mps.memory_total_bytes, mps.memory_approximate) == (
        MemoryKind.UNIFIED, 68719476736 * 3 // 4, True)
    assert (mps.float64, mps.execution_supported, mps.compute_capability) == (False, True, None)
    probe = probe_apple(facts, SUPPORT_MATRIX)
    assert probe.health.status is ProbeStatus.OK
    assert "Apple M2 Max" in probe.health.message and "macOS 14.5" in probe.health.message


def test_intel_mac_has_no_mps_device_and_says_why() -> None:
    facts = read_apple_facts(recorded(INTEL_MAC, []), 5.0)
    assert (facts.machine, facts.arm64_hardware, facts.apple_silicon) == ("x86_64", None, False)
    probe = probe_apple(facts, SUPPORT_MATRIX)
    assert probe.devices == ()
    assert probe.health.status is ProbeStatus.NO_DEVICES
    assert any("Intel Mac" in n and "no mps device" in n for n in probe.notes)


def test_rosetta_process_on_apple_silicon_still_sees_the_gpu() -> None:
    answers = dict(APPLE_M2_MAX)
    answers["uname", "-m"] = CommandResult("x86_64\n", "", 0)
    probe = probe_apple(read_apple_facts(recorded(answers, []), 5.0), SUPPORT_MATRIX)
    assert [d.accelerator for d in probe.devices] == [Accelerator.MPS]
    assert any("Rosetta" in n for n in probe.notes)


def test_apple_tool_failure_keeps_the_decisive_stderr_line() -> None:
    """A failing tool's note quotes the line that says what went wrong, not a banner above it."""
    answers = dict(APPLE_M2_MAX)
    answers["sysctl", "-n", "hw.memsize", "machdep.cpu.brand_string"] = CommandResult(
        "", "sysctl: reading kernel state\nsysctl: error: operation not permitted\n", 1)
    facts = read_apple_facts(recorded(answers, []), 5.0)
    notes = probe_apple(facts, SUPPORT_MATRIX).notes
    assert any(n.endswith("sysctl: error: operation not permitted") for n in notes), notes
    assert not any("reading kernel state" in n for n in notes)


def test_apple_memsize_unknown_keeps_the_device_with_none() -> None:
    facts = AppleFacts(machine="arm64", chip="Apple M1")
    (mps,) = apple_devices(facts, SUPPORT_MATRIX)
    assert (mps.memory_total_bytes, mps.memory_kind) == (None, MemoryKind.UNIFIED)
    assert any("memory size unknown" in n for n in probe_apple(facts, SUPPORT_MATRIX).notes)


def test_darwin_end_to_end_with_fake_sysctl_and_sw_vers(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    sysctl = install_fake_tool(bin_dir, "sysctl", [
        response(["-n", "hw.memsize", "machdep.cpu.brand_string"], "68719476736\nApple M2 Max\n"),
        response(["-n", "hw.optional.arm64"], "1\n"),
    ])
    install_fake_tool(bin_dir, "sw_vers", [response(["-productVersion"], "14.5\n")])
    inv = discover_host(config(bin_dir, system="Darwin", machine="arm64"), SUPPORT_MATRIX)
    assert [h.source for h in inv.health] == ["nvidia-smi", "rocm-smi", "apple"]
    assert health(inv, "apple").status is ProbeStatus.OK
    (mps,) = inv.devices
    assert (mps.accelerator, mps.name, mps.memory_total_bytes, mps.float64) == (
        Accelerator.MPS, "Apple M2 Max", 68719476736 * 3 // 4, False)
    assert inv.memory_total_bytes is not None  # the RAM itself stays the RAM
    assert all((c["LC_ALL"], c["LANG"]) == ("C", "C") for c in sysctl.calls())


# ROCm (detection only)

ROCM_JSON = (
    "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n\n"
    '{"card0": {"Card series": "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", "Card model": "0x73bf", '
    '"Card vendor": "Advanced Micro Devices, Inc. [AMD/ATI]", "GFX Version": "gfx1030"}, '
    '"card1": {"Card Series": "Aldebaran/MI200 [Instinct MI210]", "GFX Version": "gfx90a"}, '
    '"system": {"Driver version": "6.3.6"}}\n'
)
ROCM_ARGV = ["--showproductname", "--json"]


def test_parse_rocm_product_names() -> None:
    cards = parse_rocm_product_names(ROCM_JSON)
    assert cards is not None
    assert [(c.index, c.name, c.gfx_version) for c in cards] == [
        (0, "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", "gfx1030"),
        (1, "Aldebaran/MI200 [Instinct MI210]", "gfx90a"),
    ]
    assert parse_rocm_product_names("ERROR: no JSON here\n") is None


def test_rocm_devices_are_never_schedulable(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install_fake_tool(bin_dir, "rocm-smi", [response(ROCM_ARGV, ROCM_JSON)])
    install_fake_tool(bin_dir, "nvidia-smi", [response(FULL, TWO_GPUS), response(COMPUTE_APPS_ARGV, "")])
    inv = discover_host(config(bin_dir), SUPPORT_MATRIX)
    assert [(d.accelerator, d.index) for d in inv.devices] == [
        (Accelerator.CUDA, 0), (Accelerator.CUDA, 1), (Accelerator.ROCM, 0), (Accelerator.ROCM, 1)]
    rocm = [d for d in inv.devices if d.accelerator is Accelerator.ROCM]
    assert [d.execution_supported for d in rocm] == [False, False]
    assert rocm[1].name == "Aldebaran/MI200 [Instinct MI210]"
    h = health(inv, "rocm-smi")
    assert h.status is ProbeStatus.OK and "detection-only" in h.message
    assert any("never scheduled" in n for n in inv.notes)


@pytest.mark.parametrize(
    ("answer", "status", "message"),
    [
        (response(ROCM_ARGV, "", "ERROR:root:ROCm SMI returned 8 (the expected value is 0)\n", 2),
         ProbeStatus.ERROR, "ERROR:root:ROCm SMI returned 8 (the expected value is 0)"),
        (response(ROCM_ARGV, "No AMD GPUs specified\n", "", 0), ProbeStatus.NO_DEVICES, "No AMD GPUs specified"),
        (response(ROCM_ARGV, "{not json", "", 0), ProbeStatus.ERROR, "{not json"),
        (response(ROCM_ARGV, "", "", 0, sleep_s=60), ProbeStatus.TIMEOUT, "rocm-smi timed out after 1 s"),
    ],
)
def test_rocm_smi_failures_are_health_entries(
    tmp_path: Path, answer: dict[str, Any], status: ProbeStatus, message: str
) -> None:
    install_fake_tool(tmp_path / "bin", "rocm-smi", [answer])
    inv = discover_host(config(tmp_path / "bin", rocm_smi_timeout_s=1.0), SUPPORT_MATRIX)
    h = health(inv, "rocm-smi")
    assert h.status is status
    assert h.message.startswith(message)
    assert inv.devices == ()


# classify_nvidia_failure, pure


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "timed_out", "status", "message"),
    [
        ("No devices were found\n", "", 6, False, ProbeStatus.NO_DEVICES, "No devices were found"),
        ("", "", 0, False, ProbeStatus.NO_DEVICES, "nvidia-smi listed no GPU"),
        ("", "", None, True, ProbeStatus.TIMEOUT, "nvidia-smi timed out; its process group was killed"),
        ("GPU is lost. Reboot the system to recover this GPU\n", "", 15, False, ProbeStatus.ERROR,
         "GPU is lost. Reboot the system to recover this GPU"),
        ("", "", 3, False, ProbeStatus.ERROR, "nvidia-smi exited with status 3"),
        ("garbage\n", "", 0, False, ProbeStatus.ERROR, "garbage"),
    ],
)
def test_classify_nvidia_failure(
    stdout: str, stderr: str, code: int | None, timed_out: bool, status: ProbeStatus, message: str
) -> None:
    failure = classify_nvidia_failure(stdout, stderr, code, timed_out)
    assert (failure.status, failure.message) == (status, message)
