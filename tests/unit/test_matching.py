"""Table-driven tests of validate / match / explain: one case per rule of the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpulayerd.core.launch import launch_env
from gpulayerd.core.matching.evaluate import evaluate, explain, explain_many, match, validate
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    DistributedRequest,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState, Placement, RejectionCode, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX

MiB = 2**20


def cuda(index: int, mem_gb: float | None = 24.0, cc: tuple[int, int] | None = (8, 6), **kw: object) -> DeviceSnapshot:
    fields: dict[str, object] = {
        "accelerator": Accelerator.CUDA,
        "index": index,
        "uuid": f"GPU-{index:04d}",
        "name": "NVIDIA Test",
        "memory_total_bytes": None if mem_gb is None else int(mem_gb * GB),
        "memory_kind": MemoryKind.DEDICATED,
        "compute_capability": cc,
        "driver_version": "580.126.09",
        "execution_supported": True,
        "float64": True,
    }
    fields.update(kw)
    return DeviceSnapshot(**fields)  # type: ignore[arg-type]


def mps() -> DeviceSnapshot:
    return DeviceSnapshot(
        accelerator=Accelerator.MPS, index=0, uuid="mps-0", name="Apple M2 Max",
        memory_total_bytes=64 * 2**30, memory_kind=MemoryKind.UNIFIED, execution_supported=True,
        float64=False,
    )


def rocm(index: int = 0) -> DeviceSnapshot:
    return DeviceSnapshot(
        accelerator=Accelerator.ROCM, index=index, uuid=f"rocm-{index}", name="AMD Instinct",
        memory_total_bytes=64 * GB, memory_kind=MemoryKind.DEDICATED, execution_supported=False,
    )


def env(
    python: str | None = "3.11.7",
    frameworks: dict[str, str] | None = None,
    torch_cuda: bool | None = None,
    torch_mps: bool | None = None,
    backends: tuple[str, ...] | None = ("gloo",),
    interpreter: str = "/usr/bin/python3",
    ok: bool = True,
) -> EnvironmentSnapshot:
    from gpulayerd.core.matching.versions import is_valid_version

    fws = {
        name: FrameworkVersion(name=name, version=v, distribution=name, valid=is_valid_version(v))
        for name, v in (frameworks or {}).items()
    }
    return EnvironmentSnapshot(
        interpreter=interpreter, python_version=python, frameworks=fws, torch_cuda=torch_cuda,
        torch_mps=torch_mps, distributed_backends=backends, ok=ok,
    )


def worker(node: str = "w1", devices: tuple[DeviceSnapshot, ...] = (), envs: tuple[EnvironmentSnapshot, ...] | None = None, **kw: object) -> WorkerSnapshot:
    return WorkerSnapshot(
        node_id=node, name=node, devices=devices,
        environments=(env(),) if envs is None else envs, **kw,  # type: ignore[arg-type]
    )


def job(**kw: object) -> JobRequest:
    return JobRequest(job_id="j1", **kw)  # type: ignore[arg-type]


def codes(result: Placement | list) -> set[RejectionCode]:  # type: ignore[type-arg]
    assert not isinstance(result, Placement), f"unexpectedly placed: {result}"
    return {r.code for r in result}


CUDA1 = {"accelerator": Accelerator.CUDA, "gpu_count": 1}

# (case id, job kwargs, worker, expected: tuple of device indices placed, or set of codes)
CASES = [
    ("cpu job on cpu worker", {}, worker(), ()),
    ("cpu job on gpu worker uses no device", {}, worker(devices=(cuda(0),)), ()),
    ("cuda job, one gpu", CUDA1, worker(devices=(cuda(0),)), (0,)),
    ("cuda job on cpu-only worker", CUDA1, worker(), {RejectionCode.ACCELERATOR_MISMATCH}),
    ("gpu_count counts devices", {**CUDA1, "gpu_count": 2}, worker(devices=(cuda(0),)),
     {RejectionCode.NOT_ENOUGH_DEVICES}),
    ("two gpus granted", {**CUDA1, "gpu_count": 2}, worker(devices=(cuda(1), cuda(0))), (0, 1)),
    ("memory is per device, enough", {**CUDA1, "gpu_memory_bytes": 24 * GB}, worker(devices=(cuda(0, 24.0),)), (0,)),
    ("memory is per device, not summed", {**CUDA1, "gpu_count": 1, "gpu_memory_bytes": 40 * GB},
     worker(devices=(cuda(0, 24.0), cuda(1, 24.0))), {RejectionCode.INSUFFICIENT_MEMORY, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("GB is 10^9 bytes: 16 GiB card satisfies 17 GB", {**CUDA1, "gpu_memory_bytes": 17 * GB},
     worker(devices=(cuda(0, mem_gb=None, memory_total_bytes=16 * 2**30),)), (0,)),
    ("unknown memory is not satisfied", {**CUDA1, "gpu_memory_bytes": 8 * GB},
     worker(devices=(cuda(0, mem_gb=None),)), {RejectionCode.UNKNOWN_METRIC, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("best fit picks the smaller card", {**CUDA1, "gpu_memory_bytes": 20 * GB},
     worker(devices=(cuda(0, 80.0), cuda(1, 24.0))), (1,)),
    ("cc 8.6 >= 8.0", {**CUDA1, "min_cuda_compute_capability": (8, 0)}, worker(devices=(cuda(0, cc=(8, 6)),)), (0,)),
    ("cc 12.0 > 9.0", {**CUDA1, "min_cuda_compute_capability": (9, 0)}, worker(devices=(cuda(0, cc=(12, 0)),)), (0,)),
    ("cc 10.0 > 7.0", {**CUDA1, "min_cuda_compute_capability": (7, 0)}, worker(devices=(cuda(0, cc=(10, 0)),)), (0,)),
    ("cc 7.5 < 8.0", {**CUDA1, "min_cuda_compute_capability": (8, 0)}, worker(devices=(cuda(0, cc=(7, 5)),)),
     {RejectionCode.COMPUTE_CAPABILITY_TOO_LOW, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("cc unknown", {**CUDA1, "min_cuda_compute_capability": (8, 0)}, worker(devices=(cuda(0, cc=None),)),
     {RejectionCode.UNKNOWN_METRIC, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("memory kind dedicated wanted, unified found", {"accelerator": Accelerator.MPS, "gpu_count": 1,
     "gpu_memory_kind": MemoryKind.DEDICATED}, worker(devices=(mps(),)),
     {RejectionCode.MEMORY_KIND_MISMATCH, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("memory kind unified on mps", {"accelerator": Accelerator.MPS, "gpu_count": 1,
     "gpu_memory_kind": MemoryKind.UNIFIED}, worker(devices=(mps(),)), (0,)),
    ("memory kind unknown", {**CUDA1, "gpu_memory_kind": MemoryKind.DEDICATED},
     worker(devices=(cuda(0, memory_kind=None),)), {RejectionCode.UNKNOWN_METRIC, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("mps job never on cuda", {"accelerator": Accelerator.MPS, "gpu_count": 1}, worker(devices=(cuda(0),)),
     {RejectionCode.ACCELERATOR_MISMATCH}),
    ("cuda job never on mps", CUDA1, worker(devices=(mps(),)), {RejectionCode.ACCELERATOR_MISMATCH}),
    ("rocm devices are never used", {"accelerator": Accelerator.ROCM, "gpu_count": 1}, worker(devices=(rocm(),)),
     {RejectionCode.UNSUPPORTED_ACCELERATOR}),
    ("cuda job on rocm box", CUDA1, worker(devices=(rocm(),)), {RejectionCode.ACCELERATOR_MISMATCH}),
    ("float64 not on mps", {"accelerator": Accelerator.MPS, "gpu_count": 1, "requires_float64": True},
     worker(devices=(mps(),)), {RejectionCode.FLOAT64_UNSUPPORTED, RejectionCode.NOT_ENOUGH_DEVICES}),
    ("float64 on cuda", {**CUDA1, "requires_float64": True}, worker(devices=(cuda(0),)), (0,)),
    ("granted gpu is busy", CUDA1, worker(devices=(cuda(0, granted_to="other"),)), {RejectionCode.RESERVED}),
    ("foreign process makes a gpu busy", CUDA1, worker(devices=(cuda(0, foreign_pids=(4242,)),)),
     {RejectionCode.FOREIGN_PROCESS}),
    ("busy gpu skipped for free one", CUDA1, worker(devices=(cuda(0, granted_to="x"), cuda(1))), (1,)),
    ("python specifier", {"python": ">=3.10"}, worker(), ()),
    ("python too old", {"python": ">=3.12"}, worker(), {RejectionCode.PYTHON_VERSION}),
    ("python unknown", {"python": ">=3.10"}, worker(envs=(env(python=None),)), {RejectionCode.UNKNOWN_METRIC}),
    ("framework present", {"frameworks": {"numpy": ">=1.24"}}, worker(envs=(env(frameworks={"numpy": "1.26.4"}),)), ()),
    ("framework missing", {"frameworks": {"jax": ">=0.4"}}, worker(), {RejectionCode.FRAMEWORK_MISSING}),
    ("framework too old", {"frameworks": {"numpy": ">=2"}}, worker(envs=(env(frameworks={"numpy": "1.26.4"}),)),
     {RejectionCode.FRAMEWORK_VERSION}),
    ("local version satisfies >=", {"frameworks": {"torch": ">=2.4"}},
     worker(envs=(env(frameworks={"torch": "2.4.1+cu121"}),)), ()),
    ("installed pre-release in range", {"frameworks": {"torch": ">=2.5"}},
     worker(envs=(env(frameworks={"torch": "2.6.0.dev2024"}),)), ()),
    ("invalid installed version", {"frameworks": {"tensorflow": ">=2.12"}},
     worker(envs=(env(frameworks={"tensorflow": "-VERSION-"}),)), {RejectionCode.INVALID_VERSION}),
    ("second environment satisfies", {"frameworks": {"jax": ">=0.4"}},
     worker(envs=(env(), env(frameworks={"jax": "0.4.30"}, interpreter="/opt/jax/bin/python"))), ()),
    ("broken environment", {}, worker(envs=(env(ok=False),)), {RejectionCode.ENVIRONMENT_BROKEN}),
    ("torch cuda job needs torch.cuda", {**CUDA1, "frameworks": {"torch": ">=2"}},
     worker(devices=(cuda(0),), envs=(env(frameworks={"torch": "2.13.0+cpu"}, torch_cuda=False),)),
     {RejectionCode.TORCH_BACKEND_UNAVAILABLE}),
    ("torch mps unavailable (macOS too old)", {"accelerator": Accelerator.MPS, "gpu_count": 1,
     "frameworks": {"torch": ">=1.13.0.dev0"}},
     worker(devices=(mps(),), envs=(env(frameworks={"torch": "1.13.0.dev20220525"}, torch_mps=False),)),
     {RejectionCode.TORCH_BACKEND_UNAVAILABLE}),
    ("mps job without torch (MLX) is fine", {"accelerator": Accelerator.MPS, "gpu_count": 1,
     "frameworks": {"mlx": ">=0.30"}}, worker(devices=(mps(),), envs=(env(frameworks={"mlx": "0.30.4"}),)), (0,)),
    ("distributed gloo on cpu", {"distributed": DistributedRequest(1, 2, "gloo")},
     worker(envs=(env(frameworks={"torch": "2.13.0+cpu"}, backends=("gloo",)),)), ()),
    ("distributed needs torch", {"distributed": DistributedRequest(1, 2, "gloo")}, worker(),
     {RejectionCode.FRAMEWORK_MISSING}),
    ("distributed backend missing in env", {**CUDA1, "distributed": DistributedRequest(1, 2, "nccl")},
     worker(devices=(cuda(0),), envs=(env(frameworks={"torch": "2.13.0"}, torch_cuda=True, backends=("gloo",)),)),
     {RejectionCode.BACKEND_MISMATCH}),
    ("nccl without cuda rejected", {"distributed": DistributedRequest(1, 2, "nccl")}, worker(),
     {RejectionCode.BACKEND_MISMATCH}),
    ("distributed mps rejected", {"accelerator": Accelerator.MPS, "gpu_count": 1,
     "distributed": DistributedRequest(1, 2, "gloo")}, worker(devices=(mps(),)),
     {RejectionCode.DISTRIBUTED_UNSUPPORTED}),
    ("workdir missing", {"workdir": "/data/x"}, worker(existing_paths=frozenset({"/data/y"})),
     {RejectionCode.WORKDIR_MISSING}),
    ("workdir present", {"workdir": "/data/x"}, worker(existing_paths=frozenset({"/data/x"})), ()),
    ("workdir unchecked", {"workdir": "/data/x"}, worker(), ()),
    ("nvidia-smi timed out is not 'no gpu'", CUDA1,
     worker(health=(ProbeHealth("nvidia-smi", ProbeStatus.TIMEOUT, "timed out after 20 s"),)),
     {RejectionCode.PROBE_UNHEALTHY}),
    ("offline worker", {}, worker(online=False), {RejectionCode.WORKER_OFFLINE}),
]


@pytest.mark.parametrize(("kwargs", "w", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_match_table(kwargs: dict[str, object], w: WorkerSnapshot, expected: object) -> None:
    result = match(job(**kwargs), w, SUPPORT_MATRIX)
    if isinstance(expected, tuple):
        assert isinstance(result, Placement), [r.message for r in result]  # type: ignore[union-attr]
        assert result.device_indices == expected
        assert result.worker == w.node_id
    else:
        assert codes(result) == expected


def test_rejection_messages_read_alone() -> None:
    w = worker(devices=(cuda(0, 16.0), cuda(1, 48.0, cc=(7, 5))))
    j = job(accelerator=Accelerator.CUDA, gpu_count=2, gpu_memory_bytes=24 * GB, min_cuda_compute_capability=(8, 0))
    result = match(j, w, SUPPORT_MATRIX)
    assert not isinstance(result, Placement)
    messages = [r.message for r in result]
    assert "GPU 0 has 16.0 GB < 24 GB required" in messages
    assert "GPU 1 has compute capability 7.5 < 8.0 required" in messages
    assert "needs 2 qualifying cuda device(s), worker w1 has 0" in messages
    mem = next(r for r in result if r.code is RejectionCode.INSUFFICIENT_MEMORY)
    assert (mem.requirement, mem.wanted, mem.found, mem.worker, mem.device) == (
        "gpu_memory_gb", ">= 24 GB", "16.0 GB", "w1", 0)


def test_a_worker_that_uses_no_gpu_by_choice_says_why_not_cpu_only() -> None:
    unused = ProbeHealth("gpus", ProbeStatus.OK, "GPUs not used: this daemon runs beside another gpulayerd of "
                         "this machine (isolated): CPU slots only", None)
    result = match(job(accelerator=Accelerator.CUDA, gpu_count=1), worker(health=(unused,)), SUPPORT_MATRIX)
    assert not isinstance(result, Placement)
    assert [r.message for r in result] == [f"worker w1 has no cuda device ({unused.message})"]
    plain = match(job(accelerator=Accelerator.CUDA, gpu_count=1), worker(), SUPPORT_MATRIX)
    assert not isinstance(plain, Placement) and plain[0].message == "worker w1 has no cuda device (it is CPU-only)"


def test_unknown_says_unknown_not_too_small() -> None:
    result = match(job(**CUDA1, min_cuda_compute_capability=(8, 0)), worker(devices=(cuda(0, cc=None),)),
                   SUPPORT_MATRIX)
    assert not isinstance(result, Placement)
    msg = next(r.message for r in result if r.code is RejectionCode.UNKNOWN_METRIC)
    assert "unknown" in msg
    assert "<" not in msg


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"accelerator": Accelerator.ROCM, "gpu_count": 1}, {RejectionCode.UNSUPPORTED_ACCELERATOR}),
        ({"accelerator": Accelerator.MPS, "gpu_count": 1, "distributed": DistributedRequest(2, 1, "gloo")},
         {RejectionCode.DISTRIBUTED_UNSUPPORTED}),
        ({"distributed": DistributedRequest(1, 2, "nccl")}, {RejectionCode.BACKEND_MISMATCH}),
        ({"accelerator": Accelerator.CUDA, "gpu_count": 1, "distributed": DistributedRequest(2, 1, "nccl")}, set()),
        ({"distributed": DistributedRequest(2, 1, "gloo")}, set()),
        ({}, set()),
    ],
)
def test_validate(kwargs: dict[str, object], expected: set[RejectionCode]) -> None:
    rejs = validate(job(**kwargs), SUPPORT_MATRIX)
    assert {r.code for r in rejs} >= expected
    assert bool(rejs) == bool(expected)
    assert all(r.worker == "" for r in rejs)


def test_explain_four_verdicts() -> None:
    j = job(**CUDA1, gpu_memory_bytes=40 * GB)
    small = worker("a-small", devices=(cuda(0, 24.0),))
    busy = worker("b-busy", devices=(cuda(0, 80.0, granted_to="j0"),))
    offline = worker("c-off", devices=(cuda(0, 80.0),), online=False)
    free = worker("d-free", devices=(cuda(0, 80.0),))
    assert explain(j, [small], SUPPORT_MATRIX).verdict is Verdict.FITS_NOWHERE
    assert explain(j, [small, offline], SUPPORT_MATRIX).verdict is Verdict.FITS_ONLY_OFFLINE
    assert explain(j, [small, offline, busy], SUPPORT_MATRIX).verdict is Verdict.FITS_BUT_BUSY
    e = explain(j, [free, busy, offline, small], SUPPORT_MATRIX)
    assert e.verdict is Verdict.FITS_NOW
    assert e.placement is not None and e.placement.worker == "d-free"
    assert [w.worker for w in e.workers] == ["a-small", "b-busy", "c-off", "d-free"]
    assert [w.state for w in e.workers] == [FitState.NO_FIT, FitState.FITS_BUT_BUSY, FitState.FITS_OFFLINE,
                                            FitState.FITS_NOW]
    assert explain(j, [], SUPPORT_MATRIX).verdict is Verdict.FITS_NOWHERE


def test_explain_ties_break_by_node_id_then_uuid() -> None:
    j = job(**CUDA1)
    w2 = worker("node-b", devices=(cuda(0), cuda(1)))
    w1 = worker("node-a", devices=(cuda(1, uuid="GPU-b"), cuda(0, uuid="GPU-c"), cuda(2, uuid="GPU-a")))
    e1 = explain(j, [w2, w1], SUPPORT_MATRIX)
    e2 = explain(j, [w1, w2], SUPPORT_MATRIX)
    assert e1 == e2
    assert e1.placement is not None
    assert (e1.placement.worker, e1.placement.device_uuids) == ("node-a", ("GPU-a",))


def test_explain_table_rows_observed_vs_wanted() -> None:
    j = job(**CUDA1, gpu_memory_bytes=24 * GB, min_cuda_compute_capability=(8, 0),
            frameworks={"torch": ">=2.4"})
    w = worker(devices=(cuda(0, 16.0, cc=(8, 9)), cuda(1, 48.0, cc=(7, 0))),
               envs=(env(frameworks={"torch": "2.4.1+cu121"}, torch_cuda=True),))
    ev = evaluate(j, w, SUPPORT_MATRIX)
    rows = {c.requirement: c for c in ev.checks}
    # Each requirement is met by one device, but not the same one: no independent ticks, a device table.
    assert rows["gpu_memory_gb"].found == ("1 of 2 device(s) meet it, not on the same device as the rest: "
                                           "GPU 0: 16.0 GB dedicated, GPU 1: 48.0 GB dedicated")
    assert rows["gpu_memory_gb"].ok is None
    assert rows["min_cuda_compute_capability"].found == ("1 of 2 device(s) meet it, not on the same device as the "
                                                         "rest: GPU 0: 8.9, GPU 1: 7.0")
    assert rows["min_cuda_compute_capability"].ok is None
    assert (rows["GPU 0"].wanted, rows["GPU 0"].found, rows["GPU 0"].ok) == (
        "all of the above", "✗ memory 16.0 GB dedicated, ✓ cc 8.9", False)
    assert (rows["GPU 1"].found, rows["GPU 1"].ok) == ("✓ memory 48.0 GB dedicated, ✗ cc 7.0", False)
    together = rows["device requirements together"]
    assert (together.wanted, together.found, together.ok) == ("on >= 1 device(s)", "0 of 2 device(s) meet them all",
                                                              False)
    assert rows["gpu_count"].ok is False
    assert rows["frameworks.torch"].found == "2.4.1+cu121"
    assert rows["frameworks.torch"].ok is True
    assert rows["torch.cuda"].found == "available"
    assert ev.state is FitState.NO_FIT


def test_explain_many_equals_explain() -> None:
    jobs = [replace(job(**CUDA1, gpu_memory_bytes=g * GB), job_id=f"j{i}") for i, g in enumerate([8, 8, 40, 8, 40])]
    ws = [worker("a", devices=(cuda(0, 24.0),)), worker("b", devices=(cuda(0, 48.0),))]
    assert explain_many(jobs, ws, SUPPORT_MATRIX) == [explain(jb, ws, SUPPORT_MATRIX) for jb in jobs]


def test_launch_env_cpu_and_cuda() -> None:
    cpu = launch_env(Accelerator.CPU, (), "job-1", 1)
    assert cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert (cpu["GPULAYER_JOB_ID"], cpu["GPULAYER_ATTEMPT"]) == ("job-1", "1")
    gpu = launch_env(Accelerator.CUDA, (3, 0), "job-2", 2)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert gpu["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_multi_host_job_fits_now_only_when_enough_hosts_do() -> None:
    j = job(frameworks={"torch": ">=2"}, distributed=DistributedRequest(nnodes=2, nproc_per_node=1, backend="gloo"))
    torch_env = (env(frameworks={"torch": "2.13.0+cpu"}, backends=("gloo",)),)
    a = worker("a", envs=torch_env)
    b_busy = worker("b", envs=torch_env, cpu_slots_total=1, cpu_slots_free=0)
    b_off = worker("b", envs=torch_env, online=False)
    b = worker("b", envs=torch_env)
    one = explain(j, [a], SUPPORT_MATRIX)
    assert (one.verdict, one.placement, one.hosts_needed) == (Verdict.FITS_NOWHERE, None, 2)
    assert one.summary == "fits nowhere we know: needs 2 hosts at once, 1 fit now"
    assert explain(j, [a, b_busy], SUPPORT_MATRIX).verdict is Verdict.FITS_BUT_BUSY
    assert explain(j, [a, b_off], SUPPORT_MATRIX).verdict is Verdict.FITS_ONLY_OFFLINE
    both = explain(j, [b, a], SUPPORT_MATRIX)
    assert both.verdict is Verdict.FITS_NOW and both.placement is not None and both.placement.worker == "a"
    assert both.summary == "fits now on 2 hosts"
