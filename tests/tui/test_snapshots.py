"""SVG snapshots at a fixed size and clock (TZ=UTC, no timers): Devices, Jobs, a waiting job's detail, the help.

Update after an intended change of the look with ``pytest tests/tui --snapshot-update`` and
review the SVGs under ``tests/tui/__snapshots__/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.widgets.explanation import ExplanationView
from gpulayer_tui.widgets.gpu_metrics import GpuMetricsPanel
from gpulayer_tui.widgets.jobs_table import JobsTable
from tests.tui.fake_client import NOW, FakeDaemonClient, lab_metrics, make_job, make_peer, waiting_explanation
from tests.tui.helpers import wait_for

SNAPSHOT = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0, theme="textual-dark")
SnapCompare = Callable[..., bool]


def lab_app() -> GpulayerApp:
    peers = [make_peer("lab-ws-02", state="self", addresses=("10.0.0.2",)), make_peer("dgx-spark"),
             make_peer("old-ws-07", state="suspect"), make_peer("mac-studio", trusted=False, state="foreign"),
             make_peer("rocm-box")]
    jobs = [
        make_job("m8nq0a1b2c3d", "running", name="sweep-lr-3e-4", owner="bob", holder_name="lab-ws-02",
                 age_s=4000, reason="started on lab-ws-02 GPU 0", requirements={"accelerator": "cuda"}),
        make_job("m8nq0a1b2c3e", "queued", name="llm-finetune", age_s=900,
                 reason="Memory: GPU 0 (NVIDIA GeForce RTX 3090) has 24.0 GB, the job needs 40.0 GB (on lab-ws-02)",
                 requirements={"accelerator": "cuda", "gpu_memory_gb": 40, "gpu_memory_kind": "dedicated",
                               "frameworks": {"torch": ">=2.4"}}),
        make_job("m8nq0a1b2c3f", "queued", name="eval-mps", owner="carol", age_s=300,
                 reason="Framework: torch 2.5.1 has no mps backend on lab-ws-02 in /opt/venvs/torch/bin/python",
                 requirements={"accelerator": "mps"}),
        make_job("m8nq0a1b2c3g", "succeeded", name="ddp-cpu", owner="alice", age_s=86000, reason="exited 0"),
        make_job("m8nq0a1b2c3h", "failed", name=None, owner="dave", age_s=200000, reason="exited 1"),
        make_job("m8nq0a1b2c3j", "cancelled", name="typo", owner="bob", age_s=45, reason="cancelled by the user"),
    ]
    fake = FakeDaemonClient(jobs=jobs, peers=peers, metrics=lab_metrics(),
                            explanations={"m8nq0a1b2c3e": waiting_explanation("m8nq0a1b2c3e")})
    return make_app(fake, clock=lambda: NOW, settings=SNAPSHOT)


async def loaded(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, GpulayerApp)
    await wait_for(pilot, lambda: app.state.connection.state == "connected"
                   and app.screen.query_one(JobsTable).row_count == 6, "the first load")


def test_devices_snapshot(snap_compare: SnapCompare) -> None:
    async def devices(pilot: Pilot[Any]) -> None:
        await loaded(pilot)
        await pilot.press("1")
        await wait_for(pilot, lambda: pilot.app.screen.query_one(GpuMetricsPanel).polls >= 1, "the live metrics")
        await pilot.pause()

    assert snap_compare(lab_app(), terminal_size=(120, 30), run_before=devices)


def test_jobs_snapshot(snap_compare: SnapCompare) -> None:
    assert snap_compare(lab_app(), press=["down"], terminal_size=(80, 24), run_before=loaded)


def test_jobs_snapshot_120x40(snap_compare: SnapCompare) -> None:
    assert snap_compare(lab_app(), press=["j", "j", "s"], terminal_size=(120, 40), run_before=loaded)


def test_waiting_job_detail_snapshot(snap_compare: SnapCompare) -> None:
    async def open_detail(pilot: Pilot[Any]) -> None:
        await loaded(pilot)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, JobDetailScreen)
                       and pilot.app.screen.query_one(ExplanationView).explanation is not None, "the explanation")

    assert snap_compare(lab_app(), terminal_size=(100, 30), run_before=open_detail)


def test_help_snapshot_80x24(snap_compare: SnapCompare) -> None:
    """``?`` on the Jobs view at 80x24: gpulayer's keys, grouped, all on screen."""
    assert snap_compare(lab_app(), press=["question_mark"], terminal_size=(80, 24), run_before=loaded)
