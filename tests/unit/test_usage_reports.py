"""Fair-share reports from heartbeats (issue 11): a member speaks only for what it holds itself.

The peer route hands :meth:`UsageService.report` the TLS-proven sender; a member cannot
report under this node's id, and its report replaces only its own earlier one.
"""

from __future__ import annotations

import pytest

from gpulayerd.app.common.ledger import Ledger
from gpulayerd.app.common.usage import UsageService
from tests.fakes.clock import FakeClock

ME, PEER, OTHER = "me" * 26, "pe" * 26, "ot" * 26


@pytest.mark.asyncio
async def test_a_member_cannot_report_for_this_node_and_replaces_only_its_own_report() -> None:
    clock = FakeClock()
    usage = UsageService(node_id=ME, ledger=Ledger(), clock=clock, half_life_s=86400.0)
    usage.tick()
    usage.report(ME, {"mallory": (8, 0)})  # a forged "this node holds it": ignored
    usage.report(PEER, {"alice": (2, 0)})
    usage.report(OTHER, {"bob": (1, 0)})
    assert usage.held_now() == {"alice": {PEER: (2, 0)}, "bob": {OTHER: (1, 0)}}
    usage.report(PEER, {"carol": (1, 0)})  # PEER's new report replaces only PEER's old one
    assert usage.held_now() == {"carol": {PEER: (1, 0)}, "bob": {OTHER: (1, 0)}}
    for _ in range(360):  # an hour of heartbeats (a report counts only a while after it came)
        clock.advance(10)
        usage.report(PEER, {"carol": (1, 0)})
        usage.report(OTHER, {"bob": (1, 0)})
    used = usage.usage()
    assert "mallory" not in used and "alice" not in used
    assert used["carol"].gpu_hours == pytest.approx(1.0, rel=0.02)
    assert used["bob"].gpu_hours == pytest.approx(1.0, rel=0.02)
