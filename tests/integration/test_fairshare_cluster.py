"""Fair share across machines: a node learns what its peers hold from their heartbeats.

Two daemons in one cluster on 127.0.0.1. A job owned by the founder runs on the other
daemon (the founder's one CPU slot is taken): the founder learns from the worker's
heartbeats that the job's user holds a CPU slot THERE (a run is reported by the node
that holds it, never by its owner), and ``gpulayer users`` shows it with usage growing.
"""

from __future__ import annotations

import getpass
import json

import pytest

from .conftest import Lab, wait_until
from .loopback import loopback_cluster, node_id


def _hold(release: str) -> list[str]:
    return ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done"]


@pytest.mark.slow
def test_usage_of_a_run_on_a_peer_is_learned_from_its_heartbeats(lab: Lab) -> None:
    owner, worker = loopback_cluster(lab, [1, 2])
    me = getpass.getuser()
    spec = {"command": _hold("release"), "workdir": str(owner.work), "policy": {"lease_s": 60, "retries": 0}}
    blocker = owner.call(lambda c: c.submit(spec))
    assert owner.wait_status(blocker.id, {"running"}).holder == node_id(owner)
    remote = owner.call(lambda c: c.submit(spec))
    assert owner.wait_status(remote.id, {"running"}, timeout_s=30).holder == node_id(worker)

    def holds_on_both() -> bool:
        rows = {u.user: u for u in owner.call(lambda c: c.users())}
        row = rows.get(me)
        return row is not None and sorted((h.node_id, h.cpu_slots) for h in row.holding) == sorted(
            [(node_id(owner), 1), (node_id(worker), 1)]) and row.cpu_slot_hours > 0

    wait_until(holds_on_both, 20, "the owner to learn what its user holds on the worker", interval_s=0.2)
    rows = json.loads(owner.cli_ok("users", "--json"))
    assert [r["user"] for r in rows] == [me]
    assert rows[0]["jobs_running"] == 2
    (owner.work / "release").touch()
    for job in (blocker, remote):
        assert owner.wait_status(job.id, {"succeeded"}, timeout_s=30).status == "succeeded"
    # WHERE stays on the finished job that ran on the worker.
    where = {j["id"]: j["where_node"] for j in json.loads(owner.cli_ok("jobs", "--json", "--all"))}
    assert (where[blocker.id], where[remote.id]) == (node_id(owner), node_id(worker))

    # With the worker gone, the owner's job list says that a peer's jobs are missing.
    assert "peers down" not in owner.cli("jobs").stderr
    worker.stop()
    wait_until(lambda: any(p["state"] in ("suspect", "down") for p in json.loads(owner.cli_ok("peers", "--json"))
                           if p["state"] != "self"), 20, "the owner to miss the worker's heartbeats", interval_s=0.2)
    r = owner.cli("jobs")
    assert r.returncode == 0 and r.stderr == "1 peer down: their jobs are not listed\n", r
