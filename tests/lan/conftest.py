"""Fixtures for LAN tests: ``lan3`` (three hosts) and ``lan_factory(n)``.

These tests need root and ``ip netns`` (plus nft, ping, unshare). They are never
skipped: without them every test here fails with a message saying what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.lan.harness import Lan, check_environment, sweep_stale


@pytest.fixture(scope="session", autouse=True)
def _lan_environment() -> Iterator[None]:
    problems = check_environment()
    if problems:
        pytest.fail("LAN tests need root, `ip netns`, nft, ping and unshare (CI runs them as root; "
                    "they are not skipped): " + "; ".join(problems), pytrace=False)
    sweep_stale()  # namespaces left by earlier, killed runs
    yield
    sweep_stale()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    rep = yield
    setattr(item, f"lan_rep_{rep.when}", rep)
    return rep


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "lan_rep_call", None)
    return rep is None or rep.failed


@pytest.fixture
def lan_factory(request: pytest.FixtureRequest) -> Iterator[Callable[..., Lan]]:
    """``lan_factory(n, ipv6=False, real_gpus=False)`` -> a started :class:`Lan` of ``n`` hosts,
    torn down after the test (daemon logs are printed when the test failed)."""
    lans: list[Lan] = []

    def make(n_hosts: int = 3, **kw: Any) -> Lan:
        lan = Lan(n_hosts, **kw)
        lans.append(lan)
        return lan.up()

    try:
        yield make
    finally:
        errors = []
        for lan in lans:
            try:
                lan.close(dump_logs=_failed(request))
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def lan3(lan_factory: Callable[..., Lan]) -> Lan:
    """Three hosts on one bridge, no daemon started yet."""
    return lan_factory(3)
