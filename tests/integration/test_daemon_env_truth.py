"""Real daemons whose environment answers must follow the facts (issue 27): a torch check taken
before the driver was ready is taken again once it is (bug-52), a framework whose import fails
rejects the jobs that name it (CPU jobs too).

The torch stand-ins are real interpreters (venvs without pip) holding a small ``torch`` package
that answers what the environment probe asks; nvidia-smi is the recorded fake.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.envs import make_env

from .conftest import TERMINAL, Lab

CASES = Path(__file__).resolve().parents[1] / "data" / "cases"


def torch_env(root: Path, version: str, cuda_build: str | None, init: str) -> Path:
    """A venv with a torch stand-in: ``torch/version.py`` and ``torch/__init__.py`` = ``init``."""
    python, _ = make_env(root, {"torch": version}, {
        "torch/version.py": f"__version__ = {version!r}\ncuda = {cuda_build!r}\n",
        "torch/__init__.py": init,
    })
    return python


def flag_torch(flag: Path) -> str:
    """torch whose CUDA is available exactly while ``flag`` exists (the driver is ready)."""
    return f"""import os
from . import version
__version__ = version.__version__
class cuda:
    is_available = staticmethod(lambda: os.path.exists({str(flag)!r}))
    device_count = staticmethod(lambda: int(os.path.exists({str(flag)!r})))
class backends:
    class mps:
        is_built = staticmethod(lambda: False)
        is_available = staticmethod(lambda: False)
class distributed:
    is_available = staticmethod(lambda: True)
    is_gloo_available = staticmethod(lambda: True)
    is_nccl_available = staticmethod(lambda: False)
    is_mpi_available = staticmethod(lambda: False)
"""


def test_bug52_torch_checked_before_the_driver_was_ready_is_checked_again(lab: Lab) -> None:
    """At boot nvidia-smi cannot reach the driver (exit 9) and torch says CUDA is unavailable; seconds
    later both work. The waiting job starts within a probe interval, and the answer taken without a
    driver was never written to the on-disk cache (a restart checks again)."""
    case = json.loads((CASES / "bug-52.json").read_text(encoding="utf-8"))["input"]
    flag = lab.root / "driver-ready"
    python = torch_env(lab.root / "env52", "2.5.1+cu124", "12.4", flag_torch(flag))
    fake = lab.fake_gpus([6144])
    fake.set_driver_unavailable()
    d = lab.daemon(fake=fake, interpreters=[str(python)], probe_interval_s=0.5)  # type: ignore[arg-type]
    assert "couldn't communicate with the NVIDIA driver" in d.cli_ok("devices")
    job_id = d.submit("--accelerator", "cuda", "--framework", f"torch{case['job']['frameworks']['torch']}",
                      "--", "true")
    waiting = d.wait_reason(job_id, lambda j: j.reason not in (None, "", "waiting for the scheduler"))
    assert waiting.status == "queued", waiting

    flag.touch()  # the driver is ready: nvidia-smi lists the GPU, torch finds CUDA
    fake.set_apps([])
    job = d.wait_status(job_id, TERMINAL, timeout_s=30)
    assert job.status == "succeeded", (job, d.log_tail())
    envs = [e.model_dump(mode="json") for e in d.call(lambda c: c.devices()).environments]
    assert [e["torch_cuda"] for e in envs] == [True]

    cached = [json.loads(f.read_text(encoding="utf-8"))
              for f in (d.state_dir / "cache" / "environments").glob("*.json")]
    torch_checked = [c for c in cached if c["torch_check"] and c["interpreter"] == str(python)]
    assert torch_checked and all(c["snapshot"]["torch_cuda"] is True for c in torch_checked), torch_checked


def test_a_framework_whose_import_fails_rejects_the_jobs_naming_it_cpu_jobs_included(lab: Lab) -> None:
    line = "undefined symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12"
    python = torch_env(lab.root / "envbad", "2.5.1", "12.4",
                       f"raise ImportError('/site/torch/lib/libtorch_cuda.so: {line}')\n")
    d = lab.daemon(interpreters=[str(python)], probe_interval_s=0.5)  # type: ignore[arg-type]
    job_id = d.submit("--framework", "torch>=2.4", "--", "true")  # a CPU job
    waiting = d.wait_reason(job_id, lambda j: "import fails" in (j.reason or ""), timeout_s=20)
    assert waiting.status in ("queued", "rejected"), waiting
    assert f"torch: import fails: ImportError: /site/torch/lib/libtorch_cuda.so: {line}" in (waiting.reason or "")
    plain = d.wait_status(d.submit("--", "true"), TERMINAL)  # a job that does not name torch still runs
    assert plain.status == "succeeded"
    envs = [e.model_dump(mode="json") for e in d.call(lambda c: c.devices()).environments]
    assert envs[0]["import_errors"]["torch"].startswith("ImportError: /site/torch/lib/libtorch_cuda.so")
