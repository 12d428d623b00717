"""The paged log view: job output sanitized on screen, a 1,000,000-line log opened at its end reading
little, line 1 and back, following paused and resumed, search, and ``\\r`` progress on one line."""

from __future__ import annotations

import pytest
from rich.color import Color
from textual.app import App, ComposeResult
from textual.strip import Strip

from gpulayer_tui.widgets.log_view import LogLines, LogView
from gpulayerd.models import LogChunk
from tests.tui.fake_client import FakeDaemonClient, make_job
from tests.tui.helpers import screen_text, wait_for

JOB = "m8log0000001"
HOSTILE = ("before\n"
           "\x1b[2J\x1b[H\x1b[5A\x1b[41mOVERWRITE\x1b[0m\n"  # CSI erase and cursor, SGR kept
           "\x1b]2;PWNED-TITLE\x1b\\\x1b]52;c;cm0gLXJmIH4=\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\\n"  # OSC
           "\x1bPq#0;2;0;0;0\x1b\\dcs\x1b_apc\x1b\\\n"  # DCS, APC
           "\x9b2J\x9d0;c1-title\x9cc1\x85\x1b[?1049h\x1b[10;20r\x1bc\x07\x00\n"  # 8-bit C1, modes, reset
           "[red]not markup[/red]\n"
           "epoch 1:  10%|#     |\repoch 1:  50%|###   |\repoch 1: 100%|######|\n"
           "after\n")


class LogHarness(App[None]):
    """An app that shows one job's stdout in a :class:`LogView`, read from a fake daemon."""

    def __init__(self, fake: FakeDaemonClient) -> None:
        super().__init__()
        self.fake = fake

    def compose(self) -> ComposeResult:
        yield LogView(poll_s=0.02, id="log-view")

    def on_mount(self) -> None:
        async def read(offset: int, limit: int) -> LogChunk:
            return await self.fake.logs(JOB, offset=offset, limit=limit)

        self.query_one(LogView).show(read, "stdout")
        self.query_one(LogLines).focus()

    @property
    def view(self) -> LogView:
        return self.query_one(LogView)

    def strips(self) -> list[Strip]:
        lines = self.query_one(LogLines)
        return [lines.render_line(y) for y in range(lines.size.height)]


def fake_with(log: str, *, running: bool = False) -> FakeDaemonClient:
    fake = FakeDaemonClient(jobs=[make_job(JOB, "running", holder_name="lab-ws-02")])
    fake.logs_by_job[(JOB, "stdout")] = log
    if not running:
        fake.complete.add(JOB)
    return fake


def title(app: LogHarness) -> str:
    return str(app.view.border_title)


@pytest.mark.asyncio
async def test_no_escape_sequence_of_a_job_reaches_the_terminal_and_progress_shows_one_line() -> None:
    app = LogHarness(fake_with(HOSTILE))
    async with app.run_test(size=(80, 14)) as pilot:
        await wait_for(pilot, lambda: "after" in app.view.shown_text, "the log")
        assert app.view.shown_text == ["before", "OVERWRITE", "link", "dcs", "c1", "[red]not markup[/red]",
                                       "epoch 1: 100%|######|", "after"]
        segments = [s for strip in app.strips() for s in strip]
        controls = [s.text for s in segments if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in s.text)]
        assert controls == []
        red = [s for s in segments if s.text == "OVERWRITE"]
        assert red and red[0].style is not None and red[0].style.bgcolor == Color.parse("color(1)")  # SGR 41
        shown = screen_text(app)
        assert "[red]not markup[/red]" in shown and "PWNED" not in shown and "c1-title" not in shown
        assert "stdout of attempt 1" in title(app) and "complete" in title(app)
        assert app.title != "PWNED-TITLE"


@pytest.mark.asyncio
async def test_a_million_line_log_opens_at_its_end_reading_little_and_pages_to_line_1_and_back() -> None:
    log = "".join(f"line {i}\n" for i in range(1, 1_000_001))
    fake = fake_with(log)
    app = LogHarness(fake)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: "line 1000000" in app.view.shown_text, "the last line")
        assert app.view.shown_text[-1] == "line 1000000"
        assert fake.bytes_served <= 1_000_000, fake.bytes_served
        assert f"byte {len(log):,}/{len(log):,} 100%" in title(app)
        await pilot.press("home")
        await wait_for(pilot, lambda: app.view.shown_text[:1] == ["line 1"], "line 1")
        assert "byte " in title(app) and " 0%" in title(app)
        height = len(app.view.shown_text)
        await pilot.press("pagedown", "ctrl+d", "down")
        on = 1 + (height - 1) + height // 2 + 1
        await wait_for(pilot, lambda: app.view.shown_text[:1] == [f"line {on}"], "a page and a half on")
        await pilot.press("G")
        await wait_for(pilot, lambda: app.view.shown_text[-1:] == ["line 1000000"], "the end again")
        await pilot.press("g", "slash")
        await pilot.press(*"line 65432", "enter")  # beyond what is held: searched through the API
        await wait_for(pilot, lambda: app.view.shown_text[:1] == ["line 65432"], "the line searched")
        await pilot.press("n")
        await wait_for(pilot, lambda: app.view.shown_text[:1] == ["line 654320"], "the next match")
        await pilot.press("N")
        await wait_for(pilot, lambda: app.view.shown_text[:1] == ["line 65432"], "the previous match")
        pages = app.view.pages
        assert pages is not None and pages.end - pages.begin <= 1 << 20  # bounded in memory
        await pilot.press("slash", *"no such", "enter")
        await wait_for(pilot, lambda: "no such: not found" in title(app), "not found")


@pytest.mark.asyncio
async def test_following_pauses_on_scroll_up_and_resumes_at_end() -> None:
    fake = fake_with("".join(f"step {i}\n" for i in range(1, 101)), running=True)
    app = LogHarness(fake)
    key = (JOB, "stdout")
    async with app.run_test(size=(80, 12)) as pilot:
        await wait_for(pilot, lambda: app.view.shown_text[-1:] == ["step 100"], "the end")
        assert "following" in title(app)
        fake.logs_by_job[key] += "step 101\nstep 1"
        await wait_for(pilot, lambda: app.view.shown_text[-2:] == ["step 101", "step 1"], "a line as it is written")
        fake.logs_by_job[key] += "02\n"
        await wait_for(pilot, lambda: app.view.shown_text[-2:] == ["step 101", "step 102"], "the line finished")
        await pilot.press("pageup")
        shown = app.view.shown_text
        assert "paused" in title(app) and shown[-1] != "step 102"
        fake.logs_by_job[key] += "".join(f"step {i}\n" for i in range(103, 120))
        await wait_for(pilot, lambda: "paused, 153 B new" in title(app), "the new bytes counted")
        assert app.view.shown_text == shown  # the view stays
        await pilot.press("end")
        await wait_for(pilot, lambda: app.view.shown_text[-1:] == ["step 119"], "the end, following again")
        assert "following" in title(app)
        fake.logs_by_job[key] += "step 120\n"
        await wait_for(pilot, lambda: app.view.shown_text[-1:] == ["step 120"], "the next line followed")
