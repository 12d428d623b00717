"""Live GPU metrics: parsing nvidia-smi's sample and compute-app lines, and sampling only while watched.

The sampler tests run the fake nvidia-smi (tests/fakes/bin) as a real long-lived ``-lms``
process; the watch lease runs on a FakeClock.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from gpulayerd.app.worker.metrics import JobLabel, MetricsService
from gpulayerd.gpu.metrics import (
    METRICS_FIELDS,
    ComputeApp,
    GpuSample,
    metrics_argv,
    parse_compute_app_rows,
    parse_sample_line,
    pid_user,
)
from gpulayerd.gpu.nvidia.parse import MIB
from tests.fakes import COMPUTE_APPS_ARGV, FakeTool, install_fake_tool, response
from tests.fakes.clock import FakeClock

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"


def test_sample_lines_parse_with_placeholders_as_none() -> None:
    line = f"0, {UUID0}, 87, 71, 251.30, 350.00, 18432, 24576\n"
    assert parse_sample_line(line) == GpuSample(0, UUID0, 87.0, 71.0, 251.3, 350.0, 18432 * MIB, 24576 * MIB)
    odd = parse_sample_line(f"1, {UUID1}, [N/A], [Not Supported], [N/A], [Unknown Error], 10, 24576")
    assert odd == GpuSample(1, UUID1, None, None, None, None, 10 * MIB, 24576 * MIB)
    assert parse_sample_line("No devices were found") is None
    assert parse_sample_line(", ".join(METRICS_FIELDS)) is None  # a header line
    assert parse_sample_line(f"x, {UUID0}, 1, 2, 3, 4, 5, 6") is None  # no index: not a GPU


def test_a_degraded_nvidia_smi_still_samples_the_gpus_that_answer() -> None:
    from gpulayerd.app.worker.metrics import nvidia_path
    from gpulayerd.models import Capabilities

    box = Capabilities.model_validate_json((Path(__file__).resolve().parents[2] / "data" / "gpu-box.json").read_bytes())
    assert box.health[0].status.value == "degraded"  # a GPU is lost, the other four answer
    assert nvidia_path(box) == "/usr/bin/nvidia-smi"
    assert parse_sample_line("Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error") is None
    box.health[0].status = box.health[0].status.__class__("driver_unavailable")
    assert nvidia_path(box) is None


def test_compute_app_rows_keep_pid_and_memory() -> None:
    out = f"{UUID0}, 4242, 17408\n{UUID1}, 999, [N/A]\n{UUID1}, notapid, 5\n"
    assert parse_compute_app_rows(out) == (ComputeApp(UUID0, 4242, 17408 * MIB), ComputeApp(UUID1, 999, None))
    assert parse_compute_app_rows("No running processes found\n") == ()


def test_pid_user_names_the_account_of_another_uid() -> None:
    assert pid_user(os.getpid()) == pwd.getpwuid(os.getuid()).pw_name
    # tests run as root (CI too): starting a process as another uid needs it
    other = pwd.getpwnam("nobody")
    proc = subprocess.Popen(["sleep", "30"], user=other.pw_uid,
                            group=other.pw_gid, stdin=subprocess.DEVNULL)
    try:
        assert pid_user(proc.pid) == "nobody"
    finally:
        proc.kill()
        proc.wait()
    assert pid_user(proc.pid) is None  # gone


# --------------------------------------------------------------------------- the service


def install_sampler(tmp_path: Path) -> FakeTool:
    """A fake nvidia-smi streaming two GPUs every 20 ms; compute apps: a job's pid and a foreign pid."""
    ticks = [f"0, {UUID0}, {u}, 70, 250.00, 350.00, 1024, 24576\n1, {UUID1}, [N/A], [N/A], [N/A], [N/A], 0, 24576\n"
             for u in (10, 50, 90)]
    stream = {**response(metrics_argv("x", 20)[1:]), "loop_stdout": ticks, "loop_ms": 20}
    apps = response(COMPUTE_APPS_ARGV, f"{UUID0}, 4242, 1000\n{UUID1}, 999, 500\n")
    return install_fake_tool(tmp_path / "bin", "nvidia-smi", [stream, apps])


class Jobs:
    async def grants(self) -> dict[str, JobLabel]:
        return {UUID0: JobLabel("j-1", "sweep", "alice")}

    async def run_pids(self) -> dict[int, JobLabel]:
        return {4242: JobLabel("j-1", "sweep", "alice")}


def sampler_starts(tool: FakeTool) -> int:
    return sum(1 for argv in tool.argvs() if "-lms" in argv)


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait for a real subprocess to get somewhere (no timing is asserted)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def service(clock: FakeClock, path: str | None) -> MetricsService:
    async def locate() -> str | None:
        return path

    return MetricsService(clock=clock, locate=locate, jobs=Jobs(), interval_ms=20, grace_s=5.0,
                          user_of={999: "bob"}.get)


@pytest.mark.asyncio
async def test_sampler_runs_only_while_watched_and_names_processes(tmp_path: Path) -> None:
    tool = install_sampler(tmp_path)
    clock = FakeClock()
    metrics = service(clock, str(tool.path))
    await asyncio.sleep(0)
    assert sampler_starts(tool) == 0 and not metrics.sampling  # nobody watches: nothing runs
    first = await metrics.view()
    assert first.available and first.gpus == []
    await until(lambda: len(metrics.latest()) == 2 and any(
        s.utilization_pct == 90 for s in metrics.latest().values()), "samples of both GPUs")
    await until(lambda: bool(metrics._procs), "the compute apps")
    pid = metrics.sampler_pid
    assert pid is not None and psutil.Process(pid).is_running()
    view = await metrics.view()
    loop = asyncio.get_running_loop()
    end = loop.time() + 10.0
    while view.gpus[0].utilization_pct != 90 and loop.time() < end:  # (the fake loops 10, 50, 90 every 20 ms)
        await asyncio.sleep(0.005)
        view = await metrics.view()
    gpu0, gpu1 = view.gpus
    assert (gpu0.utilization_pct, gpu0.temperature_c, gpu0.power_draw_w, gpu0.power_limit_w) == (90, 70, 250, 350)
    assert (gpu0.memory_used_bytes, gpu0.memory_total_bytes) == (1024 * MIB, 24576 * MIB)
    assert (gpu1.utilization_pct, gpu1.temperature_c, gpu1.power_draw_w) == (None, None, None)
    assert 10 in gpu0.utilization_history and 50 in gpu0.utilization_history
    assert (gpu0.granted_to, gpu0.granted_name, gpu0.granted_user) == ("j-1", "sweep", "alice")
    (job,) = gpu0.processes
    assert (job.pid, job.job_name, job.job_user) == (4242, "sweep", "alice")
    (foreign,) = gpu1.processes
    assert (foreign.pid, foreign.user, foreign.job_id, foreign.used_memory_bytes) == (999, "bob", None, 500 * MIB)
    # watched again within the grace: the same process goes on
    clock.advance(3)
    await metrics.view()
    clock.advance(3)
    await asyncio.sleep(0.05)
    assert metrics.sampling and metrics.sampler_pid == pid
    # nobody watches for longer than the grace: the process is killed, nothing restarts it
    clock.advance(6)
    await until(lambda: not metrics.sampling, "the sampler to stop")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert sampler_starts(tool) == 1
    assert metrics.latest()[0].utilization_pct is not None  # the last sample stays readable
    await metrics.close()


@pytest.mark.asyncio
async def test_without_nvidia_smi_no_process_and_one_quiet_answer(tmp_path: Path) -> None:
    clock = FakeClock()
    asked: list[int] = []

    async def locate() -> str | None:
        asked.append(1)
        return None

    metrics = MetricsService(clock=clock, locate=locate, jobs=Jobs(), retry_s=60.0)
    metrics.watch()
    await until(lambda: not metrics.sampling, "the sampler to give up")
    view = await metrics.view()
    assert (view.available, view.message, view.gpus) == (False, "no working nvidia-smi on this machine", [])
    assert asked == [1]  # not looked for again on every poll
    clock.advance(61)
    await metrics.view()
    await until(lambda: not metrics.sampling, "the second try")
    assert asked == [1, 1]
    await metrics.close()
