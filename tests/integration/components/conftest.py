"""Component tests: one part of gpulayerd at a time, with what unit tests may not use: real
processes (watchdogs, the zygote, probes, fake nvidia-smi executables), real sockets with real
timeouts, real time. The unit tests' fixtures (a fresh store, three daemons' services over the
loopback fakes) are here too, in place of the integration lab of real daemons."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

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
