"""EnvironmentProber: real probe subprocesses against real and fake interpreters."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import platform
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpulayerd.core.types import EnvironmentSnapshot, FrameworkVersion
from gpulayerd.gpu.environments import EnvironmentProber, default_interpreter
from gpulayerd.gpu.probe_report import snapshot_from_report
from tests.fakes.envs import add_dists, make_env

CASES = Path(__file__).resolve().parents[2] / "data" / "cases"
PROBE_TIMEOUT_S = 60.0


def script(path: Path, body: str) -> Path:
    """Write an executable shell script used as a stand-in "interpreter"."""
    path.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def counting_interpreter(tmp_path: Path, python: Path) -> tuple[Path, Path]:
    """An interpreter that records each start in a counter file, then execs ``python``."""
    counter = tmp_path / "starts"
    wrapper = script(tmp_path / "counting-python", f'echo start >> "{counter}"\nexec "{python}" "$@"\n')
    return wrapper, counter


def starts(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def add_file_changing_mtime(directory: Path) -> None:
    """Add files to ``directory`` until its mtime changes (timestamps are coarse on some kernels)."""
    before = directory.stat().st_mtime_ns
    for i in range(200):
        (directory / f"added-{i}.txt").write_text("x")
        if directory.stat().st_mtime_ns != before:
            return
        time.sleep(0.005)
    raise AssertionError(f"mtime of {directory} never changed")


@pytest.fixture(scope="module")
def venv_snapshot() -> EnvironmentSnapshot:
    return EnvironmentProber(PROBE_TIMEOUT_S, None).probe(sys.executable, use_cache=False)


# ---------------------------------------------------------------------- the real venv


def test_real_venv(venv_snapshot: EnvironmentSnapshot) -> None:
    snap = venv_snapshot
    assert snap.ok
    assert snap.interpreter == os.path.abspath(sys.executable)
    assert snap.python_version == platform.python_version()
    assert snap.frameworks["torch"] == FrameworkVersion(
        name="torch", version=importlib.metadata.version("torch"), distribution="torch", valid=True
    )
    assert snap.torch_cuda is False
    assert snap.torch_mps is False
    assert snap.distributed_backends is not None
    assert "gloo" in snap.distributed_backends
    assert "nccl" not in snap.distributed_backends
    assert snap.notes == ()


def test_default_interpreter_is_the_daemons_own() -> None:
    assert default_interpreter() == sys.executable


def test_metadata_only_probe_leaves_torch_unknown() -> None:
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(sys.executable, torch_check=False)
    assert snap.ok
    assert snap.frameworks["torch"].valid
    assert (snap.torch_cuda, snap.torch_mps, snap.distributed_backends) == (None, None, None)
    assert "torch: availability not checked (metadata-only probe)" in snap.notes


def test_async_probe(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"numpy": "1.26.4"})
    prober = EnvironmentProber(PROBE_TIMEOUT_S, None)
    snap = asyncio.run(prober.async_probe(str(python)))
    assert snap.ok
    assert snap.frameworks["numpy"].version == "1.26.4"
    assert snap.torch_cuda is None
    assert snap.notes == ()


# ------------------------------------------------------------------------ versions

_BUG20 = json.loads((CASES / "bug-20.json").read_text(encoding="utf-8"))


def test_invalid_version_is_flagged_without_hiding_others(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", _BUG20["input"]["installed_metadata"])
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    assert snap.ok
    for name, expected in _BUG20["expected"]["report"].items():
        got = snap.frameworks[name]
        assert (got.version, got.valid) == (expected["version"], expected["valid"])
    assert "distro-info" not in snap.frameworks
    assert any("tensorflow: installed version '-VERSION-' is not PEP 440" in n for n in snap.notes)
    assert not any("numpy" in n for n in snap.notes)


def test_conflicting_distributions_keep_the_canonical_one(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"onnxruntime": "1.19.2", "onnxruntime-gpu": "1.20.1"})
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    # No RECORD to compare with the files: the canonical name is reported, the other listed.
    assert snap.frameworks["onnxruntime"] == FrameworkVersion(
        "onnxruntime", "1.19.2", "onnxruntime", others=("onnxruntime-gpu 1.20.1",))
    (note,) = [n for n in snap.notes if n.startswith("onnxruntime:")]
    assert "onnxruntime 1.19.2" in note
    assert "onnxruntime-gpu 1.20.1" in note
    assert "conflicting" in note


@pytest.mark.parametrize(
    ("entries", "chosen", "conflict"),
    [
        ({"onnxruntime-gpu": "1.20.1", "onnxruntime-directml": "1.20.0"}, "onnxruntime-directml", True),
        ({"tensorflow": "2.15.0", "tensorflow-intel": "2.15.0"}, "tensorflow", False),
        ({"tensorflow": "2.15.0", "tensorflow-intel": "2.14.0"}, "tensorflow", True),
        ({"tensorflow-cpu": "2.15.0", "tensorflow-intel": "2.15.0"}, "tensorflow-cpu", True),
    ],
)
def test_choice_between_distributions(entries: dict[str, str], chosen: str, conflict: bool) -> None:
    key = "onnxruntime" if "onnxruntime-gpu" in entries else "tensorflow"
    report = {
        "probe_version": 1,
        "python_version": "3.11.7",
        "frameworks": {key: [{"distribution": d, "version": v} for d, v in entries.items()]},
        "torch_stage": "absent",
        "notes": [],
    }
    snap = snapshot_from_report("/x/python", report)
    assert snap.frameworks[key].distribution == chosen
    assert snap.frameworks[key].version == entries[chosen]
    assert any("conflicting" in n for n in snap.notes) is conflict


def test_tensorrt_meta_package_and_its_cuda_wheel_are_not_a_conflict(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"tensorrt": "10.0.1", "tensorrt-cu12": "10.0.1"})
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    assert snap.frameworks["tensorrt"] == FrameworkVersion("tensorrt", "10.0.1", "tensorrt")
    assert snap.notes == ()


def test_auxiliary_distributions_and_aliases(tmp_path: Path) -> None:
    dists = {
        "mlx": "0.30.4",
        "mlx-metal": "0.30.4",
        "jax": "0.4.35",
        "jaxlib": "0.4.35",
        "jax-cuda12-plugin": "0.4.35",
        "tensorflow-macos": "2.15.0",
        "cupy-cuda12x": "13.3.0",
        "pytorch-triton": "3.1.0+cf34004b8a",
    }
    python, _ = make_env(tmp_path / "env", dists)
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    got = {k: (f.version, f.distribution, f.valid) for k, f in snap.frameworks.items()}
    assert got == {
        "mlx": ("0.30.4", "mlx", True),
        "mlx-metal": ("0.30.4", "mlx-metal", True),
        "jax": ("0.4.35", "jax", True),
        "jaxlib": ("0.4.35", "jaxlib", True),
        "jax-cuda12-plugin": ("0.4.35", "jax-cuda12-plugin", True),
        "tensorflow": ("2.15.0", "tensorflow-macos", True),
        "cupy": ("13.3.0", "cupy-cuda12x", True),
        "triton": ("3.1.0+cf34004b8a", "pytorch-triton", True),
    }
    assert snap.notes == ()


def test_malformed_report_degrades_to_notes() -> None:
    report = {
        "probe_version": 1,
        "python_version": 3.11,
        "frameworks": {"numpy": [{"distribution": "numpy"}, "junk"], "torch": "junk"},
        "torch_stage": "ran",
        "torch": "junk",
        "notes": ["from the probe", 7],
    }
    snap = snapshot_from_report("/x/python", report)
    assert snap.ok
    assert snap.python_version is None
    assert snap.frameworks == {}
    assert snap.torch_cuda is None
    assert snap.notes[0] == "from the probe"
    assert "python version unknown" in snap.notes
    assert any(n.startswith("numpy: malformed entry") for n in snap.notes)


# ------------------------------------------------------------------ torch's answers

_FAKE_TORCH = """
import types
__version__ = "2.6.0+cu124"
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


def test_torch_answers_map_to_snapshot_fields(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"torch": "2.6.0+cu124"}, {"torch/__init__.py": _FAKE_TORCH})
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    assert snap.ok
    assert snap.torch_cuda is False
    assert snap.torch_mps is False
    # One backend check failed, so the set of backends is unknown, not "gloo only".
    assert snap.distributed_backends is None
    assert "torch: built with CUDA 12.4 but torch.cuda.is_available() is False" in snap.notes
    assert any(n.startswith("torch reports MPS unavailable") for n in snap.notes)
    assert any("nccl probe exploded" in n for n in snap.notes)


def test_broken_torch_import_keeps_the_metadata(tmp_path: Path) -> None:
    python, _ = make_env(
        tmp_path / "env",
        {"torch": "2.5.1", "numpy": "1.26.4"},
        {"torch/__init__.py": "raise OSError('libcudart.so.12: cannot open shared object file')"},
    )
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    assert snap.ok
    assert snap.frameworks["torch"].version == "2.5.1"
    assert snap.frameworks["numpy"].version == "1.26.4"
    assert (snap.torch_cuda, snap.torch_mps, snap.distributed_backends) == (None, None, None)
    assert any(n.startswith("torch: import failed: OSError: libcudart.so.12") for n in snap.notes)


_NOISY_HANGING_TORCH = """
import sys, time
for i in range(2000):
    sys.stderr.write("W1130 cuda_init.cc:{}] waiting for the driver\\n".format(i))
sys.stderr.flush()
time.sleep(1000)
"""


def test_hanging_torch_import_salvages_the_metadata(tmp_path: Path) -> None:
    python, _ = make_env(
        tmp_path / "env",
        {"torch": "2.5.1", "numpy": "1.26.4"},
        {"torch/__init__.py": _NOISY_HANGING_TORCH},
    )
    wrapper, counter = counting_interpreter(tmp_path, python)
    prober = EnvironmentProber(2.0, None)
    snap = prober.probe(str(wrapper))
    assert snap.ok
    assert snap.frameworks["numpy"].version == "1.26.4"
    assert snap.torch_cuda is None
    assert any(
        n.startswith("torch: availability unknown: the torch check timed out after 2 s") for n in snap.notes
    )
    # An unfinished torch check is not cached: the next call tries again.
    prober.probe(str(wrapper))
    assert starts(counter) == 2


# ------------------------------------------------------------------------ failures


def test_missing_interpreter(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python"
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(missing))
    assert not snap.ok
    assert snap.interpreter == str(missing)
    assert len(snap.notes) == 1
    assert str(missing) in snap.notes[0]
    assert "does not exist" in snap.notes[0]


def test_interpreter_not_on_path() -> None:
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe("no-such-python-3.99")
    assert not snap.ok
    assert snap.notes == ("interpreter 'no-such-python-3.99' not found on PATH",)


def test_non_executable_interpreter(tmp_path: Path) -> None:
    plain = tmp_path / "python"
    plain.write_text("not a program")
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(plain))
    assert not snap.ok
    assert snap.notes == (f"interpreter {plain} is not executable",)


def test_unrunnable_interpreter(tmp_path: Path) -> None:
    binary = tmp_path / "python"
    binary.write_bytes(b"\x00\x01\x02 not an executable format")
    binary.chmod(0o755)
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(binary))
    assert not snap.ok
    assert snap.notes[0].startswith(f"cannot run interpreter {binary}: ")


def test_hanging_interpreter_is_killed_at_the_timeout(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hang = script(tmp_path / "python", f'echo $$ > "{pids}"\nsleep 1000 &\necho $! >> "{pids}"\nwait\n')
    prober = EnvironmentProber(1.0, None)
    started = time.monotonic()
    snap = prober.probe(str(hang))
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 1.0 + 1.5
    assert not snap.ok
    assert snap.notes == (f"probe of {hang} timed out after 1 s; its process group was killed",)
    shell_pid, sleep_pid = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 5.0
    for pid in (shell_pid, sleep_pid):
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(pid), f"pid {pid} survived the timeout"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_garbage_output(tmp_path: Path) -> None:
    noisy = script(tmp_path / "python", "echo 'Python 2.7 says hello'\n")
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(noisy))
    assert not snap.ok
    assert snap.notes == (
        f"probe of {noisy} exited with status 0 without a JSON report; stdout began 'Python 2.7 says hello'",
    )


def test_endless_output_is_cut_off(tmp_path: Path) -> None:
    flood = script(tmp_path / "python", "exec yes flood\n")
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None, max_output_bytes=1 << 20).probe(str(flood))
    assert not snap.ok
    assert snap.notes == (f"probe of {flood} wrote too much output and was killed",)


def test_crash_reports_status_and_stderr(tmp_path: Path) -> None:
    crash = script(tmp_path / "python", "echo 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    snap = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(crash))
    assert not snap.ok
    assert snap.notes == (
        f"probe of {crash} exited with status 1 without any output; stderr: Fatal Python error: init_fs_encoding",
    )


def test_constructor_rejects_nonpositive_timeout() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        EnvironmentProber(0.0, None)


# ------------------------------------------------------------------- environment variables


def test_daemon_pythonpath_is_not_inherited_but_an_explicit_env_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, _ = make_env(tmp_path / "env", {})
    extra = tmp_path / "extra"
    add_dists(extra, {"transformers": "4.46.0"})
    monkeypatch.setenv("PYTHONPATH", str(extra))
    inherited = EnvironmentProber(PROBE_TIMEOUT_S, None).probe(str(python))
    assert "transformers" not in inherited.frameworks
    explicit = EnvironmentProber(PROBE_TIMEOUT_S, None, env=dict(os.environ)).probe(str(python))
    assert explicit.frameworks["transformers"].version == "4.46.0"


# ------------------------------------------------------------------------------- cache


def test_cache_hit_runs_no_subprocess_and_site_change_invalidates(tmp_path: Path) -> None:
    python, site = make_env(tmp_path / "env", {"numpy": "1.26.4"})
    wrapper, counter = counting_interpreter(tmp_path, python)
    prober = EnvironmentProber(PROBE_TIMEOUT_S, None)
    first = prober.probe(str(wrapper))
    assert first.ok
    assert starts(counter) == 1
    assert prober.probe(str(wrapper)) == first
    assert starts(counter) == 1
    # torch_check=False is cached separately, and use_cache=False always runs.
    prober.probe(str(wrapper), torch_check=False)
    assert starts(counter) == 2
    assert prober.probe(str(wrapper), use_cache=False) == first
    assert starts(counter) == 3
    # "pip install": a new dist-info changes the site-packages mtime.
    add_dists(site, {"transformers": "4.46.0"})
    add_file_changing_mtime(site)
    changed = prober.probe(str(wrapper))
    assert starts(counter) == 4
    assert changed.frameworks["transformers"].version == "4.46.0"
    assert prober.probe(str(wrapper)) == changed
    assert starts(counter) == 4


def test_failures_are_not_cached(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    noisy = script(tmp_path / "python", f'echo start >> "{counter}"\necho garbage\n')
    prober = EnvironmentProber(PROBE_TIMEOUT_S, tmp_path / "cache")
    prober.probe(str(noisy))
    prober.probe(str(noisy))
    assert starts(counter) == 2


def test_persistent_cache_serves_a_new_prober(tmp_path: Path) -> None:
    python, site = make_env(tmp_path / "env", {"numpy": "1.26.4", "onnxruntime-gpu": "1.20.1"})
    wrapper, counter = counting_interpreter(tmp_path, python)
    cache_dir = tmp_path / "cache"
    first = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir).probe(str(wrapper))
    assert starts(counter) == 1
    assert len(list(cache_dir.glob("*.json"))) == 1
    second = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir).probe(str(wrapper))
    assert starts(counter) == 1
    assert second == first
    add_file_changing_mtime(site)
    EnvironmentProber(PROBE_TIMEOUT_S, cache_dir).probe(str(wrapper))
    assert starts(counter) == 2


def test_corrupt_cache_file_is_ignored(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"numpy": "1.26.4"})
    wrapper, counter = counting_interpreter(tmp_path, python)
    cache_dir = tmp_path / "cache"
    first = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir).probe(str(wrapper))
    (cache_file,) = cache_dir.glob("*.json")
    cache_file.write_text("{not json")
    again = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir).probe(str(wrapper))
    assert again == first
    assert starts(counter) == 2
    json.loads(cache_file.read_text())


def test_venvs_sharing_a_base_interpreter_are_cached_apart(tmp_path: Path) -> None:
    a, _ = make_env(tmp_path / "a", {"numpy": "1.26.4"})
    b, _ = make_env(tmp_path / "b", {"numpy": "2.1.0"})
    assert a.resolve() == b.resolve()
    prober = EnvironmentProber(PROBE_TIMEOUT_S, tmp_path / "cache")
    assert prober.probe(str(a)).frameworks["numpy"].version == "1.26.4"
    assert prober.probe(str(b)).frameworks["numpy"].version == "2.1.0"
    assert prober.probe(str(a)).frameworks["numpy"].version == "1.26.4"
