"""The daemon's settings: limits that contradict each other are refused at start, naming both
fields (issue 24's review: a reserve larger than its total was quietly shrunk)."""

from __future__ import annotations

import pytest

from gpulayerd.config import ConfigError, DaemonConfig


@pytest.mark.parametrize(("settings", "words"), [
    ({"local_max_connections": 10}, ["settings: local_reserved_connections (64) must be below "
                                     "local_max_connections (10)"]),
    ({"local_max_connections": 100, "local_reserved_connections": 100}, ["local_reserved_connections (100)"]),
    ({"peer_max_unauthenticated": 10000}, ["settings: peer_max_unauthenticated (10000) must be at most "
                                           "peer_max_connections (512)"]),
    ({"local_idle_timeout_s": float("inf")}, ["local_idle_timeout_s: Input should be less than or equal to 86400"]),
    ({"local_max_connections_per_user": 0}, ["local_max_connections_per_user: Input should be greater than or "
                                             "equal to 1"]),
])
def test_contradicting_or_out_of_range_limits_are_refused_naming_the_fields(settings: dict[str, object],
                                                                             words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        DaemonConfig.load(None, settings)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_limits_that_fit_are_kept() -> None:
    c = DaemonConfig.load(None, {"local_max_connections": 10, "local_reserved_connections": 2,
                                 "peer_max_connections": 100, "peer_max_unauthenticated": 100})
    assert (c.local_max_connections, c.local_reserved_connections, c.peer_max_unauthenticated) == (10, 2, 100)
