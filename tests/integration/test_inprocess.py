"""The daemon run inside the test's event loop, so that the blocking-call fixture watches its code.

Every other integration test runs gpulayerd as a subprocess, out of reach of the
``no_blocking_calls`` fixture (``tests/conftest.py``). Here :func:`gpulayerd.daemon.run`
is a task of the test's own loop: a blocking call (file or socket I/O, ``os.stat``,
``time.sleep``, ...) anywhere in the daemon's code raises ``BlockingError``, which the
API answers as a 500 (the client raises it), the supervisor logs as a failed loop, or
the start-up raises. The tests drive the daemon through :class:`DaemonClient` like the
CLI does and check the daemon's log for ``BlockingError`` at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from gpulayerd import daemon
from gpulayerd.api.client import ApiRequestError, DaemonClient
from gpulayerd.config import DaemonConfig
from gpulayerd.models import JobView
from tests.fakes.envcache import keep_env_cache, seed_env_cache

from .conftest import TERMINAL, kill_leftovers

START_TIMEOUT_S = 30.0  # the first environment probe imports torch (~2 s, more on a loaded machine)
STOP_TIMEOUT_S = 10.0

_T = TypeVar("_T")


@dataclass
class Running:
    """One in-process daemon: its task and the events that start and stop it."""

    config: DaemonConfig
    task: asyncio.Task[None]
    stop: asyncio.Event
    client: DaemonClient


@pytest.fixture
def root() -> Iterator[Path]:
    """A short temporary root (unix socket paths are limited to ~100 bytes); teardown kills
    every process left under it (watchdogs and jobs) and removes it."""
    path = Path(tempfile.mkdtemp(prefix="glip-", dir="/tmp"))
    (path / "work").mkdir()
    try:
        yield path
    finally:
        runs = path / "state" / "runs"
        job_ids = {p.name for p in runs.iterdir()} if runs.is_dir() else set()
        kill_leftovers(path, job_ids)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Everything gpulayerd logs (aiohttp too: a handler's exception lands there)."""
    caplog.set_level(logging.DEBUG, logger="gpulayerd")
    caplog.set_level(logging.WARNING)
    return caplog


def make_config(root: Path) -> DaemonConfig:
    return DaemonConfig(
        state_dir=root / "state", device_lock_dir=root / "locks", cpu_slots=2,
        interpreters=[sys.executable], mdns=False, cancel_grace_s=1.0, watchdog_poll_interval_s=0.1,
        schedule_interval_s=0.5, probe_interval_s=300.0,
    )


@contextlib.asynccontextmanager
async def running(config: DaemonConfig) -> AsyncIterator[Running]:
    """:func:`gpulayerd.daemon.run` as a task of this loop, answering ``devices`` (the first
    probe is done); on exit, ``stop`` is set and the task awaited (cancelled if it hangs)."""
    await asyncio.to_thread(seed_env_cache, config.state_dir)
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(daemon.run(config, stop=stop, ready=ready), name="gpulayerd")
    try:
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({task, waiter}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task in done:
            task.result()  # raises what the start-up raised
            raise AssertionError("gpulayerd.daemon.run returned before it was ready")
        assert waiter in done, f"gpulayerd was not ready within {START_TIMEOUT_S} s"
        async with DaemonClient(config.socket_path, timeout_s=START_TIMEOUT_S) as client:
            await client.devices()  # answers once the first probe (hardware + environments) is done
            await asyncio.to_thread(keep_env_cache, config.state_dir)
            yield Running(config, task, stop, client)
    finally:
        stop.set()
        stopped, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not stopped:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise AssertionError(f"gpulayerd did not stop within {STOP_TIMEOUT_S} s")
        await task  # raises what the daemon raised, with its traceback


async def poll(fn: Callable[[], Awaitable[_T]], done: Callable[[_T], bool], what: str,
               timeout_s: float = 20.0) -> _T:
    end = time.monotonic() + timeout_s
    while True:
        value = await fn()
        if done(value):
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {value!r}")
        await asyncio.sleep(0.05)


async def wait_status(client: DaemonClient, job_id: str, statuses: Collection[str],
                      timeout_s: float = 20.0) -> JobView:
    """Poll the job until its status is in ``statuses``; fails early on another final status."""
    def settled(job: JobView) -> bool:
        if job.status in TERMINAL and job.status not in statuses:
            raise AssertionError(f"job {job_id} is {job.status} ({job.reason!r}), wanted {sorted(statuses)}")
        return job.status in statuses

    return await poll(lambda: client.job(job_id), settled, f"job {job_id} to be {sorted(statuses)}", timeout_s)


def spec(root: Path, *command: str, **extra: object) -> dict[str, object]:
    return {"command": list(command), "workdir": str(root / "work"), **extra}


def job_pids(job_id: str) -> set[int]:
    """Pids of the live processes started for ``job_id`` (they carry it as GPULAYER_JOB_ID)."""
    pids = set()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("GPULAYER_JOB_ID") == job_id:
                pids.add(p.pid)
    return pids


def assert_no_blocking_error(log: pytest.LogCaptureFixture) -> None:
    assert "BlockingError" not in log.text, f"the daemon blocked its event loop:\n{log.text[-6000:]}"


@pytest.mark.asyncio
async def test_the_daemon_serves_jobs_without_blocking_its_loop(
        root: Path, daemon_log: pytest.LogCaptureFixture) -> None:
    config = make_config(root)
    async with running(config) as d:
        c = d.client
        health = await c.health()
        assert health.state_dir == str(config.state_dir)
        devices = await c.devices()
        assert devices.cpu_count >= 1
        assert await asyncio.to_thread(config.pid_path.read_text) == f"{os.getpid()}\n"
        with pytest.raises(daemon.DaemonAlreadyRunning):
            await daemon.run(config, stop=asyncio.Event())  # one daemon per state dir

        ok = await c.submit(spec(root, sys.executable, "-c", "print('hi')", name="hi"), submitted_by="test")
        done = await wait_status(c, ok.id, {"succeeded"})
        assert done.exit_code == 0
        chunk = await c.logs(ok.id)
        assert chunk.data == "hi\n"
        chunk = await c.logs(ok.id, offset=1, limit=1)  # a window: the chunk says the log's size
        assert (chunk.data, chunk.next_offset, chunk.size, chunk.complete) == ("i", 2, 3, False)
        for bad in (0, -5, (1 << 20) + 1):
            with pytest.raises(ApiRequestError, match="limit must be 1 to 1048576 bytes") as e:
                await c.logs(ok.id, limit=bad)
            assert e.value.status == 400

        long = await c.submit(spec(root, "sleep", "60", name="long"))
        await wait_status(c, long.id, {"running"})
        await c.cancel(long.id)
        cancelled = await wait_status(c, long.id, {"cancelled"})
        assert cancelled.cancel_requested

        why = await c.explain(ok.id)
        assert why.job_id == ok.id
        listed = await c.jobs(statuses=list(TERMINAL))
        assert {j.id for j in listed} >= {ok.id, long.id}
    assert d.task.done() and d.task.exception() is None
    assert not config.pid_path.exists()
    assert_no_blocking_error(daemon_log)


@pytest.mark.asyncio
async def test_a_restarted_daemon_re_adopts_a_running_job_without_blocking_its_loop(
        root: Path, daemon_log: pytest.LogCaptureFixture) -> None:
    config = make_config(root)
    async with running(config) as d:
        job = await d.client.submit(spec(root, "sleep", "60", name="survivor"))
        started = await wait_status(d.client, job.id, {"running"})
        pids = await poll(lambda: asyncio.to_thread(job_pids, job.id), bool, "the job's processes")
    assert await asyncio.to_thread(job_pids, job.id) == pids, "the job's processes changed with the daemon's stop"

    async with running(config) as d:
        adopted = await poll(lambda: d.client.job(job.id), lambda j: any(e.kind == "adopted" for e in j.events),
                             "the re-adoption event", timeout_s=10.0)
        assert (adopted.status, adopted.attempt) == ("running", started.attempt)
        assert await asyncio.to_thread(job_pids, job.id) == pids
        await d.client.cancel(job.id)
        await wait_status(d.client, job.id, {"cancelled"})
    assert_no_blocking_error(daemon_log)
    assert not config.pid_path.exists()


@pytest.mark.asyncio
async def test_the_end_of_a_job_is_recorded_after_its_start_however_fast_it_ends(
        root: Path, daemon_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job can end before its start is stored: its end waits for that write (no race for the job's
    row, no second read and write), and its history reads claimed, running, then succeeded."""
    from gpulayerd.app.common.owned_jobs import OwnedJobs

    started, retried = OwnedJobs.started, []
    apply = OwnedJobs.apply

    async def slow_start(self: OwnedJobs, *args: object, **kwargs: object) -> None:
        await asyncio.sleep(0.5)  # /bin/true has long ended by now
        await started(self, *args, **kwargs)  # type: ignore[arg-type]

    async def counted(self: OwnedJobs, job_id: str, event: object, kind: str = "state") -> object:
        retried.append(type(event).__name__)
        return await apply(self, job_id, event, kind)  # type: ignore[arg-type]

    monkeypatch.setattr(OwnedJobs, "started", slow_start)
    monkeypatch.setattr(OwnedJobs, "apply", counted)
    config = make_config(root)
    async with running(config) as d:
        ids = [(await d.client.submit(spec(root, "/bin/true"))).id for _ in range(3)]
        for job_id in ids:
            view = await wait_status(d.client, job_id, {"succeeded"})
            moves = [(e.from_status, e.to_status) for e in view.events if e.to_status != e.from_status]
            assert moves[-3:] == [("queued", "claimed"), ("claimed", "running"), ("running", "succeeded")], moves
            [attempt] = view.attempts
            assert attempt.state == "exited" and attempt.exit_code == 0
    assert "RunExited" not in retried and "RunStarted" not in retried
    assert_no_blocking_error(daemon_log)
