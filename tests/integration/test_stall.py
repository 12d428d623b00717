"""An owner that stops answering must not stall the lease renewals of a worker's other jobs.

Two daemons in one cluster on 127.0.0.1. The owner has one CPU slot, which a blocker
keeps busy, so the N_RUNS jobs it gets next all run on the worker. Then the owner is
frozen with SIGSTOP (a machine powered off, seen from the network: its TCP stack still
accepts, nothing answers): every renewal of those runs now waits PEER_TIMEOUT_S for
nothing. A job of the worker itself, which no peer has any part in, must live on and
end as it would anyway: its own lease is renewed by its own daemon every second.

(The bug this reproduces: the lease loop renews and reports one run after another in
one pass per second, so one pass with an owner gone takes N_RUNS * PEER_TIMEOUT_S =
36 s, longer than the local job's lease, and its watchdog kills it.)
"""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import TERMINAL, Daemon, Lab, wait_until
from .loopback import loopback_cluster, node_id

N_RUNS = 12  # the owner's runs on the worker waiting for an answer
PEER_TIMEOUT_S = 3.0  # the default limit for one call to a peer
LEASE_S = 10.0  # the worker's own job; any lease under N_RUNS * PEER_TIMEOUT_S shows the stall (the issue says 30)
RUN_S = LEASE_S + 8.0  # that job runs well past its lease, which must be renewed meanwhile
REMOTE_LEASE_S = 300.0  # the owner's runs outlive the test: they keep waiting for the owner


def _hold(release: str) -> list[str]:
    return ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done"]


def _all_running_on(owner: Daemon, job_ids: list[str], worker_id: str) -> bool:
    jobs = {j.id: j for j in owner.call(lambda c: c.jobs())}
    return all(i in jobs and jobs[i].status == "running" and jobs[i].holder == worker_id for i in job_ids)


@pytest.mark.slow
def test_a_frozen_owner_does_not_stall_the_leases_of_the_workers_own_jobs(lab: Lab) -> None:
    owner, worker = loopback_cluster(lab, [1, N_RUNS + 2], {"peer_timeout_s": PEER_TIMEOUT_S})
    worker_id = node_id(worker)
    blocker = owner.call(lambda c: c.submit({"command": _hold("release-blocker"), "workdir": str(owner.work)}))
    assert owner.wait_status(blocker.id, {"running"}).holder == node_id(owner)
    remote_spec = {
        "command": _hold("release-remote"),
        "workdir": str(owner.work),
        "policy": {"lease_s": REMOTE_LEASE_S, "retries": 0},
    }
    remote = [owner.call(lambda c: c.submit(remote_spec)).id for _ in range(N_RUNS)]
    wait_until(
        lambda: _all_running_on(owner, remote, worker_id),
        60,
        f"{N_RUNS} jobs of the owner to run on the worker",
        interval_s=0.2,
    )

    local = worker.call(
        lambda c: c.submit(
            {
                "command": ["sleep", f"{RUN_S:g}"],
                "workdir": str(worker.work),
                "policy": {"lease_s": LEASE_S, "retries": 0},
            }
        )
    )
    worker.wait_status(local.id, {"running"})
    assert owner.proc is not None
    try:
        owner.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        job = worker.wait_status(local.id, TERMINAL, timeout_s=RUN_S + 20)
        after = time.monotonic() - stopped_at
        assert (job.status, job.exit_code) == ("succeeded", 0), (
            f"the worker's own job (lease {LEASE_S:g} s, runs {RUN_S:g} s) ended {job.status} "
            f"(exit {job.exit_code}) {after:.1f} s after the owner froze: {job.reason!r}"
        )
        assert [a.attempt for a in job.attempts] == [1]
    finally:
        owner.proc.send_signal(signal.SIGCONT)  # the lab's teardown then stops both daemons and their jobs
