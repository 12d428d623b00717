"""Immutable value types of the scheduling core.

Everything here is stdlib-only, frozen and hashable where it can be. The pydantic
models in :mod:`gpulayerd.models` parse what comes over a boundary (TOML, JSON, the
wire) and convert into these types with their ``to_core()`` methods; the core never
sees a pydantic model.

Units: bytes are bytes; ``GB`` means 10^9 bytes everywhere in gpulayer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

__all__ = [
    "GB",
    "UNKNOWN_PROCESSES_IDLE_MAX_BYTES",
    "Accelerator",
    "AcceleratorSupport",
    "DeviceKind",
    "DeviceSnapshot",
    "DeviceState",
    "DistributedRequest",
    "EnvironmentSnapshot",
    "ExecutionLevel",
    "FrameworkVersion",
    "JobRequest",
    "MemoryKind",
    "ProbeHealth",
    "ProbeStatus",
    "SupportMatrix",
    "WorkerSnapshot",
]

GB = 10**9
"""One gigabyte: 10^9 bytes (decimal). Job specs state memory in GB."""


class Accelerator(str, enum.Enum):
    """The kind of compute a device offers (or a job asks for)."""

    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"
    ROCM = "rocm"


class MemoryKind(str, enum.Enum):
    """Whether a device's memory is its own (VRAM) or shared with the CPU."""

    DEDICATED = "dedicated"
    UNIFIED = "unified"


class ExecutionLevel(str, enum.Enum):
    """How far support for one accelerator goes (the spec's support matrix words)."""

    TESTED = "tested"
    IMPLEMENTED = "implemented"
    HARDWARE_VALIDATED = "hardware-validated"
    DETECTION_ONLY = "detection-only"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class AcceleratorSupport:
    """One row of the support matrix.

    Attributes:
        accelerator: the accelerator this row is about.
        independent: support level for single-process / single-host jobs.
        distributed: support level for ``torch.distributed`` jobs.
        distributed_backends: backends a distributed job may use on it.
        multi_host: whether a distributed job may span several hosts.
        notes: what this project's own tests exercise, in words.
    """

    accelerator: Accelerator
    independent: ExecutionLevel
    distributed: ExecutionLevel
    distributed_backends: tuple[str, ...]
    multi_host: bool
    notes: str

    @property
    def schedulable(self) -> bool:
        """True if jobs may be placed on this accelerator at all."""
        return self.independent not in (ExecutionLevel.DETECTION_ONLY, ExecutionLevel.UNSUPPORTED)

    @property
    def distributed_allowed(self) -> bool:
        """True if distributed jobs may be placed on this accelerator."""
        return self.distributed not in (
            ExecutionLevel.DETECTION_ONLY,
            ExecutionLevel.UNSUPPORTED,
        )


@dataclass(frozen=True, slots=True)
class SupportMatrix:
    """The support matrix: one :class:`AcceleratorSupport` per accelerator."""

    rows: tuple[AcceleratorSupport, ...]

    def row(self, accelerator: Accelerator) -> AcceleratorSupport:
        """Return the row for ``accelerator``.

        Raises:
            KeyError: if the matrix has no row for it.
        """
        for r in self.rows:
            if r.accelerator is accelerator:
                return r
        raise KeyError(accelerator.value)


class ProbeStatus(str, enum.Enum):
    """Outcome of one hardware probe (e.g. nvidia-smi). Never conflated with 'no GPU'."""

    OK = "ok"
    NOT_FOUND = "not_found"
    NO_DEVICES = "no_devices"
    DRIVER_UNAVAILABLE = "driver_unavailable"
    DRIVER_LIBRARY_MISMATCH = "driver_library_mismatch"
    TIMEOUT = "timeout"
    ERROR = "error"
    DEGRADED = "degraded"
    """Some devices answered and some did not (the tool named them in diagnostic lines)."""


class DeviceKind(str, enum.Enum):
    """What a device entry is: a whole GPU, or one MIG instance of a GPU in MIG mode."""

    GPU = "gpu"
    MIG = "mig"


class DeviceState(str, enum.Enum):
    """Whether the probe could read a device and the daemon may schedule it: ``lost`` devices
    (named only in a diagnostic line, e.g. ``Unable to determine the device handle for GPU
    0000:41:00.0``), ``unusable`` ones (listed, but a field reads ``[GPU requires reset]`` or
    ``[Unknown Error]``, or the compute mode is ``Prohibited``) and ``excluded`` ones (kept out by
    the daemon's ``CUDA_VISIBLE_DEVICES`` or ``NVIDIA_VISIBLE_DEVICES``, or by ``exclude_gpus``:
    :mod:`gpulayerd.core.visible`) are never granted."""

    OK = "ok"
    LOST = "lost"
    UNUSABLE = "unusable"
    EXCLUDED = "excluded"


EXCLUSIVE_COMPUTE_MODES: frozenset[str] = frozenset({"Exclusive_Process", "Exclusive_Thread"})
"""nvidia-smi ``compute_mode`` values in which one CUDA process at a time may use the GPU: a second
gets "all CUDA-capable devices are busy or unavailable"."""

PROHIBITED_COMPUTE_MODE = "Prohibited"
"""nvidia-smi ``compute_mode`` in which no CUDA process may use the GPU."""


OUTSIDE_HOLDER = "(another gpulayerd on this machine)"
"""``granted_to`` of a device whose lock file something other than this daemon holds (a watchdog
that outlived its daemon's records): no event says when it lets go, so a job waiting on it is
re-judged every scheduling pass."""

UNKNOWN_PROCESSES_IDLE_MAX_BYTES = 512 * 2**20
"""A GPU counts as free only if nvidia-smi's ``memory.used`` is at most this (512 MiB: an idle
datacenter GPU reports a few MiB, a display adds up to a few hundred) unless a process it lists
accounts for the use: above it with no process listed (processes nvidia-smi cannot show, as in a
container with its own PID namespace), or with the process list unknown and ``memory.used`` above
it or unknown, it counts as busy."""


@dataclass(frozen=True, slots=True)
class ProbeHealth:
    """Health of one probe source.

    Attributes:
        source: which tool or probe, e.g. ``"nvidia-smi"``, ``"rocm-smi"``, ``"apple"``.
        status: the outcome.
        message: the tool's own words (first line of its output) or our explanation.
        path: the executable that was run, when one was found.
    """

    source: str
    status: ProbeStatus
    message: str = ""
    path: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    """One accelerator device as its worker saw it.

    Attributes:
        accelerator: cuda, mps or rocm (CPU is not a device here).
        index: nvidia-smi ``index`` (PCI bus order) for CUDA; 0 for the Apple GPU.
        uuid: nvidia-smi ``uuid``; a synthetic stable id for other kinds; None if unknown.
        name: nvidia-smi ``name``, or the chip name.
        memory_total_bytes: total memory in bytes (nvidia-smi ``memory.total`` MiB * 2^20;
            system RAM for unified-memory parts); None if unknown.
        memory_used_bytes: nvidia-smi ``memory.used`` in bytes; None if unknown.
        memory_kind: dedicated (VRAM) or unified (system RAM shared with the CPU); None if unknown.
        compute_capability: nvidia-smi ``compute_cap`` as (major, minor); None if unknown.
        driver_version: nvidia-smi ``driver_version``, kept as a string.
        execution_supported: from the support matrix; False means never scheduled.
        float64: whether the device computes in 64-bit floats (False on Apple Metal);
            None if unknown.
        granted_to: id of the job this device is granted to, if any.
        foreign_pids: pids of compute processes on it that gpulayer did not start.
        kind: a whole GPU, or a MIG instance (granted by its ``MIG-...`` uuid).
        parent_uuid: a MIG instance's GPU (``GPU-...``); None for a whole GPU.
        mig_profile: a MIG instance's profile, e.g. ``2g.20gb``; None for a whole GPU.
        mig_enabled: a whole GPU's current MIG mode (nvidia-smi ``mig.mode.current``); True
            means it is never granted whole, only its instances are; None if unknown or n/a.
        pci_bus_id: nvidia-smi ``pci.bus_id`` (``00000000:41:00.0``); None if unknown.
        state: ``lost`` when nvidia-smi named the GPU only in a diagnostic line, ``unusable`` when
            a field reads a fault or the compute mode is Prohibited, ``excluded`` by the daemon.
        state_reason: the tool's words for a state other than ``ok``.
        compute_mode: nvidia-smi ``compute_mode`` (``Default``, ``Exclusive_Process``,
            ``Prohibited``); None if unknown (treated as Default).
        processes_known: False when the process list could not be read for this device:
            then it is busy unless ``memory_used_bytes`` <= :data:`UNKNOWN_PROCESSES_IDLE_MAX_BYTES`.
        memory_approximate: ``memory_total_bytes`` is an estimate, not a figure a tool gave:
            the Apple GPU's schedulable memory (Metal's recommended working set, see
            :mod:`gpulayerd.gpu.apple`).
    """

    accelerator: Accelerator
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_kind: MemoryKind | None = None
    compute_capability: tuple[int, int] | None = None
    driver_version: str | None = None
    execution_supported: bool = False
    float64: bool | None = None
    granted_to: str | None = None
    foreign_pids: tuple[int, ...] = ()
    kind: DeviceKind = DeviceKind.GPU
    parent_uuid: str | None = None
    mig_profile: str | None = None
    mig_enabled: bool | None = None
    pci_bus_id: str | None = None
    state: DeviceState = DeviceState.OK
    state_reason: str = ""
    processes_known: bool = True
    memory_approximate: bool = False
    compute_mode: str | None = None

    @property
    def busy(self) -> bool:
        """True if the device is granted to a job, used by a foreign process, or in use by processes
        nobody can name (:attr:`unknown_use`)."""
        return self.granted_to is not None or bool(self.foreign_pids) or self.unknown_use

    @property
    def unknown_use(self) -> bool:
        """True if memory is in use that no listed process accounts for: the process list is unknown
        and ``memory.used`` is unknown or above :data:`UNKNOWN_PROCESSES_IDLE_MAX_BYTES`; or (a GPU with
        dedicated memory) no process is listed while ``memory.used`` is above it (:attr:`hidden_use`). In an
        exclusive compute mode (:data:`EXCLUSIVE_COMPUTE_MODES`) an unknown process list is always use."""
        used = self.memory_used_bytes
        if not self.processes_known:
            # In an exclusive compute mode even a small unseen process takes the whole GPU.
            return (used is None or used > UNKNOWN_PROCESSES_IDLE_MAX_BYTES
                    or self.compute_mode in EXCLUSIVE_COMPUTE_MODES)
        return self.hidden_use

    @property
    def hidden_use(self) -> bool:
        """True if nvidia-smi lists no process on this dedicated-memory GPU while its ``memory.used``
        is above :data:`UNKNOWN_PROCESSES_IDLE_MAX_BYTES`: processes it cannot show use it (another
        container's PID namespace). Unified-memory parts report system RAM there, so never them."""
        used = self.memory_used_bytes
        return (self.processes_known and not self.foreign_pids and self.accelerator is Accelerator.CUDA
                and self.memory_kind is MemoryKind.DEDICATED and used is not None
                and used > UNKNOWN_PROCESSES_IDLE_MAX_BYTES)

    @property
    def sort_key(self) -> tuple[str, int]:
        """Deterministic order of devices: uuid, then index."""
        return (self.uuid or "", self.index)


@dataclass(frozen=True, slots=True)
class FrameworkVersion:
    """One framework as found in an environment's package metadata.

    Attributes:
        name: the framework's canonical name (``tensorflow``), not the distribution.
        version: the version string exactly as in the metadata; None when unknown (a
            ``*.dist-info`` without METADATA: ``note`` says why), never the string "None".
        distribution: which distribution supplied it (``tensorflow-macos``): the one whose
            RECORD hashes match the import package's files on disk when several claim them.
        valid: whether ``version`` is a valid PEP 440 version (True when it is None).
        others: the other distributions that claim the same framework, as ``"name version"``;
            non-empty means a conflict (``onnxruntime`` next to ``onnxruntime-gpu``).
        note: why the version is unknown, or how the distribution was chosen; "" if nothing to say.
    """

    name: str
    version: str | None
    distribution: str
    valid: bool = True
    others: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True, slots=True)
class EnvironmentSnapshot:
    """One workload interpreter and what it can run.

    Attributes:
        interpreter: absolute path of the python executable.
        python_version: ``platform.python_version()`` of it; None if unknown.
        frameworks: canonical framework name -> what is installed.
        torch_cuda: ``torch.cuda.is_available()``; None if torch is absent or unknown.
        torch_mps: ``torch.backends.mps.is_available()``; None if torch is absent or unknown.
        distributed_backends: torch.distributed backends available (gloo, nccl, mpi);
            None if unknown.
        ok: False if the probe of this interpreter failed (then most fields are None).
        notes: human-readable notes (unknown values, conflicts, errors).
        cuda_builds: what the frameworks were built for, CUDA version by source (``torch`` ->
            ``"12.4"`` from torch/version.py; ``cupy``/``jax``/``nvidia-libs`` -> the major,
            ``"12"``, from distribution names); ``torch`` -> ``""`` is a torch built without
            CUDA; a source that is absent is unknown (:mod:`gpulayerd.gpu.cuda_build`).
        machine: the interpreter's ``platform.machine()`` (``arm64``, ``x86_64``); None if unknown.
        translated: ``sysctl.proc_translated`` of the interpreter on macOS: True for an x86_64
            interpreter run by Rosetta on Apple silicon (it never gets ``mps``); None off macOS
            or unknown.
        mps_recommended_max_bytes: ``torch.mps.recommended_max_memory()`` in bytes (Metal's
            recommendedMaxWorkingSetSize), None when torch did not say.
        torch_pending: True while the import-based torch check has not reported yet (the
            daemon answers from package metadata first): ``torch_cuda``, ``torch_mps``,
            ``distributed_backends`` and ``mps_recommended_max_bytes`` are then unknown, and a
            requirement on them is not satisfied until the check lands.
        import_errors: framework -> the decisive line of its import failure, as the probe saw it
            (``"ImportError: .../libtorch_cuda.so: undefined symbol: __nvJitLinkComplete_12_4"``):
            a job naming that framework is rejected here with it, CPU jobs included.
        configured: the interpreter as configured when it is not ``interpreter`` itself (a pyenv,
            asdf or mise shim, a launcher script, resolved once to the interpreter it starts);
            None when they are the same.
        launcher: what ``configured`` is (``"pyenv shim"``); "" when None.
        activation: a conda environment's activation, variable -> value (``CONDA_PREFIX``,
            ``CONDA_DEFAULT_ENV``, what ``etc/conda/activate.d`` exports): jobs and probes run with
            it and the prefix's ``bin`` first on PATH; empty for other interpreters.
    """

    interpreter: str
    python_version: str | None = None
    frameworks: Mapping[str, FrameworkVersion] = field(default_factory=dict)
    torch_cuda: bool | None = None
    torch_mps: bool | None = None
    distributed_backends: tuple[str, ...] | None = None
    ok: bool = True
    notes: tuple[str, ...] = ()
    cuda_builds: Mapping[str, str] = field(default_factory=dict)
    machine: str | None = None
    translated: bool | None = None
    mps_recommended_max_bytes: int | None = None
    torch_pending: bool = False
    import_errors: Mapping[str, str] = field(default_factory=dict)
    configured: str | None = None
    launcher: str = ""
    activation: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """Everything the matcher knows about one worker (a machine running gpulayerd).

    Attributes:
        node_id: the worker's stable id; ties between workers break on it.
        name: a human name (host name).
        online: False if the worker is known but not reachable now.
        devices: accelerator devices, any order (the matcher sorts).
        environments: workload interpreters, in preference order.
        cpu_count: logical CPUs; None if unknown.
        memory_total_bytes: system RAM in bytes; None if unknown.
        health: one entry per probe source.
        existing_paths: paths known to exist on the worker (for ``workdir``);
            None means the worker has not said, which matching treats as unchecked.
        denied_paths: (user, path) pairs of a directory that exists but that user cannot
            enter (checked as the user): a workdir among them is rejected for that user's jobs.
        unanswered_paths: paths whose check did not answer within ``path_timeout_s``
            seconds (a hung network mount): a workdir among them cannot be used now.
        path_timeout_s: the time limit of one path check, seconds.
        cpu_slots_total: CPU processes the worker runs at once; None = no limit.
        cpu_slots_free: of those, how many are free now; None = no limit.
        mode: ``personal`` (runs only ``user``'s jobs) or ``system`` (runs each job as its user).
        user: a personal-mode worker's account; "" in system mode.
        allow_root_jobs: a system-mode worker runs jobs of root.
        missing_accounts: user names this worker was asked to run and has no account for.
        max_gpus_per_user: the most GPUs of this worker one user may hold; None = no cap.
        gpus_held_by_user: user name -> GPUs of this worker that user's jobs hold now.
        os: ``linux`` or ``darwin`` (``platform.system()`` lower-cased); None if unknown.
        driver_cuda: the newest CUDA the NVIDIA driver supports (nvidia-smi's ``CUDA Version``
            or the driver table of :mod:`gpulayerd.core.matching.cuda_compat`); None if unknown.
        kind: ``host`` (a workstation) or ``slurm`` (a worker backed by a Slurm cluster).
        slurm_partitions: a Slurm worker's partitions (shown in explanations).
        slurm_overflow_after_s: a Slurm worker's ``prefer``: None for ``last`` (it gets what fits no
            workstation now), else ``overflow-after``'s seconds (:mod:`gpulayerd.core.matching.targeting`).
        slurm_refused: user -> Slurm's words, for the users whose jobs Slurm refused lately (sbatch:
            no account or association, a partition's AllowGroups): their jobs are not run there for a while.
        slurm_pending: Slurm's reasons (``Priority``, ``Resources``) for the gpulayer jobs it holds pending
            on this worker now (explanations: what its busy slots wait for).
    """

    node_id: str
    name: str = ""
    online: bool = True
    devices: tuple[DeviceSnapshot, ...] = ()
    environments: tuple[EnvironmentSnapshot, ...] = ()
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    health: tuple[ProbeHealth, ...] = ()
    existing_paths: frozenset[str] | None = None
    denied_paths: frozenset[tuple[str, str]] = frozenset()
    unanswered_paths: frozenset[str] = frozenset()
    path_timeout_s: float = 0.0
    cpu_slots_total: int | None = None
    cpu_slots_free: int | None = None
    mode: str = "personal"
    user: str = ""
    allow_root_jobs: bool = False
    missing_accounts: frozenset[str] = frozenset()
    max_gpus_per_user: int | None = None
    gpus_held_by_user: Mapping[str, int] = field(default_factory=dict)
    os: str | None = None
    driver_cuda: str | None = None
    kind: str = "host"
    slurm_partitions: tuple[str, ...] = ()
    slurm_overflow_after_s: float | None = None
    slurm_refused: Mapping[str, str] = field(default_factory=dict)
    slurm_pending: tuple[str, ...] = ()

    def with_identity(self, mode: str, user: str) -> WorkerSnapshot:
        """This snapshot with ``mode`` and ``user`` as the worker's certificate proves them (what a
        worker says of itself in its capabilities is not taken for whose jobs it may run)."""
        return replace(self, mode=mode, user=user)


@dataclass(frozen=True, slots=True)
class DistributedRequest:
    """``[distributed]`` of a job: torch.distributed shape.

    Attributes:
        nnodes: number of hosts.
        nproc_per_node: processes per host.
        backend: ``gloo`` or ``nccl``.
    """

    nnodes: int = 1
    nproc_per_node: int = 1
    backend: str = "gloo"


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a job needs, in the core's terms (from ``JobSpec.to_core()``).

    Attributes:
        job_id: the job's id (any string; used only in messages).
        accelerator: the accelerator wanted.
        gpu_count: devices wanted per host (0 for CPU jobs).
        gpu_memory_bytes: minimum total memory per device in bytes; None = any.
        gpu_memory_kind: dedicated or unified; None = any.
        min_cuda_compute_capability: minimum (major, minor); None = any.
        frameworks: canonical framework name -> PEP 440 specifier string.
        python: PEP 440 specifier for the interpreter's version; None = any.
        requires_float64: the job computes in float64 on the device.
        distributed: torch.distributed shape, None for a plain job.
        workdir: the directory the job runs in; must exist on the worker.
        user: the account the job runs as ("" = not known: a job from before users).
        min_driver_version: the oldest NVIDIA driver accepted (``"535.54.03"``); None = any.
        cuda_runtime: PEP 440 specifier on the environment's torch CUDA build (``">=12.1"``).
        os: ``linux`` or ``darwin``; None = any.
        worker: the name of the one worker it may run on (``--worker``); "" = any.
        slurm: whether a Slurm worker may run it (False: ``--no-slurm``).
        waited_s: how long it has waited since its submit, as far as a Slurm worker's ``[slurm] prefer =
            "overflow-after = D"`` reads it: the largest such D its wait passed (the scheduler moves it there:
            :func:`gpulayerd.core.scheduling.judging.overflow_waits`; identical jobs keep one shape until then).
    """

    job_id: str = ""
    accelerator: Accelerator = Accelerator.CPU
    gpu_count: int = 0
    gpu_memory_bytes: int | None = None
    gpu_memory_kind: MemoryKind | None = None
    min_cuda_compute_capability: tuple[int, int] | None = None
    frameworks: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None
    requires_float64: bool = False
    distributed: DistributedRequest | None = None
    workdir: str | None = None
    user: str = ""
    min_driver_version: str | None = None
    cuda_runtime: str | None = None
    os: str | None = None
    worker: str = ""
    slurm: bool = True
    waited_s: float = 0.0
