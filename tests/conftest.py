"""Fixtures for every test.

``no_blocking_calls``: an async test fails if code of ``gpulayerd`` or ``gpulayer_tui``
makes a blocking call on its event loop (file and socket I/O, ``os.stat``,
``time.sleep``, sqlite3, ... as the ``blockbuster`` library lists them): such a call
freezes the API, the leases and the heartbeats together. Blocking work belongs in a
thread (``asyncio.to_thread``) or a subprocess.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator

import pytest
from blockbuster import blockbuster_ctx

SCANNED = ["gpulayerd", "gpulayer_tui"]


@pytest.fixture(autouse=True)
def no_blocking_calls(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the async test if our code blocks its event loop (see the module docstring)."""
    if not inspect.iscoroutinefunction(getattr(request, "function", None)):
        yield
        return
    with blockbuster_ctx(SCANNED) as bb:
        # Textual resolves the app's stylesheet path once, in App.__init__ (library code).
        for name in ("os.path.abspath", "os.stat"):
            bb.functions[name].can_block_in("textual/_path.py", {"_make_path_object_relative"})
        yield


# Real local accounts and gpulayer runnable by them (tests/fakes/accounts.py).
from tests.fakes.accounts import accounts, shared_python  # noqa: E402, F401

# ----------------------------------------------------------------------- time per folder, slow tests

_SPENT: dict[str, list[float]] = {}  # tests/<folder> -> [CPU s of this process, wall s]
_SLOW_UNMARKED: list[tuple[str, float]] = []
SLOW_S = 1.0
"""A test taking longer than this (wall) is ``slow``: every test outside tests/unit is marked so
(real processes, sockets, daemons); a unit test must be marked by hand (the summary names any that
is not)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test outside tests/unit ``slow`` (``-m "not slow"``: the unit tests alone)."""
    del config
    for item in items:
        if "/tests/unit/" not in str(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Add each test's CPU time (this process) and wall time to its folder's total."""
    del nextitem
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        return (yield)
    finally:
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        parts = item.path.parts
        folder = "/".join(parts[parts.index("tests"):parts.index("tests") + 2]) if "tests" in parts else "?"
        spent = _SPENT.setdefault(folder, [0.0, 0.0])
        spent[0] += cpu
        spent[1] += wall
        if folder == "tests/unit" and wall > SLOW_S and item.get_closest_marker("slow") is None:
            _SLOW_UNMARKED.append((item.nodeid, wall))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print CPU and wall time per test folder (scripts/test's budget lines), and unmarked slow unit tests."""
    if not _SPENT:
        return
    terminalreporter.section("time per folder (CPU of the pytest process, wall)")
    for folder, (cpu, wall) in sorted(_SPENT.items()):
        terminalreporter.write_line(f"{folder}: {cpu:.1f} s CPU, {wall:.1f} s wall")
    for nodeid, wall in _SLOW_UNMARKED:
        terminalreporter.write_line(f"unit test over {SLOW_S:g} s without the slow marker ({wall:.2f} s): {nodeid}")
