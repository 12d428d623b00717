"""``?``/F1: every key of gpulayer's own on the screen shown, grouped, read from the classes' BINDINGS.

Textual's built-in help panel lists its generic keys first (tab, page left/right, …) and, at
80x24, pushes ours off the screen. This modal lists only the bindings declared by gpulayer's
classes (the app, the screen below and its widgets; Textual's own widgets are left out), so it
cannot drift from what the keys do: the focused view's keys first, then the screen's, then the
app's. Two columns from 64 cells on, one below; it scrolls when it does not fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from gpulayer_tui.widgets.paging import PagedScroll

__all__ = ["KEY_NAMES", "HelpGroup", "HelpScreen", "help_groups", "key_label"]

_OURS = "gpulayer_tui."
NARROW_CELLS = 64
"""Below this many terminal columns the groups stack in one column."""

KEY_NAMES: dict[str, str] = {
    "question_mark": "?", "slash": "/", "escape": "esc", "enter": "enter", "up": "↑", "down": "↓",
    "left": "←", "right": "→", "pageup": "PgUp", "pagedown": "PgDn", "home": "Home", "end": "End",
}
"""How a Textual key name is shown (F-keys show as F1…F12, others as they are: ``ctrl+c``, ``S``)."""


def key_label(binding: Binding) -> str:
    """The key of one (single-key) binding as the help shows it: its ``key_display`` or :data:`KEY_NAMES`."""
    if binding.key_display:
        return binding.key_display
    key = binding.key
    if key.startswith("f") and key[1:].isdigit():
        return key.upper()
    return KEY_NAMES.get(key, key)


@dataclass(frozen=True, slots=True)
class HelpGroup:
    """One group of the help: a title and its rows of (keys, what they do)."""

    title: str
    rows: tuple[tuple[str, str], ...]


def _own_bindings(node: DOMNode) -> Iterator[tuple[str, list[Binding]]]:
    """(group title, bindings) of each gpulayer class of ``node`` that declares BINDINGS, subclass first.

    The title is the class's own ``HELP_GROUP`` (a ClassVar[str]), else its name.
    """
    for cls in type(node).__mro__:
        if cls.__module__.startswith(_OURS) and "BINDINGS" in cls.__dict__:
            raw: list[BindingType] = cls.__dict__["BINDINGS"]
            yield str(cls.__dict__.get("HELP_GROUP", cls.__name__)), list(Binding.make_bindings(raw))


def _shown(node: DOMNode, screen: Screen[object]) -> bool:
    """True unless ``node`` or a container of it is not displayed (the panes of the other views)."""
    n: DOMNode | None = node
    while n is not None and n is not screen:
        if not n.display:
            return False
        n = n.parent
    return True


def _nodes(app: App[object], screen: Screen[object]) -> Iterator[tuple[DOMNode, bool]]:
    """(node, in the focus chain): the focused widget and its ancestors up to ``screen``, the app (True:
    where Textual looks for a key's binding, in this order), then the screen's other shown widgets
    (False; those of the view shown, not the hidden tabs' widgets)."""
    seen: set[int] = set()
    node: DOMNode | None = screen.focused
    chain: list[DOMNode] = []
    while node is not None and node is not screen and node is not app:
        chain.append(node)
        node = node.parent
    others = [n for n in screen.walk_children() if _shown(n, screen)]
    for n, in_chain in (*((c, True) for c in (*chain, screen, app)), *((o, False) for o in others)):
        if id(n) not in seen:
            seen.add(id(n))
            yield n, in_chain


def help_groups(app: App[object], screen: Screen[object]) -> list[HelpGroup]:
    """Every binding gpulayer declares for ``screen``'s view shown, grouped by the class that declares it.

    Order: the focused widget's classes, its containers', the screen's, the app's, then the other
    shown widgets of the screen (a hidden view's, such as the jobs list's under Devices, are left
    out). Bindings of one class with the same action share a row ("c, F9"). A key that a class
    earlier in the focus chain binds is left out of the later ones (in a detail ``q`` is Back, not
    the app's Quit). A group whose every (key, description) an earlier group lists is left out (j/k
    of a table that the jobs list also moves with); Textual's own widgets are not listed.
    """
    groups: dict[str, dict[tuple[str, str], list[str]]] = {}
    listed: set[tuple[str, str]] = set()
    taken: set[str] = set()  # keys bound earlier in the focus chain: those bindings win
    for node, in_chain in _nodes(app, screen):
        for title, all_bindings in _own_bindings(node):
            bindings = [b for b in all_bindings if not (in_chain and b.key in taken)]
            if title in groups or all((b.key, b.description) in listed for b in bindings):
                continue
            rows = groups[title] = {}
            for b in bindings:
                listed.add((b.key, b.description))
                rows.setdefault((b.action, b.description), []).append(key_label(b))
            if in_chain:
                taken.update(b.key for b in bindings)
    return [HelpGroup(title, tuple((", ".join(keys), what) for (_, what), keys in rows.items()))
            for title, rows in groups.items() if rows]


def _group_table(group: HelpGroup) -> RichGroup:
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, style="bold")
    table.add_column()
    for keys, what in group.rows:
        table.add_row(Text(keys), Text(what))  # Text: never read as markup ("[", "/")
    return RichGroup(Text(group.title, style="bold underline"), table)


def _split(groups: list[HelpGroup]) -> tuple[list[HelpGroup], list[HelpGroup]]:
    """The groups in two columns, in order (left, then right), the taller column as short as can be."""
    heights = [len(g.rows) + 2 for g in groups]  # title, rows, a blank line
    best = min(range(len(groups) + 1), key=lambda k: (max(sum(heights[:k]), sum(heights[k:])), -k))
    return groups[:best], groups[best:]


class HelpScreen(ModalScreen[None]):
    """The keys of the screen below, from their BINDINGS; closed with ?, F1, escape or q."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > #help-box {
        width: 100%;
        max-width: 90;
        height: auto;
        max-height: 100%;
        border: round $primary;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen #help-scroll {
        height: auto;
        max-height: 1fr;
    }
    HelpScreen #help-columns {
        height: auto;
    }
    HelpScreen .help-column {
        width: 1fr;
        height: auto;
    }
    HelpScreen.-narrow #help-columns {
        layout: vertical;
    }
    HelpScreen.-narrow .help-column {
        width: 100%;
    }
    HelpScreen .help-group {
        margin-bottom: 1;
        padding-right: 2;
    }
    HelpScreen #help-note {
        color: $text-muted;
    }
    """

    HELP_GROUP: ClassVar[str] = "Help"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark,f1,escape,q", "close", "Close help"),
    ]

    def __init__(self, below: Screen[object]) -> None:
        """The help of ``below`` (the screen shown when ? was pressed)."""
        super().__init__()
        self._groups = help_groups(below.app, below)

    @property
    def groups(self) -> list[HelpGroup]:
        """What the help lists, in order."""
        return self._groups

    def compose(self) -> ComposeResult:
        left, right = _split(self._groups)
        with Vertical(id="help-box"):
            with PagedScroll(id="help-scroll"), Horizontal(id="help-columns"):
                for column in (left, right):
                    with Vertical(classes="help-column"):
                        for g in column:
                            yield Static(_group_table(g), classes="help-group")
            yield Static("Tab/shift+Tab move the focus · ?, F1, esc or q close this help", id="help-note")

    def on_mount(self) -> None:
        box = self.query_one("#help-box")
        box.border_title = "gpulayer keys"
        self._fit(self.app.size.width)
        self.query_one("#help-scroll").focus()

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)

    def _fit(self, width: int) -> None:
        self.set_class(width < NARROW_CELLS, "-narrow")

    def action_close(self) -> None:
        self.dismiss()
