"""One path for every claim: a job that runs on its owner's machine is offered to that node and
claimed from it with the same offer, claim and grant as a job a peer runs (issue 26).

Real services over the loopback network (tests/fakes): the owner runs one job itself, then,
without an interpreter, has a peer run the next; both histories say offer, claim, grant.
"""

from __future__ import annotations

import pytest

from gpulayerd.store import EventRow
from tests.fakes.daemons import OWNER, W1, Lab, d, view
from tests.unit.test_services_remote_jobs import ME, running_on_w1, submit_as


def _claim_path(events: list[EventRow]) -> list[tuple[str, str, str | None, str | None]]:
    """From a job's history, the steps from its submission to its start: (kind, words, from, to)."""
    out = []
    for e in events:
        out.append((e.kind, e.reason if e.kind in ("offer", "claim") else "",
                    e.from_status.value if e.from_status else None, e.to_status.value if e.to_status else None))
        if e.to_status is not None and e.to_status.value == "running":
            break
    return out


@pytest.mark.asyncio
async def test_a_local_job_has_the_offer_claim_and_grant_of_a_remote_one(lab: Lab) -> None:
    owner = d(lab, "owner")
    local = await submit_as(lab, owner, ME)

    async def running_here() -> bool:
        v = await view(lab, local)
        return v.status == "running" and v.holder == OWNER

    await lab.run_until("running on the owner", running_here, limit_s=20)
    remote = await running_on_w1(lab)

    here = _claim_path(await owner.store.jobs.events(local))
    there = _claim_path(await owner.store.jobs.events(remote))
    assert here == [
        ("submitted", "", None, "queued"),
        ("offer", f"offered to {OWNER}", "queued", "queued"),
        ("claim", f"claimed by {OWNER}", "queued", "queued"),
        ("grant", "", "queued", "claimed"),
        ("state", "", "claimed", "running"),
    ]
    assert there == [(k, w.replace(OWNER, W1), f, t) for k, w, f, t in here]
    # The run is the worker's record (its owner: this node), the attempt the owner's, as for a peer.
    run = await owner.store.runs.remote_run(OWNER, local, 1)
    assert run is not None and run.state == "running"
    assert await d(lab, "w1").store.runs.remote_run(OWNER, remote, 1) is not None
    assert [a.worker for a in await owner.store.jobs.attempts(local)] == [OWNER]
