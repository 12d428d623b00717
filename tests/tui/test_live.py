"""The app against a real gpulayerd (a subprocess on a temporary state dir, CPU only)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import time

import pytest

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.explanation import ExplanationView, RequirementTable
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.api.client import DaemonClient
from tests.tui.daemon import RealDaemon, clean_env, tool
from tests.tui.helpers import screen_text, wait_for

LIVE = TuiSettings(retry_s=0.2, log_poll_s=0.2, age_refresh_s=0)


def main_screen(app: GpulayerApp) -> MainScreen:
    return next(s for s in app.screen_stack if isinstance(s, MainScreen))


def table(app: GpulayerApp) -> JobsTable:
    return main_screen(app).query_one(JobsTable)


def connected(app: GpulayerApp) -> bool:
    return app.state.connection.state == "connected"


def spec(daemon: RealDaemon, *command: str, **extra: object) -> dict[str, object]:
    return {"command": list(command), "workdir": str(daemon.work), **extra}


@pytest.mark.asyncio
async def test_a_submitted_job_shows_up_within_a_second(real_daemon: RealDaemon) -> None:
    app = make_app(DaemonClient(real_daemon.socket_path), settings=LIVE)
    async with app.run_test(size=(120, 30)) as pilot, DaemonClient(real_daemon.socket_path) as client:
        await wait_for(pilot, lambda: connected(app), "the connection", timeout_s=10)
        job = await client.submit(spec(real_daemon, "true", name="tui-appears"), submitted_by="tester")
        took = await wait_for(pilot, lambda: job.id in table(app).shown_ids, "the new job's row", timeout_s=5)
        assert took < 1.0, f"the job showed up after {took:.2f} s"
        assert "tui-appears" in screen_text(app)
        # who the TUI runs as, from the kernel through health: this user, the admin of a personal daemon
        me = app.state.requester
        assert me is not None and (me.uid, me.user, me.admin) == (os.getuid(), pwd.getpwuid(os.getuid()).pw_name, True)


@pytest.mark.asyncio
async def test_a_waiting_jobs_detail_gives_the_reasons_of_gpulayer_explain(real_daemon: RealDaemon) -> None:
    app = make_app(DaemonClient(real_daemon.socket_path), settings=LIVE)
    async with app.run_test(size=(120, 40)) as pilot, DaemonClient(real_daemon.socket_path) as client:
        await wait_for(pilot, lambda: connected(app), "the connection", timeout_s=10)
        # 64 CUDA GPUs on one host: waits on this GPU-less machine (and on any other)
        job = await client.submit(spec(real_daemon, "true", name="needs-cuda",
                                       requirements={"accelerator": "cuda", "gpu_count": 64}))
        await wait_for(pilot, lambda: job.id in table(app).shown_ids, "the job's row")
        table(app).select_job(job.id)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail screen")
        view = app.screen.query_one(ExplanationView)
        await wait_for(pilot, lambda: view.explanation is not None, "the explanation", timeout_s=10)
        proc = await asyncio.create_subprocess_exec(
            tool("gpulayer"), "--state-dir", str(real_daemon.state_dir), "explain", job.id, "--json",
            env=clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        cli = json.loads(out)
        messages = [r["message"] for r in cli["rejections"]]
        messages += [r["message"] for w in cli["workers"] for r in w["rejections"]]
        assert messages, cli
        shown = screen_text(app)
        for message in messages:
            assert message in view.reasons_text
            assert message in shown
        checks = [[c["requirement"], c["wanted"], c["found"]] for w in cli["workers"] for c in w["checks"]]
        rows = view.query_one(RequirementTable).plain_rows()
        assert [r[2:] for r in rows] == checks
        assert f"verdict: {cli['verdict'].replace('_', ' ')}" in shown


@pytest.mark.asyncio
async def test_cancelling_from_the_tui_cancels_the_job(real_daemon: RealDaemon) -> None:
    app = make_app(DaemonClient(real_daemon.socket_path), settings=LIVE)
    async with app.run_test(size=(120, 30)) as pilot, DaemonClient(real_daemon.socket_path) as client:
        await wait_for(pilot, lambda: connected(app), "the connection", timeout_s=10)
        job = await client.submit(spec(real_daemon, "sleep", "100", name="sleeper"))
        await wait_for(pilot, lambda: job.id in table(app).shown_ids and table(app).cells(job.id).state == "running",
                       "the job running", timeout_s=15)
        table(app).select_job(job.id)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the confirmation")
        await pilot.press("y")
        end = time.monotonic() + 20
        while (await client.job(job.id)).status != "cancelled":
            assert time.monotonic() < end, f"not cancelled: {await client.job(job.id)}"
            await pilot.pause(0.1)
        await wait_for(pilot, lambda: table(app).cells(job.id).state == "cancelled", "the cancelled row")


@pytest.mark.asyncio
async def test_says_the_daemon_is_unreachable_and_recovers_when_it_restarts(real_daemon: RealDaemon) -> None:
    app = make_app(DaemonClient(real_daemon.socket_path), settings=LIVE)
    async with app.run_test(size=(120, 30)) as pilot, DaemonClient(real_daemon.socket_path) as client:
        await client.submit(spec(real_daemon, "true", name="before-restart"))  # (run first, the daemon has none)
        await wait_for(pilot, lambda: connected(app) and table(app).row_count > 0, "the connection", timeout_s=10)
        jobs_before = set(table(app).shown_ids)
        banner = main_screen(app).query_one(ConnectionBanner)
        assert not banner.display
        try:
            await asyncio.to_thread(real_daemon.stop)
            await wait_for(pilot, lambda: "daemon not reachable — retrying" in screen_text(app),
                           "the unreachable banner", timeout_s=5)
            assert banner.display and set(table(app).shown_ids) == jobs_before  # what was known stays
        finally:
            await asyncio.to_thread(real_daemon.start)  # same state dir
        await wait_for(pilot, lambda: connected(app), "the recovery", timeout_s=10)
        await wait_for(pilot, lambda: not banner.display, "the banner gone")
        assert "not reachable" not in screen_text(app)
        assert jobs_before <= set(table(app).shown_ids)
