"""Which CUDA version an environment's frameworks were built for, read from files, never imported.

- torch: ``torch/version.py`` read as text (``cuda = '12.4'``, or ``cuda: Optional[str] = None``
  for a CPU or ROCm build). PyPI's default Linux wheels carry no ``+cu124`` tag in their version,
  so the tag is no source; this file is.
- cupy: the distribution name ``cupy-cuda12x`` (``cupy-cuda11x``, older ``cupy-cuda117``).
- jax: the plugin distribution ``jax-cuda12-plugin`` / ``jax-cuda12-pjrt`` (or ``jaxlib``'s
  local tag ``+cuda12``).
- nvidia-* libraries: ``nvidia-cublas-cu12`` and friends (pulled in by torch, jax, ...).

Distribution names come from the ``*.dist-info`` / ``*.egg-info`` directory names of the
directories the probe read package metadata from. Blocking (a directory listing, one small
file read): runs in the environment prober's thread.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping

from gpulayerd.core.types import EnvironmentSnapshot

__all__ = ["cuda_builds_in", "read_torch_cuda", "with_cuda_builds"]

_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:(None)|['"](\d+(?:\.\d+)*)['"])\s*$""", re.MULTILINE)
_DIST = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*?)-(?P<version>[^-]+?)\.(?:dist|egg)-info$")
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cupy", re.compile(r"^cupy[-_]cuda(\d{2})(?:\d|x)$")),
    ("jax", re.compile(r"^jax[-_]cuda(\d{2})[-_](?:plugin|pjrt)$")),
    ("nvidia-libs", re.compile(r"^nvidia[-_][a-z0-9_-]+[-_]cu(\d{2})$")),
)
_MAX_VERSION_PY = 64 * 1024


def read_torch_cuda(text: str) -> str | None:
    """The CUDA version in the text of ``torch/version.py``: ``"12.4"``, ``""`` for ``cuda = None``
    (a torch built without CUDA), None if the file says neither."""
    m = _TORCH_CUDA.search(text)
    if m is None:
        return None
    return "" if m.group(1) else m.group(2)


def cuda_builds_in(dirs: Iterable[str]) -> dict[str, str]:
    """Read the CUDA builds of the frameworks installed in ``dirs`` (site-packages and the rest
    of ``sys.path``, first match wins as for imports).

    Returns:
        Source -> CUDA version, as :attr:`EnvironmentSnapshot.cuda_builds` describes; a source
        not found is absent. Unreadable directories and files are skipped.
    """
    builds: dict[str, str] = {}
    for d in dirs:
        if "torch" not in builds:
            try:
                with open(os.path.join(d, "torch", "version.py"), encoding="utf-8", errors="replace") as f:
                    found = read_torch_cuda(f.read(_MAX_VERSION_PY))
                if found is not None:
                    builds["torch"] = found
            except OSError:
                pass
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for entry in names:
            m = _DIST.match(entry)
            if m is None:
                continue
            name = m.group("name").lower()
            for source, pattern in _PATTERNS:
                pm = pattern.match(name)
                if pm is not None and source not in builds:
                    builds[source] = str(int(pm.group(1)))
            if name == "jaxlib" and "jax" not in builds:
                local = re.search(r"\+cuda(\d{2})", m.group("version"))
                if local:
                    builds["jax"] = str(int(local.group(1)))
    return builds


def with_cuda_builds(
    snapshot: EnvironmentSnapshot, dirs: Mapping[str, object] | Iterable[str] | None
) -> EnvironmentSnapshot:
    """``snapshot`` with :attr:`~EnvironmentSnapshot.cuda_builds` read from ``dirs`` (the probe's
    metadata directories); unchanged when ``dirs`` is None or the probe failed."""
    if dirs is None or not snapshot.ok:
        return snapshot
    builds = cuda_builds_in(list(dirs))
    return dataclasses.replace(snapshot, cuda_builds=builds) if builds else snapshot
