"""What a worker reports about itself (``gpulayer devices --json``), validated with pydantic.

Readers tolerate unknown fields (the JSON is versioned with ``v``). Units: ``*_bytes`` are bytes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpulayerd.core.types import (
    Accelerator,
    DeviceKind,
    DeviceSnapshot,
    DeviceState,
    EnvironmentSnapshot,
    FrameworkVersion,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.models.spec import parse_compute_capability

__all__ = [
    "CAPABILITIES_VERSION",
    "Capabilities",
    "DeviceModel",
    "EnvironmentModel",
    "FrameworkModel",
    "ProbeHealthModel",
]

CAPABILITIES_VERSION = 1
"""Version of the capability JSON written by ``gpulayer devices --json``."""


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
    kind: DeviceKind = DeviceKind.GPU
    parent_uuid: str | None = None
    mig_profile: str | None = None
    mig_enabled: bool | None = None
    pci_bus_id: str | None = None
    state: DeviceState = DeviceState.OK
    state_reason: str = ""
    processes_known: bool = True
    memory_approximate: bool = False
    """``memory_total_bytes`` is an estimate (the Apple GPU's recommended working set), not a tool's figure."""
    compute_mode: str | None = None
    """nvidia-smi ``compute_mode`` (``Default``, ``Exclusive_Process``, ``Prohibited``); None if unknown."""

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
            kind=self.kind,
            parent_uuid=self.parent_uuid,
            mig_profile=self.mig_profile,
            mig_enabled=self.mig_enabled,
            pci_bus_id=self.pci_bus_id,
            state=self.state,
            state_reason=self.state_reason,
            processes_known=self.processes_known,
            memory_approximate=self.memory_approximate,
            compute_mode=self.compute_mode,
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
            kind=d.kind,
            parent_uuid=d.parent_uuid,
            mig_profile=d.mig_profile,
            mig_enabled=d.mig_enabled,
            pci_bus_id=d.pci_bus_id,
            state=d.state,
            state_reason=d.state_reason,
            processes_known=d.processes_known,
            memory_approximate=d.memory_approximate,
            compute_mode=d.compute_mode,
        )


class FrameworkModel(BaseModel):
    """One installed framework: version as in the metadata and the distribution it came from.

    ``version`` is null when unknown (``note`` says why: "metadata file missing"), never
    the string "None". ``others`` lists the other distributions that claim the same import
    package (``"onnxruntime 1.19.2"``); then ``conflict`` is true and ``distribution`` is the
    one whose RECORD hashes match the files on disk, when the hashes could tell.
    """

    model_config = ConfigDict(extra="ignore")

    version: str | None
    distribution: str
    valid: bool = True
    others: list[str] = Field(default_factory=list, max_length=32)
    conflict: bool = False
    note: str = ""


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
    cuda_builds: dict[str, str] = Field(default_factory=dict, max_length=16)
    machine: str | None = Field(default=None, max_length=64)
    translated: bool | None = None
    mps_recommended_max_bytes: int | None = Field(default=None, ge=0)
    torch_pending: bool = False
    import_errors: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=16)
    """framework -> the decisive line of its import failure (``torch`` -> ``ImportError: ...``)."""
    configured: str | None = Field(default=None, max_length=4096)
    """The interpreter as configured when it is a shim or launcher resolved to ``interpreter``."""
    launcher: str = Field(default="", max_length=64)
    """What ``configured`` is: ``pyenv shim``, ``asdf shim``, ``mise shim``, ``Python launcher``."""
    activation: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=8192)]] = Field(
        default_factory=dict, max_length=160)
    """A conda environment's activation (``CONDA_PREFIX``, ...) that jobs run with."""

    def to_core(self) -> EnvironmentSnapshot:
        """Convert to an :class:`EnvironmentSnapshot`."""
        return EnvironmentSnapshot(
            interpreter=self.interpreter,
            python_version=self.python_version,
            frameworks={
                k: FrameworkVersion(name=k, version=f.version, distribution=f.distribution, valid=f.valid,
                                    others=tuple(f.others), note=f.note)
                for k, f in self.frameworks.items()
            },
            torch_cuda=self.torch_cuda,
            torch_mps=self.torch_mps,
            distributed_backends=(
                None if self.distributed_backends is None else tuple(self.distributed_backends)
            ),
            ok=self.ok,
            notes=tuple(self.notes),
            cuda_builds=dict(self.cuda_builds),
            machine=self.machine,
            translated=self.translated,
            mps_recommended_max_bytes=self.mps_recommended_max_bytes,
            torch_pending=self.torch_pending,
            import_errors=dict(self.import_errors),
            configured=self.configured,
            launcher=self.launcher,
            activation=dict(self.activation),
        )

    @classmethod
    def from_core(cls, e: EnvironmentSnapshot) -> EnvironmentModel:
        """Build from an :class:`EnvironmentSnapshot`."""
        return cls(
            interpreter=e.interpreter,
            python_version=e.python_version,
            frameworks={
                k: FrameworkModel(version=f.version, distribution=f.distribution, valid=f.valid,
                                  others=list(f.others), conflict=bool(f.others), note=f.note)
                for k, f in sorted(e.frameworks.items())
            },
            torch_cuda=e.torch_cuda,
            torch_mps=e.torch_mps,
            distributed_backends=(
                None if e.distributed_backends is None else list(e.distributed_backends)
            ),
            ok=e.ok,
            notes=list(e.notes),
            cuda_builds=dict(sorted(e.cuda_builds.items())),
            machine=e.machine,
            translated=e.translated,
            mps_recommended_max_bytes=e.mps_recommended_max_bytes,
            torch_pending=e.torch_pending,
            import_errors=dict(sorted(e.import_errors.items())),
            configured=e.configured,
            launcher=e.launcher,
            activation=dict(sorted(e.activation.items())),
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
        mode: ``personal`` (runs only ``user``'s jobs) or ``system`` (runs each job as its user);
            a report without it (an older daemon) reads as personal.
        user: a personal-mode worker's account ("" in system mode, or not said).
        allow_root_jobs: a system-mode worker runs root's jobs.
        missing_accounts: user names this worker was asked to run lately and has no account for.
        max_gpus_per_user: the most GPUs of this worker one user may hold; None = no cap.
        driver_cuda: the newest CUDA the NVIDIA driver supports (nvidia-smi's ``CUDA Version``,
            else :func:`gpulayerd.core.matching.cuda_compat.driver_cuda_version` of the driver); None if unknown.
        kind: ``host`` (a workstation) or ``slurm`` (a worker backed by a Slurm cluster: its devices are the
            GPUs of ``slurm_partitions``).
        slurm_partitions: a Slurm worker's partitions; ``slurm_gres``: each node's GRES (``node: gpu:a100:4``).
        slurm_refused: user -> Slurm's words, for users whose jobs its sbatch refused lately (kept off a while).
        slurm_pending: Slurm's reasons for the gpulayer jobs it holds pending now (``Priority``, ``Resources``).
        slurm_overflow_after_s: ``[slurm] prefer = "overflow-after = D"``'s D (s): it takes only jobs that
            waited that long; None for ``last``.
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
    mode: Literal["personal", "system"] = "personal"
    user: str = Field(default="", max_length=64)
    allow_root_jobs: bool = False
    missing_accounts: list[str] = Field(default_factory=list, max_length=256)
    max_gpus_per_user: int | None = Field(default=None, ge=0)
    driver_cuda: str | None = Field(default=None, max_length=16)
    kind: Literal["host", "slurm"] = "host"
    slurm_partitions: list[str] = Field(default_factory=list, max_length=256)
    slurm_gres: list[str] = Field(default_factory=list, max_length=4096)
    slurm_refused: dict[str, str] = Field(default_factory=dict, max_length=256)
    slurm_pending: list[str] = Field(default_factory=list, max_length=64)
    slurm_overflow_after_s: float | None = Field(default=None, ge=0)

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
            mode=self.mode,
            user=self.user,
            allow_root_jobs=self.allow_root_jobs,
            missing_accounts=frozenset(self.missing_accounts),
            max_gpus_per_user=self.max_gpus_per_user,
            os=self.platform.lower() if self.platform else None,
            driver_cuda=self.driver_cuda,
            kind=self.kind,
            slurm_partitions=tuple(self.slurm_partitions),
            slurm_refused=dict(self.slurm_refused),
            slurm_pending=tuple(p[:64] for p in self.slurm_pending),
            slurm_overflow_after_s=self.slurm_overflow_after_s,
        )
