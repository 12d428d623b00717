"""The simulator's tests keep the blocking-call check, except for its in-loop SQLite driver.

:mod:`tests.sim.store` runs the store's statements in the event loop's thread on purpose (an
in-memory database, so that the simulation knows when all work waits on simulated time):
blocking calls made under its methods are allowed; every other one still fails the test.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from blockbuster import blockbuster_ctx

from tests.conftest import SCANNED

_DRIVER = ("tests/sim/store.py", {"execute", "execute_fetchall", "_execute", "create_function", "close", "connect",
                                  "fetchall", "__aexit__"})


@pytest.fixture(autouse=True)
def no_blocking_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """As ``tests/conftest.py``'s, with the in-loop SQLite driver's calls allowed."""
    if not inspect.iscoroutinefunction(getattr(request, "function", None)):
        yield
        return
    with blockbuster_ctx(SCANNED) as bb:
        for fn in bb.functions.values():
            fn.can_block_in(*_DRIVER)
        yield
