"""The value types of a matching verdict: rejections, checks, placements and explanations.

Plain frozen values, produced by :mod:`gpulayerd.core.matching.evaluate` and the requirement checks in
:mod:`gpulayerd.core.matching.requirements`. Rejections are values, never exceptions; their messages read
well alone ("GPU 1 has 16.0 GB < 24 GB required").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpulayerd.core.types import Accelerator

__all__ = [
    "BUSY_CODES",
    "Check",
    "Explanation",
    "FitState",
    "Placement",
    "Rejection",
    "RejectionCode",
    "Verdict",
    "WorkerExplanation",
]


class RejectionCode(str, enum.Enum):
    """Why a requirement is not met."""

    UNSUPPORTED_ACCELERATOR = "UNSUPPORTED_ACCELERATOR"
    DISTRIBUTED_UNSUPPORTED = "DISTRIBUTED_UNSUPPORTED"
    BACKEND_MISMATCH = "BACKEND_MISMATCH"
    ACCELERATOR_MISMATCH = "ACCELERATOR_MISMATCH"
    EXECUTION_UNSUPPORTED = "EXECUTION_UNSUPPORTED"
    PROBE_UNHEALTHY = "PROBE_UNHEALTHY"
    NOT_ENOUGH_DEVICES = "NOT_ENOUGH_DEVICES"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
    MEMORY_KIND_MISMATCH = "MEMORY_KIND_MISMATCH"
    COMPUTE_CAPABILITY_TOO_LOW = "COMPUTE_CAPABILITY_TOO_LOW"
    FLOAT64_UNSUPPORTED = "FLOAT64_UNSUPPORTED"
    UNKNOWN_METRIC = "UNKNOWN_METRIC"
    ENVIRONMENT_BROKEN = "ENVIRONMENT_BROKEN"
    PYTHON_VERSION = "PYTHON_VERSION"
    FRAMEWORK_MISSING = "FRAMEWORK_MISSING"
    FRAMEWORK_VERSION = "FRAMEWORK_VERSION"
    INVALID_VERSION = "INVALID_VERSION"
    TORCH_BACKEND_UNAVAILABLE = "TORCH_BACKEND_UNAVAILABLE"
    WORKDIR_MISSING = "WORKDIR_MISSING"
    WORKDIR_UNANSWERED = "WORKDIR_UNANSWERED"
    WORKDIR_DENIED = "WORKDIR_DENIED"
    RESERVED = "RESERVED"
    FOREIGN_PROCESS = "FOREIGN_PROCESS"
    WORKER_OFFLINE = "WORKER_OFFLINE"
    NO_ACCOUNT = "NO_ACCOUNT"
    OTHER_USERS_WORKER = "OTHER_USERS_WORKER"
    ROOT_JOBS_NOT_ALLOWED = "ROOT_JOBS_NOT_ALLOWED"
    USER_NOT_VOUCHED = "USER_NOT_VOUCHED"
    USER_GPU_CAP = "USER_GPU_CAP"
    FAIR_SHARE = "FAIR_SHARE"
    OS_MISMATCH = "OS_MISMATCH"
    DRIVER_TOO_OLD = "DRIVER_TOO_OLD"
    CUDA_RUNTIME_MISMATCH = "CUDA_RUNTIME_MISMATCH"
    CUDA_DRIVER_INCOMPATIBLE = "CUDA_DRIVER_INCOMPATIBLE"
    WORKER_TARGET = "WORKER_TARGET"
    SLURM_LAST = "SLURM_LAST"
    SLURM_REFUSED = "SLURM_REFUSED"


BUSY_CODES = frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS, RejectionCode.USER_GPU_CAP,
                        RejectionCode.FAIR_SHARE})
"""Codes that mean "fits, but not now"."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One requirement a worker does not meet.

    Attributes:
        code: why.
        requirement: the job-spec field, e.g. ``gpu_memory_gb`` or ``frameworks.torch``.
        wanted: what the job asks for, as text.
        found: what the worker has, as text ("unknown" when not known).
        worker: node id ("" for job-level validation).
        device: device index, when the rejection is about one device.
        environment: interpreter path, when it is about one environment.
        message: one self-contained sentence for people.
    """

    code: RejectionCode
    requirement: str
    wanted: str
    found: str
    worker: str
    message: str
    device: int | None = None
    environment: str | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: a worker, one of its environments and the granted devices.

    Attributes:
        worker: node id.
        environment: interpreter path used for ``python`` commands.
        device_indices: granted device indices (nvidia-smi order), ascending; empty for CPU.
        device_uuids: the same devices' uuids, in the same order.
        accelerator: the accelerator of the devices (cpu for CPU jobs).
    """

    worker: str
    environment: str
    device_indices: tuple[int, ...]
    device_uuids: tuple[str | None, ...]
    accelerator: Accelerator


class FitState(str, enum.Enum):
    """How one worker relates to one job."""

    FITS_NOW = "fits_now"
    FITS_BUT_BUSY = "fits_but_busy"
    FITS_OFFLINE = "fits_offline"
    NO_FIT = "no_fit"


class Verdict(str, enum.Enum):
    """The overall answer of :func:`~gpulayerd.core.matching.evaluate.explain`, best state over all workers."""

    FITS_NOW = "fits now"
    FITS_BUT_BUSY = "fits but busy"
    FITS_ONLY_OFFLINE = "fits only an offline worker"
    FITS_NOWHERE = "fits nowhere we know"


@dataclass(frozen=True, slots=True)
class Check:
    """One cell row of the worker x requirement table.

    Attributes:
        requirement: job-spec field name.
        wanted: what the job asks for.
        found: what the worker has (per device where it matters).
        ok: True met, False not met, None not checked here (e.g. workdir, checked at claim).
    """

    requirement: str
    wanted: str
    found: str
    ok: bool | None


@dataclass(frozen=True, slots=True)
class WorkerExplanation:
    """One worker's row group in an explanation (``slurm``: a worker backed by a Slurm cluster, with its
    ``partitions`` and the reasons Slurm gives for the gpulayer jobs it holds pending there now: ``pending``)."""

    worker: str
    name: str
    online: bool
    state: FitState
    checks: tuple[Check, ...]
    rejections: tuple[Rejection, ...]
    placement: Placement | None
    slurm: bool = False
    partitions: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer of :func:`~gpulayerd.core.matching.evaluate.explain`.

    Attributes:
        job_id: the job.
        verdict: the four-way verdict.
        placement: the best placement now (lowest node id among workers that fit now);
            None unless the verdict is "fits now".
        rejections: job-level rejections from :func:`validate` (then ``workers`` is empty).
        workers: one entry per worker, ordered by node id.
        hosts_needed: workers the job needs at once (``nnodes`` of a multi-host job).
    """

    job_id: str
    verdict: Verdict
    placement: Placement | None
    rejections: tuple[Rejection, ...]
    workers: tuple[WorkerExplanation, ...]
    hosts_needed: int = 1

    @property
    def summary(self) -> str:
        """One line for a job list: the verdict and the first reason."""
        if self.rejections:
            return f"rejected: {self.rejections[0].message}"
        if self.verdict is Verdict.FITS_NOW:
            return "fits now" if self.hosts_needed == 1 else f"fits now on {self.hosts_needed} hosts"
        if not self.workers:
            return "no worker known"
        if self.hosts_needed > 1:
            now = sum(1 for w in self.workers if w.state is FitState.FITS_NOW)
            return f"{self.verdict.value}: needs {self.hosts_needed} hosts at once, {now} fit now"
        reasons = [r.message for w in self.workers for r in w.rejections]
        return f"{self.verdict.value}: {reasons[0]}" if reasons else self.verdict.value
