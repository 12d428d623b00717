"""The scheduler's pass as a pure state machine (:class:`gpulayerd.core.scheduling.SchedulerCore`),
checked by a hypothesis state machine against a model lab: one machine with three GPUs and CPU
slots, a peer that comes and goes, users with usage, jobs submitted, cancelled and ended, foreign
processes on GPUs, claims that the owner refuses, and timer wake-ups the core may skip.

After every step:
- no device is claimed twice (checked at each claim: the placement's devices and slots are free);
- once a pass ran without a refused claim, no queued one-host job fits this machine now, unless the
  peer fits it now with smaller devices (best fit across hosts: it is offered there);
- every waiting job's stored reason is current: a fresh core (nothing kept) over the same world
  would claim nothing and change no reason.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpulayerd.core import scheduling as core
from gpulayerd.core.fairshare import Usage
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.scheduling import successor
from gpulayerd.core.scheduling.judging import fit_of
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    DistributedRequest,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.gpu.support import SUPPORT_MATRIX

ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7",
                           frameworks={"torch": FrameworkVersion("torch", "2.4.0", "torch")}, torch_cuda=True,
                           distributed_backends=("gloo", "nccl")),)
ME, PEER = "node-me", "node-peer"
USERS = ("alice", "bob", "carol")
# (GPUs, CPU processes, GPU memory GB or None, hosts): the shapes jobs are drawn from.
SHAPES = [(0, 1, None, 1), (0, 2, None, 1), (0, 3, None, 1), (1, 1, None, 1), (1, 1, 40, 1), (2, 1, None, 1),
          (3, 1, None, 1), (4, 1, None, 1), (0, 1, None, 2)]
GPU_MEMORY_GB = (24, 48, 80)


@dataclass
class Job:
    req: JobRequest
    seq: int
    status: str = "queued"
    reason: str = ""
    devices: tuple[str, ...] = ()
    slots: int = 0


@dataclass
class Lab:
    """The world the scheduler's actions act on (the store, this machine, a peer, the usage)."""

    jobs: dict[str, Job] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # job id of each event (its seq is its index + 1)
    foreign: set[int] = field(default_factory=set)  # GPUs a process gpulayer did not start uses
    slots_total: int = 2
    peer: WorkerSnapshot | None = None
    usage: dict[str, Usage] = field(default_factory=dict)
    now: float = 1000.0

    def event(self, job_id: str) -> None:
        self.events.append(job_id)

    def local(self) -> WorkerSnapshot:
        held = {uuid: jid for jid, j in self.jobs.items() if j.status == "running" for uuid in j.devices}
        by_user: dict[str, int] = {}
        for j in self.jobs.values():
            if j.status == "running" and j.devices:
                by_user[j.req.user] = by_user.get(j.req.user, 0) + len(j.devices)
        devices = tuple(
            DeviceSnapshot(Accelerator.CUDA, i, f"GPU-{i}", "NVIDIA A100", mem * GB, 0, MemoryKind.DEDICATED, (8, 0),
                           "580.126.09", True, True, granted_to=held.get(f"GPU-{i}"),
                           foreign_pids=(4242,) if i in self.foreign else ())
            for i, mem in enumerate(GPU_MEMORY_GB))
        used = sum(j.slots for j in self.jobs.values() if j.status == "running")
        return WorkerSnapshot(ME, devices=devices, environments=ENV, cpu_count=8, memory_total_bytes=64 * GB,
                              cpu_slots_total=self.slots_total, cpu_slots_free=max(0, self.slots_total - used),
                              mode="system", gpus_held_by_user=by_user)

    def queued(self, job_id: str, with_request: bool) -> core.QueuedJob:
        j = self.jobs[job_id]
        return core.QueuedJob(job_id, j.seq, j.reason, j.req if with_request else None)


def drive(c: core.SchedulerCore, lab: Lab, refuse: list[bool], meanwhile: int | None = None,
          offers: list[core.SendOffer] | None = None) -> tuple[list[core.Claim], list[core.StoreReasons], int]:
    """Run one pass of ``c`` over ``lab``; returns its claims, its reason writes and how many claims were
    refused (its offers are appended to ``offers`` when given).

    ``meanwhile``: at the first granted claim, another run (picked by this number) ends at the same
    time (the snapshot after the claim shows both).
    """
    claims: list[core.Claim] = []
    writes: list[core.StoreReasons] = []
    refused = 0
    steps = c.run_pass()
    answer: core.Answer = None
    while True:
        try:
            action = steps.send(answer)
        except StopIteration:
            break
        answer = core.Resume()
        if isinstance(action, core.ReadChanges):
            after = lab.events[action.since:]
            changed = tuple((lab.queued(j, not c.queued(j) and lab.jobs[j].status == "queued"),
                             lab.jobs[j].status == "queued") for j in dict.fromkeys(after))
            count = sum(j.status == "queued" for j in lab.jobs.values())
            answer = core.QueueChanges(len(lab.events), count, changed)
        elif isinstance(action, core.ReadQueue):
            queued = sorted((j for j, job in lab.jobs.items() if job.status == "queued"), key=lambda j: lab.jobs[j].seq)
            answer = core.QueueLoaded(len(lab.events), tuple(lab.queued(j, True) for j in queued))
        elif isinstance(action, core.ReadMachine):
            answer = core.MachineRead(lab.local() if action.local else None,
                                      (lab.peer,) if lab.peer is not None else (), dict(lab.usage), lab.now)
        elif isinstance(action, core.Claim):
            claims.append(action)
            job = lab.jobs[action.job.id]
            assert job.status == "queued", f"claimed {action.job.id}, which is {job.status}"
            assert action.placement.worker == ME
            local = lab.local()
            busy = {d.uuid for d in local.devices if d.granted_to is not None or d.foreign_pids}
            devices = tuple(u for u in action.placement.device_uuids if u)
            assert not set(devices) & busy, f"device claimed twice: {devices} of which {busy} are in use"
            assert len(devices) == job.req.gpu_count
            # CPU slots are what jobs without a device use (a GPU job's judgement never reads them).
            need = 0 if job.req.gpu_count else job.req.distributed.nproc_per_node if job.req.distributed else 1
            assert (local.cpu_slots_free or 0) >= need, "CPU slots claimed twice"
            if refuse and refuse.pop(0):
                refused += 1
                answer = core.ClaimAnswered(False)
            else:
                running = sorted(j for j, x in lab.jobs.items() if x.status == "running")
                job.status, job.devices, job.slots = "running", devices, need
                lab.event(action.job.id)
                if meanwhile is not None and running:
                    ended = running[meanwhile % len(running)]
                    lab.jobs[ended].status = "succeeded"
                    lab.event(ended)
                    meanwhile = None
                answer = core.ClaimAnswered(True, lab.local())
        elif isinstance(action, core.StoreReasons):
            writes.append(action)
            for q, text, _ in action.items:
                if lab.jobs[q.id].status == "queued":
                    lab.jobs[q.id].reason = text  # no event: as the store's set_explanations
        elif isinstance(action, core.SendOffer) and offers is not None:
            offers.append(action)
    return claims, writes, refused


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lab = Lab()
        self.core = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
        self.woken = True
        self.settled = False  # the last pass ran without a refused claim and nothing changed since
        self.n = 0
        self.successors = 0  # slots given to an array's next task without a pass

    def _changed(self, then_pass: bool = False) -> None:
        self.woken = True
        self.settled = False
        if then_pass:  # most changes wake the scheduler at once
            self.scheduling_pass([])

    @rule(shape=st.sampled_from(SHAPES), user=st.sampled_from(USERS), copies=st.integers(1, 3), then=st.booleans())
    def submit(self, shape: tuple[int, int, int | None, int], user: str, copies: int, then: bool) -> None:
        gpus, procs, mem, hosts = shape
        for _ in range(copies):
            self.n += 1
            job_id = f"job-{self.n:03d}"
            dist = DistributedRequest(nnodes=hosts, nproc_per_node=procs) if procs > 1 or hosts > 1 else None
            req = JobRequest(job_id=job_id, accelerator=Accelerator.CUDA if gpus else Accelerator.CPU, gpu_count=gpus,
                             gpu_memory_bytes=mem * GB if mem else None, distributed=dist, user=user)
            self.lab.jobs[job_id] = Job(req, self.n)
            self.lab.event(job_id)
        self._changed(then)

    @rule(shape=st.sampled_from(SHAPES[:4]), user=st.sampled_from(USERS), tasks=st.integers(1, 8), then=st.booleans())
    def submit_array(self, shape: tuple[int, int, int | None, int], user: str, tasks: int, then: bool) -> None:
        gpus, procs, mem, _ = shape
        self.n += 1
        array = f"arr-{self.n:03d}"
        for i in range(tasks):  # (materialized: a job row each, ``ARRAY_INDEX``)
            self.n += 1
            dist = DistributedRequest(nnodes=1, nproc_per_node=procs) if procs > 1 else None
            req = JobRequest(job_id=f"{array}_{i}", accelerator=Accelerator.CUDA if gpus else Accelerator.CPU,
                             gpu_count=gpus, gpu_memory_bytes=mem * GB if mem else None, distributed=dist, user=user)
            self.lab.jobs[req.job_id] = Job(req, self.n)
            self.lab.event(req.job_id)
        self._changed(then)

    @rule(pick=st.integers(0, 99))
    def a_task_ends_and_its_slot_goes_on(self, pick: int) -> None:
        """A task of an array ends here while nothing asked for a pass since the last one: the core's
        successor, when it names one, is the claim a fresh core's pass over the same world makes first."""
        if self.woken:
            self.scheduling_pass([])  # (what asked for a pass got it first)
        running = sorted(j for j, job in self.lab.jobs.items() if job.status == "running" and "_" in j)
        if not running:
            return
        ended = running[pick % len(running)]
        self.lab.jobs[ended].status = "succeeded"
        self.lab.event(ended)
        claim = self.core.successor(ended, self.lab.local(), dict(self.lab.usage), peer_offers=False)
        if claim is None:
            self._changed()  # the scheduler runs a pass instead
            return
        world = copy.deepcopy(self.lab)
        claims, _, _ = drive(core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0), world, [])
        assert claims and (claims[0].job.id, claims[0].placement) == (claim.job.id, claim.placement), (
            f"successor {claim.job.id}, a pass's first claim {[c.job.id for c in claims[:1]]}")
        job = self.lab.jobs[claim.job.id]
        job.status, job.devices = "running", tuple(u for u in claim.placement.device_uuids if u)
        job.slots = 0 if job.req.gpu_count else job.req.distributed.nproc_per_node if job.req.distributed else 1
        self.lab.event(claim.job.id)
        self.core.claimed_here(claim.job.id)
        self.successors += 1

    @rule(pick=st.integers(0, 99), then=st.booleans())
    def cancel(self, pick: int, then: bool) -> None:
        queued = sorted(j for j, job in self.lab.jobs.items() if job.status == "queued")
        if queued:
            j = queued[pick % len(queued)]
            self.lab.jobs[j].status = "cancelled"
            self.lab.event(j)
            self._changed(then)

    @rule(pick=st.integers(0, 99), then=st.booleans())
    def end_a_run(self, pick: int, then: bool) -> None:
        running = sorted(j for j, job in self.lab.jobs.items() if job.status == "running")
        if running:
            j = running[pick % len(running)]
            self.lab.jobs[j].status = "succeeded"
            self.lab.event(j)
            self._changed(then)

    @rule(gpu=st.integers(0, len(GPU_MEMORY_GB) - 1), then=st.booleans())
    def foreign_process(self, gpu: int, then: bool) -> None:
        self.lab.foreign ^= {gpu}  # the probe sees it start or end (it wakes the scheduler)
        self._changed(then)

    @rule(total=st.integers(1, 4), then=st.booleans())
    def cpu_slots(self, total: int, then: bool) -> None:
        self.lab.slots_total = total
        self._changed(then)

    @rule(present=st.booleans(), free=st.integers(0, 3), gpu=st.booleans())
    def peer(self, present: bool, free: int, gpu: bool) -> None:
        devices = (DeviceSnapshot(Accelerator.CUDA, 0, "GPU-p0", "NVIDIA L4", 24 * GB, 0, MemoryKind.DEDICATED, (8, 9),
                                  "580.126.09", True, True),) if gpu else ()
        self.lab.peer = WorkerSnapshot(PEER, devices=devices, environments=ENV, cpu_count=4, memory_total_bytes=16 * GB,
                                       cpu_slots_total=3, cpu_slots_free=free, mode="system") if present else None
        self.settled = False  # no wake-up: the core must notice the peers' change itself

    @rule(user=st.sampled_from(USERS), gpu_hours=st.floats(0, 50))
    def usage(self, user: str, gpu_hours: float) -> None:
        self.lab.usage[user] = Usage(gpu_s=gpu_hours * 3600.0)
        self.settled = False  # no wake-up: decayed usage changes with the clock

    @rule(dt=st.floats(0.1, 10.0))
    def tick(self, dt: float) -> None:
        self.lab.now += dt

    @rule(refuse=st.lists(st.booleans(), max_size=3), meanwhile=st.none() | st.integers(0, 9))
    def scheduling_pass(self, refuse: list[bool], meanwhile: int | None = None) -> None:
        remote = [self.lab.peer] if self.lab.peer is not None else []
        if not self.woken and self.core.idle(remote, dict(self.lab.usage)):
            self.settled = True  # the core vouches nothing it reads changed: the checks must hold
            return
        self.woken = False
        _, _, refused = drive(self.core, self.lab, refuse, meanwhile)
        # A refused claim, or a run that ended during the pass, wakes the scheduler again: the next
        # pass settles what this one could not vouch for.
        self.settled = refused == 0 and meanwhile is None
        if not self.settled:
            self.woken = True  # a refused claim wakes the scheduler (another daemon took a device)

    @precondition(lambda self: self.settled)
    @invariant()
    def no_queued_job_that_fits_here_is_left(self) -> None:
        local = self.lab.local()
        for j, job in self.lab.jobs.items():
            if job.status == "queued" and not (job.req.distributed and job.req.distributed.nnodes > 1):
                here = evaluate(job.req, local, SUPPORT_MATRIX).placement
                there = evaluate(job.req, self.lab.peer, SUPPORT_MATRIX).placement if self.lab.peer else None
                # Best fit across hosts: a device job waits here only for a peer whose fit now is smaller.
                smaller = (here is not None and there is not None and self.lab.peer is not None
                           and fit_of(there, self.lab.peer).size < fit_of(here, local).size)
                assert here is None or smaller, f"{j} fits here and waits"

    @precondition(lambda self: self.settled)
    @invariant()
    def every_waiting_jobs_reason_is_current(self) -> None:
        fresh = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
        fresh.offered = dict(self.core.offered)
        before = {j: job.reason for j, job in self.lab.jobs.items()}
        claims, writes, _ = drive(fresh, self.lab, [True] * 99)  # refuse all: the world stays as it is
        stale = {q.id: (before[q.id], text) for w in writes for q, text, _ in w.items if before[q.id] != text}
        for j, text in before.items():  # (what the fresh pass wrote is put back: the world stays as it is)
            self.lab.jobs[j].reason = text
        assert claims == [], f"a fresh pass claims {[c.job.id for c in claims]}"
        assert stale == {}, f"stored reasons a fresh pass changes: {stale}"


SchedulerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestSchedulerPasses = SchedulerMachine.TestCase
TestSchedulerPasses.pytestmark = [pytest.mark.slow]  # (hypothesis: 300 sequences of 40 steps, ~6 s)


def test_a_pass_claims_what_fits_here_offers_what_fits_a_peer_and_says_why_the_rest_waits() -> None:
    lab = Lab(slots_total=2)
    lab.peer = WorkerSnapshot(PEER, environments=ENV, cpu_count=4, cpu_slots_total=3, cpu_slots_free=3, mode="system")
    for n, gpus in enumerate((1, 0, 0, 0, 9), start=1):
        req = JobRequest(job_id=f"j{n}", accelerator=Accelerator.CUDA if gpus else Accelerator.CPU, gpu_count=gpus,
                         user="alice")
        lab.jobs[f"j{n}"] = Job(req, n)
        lab.event(f"j{n}")
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    claims, writes, _ = drive(c, lab, [])  # 2 CPU slots: j2 and j3 start, j4 waits
    assert [(a.job.id, a.placement.device_uuids) for a in claims] == [("j1", ("GPU-0",)), ("j2", ()), ("j3", ())]
    assert sorted(q.id for w in writes for q, _, _ in w.items) == ["j4", "j5"]
    assert {j: job.status for j, job in lab.jobs.items()} == {
        "j1": "running", "j2": "running", "j3": "running", "j4": "queued", "j5": "queued"}
    assert lab.jobs["j4"].reason.startswith("Ready"), lab.jobs["j4"].reason  # offered to the peer
    assert c.offered["j4"][0] == PEER
    assert lab.jobs["j5"].reason == "DeviceCount: needs 9 whole cuda device(s) at once, worker node-me has 3 in all"
    # Nothing changed: the core vouches a timer pass would decide nothing (the offer is repeated, though).
    assert not c.idle([lab.peer], {})
    lab.peer = None
    drive(c, lab, [])
    assert lab.jobs["j4"].reason.startswith("Resources"), lab.jobs["j4"].reason
    assert c.idle([], {})


def test_slots_freed_during_a_cpu_claim_are_walked_at_the_next_pass() -> None:
    """A claim of one CPU slot while a 2-slot run ends: the walk's snapshot shows more free than
    before the claim, so the next pass walks every job (the waiting 2-slot job starts)."""
    m = SchedulerMachine()
    m.cpu_slots(total=3, then=False)
    m.submit(shape=(0, 2, None, 1), user="alice", copies=1, then=True)  # job-001 runs on 2 slots
    m.submit(shape=(0, 2, None, 1), user="alice", copies=1, then=True)  # job-002 waits: 1 free
    assert m.lab.jobs["job-002"].reason.startswith("Resources"), m.lab.jobs["job-002"].reason
    m.submit(shape=(0, 1, None, 1), user="alice", copies=1, then=False)  # job-003: 1 slot
    m.scheduling_pass(refuse=[], meanwhile=0)  # job-003 claimed while job-001 ends
    assert [m.lab.jobs[j].status for j in ("job-001", "job-002", "job-003")] == ["succeeded", "queued", "running"]
    m.scheduling_pass(refuse=[])  # the wake-up of job-001's end
    assert m.lab.jobs["job-002"].status == "running"
    m.no_queued_job_that_fits_here_is_left()
    m.every_waiting_jobs_reason_is_current()


def test_a_gpu_job_waiting_behind_another_users_gpus_keeps_timer_passes_on() -> None:
    """Whether bob (holding every GPU here) passes alice over depends on usage that changes
    without an event: the core never calls a timer pass idle while that can change her line."""
    m = SchedulerMachine()
    m.usage(user="bob", gpu_hours=10.0)
    m.submit(shape=(3, 1, None, 1), user="bob", copies=1, then=True)  # bob holds all 3 GPUs
    m.submit(shape=(1, 1, None, 1), user="alice", copies=1, then=True)
    assert m.lab.jobs["job-002"].reason.startswith("Resources"), m.lab.jobs["job-002"].reason
    m.usage(user="bob", gpu_hours=0.0)
    m.usage(user="alice", gpu_hours=10.0)
    m.scheduling_pass(refuse=[])  # a timer pass: not skipped
    # bob still holds every GPU: that decides (the holder named); the fair-share order decides only
    # once a GPU frees up, and its words carry no figures, so the usage change alone changes nothing.
    assert m.lab.jobs["job-002"].reason.startswith("Resources: GPU 0 is granted to job job-001"), \
        m.lab.jobs["job-002"].reason
    m.every_waiting_jobs_reason_is_current()


def test_a_freed_slot_goes_to_the_arrays_next_task_unless_another_job_goes_first() -> None:
    """The core's successor of an ended task: the array's next task while it is first in fair-share order
    (and equal to a fresh pass's first claim, the rule's own check); never a job that is no task, nor a
    task while another user's job, who used less, waits ahead."""
    m = SchedulerMachine()
    m.submit_array(shape=(0, 1, None, 1), user="alice", tasks=5, then=True)  # arr-001_0 and _1 run (2 slots)
    m.a_task_ends_and_its_slot_goes_on(pick=0)
    assert m.successors == 1
    assert {j: x.status for j, x in m.lab.jobs.items()} == {
        "arr-001_0": "succeeded", "arr-001_1": "running", "arr-001_2": "running", "arr-001_3": "queued",
        "arr-001_4": "queued"}
    assert m.core.successor("job-999", m.lab.local(), {}, peer_offers=False) is None  # (not a task: a pass decides)
    m.lab.jobs["arr-001_1"].status = "succeeded"  # (its end, the rule's first half)
    m.lab.event("arr-001_1")
    assert m.core.successor("arr-001_1", m.lab.local(), {}, peer_offers=True) is None  # a pass orders a peer's offer
    claim = m.core.successor("arr-001_1", m.lab.local(), {}, peer_offers=False)
    assert claim is not None and claim.job.id == "arr-001_3"
    m._changed(then_pass=True)  # (not taken: a pass claims it instead)
    assert m.lab.jobs["arr-001_3"].status == "running"
    m.usage(user="alice", gpu_hours=5.0)
    m.submit(shape=(0, 1, None, 1), user="bob", copies=1, then=True)  # bob waits ahead of alice's tasks now
    m.a_task_ends_and_its_slot_goes_on(pick=0)
    assert m.successors == 1 and m.woken  # a pass, then: it claims bob's job
    m.scheduling_pass([])
    assert m.lab.jobs["job-007"].status == "running" and m.lab.jobs["arr-001_4"].status == "queued"


def test_the_timers_pass_comes_however_often_successors_are_claimed() -> None:
    timer = core.TimerPass(5.0, now=100.0)
    asked: list[float] = []

    def idle(answer: bool) -> Callable[[], bool]:
        return lambda: asked.append(1) or answer

    assert not timer.due(104.9, idle(False)) and asked == []  # (the core is not asked before the interval)
    assert timer.due(105.0, idle(False))  # busy: a pass is owed
    assert not timer.due(105.0, idle(True))  # idle: none, and the interval starts again
    assert not timer.due(109.9, idle(False))
    timer.looked(110.0)  # a pass ran
    assert timer.left(111.0) == 4.0 and timer.left(116.0) == 0.01  # (the scheduler's wait: the pass comes on time)
    assert not timer.due(114.9, idle(False)) and timer.due(115.0, idle(False))


def test_a_stream_of_passes_only_peers_asked_for_is_paced_a_lone_one_is_not() -> None:
    timer = core.TimerPass(5.0, now=100.0, peer_gap_s=0.05, peer_at_once=2)
    timer.turned(100.0)
    assert timer.hold(100.01, peers_only=False) == 0.0  # this node's own wake-up (a submit, a slot freed): at once
    assert [timer.hold(100.01, peers_only=True) for _ in range(2)] == [0.0, 0.0]  # lone ones: at once
    assert timer.hold(100.01, peers_only=True) == pytest.approx(0.04)  # a stream: 50 ms after the last turn
    assert timer.hold(100.06, peers_only=True) == 0.0  # (its gap passed: no wait, and no credit taken)
    timer.turned(100.1)
    assert timer.hold(100.12, peers_only=True) == pytest.approx(0.03)
    later = 100.12 + successor.PEER_PASS_REFILL_S  # one more at once after the refill time
    assert timer.hold(later, peers_only=True) == 0.0
    timer.turned(later)
    assert timer.hold(later, peers_only=True) == pytest.approx(0.05)  # (that one used the credit)
    timer.turned(200.0)  # (a turn of successor claims counts too: it took what came before it)
    assert [timer.hold(200.0, peers_only=True) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.05)]  # (at most 2)
    fresh = core.TimerPass(5.0, now=0.0)
    assert [fresh.hold(0.0, peers_only=True) for _ in range(successor.PEER_PASSES_AT_ONCE)] == [0.0] * 4
    assert fresh.hold(0.0, peers_only=True) == pytest.approx(successor.PEER_PASS_GAP_S)

