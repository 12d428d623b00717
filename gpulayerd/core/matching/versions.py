"""PEP 440 version checks for the matcher (pure; wraps ``packaging``).

``packaging`` is pure computation, so the core may use it. Behaviour pinned by tests:
local versions follow PEP 440 ("2.1.0+cu121" satisfies "==2.1.0" and ">=2.1" but not
">2.1.0"); an installed pre-release counts if it is in range ("2.6.0.dev2024"
satisfies ">=2.5"); a version that is not PEP 440 never satisfies anything.
"""

from __future__ import annotations

import enum
from functools import lru_cache

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["VersionCheck", "check_version", "is_valid_version"]


class VersionCheck(str, enum.Enum):
    """Outcome of comparing an installed version with a specifier."""

    OK = "ok"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"
    INVALID = "invalid"


@lru_cache(maxsize=4096)
def _specifier(spec: str) -> SpecifierSet | None:
    try:
        return SpecifierSet(spec, prereleases=True)
    except InvalidSpecifier:
        return None


@lru_cache(maxsize=4096)
def _version(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def is_valid_version(version: str) -> bool:
    """True if ``version`` is a valid PEP 440 version string."""
    return _version(version) is not None


@lru_cache(maxsize=65536)
def check_version(version: str | None, spec: str) -> VersionCheck:
    """Compare an installed ``version`` with a PEP 440 ``spec``.

    Args:
        version: as read from metadata; None when unknown.
        spec: a specifier set such as ">=2.4,<3" (already validated at submit).

    Returns:
        UNKNOWN for None, INVALID for a non-PEP 440 version (or an invalid spec),
        OK or MISMATCH otherwise. Never raises.
    """
    if version is None:
        return VersionCheck.UNKNOWN
    v = _version(version)
    s = _specifier(spec)
    if v is None or s is None:
        return VersionCheck.INVALID
    return VersionCheck.OK if s.contains(v, prereleases=True) else VersionCheck.MISMATCH
