"""Job arrays and dependencies across a LAN of three daemons (issue 32): an array's ``%3`` holds
lab-wide while its tasks spread over the hosts, every task sees its index, and ``--after`` names a
job another host owns (an array that succeeds; a job that fails ends the dependent one
``cancelled``).

One cluster of three hosts (two CPU slots each, no GPU) serves both tests.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lan.harness import FAST_CLUSTER, Host, Lan

QUIET = "INFO"
MDNS = ["--interface", "eth0"]
ACTIVE = ("queued", "claimed", "running")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Lan]:
    lan = Lan(3)
    ok = False
    try:
        lan.up()
        lan.form_cluster()
        for h in lan.hosts:
            h.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=2, log_level=QUIET, wait=False)
        for h in lan.hosts:
            h.wait_daemon()
        lan.wait_cluster(timeout_s=20)
        yield lan
        ok = True
    finally:
        lan.close(dump_logs=not ok)


def _busy_slots(h: Host) -> int:
    """CPU slots of ``h``'s worker held now (its own report)."""
    caps = h.api(lambda c: c.devices())
    assert caps.cpu_slots_total is not None and caps.cpu_slots_free is not None
    return caps.cpu_slots_total - caps.cpu_slots_free


def _task_script(shared: Path) -> str:
    """A task: marks itself running in ``shared``/run, records how many ran at once and where, and
    its index variables; sleeps 0.3 s."""
    return (f"cd {shared} && touch run/{{task}} && ls run | wc -l > seen/{{task}} && "
            f"echo $GPULAYER_ARRAY_ID $GPULAYER_ARRAY_TASK_ID $GPULAYER_ARRAY_TASK_COUNT $(hostname) > idx/{{task}} "
            f"&& sleep 0.3; rm -f run/{{task}}")


def test_an_array_of_20_with_max_3_spreads_over_hosts_and_a_peer_waits_for_it(cluster: Lan) -> None:
    h1, h2, h3 = cluster.hosts
    shared = cluster.root / "array"
    for d in ("run", "seen", "idx"):
        (shared / d).mkdir(parents=True)
    array = h1.submit({"command": ["sh", "-c", _task_script(shared)], "array": "0-19%3"}).id
    # A job of h3 that waits for h1's array (every task ok).
    after = h3.submit({"command": ["true"], "after": [f"{array}:ok"]}).id
    waiting = cluster.wait(lambda: (v := h3.job(after)).reason.startswith("Dependency: after ") and v,
                           timeout_s=10, what="the dependent job to say why it waits")
    assert waiting.status == "queued" and waiting.reason.startswith(f"Dependency: after {array} ("), waiting.reason
    # While a task runs, h3 says so (the array's owner shows it running; it runs on no one host).
    cluster.wait(lambda: h3.job(after).reason == f"Dependency: after {array} (running at {h1.hostname})",
                 timeout_s=10, what="the dependent job to say the array runs")

    most_busy = most_active = 0
    end = time.monotonic() + 60
    while True:
        view = h1.job(array)
        assert view.array is not None
        most_active = max(most_active, sum(view.array.counts.get(s, 0) for s in ACTIVE))
        most_busy = max(most_busy, sum(_busy_slots(h) for h in cluster.hosts))
        if view.status not in ACTIVE:
            break
        assert time.monotonic() < end, f"the array does not end: {view.array}"
        time.sleep(0.05)
    assert (view.status, view.reason) == ("succeeded", "all 20 tasks succeeded")
    assert most_active <= 3 and most_busy <= 3, (most_active, most_busy)
    assert max(int((shared / "seen" / str(i)).read_text()) for i in range(20)) <= 3

    where: collections.Counter[str] = collections.Counter()
    for i in range(20):
        array_id, index, count, host = (shared / "idx" / str(i)).read_text().split()
        assert (array_id, index, count) == (array, str(i), "20")
        where[host] += 1
    assert len(where) >= 2, f"every task ran on one host: {dict(where)}"  # h1 has 2 slots, %3 needs a peer

    done = h3.wait_job(after, timeout_s=20)
    assert done.status == "succeeded", done.reason
    started = done.attempts[0].started_at
    tasks = [h1.job(f"{array}_{i}") for i in range(20)]
    assert all(t.status == "succeeded" for t in tasks)
    last_end = max(t.attempts[-1].ended_at or 0.0 for t in tasks)
    assert started is not None and started >= last_end, (started, last_end)
    listed = h2.cli_ok("jobs", "--all")  # a peer's listing of the cluster: the array is one line
    assert "all 20 tasks succeeded" in listed and f"{array}_" not in listed, listed
    print(f"20 tasks %3 on {dict(where)}; at once: {most_active} listed, {most_busy} slots held")


def test_after_a_peers_job_that_fails_ends_cancelled(cluster: Lan) -> None:
    _, h2, h3 = cluster.hosts
    failing = h2.submit({"command": ["sh", "-c", "sleep 0.5; exit 3"]}).id
    waiting = h3.submit({"command": ["true"], "after": [failing]}).id
    done = h3.wait_job(waiting, timeout_s=20)
    assert (done.status, done.reason) == ("cancelled", f"DependencyNeverSatisfied: {failing} failed")
    assert not done.attempts
    notok = h3.submit({"command": ["true"], "after": [f"{failing}:notok"]}).id
    assert h3.wait_job(notok, timeout_s=20).status == "succeeded"
