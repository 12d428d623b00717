"""Standing offers (issue 31): a job that fits a peer but waits for its busy devices is offered to it
anyway, the heads of each user's line, so that the peer chooses among every waiting user's jobs by
fair share when a device frees up. Driven through the scheduler's pure core."""

from __future__ import annotations

import pytest

from gpulayerd.core import scheduling as core
from gpulayerd.core.fairshare import Usage
from gpulayerd.core.scheduling.judging import BUSY_OFFERS
from gpulayerd.core.types import Accelerator, DeviceSnapshot, JobRequest, MemoryKind, WorkerSnapshot
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.unit.test_scheduling_core import ENV, GB, GPU_MEMORY_GB, ME, PEER, Job, Lab, drive


def _peer(held_by: str | None, users: dict[str, int]) -> WorkerSnapshot:
    gpu = DeviceSnapshot(Accelerator.CUDA, 0, "GPU-P0", "NVIDIA A100", 80 * GB, 0, MemoryKind.DEDICATED, (8, 0),
                         "580.126.09", True, True, granted_to=held_by)
    return WorkerSnapshot(PEER, name="ws-p", devices=(gpu,), environments=ENV, cpu_count=4, cpu_slots_total=3,
                          cpu_slots_free=3, mode="system", gpus_held_by_user=users)


def _pass(c: core.SchedulerCore, lab: Lab) -> list[core.SendOffer]:
    """One pass over ``lab``; the offers it sends (it claims nothing: every local GPU is in use)."""
    offers: list[core.SendOffer] = []
    claims, _, _ = drive(c, lab, [], offers=offers)
    assert claims == []
    return offers


def _lab(users: dict[str, int]) -> Lab:
    lab = Lab(usage={"alice": Usage(gpu_s=7200.0), "bob": Usage(gpu_s=60.0)})
    lab.foreign = set(range(len(GPU_MEMORY_GB)))  # this machine's GPUs: in use by processes gpulayer did not start
    lab.peer = _peer("job-x", users)
    n = 0
    for user in ("alice", "bob"):
        for _ in range(4):
            n += 1
            job_id = f"job-{n:03d}"
            lab.jobs[job_id] = Job(JobRequest(job_id=job_id, accelerator=Accelerator.CUDA, gpu_count=1, user=user), n)
            lab.event(job_id)
    return lab


def test_the_heads_of_each_users_line_are_offered_to_the_busy_peer() -> None:
    lab = _lab({"alice": 1})
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    offers = _pass(c, lab)
    assert BUSY_OFFERS == 2
    # bob (less usage) first; two of each user's jobs, oldest first; all to the busy peer.
    assert [(o.job_id, o.worker) for o in offers] == [
        ("job-005", PEER), ("job-006", PEER), ("job-001", PEER), ("job-002", PEER)]
    # Offers are repeated only every offer_interval_s.
    lab.now += 1.0
    assert _pass(c, lab) == []
    lab.now += 5.0
    assert [o.job_id for o in _pass(c, lab)] == ["job-005", "job-006", "job-001", "job-002"]
    # bob waits ahead of alice: her jobs say so, the holders named; bob's name the holders alone.
    assert lab.jobs["job-001"].reason.startswith(
        "FairShare: fair share: bob's jobs go first (less recent GPU use than alice); "), lab.jobs["job-001"].reason
    assert "GPU 0 is busy with processes gpulayer did not start (pid 4242)" in lab.jobs["job-001"].reason
    assert lab.jobs["job-005"].reason.startswith("Resources: "), lab.jobs["job-005"].reason


def test_no_standing_offer_without_a_peer_the_job_fits() -> None:
    lab = _lab({})
    lab.peer = WorkerSnapshot(PEER, name="ws-p", environments=ENV, cpu_count=4, cpu_slots_total=3, cpu_slots_free=3,
                              mode="system")  # no GPU: the jobs never fit it
    c = core.SchedulerCore(ME, SUPPORT_MATRIX, offer_interval_s=5.0)
    assert _pass(c, lab) == []


def test_a_kept_offer_that_waits_for_granted_devices_is_not_judged_in_full() -> None:
    from gpulayerd.app.worker.kept_offers import may_fit
    from gpulayerd.net.wire import Offer

    def offer(spec: dict[str, object]) -> Offer:
        return Offer(msg_id="m1", owner="n-owner", job_id="j1", spec=spec, lease_s=30.0)

    gpu_job = offer({"command": ["true"], "workdir": "/tmp", "user": "alice",
                     "requirements": {"accelerator": "cuda", "gpu_count": 1}})
    assert not may_fit(gpu_job, _peer("job-x", {"bob": 1}), SUPPORT_MATRIX)  # its one GPU is granted
    assert may_fit(gpu_job, _peer(None, {}), SUPPORT_MATRIX)
    assert may_fit(offer({"command": []}), _peer("job-x", {}), SUPPORT_MATRIX)  # unparsable: judged in full


def test_a_kept_offers_spec_is_parsed_once_not_at_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack (issue 31): a member keeps 512 offers here (its share); each pass's first look at them
    must not parse 512 specs again (twice the cost of judging them): each is parsed once while kept."""
    from gpulayerd.app.worker import kept_offers
    from gpulayerd.net.wire import Offer

    parsed: list[str] = []
    real = kept_offers.offered_spec

    def counting(offer: Offer) -> object:
        parsed.append(offer.job_id)
        return real(offer)

    monkeypatch.setattr(kept_offers, "offered_spec", counting)
    spec = {"command": ["true"], "workdir": "/tmp", "user": "alice", "requirements": {"accelerator": "cuda"}}
    kept = kept_offers.KeptOffers()
    for n in range(512):
        kept[("n-flood", f"j{n}")] = Offer(msg_id="m", owner="n-flood", job_id=f"j{n}", spec=spec, lease_s=30.0)
    busy = _peer("job-x", {"bob": 1})
    for _ in range(3):  # three passes
        assert not any(kept.may_fit(key, busy, SUPPORT_MATRIX) for key in kept)
    assert len(parsed) == 512
    kept[("n-flood", "j0")] = Offer(msg_id="m2", owner="n-flood", job_id="j0", spec=spec, lease_s=30.0)
    assert kept.may_fit(("n-flood", "j0"), _peer(None, {}), SUPPORT_MATRIX)  # a new offer: parsed again
    assert kept.pop(("n-flood", "j1")) is not None and not kept.may_fit(("n-flood", "j1"), busy, SUPPORT_MATRIX)
    assert len(parsed) == 513 and len(kept) == 511


def test_kept_offers_of_one_shape_are_judged_once_per_machine_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    # A burst leaves many offers of one shape here: a walk judges the shape once per snapshot of
    # this machine, and a new snapshot (a device freed or granted) judges it again.
    from dataclasses import replace

    from gpulayerd.app.worker import kept_offers
    from gpulayerd.net.wire import Offer, new_msg_id

    judged: list[str] = []
    real = kept_offers._fits

    def counting(req: object, worker: WorkerSnapshot, support: object) -> bool:
        judged.append(getattr(req, "job_id", ""))
        return real(req, worker, support)  # type: ignore[arg-type]

    monkeypatch.setattr(kept_offers, "_fits", counting)
    spec = {"command": ["python", "t.py"], "requirements": {"accelerator": "cuda", "gpu_count": 1}}
    offers = kept_offers.KeptOffers()
    for i in range(5):
        offers[("o" * 52, f"j{i}")] = Offer(msg_id=new_msg_id(), owner="o" * 52, job_id=f"j{i}", lease_s=10.0,
                                            spec=spec)
    gpu = DeviceSnapshot(accelerator=Accelerator.CUDA, index=0, uuid="GPU-0", name="RTX", execution_supported=True,
                         memory_total_bytes=24 * 10**9)
    free = WorkerSnapshot(node_id="w" * 52, devices=(gpu,), environments=ENV)
    first = [offers.may_fit(k, free, SUPPORT_MATRIX) for k in offers]
    assert len(judged) == 1
    busy = replace(free, devices=(replace(gpu, granted_to="other"),))
    second = [offers.may_fit(k, busy, SUPPORT_MATRIX) for k in offers]
    assert len(judged) == 2 and all(first) and not any(second)
    assert first == [real(kept_offers._request(o), free, SUPPORT_MATRIX) for o in offers.values()]
    assert second == [real(kept_offers._request(o), busy, SUPPORT_MATRIX) for o in offers.values()]
