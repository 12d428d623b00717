"""The job queue: a table that renders only the lines on screen and changes row by row.

Rows are keyed by job id. :meth:`JobsTable.apply_jobs` takes a batch of changed jobs and
repaints only the lines whose cells changed (or adds rows, or removes rows in one pass); only
a new filter, a new sort order, or a resync that drops most jobs reorders the rows, a changed
sort column re-sorts at most twice a second, and nothing that is not on screen is rendered.
Each line is kept as a rendered strip until its job's cells, the cursor or the layout change.
Old finished jobs are hidden as ``gpulayer jobs`` hides them (:class:`OldFinished`), and so are an
array's tasks: the array's row counts them by state (``x`` shows them all under it: :class:`ArrayFold`).

This is a Line API widget rather than a DataTable: a DataTable re-renders every visible
cell and recomputes its row offsets (a loop over all rows) on any change to any cell, which
measured 45 to 120 ms per job update with 1,000 to 10,000 jobs (``bench/tui.py`` on a
2-CPU machine), where this table repaints one line in a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import ClassVar

from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpulayer_tui.state import TERMINAL, cancel_refusal, may_not_manage
from gpulayer_tui.widgets.job_rows import (
    COLUMNS,
    SORTS,
    ArrayFold,
    ColumnNeeds,
    JobFilter,
    OldFinished,
    Row,
    column_widths,
    job_cells,
    sort_key,
    sort_label,
    submission_key,
)
from gpulayer_tui.widgets.job_strips import JOBS_TABLE_CSS, STATE_STYLES, header_strip, line_width, row_strip
from gpulayerd import text as fmt
from gpulayerd.models import JobView, RequesterView

__all__ = ["COLUMNS", "SORTS", "STATE_STYLES", "JobsTable", "job_cells"]

_COLUMN_INDEX = {key: i for i, (key, _) in enumerate(COLUMNS)}
_STATE = _COLUMN_INDEX["state"]
_AGE = _COLUMN_INDEX["age"]

Cells = Row


class JobsTable(ScrollView, can_focus=True):
    """Every job, one line each; filter with :attr:`filter_text`, order with :attr:`sort_by`.

    Posts :class:`OpenRequested` (enter, click on the highlighted row, ``l``) and
    :class:`CancelRequested` (``c``, F9; offered only while the highlighted job can still be
    cancelled, by :attr:`requester`) for the highlighted job, ``x`` folds or unfolds the tasks of the
    highlighted array (or of the highlighted task's), and posts :class:`JobHighlighted` when the highlighted job,
    or its data, changes. Columns: see :mod:`gpulayer_tui.widgets.job_rows`; USER is hidden
    while every shown row has the same user. A cursor on the last row follows rows added below.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"jobs-table--header", "jobs-table--cursor"}

    DEFAULT_CSS = JOBS_TABLE_CSS

    HELP_GROUP: ClassVar[str] = "Jobs list"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_job", "Detail"),
        Binding("c", "cancel_job", "Cancel"),
        Binding("f9", "cancel_job", "Cancel", show=False),
        Binding("l", "open_job('log')", "Logs"),
        Binding("x", "toggle_tasks", "Tasks"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse sort", show=False),
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First job", show=False),
        Binding("end", "last", "Last job", show=False),
        Binding("g", "first", "First job", show=False),
        Binding("G", "last", "Last job", show=False),
        Binding("ctrl+b", "page(-1)", "Page up", show=False),
        Binding("ctrl+f", "page(1)", "Page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "Half a page up", show=False),
        Binding("ctrl+d", "half_page(1)", "Half a page down", show=False),
    ]

    cursor_index: reactive[int] = reactive(0, init=False)
    """Position (from the top) of the highlighted row."""

    filter_text: reactive[str] = reactive("", init=False)
    """What every shown job matches: ``field:value`` terms and words (:class:`JobFilter`)."""

    sort_by: reactive[str] = reactive("submitted", init=False)
    """One of :data:`SORTS`."""

    sort_reverse: reactive[bool] = reactive(False, init=False)
    """True: the sort order reversed (the header shows ▼ instead of ▲)."""

    requester: RequesterView | None = None
    """Who the TUI runs as (set by the screen from the daemon's answer): cancel is offered only on the jobs
    they may cancel; None: on every job (the daemon decides)."""
    read_only = False
    """True on a read-only board (:mod:`gpulayer_tui.readonly`): neither cancel nor a job's detail or log is offered."""
    show_all_finished: reactive[bool] = reactive(False, init=False)
    """True: every finished job; False: only the latest ``FINISHED_SHOWN`` (as ``gpulayer jobs``)."""

    class OpenRequested(Message):
        """Show a job's detail (``tab``: the detail tab to open first)."""

        def __init__(self, job_id: str, tab: str = "why") -> None:
            super().__init__()
            self.job_id = job_id
            self.tab = tab

    class CancelRequested(Message):
        """The user asked to cancel a job (not yet confirmed)."""

        def __init__(self, job_id: str) -> None:
            super().__init__()
            self.job_id = job_id

    class JobHighlighted(Message):
        """The highlighted job, or its data, changed (None: no row is shown)."""

        def __init__(self, job: JobView | None) -> None:
            super().__init__()
            self.job = job

    def __init__(self, *, clock: Callable[[], float], age_refresh_s: float = 5.0,
                 id: str | None = None, classes: str | None = None) -> None:
        """A jobs table.

        Args:
            clock: wall time now (seconds since the epoch), for ages.
            age_refresh_s: seconds between age updates (0: never).
            id: the widget id.
            classes: CSS classes.
        """
        super().__init__(id=id, classes=classes)
        self._clock = clock
        self._age_refresh_s = age_refresh_s
        self._jobs: dict[str, JobView] = {}
        self._old = OldFinished()
        self._cells: dict[str, Cells] = {}
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._index_valid = True
        self._widths: tuple[int, ...] = column_widths(80, show_user=True, needs={})
        self._filter = JobFilter()
        self._cols = ColumnNeeds()
        self._fold = ArrayFold()
        self._devices: dict[tuple[str, int], str] = {}
        self._strips: LRUCache[tuple[str, bool], tuple[Cells, object, Strip]] = LRUCache(4096)
        self._resort_pending = False
        self._highlighted: str | None = None
        self._offered: tuple[bool | None, ...] | None = None

    # ------------------------------------------------------------------ reading

    @property
    def sort_label(self) -> str:
        """The sort order as the header marks it: "AGE▼ oldest first", "STATE▲", "STATE▼ reversed"."""
        return sort_label(self.sort_by, self.sort_reverse)

    @property
    def jobs(self) -> dict[str, JobView]:
        """Every job known (shown or filtered out), by id, in submission order."""
        return self._jobs

    @property
    def shown_ids(self) -> list[str]:
        """Ids of the jobs shown, top to bottom."""
        return list(self._order)

    @property
    def row_count(self) -> int:
        """How many rows are shown (jobs that match the filter, old finished ones hidden)."""
        return len(self._order)

    @property
    def hidden_count(self) -> int:
        """How many finished jobs that match the filter are hidden as old (0 when none is hidden)."""
        return self._old.hidden_count

    @property
    def highlighted_id(self) -> str | None:
        """The id of the job under the cursor, or None when no row is shown."""
        return self._order[self.cursor_index] if self._order else None

    @property
    def hidden_columns(self) -> list[str]:
        """Keys of the columns hidden to fit the width (ID below 90 columns; ID and WHERE when REASON
        needs their cells: :func:`gpulayer_tui.widgets.job_rows.column_widths`)."""
        return [key for (key, _), w in zip(COLUMNS, self._widths, strict=True) if not w]

    def set_device_names(self, names: dict[tuple[str, int], str]) -> None:
        """WHERE names these devices instead of their index: (node id, device index) -> name (a MIG
        instance's "MIG 3g.40gb on GPU 4"); rows are recomputed only when the names change."""
        if names != self._devices:
            self._devices = dict(names)
            self._rebuild()

    def cells(self, job_id: str) -> Cells:
        """The text of a shown job's row (KeyError if it is not shown)."""
        return self._cells[job_id]

    # ------------------------------------------------------------------ changing

    def set_jobs(self, jobs: Iterable[JobView]) -> None:
        """Replace every job (first load and resync), keeping the cursor on the same job."""
        new = {j.id: j for j in jobs}
        if not self._order or len(new) < len(self._jobs) // 2:
            self._jobs = new
            self._old.reset(new)
            self._rebuild()
            return
        self.apply_jobs(new.values(), [k for k in self._jobs if k not in new])

    def upsert_job(self, job: JobView) -> None:
        """Show one job's new data (see :meth:`apply_jobs`)."""
        self.apply_jobs((job,))

    def apply_jobs(self, jobs: Iterable[JobView], gone: Collection[str] = ()) -> None:
        """Show ``jobs``' new data (new ones in submission order) and remove the rows of ``gone`` ids:
        each changed line only, new rows, rows no longer shown removed in one pass."""
        now = self._clock()
        finished_changed = False
        changed: list[tuple[JobView, Row, bool]] = []
        refold = False
        for job in jobs:
            self._old.number(job.id)
            refold |= (job.array is not None and job.id not in self._jobs
                       and any(j.array_id == job.id for j in self._jobs.values()))
            self._jobs[job.id] = job
            cells = job_cells(job, now, self._devices)
            matches = self._filter.matches(job, cells) and not self._fold.folded(job, self._jobs)
            finished_changed |= self._old.mark(job.id, matches and job.status in TERMINAL and not job.array_id)
            changed.append((job, cells, matches))
        drop: set[str] = set()
        for job_id in gone:
            if (was := self._jobs.pop(job_id, None)) is not None:
                finished_changed |= self._old.forget(job_id)
                drop.add(job_id)
                refold |= was.array is not None
                self._fold.forget(job_id)
        if refold:  # an array came or went: its tasks known already fold into it, or unfold
            self._rebuild()
            return
        moved = self._old.update_kept() - drop if finished_changed else set()  # entered or left the latest
        for job, cells, matches in changed:
            moved.discard(job.id)
            self._show_row(job, cells, matches and self._old.shown(job.id), drop)
        for job in (self._jobs[k] for k in moved):
            self._show_row(job, self._cells.get(job.id) or job_cells(job, now, self._devices), self._old.shown(job.id),
                           drop)
        if drop:
            self._drop_rows(drop)

    def refresh_ages(self) -> None:
        """Recompute every shown row's age; only lines whose age changed are repainted."""
        now = self._clock()
        for job_id, cells in self._cells.items():
            new_age = fmt.age(now - self._jobs[job_id].submitted_at)
            if new_age != cells[_AGE]:
                self._cells[job_id] = cells._replace(age=new_age)
                self._refresh_row(job_id)

    def select_job(self, job_id: str) -> bool:
        """Move the cursor to ``job_id``'s row; False if it is not shown."""
        pos = self._position(job_id)
        if pos is None:
            return False
        self.cursor_index = pos
        return True

    # ----------------------------------------------------------------- textual

    def on_mount(self) -> None:
        self._layout_columns()
        if self._age_refresh_s > 0:
            self.set_interval(self._age_refresh_s, self.refresh_ages)

    def on_resize(self) -> None:
        self._layout_columns()

    def on_show(self) -> None:  # the terminal may have been resized while another view was shown
        self._layout_columns(changed_only=True)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def validate_cursor_index(self, value: int) -> int:
        return max(0, min(value, len(self._order) - 1))

    def watch_cursor_index(self, old: int, new: int) -> None:
        self.refresh_line(old + 1)
        self.refresh_line(new + 1)
        self._scroll_to_cursor()
        self._announce_highlight()

    def watch_filter_text(self, text: str) -> None:
        self._filter = JobFilter.parse(text)
        self._rebuild()

    def watch_show_all_finished(self) -> None:
        self._rebuild()

    def watch_sort_by(self) -> None:
        self._resort()

    def watch_sort_reverse(self) -> None:
        self._resort()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Cancel is offered only for a job that has not finished (hidden otherwise) and that
        :attr:`requester` may cancel (greyed otherwise; pressing it says why); neither on a read-only board."""
        if self.read_only and action in ("cancel_job", "open_job"):
            return False
        if action == "cancel_job":
            job_id = self.highlighted_id
            job = self._jobs.get(job_id) if job_id is not None else None
            if job is None or job.status in TERMINAL or job.cancel_requested:
                return False
            return None if may_not_manage(job, self.requester) else True
        if action == "toggle_tasks":
            job_id = self.highlighted_id
            return job_id is not None and ArrayFold.array_of(self._jobs[job_id]) is not None
        return True

    def on_key(self, event: events.Key) -> None:
        """c or F9 where cancel is not offered: say why (a greyed key does nothing otherwise)."""
        if event.key in ("c", "f9") and self.highlighted_id is not None and not self.read_only:
            job = self._jobs.get(self.highlighted_id)
            why = None if job is None else cancel_refusal(job, self.requester)
            if why is not None:
                event.stop()
                self.notify(why, severity="warning", markup=False)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            strip = self._header_strip(base)
        else:
            index = scroll_y + y - 1
            if index >= len(self._order):
                return Strip.blank(width, base)
            strip = self._row_strip(self._order[index], index == self.cursor_index, base)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    async def _on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y - 1
        if event.y < 1 or index >= len(self._order):
            return
        if index == self.cursor_index or event.chain > 1:
            self.cursor_index = index
            self.action_open_job()
        else:
            self.cursor_index = index

    # ----------------------------------------------------------------- actions

    def action_open_job(self, tab: str = "why") -> None:
        job_id = self.highlighted_id
        if job_id is not None:
            self.post_message(self.OpenRequested(job_id, tab))

    def action_cancel_job(self) -> None:
        job_id = self.highlighted_id
        if job_id is not None and self.check_action("cancel_job", ()):
            self.post_message(self.CancelRequested(job_id))

    def action_toggle_tasks(self) -> None:
        """Show the tasks of the highlighted array under it, or fold them back (the cursor stays on the array)."""
        job_id = self.highlighted_id
        array_id = self._fold.toggle(self._jobs[job_id]) if job_id is not None else None
        if array_id is not None:
            self._rebuild()
            self.select_job(array_id)

    def action_cycle_sort(self) -> None:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse

    def action_cursor(self, step: int) -> None:
        self.cursor_index += step

    def action_page(self, direction: int) -> None:
        self.cursor_index += direction * max(1, self.scrollable_content_region.height - 1)

    def action_half_page(self, direction: int) -> None:
        self.cursor_index += direction * max(1, (self.scrollable_content_region.height - 1) // 2)

    def action_first(self) -> None:
        self.cursor_index = 0

    def action_last(self) -> None:
        self.cursor_index = len(self._order) - 1

    # ----------------------------------------------------------------- private

    def _position(self, job_id: str) -> int | None:
        if not self._index_valid:
            self._index = {k: i for i, k in enumerate(self._order)}
            self._index_valid = True
        return self._index.get(job_id)

    def _rebuild(self) -> None:
        """Recompute which jobs show and in what order (filter or sort changed, or a new job list)."""
        keep = self.highlighted_id
        now = self._clock()
        self._cells = {}
        old = self._old
        old.active, old.finished = not self.show_all_finished and not self._filter.names_state, set()
        for job in self._jobs.values():
            if self._fold.folded(job, self._jobs):
                continue
            cells = job_cells(job, now, self._devices)
            if self._filter.matches(job, cells):
                self._cells[job.id] = cells
                if job.status in TERMINAL and not job.array_id:  # an unfolded array's tasks: every one
                    old.finished.add(job.id)
        old.update_kept()
        if old.hidden_count:
            self._cells = {k: c for k, c in self._cells.items() if old.shown(k)}
        self._order = list(self._cells)
        self._cols.reset(self._cells.values())
        self._check_user_column(relayout=True)
        self._reorder(keep)

    def _resort(self) -> None:
        self._resort_pending = False
        self._reorder(self.highlighted_id)

    def _position_in_jobs(self) -> Callable[[str], tuple[object, ...]]:
        key = sort_key(self.sort_by)
        seq, jobs = self._old.seq, self._jobs
        if key is None:
            return lambda job_id: submission_key(jobs[job_id], seq)
        return lambda job_id: (*key(self._cells[job_id]), *submission_key(jobs[job_id], seq))

    def _show_row(self, job: JobView, cells: Row, shown: bool, drop: set[str]) -> None:
        """Show ``job`` as ``cells`` (its line if changed, or a new row), or put its row in ``drop``."""
        old = self._cells.get(job.id)
        if not shown:
            if old is not None:
                drop.add(job.id)
            return
        if old == cells:
            return
        self._cells[job.id] = cells
        if self._cols.measure(cells):
            self._layout_columns(changed_only=True)
        key = sort_key(self.sort_by)
        if old is None:
            self._append_row(job.id)
            if key is not None or self.sort_reverse or not self._old.is_last(job.id) or job.array_id:
                self._schedule_resort()  # its place is not the end: sort it in soon (once for a burst)
        else:
            self._refresh_row(job.id)
            if key is not None and key(old) != key(cells):
                self._schedule_resort()
        if job.id == self.highlighted_id:
            self.post_message(self.JobHighlighted(job))
            self._offer_keys()

    def _reorder(self, keep: str | None) -> None:
        """Sort the shown rows, keeping the cursor on ``keep`` when it is still shown."""
        self._order.sort(key=self._position_in_jobs(), reverse=self.sort_reverse)
        self._index_valid = False
        self._update_virtual_size()
        pos = self._position(keep) if keep is not None else None
        self.set_reactive(JobsTable.cursor_index, self.validate_cursor_index(pos if pos is not None else 0))
        self.refresh()
        self._scroll_to_cursor()
        self._announce_highlight()

    def _append_row(self, job_id: str) -> None:
        was_empty = not self._order
        at_bottom = self.cursor_index == len(self._order) - 1
        self._order.append(job_id)
        if self._index_valid:
            self._index[job_id] = len(self._order) - 1
        self._update_virtual_size()
        self.refresh_line(len(self._order))
        self._check_user_column(relayout=False, added=None if was_empty else self._cells[job_id])
        if was_empty:
            self._announce_highlight()
        elif at_bottom:  # the cursor follows new rows at the bottom, like a log's tail
            self.cursor_index = len(self._order) - 1

    def _drop_rows(self, job_ids: set[str]) -> None:
        """Remove the rows of ``job_ids`` in one pass; the cursor stays on its job, or where it was."""
        keep, cursor, before = self.highlighted_id, self.cursor_index, self._order
        for job_id in job_ids:
            self._cells.pop(job_id, None)
        self._order = [k for k in before if k not in job_ids]
        self._index_valid = False
        self._update_virtual_size()
        if keep is not None and keep not in job_ids:
            cursor = self._position(keep) or 0
        else:
            cursor = sum(1 for k in before[:cursor] if k not in job_ids)
        self.set_reactive(JobsTable.cursor_index, self.validate_cursor_index(cursor))
        self._check_user_column(relayout=False)
        self.refresh()
        self._announce_highlight()

    def _refresh_row(self, job_id: str) -> None:
        if (pos := self._position(job_id)) is not None:
            self.refresh_line(pos + 1)

    def _schedule_resort(self) -> None:
        if not self._resort_pending:
            self._resort_pending = True
            self.set_timer(0.5, self._resort)

    def _announce_highlight(self) -> None:
        job_id = self.highlighted_id
        if job_id != self._highlighted or job_id is None:
            self._highlighted = job_id
            self.post_message(self.JobHighlighted(None if job_id is None else self._jobs.get(job_id)))
            self._offer_keys()

    def _offer_keys(self) -> None:
        """Refresh the footer's keys only when those offered changed (it re-creates its widgets: ~10 ms)."""
        offered = tuple(self.check_action(b.action, ()) for bs in self._bindings.key_to_bindings.values() for b in bs)
        if offered != self._offered and self.is_mounted:
            self._offered = offered
            self.refresh_bindings()

    def _check_user_column(self, relayout: bool, added: Row | None = None) -> None:
        """Show USER only while the shown rows have more than one user (:meth:`ColumnNeeds.check_user`)."""
        if (self._cols.check_user(self._cells, added) or relayout) and self.is_mounted:
            self._layout_columns()

    def _scroll_to_cursor(self) -> None:
        rows = max(1, self.scrollable_content_region.height - 1)
        top = self.scroll_offset.y
        if self.cursor_index < top:
            self.scroll_to(y=self.cursor_index, animate=False)
        elif self.cursor_index >= top + rows:
            self.scroll_to(y=self.cursor_index - rows + 1, animate=False)

    def _layout_columns(self, changed_only: bool = False) -> None:
        """Recompute the column widths and repaint (``changed_only``: only when the widths changed).

        The vertical scrollbar's cells are always left free: rows come and go without a relayout,
        and a line never gets wider than the table (no sideways scrolling).
        """
        room = self.content_region.width - self.styles.scrollbar_size_vertical
        widths = column_widths(room, show_user=self._cols.show_user, needs=self._cols.needs)
        if widths != self._widths:
            self._widths = widths
            self._strips.clear()
        elif changed_only:
            return
        self._update_virtual_size()
        self.refresh()

    def _update_virtual_size(self) -> None:
        line = self._line_width()
        self.virtual_size = Size(line, len(self._order) + 1)

    def _line_width(self) -> int:
        return line_width(self._widths)

    def _header_strip(self, base: Style) -> Strip:
        return header_strip(self._widths, self.sort_by, self.sort_reverse,
                            base + self.get_component_rich_style("jobs-table--header"))

    def _row_strip(self, job_id: str, cursor: bool, base: Style) -> Strip:
        cells = self._cells[job_id]
        row_style = base + self.get_component_rich_style("jobs-table--cursor") if cursor else base
        layout = (self._widths, row_style)
        cached = self._strips.get((job_id, cursor))
        if cached is not None and cached[0] is cells and cached[1] == layout:
            return cached[2]
        strip = row_strip(cells, self._widths, row_style, state_colour=not cursor)
        self._strips[(job_id, cursor)] = (cells, layout, strip)
        return strip
