"""Keys a k9s/htop user tries, and what the TUI tells instead of failing: g/G, ctrl+f/b/d/u in every
table and pane; q and esc close the screen shown (q quits only on the main screen); the help lists
the view shown; an unknown filter key is named in the filter line; cancel is offered only on the
jobs the user may cancel (health says who the TUI runs as)."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, TabbedContent

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.paging import PagedScroll
from gpulayerd.models import ExplanationModel, JobView, RequesterView
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job, make_peer, waiting_explanation
from tests.tui.helpers import screen_text, wait_for

FAST = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0)
ALICE = RequesterView(uid=1001, user="alice", admin=False)


def many_jobs(n: int) -> list[JobView]:
    return [make_job(f"m8pp{i:08d}", "queued", name=f"job-{i}", owner="bob" if i % 3 else "alice",
                     reason="Resources: cpu slots 0 free of 4", age_s=10_000 - i) for i in range(n)]


def long_explanation(job_id: str) -> ExplanationModel:
    """Why a job waits, judged on six workers: taller than an 80x24 screen."""
    ex = waiting_explanation(job_id)
    workers = [w.model_copy(update={"worker": f"{i}" * 52, "name": f"lab-ws-{i:02d}"})
               for i in range(3) for w in ex.workers]
    return ex.model_copy(update={"workers": workers})


def main_screen(app: GpulayerApp) -> MainScreen:
    return next(s for s in app.screen_stack if isinstance(s, MainScreen))


def notes(app: GpulayerApp) -> list[str]:
    """The notifications shown, oldest first."""
    return [n.message for n in app._notifications]


async def loaded(pilot: Pilot[None], app: GpulayerApp, rows: int) -> JobsTable:
    table = app.screen.query_one(JobsTable)
    await wait_for(pilot, lambda: app.state.connection.state == "connected" and table.row_count == rows,
                   "the first load")
    return table


@pytest.mark.asyncio
async def test_paging_keys_close_keys_help_of_the_view_and_filter_typos() -> None:
    fake = FakeDaemonClient(jobs=many_jobs(60), peers=[make_peer("lab-ws-02", state="self"), make_peer("dgx-spark"),
                                                        make_peer("rocm-box")],
                            explanations={"m8pp00000001": long_explanation("m8pp00000001")})
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await loaded(pilot, app, 60)
        page = table.scrollable_content_region.height - 1  # rows below the header
        # the jobs list: G, g, a page (ctrl+f, ctrl+b), half a page (ctrl+d, ctrl+u)
        await pilot.press("G")
        assert table.cursor_index == 59 and table.scroll_offset.y > 0
        await pilot.press("g")
        assert table.cursor_index == 0 and table.scroll_offset.y == 0
        await pilot.press("ctrl+f")
        assert table.cursor_index == page
        await pilot.press("ctrl+d")
        assert table.cursor_index == page + page // 2
        await pilot.press("ctrl+u", "ctrl+b")
        assert table.cursor_index == 0
        # the devices table: the same keys
        await pilot.press("1")
        devices = main_screen(app).query_one("#devices-table", DataTable)
        last = devices.row_count - 1
        assert devices.has_focus and last >= 3
        await pilot.press("G")
        assert devices.cursor_row == last
        await pilot.press("g", "ctrl+d")
        assert devices.cursor_row == min(last, (devices.scrollable_content_region.height - 1) // 2)
        # help on Devices lists the Devices view's keys, not the jobs list's; q closes it, not the app
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        titles = [g.title for g in app.screen.groups]  # type: ignore[attr-defined]
        assert titles[0] == "Moving in a table" and "Jobs list" not in titles, titles
        assert ("Home, g", "First row") in app.screen.groups[0].rows  # type: ignore[attr-defined]
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "q to close the help")
        # a detail: its Why pane has the focus and scrolls with G/g; q goes back, not out
        await pilot.press("2")
        table.select_job("m8pp00000001")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen) and "fits nowhere" in screen_text(app),
                       "the detail")
        why = app.screen.query_one("#why-scroll", PagedScroll)
        await wait_for(pilot, lambda: why.max_scroll_y > 0, "a Why pane taller than the screen")
        assert why.has_focus
        await pilot.press("G")
        assert why.scroll_y == why.max_scroll_y
        await pilot.press("g", "ctrl+d")
        assert 0 < why.scroll_y < why.max_scroll_y
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "q to go back")
        # the cancel question: q is No
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the question")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "q to say no")
        assert app.is_running and fake.count("cancel") == 0
        # a typo in the filter is named in the filter line, with the keys there are
        await pilot.press("slash")
        box = app.screen.query_one("#jobs-filter", Input)
        box.value = "stat:queued"
        await pilot.press("enter")
        await wait_for(pilot, lambda: table.row_count == 0, "the filter")
        assert box.has_class("-invalid")
        line = next(ln for ln in screen_text(app).splitlines() if "unknown key" in ln)
        assert "unknown key stat: · keys: state: acc: user: name: id: where: code: reason:" in line, line
        box.value = "state:queued"  # corrected (as if typed)
        await wait_for(pilot, lambda: table.row_count == 60, "the corrected filter")
        assert not box.has_class("-invalid") and "unknown key" not in screen_text(app)
        # q on the main screen quits
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


@pytest.mark.asyncio
async def test_cancel_is_offered_only_on_the_jobs_the_user_may_cancel() -> None:
    jobs = [make_job("m8qq00000001", "running", name="bobs-run", owner="bob", holder_name="lab-ws-02",
                     reason="started"),
            make_job("m8qq00000002", "queued", name="alices", owner="alice")]
    fake = FakeDaemonClient(jobs=jobs, peers=[make_peer("lab-ws-02", state="self")], requester=ALICE)
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(100, 24)) as pilot:
        table = await loaded(pilot, app, 2)
        assert app.state.requester == ALICE  # from the daemon's health
        table.select_job("m8qq00000001")
        await pilot.pause()
        assert table.check_action("cancel_job", ()) is None  # greyed, with a reason when pressed
        await pilot.press("c")
        await wait_for(pilot, lambda: bool(notes(app)), "the reason")
        assert notes(app)[-1] == "job m8qq00000001 is bob's: only bob or an admin may cancel it (you are alice)"
        assert isinstance(app.screen, MainScreen) and fake.count("cancel") == 0
        # the same in the job's detail
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
        assert app.screen.check_action("cancel_job", ()) is None
        await pilot.press("f9")
        await wait_for(pilot, lambda: len(notes(app)) == 2, "the reason again")
        assert isinstance(app.screen, JobDetailScreen) and fake.count("cancel") == 0
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back")
        # her own job: offered, asked, cancelled
        table.select_job("m8qq00000002")
        await pilot.pause()
        assert table.check_action("cancel_job", ()) is True
        assert "c Cancel" in screen_text(app).splitlines()[-1]
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: table.cells("m8qq00000002").state == "cancelled", "the cancel")
        # an admin (the daemon says so after a reconnect) may cancel bob's job
        fake.requester = ALICE.model_copy(update={"admin": True})
        fake.go_down()
        fake.come_back()
        await wait_for(pilot, lambda: app.state.requester is not None and app.state.requester.admin, "the resync")
        table.select_job("m8qq00000001")
        await pilot.pause()
        assert table.check_action("cancel_job", ()) is True
        assert main_screen(app).query_one(TabbedContent).active == "jobs"
