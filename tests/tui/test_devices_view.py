"""The Devices view with live metrics, and the Environments view (fake daemon, pilot)."""

from __future__ import annotations

import pytest

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.devices_table import DevicesTable
from gpulayer_tui.widgets.environments_table import EnvironmentsTable
from gpulayer_tui.widgets.gpu_metrics import GpuMetricsPanel, sparkline
from gpulayerd.models.metrics import MetricsView
from tests.tui.fake_client import NOW, FakeDaemonClient, lab_metrics, make_job, make_peer
from tests.tui.helpers import screen_text, wait_for

FAST = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0, metrics_poll_s=0.05)


def lab(metrics: MetricsView | None = None) -> FakeDaemonClient:
    peers = [make_peer("lab-ws-02", state="self"), make_peer("dgx-spark"), make_peer("rocm-box"),
             make_peer("old-ws-07")]
    jobs = [make_job("j-4711", "running", name="sweep-lr-3e-4", owner="bob", holder_name="lab-ws-02")]
    return FakeDaemonClient(jobs=jobs, peers=peers, metrics=metrics or lab_metrics())


def main_screen(app: GpulayerApp) -> MainScreen:
    return next(s for s in app.screen_stack if isinstance(s, MainScreen))


def panel(app: GpulayerApp) -> GpuMetricsPanel:
    return main_screen(app).query_one(GpuMetricsPanel)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_devices_view_shows_live_metrics_processes_and_jobs_by_name(size: tuple[int, int]) -> None:
    fake = lab()
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.state.connection.state == "connected", "the first load")
        assert fake.count("metrics") == 0  # nobody looks at the devices: no metrics asked for
        await pilot.press("1")
        await wait_for(pilot, lambda: panel(app).polls >= 2, "two polls of the metrics")
        await pilot.pause()
        shown = screen_text(app)
        assert "GPU 0  87%" in shown
        assert "████████░░ 19.3/25.8 GB" in shown  # memory used/total (GB = 10^9 bytes) with its bar
        assert "71°C" in shown and "251/350 W" in shown
        assert "GPU 1   3%  █░░░░░░░░░ 2.1/25.8 GB  —  —/— W" in shown  # placeholders: dashes
        assert "job sweep-lr-3e-4 (bob)" in shown  # the gpulayer job by name and user
        assert "foreign pid 31337 (carol)" in shown  # a foreign process with its user
        assert sparkline([10, 40, 75, 90, 87, None, 87]).plain.strip() in shown
        rows = {(r[0], r[1]): r for r in main_screen(app).query_one(DevicesTable).plain_rows()}
        gpu0 = rows[("lab-ws-02", "0")]
        assert gpu0[3] == "87%"
        assert gpu0[5] == "sweep-lr-3e-4 (bob)"  # granted: the job's name and user, never its id
        assert rows[("lab-ws-02", "1")][5] == "busy (pid 31337)"
        if size[0] >= 120:  # every column fits, DRIVER and PROBE included
            assert "DRIVER" in shown and "PROBE" in shown and "550.54.15" in shown
        # leaving the view stops the polls (the daemon then stops sampling)
        await pilot.press("2")
        await pilot.pause()
        polls = fake.count("metrics")
        await pilot.pause(0.2)
        assert fake.count("metrics") == polls


@pytest.mark.asyncio
async def test_devices_view_without_metrics_says_so_once() -> None:
    fake = lab(MetricsView(available=False, message="no working nvidia-smi on this machine"))
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("1")
        await wait_for(pilot, lambda: panel(app).polls >= 1, "a poll")
        await pilot.pause()
        assert screen_text(app).count("no live GPU metrics here: no working nvidia-smi on this machine") == 1


@pytest.mark.asyncio
async def test_environments_view_lists_interpreters_frameworks_torch_backends_and_probe_health() -> None:
    fake = lab()
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.connection.state == "connected", "the first load")
        await pilot.press("4")
        table = main_screen(app).query_one(EnvironmentsTable)
        assert table.has_focus
        rows = {r[0]: r for r in table.plain_rows()}
        ws = rows["lab-ws-02"]
        assert ws[1:3] == ["…/conda/envs/train/bin/python", "3.10.14"]  # cut on the left: the end says most
        assert ws[3] == "torch 2.4.1+cu121, numpy 1.26…"  # torch first, cut to fit
        assert ws[4:7] == ["cuda", "gloo, nccl", "ok"]
        shown = screen_text(app)
        assert "lab-ws-02: nvidia-smi ok · rocm-smi not found" in shown
        assert "rocm-box: nvidia-smi not found · rocm-smi ok" in shown
        assert "PROBE" in shown  # every column fits at 120
        assert fake.count("metrics") == 0
