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


def test_a_peers_snapshot_is_the_same_object_until_what_it_reads_changes() -> None:
    # The scheduler freezes each peer's snapshot once per object (FreezeMemo): PeerSnapshots must
    # give a new one whenever the GPUs held there, its online state, its proven identity or its
    # capabilities change, and the same one otherwise.
    from gpulayerd.app.cluster.node import PeerSnapshots
    from gpulayerd.net.peers import Peer
    from tests.fakes.daemons import caps_for

    clock = FakeClock()
    usage = UsageService(node_id=ME, ledger=Ledger(), clock=clock, half_life_s=86400.0)
    snaps = PeerSnapshots(usage)
    caps = caps_for(PEER, "peer", clock.wall())
    p = Peer(key=PEER, node_id=PEER, name="peer", addresses=["10.0.0.2"], port=1, trusted=True, caps=caps,
             proven_mode="system")
    first = snaps.get(p, caps, online=True)
    assert (first.node_id, first.name, first.online, first.mode, dict(first.gpus_held_by_user)) == (
        PEER, "peer", True, "system", {})
    assert snaps.get(p, caps, online=True) is first
    usage.report(PEER, {"alice": (1, 0)})
    held = snaps.get(p, caps, online=True)
    assert held is not first and dict(held.gpus_held_by_user) == {"alice": 1}
    assert snaps.get(p, caps, online=True) is held
    assert snaps.get(p, caps, online=False).online is False
    p.proven_mode, p.proven_user = "personal", "alice"
    mine = snaps.get(p, caps, online=True)
    assert (mine.mode, mine.user) == ("personal", "alice")
    fetched = caps_for(PEER, "peer", clock.wall() + 1)  # capabilities fetched again: a new core snapshot
    assert snaps.get(p, fetched, online=True) is not mine
