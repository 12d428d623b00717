"""NO_COLOR and the 16-colour theme stay readable: every text segment of the main views, a job's detail,
the help, the cancel question and the "daemon not reachable" banner, as the terminal gets them.

- 16 colours (``ansi-dark``): each segment's colours are resolved as Textual itself shows ANSI
  colours (its ``ansi_theme_dark`` palette; ``default`` is that palette's foreground and
  background, ``reverse`` swaps them) and its WCAG contrast ratio must reach :data:`MIN_TEXT`
  (WCAG AA for text), or :data:`MIN_DIM` for dim text, drawn :data:`DIM_BLEND` of the way from the
  background to its colour (as Textual's DimFilter draws it).
- NO_COLOR: no segment carries a colour (foreground or background); what stands out does by
  bold, dim, reverse or underline; the highlighted row is reversed.

Only segments with text are judged: spaces, box drawing and block elements (borders, the tab
underline, bars and sparklines) are drawings, not text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from rich.color import Color, ColorType
from rich.segment import Segment
from rich.style import Style
from rich.terminal_theme import TerminalTheme
from textual.pilot import Pilot

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.gpu_metrics import GpuCard
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.models import JobView
from tests.tui.fake_client import NOW, FakeDaemonClient, lab_metrics, make_job, make_peer, waiting_explanation
from tests.tui.helpers import screen_text, wait_for

MIN_TEXT = 4.5
"""WCAG AA for normal text."""
MIN_DIM = 3.0
"""Dim (greyed) text: WCAG's minimum for large text and for the parts of a user interface."""
DIM_BLEND = 0.5
"""How far from the background a terminal draws dim text (Textual's DimFilter)."""

RGB = tuple[int, int, int]


def lab_jobs() -> list[JobView]:
    """A job in every state the table colours (running, queued, cancelling, failed, cancelled, …)."""
    states = ("running", "queued", "claimed", "succeeded", "failed", "lost", "rejected", "cancelled")
    jobs = [make_job(f"m8cc0000000{i}", state, name=f"{state}-job", owner=("bob" if i % 2 else "alice"),
                     holder_name="lab-ws-02" if state == "running" else None, reason=f"reason of a {state} job",
                     age_s=600 - i) for i, state in enumerate(states)]
    stopping = make_job("m8cc00000009", "running", name="stopping", holder_name="lab-ws-02", reason="started")
    return [*jobs, stopping.model_copy(update={"cancel_requested": True})]


def lab_app(theme: str | None) -> tuple[GpulayerApp, FakeDaemonClient]:
    fake = FakeDaemonClient(jobs=lab_jobs(), peers=[make_peer("lab-ws-02", state="self"), make_peer("dgx-spark"),
                                                     make_peer("old-ws-07", state="suspect")],
                            explanations={"m8cc00000001": waiting_explanation("m8cc00000001")}, metrics=lab_metrics())
    settings = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0, theme=theme, metrics_poll_s=0.05)
    return make_app(fake, clock=lambda: NOW, settings=settings), fake


@dataclass(frozen=True, slots=True)
class Shown:
    """One text segment on screen: where, what it says, its style."""

    view: str
    line: int
    text: str
    style: Style


def _is_text(text: str) -> bool:
    """True when ``text`` has a character that is not a space, box drawing or a block element."""
    return any(not ch.isspace() and not 0x2500 <= ord(ch) <= 0x259F for ch in text)


def segments(app: GpulayerApp, view: str) -> Iterator[Shown]:
    """Every text segment of the screen as the terminal gets it (after Textual's colour filters)."""
    for y, strip in enumerate(app.screen._compositor.render_strips()):
        for seg in strip:
            assert isinstance(seg, Segment)
            if _is_text(seg.text):
                yield Shown(view, y, seg.text, seg.style or Style())


async def every_screen(pilot: Pilot[None], app: GpulayerApp, fake: FakeDaemonClient, every: bool = True
                       ) -> list[Shown]:
    """The segments of Jobs, Devices (live metrics: a GPU busy with a foreign process), Peers,
    Environments, a waiting job's detail, the help, the cancel question and the banner (``every``
    False: Jobs, Devices, the detail and the banner only)."""
    table = app.screen.query_one(JobsTable)
    await wait_for(pilot, lambda: table.row_count == 9 and "stopping" in screen_text(app), "the first load")
    shown = list(segments(app, "jobs"))
    await pilot.press("1")
    await wait_for(pilot, lambda: len(app.screen.query(GpuCard)) == 2 and "foreign pid" in screen_text(app),
                   "the live metrics")
    shown += segments(app, "devices")
    for key, view, shows in (("3", "peers", "old-ws-07"), ("4", "environments", "PYTHON")) if every else ():
        await pilot.press(key)
        await wait_for(pilot, lambda shows=shows: shows in screen_text(app), view)
        shown += segments(app, view)
    await pilot.press("2")
    table.select_job("m8cc00000001")
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, JobDetailScreen) and "fits nowhere" in screen_text(app),
                   "the detail")
    shown += segments(app, "detail")
    if every:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and "gpulayer keys" in screen_text(app),
                       "the help")
        shown += segments(app, "help")
        await pilot.press("escape", "escape", "c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmCancel) and "Cancel job" in screen_text(app),
                       "the question")
        shown += segments(app, "confirm")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), "no")
    fake.go_down()
    await wait_for(pilot, lambda: "daemon not reachable" in screen_text(app), "the banner")
    shown += segments(app, "banner")
    return shown


def _rgb(color: Color | None, palette: TerminalTheme, foreground: bool) -> RGB:
    if color is None or color.type == ColorType.DEFAULT:
        c = palette.foreground_color if foreground else palette.background_color
    else:
        c = color.get_truecolor(palette, foreground=foreground)
    return c.red, c.green, c.blue


def _luminance(rgb: RGB) -> float:
    def linear(v: int) -> float:
        s = v / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(v) for v in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: RGB, bg: RGB) -> float:
    """WCAG 2 contrast ratio of two colours, 1 (none) to 21 (black on white)."""
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def drawn(style: Style, palette: TerminalTheme) -> tuple[RGB, RGB]:
    """(text colour, background) as a terminal with ``palette`` draws ``style``."""
    fg, bg = _rgb(style.color, palette, True), _rgb(style.bgcolor, palette, False)
    if style.reverse:
        fg, bg = bg, fg
    if style.dim:
        fg = (round(bg[0] + (fg[0] - bg[0]) * DIM_BLEND), round(bg[1] + (fg[1] - bg[1]) * DIM_BLEND),
              round(bg[2] + (fg[2] - bg[2]) * DIM_BLEND))
    return fg, bg


def test_contrast_ratio_is_wcags() -> None:
    assert contrast((0, 0, 0), (255, 255, 255)) == pytest.approx(21.0)
    assert contrast((0x77, 0x77, 0x77), (255, 255, 255)) == pytest.approx(4.48, abs=0.01)
    # the NO_COLOR text: grey 237 on grey 235
    assert contrast((0x3A, 0x3A, 0x3A), (0x26, 0x26, 0x26)) < 1.5


@pytest.mark.asyncio
async def test_the_16_colour_theme_keeps_every_text_readable() -> None:
    app, fake = lab_app("ansi-dark")
    async with app.run_test(size=(120, 40)) as pilot:
        shown = await every_screen(pilot, app, fake)
        palette = app.ansi_theme_dark
    views = {s.view for s in shown}
    assert views == {"jobs", "devices", "peers", "environments", "detail", "help", "confirm", "banner"}
    judged = "\n".join("".join(s.text for s in shown if (s.view, s.line) == key)
                        for key in dict.fromkeys((s.view, s.line) for s in shown))
    for text in ("busy (pid 31337)", "foreign pid 31337 (carol)", "failed", "cancelled", "daemon not reachable"):
        assert text in judged, judged
    low = []
    for s in shown:
        ratio = contrast(*drawn(s.style, palette))
        if ratio < (MIN_DIM if s.style.dim else MIN_TEXT):
            low.append(f"{s.view} line {s.line}: {s.text.strip()!r} {s.style} {ratio:.2f}:1")
    assert low == [], "\n".join(low)


@pytest.mark.asyncio
async def test_no_color_shows_no_colour_only_text_styles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app, fake = lab_app(None)
    async with app.run_test(size=(120, 40)) as pilot:
        shown = await every_screen(pilot, app, fake, every=False)  # a filter of the whole screen: a few are enough
    coloured = [f"{s.view} line {s.line}: {s.text.strip()!r} {s.style}" for s in shown
                if not (s.style.color is None or s.style.color.is_default)
                or not (s.style.bgcolor is None or s.style.bgcolor.is_default)]
    assert coloured == [], "\n".join(coloured[:20])
    # what stood out by colour stands out by style: the highlighted row, headers, the banner
    jobs = [s for s in shown if s.view == "jobs"]
    assert any(s.style.reverse and "m8cc00000000" in s.text for s in jobs), [str(s) for s in jobs[:8]]
    assert any(s.style.underline and "STATE" in s.text for s in jobs)
    assert any(s.style.bold and "daemon not reachable" in s.text for s in shown if s.view == "banner")
    devices = [s for s in shown if s.view == "devices"]
    assert any("busy (pid 31337)" in s.text and not s.style.dim for s in devices)
