"""Property tests: spec parsing never crashes, matching is sound, deterministic and peer-stable.

The oracles here are written independently of :mod:`gpulayerd.core.matching.evaluate`: versions are
checked with ``packaging`` directly, device requirements are re-stated from the spec.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from gpulayerd.core.matching.evaluate import evaluate, explain, explain_many, job_signature, match, validate
from gpulayerd.core.matching.versions import is_valid_version
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
from gpulayerd.core.verdict import FitState, Placement, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import (
    KNOWN_FRAMEWORKS,
    Capabilities,
    DeviceModel,
    EnvironmentModel,
    JobSpec,
    ProbeHealthModel,
    SpecError,
    job_spec_from_mapping,
)

MiB = 2**20

pytestmark = pytest.mark.slow  # (hypothesis property tests, 1-2 s each)

T = TypeVar("T")

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ spec parsing

ODD_STRINGS = [
    "", " ", "\n", "\t\t", "\0", "a\0b", "\ud800", "~", "~nosuchuser-gpulayer/x", "~/x", "..", "/",
    "[N/A]", "N/A", "[Not Supported]", "nan", "inf", "-inf", "1e309", "-1", "0", "8.6", "12.1", "10",
    "8.", ".6", "8.6.1", "²", "١.٥", "ＣＵＤＡ", "CUDA", "Cuda ", "İ", "\u212a", "gpu", "cuda", "mps", "rocm",
    "cpu", "unified", "dedicated", "UNIFIED", ">=2.1", "<2", "==1.26.*", "~=2.1", "===foo", ">=2.1,",
    ">=2.4,<3", "2.1", "-VERSION-", "2.1.0+cu121", "'unclosed", '"', "python train.py", "#x", "=",
    "A=B", "torch", "TORCH ", "tensorflow-macos",
]
ODD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 1, 64, 65, 2**63]),
    st.floats(),
    st.sampled_from([0.0, -0.0, 1e-300, 8.6, 12.1, 1e5, 1e300, math.inf, -math.inf, math.nan]),
    st.text(max_size=12),
    st.sampled_from(ODD_STRINGS),
)
TOP_KEYS = ["name", "command", "workdir", "env", "requirements", "distributed", "policy"]
REQ_KEYS = [
    "accelerator", "gpu_count", "gpu_memory_gb", "gpu_memory_kind", "min_cuda_compute_capability",
    "frameworks", "python", "requires_float64",
]
ANY_KEY = st.one_of(
    st.sampled_from([*TOP_KEYS, *REQ_KEYS, *KNOWN_FRAMEWORKS, "nnodes", "backend", "retries"]),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    ODD_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_KEY, inner, max_size=4),
    max_leaves=12,
)

VALID_SPEC: dict[str, Any] = {
    "name": "sweep-lr",
    "command": ["python", "train.py", "--lr", "3e-4"],
    "workdir": "/srv/lab/project",
    "env": {"WANDB_MODE": "offline"},
    "requirements": {
        "accelerator": "cuda",
        "gpu_count": 2,
        "gpu_memory_gb": 24,
        "gpu_memory_kind": "dedicated",
        "min_cuda_compute_capability": "8.0",
        "frameworks": {"torch": ">=2.1", "numpy": "<2"},
        "python": ">=3.10",
        "requires_float64": False,
    },
    "distributed": {"nnodes": 1, "nproc_per_node": 2, "backend": "nccl"},
    "policy": {"retries": 1, "lease_s": 30.0},
}

# Field path -> plausible-but-edgy values for that field (plus any JSON value).
FIELD_VALUES: dict[tuple[str, ...], list[Any]] = {
    ("name",): [None, "", "x" * 201, 5],
    ("command",): ["python train.py", "'unclosed", "", "   ", [], [""], [" "], ["python"], [1], "#c"],
    ("workdir",): [None, "", "rel/dir", "~/x", "~nosuchuser-gpulayer/x", "a\0b", "/a\0b", "\ud800", "/"],
    ("env",): [{}, {"": "x"}, {"A=B": "x"}, {"A\0": "x"}, {"A": 1}, {"A": None}],
    ("requirements", "accelerator"): ["cuda", "CUDA", "Cuda ", "mps", "rocm", "cpu", "gpu", "", 1, None],
    ("requirements", "gpu_count"): [0, 1, 64, 65, -1, True, 1.0, 1.5, "2", None],
    ("requirements", "gpu_memory_gb"): [0, -1, 1e-300, 23.9, 1e5, 1e6, math.nan, math.inf, "24", True],
    ("requirements", "gpu_memory_kind"): ["unified", "UNIFIED", "dedicated", "vram", None, 0],
    ("requirements", "min_cuda_compute_capability"): [
        8.6, "8.6", "12.1", "10", 10, 10.0, "[N/A]", "N/A", "", "8.", ".6", "8.6.1", "²", "١.٥", -1,
        1e300, math.nan, True, [8, 6], (8, 6), None, "9" * 5000, 2**1000,
    ],
    ("requirements", "frameworks"): [{}, {"torch": 2}, {"pytorch": ">=2"}, {"TORCH ": ">=2.1"}, []],
    ("requirements", "frameworks", "torch"): [">=2.1", "<2", "==1.26.*", "~=2.1", "2.1", ">=2.1,", "===x", ""],
    ("requirements", "python"): [">=3.10", "3.10", "", " >=3.10 ", "===3.11", None, 3.1],
    ("requirements", "requires_float64"): [True, False, "yes", 1, 2, None],
    ("distributed",): [None, {}, [], "yes"],
    ("distributed", "nnodes"): [1, 2, 0, 257, -1, "2"],
    ("distributed", "nproc_per_node"): [1, 0, 256, 257],
    ("distributed", "backend"): ["gloo", "nccl", "mpi", None, ""],
    ("policy", "retries"): [0, 100, 101, -1],
    ("policy", "lease_s"): [1.0, 0.5, 86_400.0, 1e9, math.nan, math.inf],
}


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid job spec with one to four random mutations applied."""
    spec = copy.deepcopy(VALID_SPEC)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(sorted(FIELD_VALUES)))
        kind = draw(st.sampled_from(["set", "set", "set_any", "delete", "unknown_key"]))
        parent: Any = spec
        for key in path[:-1]:
            if not isinstance(parent, dict) or not isinstance(parent.get(key), dict):
                parent = None
                break
            parent = parent[key]
        if not isinstance(parent, dict):
            continue
        last = path[-1]
        if kind == "set":
            parent[last] = copy.deepcopy(draw(st.sampled_from(FIELD_VALUES[path])))
        elif kind == "set_any":
            parent[last] = draw(JSON_VALUES)
        elif kind == "delete":
            parent.pop(last, None)
        else:
            child = parent.get(last)
            target: dict[str, Any] = child if isinstance(child, dict) else parent
            target[draw(ANY_KEY)] = draw(JSON_VALUES)
    return spec


def _check_parsed(spec: JobSpec) -> None:
    job = spec.to_core(job_id="j")
    assert isinstance(job, JobRequest)
    if job.accelerator is Accelerator.CPU:
        assert job.gpu_count == 0
        assert job.gpu_memory_bytes is None and job.gpu_memory_kind is None
    else:
        assert job.gpu_count >= 1
    if job.min_cuda_compute_capability is not None:
        assert job.accelerator is Accelerator.CUDA
    assert set(job.frameworks) <= set(KNOWN_FRAMEWORKS)
    for s in [*job.frameworks.values(), *([job.python] if job.python is not None else [])]:
        SpecifierSet(s, prereleases=True)  # the matcher's parse of it must not fail
    assert job.workdir is not None and job.workdir.startswith("/")
    # The converted job goes through the matcher without raising.
    explain(job, [_CANONICAL_WORKER], SUPPORT_MATRIX)


def _parse_only_spec_errors(data: dict[str, Any]) -> None:
    try:
        spec = job_spec_from_mapping(data, base_dir="/srv/lab")
    except SpecError:
        return
    _check_parsed(spec)


@FAST
@given(st.dictionaries(ANY_KEY, JSON_VALUES, max_size=7))
def test_arbitrary_data_raises_only_spec_error(data: dict[str, Any]) -> None:
    _parse_only_spec_errors(data)


@FAST
@given(mutated_specs())
@example(copy.deepcopy(VALID_SPEC))
def test_mutated_spec_raises_only_spec_error(data: dict[str, Any]) -> None:
    _parse_only_spec_errors(data)


@pytest.mark.parametrize(
    "workdir",
    ["~nosuchuser-gpulayer/x", "rel\0dir", "\ud800"],
    ids=["unknown-user-home", "nul-byte", "lone-surrogate"],
)
def test_odd_workdir_never_crashes(workdir: str) -> None:
    """An unknown user's home, a NUL byte or a lone surrogate: a SpecError or a usable job, no crash."""
    data = {**copy.deepcopy(VALID_SPEC), "workdir": workdir}
    try:
        spec = job_spec_from_mapping(data, base_dir="/srv/lab")
    except SpecError:
        return
    _check_parsed(spec)


# ------------------------------------------------------------------ worker / job strategies

JOB_MEM_GB = [1, 8, 16, 23.9, 24, 40, 48, 80]
DEVICE_MEM = [
    None, 0, 8 * GB, 16 * GB, 24 * GB - 1, 24 * GB, 24 * GB + 1, 23_900_000_000, 40 * GB, 80 * GB,
    24564 * MiB, 16376 * MiB, 81559 * MiB, 97887 * MiB, 64 * 2**30, 128 * 2**30,
]
CCS = [(3, 5), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1)]
FW_NAMES = ["torch", "numpy", "jax", "tensorflow", "mlx", "cupy"]
FW_VERSIONS = [
    "2.1.0", "2.1.0+cu121", "2.5.1", "2.6.0.dev20240101", "2.1.0rc1", "1.26.4", "1.13.1", "2.0.0",
    "0.4.30", "2.16.1", "3", "-VERSION-", "0.23ubuntu1",
]
GOOD_PY = ["3.10.12", "3.11.7", "3.12.3", "3.13.0rc1", "3.12.0+local"]
ODD_PY = [None, "3.9.18", "3.14.0a1", "-VERSION-", "3"]
FW_SPECS = [">=2.1", "<2", "==1.26.*", "~=2.1", ">=2.4,<3", "==2.1.0", ">2.1.0", "!=2.5.1", ">=0.4", ""]
PY_SPECS = [">=3.10", "<3.12", "==3.11.*", ">=3.13", "~=3.10", ">=3.10,<3.14"]
PATHS = ["/srv/lab/a", "/srv/lab/b", "/home/ana/exp"]
HEALTH_SOURCES = ["nvidia-smi", "apple", "rocm-smi"]


def _chance(draw: st.DrawFn, tenths: int) -> bool:
    """True with probability ``tenths``/10 (before hypothesis' own biasing)."""
    return draw(st.integers(0, 9)) < tenths


def _maybe(draw: st.DrawFn, tenths: int, strategy: st.SearchStrategy[T]) -> T | None:
    """A value from ``strategy`` with probability ``tenths``/10, else None."""
    return draw(strategy) if _chance(draw, tenths) else None


@st.composite
def devices_of(draw: st.DrawFn, acc: Accelerator, max_n: int) -> list[DeviceSnapshot]:
    indices = draw(st.lists(st.integers(0, 15), max_size=max_n, unique=True))
    out = []
    for i in indices:
        uuid = f"{acc.value}-{draw(st.integers(0, 9999)):04d}-{i}" if _chance(draw, 8) else None
        busy = draw(st.integers(0, 7))
        out.append(
            DeviceSnapshot(
                accelerator=acc,
                index=i,
                uuid=uuid,
                name=draw(st.sampled_from([None, "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "M2"])),
                memory_total_bytes=draw(st.sampled_from(DEVICE_MEM) | st.integers(0, 200 * GB)),
                memory_used_bytes=_maybe(draw, 5, st.integers(0, 10 * GB)),
                memory_kind=_maybe(draw, 7, st.sampled_from(MemoryKind)),
                compute_capability=_maybe(draw, 8, st.sampled_from(CCS)),
                driver_version=_maybe(draw, 5, st.just("580.126.09")),
                execution_supported=_chance(draw, 8),
                float64=_maybe(draw, 8, st.booleans()),
                granted_to=f"job-{draw(st.integers(0, 3))}" if busy == 1 else None,
                foreign_pids=tuple(draw(st.lists(st.integers(1, 99999), min_size=1, max_size=2)))
                if busy == 2
                else (),
            )
        )
    return out


@st.composite
def environments(draw: st.DrawFn, interpreter: str) -> EnvironmentSnapshot:
    names = [n for n in FW_NAMES if _chance(draw, 7 if n in ("torch", "numpy") else 3)]
    frameworks = {}
    for n in names:
        v = draw(st.sampled_from(FW_VERSIONS))
        valid = is_valid_version(v) if _chance(draw, 9) else draw(st.booleans())
        frameworks[n] = FrameworkVersion(name=n, version=v, distribution=n, valid=valid)
    backends = draw(
        st.sampled_from([("gloo",), ("gloo", "nccl"), ("nccl", "gloo", "mpi")])
        | st.lists(st.sampled_from(["gloo", "nccl", "mpi"]), unique=True).map(tuple)
        | st.none()
    )
    return EnvironmentSnapshot(
        interpreter=interpreter,
        python_version=draw(st.sampled_from(GOOD_PY if _chance(draw, 8) else ODD_PY)),
        frameworks=frameworks,
        torch_cuda=draw(st.just(True) | st.sampled_from([None, True, False])),
        torch_mps=draw(st.just(True) | st.sampled_from([None, True, False])),
        distributed_backends=backends,
        ok=_chance(draw, 9),
        notes=("probe failed: timeout",) if _chance(draw, 1) else (),
    )


@st.composite
def workers(draw: st.DrawFn, node_id: str | None = None) -> WorkerSnapshot:
    node = node_id if node_id is not None else f"node-{draw(st.integers(0, 99)):02d}"
    devices = [
        *draw(devices_of(Accelerator.CUDA, 5)),
        *draw(devices_of(Accelerator.MPS, 1)),
        *draw(devices_of(Accelerator.ROCM, 2)),
        *draw(devices_of(Accelerator.CPU, 1)),
    ]
    devices = draw(st.permutations(devices))
    n_env = draw(st.sampled_from([0, 1, 1, 2, 2, 3]))
    envs = [draw(environments(f"/opt/env{k}/bin/python")) for k in range(n_env)]
    health = [
        ProbeHealth(source=s, status=draw(st.sampled_from(ProbeStatus)), message="tool said so")
        for s in draw(st.lists(st.sampled_from(HEALTH_SOURCES), unique=True, max_size=3))
    ]
    slots_total = _maybe(draw, 5, st.integers(1, 16))
    return WorkerSnapshot(
        node_id=node,
        name=f"host-{node}",
        online=_chance(draw, 9),
        devices=tuple(devices),
        environments=tuple(envs),
        cpu_count=_maybe(draw, 5, st.integers(1, 128)),
        memory_total_bytes=_maybe(draw, 5, st.integers(1, 2**40)),
        health=tuple(health),
        existing_paths=_maybe(draw, 5, st.frozensets(st.sampled_from(PATHS))),
        cpu_slots_total=slots_total,
        cpu_slots_free=None if slots_total is None else draw(st.integers(0, slots_total)),
    )


@st.composite
def worker_lists(draw: st.DrawFn, max_size: int = 4) -> list[WorkerSnapshot]:
    ids = draw(st.lists(st.integers(0, 99), min_size=1, max_size=max_size, unique=True))
    return [draw(workers(f"node-{i:02d}")) for i in ids]


@st.composite
def jobs(draw: st.DrawFn, raw: bool | None = None) -> JobRequest:
    """A JobRequest; ``raw`` jobs ignore the spec's cross-field rules (gpu_count 0 on cuda, ...)."""
    if raw is None:
        raw = _chance(draw, 2)
    acc = draw(st.sampled_from([Accelerator.CPU, Accelerator.CUDA, Accelerator.CUDA, Accelerator.MPS,
                                Accelerator.ROCM]))
    gpu = acc is not Accelerator.CPU or raw
    counts = [0, 1, 1, 2, 3, 4] if raw else [1, 1, 1, 2, 2, 3, 4]
    gpu_count = draw(st.sampled_from(counts)) if gpu else 0
    fw_specs = st.sampled_from(FW_SPECS)
    n_fw = draw(st.sampled_from([0, 0, 1, 1, 2, 3]))
    backends = ["gloo", "nccl", "mpi"] if raw else ["gloo", "nccl"]
    return JobRequest(
        job_id=f"job-{draw(st.integers(0, 999))}",
        accelerator=acc,
        gpu_count=gpu_count,
        gpu_memory_bytes=_maybe(draw, 5 if gpu else 0, st.sampled_from(JOB_MEM_GB).map(lambda g: round(g * GB))),
        gpu_memory_kind=_maybe(draw, 3 if gpu else 0, st.sampled_from(MemoryKind)),
        min_cuda_compute_capability=_maybe(
            draw, 5 if acc is Accelerator.CUDA else (2 if raw else 0), st.sampled_from(CCS)
        ),
        frameworks=draw(st.dictionaries(st.sampled_from(FW_NAMES), fw_specs, min_size=n_fw, max_size=n_fw)),
        python=_maybe(draw, 5, st.sampled_from(PY_SPECS)),
        requires_float64=_chance(draw, 3),
        distributed=_maybe(
            draw, 3,
            st.builds(
                DistributedRequest,
                nnodes=st.sampled_from([1, 1, 2, 3]),
                nproc_per_node=st.integers(1, 4),
                backend=st.sampled_from(backends),
            ),
        ),
        workdir=_maybe(draw, 5, st.sampled_from(PATHS)),
    )


def _spec_admitting(draw: st.DrawFn, version: str) -> str:
    """A specifier that ``version`` satisfies (when it is PEP 440), else a random one."""
    try:
        v = Version(version)
    except InvalidVersion:
        return draw(st.sampled_from(FW_SPECS))
    return draw(st.sampled_from([f"=={v}", f">={v.base_version}", f"<={v.major + 1}", f"~={v.major}.0", ""]))


@st.composite
def near_job(draw: st.DrawFn, w: WorkerSnapshot) -> JobRequest:
    """A job built to (nearly) fit ``w``, so that placements are common."""
    job = draw(jobs(raw=False))
    env = draw(st.sampled_from(w.environments)) if w.environments else None
    changes: dict[str, Any] = {}
    if env is not None:
        frameworks = {}
        for name in draw(st.lists(st.sampled_from(sorted(env.frameworks) or FW_NAMES), unique=True, max_size=2)):
            fw = env.frameworks.get(name)
            frameworks[name] = _spec_admitting(draw, fw.version) if fw else draw(st.sampled_from(FW_SPECS))
        changes["frameworks"] = frameworks
        if env.python_version is not None and _chance(draw, 5):
            changes["python"] = _spec_admitting(draw, env.python_version)
    usable = [d for d in w.devices if d.accelerator in (Accelerator.CUDA, Accelerator.MPS)]
    if usable and _chance(draw, 8):
        d = draw(st.sampled_from(usable))
        changes["accelerator"] = d.accelerator
        changes["gpu_count"] = draw(st.sampled_from([1, 1, 1, 2]))
        mem = d.memory_total_bytes
        changes["gpu_memory_bytes"] = (
            draw(st.integers(1, mem)) if mem and _chance(draw, 6) else None
        )
        changes["gpu_memory_kind"] = d.memory_kind if _chance(draw, 3) else None
        cc = d.compute_capability
        changes["min_cuda_compute_capability"] = (
            draw(st.sampled_from([c for c in CCS if c <= cc]))
            if cc is not None and d.accelerator is Accelerator.CUDA and cc >= CCS[0] and _chance(draw, 6)
            else None
        )
        changes["requires_float64"] = bool(d.float64) and _chance(draw, 5)
        if job.distributed is not None and d.accelerator is Accelerator.MPS:
            changes["distributed"] = None
    elif _chance(draw, 5):
        changes.update(
            accelerator=Accelerator.CPU, gpu_count=0, gpu_memory_bytes=None, gpu_memory_kind=None,
            min_cuda_compute_capability=None, requires_float64=False,
        )
    if job.distributed is not None and _chance(draw, 5):
        backend = "nccl" if changes.get("accelerator", job.accelerator) is Accelerator.CUDA else "gloo"
        changes["distributed"] = replace(job.distributed, backend=backend)
    if w.existing_paths and _chance(draw, 7):
        changes["workdir"] = draw(st.sampled_from(sorted(w.existing_paths)))
    elif _chance(draw, 5):
        changes["workdir"] = None
    return replace(job, **changes)


def near_pairs() -> st.SearchStrategy[tuple[JobRequest, WorkerSnapshot]]:
    """A worker and a job built to (nearly) fit it."""
    return workers().flatmap(lambda w: st.tuples(near_job(w), st.just(w)))


def pairs() -> st.SearchStrategy[tuple[JobRequest, WorkerSnapshot]]:
    """Independent (job, worker) pairs and near-fitting ones."""
    return st.one_of(st.tuples(jobs(), workers()), near_pairs())


@st.composite
def near_queues(draw: st.DrawFn, max_jobs: int = 8) -> tuple[list[JobRequest], list[WorkerSnapshot]]:
    """Workers and a queue of jobs, most of them built to fit one of the workers."""
    ws = draw(worker_lists(max_size=3))
    n = draw(st.integers(1, max_jobs))
    queue = [
        draw(near_job(draw(st.sampled_from(ws)))) if _chance(draw, 8) else draw(jobs())
        for _ in range(n)
    ]
    return queue, ws


# ------------------------------------------------------------------ independent oracle


def _version_ok(version: str | None, spec: str) -> bool:
    if version is None:
        return False
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(spec, prereleases=True).contains(v, prereleases=True)


def _needs_torch(job: JobRequest) -> bool:
    return "torch" in job.frameworks or job.distributed is not None


def _env_ok(job: JobRequest, e: EnvironmentSnapshot) -> bool:
    if not e.ok:
        return False
    if job.python is not None and not _version_ok(e.python_version, job.python):
        return False
    for name, spec in job.frameworks.items():
        fw = e.frameworks.get(name)
        if fw is None or not fw.valid or not _version_ok(fw.version, spec):
            return False
    if _needs_torch(job):
        if "torch" not in e.frameworks:
            return False
        if job.accelerator is Accelerator.CUDA and e.torch_cuda is not True:
            return False
        if job.accelerator is Accelerator.MPS and e.torch_mps is not True:
            return False
    return job.distributed is None or (
        e.distributed_backends is not None and job.distributed.backend in e.distributed_backends
    )


def _device_ok(job: JobRequest, d: DeviceSnapshot) -> bool:
    """Static fit of one device (busy-ness aside)."""
    if d.accelerator is not job.accelerator or not d.execution_supported:
        return False
    if job.gpu_memory_bytes is not None and (
        d.memory_total_bytes is None or d.memory_total_bytes < job.gpu_memory_bytes
    ):
        return False
    if job.gpu_memory_kind is not None and d.memory_kind is not job.gpu_memory_kind:
        return False
    if job.min_cuda_compute_capability is not None and (
        d.compute_capability is None or d.compute_capability < job.min_cuda_compute_capability
    ):
        return False
    return not (job.requires_float64 and d.float64 is not True)


def _job_allowed(job: JobRequest) -> bool:
    row = SUPPORT_MATRIX.row(job.accelerator)
    if job.accelerator is Accelerator.ROCM or not row.schedulable:
        return False
    if job.accelerator is not Accelerator.CPU and job.gpu_count < 1:
        return False  # an accelerator job needs at least one device
    if job.distributed is not None:
        if not row.distributed_allowed or job.distributed.backend not in row.distributed_backends:
            return False
        if job.distributed.nnodes > 1 and not row.multi_host:
            return False
    return True


def _cpu_slots_needed(job: JobRequest) -> int:
    return job.distributed.nproc_per_node if job.distributed is not None else 1


def _oracle_fits_now(job: JobRequest, w: WorkerSnapshot) -> bool:
    if not _job_allowed(job) or not w.online:
        return False
    if not any(_env_ok(job, e) for e in w.environments):
        return False
    if job.workdir is not None and w.existing_paths is not None and job.workdir not in w.existing_paths:
        return False
    if job.gpu_count == 0:  # a CPU job: takes CPU slots where the worker counts them
        return w.cpu_slots_free is None or w.cpu_slots_total is None or _cpu_slots_needed(job) <= w.cpu_slots_free
    free_fit = [d for d in w.devices if _device_ok(job, d) and not d.busy]
    return len(free_fit) >= job.gpu_count


def _assert_sound(job: JobRequest, w: WorkerSnapshot, p: Placement) -> None:
    assert p.worker == w.node_id
    assert w.online
    assert not validate(job, SUPPORT_MATRIX)
    assert _job_allowed(job)
    assert job.accelerator is not Accelerator.ROCM
    assert p.accelerator is job.accelerator
    # Exactly gpu_count distinct devices of the job's accelerator, ascending, uuids aligned.
    assert len(p.device_indices) == job.gpu_count == len(p.device_uuids)
    assert len(set(p.device_indices)) == job.gpu_count
    assert list(p.device_indices) == sorted(p.device_indices)
    by_index = {d.index: d for d in w.devices if d.accelerator is job.accelerator}
    for idx, uuid in zip(p.device_indices, p.device_uuids, strict=True):
        d = by_index[idx]
        assert d.uuid == uuid
        assert d.accelerator is job.accelerator
        assert d.execution_supported
        assert not d.busy and d.granted_to is None and not d.foreign_pids
        if job.gpu_memory_bytes is not None:
            assert d.memory_total_bytes is not None and d.memory_total_bytes >= job.gpu_memory_bytes
        if job.gpu_memory_kind is not None:
            assert d.memory_kind is job.gpu_memory_kind
        if job.min_cuda_compute_capability is not None:
            assert d.compute_capability is not None
            assert d.compute_capability >= job.min_cuda_compute_capability
        if job.requires_float64:
            assert d.float64 is True
    if job.gpu_count == 0 and w.cpu_slots_free is not None and w.cpu_slots_total is not None:
        assert _cpu_slots_needed(job) <= w.cpu_slots_free <= w.cpu_slots_total
    # The chosen environment meets every environment requirement.
    envs = [e for e in w.environments if e.interpreter == p.environment]
    assert len(envs) == 1
    e = envs[0]
    assert e.ok
    if job.python is not None:
        assert _version_ok(e.python_version, job.python)
    for name, spec in job.frameworks.items():
        fw = e.frameworks[name]
        assert fw.valid and _version_ok(fw.version, spec)
    if _needs_torch(job):
        assert "torch" in e.frameworks
        if job.accelerator is Accelerator.CUDA:
            assert e.torch_cuda is True
        if job.accelerator is Accelerator.MPS:
            assert e.torch_mps is True
    if job.distributed is not None:
        assert e.distributed_backends is not None and job.distributed.backend in e.distributed_backends
    if job.workdir is not None and w.existing_paths is not None:
        assert job.workdir in w.existing_paths


# ------------------------------------------------------------------ matching properties


@FAST
@given(pairs())
def test_match_is_deterministic_sound_and_complete(pair: tuple[JobRequest, WorkerSnapshot]) -> None:
    job, w = pair
    result = match(job, w, SUPPORT_MATRIX)
    assert match(job, w, SUPPORT_MATRIX) == result
    ev = evaluate(job, w, SUPPORT_MATRIX)
    assert evaluate(job, w, SUPPORT_MATRIX) == ev
    if isinstance(result, Placement):
        _assert_sound(job, w, result)
        assert ev.state is FitState.FITS_NOW and ev.placement == result and not ev.rejections
    else:
        assert result, "a refusal always says why"
        assert ev.state is not FitState.FITS_NOW and ev.placement is None
        assert list(ev.rejections) == result
        assert all(r.worker == w.node_id and r.message for r in result)
    # FITS_NOW iff match places iff the independent oracle says it fits now.
    assert (ev.state is FitState.FITS_NOW) == isinstance(result, Placement) == _oracle_fits_now(job, w)


@FAST
@given(pairs())
def test_never_placed_rejected_rocm_or_wrong_accelerator(pair: tuple[JobRequest, WorkerSnapshot]) -> None:
    job, w = pair
    # Every device claims execution support: the support matrix alone must keep ROCm off.
    lying = replace(w, devices=tuple(replace(d, execution_supported=True) for d in w.devices))
    rejected = bool(validate(job, SUPPORT_MATRIX))
    for worker in (w, lying):
        result = match(job, worker, SUPPORT_MATRIX)
        ev = evaluate(job, worker, SUPPORT_MATRIX)
        if rejected:
            assert not isinstance(result, Placement)
            assert ev.state is FitState.NO_FIT and ev.placement is None
        if job.accelerator is Accelerator.ROCM:
            assert rejected and not isinstance(result, Placement)
        if isinstance(result, Placement):
            # mps never on cuda devices and vice versa (nor on rocm or cpu "devices").
            assert result.accelerator is job.accelerator
            placed = set(zip(result.device_indices, result.device_uuids, strict=True))
            assert placed <= {(d.index, d.uuid) for d in worker.devices if d.accelerator is job.accelerator}
    if rejected:
        exp = explain(job, [w], SUPPORT_MATRIX)
        assert exp.placement is None and exp.verdict is Verdict.FITS_NOWHERE and not exp.workers
        assert exp.rejections == tuple(validate(job, SUPPORT_MATRIX))


@FAST
@given(pairs(), st.data())
def test_device_and_environment_order_does_not_matter(
    pair: tuple[JobRequest, WorkerSnapshot], data: st.DataObject
) -> None:
    job, w = pair
    base = evaluate(job, w, SUPPORT_MATRIX)
    # Devices come in any order: the whole evaluation is the same.
    dev_shuffled = replace(w, devices=tuple(data.draw(st.permutations(w.devices))))
    assert evaluate(job, dev_shuffled, SUPPORT_MATRIX) == base
    # Environments are a preference order: the environment chosen may change, but neither the
    # fit state nor the granted devices.
    both = replace(dev_shuffled, environments=tuple(data.draw(st.permutations(w.environments))))
    other = evaluate(job, both, SUPPORT_MATRIX)
    assert other.state is base.state
    if base.placement is None:
        assert other.placement is None
    else:
        assert other.placement is not None
        assert other.placement.device_indices == base.placement.device_indices
        assert other.placement.device_uuids == base.placement.device_uuids


@SLOW
@given(near_queues(max_jobs=3), st.data())
def test_explain_ignores_worker_order(
    queue_ws: tuple[list[JobRequest], list[WorkerSnapshot]], data: st.DataObject
) -> None:
    queue, ws = queue_ws
    by_id = {w.node_id: w for w in ws}
    for job in queue:
        exp = explain(job, ws, SUPPORT_MATRIX)
        assert explain(job, data.draw(st.permutations(ws)), SUPPORT_MATRIX) == exp
        assert exp.summary
        if exp.rejections:
            assert not exp.workers and exp.placement is None
            continue
        assert [r.worker for r in exp.workers] == sorted(by_id)
        for row in exp.workers:
            assert (row.state is FitState.FITS_NOW) == (row.placement is not None)
            if row.placement is not None:
                _assert_sound(job, by_id[row.worker], row.placement)
        fits_now = [r.worker for r in exp.workers if r.state is FitState.FITS_NOW]
        # A multi-host job fits now only when nnodes workers fit now at once.
        hosts = job.distributed.nnodes if job.distributed is not None else 1
        assert exp.hosts_needed == hosts
        assert (exp.verdict is Verdict.FITS_NOW) == (len(fits_now) >= hosts)
        if len(fits_now) >= hosts:
            assert exp.placement is not None and exp.placement.worker == min(fits_now)
        else:
            assert exp.placement is None


@SLOW
@given(near_queues(max_jobs=5), st.lists(st.integers(0, 4), max_size=12))
def test_explain_many_equals_explain(
    queue_ws: tuple[list[JobRequest], list[WorkerSnapshot]], picks: list[int]
) -> None:
    shapes, ws = queue_ws
    # A lab queue repeats shapes: the same requirements under many job ids.
    queue = [replace(shapes[p % len(shapes)], job_id=f"q{n}") for n, p in enumerate(picks)] + shapes
    many = explain_many(queue, ws, SUPPORT_MATRIX)
    assert len(many) == len(queue)
    for job, got in zip(queue, many, strict=True):
        want = explain(job, ws, SUPPORT_MATRIX)
        assert got.job_id == job.job_id
        assert (got.verdict, got.placement, got.workers, got.rejections) == (
            want.verdict, want.placement, want.workers, want.rejections
        )
        assert got == want
    # Equal signatures, equal answers.
    for a, ea in zip(queue, many, strict=True):
        for b, eb in zip(queue, many, strict=True):
            if job_signature(a) == job_signature(b):
                assert replace(ea, job_id="") == replace(eb, job_id="")


def _over_the_wire(w: WorkerSnapshot) -> WorkerSnapshot:
    """Rebuild ``w`` as another peer would: capability JSON, sent, parsed and converted."""
    caps = Capabilities(
        node_id=w.node_id,
        hostname=w.name,
        online=w.online,
        cpu_count=w.cpu_count,
        memory_total_bytes=w.memory_total_bytes,
        devices=[DeviceModel.from_core(d) for d in w.devices],
        environments=[EnvironmentModel.from_core(e) for e in w.environments],
        health=[ProbeHealthModel.from_core(h) for h in w.health],
    )
    wire = json.loads(json.dumps(caps.model_dump(mode="json")))
    paths = None if w.existing_paths is None else frozenset(sorted(w.existing_paths))
    got = Capabilities.model_validate(wire).to_core(existing_paths=paths)
    # CPU slots are the worker's own bookkeeping, not part of capability JSON.
    return replace(got, cpu_slots_total=w.cpu_slots_total, cpu_slots_free=w.cpu_slots_free)


@SLOW
@given(near_queues(max_jobs=3), st.data())
def test_same_result_on_every_peer(
    queue_ws: tuple[list[JobRequest], list[WorkerSnapshot]], data: st.DataObject
) -> None:
    queue, ws = queue_ws
    peer = [_over_the_wire(w) for w in data.draw(st.permutations(ws))]
    assert sorted(peer, key=lambda w: w.node_id) == sorted(ws, key=lambda w: w.node_id)
    for job in queue:
        assert explain(job, peer, SUPPORT_MATRIX) == explain(job, ws, SUPPORT_MATRIX)
    assert explain_many(queue, peer, SUPPORT_MATRIX) == explain_many(queue, ws, SUPPORT_MATRIX)


def _grant(ws: list[WorkerSnapshot], job: JobRequest, p: Placement) -> list[WorkerSnapshot]:
    """The workers after ``p`` is granted: its devices marked, CPU slots taken."""

    def granted(d: DeviceSnapshot) -> DeviceSnapshot:
        mine = d.accelerator is p.accelerator and d.index in p.device_indices
        return replace(d, granted_to=job.job_id) if mine else d

    out = []
    for w in ws:
        if w.node_id == p.worker:
            free = w.cpu_slots_free
            if job.gpu_count == 0 and free is not None:
                free -= _cpu_slots_needed(job)
            w = replace(w, devices=tuple(granted(d) for d in w.devices), cpu_slots_free=free)  # noqa: PLW2901
        out.append(w)
    return out


@SLOW
@given(near_queues(max_jobs=8))
def test_no_over_commit_when_grants_are_applied(queue_ws: tuple[list[JobRequest], list[WorkerSnapshot]]) -> None:
    queue, ws = queue_ws
    granted: dict[tuple[str, Accelerator, int], str] = {}
    for n, job in enumerate(queue):
        job = replace(job, job_id=f"q{n}")  # noqa: PLW2901
        p = explain(job, ws, SUPPORT_MATRIX).placement
        if p is None:
            continue
        _assert_sound(job, next(w for w in ws if w.node_id == p.worker), p)
        for idx in p.device_indices:
            key = (p.worker, p.accelerator, idx)
            assert key not in granted, f"device {key} granted to {granted.get(key)} and {job.job_id}"
            granted[key] = job.job_id
        ws = _grant(ws, job, p)
        assert all(w.cpu_slots_free is None or w.cpu_slots_free >= 0 for w in ws), "CPU slots over-committed"


# ------------------------------------------------------------------ helpers for parse checks

_CANONICAL_WORKER = WorkerSnapshot(
    node_id="node-00",
    name="ws-00",
    devices=(
        DeviceSnapshot(
            Accelerator.CUDA, 0, "GPU-0", "NVIDIA GeForce RTX 4090", 24564 * MiB, 0, MemoryKind.DEDICATED,
            (8, 9), "580.126.09", True, True,
        ),
    ),
    environments=(
        EnvironmentSnapshot(
            "/usr/bin/python3", "3.11.7",
            {"torch": FrameworkVersion("torch", "2.5.1+cu121", "torch")},
            torch_cuda=True, distributed_backends=("gloo", "nccl"),
        ),
    ),
)
