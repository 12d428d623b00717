"""The Devices view with live metrics (MIG instances, a lost GPU, CPU slots), and the Environments view (fake
daemon, pilot)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.devices_table import DevicesTable, mig_names, probe_summary, probe_texts
from gpulayer_tui.widgets.environments_table import EnvironmentsTable
from gpulayer_tui.widgets.gpu_metrics import GpuCard, GpuMetricsPanel, sparkline
from gpulayer_tui.widgets.job_rows import job_cells
from gpulayer_tui.widgets.peers_table import peer_rows
from gpulayerd.core.types import ProbeStatus
from gpulayerd.models import Capabilities, PeerView, ProbeHealthModel
from gpulayerd.models.metrics import GpuMetricsView, GpuProcessView, MetricsView
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


GPU_BOX = Path(__file__).resolve().parents[1] / "data" / "gpu-box.json"
"""2x RTX A6000, an RTX 4090 with a foreign process, GPU 3 lost, an A100 (GPU 4) with 3 MIG instances, the
3g.40gb one (5000) granted to job m8rs7eysv02m; 8 CPU slots, 4 free (tests.fakes.nvidia_recorded.lab_box)."""
HOLDER = "m8rs7eysv02m"


def gpu_box() -> PeerView:
    caps = Capabilities.model_validate_json(GPU_BOX.read_bytes())
    return PeerView(node_id=caps.node_id, name=caps.hostname, addresses=["10.0.0.5"], port=7443, version="0.1.0",
                    cluster="lab", trusted=True, state="self", last_heartbeat_at=NOW, capabilities=caps)


def gpu_box_metrics(peer: PeerView) -> MetricsView:
    """A sample of every GPU, GPU 3's a stale one from before it was lost (the sampler keeps it)."""
    assert peer.capabilities is not None
    gpus = [GpuMetricsView(index=d.index, uuid=d.uuid or "GPU-was-3", utilization_pct=0, temperature_c=34,
                           memory_used_bytes=0, memory_total_bytes=d.memory_total_bytes or 48 * 10**9,
                           granted_to=HOLDER if d.index == 3 else None, granted_name="resnet50-imagenet",
                           processes=[GpuProcessView(pid=999, user="carol")] if d.index == 2 else [])
            for d in peer.capabilities.devices if d.kind.value == "gpu"]
    return MetricsView(available=True, sampling=True, taken_at=NOW, gpus=gpus)


@pytest.mark.asyncio
async def test_gpu_box_at_80x24_mig_by_profile_lost_in_words_cpu_slots_no_sideways_scroll() -> None:
    peer = gpu_box()
    fake = FakeDaemonClient(jobs=[make_job(HOLDER, "running", name="resnet50", owner="alice", holder_name="gpu-box")],
                            peers=[peer, make_peer("lab-ws-02")], metrics=gpu_box_metrics(peer), hostname="gpu-box")
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.connection.state == "connected", "the first load")
        await pilot.press("1")
        await wait_for(pilot, lambda: panel(app).polls >= 1, "a poll of the metrics")
        await pilot.pause()
        table = main_screen(app).query_one(DevicesTable)
        assert table.hidden_columns == ["accelerator", "cc", "driver", "probe"]  # in the line under the table
        assert table.virtual_size.width <= table.scrollable_content_region.width  # no sideways scrolling
        rows = {r[1]: r for r in table.plain_rows() if r[0] == "gpu-box"}
        assert list(rows) == ["0", "1", "2", "3", "4", "5000", "5001", "5002", "—"]  # instances under their GPU
        assert rows["5000"][2] == "cuda/mig" and rows["5000"][6] == "MIG 3g.40gb on GPU 4"
        assert rows["5000"][5] == "resnet50 (alice)"  # the holder by name and user, as the CLI says
        assert rows["3"][3] == "—" and rows["3"][6] == "GPU at 0000:41:00.0"  # a stale sample is no reading
        assert rows["3"][5] == "lost: Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error"
        assert rows["4"][5] == "MIG mode" and rows["2"][5] == "busy (pid 999)"
        assert rows["—"][2] == "cpu" and rows["—"][5] == "8 slots (4 free)" and rows["—"][6] == "32 cores"
        assert "probe" not in rows["0"][9] and rows["0"][9].endswith("GPU 3 lost")
        table.move_cursor(row=table.get_row_index(f"{peer.node_id}:5000"))
        await pilot.pause()
        detail = str(main_screen(app).query_one("#devices-detail", Static).render())
        assert "gpu-box cuda/mig 5000: MIG 3g.40gb on GPU 4 · 0.0/42.1 GB dedicated" in detail
        assert "cc 8.0 · driver 550.54.15" in detail  # the columns that gave way
        assert "gpu-box: 32 CPUs, 8 slots (4 free), 256.0 GB RAM; probes: nvidia-smi degraded" in detail
        # the live panel: the lost GPU greyed in nvidia-smi's words, the MIG instances under GPU 4
        cards = [str(c.render()) for c in panel(app).query(GpuCard)]
        assert [c.split("  ")[0].split(" ")[:2] for c in cards] == [["GPU", "0"], ["GPU", "1"], ["GPU", "2"],
                                                                    ["GPU", "3"], ["GPU", "4"]]
        assert cards[3] == ("GPU 3 at 0000:41:00.0 lost: Unable to determine the device handle for GPU "
                            "0000:41:00.0: Unknown Error — no live readings")
        assert "MIG 3g.40gb  ░░░░░░░░░░ 0.0/42.1 GB  granted to resnet50 (alice)" in cards[4]
        assert "MIG 1g.10gb  ░░░░░░░░░░ 0.0/10.3 GB  free" in cards[4]


def test_probe_words_never_say_ok_while_a_gpu_is_lost_and_peers_count_a_mig_gpu_once() -> None:
    peer = gpu_box()
    assert peer.capabilities is not None
    peer.capabilities.health[0].status = ProbeStatus.OK  # a GPU lost after the last full probe
    assert probe_texts(peer.capabilities)[0] == "nvidia-smi: GPU 3 lost"
    assert probe_summary(peer.capabilities) == "GPU 3 lost"
    (row,) = peer_rows([peer], NOW).values()
    assert row[8] == ("1x NVIDIA A100 80GB PCIe, 1x NVIDIA GeForce RTX 4090, 2x NVIDIA RTX A6000, "
                      "CPU 8 slots (4 free)")
    job = make_job("j1", "running", holder_name="gpu-box").model_copy(
        update={"where_node": peer.node_id, "where_name": "gpu-box", "where_devices": [5000]})
    assert job_cells(job, NOW, mig_names([peer])).where == "gpu-box MIG 3g.40gb on GPU 4"  # not "GPU 5000"
    assert job_cells(job, NOW).where == "gpu-box GPU 5000"


def slurm_login(down: str | None) -> PeerView:
    """lab-ws-01's report as a Slurm cluster's worker (partitions, GRES; Slurm's words, hostile, when down)."""
    peer = make_peer("lab-ws-01")
    assert peer.capabilities is not None
    health = [*peer.capabilities.health, *([ProbeHealthModel(source="slurm", status=ProbeStatus.ERROR, message=down)]
                                           if down is not None else [])]
    caps = peer.capabilities.model_copy(update={
        "kind": "slurm", "slurm_partitions": ["gpu", "debug\x1b[2J"], "slurm_gres": ["node07: gpu:a100:4\x07"],
        "health": health})
    return peer.model_copy(update={"name": "login1", "capabilities": caps})


@pytest.mark.asyncio
async def test_a_slurm_worker_shows_kind_slurm_with_its_partitions_and_degraded_in_slurms_words() -> None:
    login = slurm_login("sinfo: Unable to contact slurm controller\x1b]0;pwned\x07")
    fake = FakeDaemonClient(peers=[make_peer("lab-ws-02", state="self"), login], metrics=lab_metrics())
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_for(pilot, lambda: app.state.connection.state == "connected", "the first load")
        await pilot.press("1")
        await pilot.pause()
        table = main_screen(app).query_one(DevicesTable)
        rows = [r for r in table.plain_rows() if r[0] == "login1"]
        assert rows[0][2] == "slurm" and rows[0][5] == "DEGRADED (no new claims)", rows  # first, before its GPUs
        assert rows[0][6] == ("slurm: partitions gpu, debug\\x1b[2J · GRES node07: gpu:a100:4\\x07 · sinfo: Unable "
                              "to contact slurm controller\\x1b]0;pwned\\x07"), rows  # peers' words, escaped
        table.move_cursor(row=table.get_row_index(f"{login.node_id}:slurm"))
        await pilot.pause()
        detail = str(main_screen(app).query_one("#devices-detail", Static).render())
        assert "login1 slurm: slurm: partitions gpu, debug\\x1b[2J" in detail and "\x1b" not in detail, detail
    shown = {r[0]: r[8] for r in peer_rows([login, slurm_login(None)], NOW).values()}
    assert shown["login1"].startswith("slurm: partitions gpu, debug\\x1b[2J; "), shown  # up again: no DEGRADED
    degraded = peer_rows([login], NOW)[login.node_id][8]
    assert isinstance(degraded, str) and degraded.startswith("slurm: partitions gpu, debug\\x1b[2J DEGRADED; ")
    assert "\x1b" not in degraded and "\x07" not in degraded
