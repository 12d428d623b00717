"""Placement spreads bursts (issue 17): an owner offers the jobs that fit only peers to the
least-loaded fitting peers (:func:`gpulayerd.core.protocol.targets.choose_target`), so every idle
worker gets work at once, and no job is ever run twice (the owner's compare-and-set).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core.protocol.claims import (
    ClaimRequested,
    GrantClaim,
    JobRecord,
    JobStatus,
    PersistJob,
    handle,
)
from gpulayerd.core.protocol.claims import JobStatus as S
from gpulayerd.core.protocol.targets import WorkerLoad, choose_target, spread_offers
from tests.fakes.daemons import three_daemons


@pytest.mark.slow  # (hypothesis: ~1.3-1.8 s on a loaded 2-core machine)
@given(n=st.integers(1, 8), slots=st.integers(1, 4), extra=st.integers(0, 40), salt=st.text(max_size=4),
       order=st.randoms(use_true_random=False))
def test_a_burst_gives_every_idle_fitting_worker_work_and_no_job_runs_twice(
        n: int, slots: int, extra: int, salt: str, order: object) -> None:
    workers = [f"{salt}w{i:02d}" for i in range(n)]
    order.shuffle(workers)  # type: ignore[attr-defined]
    jobs = [f"{salt}job-{k}" for k in range(n * slots + extra)]
    loads = {w: WorkerLoad(0, slots) for w in workers}
    chosen = spread_offers([(j, workers) for j in jobs], loads)

    assert set(chosen) == set(jobs)  # every job placed, once
    per = Counter(chosen.values())
    assert set(per) == set(workers)
    assert min(per.values()) >= slots  # every idle worker gets a full first round
    assert max(per.values()) - min(per.values()) <= 1  # and the burst is even

    # First every worker claims what it was offered, then all of them race for every job: one grant per job.
    records = {j: JobRecord(j, S.QUEUED) for j in jobs}
    grants: Counter[str] = Counter()
    rounds = [(w, [j for j in jobs if chosen[j] == w]) for w in workers] + [(w, jobs) for w in workers]
    for w, claimed in rounds:
        for j in claimed:
            actions = handle(records[j], ClaimRequested(w), 0.0)
            persist = next((a for a in actions if isinstance(a, PersistJob)), None)
            if persist is not None:
                records[j] = persist.record
                grants[j] += any(isinstance(a, GrantClaim) for a in actions)
    assert set(grants.values()) == {1}
    assert all(records[j].holder == chosen[j] for j in jobs)


@given(busy=st.integers(0, 3))
def test_the_least_loaded_worker_wins_and_a_kept_offer_stays(busy: int) -> None:
    loads = {"a": WorkerLoad(busy + 1, 2), "b": WorkerLoad(busy, 2)}
    assert choose_target(["a", "b"], loads) == "b"
    assert choose_target(["a", "b"], loads, previous="a") == "a"  # not moved pass after pass
    assert choose_target(["a", "b"], loads, previous="gone") == "b"
    assert choose_target([], loads) is None
    # Capacity counts: 3 busy of 8 is less loaded than 1 of 2.
    assert choose_target(["a", "b"], {"a": WorkerLoad(3, 8), "b": WorkerLoad(1, 2)}) == "a"


def test_ties_do_not_always_favour_the_same_node() -> None:
    """Equal idle workers: the burst's first jobs go to every one of them in turn, the
    lowest node id first only once."""
    idle = {w: WorkerLoad(0, 2) for w in ("h3", "h1", "h2")}
    chosen = spread_offers([(f"job-{k}", ["h3", "h1", "h2"]) for k in range(7)], idle)
    assert list(chosen.values()) == ["h1", "h2", "h3", "h1", "h2", "h3", "h1"]
    # A busier low node id loses to an idle higher one.
    assert choose_target(["h1", "h3"], {"h1": WorkerLoad(1, 2), "h3": WorkerLoad(0, 2)}) == "h3"


@pytest.mark.asyncio
async def test_an_owners_burst_reaches_the_peer_with_the_highest_node_id(tmp_path: Path) -> None:
    """The owner (1 slot, kept busy) offers 10 jobs; both peers (2 slots each) run 2 at once.

    Before: every offer went to the lowest node id that fitted (w1): w2 ran nothing."""
    async with three_daemons(tmp_path) as lab:
        owner = lab.daemons["owner"]
        ids = [await lab.submit(owner) for _ in range(10)]
        await lab.schedule()  # offers
        await lab.schedule()  # the peers claim what fits them
        views = [await lab.job(owner, j) for j in ids]
        running = Counter(v.attempts[-1].worker for v in views if v.status in ("claimed", "running"))
        assert running == {owner.node_id: 1, lab.daemons["w1"].node_id: 2, lab.daemons["w2"].node_id: 2}
        queued = [v for v in views if v.status == JobStatus.QUEUED.value]
        assert len(queued) == 5
