"""The jobs view at 80x24 and 120x40 through the whole app: reasons in rows, keys, help, sort, filter, escaping."""

from __future__ import annotations

import re

import pytest
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static, TabbedContent

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.models import JobView
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job, make_peer
from tests.tui.helpers import screen_text, wait_for

FAST = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0)
SIZES = [(80, 24), (120, 40)]
BUSY = "Resources: cpu slots 0 free of 4 on lab-ws-02 (needs 2)"
EVIL_NAME = "\x1b]0;title\x07\x1b[2Ja\nfake [b]row[/b]"


def lab_jobs() -> list[JobView]:
    return [
        make_job("m8kk00000001", "running", name="sweep-lr-3e-4", owner="bob", holder_name="lab-ws-02",
                 reason="started on lab-ws-02 GPU 0", requirements={"accelerator": "cuda"}),
        make_job("m8kk00000002", "queued", name="llm-finetune-" + "x" * 58, reason=BUSY,
                 requirements={"accelerator": "cuda"}),
        make_job("m8kk00000003", "queued", name="eval-mps", owner="carol",
                 reason="Framework: torch 2.5.1 has no cuda backend on mac-studio in /opt/venv/bin/python",
                 requirements={"accelerator": "mps"}),
        make_job("m8kk00000004", "succeeded", name="ddp-cpu", owner="alice", reason="exited 0"),
        make_job("m8kk00000005", "queued", name=EVIL_NAME, owner="mallory", reason="Pending: not judged yet"),
    ]


async def started(pilot: Pilot[None], app: GpulayerApp) -> JobsTable:
    table = app.screen.query_one(JobsTable)
    await wait_for(pilot, lambda: app.state.connection.state == "connected" and table.row_count == 5,  # type: ignore[arg-type]
                   "the first load")
    return table


def lab_app() -> GpulayerApp:
    fake = FakeDaemonClient(jobs=lab_jobs(), peers=[make_peer("lab-ws-02", state="self")])
    return make_app(fake, clock=lambda: NOW, settings=FAST)


def row_line(app: GpulayerApp, *needles: str) -> str:
    """The one screen line holding every needle."""
    lines = [ln for ln in screen_text(app).splitlines() if all(n in ln for n in needles)]
    assert len(lines) == 1, (needles, screen_text(app))
    return lines[0]


@pytest.mark.asyncio
@pytest.mark.parametrize("size", SIZES)
async def test_jobs_view(size: tuple[int, int]) -> None:
    """One app per size (each start costs a second): the checks of the jobs view in turn."""
    app = lab_app()
    async with app.run_test(size=size) as pilot:
        table = await started(pilot, app)
        await shows_the_reason_code_and_deciding_words(pilot, app, table)
        await question_mark_and_f1_show_every_binding(pilot, app, every_close_key=size == SIZES[0])
        if size == SIZES[0]:  # these do not depend on the layout: one size is enough (test time)
            await the_detail_help_lists_its_keys(pilot, app, table)
            await j_k_move_the_cursor_and_number_keys_switch_views(pilot, app, table)
            await cancel_is_not_offered_for_a_finished_job(pilot, app, table)
        await sort_marks_its_column_and_reverses(pilot, app, table)
        await a_name_with_escape_sequences_and_markup_is_shown_escaped(pilot, app, table)
        await acc_cuda_filters_by_the_jobs_accelerator_not_the_rows_text(pilot, app, table)


async def shows_the_reason_code_and_deciding_words(pilot: Pilot[None], app: GpulayerApp, table: JobsTable) -> None:
    line = row_line(app, "queued", "Resources:")
    assert "Resources: cpu slots 0 free of" in line and "llm-fine" in line
    assert "Framework: torch 2.5.1" in row_line(app, "Framework:")
    header = row_line(app, "STATE", "REASON")
    assert header.index("STATE") < header.index("REASON") < header.index("NAME") < header.index("USER")
    # the whole reason of the highlighted job is in the status line
    table.select_job("m8kk00000003")
    await wait_for(pilot, lambda: "/opt/venv/bin/python" in screen_text(app), "the status line")


SHOWN_AS = {"question_mark": "?", "slash": "/", "escape": "esc", "up": "↑", "down": "↓", "left": "←",
            "right": "→", "pageup": "PgUp", "pagedown": "PgDn", "home": "Home", "end": "End", "f1": "F1",
            "f9": "F9", "f10": "F10"}


def assert_every_binding_on_screen(app: GpulayerApp, *owners: type[object], shadowed: tuple[str, ...] = ()) -> None:
    """Each key of each owner's BINDINGS is on a line of the help box on screen, followed by its description
    (but ``shadowed`` keys: bound by the screen shown, they are listed there and not under Everywhere)."""
    lines = screen_text(app).splitlines()
    top = next(i for i, ln in enumerate(lines) if "gpulayer keys" in ln)
    bottom = next(i for i, ln in enumerate(lines) if i > top and ln.lstrip().startswith("╰"))
    text = "\n".join(lines[top:bottom])  # not the footer below it
    for owner in owners:
        for binding in Binding.make_bindings(owner.BINDINGS):  # type: ignore[attr-defined]
            if binding.key in shadowed and owner is GpulayerApp:
                continue
            key = re.escape(SHOWN_AS.get(binding.key, binding.key))
            row = re.compile(rf"(?:^|[\s│])(?:\S+, )*{key}(?:, \S+)*\s+{re.escape(binding.description)}(?:\s|│|$)",
                             re.MULTILINE)
            assert row.search(text), (owner.__name__, binding.key, binding.description, text)  # type: ignore[attr-defined]


async def question_mark_and_f1_show_every_binding(pilot: Pilot[None], app: GpulayerApp, every_close_key: bool) -> None:
    """At 80x24 and 120x40 every key of ours is on screen, without scrolling, ours only, and ?/F1/esc/q close it."""
    await pilot.press("question_mark")
    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
    await pilot.pause()
    scroll = app.screen.query_one("#help-scroll", VerticalScroll)
    assert scroll.max_scroll_y == 0 and scroll.scroll_y == 0, screen_text(app)  # it all fits
    assert_every_binding_on_screen(app, GpulayerApp, MainScreen, JobsTable)
    lines = screen_text(app).splitlines()
    top = next(i for i, ln in enumerate(lines) if "gpulayer keys" in ln)
    assert "Jobs list" in lines[top + 1] and "Views" in lines[top + 1], lines  # ours first: the focused list
    assert not re.search(r"shift\+tab\s+Focus|Page Left|super", screen_text(app)), screen_text(app)
    keys = ("question_mark", "f1", "escape", "q") if every_close_key else ("escape",)
    for i, key in enumerate(keys):  # each closes it; q does not quit here
        if i:
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), f"{key} to close the help")
    assert app.is_running


async def the_detail_help_lists_its_keys(pilot: Pilot[None], app: GpulayerApp, table: JobsTable) -> None:
    table.select_job("m8kk00000001")
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail")
    await pilot.press("f1")
    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
    await pilot.pause()
    assert app.screen.query_one("#help-scroll", VerticalScroll).max_scroll_y == 0, screen_text(app)
    assert_every_binding_on_screen(app, GpulayerApp, JobDetailScreen, shadowed=("q",))
    assert not re.search(r"\bq\b[^│]*Quit", screen_text(app)), screen_text(app)  # q is Back here, not Quit
    await pilot.press("escape")
    await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the help to close")
    await pilot.press("escape")
    await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "back")
    table.focus()


async def j_k_move_the_cursor_and_number_keys_switch_views(pilot: Pilot[None], app: GpulayerApp,
                                                          table: JobsTable) -> None:
    table.select_job("m8kk00000001")
    await pilot.press("j", "j")
    assert table.cursor_index == 2
    await pilot.press("k")
    assert table.cursor_index == 1 and app.screen.query_one(TabbedContent).active == "jobs"
    await pilot.press("down")
    assert table.cursor_index == 2
    await pilot.press("1", "j")  # j/k move in the devices table too, never switch views
    devices = app.screen.query_one("#devices-table", DataTable)
    assert app.screen.query_one(TabbedContent).active == "devices" and devices.cursor_row == 1
    await pilot.press("k")
    assert devices.cursor_row == 0
    await pilot.press("3", "2")
    assert app.screen.query_one(TabbedContent).active == "jobs" and table.has_focus
    await pilot.press("tab")  # Tab still moves the focus
    assert not table.has_focus
    table.focus()


async def sort_marks_its_column_and_reverses(pilot: Pilot[None], app: GpulayerApp, table: JobsTable) -> None:
    assert "AGE▼" in row_line(app, "STATE", "REASON")  # submission order: oldest first
    assert "sort: AGE▼ oldest first" in screen_text(app)  # the status line says what the header marks
    await pilot.press("s")
    await pilot.pause()
    assert table.sort_by == "state" and "STATE▲" in row_line(app, "STATE", "REASON")
    assert table.shown_ids[0] == "m8kk00000001" and table.shown_ids[-1] == "m8kk00000004"
    await pilot.press("S")
    await pilot.pause()
    assert "STATE▼" in row_line(app, "STATE", "REASON") and "sort: STATE▼ reversed" in screen_text(app)
    assert table.shown_ids[0] == "m8kk00000004" and table.shown_ids[-1] == "m8kk00000001"
    await pilot.press("s")
    await pilot.pause()
    assert table.sort_by == "reason" and "REASON▼" in row_line(app, "STATE", "REASON")
    table.sort_by, table.sort_reverse = "submitted", False


async def acc_cuda_filters_by_the_jobs_accelerator_not_the_rows_text(pilot: Pilot[None], app: GpulayerApp,
                                                                     table: JobsTable) -> None:
    await pilot.press("slash")
    box = app.screen.query_one("#jobs-filter", Input)
    box.value = "acc:cuda"  # as if typed (typing costs a pilot round per key)
    await pilot.press("enter")
    await wait_for(pilot, lambda: table.row_count == 2, "the filter")
    # the mps job's reason says "cuda": not shown; both CUDA jobs are
    assert table.shown_ids == ["m8kk00000001", "m8kk00000002"]
    assert "2 of 5 jobs (filter: acc:cuda)" in screen_text(app)
    await pilot.press("slash")
    box.value += " user:bob"
    await pilot.press("enter")
    await wait_for(pilot, lambda: table.shown_ids == ["m8kk00000001"], "the user term")


async def cancel_is_not_offered_for_a_finished_job(pilot: Pilot[None], app: GpulayerApp, table: JobsTable) -> None:
    table.select_job("m8kk00000004")
    await pilot.pause()
    assert "c Cancel" not in screen_text(app).splitlines()[-1]
    await pilot.press("c", "f9")
    await pilot.pause()
    assert isinstance(app.screen, MainScreen)
    table.select_job("m8kk00000001")
    await pilot.pause()
    assert "c Cancel" in screen_text(app).splitlines()[-1]
    await pilot.press("f9")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the confirmation")
    await pilot.press("n")
    await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "no")


async def a_name_with_escape_sequences_and_markup_is_shown_escaped(pilot: Pilot[None], app: GpulayerApp,
                                                                   table: JobsTable) -> None:
    assert table.cells("m8kk00000005").name == "\\x1b]0;title\\x07\\x1b[2Ja\\nfake [b]row[/b]"
    line = row_line(app, "mallory")
    assert "\\x1b]0;ti" in line and "Pending: not judged yet" in line
    assert "\x1b" not in screen_text(app) and "\x07" not in screen_text(app)
    table.select_job("m8kk00000005")
    await pilot.press("c")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel), "the confirmation")
    shown = app.screen.query_one("#confirm-text", Static).render()  # not markup: [b] stays as typed
    assert "Cancel job m8kk00000005 (\\x1b]0;title\\x07\\x1b[2Ja\\nfake [b]row[/b]), queued?" in str(shown)
    await pilot.press("n")
    await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "no")


@pytest.mark.asyncio
async def test_ctrl_c_quits_but_copies_in_the_filter_box() -> None:
    app = lab_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await started(pilot, app)
        await pilot.press("slash", "a", "ctrl+c")
        await pilot.pause()
        assert app.is_running and isinstance(app.focused, Input)  # Textual's copy, not quit
        await pilot.press("enter", "ctrl+c")
        await pilot.pause()
        assert not app.is_running
