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
