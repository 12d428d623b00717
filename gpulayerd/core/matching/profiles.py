"""Runtime profiles: named bundles of requirements (frameworks, python, cuda_runtime,
min_driver_version, os), expanded into a job's requirements at submit, and checked against
every worker environment for ``gpulayer profiles``.

A profile is a convenience, never a promise: workers are still checked against the job's
requirements, and the implicit driver/CUDA-build compatibility of every CUDA job still applies.
Files and their places: :mod:`gpulayerd.host.profile_files`. Pure: no I/O.


(Same name as :mod:`gpulayerd.cli.profiles`: the same idea (runtime profiles), the pure rules here
and the command there.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpulayerd.core.matching.requirements import choose_environment
from gpulayerd.core.matching.runtime_checks import check_host
from gpulayerd.core.types import Accelerator, EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Check, Rejection

__all__ = [
    "PROFILE_ITEMS",
    "CellResult",
    "Profile",
    "UnknownProfile",
    "check_profile",
    "expand_profile",
    "profile_job",
]

PROFILE_ITEMS: tuple[str, ...] = ("frameworks", "python", "cuda_runtime", "min_driver_version", "os")
"""The requirement fields a profile may set."""

_CUDA_ONLY = ("cuda_runtime", "min_driver_version")


class UnknownProfile(LookupError):
    """A job names a profile that no profile file defines.

    Attributes:
        name: the name asked for.
        known: every defined profile name, sorted.
    """

    def __init__(self, name: str, known: list[str]) -> None:
        """Build the message ``unknown profile 'x'; known profiles: a, b``."""
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown profile {name!r}; known profiles: {', '.join(self.known) or 'none'}")


@dataclass(frozen=True, slots=True)
class Profile:
    """One named bundle of requirements.

    Attributes:
        name: e.g. ``torch-2.4-cu124``.
        description: one line for people.
        frameworks: canonical framework name -> PEP 440 specifier.
        python: PEP 440 specifier for the interpreter, or None.
        cuda_runtime: PEP 440 specifier on torch's CUDA build, or None.
        min_driver_version: the oldest NVIDIA driver, or None.
        os: ``linux`` or ``darwin``, or None.
        source: where it was defined (a file path, or ``shipped``).
    """

    name: str
    description: str = ""
    frameworks: Mapping[str, str] = field(default_factory=dict)
    python: str | None = None
    cuda_runtime: str | None = None
    min_driver_version: str | None = None
    os: str | None = None
    source: str = ""

    def items(self) -> dict[str, str]:
        """The requirements as ``{"frameworks.torch": "==2.4.*", "python": ">=3.9", ...}``."""
        out = {f"frameworks.{k}": v for k, v in sorted(self.frameworks.items())}
        for key in PROFILE_ITEMS[1:]:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @property
    def wants_cuda(self) -> bool:
        """True when the profile pins CUDA items (``cuda_runtime``, ``min_driver_version``)."""
        return self.cuda_runtime is not None or self.min_driver_version is not None


def expand_profile(
    spec: Mapping[str, Any], profiles: Mapping[str, Profile]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Expand ``spec["profile"]`` (a raw job spec mapping) into its ``requirements``.

    Each profile item the job does not set is added, with origin ``from profile NAME``; an item
    the job sets itself wins, with origin ``job (profile NAME says V)``. ``cuda_runtime`` and
    ``min_driver_version`` apply to CUDA jobs only: for another accelerator they are left out,
    with origin ``not applied: not a CUDA job (profile NAME says V)``.

    Returns:
        ``(spec, origins)``: a new mapping whose ``requirement_origins`` is ``origins``
        (requirement -> origin); ``spec`` itself unchanged when it names no profile.

    Raises:
        UnknownProfile: no profile of that name (the error lists the known ones).
    """
    name = spec.get("profile")
    if not name:
        return dict(spec), {}
    profile = profiles.get(str(name))
    if profile is None:
        raise UnknownProfile(str(name), list(profiles))
    out = dict(spec)
    req_in = out.get("requirements")
    req: dict[str, Any] = dict(req_in) if isinstance(req_in, Mapping) else {}
    frameworks_in = req.get("frameworks")
    frameworks: dict[str, Any] = dict(frameworks_in) if isinstance(frameworks_in, Mapping) else {}
    accel = str(req.get("accelerator", "cpu")).lower()
    origins: dict[str, str] = {}
    tag = f"profile {profile.name}"
    for fw, value in sorted(profile.frameworks.items()):
        key = f"frameworks.{fw}"
        if fw in frameworks:
            origins[key] = f"job ({tag} says {value})"
        else:
            frameworks[fw] = value
            origins[key] = f"from {tag}"
    if frameworks:
        req["frameworks"] = frameworks
    for key in PROFILE_ITEMS[1:]:
        value = getattr(profile, key)
        if value is None:
            continue
        if req.get(key) is not None:
            origins[key] = f"job ({tag} says {value})"
        elif key in _CUDA_ONLY and accel != Accelerator.CUDA.value:
            origins[key] = f"not applied: not a CUDA job ({tag} says {value})"
        else:
            req[key] = value
            origins[key] = f"from {tag}"
    out["requirements"] = req
    out["requirement_origins"] = origins
    return out, origins


def profile_job(profile: Profile) -> JobRequest:
    """The job a profile stands for in the matrix: its items, on CUDA when it pins CUDA items."""
    return JobRequest(
        job_id=f"profile:{profile.name}",
        accelerator=Accelerator.CUDA if profile.wants_cuda else Accelerator.CPU,
        gpu_count=1 if profile.wants_cuda else 0,
        frameworks=dict(profile.frameworks),
        python=profile.python,
        min_driver_version=profile.min_driver_version,
        cuda_runtime=profile.cuda_runtime,
        os=profile.os,
    )


@dataclass(frozen=True, slots=True)
class CellResult:
    """One cell of the profile x environment matrix.

    Attributes:
        profile: the profile's name.
        worker: the worker's node id; ``name`` its host name.
        environment: the interpreter.
        ok: True when every item is met.
        failures: the rejections of the items not met (``requirement``, ``wanted``, ``found``).
        notes: rows that could not be checked (``ok`` None), e.g. driver compatibility unknown.
    """

    profile: str
    worker: str
    name: str
    environment: str
    ok: bool
    failures: tuple[Rejection, ...]
    notes: tuple[Check, ...] = ()


def check_profile(profile: Profile, worker: WorkerSnapshot, env: EnvironmentSnapshot) -> CellResult:
    """Check one profile against one environment of ``worker`` (its items and, for a CUDA
    profile, the driver/CUDA-build compatibility); devices, users and workdir are not checked."""
    job = profile_job(profile)
    one = replace(worker, environments=(env,))
    checks: list[Check] = []
    _, env_rejs = choose_environment(job, one, checks)
    # torch.cuda availability is a device question: the matrix is about the software stack.
    failures = [r for r in env_rejs if r.requirement != "torch.cuda"]
    failures.extend(check_host(job, one, checks))
    notes = tuple(c for c in checks if c.ok is None)
    return CellResult(profile.name, worker.node_id, worker.name or worker.node_id, env.interpreter,
                      not failures, tuple(failures), notes)
