"""Job spec parsing: good specs load, bad ones name the field and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayerd.core.types import GB, Accelerator, MemoryKind
from gpulayerd.models import Capabilities, SpecError, job_spec_from_mapping, load_job_spec

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_full_spec_loads_and_converts(tmp_path: Path) -> None:
    p = write(tmp_path, """
name = "ft"
command = ["python", "train.py", "--lr", "3e-4"]
workdir = "runs"
env = { WANDB_MODE = "offline" }
[requirements]
accelerator = "CUDA"
gpu_count = 2
gpu_memory_gb = 40
gpu_memory_kind = "dedicated"
min_cuda_compute_capability = "8.6"
frameworks = { torch = ">=2.4,<3", "NumPy" = ">=1.24" }
python = ">=3.10"
[distributed]
nproc_per_node = 2
[policy]
retries = 1
lease_s = 15
""")
    spec = load_job_spec(p, base_dir=tmp_path)
    assert spec.workdir == str((tmp_path / "runs").resolve())
    core = spec.to_core("j1")
    assert core.accelerator is Accelerator.CUDA
    assert (core.gpu_count, core.gpu_memory_bytes, core.gpu_memory_kind) == (2, 40 * GB, MemoryKind.DEDICATED)
    assert core.min_cuda_compute_capability == (8, 6)
    assert core.frameworks == {"torch": ">=2.4,<3", "numpy": ">=1.24"}
    assert core.distributed is not None and core.distributed.backend == "nccl"  # cuda default
    assert spec.policy.retries == 1 and spec.policy.lease_s == 15


def test_defaults_cpu_job(tmp_path: Path) -> None:
    spec = load_job_spec(write(tmp_path, 'command = "python -c \'print(1)\'"\n'), base_dir=tmp_path)
    assert spec.command == ["python", "-c", "print(1)"]
    core = spec.to_core()
    assert (core.accelerator, core.gpu_count, core.distributed) == (Accelerator.CPU, 0, None)
    assert spec.workdir == str(tmp_path)
    gpu = job_spec_from_mapping({"command": ["x"], "requirements": {"accelerator": "mps"}})
    assert gpu.to_core().gpu_count == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("command = [\n", "malformed TOML"),
        ('command = ["x"]\nbogus = 1\n', "bogus: unknown field"),
        ('command = ["x"]\n[requirements]\ngpus = 1\n', "requirements.gpus: unknown field"),
        ('command = ["x"]\n[requirements]\naccelerator = "tpu"\n',
         "requirements.accelerator: 'tpu' is not one of: cpu, cuda, mps, rocm"),
        ('command = ["x"]\n[requirements]\naccelerator = "cuda"\ngpu_count = "two"\n', "requirements.gpu_count"),
        ('command = ["x"]\n[requirements]\naccelerator = "cuda"\ngpu_memory_gb = -1\n', "requirements.gpu_memory_gb"),
        ('command = ["x"]\n[requirements]\naccelerator = "cuda"\ngpu_memory_kind = "vram"\n',
         "'vram' is not one of: dedicated, unified"),
        ('command = ["x"]\n[requirements]\naccelerator = "cuda"\nmin_cuda_compute_capability = "sm_80"\n',
         "requirements.min_cuda_compute_capability"),
        ('command = ["x"]\n[requirements]\nframeworks = { torchx = ">=1" }\n', "unknown framework 'torchx'; known: torch"),
        ('command = ["x"]\n[requirements]\nframeworks = { torch = "bigger than 2" }\n', "not a PEP 440 specifier"),
        ('command = ["x"]\n[requirements]\ngpu_count = 1\n', "gpu_count must be 0 when accelerator is 'cpu'"),
        ('command = ["x"]\n[requirements]\naccelerator = "mps"\nmin_cuda_compute_capability = 8\n',
         "applies only to accelerator 'cuda'"),
        ('command = []\n', "command: must not be empty"),
        ('name = "x"\n', "command: required field is missing"),
        ('command = ["x"]\n[distributed]\nbackend = "mpi"\n', "distributed.backend"),
        ('command = ["x"]\n[policy]\nretries = -1\n', "policy.retries"),
        ('command = ["x"]\nenv = { "A=B" = "1" }\n', "not a valid environment variable name"),
    ],
)
def test_bad_specs_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        load_job_spec(write(tmp_path, text), base_dir=tmp_path)
    assert expected in str(err.value)
    assert str(tmp_path / "job.toml") in str(err.value)


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "nope.toml")


def test_example_specs_load() -> None:
    examples = sorted((REPO / "examples" / "jobs").glob("*.toml"))
    assert len(examples) >= 3
    for p in examples:
        load_job_spec(p, base_dir=p.parent).to_core()


def test_sample_workers_parse() -> None:
    files = sorted((REPO / "tests" / "data" / "workers").glob("*.json"))
    assert len(files) >= 6
    for f in files:
        w = Capabilities.model_validate_json(f.read_bytes()).to_core()
        assert w.node_id and w.environments
