"""Real daemons whose environment answers must follow the facts (issue 27): a torch check taken
before the driver was ready is taken again once it is (bug-52), a framework whose import fails
rejects the jobs that name it (CPU jobs too).

The torch stand-ins are real interpreters (venvs without pip) holding a small ``torch`` package
that answers what the environment probe asks; nvidia-smi is the recorded fake.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.fakes.envs import fake_torch, make_env

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
    return fake_torch(cuda=f"os.path.exists({str(flag)!r})", nccl=False, prelude="import os\n")


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


PYENV = r"""#!/usr/bin/env bash
# A stand-in for pyenv's libexec/pyenv: only `pyenv exec PROGRAM ARGS`, with pyenv's version
# selection order: PYENV_VERSION, the nearest .python-version from the working directory up,
# $PYENV_ROOT/version.
set -e
[ "$1" = exec ] || { echo "pyenv: no such command \`$1'" >&2; exit 1; }
program="$2"; shift 2
version="$PYENV_VERSION"
if [ -z "$version" ]; then
  dir="$PWD"
  while [ -n "$dir" ]; do
    if [ -f "$dir/.python-version" ]; then version="$(head -n1 "$dir/.python-version")"; break; fi
    [ "$dir" = / ] && break
    dir="$(dirname "$dir")"
  done
fi
[ -n "$version" ] || version="$(head -n1 "$PYENV_ROOT/version")"
if [ ! -d "$PYENV_ROOT/versions/$version" ]; then
  echo "pyenv: version \`$version' is not installed (set by $PYENV_ROOT/version)" >&2; exit 1
fi
exec "$PYENV_ROOT/versions/$version/bin/$program" "$@"
"""


def pyenv_tree(root: Path) -> tuple[Path, Path, Path]:
    """~/.pyenv with versions ml-3.11 (torch 2.4.1) and plain-3.11 (no torch), global ml-3.11, the
    recorded shim; and a project whose .python-version names plain-3.11. Returns (shim, ml python, proj)."""
    case = json.loads((CASES / "bug-49.json").read_text(encoding="utf-8"))["input"]
    pyenv = root / ".pyenv"
    ml = torch_env(pyenv / "versions" / "ml-3.11", "2.4.1", None, flag_torch(root / "never"))
    make_env(pyenv / "versions" / "plain-3.11", {})
    (pyenv / "libexec").mkdir(parents=True)
    (pyenv / "libexec" / "pyenv").write_text(PYENV, encoding="utf-8")
    (pyenv / "libexec" / "pyenv").chmod(0o755)
    (pyenv / "version").write_text("ml-3.11\n", encoding="utf-8")
    (pyenv / "shims").mkdir()
    shim = pyenv / "shims" / "python"
    shim.write_text(case["shim"].replace("/home/user/.pyenv", str(pyenv)), encoding="utf-8")
    shim.chmod(0o755)
    proj = root / "proj"
    proj.mkdir()
    (proj / ".python-version").write_text("plain-3.11\n", encoding="utf-8")
    return shim, ml, proj


def test_bug49_a_pyenv_shim_is_resolved_once_and_jobs_run_exactly_the_probed_interpreter(lab: Lab) -> None:
    shim, ml, proj = pyenv_tree(lab.root / "home")
    d = lab.daemon(interpreters=[str(shim)], probe_interval_s=0.5)  # type: ignore[arg-type]
    (env,) = d.call(lambda c: c.devices()).environments
    assert (env.interpreter, env.configured, env.launcher) == (str(ml), str(shim), "pyenv shim")
    assert env.frameworks["torch"].version == "2.4.1"
    devices = d.cli_ok("devices")
    assert f"configured as {shim} (pyenv shim): jobs run the interpreter above, its directory first on PATH" \
        in devices, devices
    # proj/.python-version names plain-3.11 (no torch): the job still runs the probed ml-3.11.
    job_id = d.submit("--workdir", str(proj), "--framework", "torch>=2.4", "--",
                      "python", "-c", "import sys, torch; print(sys.executable, torch.__version__)")
    job = d.wait_status(job_id, TERMINAL)
    assert job.status == "succeeded", d.cli_ok("logs", job_id)
    assert d.cli_ok("logs", job_id) == f"{ml} 2.4.1\n"
    # A `python` a script calls finds the same interpreter: its directory is first on the job's PATH.
    nested = d.submit("--workdir", str(proj), "--", "sh", "-c", "python -c 'import sys; print(sys.executable)'")
    assert d.wait_status(nested, TERMINAL).status == "succeeded"
    assert d.cli_ok("logs", nested) == f"{ml}\n"


def test_bug49_a_shim_whose_version_is_not_installed_is_a_broken_environment_with_pyenvs_words(lab: Lab) -> None:
    shim, _, _ = pyenv_tree(lab.root / "home")
    (shim.parent.parent / "version").write_text("3.10.4\n", encoding="utf-8")
    d = lab.daemon(interpreters=[str(shim)], probe_interval_s=0.5)  # type: ignore[arg-type]
    (env,) = d.call(lambda c: c.devices()).environments
    assert not env.ok
    assert "pyenv: version `3.10.4' is not installed" in "; ".join(env.notes), env.notes
    job_id = d.submit("--", "python", "-c", "print(1)")
    waiting = d.wait_reason(job_id, lambda j: "is not installed" in (j.reason or ""))
    assert waiting.status in ("queued", "rejected"), waiting


def test_a_conda_environment_runs_jobs_and_probes_activated(lab: Lab) -> None:
    """Its activate.d script exports LD_LIBRARY_PATH (torch here finds CUDA only with it), its
    conda-meta/state sets a variable; jobs get both, CONDA_PREFIX and the prefix's bin first on PATH."""
    prefix = lab.root / "miniforge" / "envs" / "ml"
    torch_init = fake_torch(cuda="os.environ.get('LD_LIBRARY_PATH', '').endswith('/lib/cudnn')", nccl=False,
                            prelude="import os\n")
    python = torch_env(prefix, "2.5.1", None, torch_init)
    (prefix / "conda-meta").mkdir()
    (prefix / "conda-meta" / "state").write_text(json.dumps({"env_vars": {"LAB_DATA": "/data/lab"}}),
                                                  encoding="utf-8")
    (prefix / "etc" / "conda" / "activate.d").mkdir(parents=True)
    (prefix / "etc" / "conda" / "activate.d" / "cudnn.sh").write_text(
        'export LD_LIBRARY_PATH="$CONDA_PREFIX/lib/cudnn${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n', encoding="utf-8")
    d = lab.daemon(interpreters=[str(python)], probe_interval_s=0.5)  # type: ignore[arg-type]
    (env,) = d.call(lambda c: c.devices()).environments
    assert env.activation["CONDA_PREFIX"] == str(prefix)
    assert env.activation["LD_LIBRARY_PATH"] == f"{prefix}/lib/cudnn" and env.activation["LAB_DATA"] == "/data/lab"
    assert "conda environment ml: jobs run activated (also sets LAB_DATA, LD_LIBRARY_PATH)" in d.cli_ok("devices")
    deadline = time.monotonic() + 20
    while env.torch_pending and time.monotonic() < deadline:  # the probe imports torch activated too
        time.sleep(0.1)
        (env,) = d.call(lambda c: c.devices()).environments
    assert env.torch_cuda is True, env
    show = "import os; print(os.environ['CONDA_PREFIX'], os.environ['LD_LIBRARY_PATH'], os.environ['LAB_DATA'])"
    job_id = d.submit("--", "python", "-c", show)
    assert d.wait_status(job_id, TERMINAL).status == "succeeded"
    assert d.cli_ok("logs", job_id) == f"{prefix} {prefix}/lib/cudnn /data/lab\n"
