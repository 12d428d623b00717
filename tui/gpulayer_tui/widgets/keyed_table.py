"""A small DataTable whose rows are set as a whole but changed by key: only changed cells move; its
columns can fit the table's width instead of scrolling sideways."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

from gpulayerd import text as fmt

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

    SHRINK: ClassVar[Sequence[tuple[str, int]]] = ()
    """Set: the columns fit the table's width, never scrolling sideways. (column key, floor) in the
    order columns give way when the content is wider (:func:`gpulayerd.text.fit_widths`): a cut
    cell ends in "…"; a floor of 0 hides the column (:attr:`hidden_columns`: show its text
    elsewhere). Unset: each column is as wide as its widest cell."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        """A table with :attr:`COLUMNS`.

        Args:
            id: the widget id.
            classes: CSS classes.
        """
        super().__init__(id=id, classes=classes, cursor_type="row")
        self._rows: dict[str, tuple[Cell, ...]] = {}
        self._pending: dict[str, tuple[Cell, ...]] | None = None
        self._widths: tuple[int, ...] | None = None

    def on_mount(self) -> None:
        self._add_columns(None)
        if self._pending is not None:
            self.sync_rows(self._pending)
            self._pending = None

    def action_half_page(self, direction: int) -> None:
        """Move the cursor half the visible rows up (-1) or down (1)."""
        rows = max(1, (self.scrollable_content_region.height - (self.header_height if self.show_header else 0)) // 2)
        self.move_cursor(row=max(0, min(self.row_count - 1, self.cursor_row + direction * rows)))

    def on_resize(self) -> None:
        if self.SHRINK and self.columns and self._layout(self._rows) != self._widths:
            self._rebuild(self._rows)

    def on_show(self) -> None:  # the terminal may have been resized while another view was shown
        self.on_resize()

    @property
    def hidden_columns(self) -> list[str]:
        """Keys of the columns hidden to fit the width (see :attr:`SHRINK`), in column order."""
        widths = self._widths or ()
        return [key for (key, _), w in zip(self.COLUMNS, widths, strict=False) if w == 0]

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
        widths = self._layout(new)
        if list(new) == list(self._rows) and widths == self._widths:
            for key, cells in new.items():
                old = self._rows[key]
                for i, (before, after) in enumerate(zip(old, cells, strict=True)):
                    if before == after:
                        continue
                    if widths is None:
                        self.update_cell(key, self.COLUMNS[i][0], _plain(after), update_width=True)
                    elif widths[i]:
                        self.update_cell(key, self.COLUMNS[i][0], _plain(after, widths[i]))
            self._rows = new
            return
        self._rebuild(new)

    def row_cells(self, key: str) -> tuple[Cell, ...]:
        """A row's cells, whole (never cut to fit); KeyError if no row has ``key``."""
        return self._rows[key]

    def plain_rows(self) -> list[list[str]]:
        """The rows as plain text, whole (for tests and for copying)."""
        return [[c.plain if isinstance(c, Text) else c for c in cells] for cells in self._rows.values()]

    # ----------------------------------------------------------------- private

    def _rebuild(self, rows: dict[str, tuple[Cell, ...]]) -> None:
        """Show ``rows`` anew (columns too when their widths change), keeping the cursor on its row."""
        keep = self.highlighted_key
        widths = self._layout(rows)
        if widths != self._widths:
            self.clear(columns=True)
            self._add_columns(widths)
        else:
            self.clear()
        self._rows = rows
        for key, cells in rows.items():
            if widths is None:
                self.add_row(*(_plain(c) for c in cells), key=key)
            else:
                self.add_row(*(_plain(c, w) for c, w in zip(cells, widths, strict=True) if w), key=key)
        if keep is not None and keep in rows:
            self.move_cursor(row=self.get_row_index(keep))

    def _add_columns(self, widths: tuple[int, ...] | None) -> None:
        self._widths = widths
        for i, (key, header) in enumerate(self.COLUMNS):
            if widths is None:
                self.add_column(header, key=key)
            elif widths[i]:
                self.add_column(fmt.cut(header, widths[i]), key=key, width=widths[i])

    def _layout(self, rows: Mapping[str, Sequence[Cell]]) -> tuple[int, ...] | None:
        """The columns' widths for ``rows`` at the table's width (0: hidden); None: content widths."""
        if not self.SHRINK or self.size.width <= 0:
            return None
        needs = [fmt.width(header) for _, header in self.COLUMNS]
        for cells in rows.values():
            for i, cell in enumerate(cells):
                needs[i] = max(needs[i], fmt.width(cell.plain if isinstance(cell, Text) else cell))
        room = self.size.width
        if len(rows) + 1 > self.size.height > 0:  # a vertical scrollbar takes cells too
            room -= self.styles.scrollbar_size_vertical
        index = {key: i for i, (key, _) in enumerate(self.COLUMNS)}
        return tuple(fmt.fit_widths(needs, room, [(index[k], floor) for k, floor in self.SHRINK],
                                    gap=2 * self.cell_padding))


def _plain(cell: Cell, cells: int | None = None) -> Text:
    """A cell as Text, cut to ``cells`` cells when given (at a space when one is near the end, then
    "…": :func:`gpulayerd.text.cut`): DataTable parses a str cell as Rich markup, and cells hold
    peers' and users' text (a host named ``[/]`` would crash the TUI, ``[link=...]`` would hide a
    hyperlink)."""
    text = Text(cell) if isinstance(cell, str) else cell
    if cells is not None and text.cell_len > cells:
        kept = fmt.cut(text.plain, cells, words=True)
        text = text[: len(kept) - 1] + Text("…", style=text.style)
    return text
