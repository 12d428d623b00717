"""The integration tests' fixtures: real gpulayerd processes (:mod:`tests.fakes.daemon_process`, the
one daemon-process harness), a lab per test or per module, logs printed when a test fails."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.daemon_process import (  # noqa: F401 (the tests import these from here)
    GPULAYER,
    GPULAYERD,
    REPO_ROOT,
    SETTINGS,
    START_TIMEOUT_S,
    TERMINAL,
    Daemon,
    FakeGpu,
    FakeGpus,
    Lab,
    clean_env,
    is_dead,
    kill_leftovers,
    live_group_members,
    wait_until,
)
from tests.fakes.envcache import drop_env_cache
from tests.fakes.slurm_cluster import SlurmCluster, running_slurm


@pytest.fixture(scope="session", autouse=True)
def _env_cache_cleanup() -> Iterator[None]:
    yield
    drop_env_cache()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """A fresh :class:`Lab`; teardown stops its daemons and kills every leftover process."""
    lab = Lab()
    try:
        yield lab
    finally:
        rep = getattr(request.node, "rep_call", None)
        lab.close(dump_logs=rep is None or rep.failed)


@pytest.fixture(scope="module")
def shared_lab() -> Iterator[Lab]:
    lab = Lab()
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def cpu_daemon(shared_lab: Lab) -> Daemon:
    """One CPU-only daemon shared by a module's tests that need nothing else."""
    return shared_lab.daemon(cpu_slots=2)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """A real one-node Slurm (:mod:`tests.fakes.slurm_cluster`: GRES ``gpu:a100:2``, partition ``gpu``),
    stopped after the module, every process it started with it."""
    with running_slurm() as cluster:
        yield cluster
