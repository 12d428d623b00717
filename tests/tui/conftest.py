"""Fixtures of the TUI tests: UTC time, and one real gpulayerd shared by the session."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.tui.daemon import RealDaemon


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every TUI test runs with TZ=UTC (clock times in snapshots and timelines)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(scope="session")
def real_daemon() -> Iterator[RealDaemon]:
    """A gpulayerd on a temporary state dir (CPU only: no GPU here), stopped at the end.

    A test that stops it must start it again on the same state dir before it returns.
    """
    daemon = RealDaemon()
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()
