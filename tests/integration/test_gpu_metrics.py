"""Live GPU metrics end to end: a real gpulayerd, the fake nvidia-smi streaming ``-lms``, the real TUI.

No metrics process runs while nobody watches; the TUI's Devices view then shows utilisation,
temperature, power, the gpulayer job on its GPU by name and user, and a foreign process
with its account.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess

import psutil

from gpulayer_tui.app import TuiSettings, make_app
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.gpu_metrics import GpuMetricsPanel
from gpulayerd.api.client import DaemonClient
from gpulayerd.gpu.metrics import metrics_argv
from tests.fakes import COMPUTE_APPS_ARGV, response
from tests.integration.conftest import FakeGpus, Lab
from tests.tui.helpers import screen_text, wait_for


def stream_metrics(fake: FakeGpus, apps: list[tuple[int, int]]) -> None:
    """Make the fake answer the sampler (utilisation, temperature, power every 100 ms) and list ``apps``."""
    path = fake.tool.path.with_name("nvidia-smi.json")
    scenario = json.loads(path.read_text(encoding="utf-8"))
    ticks = ["".join(f"{g.index}, {g.uuid}, {u + g.index}, 6{g.index}, 20{g.index}.50, 300.00, 1024, {g.memory_mib}\n"
                     for g in fake.gpus) for u in (40, 80)]
    stream = {**response(metrics_argv("x", 1000)[1:]), "loop_stdout": ticks, "loop_ms": 100}
    rows = "".join(f"{fake.uuid_of(i)}, {pid}, 2048\n" for i, pid in apps)
    scenario["responses"] = [r for r in scenario["responses"] if r["argv"] != COMPUTE_APPS_ARGV]
    scenario["responses"] += [response(COMPUTE_APPS_ARGV, rows), stream]
    tmp = path.with_name(".nvidia-smi.json.tmp")
    tmp.write_text(json.dumps(scenario), encoding="utf-8")
    os.replace(tmp, path)


def samplers(fake: FakeGpus, daemon_pid: int) -> tuple[int, list[int]]:
    """(sampler starts the fake logged, live sampler processes under the daemon)."""
    starts = sum(1 for argv in fake.tool.argvs() if "-lms" in argv)
    live = [p.pid for p in psutil.Process(daemon_pid).children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and "-lms" in p.cmdline()]
    return starts, live


def job_pid(job_id: str) -> int:
    for p in psutil.process_iter():
        try:
            if p.environ().get("GPULAYER_JOB_ID") == job_id and p.name() == "sleep":
                return p.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no process of job {job_id}")


def test_devices_view_shows_live_metrics_only_while_watched(lab: Lab) -> None:
    fake = lab.fake_gpus([24576, 24576])
    d = lab.daemon(fake=fake)
    assert d.proc is not None
    job_id = d.submit("--name", "metrics-job", "--accelerator", "cuda", "--", "sleep", "60")
    job = d.wait_status(job_id, {"running"})
    assert job.where_devices is not None
    (gpu,) = job.where_devices
    as_root = os.geteuid() == 0
    nobody = pwd.getpwnam("nobody")
    foreign = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL,
                               **({"user": nobody.pw_uid, "group": nobody.pw_gid} if as_root else {}))
    try:
        stream_metrics(fake, [(gpu, job_pid(job_id)), (1 - gpu, foreign.pid)])
        foreign_user = "nobody" if as_root else pwd.getpwuid(os.getuid()).pw_name
        # the daemon has run for seconds (start, probe, a job started) with no TUI: no sampler ever started
        assert samplers(fake, d.proc.pid) == (0, [])

        async def watch() -> str:
            app = make_app(DaemonClient(d.socket_path), settings=TuiSettings(retry_s=0.2, age_refresh_s=0,
                                                                           metrics_poll_s=0.2))
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_for(pilot, lambda: app.state.connection.state == "connected", "the connection", 10)
                await pilot.press("1")

                def shown() -> bool:
                    text = screen_text(app)
                    return "foreign pid" in text and "job metrics-job" in text and "°C" in text

                await wait_for(pilot, shown, "the live metrics with both processes", timeout_s=10)
                screen = next(s for s in app.screen_stack if isinstance(s, MainScreen))
                assert screen.query_one(GpuMetricsPanel).polls >= 2
                assert samplers(fake, d.proc.pid if d.proc else 0)[1]  # one sampler runs now, under the daemon
                return screen_text(app)

        text = asyncio.run(watch())
        user = pwd.getpwuid(os.getuid()).pw_name
        assert f"foreign pid {foreign.pid} ({foreign_user})" in text
        assert f"pid {job_pid(job_id)} job metrics-job ({user})" in text
        assert f"GPU {gpu} " in text and "°C" in text and "/300 W" in text
        assert "metrics-job" in text.split("GPU 0", 1)[0]  # the devices table names the granted job
        starts, _ = samplers(fake, d.proc.pid)
        assert starts == 1  # one long-lived process, not one per poll (its stop: tests/integration/components/test_gpu_metrics_sampler.py)
    finally:
        foreign.kill()
        foreign.wait()
        d.cli("cancel", job_id)
