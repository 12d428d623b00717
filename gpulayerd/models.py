"""pydantic v2 models for everything that crosses a boundary.

Job spec files (TOML), capability JSON (``gpulayer devices --json``), API bodies and
explanations are parsed here with ``model_validate`` and converted to the frozen
dataclasses of :mod:`gpulayerd.core.types` with ``to_core()``. Readers tolerate
unknown fields in capability JSON (it is versioned with ``v``); job specs reject
unknown fields, naming them.

Units: ``*_bytes`` are bytes; ``gpu_memory_gb`` is decimal GB (10^9 bytes).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpulayerd.core.matching import Explanation, Placement, Rejection
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

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "CAPABILITIES_VERSION",
    "KNOWN_FRAMEWORKS",
    "ApiErrorBody",
    "AttemptView",
    "Capabilities",
    "CheckModel",
    "DeviceModel",
    "DistributedModel",
    "EnvironmentModel",
    "EventView",
    "ExplanationModel",
    "FrameworkModel",
    "HealthView",
    "JobList",
    "JobSpec",
    "JobView",
    "LogChunk",
    "PeerView",
    "PlacementModel",
    "PolicyModel",
    "ProbeHealthModel",
    "RejectionModel",
    "Requirements",
    "SpecError",
    "SubmitRequest",
    "WorkerExplanationModel",
    "format_validation_error",
    "job_spec_from_mapping",
    "load_job_spec",
    "parse_compute_capability",
]

CAPABILITIES_VERSION = 1
"""Version of the capability JSON written by ``gpulayer devices --json``."""

KNOWN_FRAMEWORKS: tuple[str, ...] = (
    "torch",
    "jax",
    "jaxlib",
    "tensorflow",
    "mlx",
    "cupy",
    "onnxruntime",
    "tensorrt",
    "triton",
    "vllm",
    "transformers",
    "numpy",
)
"""Framework names a job may put in ``requirements.frameworks``."""


class SpecError(ValueError):
    """A job spec is invalid. The message names each bad field and what is allowed."""


def parse_compute_capability(value: object) -> tuple[int, int] | None:
    """Parse a CUDA compute capability into (major, minor).

    Accepts ``8``, ``8.6``, ``"8.6"``, ``" 9.0"``, ``"12"``; a missing minor is 0.
    Placeholders (``[N/A]`` and the like), empty strings and None give None.

    Raises:
        ValueError: if the value is neither a placeholder nor ``major[.minor]`` digits.
    """
    if value is None or isinstance(value, bool):
        if value is None:
            return None
        raise ValueError(f"not a compute capability: {value!r}")
    if isinstance(value, tuple | list) and len(value) == 2:
        return (int(value[0]), int(value[1]))
    text = str(value).strip()
    if not text or text.startswith("[") or text.upper() == "N/A":
        return None
    major, _, minor = text.partition(".")
    if not major.isdigit() or (minor and not minor.isdigit()):
        raise ValueError(f"not a compute capability: {value!r} (expected e.g. 8.6)")
    return (int(major), int(minor or "0"))


def _enum_values(enum_type: type[Accelerator] | type[MemoryKind]) -> str:
    return ", ".join(m.value for m in enum_type)


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """Render a pydantic error as lines ``field.path: message`` (one per problem)."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        loc = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "spec")
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{loc}: {msg}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- job spec


class Requirements(BaseModel):
    """``[requirements]`` of a job spec: what a worker must offer.

    ``gpu_count`` defaults to 0 for ``cpu`` and 1 otherwise and counts devices per host.
    ``gpu_memory_gb`` is per device, decimal GB (10^9 bytes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerator: Accelerator = Accelerator.CPU
    gpu_count: int | None = Field(default=None, ge=0, le=64)
    gpu_memory_gb: float | None = Field(default=None, gt=0, le=100_000)
    gpu_memory_kind: MemoryKind | None = None
    min_cuda_compute_capability: str | None = None
    frameworks: dict[str, str] = Field(default_factory=dict)
    python: str | None = None
    requires_float64: bool = False

    @field_validator("accelerator", mode="before")
    @classmethod
    def _accelerator(cls, v: object) -> object:
        if isinstance(v, str) and v.lower() not in {a.value for a in Accelerator}:
            raise ValueError(f"{v!r} is not one of: {_enum_values(Accelerator)}")
        return v.lower() if isinstance(v, str) else v

    @field_validator("gpu_memory_kind", mode="before")
    @classmethod
    def _memory_kind(cls, v: object) -> object:
        if isinstance(v, str) and v.lower() not in {k.value for k in MemoryKind}:
            raise ValueError(f"{v!r} is not one of: {_enum_values(MemoryKind)}")
        return v.lower() if isinstance(v, str) else v

    @field_validator("min_cuda_compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise ValueError("must be a number or string like 8.0 or '8.6'")
        cc = parse_compute_capability(v)
        if cc is None:
            raise ValueError(f"{v!r} is not a compute capability (expected e.g. 8.6)")
        return f"{cc[0]}.{cc[1]}"

    @field_validator("frameworks")
    @classmethod
    def _frameworks(cls, v: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, spec in v.items():
            key = name.strip().lower()
            if key not in KNOWN_FRAMEWORKS:
                raise ValueError(
                    f"unknown framework {name!r}; known: {', '.join(KNOWN_FRAMEWORKS)}"
                )
            try:
                SpecifierSet(spec)
            except InvalidSpecifier as e:
                raise ValueError(
                    f"{name}: {spec!r} is not a PEP 440 specifier (e.g. '>=2.4,<3')"
                ) from e
            out[key] = spec.strip()
        return out

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            SpecifierSet(v)
        except InvalidSpecifier as e:
            raise ValueError(f"{v!r} is not a PEP 440 specifier (e.g. '>=3.10')") from e
        return v.strip()

    @model_validator(mode="after")
    def _counts(self) -> Requirements:
        if self.accelerator is Accelerator.CPU:
            if self.gpu_count:
                raise ValueError("gpu_count must be 0 when accelerator is 'cpu'")
            for name in ("gpu_memory_gb", "gpu_memory_kind", "min_cuda_compute_capability"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} needs a GPU accelerator (cuda, mps, rocm), not cpu")
        elif self.gpu_count == 0:
            raise ValueError(f"gpu_count must be at least 1 for accelerator {self.accelerator.value!r}")
        if self.min_cuda_compute_capability is not None and self.accelerator is not Accelerator.CUDA:
            raise ValueError("min_cuda_compute_capability applies only to accelerator 'cuda'")
        return self

    @property
    def effective_gpu_count(self) -> int:
        """Devices wanted per host: ``gpu_count``, or its default (0 for cpu, else 1)."""
        if self.gpu_count is not None:
            return self.gpu_count
        return 0 if self.accelerator is Accelerator.CPU else 1


class DistributedModel(BaseModel):
    """``[distributed]`` of a job spec: a torch.distributed job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = Field(default=1, ge=1, le=256)
    nproc_per_node: int = Field(default=1, ge=1, le=256)
    backend: Literal["gloo", "nccl"] | None = None


class PolicyModel(BaseModel):
    """``[policy]`` of a job spec: retries after a lost attempt, and the lease length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retries: int = Field(default=0, ge=0, le=100)
    lease_s: float = Field(default=30.0, ge=1.0, le=86_400.0)


class JobSpec(BaseModel):
    """A job as a user writes it (TOML file or CLI flags).

    ``command`` is a list of arguments (a string is split with shlex). A leading
    ``python`` runs with the matched environment's interpreter. ``workdir`` must exist
    on the worker that runs the job.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(default=None, max_length=200)
    command: list[str]
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    requirements: Requirements = Field(default_factory=Requirements)
    distributed: DistributedModel | None = None
    policy: PolicyModel = Field(default_factory=PolicyModel)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: object) -> object:
        if isinstance(v, str):
            v = shlex.split(v)
        if isinstance(v, list) and not v:
            raise ValueError("must not be empty (e.g. command = [\"python\", \"train.py\"])")
        return v

    @field_validator("command")
    @classmethod
    def _command_items(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (first item) must not be empty")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if not v.strip():
            raise ValueError("must not be empty")
        if "\0" in v:
            raise ValueError("must not contain a NUL byte")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError("must be valid UTF-8 text") from e
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return v

    def to_core(self, job_id: str = "") -> JobRequest:
        """Convert to the core's :class:`JobRequest`."""
        r = self.requirements
        dist = None
        if self.distributed is not None:
            backend = self.distributed.backend or (
                "nccl" if r.accelerator is Accelerator.CUDA else "gloo"
            )
            dist = DistributedRequest(
                nnodes=self.distributed.nnodes,
                nproc_per_node=self.distributed.nproc_per_node,
                backend=backend,
            )
        return JobRequest(
            job_id=job_id,
            accelerator=r.accelerator,
            gpu_count=r.effective_gpu_count,
            gpu_memory_bytes=None if r.gpu_memory_gb is None else round(r.gpu_memory_gb * GB),
            gpu_memory_kind=r.gpu_memory_kind,
            min_cuda_compute_capability=parse_compute_capability(r.min_cuda_compute_capability),
            frameworks=dict(r.frameworks),
            python=r.python,
            requires_float64=r.requires_float64,
            distributed=dist,
            workdir=self.workdir,
        )


def load_job_spec(path: str | Path, base_dir: str | Path | None = None) -> JobSpec:
    """Load a job spec from a TOML file.

    A relative ``workdir`` is taken relative to ``base_dir`` (default: the current
    directory); a missing ``workdir`` becomes ``base_dir``. The workdir is not checked
    for existence here: that is the worker's business (or the submit command's).

    Raises:
        SpecError: the file cannot be read, is not TOML, or has invalid fields; the
            message names the file and each bad field.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p}: malformed TOML: {e}") from e
    return job_spec_from_mapping(data, source=str(p), base_dir=base_dir)


def job_spec_from_mapping(
    data: Mapping[str, Any], source: str = "spec", base_dir: str | Path | None = None
) -> JobSpec:
    """Validate a mapping (parsed TOML or JSON) as a :class:`JobSpec`.

    Raises:
        SpecError: naming ``source`` and each bad field.
    """
    try:
        spec = JobSpec.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError(f"{source}: invalid job spec\n{format_validation_error(e)}") from e
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    workdir = Path(spec.workdir) if spec.workdir else base
    if spec.workdir and spec.workdir.startswith("~"):
        expanded = Path(os.path.expanduser(spec.workdir))
        if str(expanded).startswith("~"):
            raise SpecError(f"{source}: invalid job spec\nworkdir: cannot expand {spec.workdir!r} (no such user)")
        workdir = expanded
    if not workdir.is_absolute():
        workdir = base / workdir
    return spec.model_copy(update={"workdir": os.path.normpath(workdir)})


# ------------------------------------------------------------------------ capabilities


class DeviceModel(BaseModel):
    """One device in capability JSON (see :class:`gpulayerd.core.types.DeviceSnapshot`)."""

    model_config = ConfigDict(extra="ignore")

    accelerator: Accelerator
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_kind: MemoryKind | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    execution_supported: bool = False
    float64: bool | None = None
    granted_to: str | None = None
    foreign_pids: list[int] = Field(default_factory=list)

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _cc(cls, v: object) -> object:
        cc = parse_compute_capability(v)
        return None if cc is None else f"{cc[0]}.{cc[1]}"

    def to_core(self) -> DeviceSnapshot:
        """Convert to a :class:`DeviceSnapshot`."""
        return DeviceSnapshot(
            accelerator=self.accelerator,
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            memory_total_bytes=self.memory_total_bytes,
            memory_used_bytes=self.memory_used_bytes,
            memory_kind=self.memory_kind,
            compute_capability=parse_compute_capability(self.compute_capability),
            driver_version=self.driver_version,
            execution_supported=self.execution_supported,
            float64=self.float64,
            granted_to=self.granted_to,
            foreign_pids=tuple(self.foreign_pids),
        )

    @classmethod
    def from_core(cls, d: DeviceSnapshot) -> DeviceModel:
        """Build from a :class:`DeviceSnapshot`."""
        cc = d.compute_capability
        return cls(
            accelerator=d.accelerator,
            index=d.index,
            uuid=d.uuid,
            name=d.name,
            memory_total_bytes=d.memory_total_bytes,
            memory_used_bytes=d.memory_used_bytes,
            memory_kind=d.memory_kind,
            compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
            driver_version=d.driver_version,
            execution_supported=d.execution_supported,
            float64=d.float64,
            granted_to=d.granted_to,
            foreign_pids=list(d.foreign_pids),
        )


class FrameworkModel(BaseModel):
    """One installed framework: version as in the metadata and the distribution it came from."""

    model_config = ConfigDict(extra="ignore")

    version: str
    distribution: str
    valid: bool = True


class EnvironmentModel(BaseModel):
    """One workload interpreter (see :class:`gpulayerd.core.types.EnvironmentSnapshot`)."""

    model_config = ConfigDict(extra="ignore")

    interpreter: str
    python_version: str | None = None
    frameworks: dict[str, FrameworkModel] = Field(default_factory=dict)
    torch_cuda: bool | None = None
    torch_mps: bool | None = None
    distributed_backends: list[str] | None = None
    ok: bool = True
    notes: list[str] = Field(default_factory=list)

    def to_core(self) -> EnvironmentSnapshot:
        """Convert to an :class:`EnvironmentSnapshot`."""
        return EnvironmentSnapshot(
            interpreter=self.interpreter,
            python_version=self.python_version,
            frameworks={
                k: FrameworkVersion(name=k, version=f.version, distribution=f.distribution, valid=f.valid)
                for k, f in self.frameworks.items()
            },
            torch_cuda=self.torch_cuda,
            torch_mps=self.torch_mps,
            distributed_backends=(
                None if self.distributed_backends is None else tuple(self.distributed_backends)
            ),
            ok=self.ok,
            notes=tuple(self.notes),
        )

    @classmethod
    def from_core(cls, e: EnvironmentSnapshot) -> EnvironmentModel:
        """Build from an :class:`EnvironmentSnapshot`."""
        return cls(
            interpreter=e.interpreter,
            python_version=e.python_version,
            frameworks={
                k: FrameworkModel(version=f.version, distribution=f.distribution, valid=f.valid)
                for k, f in sorted(e.frameworks.items())
            },
            torch_cuda=e.torch_cuda,
            torch_mps=e.torch_mps,
            distributed_backends=(
                None if e.distributed_backends is None else list(e.distributed_backends)
            ),
            ok=e.ok,
            notes=list(e.notes),
        )


class ProbeHealthModel(BaseModel):
    """Health of one probe source (nvidia-smi, rocm-smi, apple, ...)."""

    model_config = ConfigDict(extra="ignore")

    source: str
    status: ProbeStatus
    message: str = ""
    path: str | None = None

    def to_core(self) -> ProbeHealth:
        """Convert to a :class:`ProbeHealth`."""
        return ProbeHealth(source=self.source, status=self.status, message=self.message, path=self.path)

    @classmethod
    def from_core(cls, h: ProbeHealth) -> ProbeHealthModel:
        """Build from a :class:`ProbeHealth`."""
        return cls(source=h.source, status=h.status, message=h.message, path=h.path)


class Capabilities(BaseModel):
    """What one worker reports about itself: ``gpulayer devices --json``.

    Attributes:
        v: format version (:data:`CAPABILITIES_VERSION`).
        node_id: stable id of the worker; ``hostname`` is for people.
        online: False for a worker that is known but unreachable.
        cpu_count: logical CPUs (psutil).
        memory_total_bytes: system RAM in bytes (psutil).
        taken_at: wall-clock time of the snapshot, seconds since the epoch.
        cpu_slots_total: CPU processes the daemon runs at once (None: not a daemon's report).
        cpu_slots_free: of those, free now.
    """

    model_config = ConfigDict(extra="ignore")

    v: int = CAPABILITIES_VERSION
    node_id: str
    hostname: str = ""
    online: bool = True
    platform: str | None = None
    machine: str | None = None
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    devices: list[DeviceModel] = Field(default_factory=list)
    environments: list[EnvironmentModel] = Field(default_factory=list)
    health: list[ProbeHealthModel] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    taken_at: float | None = None
    cpu_slots_total: int | None = None
    cpu_slots_free: int | None = None

    def to_core(self, existing_paths: frozenset[str] | None = None) -> WorkerSnapshot:
        """Convert to a :class:`WorkerSnapshot` for the matcher."""
        return WorkerSnapshot(
            node_id=self.node_id,
            name=self.hostname or self.node_id,
            online=self.online,
            devices=tuple(d.to_core() for d in self.devices),
            environments=tuple(e.to_core() for e in self.environments),
            cpu_count=self.cpu_count,
            memory_total_bytes=self.memory_total_bytes,
            health=tuple(h.to_core() for h in self.health),
            existing_paths=existing_paths,
            cpu_slots_total=self.cpu_slots_total,
            cpu_slots_free=self.cpu_slots_free,
        )


# ------------------------------------------------------------------------ explanations


class RejectionModel(BaseModel):
    """A :class:`gpulayerd.core.matching.Rejection` on the wire."""

    model_config = ConfigDict(extra="ignore")

    code: str
    requirement: str
    wanted: str
    found: str
    worker: str
    message: str
    device: int | None = None
    environment: str | None = None

    @classmethod
    def from_core(cls, r: Rejection) -> RejectionModel:
        """Build from a core rejection."""
        return cls(
            code=r.code.value, requirement=r.requirement, wanted=r.wanted, found=r.found,
            worker=r.worker, message=r.message, device=r.device, environment=r.environment,
        )


class PlacementModel(BaseModel):
    """A :class:`gpulayerd.core.matching.Placement` on the wire."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    environment: str
    accelerator: Accelerator
    device_indices: list[int]
    device_uuids: list[str | None]

    @classmethod
    def from_core(cls, p: Placement) -> PlacementModel:
        """Build from a core placement."""
        return cls(
            worker=p.worker, environment=p.environment, accelerator=p.accelerator,
            device_indices=list(p.device_indices), device_uuids=list(p.device_uuids),
        )


class CheckModel(BaseModel):
    """One row of the worker x requirement table (``ok`` None = not checked here)."""

    model_config = ConfigDict(extra="ignore")

    requirement: str
    wanted: str
    found: str
    ok: bool | None


class WorkerExplanationModel(BaseModel):
    """One worker's part of an explanation."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    name: str
    online: bool
    state: str
    checks: list[CheckModel]
    rejections: list[RejectionModel]
    placement: PlacementModel | None = None


class ExplanationModel(BaseModel):
    """``gpulayer explain --json``: verdict, placement and the worker x requirement table."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    verdict: str
    summary: str
    hosts_needed: int = 1
    placement: PlacementModel | None = None
    rejections: list[RejectionModel] = Field(default_factory=list)
    workers: list[WorkerExplanationModel] = Field(default_factory=list)

    @classmethod
    def from_core(cls, e: Explanation) -> ExplanationModel:
        """Build from a core explanation."""
        return cls(
            job_id=e.job_id,
            verdict=e.verdict.value,
            summary=e.summary,
            hosts_needed=e.hosts_needed,
            placement=None if e.placement is None else PlacementModel.from_core(e.placement),
            rejections=[RejectionModel.from_core(r) for r in e.rejections],
            workers=[
                WorkerExplanationModel(
                    worker=w.worker, name=w.name, online=w.online, state=w.state.value,
                    checks=[CheckModel(requirement=c.requirement, wanted=c.wanted, found=c.found, ok=c.ok)
                            for c in w.checks],
                    rejections=[RejectionModel.from_core(r) for r in w.rejections],
                    placement=None if w.placement is None else PlacementModel.from_core(w.placement),
                )
                for w in e.workers
            ],
        )


# ------------------------------------------------------------------------------ jobs


class SubmitRequest(BaseModel):
    """``POST /v1/jobs`` body: a job spec (already resolved: absolute workdir)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any]
    submitted_by: str = ""


class AttemptView(BaseModel):
    """One attempt of a job: where it ran and how it ended."""

    model_config = ConfigDict(extra="ignore")

    attempt: int
    worker: str
    worker_name: str | None = None
    state: str
    placement: PlacementModel | None = None
    gang: list[str] = Field(default_factory=list)
    """Node ids of a multi-host job's members, by node rank (empty for a one-host job)."""
    run_dir: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""


class EventView(BaseModel):
    """One row of a job's append-only history."""

    model_config = ConfigDict(extra="ignore")

    seq: int
    at: float
    kind: str
    from_status: str | None = None
    to_status: str | None = None
    attempt: int | None = None
    reason: str = ""
    stimulus_id: str = ""


class JobView(BaseModel):
    """A job as the API shows it (``gpulayer show --json``).

    Attributes:
        status: queued, claimed, running, succeeded, failed, cancelled, lost or rejected.
        reason: the last state change's reason, or for a waiting job why it waits.
        holder: node id of the worker running the current attempt.
        holder_name: that worker's host name, when known.
        explanation: the last explanation (waiting and rejected jobs).
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    name: str | None = None
    submitted_by: str = ""
    owner: str | None = None
    """Node id of the daemon that owns the job (where it was submitted)."""
    owner_name: str | None = None
    status: str
    attempt: int = 0
    holder: str | None = None
    holder_name: str | None = None
    retries_left: int = 0
    cancel_requested: bool = False
    reason: str = ""
    exit_code: int | None = None
    submitted_at: float
    updated_at: float
    spec: JobSpec
    explanation: ExplanationModel | None = None
    attempts: list[AttemptView] = Field(default_factory=list)
    events: list[EventView] = Field(default_factory=list)


class JobList(BaseModel):
    """A list of jobs (a peer's own jobs, for ``gpulayer jobs`` across the cluster)."""

    model_config = ConfigDict(extra="ignore")

    jobs: list[JobView] = Field(default_factory=list)


class LogChunk(BaseModel):
    """``GET /v1/jobs/{id}/logs``: bytes ``[offset, next_offset)`` of one log, as text."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    attempt: int
    stream: Literal["stdout", "stderr"]
    offset: int
    next_offset: int
    data: str
    complete: bool
    """True when the job has ended and the chunk reaches the end of the log."""


class ApiErrorBody(BaseModel):
    """The body of every API error: a stable code, a message and details."""

    model_config = ConfigDict(extra="ignore")

    code: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class HealthView(BaseModel):
    """``GET /v1/health``."""

    model_config = ConfigDict(extra="ignore")

    ok: bool
    version: str
    node_id: str
    hostname: str
    pid: int
    state_dir: str
    counters: dict[str, int] = Field(default_factory=dict)
    """Protocol counters: offers sent/received, claims sent/granted/denied/failed, ..."""


class PeerView(BaseModel):
    """One gpulayerd this daemon knows of (``gpulayer peers``), itself included.

    Attributes:
        state: ``self``, ``up``, ``suspect`` (missed heartbeats), ``down``, or ``foreign``
            (another cluster: listed, never used).
        trusted: True if it proved membership of our cluster (mutual TLS).
        last_heartbeat_at: wall-clock time of its last heartbeat (seconds since the epoch).
        capabilities: its devices and environments, when fetched.
    """

    model_config = ConfigDict(extra="ignore")

    node_id: str
    name: str
    addresses: list[str] = Field(default_factory=list)
    port: int | None = None
    version: str | None = None
    cluster: str | None = None
    trusted: bool = False
    state: str = "up"
    last_heartbeat_at: float | None = None
    capabilities: Capabilities | None = None
