"""Helpers for TUI tests: read the screen as text, wait for a condition on the pilot's clock."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from rich.console import Console
from textual.app import App
from textual.pilot import Pilot


def screen_text(app: App[object]) -> str:
    """The current screen as plain text, as a terminal of the app's size would show it."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def wait_for(pilot: Pilot[object], predicate: Callable[[], bool], what: str,
                   timeout_s: float = 5.0, step_s: float = 0.02) -> float:
    """Pause the pilot until ``predicate()`` holds; returns the seconds it took.

    Raises:
        AssertionError: not within ``timeout_s``, with the screen as text.
    """
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{screen_text(pilot.app)}")
        await pilot.pause(step_s)
    return time.monotonic() - start
