"""How the jobs table draws its lines: the state colours, the header and a row as Rich segments
cut or padded to the column widths (a width of 0 hides a column), and the table's CSS."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from gpulayer_tui.widgets.job_rows import COLUMNS, sort_mark

__all__ = ["JOBS_TABLE_CSS", "STATE_STYLES", "fit", "header_strip", "line_width", "row_strip"]

STATE_STYLES: dict[str, str] = {
    "queued": "yellow",
    "claimed": "yellow",
    "running": "bold green",
    "cancelling": "bold magenta",
    "succeeded": "green",
    "failed": "bold red",
    "timeout": "bold red",
    "lost": "red",
    "rejected": "red",
    "cancelled": "magenta",
}
"""Plain ANSI colours, so a 16-colour terminal shows them as meant; the word carries the meaning."""

_STATE_RICH = {state: Style.parse(style) for state, style in STATE_STYLES.items()}
_STATE_RICH = {state: Style.parse(style) for state, style in STATE_STYLES.items()}
_STATE = next(i for i, (key, _) in enumerate(COLUMNS) if key == "state")

JOBS_TABLE_CSS = """
    JobsTable {
        height: 1fr;
        scrollbar-size-vertical: 1;
        background: $surface;
        color: $foreground;
        & > .jobs-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        &:ansi > .jobs-table--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
        & > .jobs-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus > .jobs-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """
"""The jobs table's ``DEFAULT_CSS``: header and cursor lines as component classes."""


def fit(text: str, width: int) -> str:
    """``text`` padded or cut to exactly ``width`` cells (cut text ends with "…")."""
    if cell_len(text) > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else set_cell_size(text, width)
    return set_cell_size(text, width)


def line_width(widths: Sequence[int]) -> int:
    """Cells of one line: each shown column (width > 0) with the space before it, and one after."""
    return sum(w + 1 for w in widths if w) + 1


def header_strip(widths: Sequence[int], sort_by: str, sort_reverse: bool, style: Style) -> Strip:
    """The header line: each shown column's title, the sorted one marked ▲ or ▼."""
    marked, mark = sort_mark(sort_by, sort_reverse)
    parts = [f" {fit(header + (mark if key == marked else ''), w)}" for (key, header), w in
             zip(COLUMNS, widths, strict=True) if w]
    text = "".join(parts) + " "
    return Strip([Segment(text, style)], cell_len(text))


def row_strip(cells: Sequence[str], widths: Sequence[int], row_style: Style, *, state_colour: bool) -> Strip:
    """One job's line: its cells cut to ``widths`` in ``row_style``, the STATE cell in its colour
    (:data:`STATE_STYLES`) unless ``state_colour`` is False (the cursor line)."""
    segments = []
    for i, (text, width) in enumerate(zip(cells, widths, strict=True)):
        if not width:
            continue
        style = row_style
        if i == _STATE and state_colour:
            style = row_style + _STATE_RICH.get(text, Style.null())
        segments.append(Segment(f" {fit(text, width)}", style))
    segments.append(Segment(" ", row_style))
    return Strip(segments, line_width(widths))
