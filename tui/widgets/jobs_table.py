"""The job queue as a table that changes row by row: an update never rebuilds it.

Rows are keyed by job id. :meth:`JobsTable.upsert_job` updates only the cells that
changed, adds a new job's row, or removes a row that no longer matches the filter; only
a new filter (or a resync that changes most rows) rebuilds the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from rich.text import Text
from textual import on
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, RowKey

from gpulayerd.models import JobView
from tui import format as fmt
from tui.state import TERMINAL

__all__ = ["COLUMNS", "SORTS", "JobsTable", "job_cells"]

COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("id", "ID", 12),
    ("name", "NAME", 14),
    ("owner", "OWNER", 8),
    ("state", "STATE", 10),
    ("where", "WHERE", 10),
    ("age", "AGE", 4),
    ("reason", "REASON", 100),
)
"""(key, header, width) of each column, in order."""

SORTS: tuple[str, ...] = ("submitted", "state", "owner", "name", "where")
"""Sort orders that ``s`` cycles through; ties break by submission (the id sorts by time)."""

STATE_STYLES: dict[str, str] = {
    "queued": "yellow",
    "claimed": "yellow",
    "running": "bold green",
    "cancelling": "bold magenta",
    "succeeded": "green",
    "failed": "bold red",
    "lost": "red",
    "rejected": "red",
    "cancelled": "magenta",
}
"""Plain ANSI colours, so a 16-colour terminal shows them as meant; the word carries the meaning."""

_STATE_RANK = {s: i for i, s in enumerate(
    ("running", "cancelling", "claimed", "queued", "failed", "lost", "rejected", "cancelled", "succeeded"))}
_COLUMN_INDEX = {key: i for i, (key, _, _) in enumerate(COLUMNS)}

Cells = tuple[str, ...]


def job_cells(job: JobView, now: float) -> Cells:
    """The plain text of a job's row, one string per column of :data:`COLUMNS`.

    Args:
        job: the job.
        now: wall time (seconds since the epoch) the age is measured to.
    """
    state = "cancelling" if job.cancel_requested and job.status not in TERMINAL else job.status
    where = job.holder_name or (job.holder[:12] if job.holder else None)
    return (
        job.id,
        fmt.text(job.name),
        job.submitted_by or fmt.DASH,
        state,
        fmt.text(where),
        fmt.age(now - job.submitted_at),
        fmt.one_line(job.reason, 200),
    )


def _render(column: int, value: str) -> str | Text:
    if column == _COLUMN_INDEX["state"]:
        return Text(value, style=STATE_STYLES.get(value, ""))
    return value


def _sort_key(order: str) -> Callable[[Any], Any]:
    """A DataTable sort key over a whole row (the cells in column order)."""
    ident = _COLUMN_INDEX["id"]
    if order == "state":
        col = _COLUMN_INDEX["state"]
        return lambda row: (_STATE_RANK.get(str(row[col]), 99), str(row[ident]))
    if order in ("owner", "name", "where"):
        col = _COLUMN_INDEX[order]
        return lambda row: (str(row[col]).lower(), str(row[ident]))
    return lambda row: str(row[ident])


class JobsTable(DataTable[str | Text]):
    """Every job, one row each; filter with :attr:`filter_text`, order with :attr:`sort_by`.

    Posts :class:`OpenRequested` (enter, click, ``l``) and :class:`CancelRequested` (``c``)
    for the highlighted job, and :class:`JobHighlighted` when the highlighted job or its data
    changes.
    """

    DEFAULT_CSS = """
    JobsTable {
        height: 1fr;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_job", "Detail"),
        Binding("c", "cancel_job", "Cancel"),
        Binding("l", "open_job('log')", "Logs"),
        Binding("s", "cycle_sort", "Sort"),
    ]

    filter_text: reactive[str] = reactive("", init=False)
    """Words (case-insensitive) that every shown row must contain."""

    sort_by: reactive[str] = reactive("submitted", init=False)
    """One of :data:`SORTS`."""

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
        """The highlighted job, or its data, changed (None: the table is empty)."""

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
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=False)
        self._clock = clock
        self._age_refresh_s = age_refresh_s
        self._jobs: dict[str, JobView] = {}
        self._shown: dict[str, Cells] = {}
        self._resort_pending = False

    # ------------------------------------------------------------------ public

    @property
    def jobs(self) -> dict[str, JobView]:
        """Every job known (shown or filtered out), by id, in submission order."""
        return self._jobs

    @property
    def shown_ids(self) -> list[str]:
        """Ids of the rows shown, top to bottom."""
        return [str(row.key.value) for row in self.ordered_rows]

    @property
    def highlighted_id(self) -> str | None:
        """The id of the job under the cursor, or None when no row is shown."""
        if not self.row_count:
            return None
        try:
            return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        except CellDoesNotExist:
            return None

    def set_jobs(self, jobs: Iterable[JobView]) -> None:
        """Replace every job (first load and resync), keeping the cursor on the same job."""
        new = {j.id: j for j in jobs}
        if not self.columns:  # not mounted yet: shown on mount
            self._jobs = new
            return
        if not self._shown or len(new) < len(self._jobs) // 2:
            self._jobs = new
            self._rebuild()
            return
        for job_id in [k for k in self._jobs if k not in new]:
            del self._jobs[job_id]
            self._remove_row(job_id)
        for job in new.values():
            self.upsert_job(job)

    def upsert_job(self, job: JobView) -> None:
        """Show one job's new data: changed cells only, or a new row, or remove a filtered-out row."""
        self._jobs[job.id] = job
        if not self.columns:  # not mounted yet: shown on mount
            return
        cells = job_cells(job, self._clock())
        old = self._shown.get(job.id)
        if not self._matches(cells):
            if old is not None:
                self._remove_row(job.id)
            return
        if old is None:
            self._shown[job.id] = cells
            self.add_row(*(_render(i, c) for i, c in enumerate(cells)), key=job.id)
            self._schedule_resort()
        elif old != cells:
            self._shown[job.id] = cells
            for i, (before, after) in enumerate(zip(old, cells, strict=True)):
                if before != after:
                    self.update_cell(job.id, COLUMNS[i][0], _render(i, after))
            self._schedule_resort()
        if job.id == self.highlighted_id:
            self.post_message(self.JobHighlighted(job))

    def refresh_ages(self) -> None:
        """Recompute every shown row's age; only cells whose text changed are updated."""
        now = self._clock()
        col = _COLUMN_INDEX["age"]
        for job_id, cells in self._shown.items():
            new_age = fmt.age(now - self._jobs[job_id].submitted_at)
            if new_age != cells[col]:
                self._shown[job_id] = (*cells[:col], new_age, *cells[col + 1:])
                self.update_cell(job_id, "age", new_age)

    def select_job(self, job_id: str) -> bool:
        """Move the cursor to ``job_id``'s row; False if it is not shown."""
        if job_id not in self._shown:
            return False
        self.move_cursor(row=self.get_row_index(job_id))
        return True

    # ----------------------------------------------------------------- textual

    def on_mount(self) -> None:
        for key, header, width in COLUMNS:
            self.add_column(header, width=width, key=key)
        if self._jobs:
            self._rebuild()
        if self._age_refresh_s > 0:
            self.set_interval(self._age_refresh_s, self.refresh_ages)

    def watch_filter_text(self) -> None:
        self._rebuild()

    def watch_sort_by(self) -> None:
        self._resort()

    def action_open_job(self, tab: str = "why") -> None:
        job_id = self.highlighted_id
        if job_id is not None:
            self.post_message(self.OpenRequested(job_id, tab))

    def action_cancel_job(self) -> None:
        job_id = self.highlighted_id
        if job_id is not None:
            self.post_message(self.CancelRequested(job_id))

    def action_cycle_sort(self) -> None:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]

    @on(DataTable.RowSelected)
    def _row_clicked(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.OpenRequested(str(event.row_key.value)))

    @on(DataTable.RowHighlighted)
    def _row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.post_message(self.JobHighlighted(self._jobs.get(str(event.row_key.value))))

    # ----------------------------------------------------------------- private

    def _matches(self, cells: Cells) -> bool:
        words = self.filter_text.lower().split()
        if not words:
            return True
        hay = " ".join(cells).lower()
        return all(w in hay for w in words)

    def _rebuild(self) -> None:
        keep = self.highlighted_id
        self.clear()
        self._shown = {}
        now = self._clock()
        for job in self._jobs.values():
            cells = job_cells(job, now)
            if self._matches(cells):
                self._shown[job.id] = cells
                self.add_row(*(_render(i, c) for i, c in enumerate(cells)), key=job.id)
        if self.sort_by != "submitted":
            self.sort(key=_sort_key(self.sort_by))
        if keep is not None and keep in self._shown:
            self.move_cursor(row=self.get_row_index(keep))
        if not self._shown:
            self.post_message(self.JobHighlighted(None))

    def _remove_row(self, job_id: str) -> None:
        if self._shown.pop(job_id, None) is None:
            return
        index = self.get_row_index(job_id)
        cursor = self.cursor_row
        self.remove_row(RowKey(job_id))
        if index < cursor:
            self.move_cursor(row=cursor - 1, scroll=False)

    def _schedule_resort(self) -> None:
        if self.sort_by != "submitted" and not self._resort_pending:
            self._resort_pending = True
            self.set_timer(0.5, self._resort)

    def _resort(self) -> None:
        self._resort_pending = False
        keep = self.highlighted_id
        self.sort(key=_sort_key(self.sort_by))
        if keep is not None:
            self.move_cursor(row=self.get_row_index(keep))

