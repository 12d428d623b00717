"""A small DataTable whose rows are set as a whole but changed by key: only changed cells move."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

__all__ = ["Cell", "KeyedTable"]

Cell = str | Text


class KeyedTable(DataTable[Cell]):
    """A read-only table of a few hundred rows at most (devices, peers, checks).

    Subclasses set :attr:`COLUMNS`. :meth:`sync_rows` keeps the cursor on the same row key:
    when the set of keys is unchanged it updates the cells that changed; otherwise it
    rebuilds, which is cheap at this size.
    """

    HELP_GROUP: ClassVar[str] = "Moving in a table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("home,g", "scroll_top", "First row", show=False),
        Binding("end,G", "scroll_bottom", "Last row", show=False),
        Binding("ctrl+b", "page_up", "Page up", show=False),
        Binding("ctrl+f", "page_down", "Page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "Half a page up", show=False),
        Binding("ctrl+d", "half_page(1)", "Half a page down", show=False),
    ]
    """j/k move like the arrows, Home/End and g/G to the first and last row, ctrl+b/ctrl+f a page and
    ctrl+u/ctrl+d half a page, as in the jobs table (DataTable's other bindings stay)."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = ()
    """(key, header) of each column, in order; widths follow the content."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        """A table with :attr:`COLUMNS`.

        Args:
            id: the widget id.
            classes: CSS classes.
        """
        super().__init__(id=id, classes=classes, cursor_type="row")
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self._pending: dict[str, tuple[Cell, ...]] | None = None

    def on_mount(self) -> None:
        for key, header in self.COLUMNS:
            self.add_column(header, key=key)
        if self._pending is not None:
            self.sync_rows(self._pending)
            self._pending = None

    def action_half_page(self, direction: int) -> None:
        """Move the cursor half the visible rows up (-1) or down (1)."""
        rows = max(1, (self.scrollable_content_region.height - (self.header_height if self.show_header else 0)) // 2)
        self.move_cursor(row=max(0, min(self.row_count - 1, self.cursor_row + direction * rows)))

    @property
    def row_keys(self) -> list[str]:
        """Keys of the rows, top to bottom."""
        return list(self._rows)

    @property
    def highlighted_key(self) -> str | None:
        """The key of the row under the cursor, or None."""
        if not self.row_count:
            return None
        try:
            return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        except CellDoesNotExist:
            return None

    def sync_rows(self, rows: Mapping[str, Sequence[Cell]]) -> None:
        """Show exactly ``rows`` (row key -> cells in column order), in that order."""
        new = {k: tuple(v) for k, v in rows.items()}
        if not self.columns:  # not mounted yet: shown on mount
            self._pending = new
            return
        if list(new) == list(self._rows):
            for key, cells in new.items():
                old = self._rows[key]
                for i, (before, after) in enumerate(zip(old, cells, strict=True)):
                    if before != after:
                        self.update_cell(key, self.COLUMNS[i][0], _plain(after), update_width=True)
            self._rows = new
            return
        keep = self.highlighted_key
        self.clear()
        self._rows = new
        for key, cells in new.items():
            self.add_row(*(_plain(c) for c in cells), key=key)
        if keep is not None and keep in new:
            self.move_cursor(row=self.get_row_index(keep))

    def plain_rows(self) -> list[list[str]]:
        """The rows as plain text (for tests and for copying)."""
        return [[c.plain if isinstance(c, Text) else c for c in cells] for cells in self._rows.values()]


def _plain(cell: Cell) -> Text:
    """A cell as Text: DataTable parses a str cell as Rich markup, and cells hold peers' and users'
    text (a host named ``[/]`` would crash the TUI, ``[link=...]`` would hide a hyperlink)."""
    return Text(cell) if isinstance(cell, str) else cell
