"""Figures for the TUI: ``python bench/tui.py``.

Prints, against a fake daemon (tests/tui/fake_client.py) holding 1,000 and 10,000 jobs:

- first paint: from starting the app (headless, 120x40) until the Jobs table holds every
  job and a whole frame has been composed (target 150 ms at 1,000 jobs);
- one job update: from the daemon's ``job`` change to the next composed frame, that is,
  fetch the job, update its changed cells, compose the frame (target 16 ms; median and
  worst of 50 updates at 10,000 jobs).

It asserts nothing; figures depend on the machine (printed first).
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from gpulayerd.api.client import ChangeEvent
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job, make_peer
from tui.app import GpulayerApp, TuiSettings, make_app
from tui.widgets.jobs_table import JobsTable

SIZE = (120, 40)
SETTINGS = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0)
STATES = ("queued", "queued", "running", "succeeded", "failed", "cancelled")
FIRST_PAINT_TARGET_MS = 150.0
UPDATE_TARGET_MS = 16.0


def fake_daemon(n_jobs: int) -> FakeDaemonClient:
    jobs = [
        make_job(f"m8bench{i:06d}", STATES[i % len(STATES)], name=f"sweep-{i % 97}", owner=("alice", "bob")[i % 2],
                 holder_name="lab-ws-02" if STATES[i % len(STATES)] == "running" else None,
                 age_s=30.0 + (n_jobs - i) * 7.0,
                 reason="fits nowhere we know: no worker has a CUDA GPU with >= 40.0 GB dedicated memory")
        for i in range(n_jobs)
    ]
    peers = [make_peer(name) for name in ("lab-ws-02", "dgx-spark", "old-ws-07", "h100-box", "mac-studio")]
    return FakeDaemonClient(jobs=jobs, peers=peers)


def compose_frame(app: GpulayerApp) -> None:
    """Compose the whole screen, as the driver would for the next frame."""
    app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)


def table_of(app: GpulayerApp) -> JobsTable:
    return app.screen.query_one(JobsTable)


async def first_paint_ms(n_jobs: int) -> float:
    fake = fake_daemon(n_jobs)
    start = time.perf_counter()
    app = make_app(fake, clock=lambda: NOW, settings=SETTINGS)
    async with app.run_test(size=SIZE) as pilot:
        while not (app.state.connection.state == "connected" and table_of(app).row_count == n_jobs):
            await asyncio.sleep(0)
        await pilot.pause()  # let the table measure its new rows (on idle)
        compose_frame(app)
        elapsed = time.perf_counter() - start
        await pilot.press("q")
    return elapsed * 1000


async def update_ms(n_jobs: int, n_updates: int = 50) -> list[float]:
    fake = fake_daemon(n_jobs)
    app = make_app(fake, clock=lambda: NOW, settings=SETTINGS)
    times: list[float] = []
    async with app.run_test(size=SIZE) as pilot:
        while table_of(app).row_count != n_jobs:
            await pilot.pause(0.01)
        await pilot.pause()
        compose_frame(app)
        for k in range(n_updates):
            i = (k * 7919) % n_jobs
            old = fake.jobs_by_id[f"m8bench{i:06d}"]
            status = "running" if old.status != "running" else "succeeded"
            fake.put_job(old.model_copy(update={"status": status, "reason": f"update {k}",
                                                "holder_name": "dgx-spark"}), notify=False)
            start = time.perf_counter()
            await app.apply_change(ChangeEvent(kind="job", key=old.id))
            compose_frame(app)
            times.append((time.perf_counter() - start) * 1000)
            await pilot.pause()
        await pilot.press("q")
    return times


def best_of(n: int, n_jobs: int) -> float:
    return min(asyncio.run(first_paint_ms(n_jobs)) for _ in range(n))


def main() -> None:
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    asyncio.run(first_paint_ms(10))  # warm up imports and the CSS parser
    for n_jobs in (1_000, 10_000):
        ms = best_of(3, n_jobs)
        target = f" (target {FIRST_PAINT_TARGET_MS:.0f} ms: {'ok' if ms <= FIRST_PAINT_TARGET_MS else 'MISSED'})" \
            if n_jobs == 1_000 else ""
        print(f"first paint, {n_jobs:>6,} jobs: {ms:8.1f} ms (best of 3){target}")
    for n_jobs in (1_000, 10_000):
        times = asyncio.run(update_ms(n_jobs))
        median = statistics.median(times)
        verdict = "ok" if median <= UPDATE_TARGET_MS else "MISSED"
        print(f"one job update, {n_jobs:>6,} jobs: median {median:6.2f} ms, worst {max(times):6.2f} ms "
              f"over {len(times)} updates (target {UPDATE_TARGET_MS:.0f} ms: {verdict})")


if __name__ == "__main__":
    main()
