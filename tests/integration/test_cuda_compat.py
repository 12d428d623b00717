"""A real daemon with fake GPUs and a crafted environment (torch 2.4.1 built for CUDA 12.4):
on driver 470 a CUDA job waits with the compatibility message; once the driver is 550 it runs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.envs import fake_torch, make_env
from tests.integration.conftest import Lab, wait_until

# Enough of torch for the environment probe: CUDA available, NCCL there, no MPS.
FAKE_TORCH = fake_torch(cuda=True, nccl=True)


def _set_driver(scenario: Path, old: str, new: str) -> None:
    text = scenario.read_text(encoding="utf-8")
    assert old in text
    tmp = scenario.with_name(".nvidia-smi.json.tmp")
    tmp.write_text(text.replace(old, new), encoding="utf-8")
    tmp.replace(scenario)  # the fake reads it on every call


def test_driver_470_refuses_a_cu124_build_and_driver_550_runs_it(lab: Lab) -> None:
    python, _ = make_env(lab.root / "cu124", {"torch": "2.4.1"}, {
        "torch/version.py": "__version__ = '2.4.1'\ncuda = '12.4'\n", "torch/__init__.py": FAKE_TORCH})
    fake = lab.fake_gpus([24 * 1024])
    scenario = fake.tool.path.with_name("nvidia-smi.json")
    _set_driver(scenario, "550.54.15", "470.82.01")
    d = lab.daemon(fake=fake, probe_interval_s=0.5, interpreters=[str(python)])  # type: ignore[arg-type]
    caps = d.cli_json("devices", "--json")
    caps = caps if isinstance(caps, list) else [caps]
    host = caps[0]["hostname"]
    assert caps[0]["environments"][0]["cuda_builds"] == {"torch": "12.4"}

    job = d.submit("--accelerator", "cuda", "--framework", "torch>=2.4", "--", "python", "-c", "pass")
    wait_until(lambda: d.show(job)["reason"].startswith("Driver:"), 15, "the compatibility reason")
    message = f"torch 2.4.1+cu124 needs driver ≥ 525.60.13 (CUDA 12.x); {host} has 470.82.01 (CUDA 11.4)"
    assert d.show(job)["reason"] == f"Driver: {message} on {host} in {python}"
    explained = json.loads(d.cli_ok("explain", "--json", job))
    assert [r["message"] for w in explained["workers"] for r in w["rejections"]] == [message]

    _set_driver(scenario, "470.82.01", "550.54.15")
    wait_until(lambda: d.show(job)["status"] == "succeeded", 20, "the job to run on driver 550")
