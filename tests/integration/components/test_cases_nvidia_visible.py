"""The daemon's own CUDA_VISIBLE_DEVICES (bug-45), replayed: the recorded nvidia-smi answer through
the fake tool and the real probe, the recorded daemon environment through
:mod:`gpulayerd.core.visible`, then the matcher."""

from __future__ import annotations

from pathlib import Path

from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.types import Accelerator, DeviceState, EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.visible import Visibility, apply_visibility
from gpulayerd.gpu.discovery import discover_host
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes import response
from tests.integration.components.test_cases_nvidia import FULL, config, cuda, fake_smi, load

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)


def test_bug45_the_gpu_the_daemons_environment_hides_is_never_granted(tmp_path: Path) -> None:
    inp = load("bug-45")["input"]
    fake_smi(tmp_path, response(FULL, inp["stdout"]))
    found = cuda(discover_host(config(tmp_path), SUPPORT_MATRIX))
    assert [d.name for d in found] == ["NVIDIA GeForce GT 1030", "NVIDIA GeForce RTX 3090"]  # nvidia-smi lists both
    devices, notes = apply_visibility(found, Visibility.of(inp["daemon_environment"]))
    assert [(d.index, d.state, d.state_reason) for d in devices] == [
        (0, DeviceState.EXCLUDED, "CUDA_VISIBLE_DEVICES"), (1, DeviceState.OK, "")]
    assert notes == ()
    job = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=inp["job"]["gpu_count"])
    ev = evaluate(job, WorkerSnapshot("ws", devices=devices, environments=ENV), SUPPORT_MATRIX)
    assert ev.placement is not None and ev.placement.device_indices == (1,)
    two = evaluate(JobRequest(job_id="k", accelerator=Accelerator.CUDA, gpu_count=2),
                   WorkerSnapshot("ws", devices=devices, environments=ENV), SUPPORT_MATRIX)
    assert two.placement is None
    assert any("GPU 0 is excluded by the daemon's CUDA_VISIBLE_DEVICES" in r.message for r in two.rejections)
