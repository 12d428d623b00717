"""Retries in the scheduler's pass (issue 33, :mod:`gpulayerd.core.scheduling.retrying`):

- ``--retry-elsewhere``: a retry's avoided worker (its last attempt's) is chosen, to claim here or
  to offer to, only when no other worker fits it now ("prefer", not "forbid");
- a retry waiting out its backoff is neither claimed nor offered (a claim would be denied) until
  ``retry_at`` (wall clock), then walked as a new job, even when nothing else changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core import scheduling as core
from gpulayerd.core.protocol.targets import Fit
from gpulayerd.core.scheduling.retrying import RetryHolds, prefer_others
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.gpu.support import SUPPORT_MATRIX

MIB = 1 << 20
ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)
ME = "node-me"
PEERS = ("h1", "h2", "h3")


def _host(node: str, free: int, *cards: DeviceSnapshot) -> WorkerSnapshot:
    return WorkerSnapshot(node, devices=cards, environments=ENV, cpu_count=8, cpu_slots_total=2,
                          cpu_slots_free=free, mode="system")


def _card(node: str, mib: int, cc: tuple[int, int], name: str) -> DeviceSnapshot:
    return DeviceSnapshot(Accelerator.CUDA, 0, f"GPU-{node}", name, mib * MIB, 0, MemoryKind.DEDICATED, cc,
                          "580.126.09", True, True)


@dataclass
class World:
    """What the core's actions act on: this machine, the peers, the queue (a reload at the first pass,
    then the events given to :meth:`run`) and the clocks."""

    local: WorkerSnapshot
    remote: list[WorkerSnapshot]
    jobs: dict[str, core.QueuedJob] = field(default_factory=dict)
    now: float = 0.0  # monotonic s
    wall: float | None = 1000.0
    claims: list[str] = field(default_factory=list)
    offers: list[tuple[str, str]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    def run(self, c: core.SchedulerCore, changed: tuple[str, ...] = ()) -> None:
        """One pass of ``c``; ``changed``: the jobs with an event since the last one."""
        self.claims.clear()
        self.offers.clear()
        steps = c.run_pass()
        answer: core.Answer = None
        while True:
            try:
                action = steps.send(answer)
            except StopIteration:
                return
            answer = core.Resume()
            if isinstance(action, core.ReadChanges):
                answer = core.QueueChanges(1, len(self.jobs), tuple(
                    (replace(self.jobs[j], request=None) if c.queued(j) else self.jobs[j], True) for j in changed))
            elif isinstance(action, core.ReadQueue):
                answer = core.QueueLoaded(1, tuple(self.jobs.values()))
            elif isinstance(action, core.ReadMachine):
                answer = core.MachineRead(self.local if action.local else None, tuple(self.remote), {}, self.now,
                                          self.wall)
            elif isinstance(action, core.SendOffer):
                self.offers.append((action.job_id, action.worker))
            elif isinstance(action, core.StoreReasons):
                self.reasons.update((q.id, text) for q, text, _ in action.items)
            elif isinstance(action, core.Claim):
                assert action.job.retry_at is None or self.wall is None or self.wall >= action.job.retry_at, \
                    "claimed during its backoff"
                self.claims.append(action.job.id)
                del self.jobs[action.job.id]
                self.local = replace(self.local, cpu_slots_free=(self.local.cpu_slots_free or 0) - 1)
                answer = core.ClaimAnswered(True, self.local)
            else:
                assert not isinstance(action, core.ToGang), action


def _job(job_id: str, seq: int = 1, *, avoid: str | None = None, retry_at: float | None = None,
         req: JobRequest | None = None) -> core.QueuedJob:
    return core.QueuedJob(job_id, seq, "", req or JobRequest(job_id=job_id, user="alice"), avoid=avoid,
                          retry_at=retry_at)


def _core() -> core.SchedulerCore:
    return core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=2.0)


def _target(w: World) -> str | None:
    """Where the pass placed the one job: this machine (a claim), a peer (an offer), or None."""
    assert len(w.claims) + len(w.offers) <= 1, (w.claims, w.offers)
    return ME if w.claims else w.offers[0][1] if w.offers else None


# ------------------------------------------------------------------------ --retry-elsewhere


@given(local_free=st.integers(0, 2), peers=st.dictionaries(st.sampled_from(PEERS), st.integers(0, 2)),
       avoid=st.sampled_from([None, ME, *PEERS]), users=st.sampled_from([("alice",), ("alice", "bob")]))
def test_a_retry_goes_to_any_other_worker_that_fits_now_and_to_the_avoided_one_only_when_none_does(
        local_free: int, peers: dict[str, int], avoid: str | None, users: tuple[str, ...]) -> None:
    w = World(_host(ME, local_free), [_host(p, n) for p, n in sorted(peers.items())])
    w.jobs["r"] = _job("r", 2, avoid=avoid)
    if len(users) > 1:  # another user's job that never fits: the reasons are judged job by job
        w.jobs["x"] = _job("x", 1, req=JobRequest(job_id="x", user="bob", gpu_count=9))
    w.run(_core())
    fits = {ME} if local_free else set()
    fits |= {p for p, n in peers.items() if n}
    target = _target(w)
    if not fits:
        assert target != ME
    elif fits - {avoid}:
        assert target in fits - {avoid}, (target, fits, avoid)
    else:
        assert target == avoid  # "prefer", not "forbid": the only fit still runs it


def test_a_retry_that_avoids_this_machine_is_claimed_here_when_no_peer_takes_it_in_two_offers() -> None:
    w = World(_host(ME, 2), [_host("h1", 2)])
    w.jobs["r"] = _job("r", avoid=ME)
    c = _core()
    w.run(c)
    assert (w.claims, w.offers) == ([], [("r", "h1")])
    w.now = 2.5  # the peer has not claimed it: offered again
    w.run(c)
    assert (w.claims, w.offers) == ([], [("r", "h1")])
    w.now = 4.5  # two offers: this machine after all (the peer may be gone)
    w.run(c)
    assert w.claims == ["r"]
    # No peer fits it now: here at once.
    w = World(_host(ME, 2), [_host("h1", 0)])
    w.jobs["r"] = _job("r", avoid=ME)
    w.run(_core())
    assert w.claims == ["r"]


def test_a_device_retry_never_goes_to_the_avoided_peer_for_its_smaller_card() -> None:
    """Best fit across hosts leaves a 16 GB job to a peer's 24 GB card rather than this machine's
    94 GB one; a retry that avoids that peer runs here, or on another peer's 24 GB card."""
    here = _host(ME, 2, _card(ME, 95830, (9, 0), "NVIDIA H100 NVL"))
    small = _host("h1", 2, _card("h1", 24564, (8, 6), "NVIDIA RTX A5000"))
    other = _host("h2", 2, _card("h2", 24564, (8, 6), "NVIDIA RTX A5000"))
    req = JobRequest(job_id="g", accelerator=Accelerator.CUDA, gpu_count=1, gpu_memory_bytes=16 * GB, user="alice")
    w = World(here, [small])
    w.jobs["g"] = _job("g", req=req)
    w.run(_core())
    assert (w.claims, w.offers) == ([], [("g", "h1")])  # best fit, no retry
    w = World(here, [small])
    w.jobs["g"] = _job("g", req=req, avoid="h1")
    w.run(_core())
    assert (w.claims, w.offers) == (["g"], [])
    w = World(here, [small, other])
    w.jobs["g"] = _job("g", req=req, avoid="h1")
    w.run(_core())
    assert (w.claims, w.offers) == ([], [("g", "h2")])
    # Avoiding this machine, and only the 94 GB card is free here: the peer's card, not only a smaller one.
    w = World(here, [_host("h1", 2, _card("h1", 95830, (9, 0), "NVIDIA H100 NVL"))])
    w.jobs["g"] = _job("g", req=req, avoid=ME)
    w.run(_core())
    assert (w.claims, w.offers) == ([], [("g", "h1")])


def test_prefer_others_keeps_the_avoided_worker_only_alone() -> None:
    a, b = Fit("a"), Fit("b")
    assert prefer_others([a, b], "a") == [b]
    assert prefer_others([a], "a") == [a]
    assert prefer_others([a, b], None) == [a, b]
    assert prefer_others([], "a") == []


# ------------------------------------------------------------------------ backoff


def test_a_retry_in_its_backoff_is_neither_claimed_nor_offered_until_retry_at() -> None:
    w = World(_host(ME, 1), [_host("h1", 2)])
    w.jobs["r"] = _job("r", 1, retry_at=1010.0)
    w.jobs["n"] = _job("n", 2)
    c = _core()
    w.run(c)
    assert (w.claims, w.offers) == (["n"], [])  # the other job is not held up; "r" waits (no denied claim)
    assert "r" not in w.reasons  # its stored line (the retry's) stays
    assert c.retry_due() == 1010.0
    w.wall, w.now = 1005.0, 5.0
    w.run(c)
    assert (w.claims, w.offers) == ([], [])
    w.wall, w.now = 1010.0, 10.0  # nothing else changed (no event): released and walked as a new job
    w.run(c)
    assert (w.claims, w.offers) == ([], [("r", "h1")])  # this machine is full now: the peer
    assert c.retry_due() is None
    # Without a wall clock (an old driver) nothing is held.
    w = World(_host(ME, 1), [], wall=None)
    w.jobs["r"] = _job("r", retry_at=1e12)
    w.run(_core())
    assert w.claims == ["r"]


def test_a_retry_queued_again_after_a_pass_is_held_and_released_on_the_settled_path() -> None:
    """The job arrives by an event (not a reload) into a queue the last pass settled."""
    w = World(_host(ME, 2), [])
    w.jobs["a"] = _job("a", 1, req=JobRequest(job_id="a", user="alice", gpu_count=9))  # never fits
    c = _core()
    w.run(c)
    w.jobs["r"] = _job("r", 2, retry_at=1003.0, avoid=ME)
    w.run(c, changed=("r",))
    assert (w.claims, w.offers, c.retry_due()) == ([], [], 1003.0)
    w.wall, w.now = 1003.0, 3.0
    w.run(c)
    assert w.claims == ["r"]  # avoids this machine, but no peer fits


@given(ends=st.lists(st.floats(0, 100), max_size=8), wall=st.floats(0, 100))
def test_retry_holds_release_exactly_the_ended_backoffs(ends: list[float], wall: float) -> None:
    holds = RetryHolds()
    for i, t in enumerate(ends):
        holds.keep(core.QueuedJob(f"j{i}", i, "", retry_at=t))
    assert holds.next_due() == (min(ends) if ends else None)
    released = holds.release(wall)
    assert released == [f"j{i}" for i, t in enumerate(ends) if t <= wall]
    assert all(t > wall for i, t in enumerate(ends) if f"j{i}" in holds)
    assert len(holds) + len(released) == len(ends)
    holds.keep(core.QueuedJob("j0", 0, ""))  # queued again without a backoff: not held
    assert "j0" not in holds
