"""Reasons change only when the decision does (issue 28): with 2,000 waiting GPU jobs of three users
and one user's usage rising over 10 fair-share ticks, no pass writes a reason, since the words name who
holds the devices and who goes first, never decaying figures. Driven through the scheduler's pure core
(the harness of tests/unit/test_scheduling_core.py); every write there is one job change event."""

from __future__ import annotations

from gpulayerd.core.fairshare import Usage
from gpulayerd.core.types import Accelerator, JobRequest
from tests.unit.test_scheduling_core import Job, SchedulerMachine, drive


def test_2000_waiting_jobs_get_no_reason_change_from_fair_share_ticks() -> None:
    m = SchedulerMachine()
    users = ("alice", "bob", "carol")
    for n in range(1, 2001):
        job_id = f"job-{n:04d}"
        m.lab.jobs[job_id] = Job(JobRequest(job_id=job_id, accelerator=Accelerator.CUDA, gpu_count=1,
                                            user=users[n % 3]), n)
        m.lab.event(job_id)
    claims, writes, _ = drive(m.core, m.lab, [])
    assert len(claims) == 3  # the three GPUs; 1,997 jobs wait
    waiting = [j for j in m.lab.jobs.values() if j.status == "queued"]
    assert len(waiting) == 1997 and all(j.reason.startswith("Resources: GPU 0 is granted to job ") for j in waiting)
    feed = 0
    for tick in range(1, 11):  # bob's usage rises; alice stays the lowest: the users' order never changes
        m.lab.usage.update({"alice": Usage(gpu_s=0.0), "bob": Usage(gpu_s=tick * 360.0),
                            "carol": Usage(gpu_s=5 * 3600.0)})
        m.lab.now += 60.0
        _, writes, _ = drive(m.core, m.lab, [])
        feed += len(writes)
    assert feed == 0
