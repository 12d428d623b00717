"""The keys a less/vim/htop/k9s user tries to move through a table or a pane: ``g``/``G`` (first,
last), ``ctrl+f``/``ctrl+b`` (a page), ``ctrl+d``/``ctrl+u`` (half a page), beside the arrows,
PgUp/PgDn and Home/End.

:class:`PagedScroll` is a scrolling pane with them (the detail's Why tab, the help);
:class:`~gpulayer_tui.widgets.keyed_table.KeyedTable` and
:class:`~gpulayer_tui.widgets.jobs_table.JobsTable` bind the same keys to their cursor.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll

__all__ = ["PagedScroll"]


class PagedScroll(VerticalScroll):
    """A vertical scrolling pane that also moves with g/G, ctrl+f/ctrl+b and ctrl+d/ctrl+u (at once, as in
    less: without the animation of Textual's Home/End and PgUp/PgDn)."""

    HELP_GROUP: ClassVar[str] = "Scrolling"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("g", "top", "Top", show=False),
        Binding("G", "bottom", "Bottom", show=False),
        Binding("ctrl+b", "page(-1)", "Page up", show=False),
        Binding("ctrl+f", "page(1)", "Page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "Half a page up", show=False),
        Binding("ctrl+d", "half_page(1)", "Half a page down", show=False),
    ]

    def action_top(self) -> None:
        """Scroll to the top."""
        self.scroll_home(animate=False)

    def action_bottom(self) -> None:
        """Scroll to the bottom."""
        self.scroll_end(animate=False)

    def action_page(self, direction: int) -> None:
        """Scroll the visible height up (-1) or down (1)."""
        self.scroll_relative(y=direction * max(1, self.scrollable_content_region.height), animate=False)

    def action_half_page(self, direction: int) -> None:
        """Scroll half the visible height up (-1) or down (1)."""
        self.scroll_relative(y=direction * max(1, self.scrollable_content_region.height // 2), animate=False)
