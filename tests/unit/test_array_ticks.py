"""The arrays' tick after a pass (in the background), on the loopback lab: an array that waits for a
dependency and is cancelled meanwhile is let go of (not held for ever, not re-registered at each tick)."""

from __future__ import annotations

import pytest

from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import Lab, d


@pytest.mark.asyncio
async def test_an_array_cancelled_while_it_waits_for_a_dependency_is_let_go(lab: Lab) -> None:
    owner = d(lab, "owner")
    first = await lab.submit(owner, cpus=2)
    await lab.schedule()
    await lab.schedule()
    assert (await lab.job(owner, first)).status == "running"
    spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "array": "0-3", "after": [first]}
    array = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
    await lab.schedule()
    await lab.schedule()  # the array waits for its dependency (its tick has read it)
    books = owner.services.owner.arrays
    assert array in books.gate.waiting()
    await owner.services.owner.cancel(array)
    assert (await lab.job(owner, array)).status == "cancelled"
    for _ in range(3):
        await lab.step()
    assert array not in books.gate.waiting()
    assert books.held() == 0  # the scheduler's count of its queue agrees with the store's
