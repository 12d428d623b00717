"""Matcher and launch-environment halves of the recorded cases in tests/data/cases.

Each test reads its case file and checks the case's ``expected`` values, so the
recorded data (not a copy typed into the test) drives the assertions.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.core.launch import cuda_visible_devices, launch_env, visible_cuda_devices
from gpulayerd.core.matching.evaluate import match
from gpulayerd.core.matching.versions import VersionCheck, check_version, is_valid_version
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Placement, RejectionCode
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import JobSpec, parse_compute_capability

CASES = Path(__file__).resolve().parents[1] / "data" / "cases"
MiB = 2**20


def case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())
    return data


def devices_from_rows(stdout: str) -> tuple[DeviceSnapshot, ...]:
    """Rows in the daemon's 6-field recorded form: index, uuid, name, memory.total, compute_cap, driver."""
    out = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        idx, uuid, name, mem, cc, drv = (f.strip() for f in line.split(","))
        out.append(DeviceSnapshot(
            accelerator=Accelerator.CUDA, index=int(idx), uuid=uuid, name=name,
            memory_total_bytes=int(mem) * MiB, memory_kind=MemoryKind.DEDICATED,
            compute_capability=parse_compute_capability(cc), driver_version=drv,
            execution_supported=True, float64=True,
        ))
    return tuple(out)


def cuda_job(**kw: Any) -> JobRequest:
    return JobRequest(job_id="j", accelerator=Accelerator.CUDA, **kw)


def test_bug_12_mixed_models_match_per_device() -> None:
    c = case("bug-12")
    w = WorkerSnapshot(node_id="w", devices=devices_from_rows(c["input"]["adapted_daemon_stdout"]),
                       environments=(EnvironmentSnapshot(interpreter="/py", python_version="3.11.7"),))
    assert len(w.devices) == 2
    jobs = {j["name"]: j for j in c["input"]["jobs"]}

    def run(name: str) -> Placement | list[Any]:
        j = jobs[name]
        cc = parse_compute_capability(j.get("min_cuda_compute_capability"))
        mem = j.get("gpu_memory_gb")
        return match(cuda_job(gpu_count=j["gpus"], gpu_memory_bytes=None if mem is None else mem * GB,
                              min_cuda_compute_capability=cc), w, SUPPORT_MATRIX)

    big = run("big")
    assert isinstance(big, Placement) and big.device_indices == (1,)  # expected: granted index 1 only
    pair = run("pair")
    assert not isinstance(pair, Placement)
    mem = [r for r in pair if r.code is RejectionCode.INSUFFICIENT_MEMORY]
    assert [(r.device, r.found) for r in mem] == [(0, "102.6 GB")]  # 97887 MiB = 102.6 GB < 120
    cc12 = run("cc12")
    assert isinstance(cc12, Placement) and cc12.device_indices == (0,)
    # cc10: either device qualifies numerically; best fit picks the smaller one.
    for dev in w.devices:
        assert dev.compute_capability is not None and dev.compute_capability >= (10, 0)
    cc10 = run("cc10")
    assert isinstance(cc10, Placement) and cc10.device_indices == (0,)


def test_bug_13_compute_capability_numeric() -> None:
    c = case("bug-13")
    ops = {">=": operator.ge, ">": operator.gt, "<": operator.lt}
    results = []
    for a, op, b in c["input"]["comparisons"]:
        ca, cb = parse_compute_capability(a), parse_compute_capability(b)
        assert ca is not None and cb is not None
        results.append(ops[op](ca, cb))
    assert results == c["expected"]["numeric_results"]
    parsed = [parse_compute_capability(v) for v in c["input"]["reported_values_to_parse"]]
    assert parsed == [(8, 6), (12, 0), (9, 0), None, (8, 0), (8, 0)]
    for cc, sm in c["expected"]["sm_strings"].items():
        major, minor = parse_compute_capability(cc)  # type: ignore[misc]
        assert f"{major}{minor}" == sm
    # requirement forms 8, 8.0, '8.0' normalise alike; unknown never satisfies
    for form in (8, 8.0, "8.0"):
        spec = JobSpec.model_validate({"command": ["true"], "requirements": {
            "accelerator": "cuda", "min_cuda_compute_capability": form}})
        assert spec.to_core().min_cuda_compute_capability == (8, 0)
    w = WorkerSnapshot(node_id="w", devices=(DeviceSnapshot(Accelerator.CUDA, 0, "GPU-x", execution_supported=True),),
                       environments=(EnvironmentSnapshot(interpreter="/py"),))
    res = match(cuda_job(gpu_count=1, min_cuda_compute_capability=(8, 0)), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    assert RejectionCode.UNKNOWN_METRIC in {r.code for r in res}


def test_bug_15_pci_bus_order_in_child_env() -> None:
    c = case("bug-15")
    devs = devices_from_rows(c["input"]["nvidia_smi_rows"])
    titan = next(d for d in devs if d.name == "TITAN Xp")
    assert titan.index == c["input"]["grant"]["nvidia_smi_index"]
    env = launch_env(Accelerator.CUDA, (titan.index,), "j", 1)
    for k, v in c["expected"]["child_env"].items():
        assert env[k] == v


def test_bug_17_cuda_visible_devices_semantics() -> None:
    c = case("bug-17")
    for inp, expected in zip(c["input"]["cases"], c["expected"]["visible"], strict=True):
        assert visible_cuda_devices(inp["CUDA_VISIBLE_DEVICES"], inp["physical_gpus"]) == expected
    env = launch_env(Accelerator.CPU, (), "j", 1)
    assert "CUDA_VISIBLE_DEVICES" in env and env["CUDA_VISIBLE_DEVICES"] == ""
    assert cuda_visible_devices([3, 0]) == "0,3"  # comma-separated, no spaces


def test_bug_18_local_versions() -> None:
    c = case("bug-18")
    installed = c["input"]["installed"]["torch"]
    for spec, expected in c["expected"]["results"].items():
        assert (check_version(installed, spec) is VersionCheck.OK) is expected, spec
        w = WorkerSnapshot(node_id="w", environments=(EnvironmentSnapshot(
            interpreter="/py", frameworks={"torch": FrameworkVersion("torch", installed, "torch")}),))
        res = match(JobRequest(frameworks={"torch": spec}), w, SUPPORT_MATRIX)
        assert isinstance(res, Placement) is expected, spec


def test_bug_20_invalid_versions_in_metadata() -> None:
    c = case("bug-20")
    meta = c["input"]["installed_metadata"]
    assert {k: is_valid_version(v) for k, v in meta.items()} == {
        "numpy": True, "distro-info": False, "tensorflow": False}
    fws = {k: FrameworkVersion(k, v, k, is_valid_version(v)) for k, v in meta.items()}
    w = WorkerSnapshot(node_id="w", environments=(EnvironmentSnapshot(interpreter="/py", frameworks=fws),))
    ok = match(JobRequest(frameworks={"numpy": c["input"]["requirements"]["numpy"]}), w, SUPPORT_MATRIX)
    assert isinstance(ok, Placement)
    bad = match(JobRequest(frameworks={"tensorflow": c["input"]["requirements"]["tensorflow"]}), w, SUPPORT_MATRIX)
    assert not isinstance(bad, Placement)
    assert [r.code for r in bad] == [RejectionCode.INVALID_VERSION]
    assert "not PEP 440" in bad[0].message


@pytest.mark.parametrize("env_kind", ["torch_mps_false", "torch_absent"])
def test_bug_23_mps_offered_only_when_available(env_kind: str) -> None:
    c = case("bug-23")["input"]["case_a"]
    mps = DeviceSnapshot(Accelerator.MPS, 0, "mps-0", "Apple M1", 16 * 2**30, None, MemoryKind.UNIFIED,
                         execution_supported=True, float64=False)
    if env_kind == "torch_mps_false":
        env = EnvironmentSnapshot("/py", "3.10", {"torch": FrameworkVersion("torch", c["torch"], "torch")},
                                  torch_mps=False)
    else:
        env = EnvironmentSnapshot("/py", "3.10", {})
    w = WorkerSnapshot(node_id="mac", devices=(mps,), environments=(env,))
    torch_job = JobRequest(accelerator=Accelerator.MPS, gpu_count=1, frameworks={"torch": ">=1.12"})
    res = match(torch_job, w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    expected = (RejectionCode.TORCH_BACKEND_UNAVAILABLE if env_kind == "torch_mps_false"
                else RejectionCode.FRAMEWORK_MISSING)
    assert expected in {r.code for r in res}


def test_bug_25_float64_never_on_mps() -> None:
    c = case("bug-25")
    assert c["expected"]["device_report"] == {"type": "mps", "float64": False}
    mps = DeviceSnapshot(Accelerator.MPS, 0, "mps-0", "Apple M2", 32 * 2**30, None, MemoryKind.UNIFIED,
                         execution_supported=True, float64=False)
    w = WorkerSnapshot(node_id="mac", devices=(mps,), environments=(EnvironmentSnapshot("/py"),))
    spec = JobSpec.model_validate({"command": ["python", "x.py"], "requirements": {
        "accelerator": "mps", "requires_float64": c["input"]["job"]["needs_float64_on_gpu"]}})
    res = match(spec.to_core(), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    assert RejectionCode.FLOAT64_UNSUPPORTED in {r.code for r in res}
    spec32 = JobSpec.model_validate({"command": ["python", "x.py"], "requirements": {"accelerator": "mps"}})
    assert isinstance(match(spec32.to_core(), w, SUPPORT_MATRIX), Placement)


def test_bug_01_unknown_capability_refused_with_reason() -> None:
    c = case("bug-01")
    row = c["expected"]["gpus"][0]
    dev = DeviceSnapshot(Accelerator.CUDA, row["index"], row["uuid"], row["name"], row["memory_total_mib"] * MiB,
                         None, MemoryKind.DEDICATED, row["compute_capability"], row["driver_version"], True, True)
    w = WorkerSnapshot(node_id="w", devices=(dev,), environments=(EnvironmentSnapshot("/py"),))
    res = match(cuda_job(gpu_count=1, min_cuda_compute_capability=(7, 0)), w, SUPPORT_MATRIX)
    assert not isinstance(res, Placement)
    unknown = [r for r in res if r.code is RejectionCode.UNKNOWN_METRIC]
    assert unknown and "compute capability is unknown" in unknown[0].message
    assert isinstance(match(cuda_job(gpu_count=1), w, SUPPORT_MATRIX), Placement)
