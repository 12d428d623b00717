"""Driver / CUDA-build compatibility, the new requirements (os, min_driver_version, cuda_runtime),
and where CUDA builds are read from (torch/version.py, distribution names, nvidia-smi's header)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulayerd.core.matching.cuda_compat import Compat, driver_cuda_version, driver_supports, minimum_driver
from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.types import (
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import RejectionCode, Verdict
from gpulayerd.gpu.cuda_build import cuda_builds_in, read_torch_cuda
from gpulayerd.gpu.nvidia.query import parse_cuda_version_header, query_driver_cuda
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, SpecError, job_spec_from_mapping
from tests.fakes.envs import add_dists

CASES = Path(__file__).resolve().parents[1] / "data" / "cases"


@pytest.mark.parametrize(("build", "driver", "expected"), [
    ("11.8", "450.80.02", Compat.OK),  # the 11.x minimum itself
    ("11.8", "450.36.06", Compat.TOO_OLD),  # 11.0's own driver is below the minor-compat minimum
    ("12.1", "470.82.01", Compat.TOO_OLD),
    ("12.1", "470.256.02", Compat.TOO_OLD),
    ("12.4", "525.60.13", Compat.OK),  # minor-version compatibility: 12.0's driver runs 12.4
    ("12.4", "525.60.12", Compat.TOO_OLD),
    ("13.0", "575.51.03", Compat.TOO_OLD),
    ("13.0", "580.95.05", Compat.OK),
    ("12", "550.54.15", Compat.OK),  # a major only (cupy-cuda12x)
    ("12.4", None, Compat.UNKNOWN),
    ("12.4", "[N/A]", Compat.UNKNOWN),
    (None, "550.54.15", Compat.UNKNOWN),
])
def test_driver_supports_recorded_pairs(build: str | None, driver: str | None, expected: Compat) -> None:
    assert driver_supports(build, driver) is expected


def test_driver_cuda_decides_when_the_driver_version_is_unknown() -> None:
    assert driver_supports("12.6", None, "12.4") is Compat.OK
    assert driver_supports("13.0", None, "12.4") is Compat.TOO_OLD
    assert minimum_driver("12.4") == "525.60.13"
    assert minimum_driver("11") == "450.80.02"
    assert driver_cuda_version("550.54.15") == "12.4"
    assert driver_cuda_version("470.82.01") == "11.4"
    assert driver_cuda_version("525.60.13") == "12.0"
    assert driver_cuda_version("300.1") is None


def test_nvidia_smi_header_gives_the_driver_cuda_version() -> None:
    case = json.loads((CASES / "bug-01.json").read_text())
    line = next(v for v in _strings(case) if "CUDA Version:" in v)
    assert parse_cuda_version_header(line) == "13.0"
    assert parse_cuda_version_header("| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: N/A |") is None


def test_query_driver_cuda_falls_back_to_the_table() -> None:
    from gpulayerd.gpu.command import CommandResult

    def failing(argv: object, timeout_s: float, env_overrides: object = None) -> CommandResult:
        return CommandResult(stdout="", stderr="boom", returncode=9, timed_out=False, not_found=False)

    def header(argv: object, timeout_s: float, env_overrides: object = None) -> CommandResult:
        text = "| NVIDIA-SMI 535.54.03   Driver Version: 535.54.03   CUDA Version: 12.2     |\n"
        return CommandResult(stdout=text, stderr="", returncode=0, timed_out=False, not_found=False)

    assert query_driver_cuda("/x/nvidia-smi", header, 5.0) == "12.2"
    assert query_driver_cuda("/x/nvidia-smi", failing, 5.0, "470.82.01") == "11.4"
    assert query_driver_cuda(None, failing, 5.0, None) is None


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# ------------------------------------------------------------------- reading builds


def test_torch_version_py_read_as_text() -> None:
    assert read_torch_cuda("__version__ = '2.4.1'\ncuda = '12.4'\n") == "12.4"
    assert read_torch_cuda("cuda: Optional[str] = '12.1'\nhip = None\n") == "12.1"
    assert read_torch_cuda("from typing import Optional\ncuda: Optional[str] = None\n") == ""
    assert read_torch_cuda("hip = '6.2'\n") is None


def test_builds_from_distribution_names(tmp_path: Path) -> None:
    site = tmp_path / "site"
    add_dists(site, {"cupy-cuda12x": "13.3.0", "jax-cuda12-plugin": "0.4.35", "nvidia-cublas-cu12": "12.4.5.8",
                     "torch": "2.4.1"})
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.4.1'\ncuda = '12.4'\n")
    builds = cuda_builds_in([str(tmp_path / "missing"), str(site)])
    assert builds == {"torch": "12.4", "cupy": "12", "jax": "12", "nvidia-libs": "12"}


# ------------------------------------------------------------------- matching

def _worker(name: str, driver: str | None, env: EnvironmentSnapshot, os_name: str = "linux") -> WorkerSnapshot:
    dev = DeviceSnapshot(Accelerator.CUDA, 0, uuid=f"GPU-{name}", memory_total_bytes=24 * 10**9,
                         compute_capability=(8, 6), driver_version=driver, execution_supported=True, float64=True)
    return WorkerSnapshot(node_id=name, name=name, devices=(dev,), environments=(env,), os=os_name)


def _env(torch: str = "2.4.1", builds: dict[str, str] | None = None) -> EnvironmentSnapshot:
    return EnvironmentSnapshot(
        interpreter="/opt/env/bin/python", python_version="3.11.9",
        frameworks={"torch": FrameworkVersion("torch", torch, "torch")}, torch_cuda=True, torch_mps=False,
        distributed_backends=("gloo", "nccl"), cuda_builds={"torch": "12.4"} if builds is None else builds,
    )


CUDA_JOB = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1, frameworks={"torch": ">=2.4"})


def test_cuda_job_is_rejected_on_a_driver_too_old_for_the_build() -> None:
    e = explain(CUDA_JOB, [_worker("ws-3", "470.82.01", _env())], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOWHERE
    (rej,) = e.workers[0].rejections
    assert rej.code is RejectionCode.CUDA_DRIVER_INCOMPATIBLE
    assert rej.message == "torch 2.4.1+cu124 needs driver ≥ 525.60.13 (CUDA 12.x); ws-3 has 470.82.01 (CUDA 11.4)"
    assert (rej.requirement, rej.wanted, rej.found) == ("cuda_compat", "driver >= 525.60.13", "470.82.01")
    row = next(c for c in e.workers[0].checks if c.requirement == "cuda_compat")
    assert row.ok is False


def test_same_job_fits_driver_550_and_a_local_tag_is_a_build_too() -> None:
    e = explain(CUDA_JOB, [_worker("ws-2", "550.54.15", _env())], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW
    tagged = _env(torch="2.4.1+cu121", builds={})
    rej = explain(CUDA_JOB, [_worker("old", "470.82.01", tagged)], SUPPORT_MATRIX).workers[0].rejections
    assert [r.message for r in rej] == ["torch 2.4.1+cu121 needs driver ≥ 525.60.13 (CUDA 12.x); old has 470.82.01 (CUDA 11.4)"]


def test_unknown_driver_or_build_is_a_note_not_a_rejection() -> None:
    for worker in (_worker("a", None, _env()), _worker("b", "470.82.01", _env(builds={}))):
        e = explain(CUDA_JOB, [worker], SUPPORT_MATRIX)
        assert e.verdict is Verdict.FITS_NOW, e.workers[0].rejections
        row = next(c for c in e.workers[0].checks if c.requirement == "cuda_compat")
        assert row.ok is None
        assert "unknown" in row.found


def test_cpu_job_ignores_the_driver() -> None:
    job = JobRequest(job_id="c", frameworks={"torch": ">=2.4"})
    e = explain(job, [_worker("ws-3", "470.82.01", _env())], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW
    assert all(c.requirement != "cuda_compat" for c in e.workers[0].checks)


def test_explicit_requirements() -> None:
    w = _worker("ws-2", "550.54.15", _env())
    unknown = _worker("ws-9", "550.54.15", _env(torch="2.4.1", builds={}))

    def rejs(job: JobRequest, worker: WorkerSnapshot) -> list[tuple[RejectionCode, str, str, str]]:
        e = explain(job, [worker], SUPPORT_MATRIX)
        return [(r.code, r.requirement, r.wanted, r.found) for r in e.workers[0].rejections]

    base = {"job_id": "j", "accelerator": Accelerator.CUDA, "gpu_count": 1}
    assert rejs(JobRequest(**base, cuda_runtime=">=12.1"), w) == []  # type: ignore[arg-type]
    assert rejs(JobRequest(**base, cuda_runtime="<12.4"), w) == [  # type: ignore[arg-type]
        (RejectionCode.CUDA_RUNTIME_MISMATCH, "cuda_runtime", "<12.4", "12.4")]
    assert rejs(JobRequest(**base, cuda_runtime=">=12.1"), unknown) == [  # type: ignore[arg-type]
        (RejectionCode.UNKNOWN_METRIC, "cuda_runtime", ">=12.1", "unknown")]
    assert rejs(JobRequest(**base, min_driver_version="555.42.02"), w) == [  # type: ignore[arg-type]
        (RejectionCode.DRIVER_TOO_OLD, "min_driver_version", ">= 555.42.02", "550.54.15")]
    assert rejs(JobRequest(**base, min_driver_version="550.54.15"), w) == []  # type: ignore[arg-type]
    assert rejs(JobRequest(**base, os="darwin"), w) == [  # type: ignore[arg-type]
        (RejectionCode.OS_MISMATCH, "os", "darwin", "linux")]
    e = explain(JobRequest(**base, min_driver_version="555.42.02"), [w], SUPPORT_MATRIX)  # type: ignore[arg-type]
    assert e.workers[0].rejections[0].message == "ws-2 has NVIDIA driver 550.54.15 < 555.42.02 required"


@pytest.mark.parametrize(("req", "message"), [
    ({"os": "windows"}, "requirements.os: 'windows' is not one of: linux, darwin"),
    ({"cuda_runtime": "twelve"}, "requirements.cuda_runtime: 'twelve' is not a version specifier"),
    ({"min_driver_version": "r550"}, "requirements.min_driver_version: 'r550' is not an NVIDIA driver version"),
    # Specifiers are bounded (a peer's offer of a 200,000-clause set took seconds to parse and judge):
    ({"cuda_runtime": ">=12," * 50}, "requirements.cuda_runtime: '>=12,>=12,>=12,>=12,>=12,>=12,>=12,>=12,'... is "
                                     "not a version specifier of at most 200 characters"),
    ({"frameworks": {"torch": ">=2," * 60}}, "torch: '>=2,>=2,>=2,>=2,>=2,>=2,>=2,>=2,>=2,>=2,'... is not a PEP 440 "
                                             "specifier of at most 200 characters"),
    ({"python": ">=3.1," * 50}, "requirements.python: String should have at most 200 characters"),
])
def test_spec_errors_name_the_field_and_what_is_allowed(req: dict[str, str], message: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec_from_mapping({"command": ["true"], "requirements": req}, base_dir="/")
    assert message in str(err.value)


def test_spec_to_core_and_capabilities_carry_the_new_fields() -> None:
    spec = job_spec_from_mapping({"command": ["true"], "requirements": {
        "accelerator": "cuda", "cuda_runtime": "12.4", "os": "Linux", "min_driver_version": "525.60.13"}},
        base_dir="/")
    job = spec.to_core("j")
    assert (job.cuda_runtime, job.os, job.min_driver_version) == ("==12.4", "linux", "525.60.13")
    caps = Capabilities.model_validate_json(
        (Path(__file__).resolve().parents[1] / "data" / "workers" / "lab-ws-02.json").read_text())
    w = caps.to_core()
    assert (w.os, w.driver_cuda) == ("linux", None)  # an older report: the driver version still decides
    from gpulayerd.gpu.compose import build_capabilities
    from gpulayerd.gpu.discovery import HostInventory

    inv = HostInventory(devices=tuple(d.to_core() for d in caps.devices), health=(), cpu_count=1,
                        memory_total_bytes=None, hostname="ws-2", platform="Linux", machine="x86_64")
    built = build_capabilities(inv, [], "n", 0.0)
    assert built.driver_cuda == "12.4" and built.to_core().os == "linux"
