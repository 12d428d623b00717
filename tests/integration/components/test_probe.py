"""The environment probe script, run for real by an interpreter in a subprocess.

Fake environments are real venvs (``python -m venv --without-pip``) whose
site-packages hold hand-made ``*.dist-info`` directories, so importlib.metadata
finds them exactly as it finds pip-installed distributions.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpulayerd.gpu import probe as probe_module
from tests.fakes.envs import add_dists, make_env

PROBE = Path(probe_module.__file__)
VENV_PYTHON = sys.executable
CASES = Path(__file__).resolve().parents[2] / "data" / "cases"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def run_probe(python: str | Path, *args: str, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """Run the probe; assert stdout is exactly one JSON object and return it."""
    proc = subprocess.run(
        [str(python), str(PROBE), *args],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else clean_env(),
        timeout=120,
        check=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    assert report["probe_version"] == 1
    return report


def frameworks(report: Mapping[str, object]) -> dict[str, list[dict[str, str]]]:
    value = report["frameworks"]
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def venv_report() -> dict[str, object]:
    return run_probe(VENV_PYTHON)


# --------------------------------------------------------------------- the real venv


def test_real_venv_python_version_and_platform(venv_report: dict[str, object]) -> None:
    expected = subprocess.run(
        [VENV_PYTHON, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert venv_report["python_version"] == expected == platform.python_version()
    assert venv_report["executable"] == VENV_PYTHON
    assert venv_report["implementation"] == platform.python_implementation()
    plat = venv_report["platform"]
    assert isinstance(plat, dict)
    assert plat["machine"] == platform.machine()
    assert plat["mac_ver"] == (platform.mac_ver()[0] or None)
    assert venv_report["failed"] is False


def test_real_venv_reports_torch_from_metadata_and_runtime(venv_report: dict[str, object]) -> None:
    installed = importlib.metadata.version("torch")
    assert frameworks(venv_report)["torch"] == [{"distribution": "torch", "version": installed}]
    assert venv_report["torch_stage"] == "ran"
    torch = venv_report["torch"]
    assert isinstance(torch, dict)
    assert torch["error"] is None
    assert torch["version"] == installed
    assert torch["cuda_available"] is False
    assert torch["cuda_device_count"] == 0
    assert torch["mps_available"] is False
    assert torch["distributed_available"] is True
    assert torch["backends"]["gloo"] is True
    # The numpy-missing UserWarning torch emits on import must not reach stdout or notes.
    assert venv_report["notes"] == []


def test_real_venv_site_packages_and_mtimes(venv_report: dict[str, object]) -> None:
    site = [p for p in sys.path if p.endswith("site-packages")]
    assert venv_report["site_packages"] == site
    mtimes = venv_report["path_mtimes_ns"]
    assert isinstance(mtimes, dict)
    for d in site:
        assert mtimes[d] == os.stat(d).st_mtime_ns


def test_no_torch_stage_reads_metadata_only() -> None:
    report = run_probe(VENV_PYTHON, "--no-torch")
    assert report["torch"] is None
    assert report["torch_stage"] == "skipped"
    assert frameworks(report)["torch"][0]["version"] == importlib.metadata.version("torch")


def test_probe_keeps_to_python_3_8_syntax() -> None:
    ast.parse(PROBE.read_text(encoding="utf-8"), feature_version=(3, 8))


# ----------------------------------------------------------------- distribution aliases

_BUG21 = json.loads((CASES / "bug-21.json").read_text(encoding="utf-8"))
_REPORT_KEY = {
    "tensorflow-macos": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "onnxruntime-gpu": "onnxruntime",
    "cupy-cuda12x": "cupy",
    "torch": "torch",
    "pytorch-triton": "triton",
    "mlx": "mlx",
    "mlx-metal": "mlx-metal",
}


@pytest.mark.parametrize(
    "environment", _BUG21["input"]["environments"], ids=lambda e: str(e["desc"]).split(",")[0]
)
def test_distribution_aliases_map_to_frameworks(tmp_path: Path, environment: dict[str, object]) -> None:
    dists = environment["distributions"]
    assert isinstance(dists, dict)
    python, _ = make_env(tmp_path / "env", dists)
    found = frameworks(run_probe(python, "--no-torch"))
    expected = {
        _REPORT_KEY[dist]: [{"distribution": dist, "version": version}] for dist, version in dists.items()
    }
    assert found == expected


def test_tensorflow_macos_report_shape(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"tensorflow-macos": "2.15.0"})
    found = frameworks(run_probe(python))
    assert found["tensorflow"] == [{"distribution": "tensorflow-macos", "version": "2.15.0"}]


def test_two_distributions_of_one_framework_are_both_reported(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"onnxruntime-gpu": "1.20.1", "onnxruntime": "1.19.2"})
    found = frameworks(run_probe(python, "--no-torch"))
    assert found["onnxruntime"] == [
        {"distribution": "onnxruntime", "version": "1.19.2"},
        {"distribution": "onnxruntime-gpu", "version": "1.20.1"},
    ]


def test_auxiliary_distributions_have_their_own_keys(tmp_path: Path) -> None:
    dists = {"jax": "0.4.35", "jaxlib": "0.4.35", "jax-cuda12-plugin": "0.4.35", "jax-cuda12-pjrt": "0.4.35"}
    python, _ = make_env(tmp_path / "env", dists)
    found = frameworks(run_probe(python, "--no-torch"))
    assert found == {name: [{"distribution": name, "version": "0.4.35"}] for name in dists}


def test_unrelated_distributions_are_not_reported(tmp_path: Path) -> None:
    dists = {"distro-info": "0.23ubuntu1", "onnxruntime-extensions": "0.12.0", "tensorrt-cu12-libs": "10.0.1"}
    python, _ = make_env(tmp_path / "env", dists)
    assert frameworks(run_probe(python, "--no-torch")) == {}


@pytest.mark.parametrize(
    ("distribution", "key"),
    [
        ("TensorFlow_MacOS", "tensorflow"),
        ("tf.nightly", "tensorflow"),
        ("intel-tensorflow", "tensorflow"),
        ("cupy-cuda11x", "cupy"),
        ("cupy-cuda102", "cupy"),
        ("cupy-rocm-5-0", "cupy"),
        ("onnxruntime-directml", "onnxruntime"),
        ("onnxruntime-extensions", None),
        ("pytorch-triton-rocm", "triton"),
        ("triton-windows", "triton"),
        ("tensorrt-cu12", "tensorrt"),
        ("tensorrt-cu12-bindings", None),
        ("jax-rocm60-plugin", "jax-rocm60-plugin"),
        ("mlx-metal", "mlx-metal"),
        ("tensorflow-metal", "tensorflow-metal"),
        ("numpy", "numpy"),
        ("numpy-financial", None),
    ],
)
def test_classify(distribution: str, key: str | None) -> None:
    assert probe_module.classify(probe_module.normalise(distribution)) == key


# ------------------------------------------------------------- never importing frameworks

_MARKER_INIT = (
    "import pathlib\n"
    "pathlib.Path({marker!r}).write_text('imported')\n"
    "raise RuntimeError('this framework must not be imported by the probe')\n"
)


def test_frameworks_are_not_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    init = _MARKER_INIT.format(marker=str(marker))
    vllm_fork = "vllm_fork-0.6.0.dist-info"
    python, _ = make_env(
        tmp_path / "env",
        {"tensorflow": "2.16.1"},
        {
            "tensorflow/__init__.py": init,
            # importable, but without any package metadata
            "jax/__init__.py": init,
            # shipped by a distribution whose name we do not know
            "vllm/__init__.py": init,
            f"{vllm_fork}/METADATA": "Metadata-Version: 2.1\nName: vllm-fork\nVersion: 0.6.0\n",
            f"{vllm_fork}/top_level.txt": "vllm\n",
        },
    )
    report = run_probe(python)
    assert not marker.exists()
    found = frameworks(report)
    assert found["tensorflow"] == [{"distribution": "tensorflow", "version": "2.16.1"}]
    assert found["vllm"] == [{"distribution": "vllm-fork", "version": "0.6.0"}]
    assert "jax" not in found
    notes = report["notes"]
    assert isinstance(notes, list)
    assert any(n.startswith("jax: importable from") and "version unknown" in n for n in notes)
    assert any(n.startswith("vllm: supplied by distribution 'vllm-fork'") for n in notes)
    assert report["torch_stage"] == "absent"


def test_shadowed_distribution_is_noted(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"numpy": "1.26.4"})
    extra = tmp_path / "extra"
    add_dists(extra, {"numpy": "2.1.0"})
    report = run_probe(python, "--no-torch", env=clean_env(PYTHONPATH=str(extra)))
    assert frameworks(report)["numpy"] == [{"distribution": "numpy", "version": "2.1.0"}]
    notes = report["notes"]
    assert isinstance(notes, list)
    assert any("numpy 1.26.4" in n and "shadowed by 2.1.0" in n for n in notes)
    mtimes = report["path_mtimes_ns"]
    assert isinstance(mtimes, dict)
    assert mtimes[str(extra)] == os.stat(extra).st_mtime_ns


# ---------------------------------------------------------------------- broken torch

_FAKE_TORCH = """
import os, sys, types
print("python-level noise on stdout")
os.write(1, b"C-level noise on fd 1\\n")
__version__ = "2.6.0.dev20241113+cu124"
version = types.SimpleNamespace(cuda="12.4", hip=None)
cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
backends = types.SimpleNamespace(
    mps=types.SimpleNamespace(is_built=lambda: True, is_available=lambda: False)
)
def _nccl():
    raise RuntimeError("nccl probe exploded")
distributed = types.SimpleNamespace(
    is_available=lambda: True,
    is_gloo_available=lambda: True,
    is_nccl_available=_nccl,
    is_mpi_available=lambda: False,
)
"""


def test_fake_torch_degrades_field_by_field_and_stdout_stays_json(tmp_path: Path) -> None:
    python, _ = make_env(
        tmp_path / "env", {"torch": "2.6.0.dev20241113+cu124"}, {"torch/__init__.py": _FAKE_TORCH}
    )
    report = run_probe(python)
    torch = report["torch"]
    assert isinstance(torch, dict)
    assert torch == {
        "version": "2.6.0.dev20241113+cu124",
        "cuda_built": "12.4",
        "hip_built": None,
        "cuda_available": False,
        "cuda_device_count": 0,
        "mps_built": True,
        "mps_available": False,
        "mps_recommended_max_memory": None,  # asked only when mps is available
        "distributed_available": True,
        "backends": {"gloo": True, "nccl": None, "mpi": False},
        "error": None,
    }
    assert report["notes"] == ["torch: is_nccl_available() failed: RuntimeError: nccl probe exploded"]


@pytest.mark.parametrize(
    ("init", "error"),
    [
        ("raise RuntimeError('libtorch_cuda.so: cannot open shared object file')", "RuntimeError: libtorch"),
        ("import sys\nsys.exit('torch refuses to load')", "SystemExit: torch refuses to load"),
        (None, "ModuleNotFoundError: No module named 'torch'"),
    ],
    ids=["raises", "exits", "metadata-only"],
)
def test_broken_torch_becomes_an_error_string(tmp_path: Path, init: str | None, error: str) -> None:
    files = {"torch/__init__.py": init} if init is not None else {}
    python, _ = make_env(tmp_path / "env", {"torch": "2.5.1", "numpy": "1.26.4"}, files)
    report = run_probe(python)
    torch = report["torch"]
    assert isinstance(torch, dict)
    assert str(torch["error"]).startswith(error)
    assert torch["cuda_available"] is None
    assert frameworks(report)["numpy"] == [{"distribution": "numpy", "version": "1.26.4"}]
    notes = report["notes"]
    assert isinstance(notes, list)
    assert any(n.startswith("torch: import failed: " + error) for n in notes)
