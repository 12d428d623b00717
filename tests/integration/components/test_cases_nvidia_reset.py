"""GPUs that are listed but cannot take a job (bug-41's kind), replayed through the fake nvidia-smi
and the real probe (:func:`discover_host`), then judged by the matcher and shown as ``gpulayer
devices`` shows them.

After an Xid or GSP fault nvidia-smi still lists a GPU with its name, uuid and memory, while its
live fields read ``[GPU requires reset]``: the probe asks one live field (``pstate``) and the compute
mode in its second query, and any field reading a fault placeholder (``[GPU requires reset]``,
``[Unknown Error]``, ``[GPU is lost]``) makes the GPU ``unusable`` with the tool's words. Compute
mode ``Prohibited`` is unusable too; ``Exclusive_Process`` takes one process at a time. ``[N/A]``
and ``[Not Supported]`` stay unknown, never a fault.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayerd.cli.render import render_capabilities
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceState,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState
from gpulayerd.gpu.discovery import discover_host
from gpulayerd.gpu.nvidia.parse import fault_placeholder
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, DeviceModel
from tests.fakes import COMPUTE_APPS_ARGV, MIG_MODE_ARGV, response
from tests.integration.components.test_cases_nvidia import FULL, config, cuda, fake_smi, load, nvidia_health

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
CASE = load("bug-41")["input"]
UUID0, UUID1 = "GPU-00000000-0000-4000-8000-000000000001", "GPU-00000000-0000-4000-8000-000000000002"


def _state_rows(pstate0: str = "P0", mode0: str = "Default", mode1: str = "Default") -> str:
    return (f"0, {UUID0}, 00000000:23:00.0, Disabled, {mode0}, {pstate0}\n"
            f"1, {UUID1}, 00000000:A4:00.0, Disabled, {mode1}, P0\n")


def _probe(tmp_path: Path, stdout: str, state: str | None, apps: str) -> object:
    answers = [response(FULL, stdout), response(COMPUTE_APPS_ARGV, apps)]
    if state is not None:
        answers.insert(1, response(MIG_MODE_ARGV, state))
    fake_smi(tmp_path, *answers)
    return discover_host(config(tmp_path), SUPPORT_MATRIX)


def _judge(devices: list[object], gpu_memory_gb: float = 40) -> object:
    req = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=int(gpu_memory_gb * GB))
    return evaluate(req, WorkerSnapshot("node1", devices=tuple(devices), environments=ENV), SUPPORT_MATRIX)  # type: ignore[arg-type]


def _table(devices: list[object]) -> str:
    caps = Capabilities(node_id="n" * 16, hostname="node1", devices=[DeviceModel.from_core(d) for d in devices])  # type: ignore[arg-type]
    return render_capabilities(caps, wide=True)


def test_bug41_live_field_requires_reset_makes_the_gpu_unusable_and_the_job_waits(tmp_path: Path) -> None:
    inv = _probe(tmp_path, CASE["stdout"], _state_rows(pstate0=CASE["live_fields_gpu0"]["pstate"]),
                 CASE["compute_apps_stdout"])
    gpu0, gpu1 = cuda(inv)  # type: ignore[arg-type]
    assert (gpu0.state, gpu0.state_reason) == (DeviceState.UNUSABLE, "GPU requires reset (pstate)")
    assert gpu0.uuid == UUID0 and gpu0.memory_total_bytes == 81559 * 2**20  # identity still read
    assert gpu1.state is DeviceState.OK and gpu1.foreign_pids == (48213,)
    health = nvidia_health(inv)  # type: ignore[arg-type]
    assert health.status is ProbeStatus.DEGRADED
    assert health.message.startswith("1 GPU(s) ok, 1 not: GPU 0: GPU requires reset (pstate)"), health.message
    ev = _judge(cuda(inv))  # type: ignore[arg-type]
    assert ev.placement is None and ev.state is not FitState.FITS_NOW  # type: ignore[attr-defined]
    messages = " | ".join(r.message for r in ev.rejections)  # type: ignore[attr-defined]
    assert "GPU 0 is unusable: nvidia-smi reads 'GPU requires reset (pstate)'" in messages, messages
    assert "GPU 1 is busy with processes gpulayer did not start (pid 48213)" in messages, messages
    table = _table(cuda(inv))  # type: ignore[arg-type]
    assert "unusable: GPU requires reset (pstate)" in table and "no (unusable)" in table, table


def test_bug41_variant_every_field_reads_the_fault_even_without_the_second_query(tmp_path: Path) -> None:
    """The recorded variant: memory.used and compute_cap read [GPU requires reset] in the main query;
    the second query fails (an old tool), and the GPU is still unusable."""
    stdout = CASE["variant_all_fields"] + "\n" + CASE["stdout"].splitlines()[1] + "\n"
    inv = _probe(tmp_path, stdout, None, CASE["compute_apps_stdout"])
    gpu0, gpu1 = cuda(inv)  # type: ignore[arg-type]
    assert gpu0.state is DeviceState.UNUSABLE
    assert gpu0.state_reason == "GPU requires reset (memory.used, compute_cap)"
    assert gpu0.memory_used_bytes is None and gpu0.compute_capability is None
    assert gpu1.state is DeviceState.OK
    assert _judge(cuda(inv)).placement is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "words"), [
    ("[GPU requires reset]", "GPU requires reset"), ("[Unknown Error]", "Unknown Error"),
    ("[GPU is lost]", "GPU is lost"), ("[N/A]", None), ("[Not Supported]", None),
    ("[Insufficient Permissions]", None), ("P0", None), ("", None)])
def test_kind_which_placeholders_are_faults(text: str, words: str | None) -> None:
    assert fault_placeholder(text) == words


@pytest.mark.parametrize("pstate", ["[N/A]", "[Not Supported]", "P8"])
def test_kind_unknown_live_fields_are_not_faults_and_the_gpu_is_granted(tmp_path: Path, pstate: str) -> None:
    inv = _probe(tmp_path, CASE["stdout"], _state_rows(pstate0=pstate), "No running processes found\n")
    gpu0, _ = cuda(inv)  # type: ignore[arg-type]
    assert gpu0.state is DeviceState.OK and nvidia_health(inv).status is ProbeStatus.OK  # type: ignore[arg-type]
    assert _judge(cuda(inv)).placement is not None  # type: ignore[attr-defined]


def test_kind_compute_mode_prohibited_is_never_granted(tmp_path: Path) -> None:
    inv = _probe(tmp_path, CASE["stdout"].replace(", 80620, ", ", 2, "), _state_rows(mode0="Prohibited"),
                 "No running processes found\n")
    gpu0, gpu1 = cuda(inv)  # type: ignore[arg-type]
    assert (gpu0.state, gpu0.state_reason, gpu0.compute_mode) == (
        DeviceState.UNUSABLE, "compute mode Prohibited", "Prohibited")
    assert nvidia_health(inv).status is ProbeStatus.OK  # a setting, not a fault  # type: ignore[arg-type]
    ev = _judge([gpu0])
    assert ev.placement is None  # type: ignore[attr-defined]
    assert "GPU 0 is in compute mode Prohibited: no CUDA process may use it" in ev.rejections[0].message  # type: ignore[attr-defined]
    placed = _judge([gpu0, gpu1]).placement  # type: ignore[attr-defined]
    assert placed is not None and placed.device_indices == (1,)


def test_kind_exclusive_process_is_busy_while_any_process_uses_it(tmp_path: Path) -> None:
    apps = f"{UUID0}, 777, 90\n"  # a small foreign process: in Exclusive_Process it takes the whole GPU
    inv = _probe(tmp_path, CASE["stdout"].replace(", 80620, ", ", 2, "),
                 _state_rows(mode0="Exclusive Process", mode1="Exclusive_Process"), apps)
    gpu0, gpu1 = cuda(inv)  # type: ignore[arg-type]
    assert gpu0.compute_mode == gpu1.compute_mode == "Exclusive_Process"  # old tools print a space
    assert gpu0.busy and not gpu1.busy
    ev = _judge([gpu0])
    assert "compute mode Exclusive_Process, so a second process would get 'all CUDA-capable devices are busy" \
        in ev.rejections[0].message  # type: ignore[attr-defined]
    assert _judge([gpu0, gpu1]).placement.device_indices == (1,)  # type: ignore[attr-defined]
    table = _table([gpu0, gpu1])
    assert "[Exclusive_Process: one process at a time]" in table, table


def test_kind_exclusive_process_with_an_unknown_process_list_is_busy_at_any_memory(tmp_path: Path) -> None:
    from dataclasses import replace

    inv = _probe(tmp_path, CASE["stdout"].replace(", 80620, ", ", 2, "), _state_rows(mode1="Exclusive_Process"),
                 "No running processes found\n")
    _, gpu1 = cuda(inv)  # type: ignore[arg-type]
    unknown = replace(gpu1, processes_known=False)
    assert unknown.busy and not replace(unknown, compute_mode="Default").busy


def test_kind_a_tool_rejecting_mig_mode_still_answers_the_live_field(tmp_path: Path) -> None:
    """A driver before MIG (R450) rejects mig.mode.current: the second query is asked again without it,
    so a GPU needing a reset is still found."""
    fields = "index,uuid,pci.bus_id,compute_mode,pstate"
    fake_smi(tmp_path, response(FULL, CASE["stdout"]),
             response(MIG_MODE_ARGV, 'Field "mig.mode.current" is not a valid field to query.\n', exit_code=2),
             response([f"--query-gpu={fields}", MIG_MODE_ARGV[1]],
                      f"0, {UUID0}, 00000000:23:00.0, Default, [GPU requires reset]\n"
                      f"1, {UUID1}, 00000000:A4:00.0, Default, P0\n"),
             response(COMPUTE_APPS_ARGV, CASE["compute_apps_stdout"]))
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    gpu0, gpu1 = cuda(inv)
    assert gpu0.state is DeviceState.UNUSABLE and gpu1.pci_bus_id == "0000:a4:00.0"
    assert any("rejected --query-gpu field(s) mig.mode.current" in n for n in inv.notes), inv.notes
