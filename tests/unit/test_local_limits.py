"""The local socket's connection limits (issue 24): per account, in total, a share kept for root and
admins, and refusals logged once a minute per account with a count."""

from __future__ import annotations

import logging

import pytest

from gpulayerd.api.unixsite import LocalLimits, LocalSocketSettings

ROOT, ADMIN, MALLORY, BOB = 0, 1500, 2001, 2002


class _Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _limits(clock: _Clock) -> LocalLimits:
    return LocalLimits(LocalSocketSettings(max_connections=20, max_per_user=8, reserved=4,
                                           privileged=lambda uid: uid in (ROOT, ADMIN)), clock)


def test_one_account_gets_its_share_and_the_reserve_stays_for_root_and_admins() -> None:
    limits = _limits(_Clock())
    assert [limits.try_open(MALLORY) for _ in range(8)] == [None] * 8
    why = limits.try_open(MALLORY)
    assert why is not None and "uid 2001 has 8 connections open to gpulayerd (at most 8 per user" in why
    assert [limits.try_open(BOB) for _ in range(8)] == [None] * 8
    # 16 taken: the last 4 of 20 are root's and admins' only.
    why = limits.try_open(3000)
    assert why is not None and "at most 20, 4 of them kept for root and admins" in why
    assert limits.try_open(ADMIN) is None and limits.try_open(ROOT) is None
    # Root and admins have no share of their own: only the total bounds them (a personal daemon's
    # own account is privileged too: its scripts may open many connections at once).
    assert [limits.try_open(ROOT) for _ in range(2)] == [None, None] and limits.open_for(ROOT) == 3
    why = limits.try_open(ROOT)
    assert why is not None and "at most 20" in why
    for _ in range(3):
        limits.closed(ROOT, privileged=True)
    limits.closed(BOB, privileged=False)
    assert limits.try_open(3000) is None
    assert (limits.open_for(MALLORY), limits.open_for(BOB), limits.refused) == (8, 7, 3)
    for _ in range(8):
        limits.closed(MALLORY, privileged=False)
    limits.closed(MALLORY, privileged=False)  # more than it took: nothing happens
    assert limits.open_for(MALLORY) == 0 and limits.try_open(MALLORY) is None


def test_refusals_are_logged_once_a_minute_per_account_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    limits = _limits(clock)
    for _ in range(8):
        limits.try_open(MALLORY)
    with caplog.at_level(logging.WARNING, logger="gpulayerd.api.unixsite"):
        for _ in range(1000):
            limits.try_open(MALLORY)
        clock.now += 61.0
        limits.try_open(MALLORY)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "uid 2001" in lines[0] and "999 more" in lines[1], lines
