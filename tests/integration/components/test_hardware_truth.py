"""Issue 15, NVIDIA side: MIG instances, lost GPUs, unreadable process lists, re-probe before a grant.

Each test replays recorded nvidia-smi answers (tests/fakes/nvidia_recorded.py) through the fake
nvidia-smi, runs the real discovery, and matches jobs against what it found.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.cli.render import render_capabilities
from gpulayerd.core.launch import launch_env
from gpulayerd.core.matching.evaluate import evaluate, match
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceKind,
    DeviceState,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState, Placement, RejectionCode
from gpulayerd.gpu.command import decisive_line
from gpulayerd.gpu.compose import build_capabilities
from gpulayerd.gpu.discovery import DiscoveryConfig, HostInventory, discover_host
from gpulayerd.gpu.nvidia.mig import normalise_bus_id, parse_query
from gpulayerd.gpu.rocm import probe_rocm
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities
from tests.fakes import FakeTool, install_fake_tool
from tests.fakes.nvidia_recorded import (
    APPS_FAILED,
    H100_MIG,
    H100_WHOLE,
    LOST_AMONG_ROWS,
    MIG_BOX,
    MIG_UUIDS,
)

ENV = EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.9")


def probe(tmp_path: Path, answers: list[dict[str, Any]]) -> tuple[HostInventory, FakeTool]:
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", answers)
    config = DiscoveryConfig(path_env=str(tmp_path / "bin"), extra_search_dirs=(), rocm_search_dirs=(),
                             system="Linux", machine="x86_64", nvidia_smi_timeout_s=10.0)
    return discover_host(config, SUPPORT_MATRIX), fake


def worker_of(inv: HostInventory) -> tuple[Capabilities, WorkerSnapshot]:
    caps = build_capabilities(inv, [ENV], "w1", 0.0)
    return caps, caps.to_core()


def cuda_job(n: int = 1, gb: int | None = None) -> JobRequest:
    return JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=n,
                      gpu_memory_bytes=None if gb is None else gb * GB)


def health(inv: HostInventory) -> Any:
    (h,) = [h for h in inv.health if h.source == "nvidia-smi"]
    return h


# --------------------------------------------------------------------------- MIG


def test_mig_box_instances_are_devices_and_grants_follow_memory(tmp_path: Path) -> None:
    inv, fake = probe(tmp_path, MIG_BOX)
    assert health(inv).status is ProbeStatus.OK
    by_uuid = {d.uuid: d for d in inv.devices}
    parent, whole = by_uuid[H100_MIG], by_uuid[H100_WHOLE]
    assert (parent.mig_enabled, whole.mig_enabled) == (True, False)
    assert (parent.pci_bus_id, whole.pci_bus_id) == ("0000:19:00.0", "0000:3b:00.0")
    migs = {d.mig_profile: d for d in inv.devices if d.kind is DeviceKind.MIG}
    assert sorted(migs) == ["1g.10gb", "2g.20gb", "4g.40gb"]
    big = migs["4g.40gb"]
    assert (big.uuid, big.parent_uuid, big.memory_total_bytes, big.index) == (
        MIG_UUIDS["4g.40gb"], H100_MIG, 40192 * 2**20, 1000)
    assert migs["1g.10gb"].foreign_pids == (4242,)  # GPU instance 9 runs pid 4242
    assert migs["2g.20gb"].foreign_pids == () and migs["2g.20gb"].processes_known
    assert ["-L"] in fake.argvs() and ["-q", "-d", "MEMORY,PIDS"] in fake.argvs()

    _, worker = worker_of(inv)
    p30 = match(cuda_job(gb=30), worker, SUPPORT_MATRIX)
    assert isinstance(p30, Placement) and p30.device_uuids == (MIG_UUIDS["4g.40gb"],)
    env = launch_env(Accelerator.CUDA, p30.device_indices, "j", 1, p30.device_uuids)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG_UUIDS["4g.40gb"]
    p50 = match(cuda_job(gb=50), worker, SUPPORT_MATRIX)
    assert isinstance(p50, Placement) and p50.device_uuids == (H100_WHOLE,)
    assert launch_env(Accelerator.CUDA, p50.device_indices, "j", 1, p50.device_uuids)["CUDA_VISIBLE_DEVICES"] == "1"
    # The 1g.10gb is busy with pid 4242: a 5 GB job gets the 2g.20gb, never the parent.
    p5 = match(cuda_job(gb=5), worker, SUPPORT_MATRIX)
    assert isinstance(p5, Placement) and p5.device_uuids == (MIG_UUIDS["2g.20gb"],)

    two = evaluate(cuda_job(n=2), worker, SUPPORT_MATRIX)
    assert two.state is FitState.NO_FIT
    msgs = [r.message for r in two.rejections]
    assert any("MIG 4g.40gb" in m and "a process can use only one" in m for m in msgs)
    assert any("GPU 0 is in MIG mode" in m for m in msgs)
    assert any(r.code is RejectionCode.NOT_ENOUGH_DEVICES and "has 1" in r.message for r in two.rejections)


def test_mig_query_failure_leaves_instances_unknown_not_free(tmp_path: Path) -> None:
    answers = [a if a["argv"] != ["-q", "-d", "MEMORY,PIDS"] else
               {**a, "stdout": "Failed to initialize NVML: Unknown Error\n", "exit_code": 255} for a in MIG_BOX]
    inv, _ = probe(tmp_path, answers)
    migs = [d for d in inv.devices if d.kind is DeviceKind.MIG]
    assert len(migs) == 3 and all(not d.processes_known and d.busy for d in migs)
    assert {d.mig_profile: d.memory_total_bytes for d in migs}["4g.40gb"] == 40 * GB  # from the profile name
    _, worker = worker_of(inv)
    ev = evaluate(cuda_job(gb=30), worker, SUPPORT_MATRIX)
    # The 4g.40gb would fit best, but its processes are unknown: the whole H100 is granted instead.
    assert ev.state is FitState.FITS_NOW
    assert ev.placement is not None and ev.placement.device_uuids == (H100_WHOLE,)


def test_parse_query_reads_mig_blocks_and_processes() -> None:
    text = MIG_BOX[3]["stdout"]
    parsed = parse_query(text)
    assert sorted(parsed) == ["0000:19:00.0", "0000:3b:00.0"]
    gpu = parsed["0000:19:00.0"]
    assert {i: (m.gpu_instance, m.memory_total_mib, m.memory_used_mib) for i, m in gpu.migs.items()} == {
        0: (1, 40192, 12), 1: (5, 19968, 6), 2: (9, 9856, 512)}
    assert gpu.processes == [(9, 0, 4242)]
    assert parsed["0000:3b:00.0"].processes == []
    assert normalise_bus_id("GPU 00000000:3B:00.0") == "0000:3b:00.0"


# --------------------------------------------------------------------------- lost GPUs


def test_diagnostic_line_between_rows_is_a_lost_gpu_and_degraded_health(tmp_path: Path) -> None:
    inv, _ = probe(tmp_path, LOST_AMONG_ROWS)
    h = health(inv)
    assert h.status is ProbeStatus.DEGRADED
    assert h.message.startswith("2 GPU(s) ok, 1 not: Unable to determine the device handle for GPU 0000:41:00.0")
    states = [(d.index, d.state, d.pci_bus_id) for d in inv.devices]
    assert states == [(0, DeviceState.OK, "0000:07:00.0"), (1, DeviceState.LOST, "0000:41:00.0"),
                      (2, DeviceState.OK, "0000:c7:00.0")]
    caps, worker = worker_of(inv)
    three = evaluate(cuda_job(n=3), worker, SUPPORT_MATRIX)
    assert three.state is FitState.NO_FIT
    assert any("GPU 1 (0000:41:00.0) is lost" in r.message and "Unknown Error" in r.message
               for r in three.rejections)
    two = match(cuda_job(n=2), worker, SUPPORT_MATRIX)
    assert isinstance(two, Placement) and two.device_indices == (0, 2)
    # devices --json and the table show it
    data = json.loads(caps.model_dump_json())
    assert [d["state"] for d in data["devices"]] == ["ok", "lost", "ok"]
    assert data["health"][0]["status"] == "degraded"
    text = render_capabilities(caps)
    assert "lost: Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error" in text
    assert "degraded" in text


def test_devices_json_shows_mig(tmp_path: Path) -> None:
    inv, _ = probe(tmp_path, MIG_BOX)
    caps, _ = worker_of(inv)
    data = json.loads(caps.model_dump_json())
    kinds = [(d["kind"], d["mig_profile"], d["parent_uuid"]) for d in data["devices"]]
    assert ("mig", "4g.40gb", H100_MIG) in kinds and ("gpu", None, None) in kinds
    assert Capabilities.model_validate(data).to_core().devices == worker_of(inv)[1].devices
    text = render_capabilities(caps)
    row = next(line for line in text.splitlines() if line.startswith("  0 "))
    assert "no (MIG instances only)  MIG mode" in row, row  # SCHEDULED, STATE


# --------------------------------------------------------------------------- process lists


def test_failed_compute_apps_keeps_valid_rows_and_is_never_free_by_default(tmp_path: Path) -> None:
    inv, _ = probe(tmp_path, APPS_FAILED)
    a, b, c = inv.devices
    assert (a.foreign_pids, a.processes_known) == ((111,), True)
    assert (b.processes_known, b.busy) == (False, True)  # 2048 MiB used > 512 MiB
    assert (c.processes_known, c.busy) == (False, False)  # 3 MiB used: idle
    assert any("kept its 1 valid row(s)" in n and "Unable to determine the process list" in n for n in inv.notes)
    _, worker = worker_of(inv)
    one = match(cuda_job(), worker, SUPPORT_MATRIX)
    assert isinstance(one, Placement) and one.device_indices == (2,)
    two = evaluate(cuda_job(n=2), worker, SUPPORT_MATRIX)
    assert two.state is FitState.FITS_BUT_BUSY
    (why,) = [r for r in two.rejections if r.device == 1]
    assert why.message == ("GPU 1 may be in use: its process list could not be read and its memory.used is "
                           "2048 MiB (free only at <= 512 MiB)")


# --------------------------------------------------------------------------- decisive lines


def test_decisive_line_prefers_error_lines(tmp_path: Path) -> None:
    assert decisive_line(["WARNING: something", "", "ERROR: GPU[0] : failed"]) == "ERROR: GPU[0] : failed"
    assert decisive_line(["just words", "more"]) == "just words"
    assert decisive_line([]) == ""
    rocm = install_fake_tool(tmp_path / "bin", "rocm-smi", [{
        "argv": ["--showproductname", "--json"], "exit_code": 2,
        "stdout": "======= ROCm System Management Interface =======\nWARNING: no sysfs\nERROR: amdgpu driver not loaded\n",
        "stderr": ""}])
    from gpulayerd.gpu.command import run_command

    result = probe_rocm(str(rocm.path), run_command, 10.0, SUPPORT_MATRIX)
    assert result.health.message == "ERROR: amdgpu driver not loaded"


# --------------------------------------------------------------------------- re-probe before a grant


@pytest.mark.asyncio
async def test_gpu_vanishing_between_probes_is_not_granted(tmp_path: Path) -> None:
    from gpulayerd.app.worker.machine import REPROBE_AFTER_S
    from tests.fakes.daemons import W1, Lab, d

    lab = Lab(tmp_path)
    try:
        await lab.add("w1", W1)
        machine = d(lab, "w1").services.machine
        inv, _ = await asyncio.to_thread(probe, tmp_path / "first", LOST_AMONG_ROWS)
        caps = build_capabilities(inv, [], W1, lab.clock.wall())
        machine.use_capabilities(caps.model_copy(update={"environments": (await machine.capabilities()).environments}))
        # Now GPU 2 is gone: nvidia-smi lists only GPU 0 (and still cannot read 0000:41:00.0).
        gone = [dict(a) for a in LOST_AMONG_ROWS]
        gone[0]["stdout"] = "\n".join(gone[0]["stdout"].splitlines()[:2]) + "\n"
        later = await asyncio.to_thread(install_fake_tool, tmp_path / "later" / "bin", "nvidia-smi", gone)
        machine._discovery = DiscoveryConfig(path_env=str(later.path.parent), extra_search_dirs=(),
                                             rocm_search_dirs=(), system="Linux", machine="x86_64")
        machine._hw_at = lab.clock.monotonic()  # as if probed just now
        fresh = await machine.snapshot(refresh_apps=True)
        assert [dv.index for dv in fresh.devices if dv.state is DeviceState.OK] == [0, 2]  # not re-probed yet
        assert await asyncio.to_thread(later.argvs) == []
        lab.clock.advance(REPROBE_AFTER_S + 1)
        snap = await machine.snapshot(refresh_apps=True)
        assert (await asyncio.to_thread(later.argvs))[0][0].startswith("--query-gpu=")
        assert [dv.index for dv in snap.devices if dv.state is DeviceState.OK] == [0]
        assert isinstance(match(cuda_job(), snap, SUPPORT_MATRIX), Placement)
        ev = evaluate(cuda_job(n=2), snap, SUPPORT_MATRIX)
        assert ev.placement is None and ev.state is FitState.NO_FIT
    finally:
        await lab.close()
