"""The pre-flight check on the chosen worker (issue 35), with two real daemons on 127.0.0.1.

The owner's environment holds a torch stand-in that the environment probe finds fine but that
fails to import in a job's environment (``GPULAYER_JOB_ID`` set), as a torch whose CUDA libraries
do not match fails only when a job loads them; the worker's stand-in imports and initializes its
device. nvidia-smi is the recorded fake on both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.envs import fake_torch, make_env

from .conftest import TERMINAL, Daemon, Lab
from .loopback import loopback_cluster, node_id

UNDEFINED = "libtorch_cuda.so: undefined symbol: __nvJitLinkComplete_12_4"



def torch_env(root: Path, broken_in_jobs: bool) -> Path:
    """A venv with a torch stand-in (CUDA available); ``broken_in_jobs``: its import fails in a job."""
    prelude = "import os\n"
    if broken_in_jobs:
        prelude += f"if os.environ.get('GPULAYER_JOB_ID'):\n    raise ImportError({UNDEFINED!r})\n"
    python, _ = make_env(root, {"torch": "2.5.1+cu124"}, {
        "torch/version.py": "__version__ = '2.5.1+cu124'\ncuda = '12.4'\n",
        "torch/__init__.py": fake_torch(cuda=True, nccl=True, prelude=prelude),
    })
    return python


def environments(d: Daemon, node: str) -> dict[str, dict[str, Any]]:
    """interpreter -> environment of ``node``, as ``gpulayer devices --json`` on ``d`` shows it."""
    workers = json.loads(d.cli_ok("devices", "--json"))
    return {e["interpreter"]: e for w in workers if w["node_id"] == node for e in w["environments"]}


@pytest.mark.slow
def test_a_job_whose_environment_fails_its_preflight_is_moved_and_the_environment_marked(lab: Lab) -> None:
    bad, good = torch_env(lab.root / "bad-env", True), torch_env(lab.root / "good-env", False)
    owner, worker = loopback_cluster(lab, [2, 2], each=[
        {"fake": lab.fake_gpus([24576]), "interpreters": [str(bad)]},
        {"fake": lab.fake_gpus([24576]), "interpreters": [str(good)]},
    ])
    me, other = node_id(owner), node_id(worker)
    cuda = ["--accelerator", "cuda", "--gpus", "1", "--framework", "torch>=2.4"]

    job_id = owner.submit(*cuda, "--", "sh", "-c", "echo ran")
    job = owner.wait_status(job_id, TERMINAL, timeout_s=60)
    assert (job.status, job.where_node) == ("succeeded", other), (job, owner.log_tail())
    shown = owner.show(job_id)
    attempts = [(a["attempt"], a["state"], a["worker"]) for a in shown["attempts"]]
    assert attempts == [(1, "preflight-failed", me), (2, "exited", other)], shown["attempts"]
    assert UNDEFINED in shown["attempts"][0]["reason"], shown["attempts"][0]
    history = " | ".join(e["reason"] for e in shown["events"])
    assert re.search(rf"attempt 1 preflight-failed on \S+ \({me[:8]}\): torch: ImportError: {re.escape(UNDEFINED)}; "
                     "queued again for another worker", history), history

    # The owner's environment is broken for torch now: shown by devices, and a job naming torch
    # goes to the worker at once (no second pre-flight there).
    envs = environments(owner, me)
    assert envs[str(bad)]["import_errors"] == {"torch": f"pre-flight check failed: ImportError: {UNDEFINED}"}, envs
    assert "pre-flight check failed" in owner.cli_ok("devices")
    again = owner.submit(*cuda, "--", "true")
    job = owner.wait_status(again, TERMINAL, timeout_s=60)
    assert (job.status, job.where_node, job.attempt) == ("succeeded", other, 1), job

    # A workdir that holds a broken torch/ folder (on the job's own PYTHONPATH too) marks nothing broken: the
    # check runs in a neutral directory, without the variables the job's spec sets.
    workdir = lab.root / "with-own-torch"
    (workdir / "torch").mkdir(parents=True)
    (workdir / "torch" / "__init__.py").write_text("raise ImportError('the user\\'s own torch folder')\n")
    mine = worker.submit(*cuda, "--workdir", str(workdir), "--env", f"PYTHONPATH={workdir}", "--", "true")
    job = worker.wait_status(mine, TERMINAL, timeout_s=60)
    assert (job.status, job.where_node, job.attempt) == ("succeeded", other, 1), (job, worker.log_tail())
    envs = environments(worker, other)
    assert envs[str(good)]["import_errors"] == {}, envs

    # --no-preflight: no check (the job itself would fail on the owner; a job naming no framework has none).
    skipped = worker.submit("--framework", "torch", "--no-preflight", "--", "true")
    job = worker.wait_status(skipped, TERMINAL, timeout_s=60)
    assert job.status == "succeeded", job
    assert not (worker.state_dir / "runs" / skipped / "1" / "preflight.log").exists()
