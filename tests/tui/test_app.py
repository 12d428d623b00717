"""The whole app through make_app(FakeDaemonClient): live changes, keys, cancel, disconnects, errors."""

from __future__ import annotations

import pytest
from rich.color import ColorSystem

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.devices_table import DevicesTable
from gpulayer_tui.widgets.explanation import ExplanationView
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.log_view import LogView
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job, make_peer, waiting_explanation
from tests.tui.helpers import screen_text, wait_for

FAST = TuiSettings(retry_s=0.05, log_poll_s=0.02, age_refresh_s=0)


def fake_lab() -> FakeDaemonClient:
    jobs = [
        make_job("m8aa00000001", "running", name="sweep-1", owner="bob", holder_name="lab-ws-02", reason="started",
                 requirements={"accelerator": "cuda"}),
        make_job("m8aa00000002", "queued", name="finetune", reason="fits nowhere we know: no worker has a CUDA GPU "
                 "with >= 40.0 GB dedicated memory", requirements={"accelerator": "cuda", "gpu_memory_gb": 40}),
        make_job("m8aa00000003", "succeeded", name="eval", owner="carol", reason="exited 0"),
    ]
    return FakeDaemonClient(jobs=jobs, peers=[make_peer("lab-ws-02", state="self"), make_peer("dgx-spark")],
                            explanations={"m8aa00000002": waiting_explanation("m8aa00000002")})


def main_screen(app: GpulayerApp) -> MainScreen:
    return next(s for s in app.screen_stack if isinstance(s, MainScreen))


def table(app: GpulayerApp) -> JobsTable:
    return main_screen(app).query_one(JobsTable)


def connected(app: GpulayerApp) -> bool:
    return app.state.connection.state == "connected"


@pytest.mark.asyncio
async def test_loads_everything_then_follows_changes_reading_only_changed_jobs() -> None:
    fake = fake_lab()
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the first load")
        assert fake.count("jobs") == 1 and fake.count("peers") == 1
        assert app.sub_title == "lab-ws-02 · gpulayerd 0.1.0"
        # a job change re-reads the changed jobs (by id), never the whole queue
        fake.put_job(make_job("m8aa00000004", "queued", name="new-one", age_s=0))
        await wait_for(pilot, lambda: "m8aa00000004" in table(app).shown_ids, "the new job's row")
        fake.put_job(make_job("m8aa00000002", "running", name="finetune", holder_name="dgx-spark",
                              reason="started"))
        await wait_for(pilot, lambda: table(app).cells("m8aa00000002").state == "running",
                       "the job's new state")
        assert fake.count("jobs") == 1
        assert ("jobs?ids", "m8aa00000004") in fake.calls and ("jobs?ids", "m8aa00000002") in fake.calls
        # devices changed: peers re-read; resync: everything re-read
        fake.push("devices")
        await wait_for(pilot, lambda: fake.count("peers") == 2, "peers re-read")
        fake.push("resync")
        await wait_for(pilot, lambda: fake.count("jobs") == 2, "a full re-read")
        assert "new-one" in screen_text(app)


@pytest.mark.asyncio
async def test_keys_switch_screens_filter_and_quit() -> None:
    fake = fake_lab()
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the first load")
        await wait_for(pilot, lambda: "Detail" in screen_text(app).splitlines()[-1], "the jobs table's keys")
        footer = screen_text(app).splitlines()[-1]
        for key in ("⏎ Detail", "c Cancel", "l Logs", "/ Filter", "1 Devices", "2 Jobs", "3 Peers", "q Quit",
                    "? Help"):
            assert key in footer, footer
        await pilot.press("d")
        assert main_screen(app).query_one("#devices-table").has_focus
        assert "130.7 GB unified (RAM)" in "".join(
            str(c) for row in main_screen(app).query_one(DevicesTable).plain_rows() for c in row)
        await pilot.press("p")
        assert main_screen(app).query_one("#peers-table").has_focus
        await pilot.press("2")
        await pilot.press("slash", *"carol")
        await wait_for(pilot, lambda: table(app).shown_ids == ["m8aa00000003"], "the filter")
        await pilot.press("enter")  # keep the filter, back to the table
        assert table(app).has_focus and table(app).filter_text == "carol"
        await pilot.press("escape")
        await wait_for(pilot, lambda: table(app).row_count == 3, "the filter cleared")
        await pilot.press("q")
        await pilot.pause()
    assert fake.closed == 1  # the app closes its client


@pytest.mark.asyncio
async def test_detail_of_a_waiting_job_shows_the_reasons_timeline_and_follows_the_log() -> None:
    fake = fake_lab()
    fake.logs_by_job[("m8aa00000001", "stdout")] = "step 1 loss 2.30\n"
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the first load")
        table(app).select_job("m8aa00000002")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail screen")
        view = app.screen.query_one(ExplanationView)
        await wait_for(pilot, lambda: view.explanation is not None, "the explanation")
        text = screen_text(app)
        for w in waiting_explanation("m8aa00000002").workers:
            for r in w.rejections:
                assert r.message in view.reasons_text
        assert "verdict: fits nowhere" in text and "INSUFFICIENT" not in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back to the jobs")
        # l opens the log of the running job, and the tail follows new output
        table(app).select_job("m8aa00000001")
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail screen")
        log = app.screen.query_one(LogView)
        await wait_for(pilot, lambda: log.shown_text == ["step 1 loss 2.30"], "the log")
        fake.logs_by_job[("m8aa00000001", "stdout")] += "step 2 loss 1.70\n"
        await wait_for(pilot, lambda: log.shown_text == ["step 1 loss 2.30", "step 2 loss 1.70"],
                       "the next log line")
        offsets = [int(c[3]) for c in fake.calls if c[:2] == ("logs", "m8aa00000001")]
        assert offsets[:2] == [0, 0] and 17 in offsets  # its size, its end, then on from where it was
        assert offsets.count(0) == 2
        # an error reply is shown, not raised: this job has no explanation in the fake
        await pilot.press("w")
        await wait_for(pilot, lambda: "cannot explain: internal error: probe failed" in screen_text(app),
                       "the error reply")


@pytest.mark.asyncio
async def test_cancel_asks_first_and_no_means_no() -> None:
    fake = fake_lab()
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the first load")
        table(app).select_job("m8aa00000001")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the confirmation")
        assert "Cancel job m8aa00000001 (sweep-1), running?" in screen_text(app)
        await pilot.press("n")
        await pilot.pause()
        assert fake.count("cancel") == 0 and isinstance(app.screen, MainScreen)
        await pilot.press("c", "y")
        await wait_for(pilot, lambda: fake.count("cancel") == 1, "the cancel call")
        await wait_for(pilot, lambda: table(app).cells("m8aa00000001").state == "cancelled",
                       "the cancelled state")


@pytest.mark.asyncio
async def test_says_when_the_daemon_is_unreachable_and_recovers() -> None:
    fake = fake_lab()
    fake.reachable = False
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        banner = main_screen(app).query_one(ConnectionBanner)
        await wait_for(pilot, lambda: app.state.connection.state == "unreachable", "the unreachable state")
        assert banner.display and "daemon not reachable — retrying" in screen_text(app)
        fake.come_back()
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the recovery")
        assert not banner.display and "not reachable" not in screen_text(app)
        fake.go_down()  # the stream breaks; retries fail until it is back
        await wait_for(pilot, lambda: "daemon not reachable" in screen_text(app), "the banner again")
        assert table(app).row_count == 3  # what was known stays on screen
        fake.come_back()
        await wait_for(pilot, lambda: connected(app), "the recovery")
        assert fake.open_streams == 1


@pytest.mark.asyncio
async def test_a_16_colour_terminal_gets_the_terminals_own_colours() -> None:
    app = make_app(fake_lab(), clock=lambda: NOW, settings=TuiSettings(age_refresh_s=0))
    app.console._color_system = ColorSystem.STANDARD
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: connected(app) and table(app).row_count == 3, "the first load")
        assert app.theme == "ansi-dark"
        await wait_for(pilot, lambda: "Detail" in screen_text(app), "the jobs table's keys")
        text = screen_text(app)
        for word in ("running", "queued", "succeeded", "⏎ Detail", "q Quit"):  # states are words, not colours
            assert word in text
