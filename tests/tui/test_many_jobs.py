"""The jobs view with many jobs (a fake daemon): changes read in batches, old finished jobs hidden."""

from __future__ import annotations

import pytest

from gpulayer_tui.app import GpulayerApp, TuiSettings, make_app
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.models import FINISHED_SHOWN, JobView
from gpulayerd.models.jobs_query import MAX_IDS
from tests.tui.fake_client import NOW, FakeDaemonClient, make_job
from tests.tui.helpers import screen_text, wait_for

FAST = TuiSettings(retry_s=0.05, log_poll_s=60.0, age_refresh_s=0)
STATES = ("queued", "queued", "queued", "running", "succeeded", "failed", "cancelled")


def main_screen(app: GpulayerApp) -> MainScreen:
    return next(s for s in app.screen_stack if isinstance(s, MainScreen))


def table(app: GpulayerApp) -> JobsTable:
    return main_screen(app).query_one(JobsTable)


def many_jobs(n: int) -> list[JobView]:
    return [make_job(f"m8big{i:07d}", STATES[i % len(STATES)], name=f"sweep-{i % 97}", age_s=(n - i) * 3.0,
                     owner=("alice", "bob")[i % 2], holder_name="lab-ws-02" if STATES[i % len(STATES)] == "running"
                     else None)
            for i in range(n)]


@pytest.mark.asyncio
async def test_ten_thousand_jobs_and_a_burst_of_changes_are_read_in_a_few_batched_requests() -> None:
    jobs = many_jobs(10_000)
    fake = FakeDaemonClient(jobs=jobs)
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    finished = sum(1 for j in jobs if j.status in ("succeeded", "failed", "cancelled"))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: table(app).row_count == 10_000 - finished + FINISHED_SHOWN, "the first load",
                       timeout_s=20)
        # A fair-share tick: every waiting job's reason changes at once (one change each, pushed together) ...
        waiting = [j for j in jobs if j.status == "queued"]
        for k, j in enumerate(waiting):
            fake.put_job(j.model_copy(update={"reason": f"Fair share: tick 1 ({k})"}))
        # ... then a trickle: jobs start, one is cancelled, new ones come, one is removed.
        started = [j.model_copy(update={"status": "running", "holder_name": "dgx-spark", "attempt": 1,
                                        "reason": "started"}) for j in waiting[:300]]
        new = [make_job(f"m8new{i:07d}", name="late", age_s=0) for i in range(200)]
        cancelled = waiting[-1].model_copy(update={"status": "cancelled", "reason": "cancelled by bob"})
        await fake.feed([*started, cancelled, *new], per_s=2_000)
        del fake.jobs_by_id[waiting[-2].id]
        fake.push("job", waiting[-2].id)
        changes = len(waiting) + len(started) + 1 + len(new) + 1
        await wait_for(pilot, lambda: app.changes_applied >= 1 + changes, "every change applied", timeout_s=20)

        t = table(app)
        reads = fake.count("jobs?ids")
        assert reads == app.job_reads
        assert len(waiting) // MAX_IDS + 1 <= reads <= 60, f"{reads} reads for {changes} changes"
        assert max(len(c) - 1 for c in fake.calls if c[0] == "jobs?ids") <= MAX_IDS
        assert fake.count("jobs") == 1 and fake.count("job") == 0  # never the whole queue, never one by one
        # the table shows the final state of every job
        assert t.cells(waiting[0].id).state == "running" and t.cells(waiting[0].id).where.startswith("dgx-spark")
        assert t.cells(waiting[400].id).reason == "Pending: Fair share: tick 1 (400)"
        assert t.cells(cancelled.id).state == "cancelled"  # the latest finished job: shown
        assert waiting[-2].id not in t.jobs and waiting[-2].id not in t.shown_ids
        assert t.shown_ids[-200:] == [j.id for j in new]
        assert t.row_count == 10_000 + len(new) - 1 - (finished + 1) + FINISHED_SHOWN
        # what the screen shows is the table's final state too
        t.select_job(waiting[400].id)
        await pilot.pause()
        assert "Fair share: tick 1 (400)" in screen_text(app)


@pytest.mark.asyncio
async def test_old_finished_jobs_are_hidden_as_in_the_cli_and_a_shows_them() -> None:
    jobs = [make_job("m8run0000001", "running", holder_name="lab-ws-02", age_s=20_000)]
    jobs += [make_job(f"m8fin{i:07d}", ("succeeded", "failed")[i % 2], name=f"done-{i}", age_s=10_000 - i)
             for i in range(30)]
    jobs.append(make_job("m8que0000001", "queued", age_s=10))
    fake = FakeDaemonClient(jobs=jobs)
    app = make_app(fake, clock=lambda: NOW, settings=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: table(app).row_count == 22, "the first load")
        t = table(app)
        latest = [j.id for j in jobs[11:31]]  # the 20 latest finished, in submission order
        assert t.shown_ids == ["m8run0000001", *latest, "m8que0000001"]
        assert t.hidden_count == 10
        assert "22 of 32 jobs (10 older finished hidden, a shows them) · sort:" in screen_text(app)
        await pilot.press("a")
        await wait_for(pilot, lambda: t.row_count == 32, "every finished job")
        assert t.hidden_count == 0 and "32 jobs ·" in screen_text(app)
        await pilot.press("a")
        await wait_for(pilot, lambda: t.row_count == 22, "the latest finished jobs again")
        # the running job ends: it is the oldest finished job now, so it is hidden at once (as in gpulayer jobs)
        fake.put_job(jobs[0].model_copy(update={"status": "succeeded", "reason": "exited 0"}))
        await wait_for(pilot, lambda: t.hidden_count == 11, "the job that ended hidden")
        assert "m8run0000001" not in t.shown_ids and t.row_count == 21
        # a new finished job pushes the oldest shown one out
        fake.put_job(make_job("m8fin0000099", "failed", age_s=1))
        await wait_for(pilot, lambda: "m8fin0000099" in t.shown_ids, "the new finished job")
        assert jobs[11].id not in t.shown_ids and t.hidden_count == 12 and t.row_count == 21
        # a state filter shows every job in that state (as gpulayer jobs --state); a word filter does not
        t.filter_text = "state:failed"
        assert t.row_count == 16 and t.hidden_count == 0
        t.filter_text = "done"  # the 30 named done-N: the latest 20 of them
        assert t.shown_ids == [j.id for j in jobs[11:31]] and t.hidden_count == 10
