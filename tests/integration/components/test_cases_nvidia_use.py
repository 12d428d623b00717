"""GPUs in use by processes nvidia-smi cannot show (bug-44's kind), replayed through the fake
nvidia-smi and the real probe (:func:`discover_host`), then judged by the matcher.

Inside a container with its own PID namespace, nvidia-smi shows a GPU's ``memory.used`` and an
empty process list: the driver's pids belong to the host or to other containers. Such a GPU is
busy ("memory in use by processes not visible here") unless its ``memory.used`` is at most
512 MiB; a pid that is listed (the host's, not in this namespace) keeps it busy as before.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState
from gpulayerd.gpu.discovery import discover_host
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes import COMPUTE_APPS_ARGV, response
from tests.integration.components.test_cases_nvidia import FULL, config, cuda, fake_smi, load

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)


def _judge(tmp_path: Path, apps_stdout: str, stdout: str | None = None) -> tuple[list[object], object]:
    inp = load("bug-44")["input"]
    fake_smi(tmp_path, response(FULL, stdout if stdout is not None else inp["stdout"]),
             response(COMPUTE_APPS_ARGV, apps_stdout))
    devices = cuda(discover_host(config(tmp_path), SUPPORT_MATRIX))
    job = load("bug-44")["input"]["job"]
    req = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=job["gpu_count"],
                     gpu_memory_bytes=int(job["gpu_memory_gb"] * GB))
    worker = WorkerSnapshot("ws", devices=tuple(devices), environments=ENV)
    return devices, evaluate(req, worker, SUPPORT_MATRIX)


def test_bug44_no_process_listed_but_memory_used_is_busy(tmp_path: Path) -> None:
    devices, ev = _judge(tmp_path, load("bug-44")["input"]["compute_apps_stdout"])
    gpu0, gpu1 = devices
    assert (gpu0.memory_used_bytes, gpu0.processes_known, gpu0.foreign_pids) == (7325 * 2**20, True, ())
    assert gpu0.busy and gpu0.hidden_use and not gpu1.busy
    assert ev.placement is None and ev.state is FitState.FITS_BUT_BUSY  # both GPUs needed, GPU 0 in use
    assert [r.message for r in ev.rejections] == [
        "GPU 0 is in use: memory in use by processes not visible here "
        "(memory.used 7325 MiB, no process listed; free only at <= 512 MiB)"]


def test_bug44_variant_a_host_pid_listed_is_busy_as_before(tmp_path: Path) -> None:
    devices, ev = _judge(tmp_path, load("bug-44")["input"]["variant_host_pid"] + "\n")
    gpu0, _ = devices
    assert gpu0.foreign_pids == (2841907,) and gpu0.busy and not gpu0.hidden_use
    assert ev.placement is None and "pid 2841907" in ev.rejections[0].message


@pytest.mark.parametrize(("used_mib", "busy"), [(0, False), (512, False), (513, True), (80620, True)])
def test_kind_the_bound_is_512_mib_for_any_gpu(tmp_path: Path, used_mib: int, busy: bool) -> None:
    stdout = load("bug-44")["input"]["stdout"].replace(", 7325, ", f", {used_mib}, ")
    devices, _ = _judge(tmp_path, "", stdout)
    assert devices[0].busy is busy


def test_kind_unified_memory_parts_report_system_ram_and_are_not_busy_by_it() -> None:
    gb10 = DeviceSnapshot(Accelerator.CUDA, 0, "GPU-x", "NVIDIA GB10", 128 * GB, 60 * GB, MemoryKind.UNIFIED, (12, 1),
                          "580.95.05", True, True)
    assert not gb10.busy
    assert replace(gb10, memory_kind=MemoryKind.DEDICATED).busy
