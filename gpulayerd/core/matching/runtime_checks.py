"""Runtime requirements of matching: ``os``, ``min_driver_version``, ``cuda_runtime``, and the
implicit driver/CUDA-build compatibility of every CUDA job.

Like :mod:`gpulayerd.core.matching.requirements`, each check appends rows of the worker x requirement
table and returns :class:`~gpulayerd.core.verdict.Rejection` values whose ``requirement``,
``wanted`` and ``found`` say which item failed with what values (``cuda_compat``: wanted
``driver >= 525.60.13``, found ``470.82.01``), so a hint generator can read them.

Compatibility (``cuda_compat``) follows :mod:`gpulayerd.core.matching.cuda_compat`: every CUDA build the
environment reports (torch's exact build, the CUDA major of cupy, jax or the nvidia-* libraries)
must run on the worker's driver. When either side is unknown it adds a row with ``ok`` None (a
note), never a rejection; an explicit ``cuda_runtime`` against an unknown build is not met. A
torch known to be a CPU-only build has no CUDA build to check: its row says so (``ok`` True when
no environment has a CUDA build; whether torch can use the GPU is the ``torch.cuda`` row's).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import re

from gpulayerd.core.matching.cuda_compat import (
    Compat,
    cuda_major,
    driver_cuda_version,
    driver_supports,
    minimum_driver,
    parse_driver_version,
)
from gpulayerd.core.matching.versions import VersionCheck, check_version
from gpulayerd.core.types import Accelerator, EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Check, Rejection, RejectionCode

__all__ = [
    "build_label",
    "check_host",
    "env_runtime_rejections",
    "env_runtime_rows",
    "torch_cuda_build",
    "worker_driver",
]

_NVIDIA_LIBS = "nvidia-libs"
_CU_TAG = re.compile(r"^cu(\d{3,4})$")


def worker_driver(worker: WorkerSnapshot) -> str | None:
    """The NVIDIA driver version of ``worker``'s CUDA devices (the newest if they differ)."""
    drivers = [d.driver_version for d in worker.devices
               if d.accelerator is Accelerator.CUDA and d.driver_version]
    return max(drivers, key=lambda v: parse_driver_version(v) or (0,), default=None)


def torch_cuda_build(env: EnvironmentSnapshot) -> str | None:
    """torch's CUDA build in ``env`` (``"12.4"``), ``""`` for a build without CUDA, None unknown.

    From :attr:`EnvironmentSnapshot.cuda_builds` (torch/version.py), else from the version's
    local tag (``2.4.1+cu124`` -> ``"12.4"``; ``+cpu`` and ``+rocm6.2`` -> ``""``), which conda and
    the PyTorch index's wheels carry and PyPI's default Linux wheels do not.
    """
    build = env.cuda_builds.get("torch")
    if build is not None:
        return build
    fw = env.frameworks.get("torch")
    version = (fw.version if fw is not None else None) or ""
    if "+" not in version:
        return None
    tag = version.rsplit("+", 1)[1].lower()
    m = _CU_TAG.match(tag)
    if m is not None:
        digits = m.group(1)
        return f"{int(digits[:-1])}.{digits[-1]}"
    return "" if tag == "cpu" or tag.startswith("rocm") else None


def build_label(env: EnvironmentSnapshot, source: str, build: str) -> str:
    """How a CUDA build reads in messages: ``torch 2.4.1+cu124``, ``cupy-cuda12x 13.3.0``,
    ``nvidia-* libraries (CUDA 12)``."""
    fw = env.frameworks.get(source)
    if source == "torch" and fw is not None and fw.version:
        tag = "" if "+" in fw.version else "+cu" + build.replace(".", "")
        return f"torch {fw.version}{tag}"
    if fw is not None:
        return f"{fw.distribution} {fw.version}"
    if source == _NVIDIA_LIBS:
        return f"nvidia-* libraries (CUDA {build})"
    return f"{source} (CUDA {build})"


def _builds(env: EnvironmentSnapshot) -> list[tuple[str, str]]:
    """The (source, build) pairs the compatibility check reads: every framework build, the
    nvidia-* libraries only when no framework says."""
    found = dict(env.cuda_builds)
    torch = torch_cuda_build(env)
    if torch is not None:
        found["torch"] = torch
    builds = sorted((s, b) for s, b in found.items() if b and s != _NVIDIA_LIBS)
    if not builds and env.cuda_builds.get(_NVIDIA_LIBS):
        builds = [(_NVIDIA_LIBS, env.cuda_builds[_NVIDIA_LIBS])]
    return builds


def _compat(env: EnvironmentSnapshot, worker: WorkerSnapshot) -> tuple[Compat, list[Rejection]]:
    """The worst compatibility of ``env``'s builds on ``worker``, and the rejections of the bad ones."""
    driver = worker_driver(worker)
    name = worker.name or worker.node_id
    builds = _builds(env)
    if not builds:
        return Compat.UNKNOWN, []
    rejs: list[Rejection] = []
    unknown = False
    for source, build in builds:
        result = driver_supports(build, driver, worker.driver_cuda)
        if result is Compat.UNKNOWN:
            unknown = True
        elif result is Compat.TOO_OLD:
            need = minimum_driver(build) or "?"
            driver_cuda = (driver_cuda_version(driver) if driver else None) or worker.driver_cuda
            have = (f"{driver} (CUDA {driver_cuda})" if driver and driver_cuda else driver
                    or f"a driver for CUDA {worker.driver_cuda}")
            rejs.append(Rejection(
                RejectionCode.CUDA_DRIVER_INCOMPATIBLE, "cuda_compat", f"driver >= {need}", driver or "unknown",
                worker.node_id,
                f"{build_label(env, source, build)} needs driver ≥ {need} (CUDA {cuda_major(build)}.x); "
                f"{name} has {have}",
                environment=env.interpreter,
            ))
    if rejs:
        return Compat.TOO_OLD, rejs
    return (Compat.UNKNOWN if unknown else Compat.OK), []


def env_runtime_rejections(job: JobRequest, env: EnvironmentSnapshot, worker: WorkerSnapshot) -> list[Rejection]:
    """``cuda_runtime`` and, for a CUDA job, driver compatibility of one working environment."""
    if not env.ok:
        return []
    out: list[Rejection] = []
    where = env.interpreter
    if job.cuda_runtime is not None:
        build = torch_cuda_build(env)
        spec = job.cuda_runtime
        if build is None:
            out.append(Rejection(
                RejectionCode.UNKNOWN_METRIC, "cuda_runtime", spec, "unknown", worker.node_id,
                f"torch's CUDA build in {where} is unknown, so cuda_runtime {spec} cannot be confirmed",
                environment=where,
            ))
        elif not build:
            out.append(Rejection(
                RejectionCode.CUDA_RUNTIME_MISMATCH, "cuda_runtime", spec, "none", worker.node_id,
                f"torch in {where} is built without CUDA; cuda_runtime {spec} required", environment=where,
            ))
        elif check_version(build, spec) is not VersionCheck.OK:
            out.append(Rejection(
                RejectionCode.CUDA_RUNTIME_MISMATCH, "cuda_runtime", spec, build, worker.node_id,
                f"torch in {where} is built for CUDA {build}, which does not satisfy cuda_runtime {spec}",
                environment=where,
            ))
    if job.accelerator is Accelerator.CUDA:
        out.extend(_compat(env, worker)[1])
    return out


def env_runtime_rows(job: JobRequest, worker: WorkerSnapshot, envs: tuple[EnvironmentSnapshot, ...]) -> list[Check]:
    """The table rows of :func:`env_runtime_rejections`: ``cuda_runtime`` (met if any environment
    meets it) and ``cuda_compat`` (ok None, a note, when no environment is known to run and
    either side is unknown)."""
    rows: list[Check] = []
    many = len(envs) > 1
    if job.cuda_runtime is not None:
        found, ok = [], False
        for e in envs:
            b = torch_cuda_build(e)
            text = "unknown" if b is None else (b or "none (no CUDA)")
            found.append(text + (f" ({e.interpreter})" if many else ""))
            ok = ok or (bool(b) and check_version(b, job.cuda_runtime) is VersionCheck.OK)
        rows.append(Check("cuda_runtime", job.cuda_runtime, "; ".join(found), ok))
    if job.accelerator is Accelerator.CUDA:
        driver = worker_driver(worker) or "unknown"
        results = [(_compat(e, worker)[0], e) for e in envs if e.ok]
        found = []
        states = set()
        for result, e in results:
            where = f" ({e.interpreter})" if many else ""
            if _cpu_only(e):  # known: no CUDA build to run, whatever the driver (torch.cuda says the rest)
                found.append(f"{_torch_label(e)} is a CPU-only build: no CUDA build to check{where}")
                continue
            states.add(result)
            builds = ", ".join(f"{s} {b}" for s, b in _builds(e)) or "CUDA build unknown"
            found.append(f"{builds} on driver {driver}: {result.value}{where}")
        compat_ok = True if Compat.OK in states or (results and not states) else (
            None if Compat.UNKNOWN in states or not states else False)
        rows.append(Check("cuda_compat", "driver runs the CUDA build", "; ".join(found) or "no environment", compat_ok))
    return rows


def _cpu_only(env: EnvironmentSnapshot) -> bool:
    """True when ``env``'s torch is known to be built without CUDA (``+cpu``, torch/version.py's
    ``cuda = None``) and no other framework or library reports a CUDA build."""
    return torch_cuda_build(env) == "" and not _builds(env) and not env.cuda_builds.get(_NVIDIA_LIBS)


def _torch_label(env: EnvironmentSnapshot) -> str:
    """``torch 2.13.0+cpu`` (or ``torch`` when its version is unknown)."""
    fw = env.frameworks.get("torch")
    return f"torch {fw.version}" if fw is not None and fw.version else "torch"


def check_host(job: JobRequest, worker: WorkerSnapshot, checks: list[Check]) -> list[Rejection]:
    """``os`` and ``min_driver_version`` of ``worker``: appends their rows, returns rejections."""
    out: list[Rejection] = []
    name = worker.name or worker.node_id
    if job.os is not None:
        have = worker.os
        checks.append(Check("os", job.os, have or "unknown", have == job.os))
        if have is None:
            out.append(Rejection(RejectionCode.UNKNOWN_METRIC, "os", job.os, "unknown", worker.node_id,
                                 f"the operating system of {name} is unknown, so {job.os} cannot be confirmed"))
        elif have != job.os:
            out.append(Rejection(RejectionCode.OS_MISMATCH, "os", job.os, have, worker.node_id,
                                 f"{name} runs {have}, {job.os} required"))
    if job.min_driver_version is not None:
        want = job.min_driver_version
        driver = worker_driver(worker)
        have_v = parse_driver_version(driver)
        need_v = parse_driver_version(want)
        ok = have_v is not None and need_v is not None and have_v >= need_v
        checks.append(Check("min_driver_version", f">= {want}", driver or "unknown", ok))
        if have_v is None:
            out.append(Rejection(RejectionCode.UNKNOWN_METRIC, "min_driver_version", f">= {want}", "unknown",
                                 worker.node_id, f"the NVIDIA driver version of {name} is unknown, "
                                 f"so >= {want} cannot be confirmed"))
        elif not ok:
            out.append(Rejection(RejectionCode.DRIVER_TOO_OLD, "min_driver_version", f">= {want}", str(driver),
                                 worker.node_id, f"{name} has NVIDIA driver {driver} < {want} required"))
    return out
