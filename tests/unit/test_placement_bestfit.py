"""Best fit across hosts (issue 31): an owner offers a job that fits several peers now to the one
whose placement takes the smallest device(s) (:mod:`gpulayerd.core.protocol.targets`), then the least
loaded, then the lowest node id. Before, a 16 GB job went to an idle 94 GB card while a 24 GB card
was idle too (least loaded, ties to the lowest node id). CPU jobs and equal-size jobs still spread
by load (tests/unit/test_placement_spread.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core import scheduling as core
from gpulayerd.core.protocol.targets import (
    GIB,
    Fit,
    FitSize,
    OfferRound,
    WorkerLoad,
    choose_target,
    fit_size,
    spread_offers,
)
from gpulayerd.core.scheduling.judging import fit_of
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Placement
from gpulayerd.gpu.support import SUPPORT_MATRIX

MIB = 1 << 20
ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
ME = "node-me"
SIZES = [fit_size(g * GIB, cc) for g in (16, 24, 48, 80, 94) for cc in ((7, 5), (8, 6), (9, 0))]

workers_st = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.tuples(st.sampled_from(SIZES), st.integers(0, 4), st.integers(1, 4)),  # (size, in use, capacity)
    min_size=1, max_size=6)


def _ratio(load: WorkerLoad) -> float:
    return load.in_use / load.capacity


@given(workers=workers_st, order=st.randoms(use_true_random=False))
def test_never_a_larger_fit_while_a_smaller_one_fits_and_the_choice_is_deterministic(
        workers: dict[str, tuple[FitSize, int, int]], order: object) -> None:
    sizes = {w: s for w, (s, _, _) in workers.items()}
    loads = {w: WorkerLoad(u, c) for w, (_, u, c) in workers.items()}
    names = sorted(workers)
    target = choose_target(names, loads, sizes=sizes)
    assert target is not None
    smallest = min(sizes.values())
    assert sizes[target] == smallest  # never a larger fit, however busy the smaller ones are
    equal = [w for w in names if sizes[w] == smallest]
    assert _ratio(loads[target]) == min(_ratio(loads[w]) for w in equal)  # then the least loaded
    assert target == min(w for w in equal if _ratio(loads[w]) == _ratio(loads[target]))  # then the node id
    shuffled = list(names)
    order.shuffle(shuffled)  # type: ignore[attr-defined]
    assert choose_target(shuffled, loads, sizes=sizes) == target  # the order given changes nothing


@given(workers=workers_st, pick=st.integers(0, 5))
def test_a_kept_offer_stays_only_while_it_is_still_a_best_fit(
        workers: dict[str, tuple[FitSize, int, int]], pick: int) -> None:
    sizes = {w: s for w, (s, _, _) in workers.items()}
    loads = {w: WorkerLoad(u, c) for w, (_, u, c) in workers.items()}
    names = sorted(workers)
    previous = names[pick % len(names)]
    target = choose_target(names, loads, previous, sizes)
    if sizes[previous] == min(sizes.values()):
        assert target == previous  # not moved pass after pass for load alone
    else:
        assert target != previous and target is not None and sizes[target] < sizes[previous]
    # A previous worker that no longer fits is not kept.
    rest = [w for w in names if w != previous]
    assert choose_target(rest, loads, previous, sizes) == choose_target(rest, loads, None, sizes)


@given(cards=st.dictionaries(st.sampled_from(["h1", "h2", "h3", "h4"]),
                             st.tuples(st.sampled_from([24, 48, 94]), st.integers(1, 3)), min_size=1),
       jobs=st.integers(1, 12))
def test_a_burst_fills_the_smallest_cards_first_and_spreads_over_equal_ones(
        cards: dict[str, tuple[int, int]], jobs: int) -> None:
    """Each host has n free cards of one size; a burst of 1-GPU jobs that fit every card: a job goes
    to a bigger card only once every smaller card is promised, and equal cards are shared out by load."""
    fits = [Fit(h, fit_size(g * GIB, (8, 6)), tuple(f"{h}-gpu{i}" for i in range(n)), 1)
            for h, (g, n) in sorted(cards.items())]
    chosen = spread_offers([(f"job-{k}", fits) for k in range(jobs)], {h: WorkerLoad(0, 4) for h in cards})
    per = Counter(chosen.values())
    room = sum(n for _, n in cards.values())
    assert len(chosen) == jobs
    for k in range(min(jobs, room)):
        host = chosen[f"job-{k}"]
        size = cards[host][0]
        # Every smaller card was promised to an earlier job.
        earlier = Counter(chosen[f"job-{i}"] for i in range(k))
        assert all(earlier[h] >= n for h, (g, n) in cards.items() if g < size), (k, host, chosen)
    if jobs <= room:
        assert all(per[h] <= cards[h][1] for h in per)  # no card offered twice while another is free
    same = [h for h in cards if cards[h][0] == min(g for g, _ in cards.values())]
    if jobs >= len(same) and all(cards[h][1] == cards[same[0]][1] for h in same):
        assert all(per[h] >= 1 for h in same)  # equal smallest cards: each gets work


def test_a_16gb_job_goes_to_the_idle_24gb_card_not_the_idle_94gb_one() -> None:
    big = Fit("a-big", fit_size(95830 * MIB, (9, 0)), ("GPU-big",), 1)
    small = Fit("z-small", fit_size(24564 * MIB, (8, 6)), ("GPU-small",), 1)
    idle = {"a-big": WorkerLoad(0, 8), "z-small": WorkerLoad(3, 8)}  # the small one is even busier
    assert spread_offers([("j", [big, small])], idle) == {"j": "z-small"}
    # Offered to the big card before (the bug): moved once the small card fits.
    assert spread_offers([("j", [big, small])], idle, {"j": "a-big"}) == {"j": "z-small"}
    # A second job of the same pass: the small card is promised, the big one takes it.
    assert spread_offers([("j1", [big, small]), ("j2", [big, small])], idle) == {"j1": "z-small", "j2": "a-big"}
    # Memory ties (whole GiB) go to the older compute capability, then load.
    old = Fit("m-old", fit_size(24576 * MIB, (7, 5)), ("GPU-old",), 1)
    assert OfferRound(idle).choose([small, old]) == old


def test_cpu_jobs_and_equal_cards_spread_by_load() -> None:
    cpu = [Fit("h1"), Fit("h2"), Fit("h3")]
    chosen = spread_offers([(f"c{k}", cpu) for k in range(6)], {h: WorkerLoad(0, 2) for h in ("h1", "h2", "h3")})
    assert Counter(chosen.values()) == {"h1": 2, "h2": 2, "h3": 2}
    # Two cards of one model that the drivers report 12 MiB apart are one size: load decides.
    a = Fit("h1", fit_size(24564 * MIB, (8, 6)), ("GPU-a0", "GPU-a1"), 1)
    b = Fit("h2", fit_size(24576 * MIB, (8, 6)), ("GPU-b0", "GPU-b1"), 1)
    assert a.size == b.size == (24, 8, 6)
    chosen = spread_offers([(f"g{k}", [a, b]) for k in range(4)], {"h1": WorkerLoad(0, 4), "h2": WorkerLoad(0, 4)})
    assert list(chosen.values()) == ["h1", "h2", "h1", "h2"]


def _card(i: int, mib: int, cc: tuple[int, int], name: str, **kw: object) -> DeviceSnapshot:
    return DeviceSnapshot(Accelerator.CUDA, i, f"GPU-{name}-{i}", name, mib * MIB, 0, MemoryKind.DEDICATED, cc,
                          "580.126.09", True, True, **kw)  # type: ignore[arg-type]


def test_fit_of_sizes_the_chosen_devices_and_pools_their_free_twins() -> None:
    w = WorkerSnapshot("h1", devices=(
        _card(0, 24564, (8, 6), "RTX A5000"), _card(1, 24564, (8, 6), "RTX A5000"),
        _card(2, 24564, (8, 6), "RTX A5000", granted_to="other"), _card(3, 49140, (8, 6), "RTX A6000")))
    one = fit_of(Placement("h1", "/usr/bin/python3", (1,), ("GPU-RTX A5000-1",), Accelerator.CUDA), w)
    assert one.size == (24, 8, 6) and one.need == 1
    assert one.pool == ("GPU-RTX A5000-1", "GPU-RTX A5000-0")  # the chosen one first; the granted twin is not free
    two = fit_of(Placement("h1", "/usr/bin/python3", (0, 3), ("GPU-RTX A5000-0", "GPU-RTX A6000-3"),
                           Accelerator.CUDA), w)
    assert two.size == (72, 8, 6) and two.need == 2
    assert fit_of(Placement("h1", "/usr/bin/python3", (), (), Accelerator.CPU), w) == Fit("h1")


# ------------------------------------------------------------------------ a scheduler pass, end to end


def _peer(node: str, *cards: DeviceSnapshot) -> WorkerSnapshot:
    return WorkerSnapshot(node, devices=cards, environments=ENV, cpu_count=8, cpu_slots_total=4, cpu_slots_free=4,
                          mode="system")


NO_GPU = WorkerSnapshot(ME, environments=ENV, cpu_count=2, cpu_slots_total=1, cpu_slots_free=0, mode="system")


def _pass(c: core.SchedulerCore, jobs: dict[str, JobRequest], remote: list[WorkerSnapshot], now: float,
          local: WorkerSnapshot = NO_GPU, claims: list[str] | None = None) -> list[tuple[str, str]]:
    """One pass of ``c`` (this machine: ``local``); returns its offers. Claims are granted (their
    devices then held) and listed in ``claims``, which must be given when ``local`` has room."""
    queued = tuple(core.QueuedJob(j, n, "", req) for n, (j, req) in enumerate(jobs.items(), start=1))
    offers: list[tuple[str, str]] = []
    steps = c.run_pass()
    answer: core.Answer = None
    while True:
        try:
            action = steps.send(answer)
        except StopIteration:
            return offers
        answer = core.Resume()
        if isinstance(action, core.ReadChanges):
            answer = core.QueueChanges(1, len(jobs), ())
        elif isinstance(action, core.ReadQueue):
            answer = core.QueueLoaded(1, queued)
        elif isinstance(action, core.ReadMachine):
            answer = core.MachineRead(local if action.local else None, tuple(remote), {}, now)
        elif isinstance(action, core.SendOffer):
            offers.append((action.job_id, action.worker))
        elif isinstance(action, core.Claim):
            assert claims is not None, action
            claims.append(action.job.id)
            held = set(action.placement.device_uuids)
            local = replace(local, devices=tuple(replace(d, granted_to=action.job.id) if d.uuid in held else d
                                                 for d in local.devices))
            answer = core.ClaimAnswered(True, local)
        else:
            assert not isinstance(action, core.ToGang), action


@pytest.mark.parametrize("users", [("alice",), ("alice", "bob")])  # reasons by shape, and job by job
def test_a_pass_offers_each_gpu_job_to_the_smallest_card_that_fits_it_now(users: tuple[str, ...]) -> None:
    big = _peer("a-big", _card(0, 95830, (9, 0), "NVIDIA H100 NVL"))  # the lowest node id, idle
    small = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000"))
    jobs = {f"j{k}": JobRequest(job_id=f"j{k}", accelerator=Accelerator.CUDA, gpu_count=1,
                                gpu_memory_bytes=16 * GB, user=users[k % len(users)]) for k in range(2)}
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    # Two 16 GB jobs: the first to the 24 GB card, the second (that card promised) to the 94 GB one.
    assert _pass(c, {"j0": jobs["j0"]}, [big, small], 0.0) == [("j0", "z-small")]
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    assert sorted(_pass(c, jobs, [big, small], 0.0)) == [("j0", "z-small"), ("j1", "a-big")]
    # The 24 GB card is taken meanwhile: j0 moves to the 94 GB card; j1 stays there (not re-sent yet).
    taken = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000", granted_to="x"))
    assert _pass(c, jobs, [big, taken], 1.0) == [("j0", "a-big")]
    # A 40 GB job never fits the 24 GB card: the 94 GB card, as before.
    wide = {"w": JobRequest(job_id="w", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=40 * GB,
                            user="alice")}
    assert _pass(core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0), wide, [big, small], 0.0) == \
        [("w", "a-big")]


@pytest.mark.parametrize("users", [("alice",), ("alice", "bob")])
def test_the_owners_own_big_card_waits_for_jobs_a_smaller_peer_card_fits(users: tuple[str, ...]) -> None:
    """Best fit counts this machine too: a 16 GB job submitted on the host with the 94 GB card goes to
    the peer's free 24 GB card; the next such job (that card promised) and a 40 GB job run here."""
    here = WorkerSnapshot(ME, devices=(_card(0, 95830, (9, 0), "NVIDIA H100 NVL"),), environments=ENV, cpu_count=8,
                          cpu_slots_total=2, cpu_slots_free=2, mode="system")
    small = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000"))

    def gpu(job_id: str, gb: int, k: int) -> JobRequest:
        return JobRequest(job_id=job_id, accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=gb * GB,
                          user=users[k % len(users)])

    claims: list[str] = []
    jobs = {"j0": gpu("j0", 16, 0)}
    assert _pass(core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0), jobs, [small], 0.0, here,
                 claims) == [("j0", "z-small")]
    assert claims == []
    jobs = {"j0": gpu("j0", 16, 0), "j1": gpu("j1", 16, 1)}
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    assert _pass(c, jobs, [small], 0.0, here, claims) == [("j0", "z-small")]
    assert claims == ["j1"]
    # The peer's card is taken before it claims j0: j0 runs here at the next pass.
    taken = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000", granted_to="x"))
    claims.clear()
    assert _pass(c, {"j0": jobs["j0"]}, [taken], 1.0, here, claims) == []
    assert claims == ["j0"]
    # A 40 GB job, and a CPU job: here. An equal card on the peer: here too (no hop for nothing).
    claims.clear()
    cpu = JobRequest(job_id="c", user=users[0])
    _pass(core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0), {"w": gpu("w", 40, 0), "c": cpu}, [small],
          0.0, here, claims)
    assert claims == ["w", "c"]
    claims.clear()
    twin = _peer("a-twin", _card(0, 95830, (9, 0), "NVIDIA H100 NVL"))
    assert _pass(core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0), {"j0": gpu("j0", 16, 0)}, [twin], 0.0,
                 here, claims) == []
    assert claims == ["j0"]


def test_a_job_left_to_a_peer_that_does_not_claim_it_runs_here_after_two_offers() -> None:
    """A peer that looks free and does not claim (its workdir check at claim fails, say: a peer's
    workdir is checked only then) holds a job that fits the owner's own card up only for two offers."""
    here = WorkerSnapshot(ME, devices=(_card(0, 95830, (9, 0), "NVIDIA H100 NVL"),), environments=ENV, cpu_count=8,
                          cpu_slots_total=2, cpu_slots_free=2, mode="system", existing_paths=frozenset({"/srv/x"}))
    small = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000"))
    claims: list[str] = []
    jobs = {"j": JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=16 * GB,
                            workdir="/srv/x", user="alice")}
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=2.0)
    assert _pass(c, jobs, [small], 0.0, here, claims) == [("j", "z-small")]
    for now in (1.0, 2.0, 3.9):
        _pass(c, jobs, [small], now, here, claims)
        assert claims == [], now
    assert c.offered["j"] == ("z-small", 2.0)  # offered at 0 and 2 s
    assert _pass(c, jobs, [small], 4.0, here, claims) == []
    assert claims == ["j"]


def test_a_peer_that_never_claims_a_jobs_offer_loses_it_to_the_next_best_fit() -> None:
    """A peer whose snapshot says it fits (its small card looks free) but that never claims: after
    3 offer intervals the offer goes to the next best fit, so the job is not held there for ever."""
    big = _peer("a-big", _card(0, 95830, (9, 0), "NVIDIA H100 NVL"))
    small = _peer("z-small", _card(0, 24564, (8, 6), "NVIDIA RTX A5000"))  # the best fit, never claims
    job = {"j0": JobRequest(job_id="j0", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=16 * GB,
                            user="alice")}
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=2.0)
    sent = [(t, _pass(c, job, [big, small], float(t))) for t in range(0, 12)]
    targets = [(t, offers[0][1]) for t, offers in sent if offers]
    assert targets[:3] == [(0, "z-small"), (2, "z-small"), (4, "z-small")]  # repeated every interval
    assert targets[3] == (6, "a-big"), targets  # held unclaimed for 3 intervals: the next best fit
    assert {w for _, w in targets[3:]} <= {"a-big", "z-small"}  # (the clock starts again for each target)
