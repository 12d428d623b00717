"""PathChecker: a hung path never delays the check of another, and is not waited for twice."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.worker import machine


@pytest.mark.asyncio
async def test_hung_paths_never_delay_healthy_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real_isdir = machine.os.path.isdir
    calls: list[str] = []

    def isdir(path: str) -> bool:
        calls.append(path)
        if path.startswith("/hung"):
            release.wait(30)  # a dead NFS server: the call does not return
            return False
        return bool(real_isdir(path))

    monkeypatch.setattr(machine.os.path, "isdir", isdir)
    checker = machine.PathChecker(Clock(), timeout_s=0.3)
    try:
        hung = await asyncio.gather(*(checker.is_dir(f"/hung/user{i}") for i in range(8)))
        assert hung == [None] * 8
        # More hung paths than any thread pool would hold: a healthy path still answers.
        assert await checker.is_dir(str(tmp_path)) is True
        assert await checker.is_dir(str(tmp_path / "missing")) is False
        # A path known not to answer joins its running check instead of starting another.
        assert await checker.is_dir("/hung/user0") is None
        assert calls.count("/hung/user0") == 1
    finally:
        release.set()


@pytest.mark.asyncio
async def test_past_the_pending_limit_new_paths_are_unanswered(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    monkeypatch.setattr(machine.os.path, "isdir", lambda path: release.wait(30) and False)
    checker = machine.PathChecker(Clock(), timeout_s=0.1, max_pending=2)
    try:
        assert await asyncio.gather(checker.is_dir("/a"), checker.is_dir("/b")) == [None, None]
        assert await checker.is_dir("/c") is None
    finally:
        release.set()
