"""A job's log, paged from the daemon like ``less +F``: opens at the end, follows, searches.

:class:`LogView` shows a :class:`gpulayer_tui.log_pages.LogPages` window: only the lines near
the view are read (so a log of any size opens at once at its last line), each sanitized
(SGR colours shown as styles, every other escape dropped) and shown as text, never as markup.
While at the end of a running job it follows; scrolling up pauses (the border says how much
arrived since), ``End``/``G``/``F`` resume. The border shows the position like ``less``.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input

from gpulayer_tui.api import ApiRequestError, DaemonUnreachable
from gpulayer_tui.log_pages import AttemptChanged, LogPages, Read
from gpulayerd import text as fmt

__all__ = ["LogLines", "LogView"]

WHEEL_LINES = 3
"""Lines one mouse wheel step scrolls."""
SIDEWAYS_CELLS = 8
"""Cells one left/right key scrolls."""


class LogLines(Widget, can_focus=True):
    """The lines in view of a :class:`LogPages` (no markup: text and SGR styles only)."""

    DEFAULT_CSS = """
    LogLines {
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.pages: LogPages | None = None
        self.x = 0
        self.pattern = ""

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the view, from column :attr:`x`, cropped to the width."""
        width = self.size.width
        style = self.rich_style
        pages = self.pages
        if pages is None or not 0 <= pages.top + y < len(pages.lines) or y >= pages.height:
            return Strip.blank(width, style)
        line = pages.lines[pages.top + y]
        text = Text.from_ansi(line) if "\x1b" in line else Text(line)
        text.no_wrap = True
        text.end = ""
        text.expand_tabs(8)
        text.stylize_before(style)
        if self.pattern:
            text.highlight_words([self.pattern], style="reverse", case_sensitive=self.pattern != self.pattern.lower())
        segments = [s for s in text.render(self.app.console) if s.text != "\n"]
        return Strip(segments, cell_len(text.plain)).crop_extend(self.x, self.x + width, style)

    def on_resize(self, event: events.Resize) -> None:
        if self.pages is not None:
            self.pages.resize(event.size.height)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.parent_view().scroll_lines(WHEEL_LINES)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.parent_view().scroll_lines(-WHEEL_LINES)

    def parent_view(self) -> LogView:
        """The :class:`LogView` this belongs to."""
        parent = self.parent
        assert isinstance(parent, LogView)
        return parent


class LogView(Vertical):
    """One stream of a job's log, paged from the daemon; see the module docstring for the keys."""

    DEFAULT_CSS = """
    LogView {
        height: 1fr;
    }
    LogView > #log-search {
        display: none;
        height: 3;
    }
    LogView.-searching > #log-search {
        display: block;
    }
    """

    HELP_GROUP: ClassVar[str] = "Log"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "scroll_lines(-1)", "Line up (pauses following)", show=False),
        Binding("down,j", "scroll_lines(1)", "Line down", show=False),
        Binding("pageup,ctrl+b,b", "scroll_pages(-1)", "Page up", show=False),
        Binding("pagedown,ctrl+f,space", "scroll_pages(1)", "Page down", show=False),
        Binding("ctrl+u", "scroll_half(-1)", "Half page up", show=False),
        Binding("ctrl+d", "scroll_half(1)", "Half page down", show=False),
        Binding("left", "sideways(-1)", "Scroll left", show=False),
        Binding("right", "sideways(1)", "Scroll right", show=False),
        Binding("home,g", "start", "Line 1"),
        Binding("end,G,F", "end", "End, follow"),
        Binding("slash", "search", "Search"),
        Binding("n", "search_again(True)", "Next match", show=False),
        Binding("N", "search_again(False)", "Previous match", show=False),
    ]

    def __init__(self, *, poll_s: float, id: str | None = None) -> None:
        """An empty log view; :meth:`show` gives it a log.

        Args:
            poll_s: seconds between reads while the log has nothing new.
            id: the widget id.
        """
        super().__init__(id=id)
        self._poll_s = poll_s
        self._label = ""
        self._note = ""
        self._pattern = ""
        self._shown_title = ""
        self._read: Read | None = None
        self.pages: LogPages | None = None

    def compose(self) -> ComposeResult:
        yield LogLines(id="log-lines")
        yield Input(placeholder="search forward (enter; then n next, N previous; esc closes)", id="log-search")

    # ------------------------------------------------------------------ public

    def show(self, read: Read, label: str) -> None:
        """Show the log that ``read`` reads (another stream, another attempt), titled ``label``, from its end."""
        self._read, self._label, self._note, self._pattern = read, label, "reading…", ""
        lines = self.query_one(LogLines)
        lines.pattern, lines.x = "", 0
        self._open()

    @property
    def shown_text(self) -> list[str]:
        """The lines in view as plain text (for tests)."""
        pages = self.pages
        if pages is None:
            return []
        return [pages.plain(i) for i in range(pages.top, min(len(pages.lines), pages.top + pages.height))]

    # ------------------------------------------------------------------ actions

    def action_scroll_lines(self, lines: int) -> None:
        self.scroll_lines(lines)

    def action_scroll_pages(self, pages: int) -> None:
        self.scroll_lines(pages * max(1, self._height() - 1))

    def action_scroll_half(self, halves: int) -> None:
        self.scroll_lines(halves * max(1, self._height() // 2))

    def action_sideways(self, steps: int) -> None:
        lines = self.query_one(LogLines)
        lines.x = max(0, lines.x + steps * SIDEWAYS_CELLS)
        lines.refresh()

    def action_start(self) -> None:
        self._jump(end=False)

    def action_end(self) -> None:
        self._jump(end=True)

    def action_search(self) -> None:
        self.add_class("-searching")
        self.query_one("#log-search", Input).focus()

    def action_search_again(self, forward: bool) -> None:
        if self._pattern:
            self._search(self._pattern, forward)

    def scroll_lines(self, lines: int) -> None:
        """Move the view ``lines`` down (negative: up, pausing following), reading on as it nears an edge."""
        pages = self.pages
        if pages is None:
            return
        pages.scroll(lines)
        self._changed()
        self._fill()

    # ------------------------------------------------------------------ search box

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._close_search()
        if event.value:
            self._pattern = event.value
            self._search(event.value, True)

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape" and self.has_class("-searching"):
            event.stop()
            self._close_search()

    def _close_search(self) -> None:
        self.remove_class("-searching")
        self.query_one(LogLines).focus()

    # ------------------------------------------------------------------ workers

    @work(exclusive=True, group="log-follow")
    async def _open(self) -> None:
        """Open the log at its end, then read what it gains until the attempt ended and all was read."""
        read = self._read
        assert read is not None
        lines = self.query_one(LogLines)
        while True:
            pages = LogPages(read)
            pages.resize(lines.size.height)
            self.pages = lines.pages = pages
            try:
                await pages.open_end()
                self._note = ""
                self._changed()
                while not (pages.complete and pages.end >= (pages.size or 0)):
                    if await pages.poll():
                        self._changed()
                    else:
                        self._retitle()
                        await asyncio.sleep(self._poll_s)
                return
            except AttemptChanged:
                continue  # a new attempt: its log from its end
            except DaemonUnreachable:
                self._note = "the daemon is unreachable"
                self._changed()
                await asyncio.sleep(self._poll_s)
            except ApiRequestError as e:
                self._note = fmt.escape(str(e))
                self._changed()
                return

    @work(exclusive=True, group="log-fill")
    async def _fill(self) -> None:
        """Read what the view needs near its edges."""
        pages = self.pages
        if pages is None:
            return
        try:
            while await pages.fill():
                self._changed()
        except (AttemptChanged, DaemonUnreachable, ApiRequestError):
            return  # the follow worker says so and starts again

    @work(exclusive=True, group="log-jump")
    async def _jump(self, end: bool) -> None:
        pages = self.pages
        if pages is None:
            return
        try:
            await (pages.resume() if end else pages.open_start())
        except (AttemptChanged, DaemonUnreachable, ApiRequestError):
            return
        self._changed()
        self._fill()

    @work(exclusive=True, group="log-jump")
    async def _search(self, pattern: str, forward: bool) -> None:
        pages = self.pages
        if pages is None:
            return
        self.query_one(LogLines).pattern = pattern
        self._note = f"searching {fmt.escape(pattern)}…"
        self._changed()
        try:
            missing = await pages.search(pattern, forward)
        except (AttemptChanged, DaemonUnreachable, ApiRequestError):
            missing = "the log changed"
        self._note = f"{fmt.escape(pattern)}: {missing}" if missing else ""
        self._changed()
        self._fill()

    # ------------------------------------------------------------------ private

    def _height(self) -> int:
        return self.pages.height if self.pages is not None else 1

    def _changed(self) -> None:
        """Repaint the lines and say where the view is in the border title."""
        lines = self.query_one(LogLines)
        if self.pages is not None and lines.size.height and lines.size.height != self.pages.height:
            self.pages.resize(lines.size.height)
        lines.refresh()
        self._retitle()

    def _retitle(self) -> None:
        """Say where the view is in the border title (when that changed)."""
        title = self._title()
        if title != self._shown_title:
            self._shown_title = title
            self.border_title = Text(title)

    def _title(self) -> str:
        pages = self.pages
        parts = [self._label]
        if pages is not None and pages.attempt == 0:
            parts.append("the job has not started")
        elif pages is not None and pages.size is not None:
            parts[0] = f"{self._label} of attempt {pages.attempt}"
            pct = 100 if not pages.size else pages.position * 100 // pages.size
            parts.append(f"byte {pages.position:,}/{pages.size:,} {pct}%")
            if pages.complete:
                parts.append("complete")
            elif pages.following:
                parts.append("following")
            else:
                new = pages.new_bytes
                parts.append(f"paused, {fmt.size(new)} new (End or F follows)" if new else
                             "paused (End or F follows)")
        if self._note:
            parts.append(self._note)
        return " · ".join(parts)
