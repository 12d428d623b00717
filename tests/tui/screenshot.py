"""Writes the README's screenshot of the TUI: ``.venv/bin/python -m tests.tui.screenshot [docs/tui.svg]``.

The app runs headless at 120x40 against the fake lab of the snapshot tests (fixed clock, TZ=UTC),
with the cursor on the job that waits for memory, and Textual saves the screen as SVG.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from tests.tui.test_snapshots import lab_app, loaded

SIZE = (120, 40)


async def save(path: Path) -> None:
    """Run the app, wait for the jobs, move to the waiting job, save the screen to ``path``."""
    app = lab_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await pilot.press("j")
        await pilot.pause()
        app.save_screenshot(filename=path.name, path=str(path.parent))


def main() -> None:
    """Write the screenshot to argv[1] (default docs/tui.svg)."""
    os.environ["TZ"] = "UTC"
    time.tzset()
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/tui.svg")
    asyncio.run(save(path))
    print(path)


if __name__ == "__main__":
    main()
