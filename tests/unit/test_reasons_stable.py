"""Reasons change only when the decision does (issue 28): with 2,000 waiting GPU jobs of three users
and one user's usage rising over 10 fair-share ticks, no pass writes a reason, since the words name who
holds the devices and who goes first (issue 31: ``FairShare`` when a user with less usage waits ahead,
the holders still named), never decaying figures. Driven through the scheduler's pure core
(the harness of tests/unit/test_scheduling_core.py); every write there is one job change event."""

from __future__ import annotations

from gpulayerd.core.fairshare import Usage
from gpulayerd.core.types import Accelerator, JobRequest
from tests.unit.test_scheduling_core import Job, SchedulerMachine, drive


def test_2000_waiting_jobs_get_no_reason_change_from_fair_share_ticks() -> None:
    m = SchedulerMachine()
    users = ("alice", "bob", "carol")
    m.lab.usage.update({"alice": Usage(gpu_s=0.0), "bob": Usage(gpu_s=1.0), "carol": Usage(gpu_s=5 * 3600.0)})
    for n in range(1, 2001):
        job_id = f"job-{n:04d}"
        m.lab.jobs[job_id] = Job(JobRequest(job_id=job_id, accelerator=Accelerator.CUDA, gpu_count=1,
                                            user=users[n % 3]), n)
        m.lab.event(job_id)
    claims, writes, _ = drive(m.core, m.lab, [])
    assert len(claims) == 3  # the three GPUs, to alice (the least usage); 1,997 jobs wait
    waiting = [j for j in m.lab.jobs.values() if j.status == "queued"]
    assert len(waiting) == 1997
    # alice (the least usage) waits only for the holders; bob and carol wait behind alice's queued jobs.
    held = "GPU 0 is granted to job job-0003; GPU 1 is granted to job job-0006; GPU 2 is granted to job job-0009"
    for j in waiting:
        if j.req.user == "alice":
            assert j.reason == f"Resources: {held} (on node-me)", j.reason
        else:
            assert j.reason == (f"FairShare: fair share: alice's jobs go first (less recent GPU use than {j.req.user});"
                                f" {held} (on node-me)"), j.reason
    feed = 0
    for tick in range(1, 11):  # bob's usage rises; alice stays the lowest: the users' order never changes
        m.lab.usage.update({"alice": Usage(gpu_s=0.0), "bob": Usage(gpu_s=tick * 360.0),
                            "carol": Usage(gpu_s=5 * 3600.0)})
        m.lab.now += 60.0
        _, writes, _ = drive(m.core, m.lab, [])
        feed += len(writes)
    assert feed == 0
