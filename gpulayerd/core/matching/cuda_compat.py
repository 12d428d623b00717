"""Which CUDA builds an NVIDIA driver can run: NVIDIA's published minimum driver versions, as data.

Source: NVIDIA, *CUDA Toolkit Release Notes*, "CUDA Driver" section: Table 2 ("CUDA Toolkit
and Minimum Required Driver Version for CUDA Minor Version Compatibility") and Table 3
("CUDA Toolkit and Corresponding Driver Versions", the driver each toolkit release ships
with); and *CUDA Compatibility* (docs.nvidia.com/deploy/cuda-compatibility), sections
"Minor Version Compatibility" and "Forward Compatibility". Linux x86_64 driver versions.

Rules used here:

- Minor-version compatibility: an application built with any CUDA ``M.x`` runs on a driver
  at or above the minimum of major ``M`` (11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >=
  580.65.06), as long as it needs no PTX JIT of code newer than the driver (not checked:
  torch, cupy and jax wheels ship SASS for the usual GPUs).
- Datacenter drivers with the ``cuda-compat`` package (forward compatibility) can run newer
  CUDA than these minimums allow; gpulayer cannot see that package, so such a worker is
  judged by its driver alone (an admin pins it with a profile or ``min_driver_version``).
- The driver's own CUDA version (nvidia-smi's header ``CUDA Version: 12.4``) is the newest
  toolkit whose Table 3 driver it reaches: :func:`driver_cuda_version`.

Pure: no I/O. Versions are compared as tuples of integers (``"525.60.13"`` -> (525, 60, 13)).
"""

from __future__ import annotations

import enum
import re
from functools import lru_cache

__all__ = [
    "MINOR_COMPAT_MINIMUM",
    "TOOLKIT_DRIVERS",
    "Compat",
    "cuda_major",
    "driver_cuda_version",
    "driver_supports",
    "minimum_driver",
    "parse_driver_version",
]

MINOR_COMPAT_MINIMUM: dict[int, str] = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580.65.06",
}
"""CUDA major -> the minimum Linux driver of minor-version compatibility (Table 2)."""

TOOLKIT_DRIVERS: tuple[tuple[str, str], ...] = (
    ("10.0", "410.48"),
    ("10.1", "418.39"),
    ("10.2", "440.33"),
    ("11.0", "450.36.06"),
    ("11.1", "455.23"),
    ("11.2", "460.27.03"),
    ("11.3", "465.19.01"),
    ("11.4", "470.42.01"),
    ("11.5", "495.29.05"),
    ("11.6", "510.39.01"),
    ("11.7", "515.43.04"),
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
)
"""(CUDA toolkit, the Linux driver it ships with), oldest first (Table 3)."""

_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$")


class Compat(str, enum.Enum):
    """Whether a driver runs a CUDA build."""

    OK = "ok"
    TOO_OLD = "too_old"
    UNKNOWN = "unknown"


@lru_cache(maxsize=4096)  # read for every environment of every worker a job is judged against
def parse_driver_version(text: str | None) -> tuple[int, ...] | None:
    """``"525.60.13"`` -> ``(525, 60, 13)``; None for None, placeholders or anything else."""
    if not text:
        return None
    m = _VERSION.match(text)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def cuda_major(build: str | None) -> int | None:
    """The major of a CUDA version (``"12.4"`` -> 12, ``"12"`` -> 12); None if not one."""
    v = parse_driver_version(build)
    return None if v is None else v[0]


def minimum_driver(build: str) -> str | None:
    """The minimum driver that runs a ``build`` (``"12.4"`` or ``"12"``) under minor-version
    compatibility; for a major outside :data:`MINOR_COMPAT_MINIMUM` (10.x and older), the
    driver of that exact toolkit. None when not known."""
    major = cuda_major(build)
    if major is None:
        return None
    if major in MINOR_COMPAT_MINIMUM:
        return MINOR_COMPAT_MINIMUM[major]
    v = parse_driver_version(build)
    exact = [d for t, d in TOOLKIT_DRIVERS if parse_driver_version(t) == v]
    return exact[0] if exact else None


@lru_cache(maxsize=4096)
def driver_supports(build: str | None, driver: str | None, driver_cuda: str | None = None) -> Compat:
    """Does ``driver`` (e.g. ``"470.82.01"``) run code built for CUDA ``build`` (``"12.4"``)?

    ``driver_cuda`` (nvidia-smi's ``CUDA Version``) decides when the driver version is not
    known: a build of the same or an older major runs (minor-version compatibility).

    Returns:
        OK, TOO_OLD, or UNKNOWN when either side is unknown.
    """
    major = cuda_major(build)
    if major is None or not build:
        return Compat.UNKNOWN
    have = parse_driver_version(driver)
    if have is None:
        host_major = cuda_major(driver_cuda)
        if host_major is None:
            return Compat.UNKNOWN
        return Compat.OK if major <= host_major else Compat.TOO_OLD
    need_text = minimum_driver(build)
    need = parse_driver_version(need_text)
    if need is None:
        return Compat.UNKNOWN
    return Compat.OK if have >= need else Compat.TOO_OLD


def driver_cuda_version(driver: str | None) -> str | None:
    """The newest CUDA toolkit whose shipped driver ``driver`` reaches (Table 3), e.g.
    ``"550.54.15"`` -> ``"12.4"``; None when unknown or older than every row."""
    have = parse_driver_version(driver)
    if have is None:
        return None
    best = None
    for toolkit, d in TOOLKIT_DRIVERS:
        need = parse_driver_version(d)
        if need is not None and have >= need:
            best = toolkit
    return best
