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


class _StoppedClock(Clock):
    """A clock whose monotonic time moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_an_ok_is_reused_briefly_and_anything_else_is_checked_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_isdir = machine.os.path.isdir
    calls: list[str] = []

    def isdir(path: str) -> bool:
        calls.append(path)
        return bool(real_isdir(path))

    monkeypatch.setattr(machine.os.path, "isdir", isdir)
    clock = _StoppedClock()
    checker = machine.PathChecker(clock, timeout_s=5.0)
    missing = str(tmp_path / "missing")
    assert [await checker.check(str(tmp_path)) for _ in range(3)] == ["ok"] * 3
    assert calls.count(str(tmp_path)) == 1  # one scheduling pass after another: one check
    assert [await checker.check(missing) for _ in range(2)] == ["missing"] * 2
    assert calls.count(missing) == 2
    clock.now += machine.PathChecker.OK_FRESH_S
    (tmp_path / "gone").mkdir()
    assert await checker.check(str(tmp_path / "gone")) == "ok"
    (tmp_path / "gone").rmdir()
    clock.now += machine.PathChecker.OK_FRESH_S  # no longer fresh: checked again, and found gone
    assert await checker.check(str(tmp_path / "gone")) == "missing"
    assert await checker.check(str(tmp_path)) == "ok"
    assert calls.count(str(tmp_path)) == 2
