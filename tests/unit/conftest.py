"""Fixtures of the unit tests: a fresh store, several daemons' services over the loopback fakes, and
the rule that keeps unit tests unit tests: no process started, no real sleep (see
:func:`no_processes_no_sleeps`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from gpulayerd.store import Store
from tests.fakes.daemons import Lab, three_daemons


@pytest_asyncio.fixture
async def lab(tmp_path: Path) -> AsyncIterator[Lab]:
    """An owner (1 CPU slot) and workers w1, w2 (2 each), up (see :func:`three_daemons`)."""
    async with three_daemons(tmp_path) as lab:
        yield lab


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh store in ``tmp_path``; at the end it must pass SQLite's integrity check."""
    s = await Store.open(tmp_path / "gpulayer.db")
    try:
        yield s
        assert await s.integrity_check() == "ok"
    finally:
        await s.close()


class _NotInUnitTests(AssertionError):
    """A unit test started a process or slept in real time: it belongs in tests/integration."""


@pytest.fixture(autouse=True)
def no_processes_no_sleeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a unit test that starts a process (``subprocess``, ``asyncio`` subprocesses, ``fork``,
    ``posix_spawn``) or sleeps in real time (``time.sleep``, ``asyncio.sleep`` above zero): unit tests
    are fast and deterministic; what needs real processes or real time is tests/integration's."""

    def no_process(*_a: object, **_kw: object) -> None:
        raise _NotInUnitTests("a unit test started a process: move it to tests/integration")

    real_async_sleep = asyncio.sleep

    def no_sleep(seconds: float, *_a: object) -> None:
        if seconds > 0:
            raise _NotInUnitTests(f"a unit test slept {seconds} s in real time: move it to tests/integration "
                                  "or use the fake clock")

    async def no_async_sleep(seconds: float, result: object = None) -> object:
        if seconds > 0:
            raise _NotInUnitTests(f"a unit test awaited asyncio.sleep({seconds}) in real time: move it to "
                                  "tests/integration or use the fake clock")
        return await real_async_sleep(0, result)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", no_process)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, no_process)
    monkeypatch.setattr(time, "sleep", no_sleep)
    monkeypatch.setattr(asyncio, "sleep", no_async_sleep)
    yield
