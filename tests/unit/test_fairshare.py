"""Fair share core (gpulayerd.core.fairshare): decayed usage, job order, the per-user GPU cap, the reason text."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayerd.core import fairshare as fairshare_core
from gpulayerd.core.fairshare import (
    CPU_SLOT_WEIGHT,
    MAX_REPORTED_USERS,
    Candidate,
    Holding,
    Usage,
    UsageBook,
    accrue,
    fair_share_reason,
    gpu_cap_rejection,
    order,
    passed_over_by,
    usage_at,
)
from gpulayerd.core.types import Accelerator, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import BUSY_CODES, RejectionCode

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DAY = 86400.0

users = st.sampled_from(["alice", "bob", "carol", "dave", ""])
usages = st.dictionaries(users, st.builds(Usage, st.floats(0, 1e7), st.floats(0, 1e7)), max_size=5)


# ------------------------------------------------------------------ decay and accrual


def test_one_gpu_for_an_hour_is_one_gpu_hour_when_the_half_life_is_long() -> None:
    book = accrue(UsageBook(half_life_s=1e12, stale_after_s=1e9), {"n1": {"alice": Holding(1, 0)}}, 0.0)
    u = usage_at(book, 3600.0)
    assert u["alice"].gpu_hours == pytest.approx(1.0, rel=1e-6)
    assert u["alice"].cpu_slot_s == 0.0


@FAST
@given(gpu_s=st.floats(1, 1e7), cpu_s=st.floats(0, 1e7), half_life=st.floats(10, 1e6))
def test_usage_halves_after_one_half_life(gpu_s: float, cpu_s: float, half_life: float) -> None:
    book = UsageBook(half_life_s=half_life, at=100.0, usage={"alice": Usage(gpu_s, cpu_s)})
    later = usage_at(book, 100.0 + half_life)["alice"]
    assert later.gpu_s == pytest.approx(gpu_s / 2, rel=1e-9)
    assert later.cpu_slot_s == pytest.approx(cpu_s / 2, rel=1e-9, abs=1e-9)


@FAST
@given(gpus=st.integers(1, 8), slots=st.integers(0, 64), dt=st.floats(1, 1e5), half_life=st.floats(10, 1e6))
def test_held_resources_integrate_exactly(gpus: int, slots: int, dt: float, half_life: float) -> None:
    book = accrue(UsageBook(half_life_s=half_life, stale_after_s=1e9), {"n": {"bob": Holding(gpus, slots)}}, 0.0)
    u = usage_at(book, dt)["bob"]
    expected = half_life / math.log(2) * (1 - 2 ** (-dt / half_life))  # ∫0^dt 2^(-(dt-t)/hl) dt
    assert u.gpu_s == pytest.approx(gpus * expected, rel=1e-6)
    assert u.cpu_slot_s == pytest.approx(slots * expected, rel=1e-6)
    assert u.score == pytest.approx(u.gpu_s + CPU_SLOT_WEIGHT * u.cpu_slot_s)


@FAST
@given(steps=st.lists(st.floats(0.1, 100), min_size=1, max_size=20))
def test_accruing_in_steps_equals_accruing_at_once(steps: list[float]) -> None:
    report = {"n": {"alice": Holding(2, 3)}}
    book = accrue(UsageBook(half_life_s=500.0, stale_after_s=1e9), report, 0.0)
    stepped, now = book, 0.0
    for s in steps:
        now += s
        stepped = accrue(stepped, report, now)
    assert usage_at(stepped, now)["alice"].gpu_s == pytest.approx(usage_at(book, now)["alice"].gpu_s, rel=1e-6)


def _accrue_walking_the_book(book: UsageBook, holdings: dict[str, dict[str, Holding]], now: float) -> UsageBook:
    """The reference: every report integrates the whole book up to its arrival (no repeat shortcut)."""
    moved = fairshare_core._advance(book, now)
    if not holdings:
        return moved
    when = moved.at if moved.at is not None else now
    return dataclasses.replace(moved, held={**moved.held, **{n: fairshare_core._kept(r) for n, r in holdings.items()}},
                               seen_at={**moved.seen_at, **dict.fromkeys(holdings, when)})


report_steps = st.lists(st.tuples(st.floats(0.0, 40.0), st.sampled_from(["own", "n1", "n2", "n3"]),
                                  st.dictionaries(st.sampled_from(["alice", "bob"]),
                                                  st.builds(Holding, st.integers(0, 2), st.integers(0, 2)),
                                                  max_size=2)),
                        min_size=1, max_size=40)


@FAST
@given(steps=report_steps, later=st.floats(0.0, 100.0))
def test_repeated_reports_noted_without_walking_the_book_give_the_same_usage(
        steps: list[tuple[float, str, dict[str, Holding]]], later: float) -> None:
    fast = slow = UsageBook(half_life_s=300.0, stale_after_s=30.0, own_node="own")
    now = 0.0
    for dt, node, report in steps:  # heartbeats mostly repeat the last report: the shortcut's case
        start = now + dt
        for now in (start, start + 0.5):  # a monotonic clock; the last one is kept
            fast = accrue(fast, {node: report}, now)
            slow = _accrue_walking_the_book(slow, {node: report}, now)
    for at in (now, now + later):
        got, want = usage_at(fast, at), usage_at(slow, at)
        assert set(got) == set(want)
        for user, u in want.items():
            assert got[user].gpu_s == pytest.approx(u.gpu_s, rel=1e-9, abs=1e-9)
            assert got[user].cpu_slot_s == pytest.approx(u.cpu_slot_s, rel=1e-9, abs=1e-9)


def test_a_report_replaces_the_nodes_previous_one_and_never_adds_to_it() -> None:
    book = UsageBook(half_life_s=1e12, stale_after_s=1e9)
    for t in range(0, 100, 10):  # the same run reported ten times, by its node and again from a reply
        book = accrue(book, {"n1": {"alice": Holding(1, 0)}}, float(t))
        book = accrue(book, {"n1": {"alice": Holding(1, 0)}}, float(t))
    assert usage_at(book, 100.0)["alice"].gpu_s == pytest.approx(100.0)


def test_runs_on_two_nodes_both_count_and_an_emptied_node_stops_counting() -> None:
    book = accrue(UsageBook(half_life_s=1e12, stale_after_s=1e9),
                  {"n1": {"alice": Holding(1, 0)}, "n2": {"alice": Holding(2, 0), "bob": Holding(0, 4)}}, 0.0)
    book = accrue(book, {"n2": {}}, 10.0)
    u = usage_at(book, 20.0)
    assert u["alice"].gpu_s == pytest.approx(1 * 20 + 2 * 10)
    assert u["bob"].cpu_slot_s == pytest.approx(40.0)


def test_a_node_that_stops_reporting_counts_only_until_its_report_is_stale() -> None:
    book = accrue(UsageBook(half_life_s=1e12, stale_after_s=30.0), {"gone": {"alice": Holding(1, 0)}}, 0.0)
    u = usage_at(book, 1000.0)
    assert u["alice"].gpu_s == pytest.approx(30.0)
    assert accrue(book, {}, 1000.0).held == {}


def test_a_report_is_bounded_to_the_biggest_holders() -> None:
    report = {f"u{i:04d}": Holding(1 if i < 10 else 0, 1) for i in range(MAX_REPORTED_USERS + 50)}
    book = accrue(UsageBook(half_life_s=DAY), {"n": report}, 0.0)
    kept = book.held["n"]
    assert len(kept) == MAX_REPORTED_USERS
    assert all(f"u{i:04d}" in kept for i in range(10))


def test_time_going_back_integrates_nothing() -> None:
    book = accrue(UsageBook(half_life_s=DAY), {"n": {"alice": Holding(1, 0)}}, 100.0)
    assert usage_at(book, 50.0) == {}


def test_bad_half_life_names_the_field() -> None:
    with pytest.raises(ValueError, match="half_life_s must be > 0"):
        UsageBook(half_life_s=0)


# ------------------------------------------------------------------ order

candidate_lists = st.lists(st.builds(Candidate, st.text("abcdef0123", min_size=1, max_size=6), users,
                                     st.integers(0, 50).map(float)), max_size=30)


@FAST
@given(cands=candidate_lists, usage=usages)
def test_order_is_a_permutation(cands: list[Candidate], usage: dict[str, Usage]) -> None:
    out = order(cands, usage)
    assert sorted(out, key=repr) == sorted(cands, key=repr)


@FAST
@given(cands=candidate_lists, usage=usages)
def test_less_usage_never_waits_behind_more(cands: list[Candidate], usage: dict[str, Usage]) -> None:
    out = order(cands, usage)

    def score(u: str) -> float:
        return usage[u].score if u in usage else 0.0

    for i, a in enumerate(out):
        for b in out[i + 1:]:
            assert score(a.user) <= score(b.user)


@FAST
@given(cands=candidate_lists, usage=usages)
def test_within_one_user_submission_order_holds(cands: list[Candidate], usage: dict[str, Usage]) -> None:
    out = order(cands, usage)
    for user in {c.user for c in cands}:
        mine = [(c.seq, c.job_id) for c in out if c.user == user]
        assert mine == sorted(mine)


@FAST
@given(cands=candidate_lists, usage=usages)
def test_order_is_deterministic_whatever_the_input_order(cands: list[Candidate], usage: dict[str, Usage]) -> None:
    assert order(cands, usage) == order(list(reversed(cands)), usage)


def test_bob_goes_before_alice_who_used_more() -> None:
    usage = {"alice": Usage(6.1 * 3600, 0), "bob": Usage(0.2 * 3600, 0)}
    cands = [Candidate("a1", "alice", 1), Candidate("a2", "alice", 2), Candidate("b1", "bob", 3)]
    assert [c.job_id for c in order(cands, usage)] == ["b1", "a1", "a2"]
    assert fair_share_reason("alice", "bob", usage) == "fair share: bob's jobs go first (less recent GPU use than alice)"
    # No figures: the words stay the same while the usage decays.
    later = {"alice": Usage(3.0 * 3600, 0), "bob": Usage(0.1 * 3600, 0)}
    assert fair_share_reason("alice", "bob", later) == fair_share_reason("alice", "bob", usage)
    assert passed_over_by("alice", ["bob", "alice"], usage) == "bob"
    assert passed_over_by("bob", ["alice"], usage) is None


def test_a_cpu_jobs_reason_names_the_kind_of_use_that_decided() -> None:
    usage = {"alice": Usage(0, 3.5 * 3600), "bob": Usage(0, 0.4 * 3600)}
    assert passed_over_by("alice", ["bob"], usage) == "bob"
    assert fair_share_reason("alice", "bob", usage, gpus=False) == (
        "fair share: bob's jobs go first (less recent GPU and CPU-slot use than alice)")


# ------------------------------------------------------------------ the per-user GPU cap


def _job(user: str, gpus: int, acc: Accelerator = Accelerator.CUDA) -> JobRequest:
    return JobRequest(job_id="j", accelerator=acc, gpu_count=gpus, user=user)


def test_gpu_cap_rejects_past_the_cap_and_is_busy() -> None:
    w = WorkerSnapshot(node_id="n2", name="ws-2", max_gpus_per_user=1, gpus_held_by_user={"alice": 1})
    r = gpu_cap_rejection("alice", 1, w)
    assert r is not None
    assert r.code is RejectionCode.USER_GPU_CAP and r.code in BUSY_CODES
    assert r.message == "fair share: alice holds 1 of max 1 GPUs on ws-2"
    assert gpu_cap_rejection("bob", 1, w) is None


@FAST
@given(cap=st.none() | st.integers(0, 8), held=st.integers(0, 8), want=st.integers(0, 8))
def test_gpu_cap_rejects_exactly_when_held_plus_wanted_passes_the_cap(cap: int | None, held: int,
                                                                      want: int) -> None:
    w = WorkerSnapshot(node_id="n", max_gpus_per_user=cap, gpus_held_by_user={"alice": held})
    rejected = gpu_cap_rejection("alice", want, w) is not None
    assert rejected == (cap is not None and want > 0 and held + want > cap)


def test_the_cap_shows_in_evaluate_as_fits_but_busy() -> None:
    from gpulayerd.core.matching.evaluate import evaluate
    from gpulayerd.core.types import DeviceSnapshot, EnvironmentSnapshot
    from gpulayerd.core.verdict import FitState
    from gpulayerd.gpu.support import SUPPORT_MATRIX

    devs = tuple(DeviceSnapshot(accelerator=Accelerator.CUDA, index=i, uuid=f"GPU-{i}", execution_supported=True,
                                memory_total_bytes=24 * 10**9) for i in range(2))
    env = EnvironmentSnapshot(interpreter="/usr/bin/python3")
    w = WorkerSnapshot(node_id="n2", name="ws-2", devices=devs, environments=(env,), max_gpus_per_user=1,
                       gpus_held_by_user={"alice": 1})
    ev = evaluate(_job("alice", 1), w, SUPPORT_MATRIX)
    assert ev.state is FitState.FITS_BUT_BUSY
    assert [r.message for r in ev.rejections] == ["fair share: alice holds 1 of max 1 GPUs on ws-2"]
    assert evaluate(_job("bob", 1), w, SUPPORT_MATRIX).placement is not None


def test_the_books_own_node_never_goes_stale() -> None:
    book = accrue(UsageBook(half_life_s=1e12, stale_after_s=30.0, own_node="me"),
                  {"me": {"alice": Holding(1, 0)}, "peer": {"bob": Holding(1, 0)}}, 0.0)
    u = usage_at(book, 100.0)
    assert u["alice"].gpu_s == pytest.approx(100.0)
    assert u["bob"].gpu_s == pytest.approx(30.0)
