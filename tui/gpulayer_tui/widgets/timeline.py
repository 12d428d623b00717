"""A job's history: every state change with its reason, oldest first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.reactive import reactive

from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import EventView

__all__ = ["Timeline", "event_rows"]


def event_rows(events: Sequence[EventView]) -> dict[str, tuple[Cell, ...]]:
    """One row per event, keyed by its sequence number."""
    rows: dict[str, tuple[Cell, ...]] = {}
    for e in events:
        if e.to_status and e.to_status != e.from_status:
            change = f"{e.from_status or ''} -> {e.to_status}".strip()
        else:
            change = e.kind
        rows[str(e.seq)] = (fmt.clock(e.at), change, fmt.text(e.attempt), fmt.one_line(e.reason, 200))
    return rows


class Timeline(KeyedTable):
    """The events in :attr:`events`."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("at", "TIME"),
        ("change", "CHANGE"),
        ("attempt", "ATTEMPT"),
        ("reason", "REASON"),
    )

    events: reactive[tuple[EventView, ...]] = reactive((), init=False)
    """The job's events, oldest first."""

    def watch_events(self, events: tuple[EventView, ...]) -> None:
        self.sync_rows(event_rows(events))
