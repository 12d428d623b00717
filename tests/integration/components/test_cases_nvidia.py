"""nvidia-smi halves of the recorded cases in tests/data/cases, end to end.

Each test loads its case file, replays the recorded output through the fake
nvidia-smi (a real subprocess found on ``DiscoveryConfig.path_env``), runs
:func:`discover_host` and checks the case's ``expected`` values.

The cases recorded queries without ``memory.used``; the daemon asks for it. Recorded
CSV rows are converted into the daemon's column set by inserting a ``memory.used``
value after ``memory.total`` (``tests.fakes.insert_memory_used``); recorded error
output is replayed verbatim. Extra rows of our own cover other values of each fault.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayerd.core.types import Accelerator, DeviceState, MemoryKind, ProbeHealth, ProbeStatus
from gpulayerd.gpu.discovery import (
    DiscoveryConfig,
    HostInventory,
    NvidiaSmi,
    classify_nvidia_failure,
    discover_host,
    parse_meminfo_total_bytes,
    parse_nvidia_csv,
)
from gpulayerd.gpu.nvidia.parse import nvidia_devices, nvidia_gpus
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes import (
    COMPUTE_APPS_ARGV,
    MIG_MODE_ARGV,
    FakeTool,
    gpu_query_argv,
    insert_memory_used,
    install_fake_tool,
    response,
    smi_header,
)

CASES = Path(__file__).resolve().parents[2] / "data" / "cases"
MIB = 2**20
FULL = gpu_query_argv()
NO_CC = gpu_query_argv(compute_cap=False)
NO_APPS = response(COMPUTE_APPS_ARGV, "No running processes found\n")


def load(case_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{case_id}.json").read_text(encoding="utf-8"))
    return data


def query_fields(command: str) -> list[str]:
    """The ``--query-gpu`` field list of a recorded command line."""
    arg = next(a for a in command.split() if a.startswith("--query-gpu="))
    return arg.removeprefix("--query-gpu=").split(",")


def fake_smi(tmp_path: Path, *responses: dict[str, Any]) -> FakeTool:
    return install_fake_tool(tmp_path / "bin", "nvidia-smi", [*responses, NO_APPS, smi_header("580.95.05", "13.0")])


def config(tmp_path: Path, **kw: Any) -> DiscoveryConfig:
    """Search only tmp_path/bin; pretend to be Linux; no real rocm-smi or nvidia-smi."""
    base: dict[str, Any] = {
        "path_env": str(tmp_path / "bin"),
        "extra_search_dirs": (),
        "rocm_search_dirs": (),
        "system": "Linux",
        "machine": "x86_64",
        "nvidia_smi_timeout_s": 10.0,
    }
    base.update(kw)
    return DiscoveryConfig(**base)


def nvidia_health(inv: HostInventory) -> ProbeHealth:
    (h,) = [h for h in inv.health if h.source == "nvidia-smi"]
    return h


def cuda(inv: HostInventory) -> list[Any]:
    return [d for d in inv.devices if d.accelerator is Accelerator.CUDA]


def case_rows(stdout: str, command: str) -> str:
    return insert_memory_used(stdout, query_fields(command))


# bug-01: an nvidia-smi that rejects compute_cap


def test_bug01_retries_without_compute_cap_and_remembers(tmp_path: Path) -> None:
    inp = load("bug-01")["input"]
    exp = load("bug-01")["expected"]
    smi_fake = fake_smi(
        tmp_path,
        response(FULL, inp["stdout"], inp["stderr"], inp["exit_code"]),
        response(NO_CC, case_rows(inp["retry_stdout"], inp["retry_command"])),
    )
    smi = NvidiaSmi()
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX, nvidia=smi)

    assert nvidia_health(inv).status is ProbeStatus.OK
    (want,) = exp["gpus"]
    (gpu,) = cuda(inv)
    assert gpu.index == want["index"]
    assert gpu.uuid == want["uuid"]
    assert gpu.name == want["name"]
    assert gpu.memory_total_bytes == want["memory_total_mib"] * MIB
    assert gpu.compute_capability is None
    assert gpu.driver_version == want["driver_version"] == "580.95.05"
    assert "470.256.02" not in inp["retry_stdout"]  # the banner's tool version is never used
    assert any("compute_cap" in n for n in inv.notes)
    assert any("compute capability unknown" in n for n in inv.notes)
    assert smi_fake.argvs() == [FULL, NO_CC, MIG_MODE_ARGV, COMPUTE_APPS_ARGV, []]  # [] = the CUDA header
    assert inv.driver_cuda == "13.0"

    # Same binary, same NvidiaSmi: straight to the short query (the header is known).
    again = discover_host(config(tmp_path), SUPPORT_MATRIX, nvidia=smi)
    assert [d.uuid for d in cuda(again)] == [want["uuid"]]
    assert smi_fake.argvs()[5:] == [NO_CC, MIG_MODE_ARGV, COMPUTE_APPS_ARGV]
    assert again.driver_cuda == "13.0"
    assert any("rejected them before" in n and "compute_cap" in n for n in again.notes)
    assert smi.query_fields(str(smi_fake.path)) == tuple(NO_CC[0].removeprefix("--query-gpu=").split(","))

    # An upgraded binary (new mtime) is asked for every field again.
    st = smi_fake.path.stat()
    os.utime(smi_fake.path, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
    discover_host(config(tmp_path), SUPPORT_MATRIX, nvidia=smi)
    assert smi_fake.argvs()[8:] == [FULL, NO_CC, MIG_MODE_ARGV, COMPUTE_APPS_ARGV, []]


def test_bug01_first_answer_is_an_unsupported_field_not_zero_gpus() -> None:
    inp = load("bug-01")["input"]
    parsed = parse_nvidia_csv(inp["stdout"], query_fields(inp["command"]))
    assert parsed.rows == ()
    assert parsed.diagnostics == ('Field "compute_cap" is not a valid field to query.',)
    failure = classify_nvidia_failure(inp["stdout"], inp["stderr"], inp["exit_code"], False)
    assert failure.status is ProbeStatus.ERROR
    assert failure.unsupported_fields == ("compute_cap",)


def test_bug01_kind_other_rejected_field_is_dropped_too(tmp_path: Path) -> None:
    no_used = gpu_query_argv(memory_used=False)
    fake = fake_smi(
        tmp_path,
        response(FULL, 'Field "memory.used" is not a valid field to query.\n\n', exit_code=2),
        response(no_used, "3, GPU-00000000-0000-4000-8000-0000000000a1, Tesla T4, 15360, 7.5, 535.104.05\n"),
    )
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    (gpu,) = cuda(inv)
    assert (gpu.index, gpu.memory_total_bytes, gpu.memory_used_bytes) == (3, 15360 * MIB, None)
    assert gpu.compute_capability == (7, 5)
    assert fake.argvs() == [FULL, no_used, MIG_MODE_ARGV, COMPUTE_APPS_ARGV, []]


# bug-02: placeholders in single fields


def test_bug02_adapted_row_placeholder_compute_cap(tmp_path: Path) -> None:
    case = load("bug-02")
    fields6 = ["index", "uuid", "name", "memory.total", "compute_cap", "driver_version"]
    fake_smi(tmp_path, response(FULL, insert_memory_used(case["input"]["adapted_daemon_stdout"], fields6)))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    want = case["expected"]["parsed_adapted"]
    (gpu,) = cuda(inv)
    assert gpu.index == want["index"]
    assert gpu.name == want["name"]
    assert gpu.memory_total_bytes == want["memory_total_mib"] * MIB
    assert gpu.compute_capability is None
    assert gpu.driver_version == want["driver_version"]
    assert nvidia_health(inv).status is ProbeStatus.OK


@pytest.mark.parametrize("variant", ["stdout_newer_driver", "stdout_older_driver"])
def test_bug02_recorded_rows_with_their_own_fields(variant: str) -> None:
    case = load("bug-02")
    fields = case["input"]["query"].split()[0].removeprefix("--query-gpu=").split(",")
    parsed = parse_nvidia_csv(case["input"][variant], fields)
    (row,) = parsed.rows
    expected = list(case["expected"]["parsed_newer_and_older"].values())
    assert [row[f] for f in fields] == [None if v is None else str(v) for v in expected]
    assert row["fan.speed"] is None


def test_bug02_gtx770_and_bare_na() -> None:
    inp = load("bug-02")["input"]
    fields = [f"f{i}" for i in range(12)]
    (row,) = parse_nvidia_csv(inp["stdout_geforce_gtx_770"], fields).rows
    assert row["f0"] == "GeForce GTX 770"
    assert row["f3"] == "52"
    assert row["f6"] == "52 %"
    assert sum(v is None for v in row.values()) == 8
    # An excerpt: "... 45, N/A, 1965, ..." is four comma-separated fields.
    (bare,) = parse_nvidia_csv(inp["bare_na_example_driver_440"], [f"g{i}" for i in range(4)]).rows
    assert (bare["g1"], bare["g2"]) == (None, "1965")


@pytest.mark.parametrize("token", [*load("bug-02")["expected"]["missing_value_tokens"], "[GPU requires reset]"])
def test_bug02_kind_every_placeholder_in_every_numeric_field(token: str) -> None:
    stdout = (
        f"0, GPU-00000000-0000-4000-8000-0000000000b0, NVIDIA A100-SXM4-80GB, {token}, {token}, 8.0, 550.54.15\n"
        f"1, GPU-00000000-0000-4000-8000-0000000000b1, NVIDIA A100-SXM4-80GB, 81920, 512, {token}, {token}\n"
    )
    gpus, _ = nvidia_gpus(parse_nvidia_csv(stdout, FULL[0].removeprefix("--query-gpu=").split(",")))
    devices, _ = nvidia_devices(gpus, SUPPORT_MATRIX, system_memory_bytes=64 * 2**30)
    a, b = devices
    assert (a.memory_total_bytes, a.memory_used_bytes, a.compute_capability) == (None, None, (8, 0))
    assert a.memory_kind is MemoryKind.DEDICATED  # a discrete card never borrows system RAM
    assert (b.memory_total_bytes, b.memory_used_bytes) == (81920 * MIB, 512 * MIB)
    assert (b.compute_capability, b.driver_version) == (None, None)


def test_bug02_kind_insufficient_permissions_end_to_end(tmp_path: Path) -> None:
    fake_smi(
        tmp_path,
        response(FULL, "0, GPU-00000000-0000-4000-8000-0000000000c0, NVIDIA L40S, 46068, "
                       "[Insufficient Permissions], 8.9, 550.90.07\n"),
    )
    (gpu,) = cuda(discover_host(config(tmp_path), SUPPORT_MATRIX))
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes, gpu.compute_capability) == (46068 * MIB, None, (8, 9))


# bug-04: unified memory (GB10, Jetson)


def test_bug04_gb10_unified_memory_from_memtotal(tmp_path: Path) -> None:
    case = load("bug-04")
    inp, exp = case["input"], case["expected"]
    fields6 = ["index", "uuid", "name", "memory.total", "compute_cap", "driver_version"]
    fake_smi(tmp_path, response(FULL, insert_memory_used(inp["adapted_daemon_stdout"], fields6, "[N/A]")))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(inp["proc_meminfo"], encoding="ascii")
    inv = discover_host(config(tmp_path, meminfo_path=str(meminfo), machine=inp["machine"]), SUPPORT_MATRIX)

    (want,) = exp["gpus"]
    (gpu,) = cuda(inv)
    assert nvidia_health(inv).status is ProbeStatus.OK
    assert gpu.index == want["index"]
    assert gpu.name == want["name"]
    assert gpu.compute_capability == tuple(want["compute_capability"])
    assert gpu.driver_version == want["driver_version"]
    assert gpu.memory_kind is MemoryKind.UNIFIED
    assert gpu.memory_total_bytes == want["unified_memory_total_bytes"] == 130663165952
    assert gpu.memory_used_bytes is None
    assert inv.memory_total_bytes == 130663165952
    assert parse_meminfo_total_bytes(inp["proc_meminfo"]) == 127600748 * 1024


@pytest.mark.parametrize(
    ("name", "memory_total", "kind", "total_bytes"),
    [
        ("Orin (nvgpu)", "[N/A]", MemoryKind.UNIFIED, 32 * 2**30),
        ("NVIDIA Jetson AGX Orin", "[N/A]", MemoryKind.UNIFIED, 32 * 2**30),
        ("NVIDIA Jetson AGX Thor", "N/A", MemoryKind.UNIFIED, 32 * 2**30),
        ("Xavier", "[Not Supported]", MemoryKind.UNIFIED, 32 * 2**30),
        ("NVIDIA GB10", "[N/A]", MemoryKind.UNIFIED, 32 * 2**30),
        ("NVIDIA B200", "[N/A]", MemoryKind.DEDICATED, None),
        ("NVIDIA GeForce RTX 4090", "[N/A]", MemoryKind.DEDICATED, None),
        ("NVIDIA GeForce RTX 4090", "24564", MemoryKind.DEDICATED, 24564 * MIB),
    ],
)
def test_bug04_kind_unified_only_for_integrated_parts(
    tmp_path: Path, name: str, memory_total: str, kind: MemoryKind, total_bytes: int | None
) -> None:
    fake_smi(tmp_path, response(FULL, f"0, GPU-00000000-0000-4000-8000-0000000000d0, {name}, {memory_total}, "
                                      "[N/A], 8.7, 540.4.0\n"))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {32 * 2**20} kB\n", encoding="ascii")
    inv = discover_host(config(tmp_path, meminfo_path=str(meminfo)), SUPPORT_MATRIX)
    (gpu,) = cuda(inv)
    assert gpu.name == name
    assert (gpu.memory_kind, gpu.memory_total_bytes) == (kind, total_bytes)


# bug-05: "No devices were found"


@pytest.mark.parametrize("exit_code", [None, 0, 6, 255])
def test_bug05_no_devices_whatever_the_exit_status(tmp_path: Path, exit_code: int | None) -> None:
    case = load("bug-05")
    assert case["input"]["exit_code"] is None  # unknown in the report: try several
    fake = fake_smi(tmp_path, response(FULL, case["input"]["stdout"], exit_code=exit_code))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    assert cuda(inv) == [] == case["expected"]["gpus"]
    h = nvidia_health(inv)
    assert h.status.value == case["expected"]["status"]
    assert h.message == "No devices were found"
    assert h.path == str(fake.path)
    assert inv.cpu_count == psutil.cpu_count()  # the worker stays up for CPU jobs
    assert fake.argvs() == [FULL]


def test_bug05_kind_empty_output_is_no_devices(tmp_path: Path) -> None:
    fake_smi(tmp_path, response(FULL, "\n"))
    assert nvidia_health(discover_host(config(tmp_path), SUPPORT_MATRIX)).status is ProbeStatus.NO_DEVICES


# bug-06: driver not loaded


@pytest.mark.parametrize("variant", ["stdout", "wsl_variant_stdout"])
def test_bug06_driver_unavailable(tmp_path: Path, variant: str) -> None:
    case = load("bug-06")
    stdout = case["input"][variant]
    fake_smi(tmp_path, response(FULL, stdout, exit_code=case["input"]["exit_code"]))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    h = nvidia_health(inv)
    assert h.status.value == case["expected"]["status"]
    assert h.message == stdout.splitlines()[0]
    assert cuda(inv) == []


@pytest.mark.parametrize(
    ("stdout", "stderr", "code"),
    [
        ("Failed to initialize NVML: Driver Not Loaded\n", "", 9),
        ("", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9),
        ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
         "NVIDIA Display Driver is properly installed and present in your system.\n", "", 12),
        ("Unable to determine the NVIDIA driver version: is the NVIDIA driver loaded?\n", "", 255),
    ],
)
def test_bug06_kind_other_driver_wordings(tmp_path: Path, stdout: str, stderr: str, code: int) -> None:
    fake_smi(tmp_path, response(FULL, stdout, stderr, code))
    h = nvidia_health(discover_host(config(tmp_path), SUPPORT_MATRIX))
    assert h.status is ProbeStatus.DRIVER_UNAVAILABLE
    assert h.message == (stdout or stderr).splitlines()[0]


# bug-07: driver/library version mismatch


@pytest.mark.parametrize(("variant", "nvml"), [("stdout", "535.161"), ("older_driver_stdout", None)])
def test_bug07_driver_library_mismatch(tmp_path: Path, variant: str, nvml: str | None) -> None:
    case = load("bug-07")
    stdout = case["input"][variant]
    fake_smi(tmp_path, response(FULL, stdout, exit_code=case["input"]["exit_code"]))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    h = nvidia_health(inv)
    assert h.status.value == case["expected"]["status"]
    assert h.message.startswith("Failed to initialize NVML: Driver/library version mismatch")
    assert cuda(inv) == []
    failure = classify_nvidia_failure(stdout, "", case["input"]["exit_code"], False)
    assert failure.nvml_library_version == nvml
    assert failure.message == stdout.splitlines()[0]
    if nvml is None:
        assert h.message == stdout.splitlines()[0]
    else:
        assert f"NVML library version: {nvml}" in h.message


def test_bug07_kind_other_version_on_stderr() -> None:
    failure = classify_nvidia_failure(
        "", "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.54.15\n", 18, False
    )
    assert (failure.status, failure.nvml_library_version) == (ProbeStatus.DRIVER_LIBRARY_MISMATCH, "550.54.15")


# bug-09: a hung nvidia-smi


def gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_bug09_hang_times_out_and_kills_the_process_group(tmp_path: Path) -> None:
    case = load("bug-09")
    assert case["input"]["behavior"] == "no output, process never exits"
    fake = fake_smi(tmp_path, response(FULL, "", sleep_s=120, spawn_sleeper_s=120))
    start = time.monotonic()
    inv = discover_host(config(tmp_path, nvidia_smi_timeout_s=1.0), SUPPORT_MATRIX)
    elapsed = time.monotonic() - start

    assert 1.0 <= elapsed < 6.0
    h = nvidia_health(inv)
    assert h.status is ProbeStatus.TIMEOUT
    assert "timed out after 1 s" in h.message
    assert cuda(inv) == []
    (call,) = fake.calls()
    assert call["pgid"] == call["pid"] != os.getpgid(0)  # its own process group
    assert call["sleeper_pid"] is not None
    assert gone(call["pid"])
    assert gone(call["sleeper_pid"])  # the child holding stdout died with the group


# bug-11: ordinary CSV that naive parsers break on


def test_bug11_two_gpus_names_with_spaces_locale_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = load("bug-11")
    monkeypatch.setenv("LC_ALL", "de_AT.UTF-8")
    monkeypatch.setenv("LANG", "de_AT.UTF-8")
    fields6 = ["index", "uuid", "name", "memory.total", "compute_cap", "driver_version"]
    fake = fake_smi(tmp_path, response(FULL, insert_memory_used(case["input"]["adapted_daemon_stdout_two_gpus"],
                                                                fields6, "1")))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    gpus = cuda(inv)
    assert len(gpus) == 2
    for gpu, want in zip(gpus, case["expected"]["two_gpu_result"], strict=True):
        assert gpu.index == want["index"]
        assert gpu.memory_total_bytes == want["memory_total_mib"] * MIB
        assert gpu.memory_used_bytes == MIB
        assert gpu.compute_capability == tuple(want["compute_capability"])
        assert gpu.name == "Tesla V100-SXM2-16GB"
        assert gpu.driver_version == "580.126.09"
    assert [(c["LC_ALL"], c["LANG"]) for c in fake.calls()] == [("C", "C")] * 4


def test_bug11_long_row_with_its_own_fields() -> None:
    case = load("bug-11")
    fields = query_fields(case["input"]["command"])
    parsed = parse_nvidia_csv(case["input"]["stdout"], fields)
    (row,) = parsed.rows
    want = case["expected"]["row_1"]
    assert row["name"] == want["name"] == "GeForce RTX 2080"
    assert row["driver_version"] == want["driver_version"]
    assert row["temperature.memory"] is want["temperature.memory"] is None
    assert row["gpu_uuid"] == "GPU-00000000-0000-4000-8000-000000000005"
    assert row["pstate"] == "P2"
    assert parsed.diagnostics == ()


def test_bug11_kind_three_part_driver_and_bad_lines(tmp_path: Path) -> None:
    case = load("bug-11")
    driver = case["expected"]["driver_version"].split("'")[1]
    fake_smi(
        tmp_path,
        response(
            FULL,
            f"0, GPU-00000000-0000-4000-8000-0000000000e0, GeForce RTX 2080 Ti, 11019, 0, 7.5, {driver}\n"
            "1, GPU-00000000-0000-4000-8000-0000000000e1, GeForce RTX\n"
            "Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error\n\n",
            exit_code=15,
        ),
    )
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    gpu, lost = cuda(inv)
    assert gpu.driver_version == "418.87.01"
    assert gpu.name == "GeForce RTX 2080 Ti"
    # issue 15: the GPU named in the diagnostic line is a lost device, and health is degraded
    assert (lost.state, lost.pci_bus_id, lost.index) == (DeviceState.LOST, "0000:3b:00.0", 2)
    assert nvidia_health(inv).status is ProbeStatus.DEGRADED
    assert "Unable to determine the device handle for GPU 0000:3B:00.0" in nvidia_health(inv).message
    assert "nvidia-smi: 1, GPU-00000000-0000-4000-8000-0000000000e1, GeForce RTX" in inv.notes
    assert any("Unable to determine the device handle" in n for n in inv.notes)
    assert any("status 15" in n for n in inv.notes)


# bug-12: two different models


def test_bug12_mixed_models_are_separate_devices(tmp_path: Path) -> None:
    case = load("bug-12")
    fields6 = ["index", "uuid", "name", "memory.total", "compute_cap", "driver_version"]
    fake_smi(tmp_path, response(FULL, insert_memory_used(case["input"]["adapted_daemon_stdout"], fields6)))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    a, b = cuda(inv)
    assert (a.index, a.name, a.memory_total_bytes, a.compute_capability) == (
        0, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", 97887 * MIB, (12, 0))
    assert (b.index, b.name, b.memory_total_bytes, b.compute_capability) == (
        1, "NVIDIA GB300", 256703 * MIB, (10, 3))
    assert a.uuid != b.uuid
    assert all(d.memory_kind is MemoryKind.DEDICATED and d.execution_supported and d.float64 for d in (a, b))
