"""Fake Python environments: a real venv (no pip) holding hand-made ``*.dist-info`` dirs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["add_dists", "make_env"]


def make_env(
    root: Path, dists: Mapping[str, str], files: Mapping[str, str] | None = None
) -> tuple[Path, Path]:
    """Create a venv under ``root`` with fake distributions; return (python, site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert site.is_dir()
    add_dists(site, dists)
    for rel, text in (files or {}).items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "bin" / "python", site


def add_dists(directory: Path, dists: Mapping[str, str]) -> None:
    """Write one ``<name>-<version>.dist-info`` per distribution, as an installer would."""
    for name, version in dists.items():
        info = directory / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        info.joinpath("METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
        )


def fake_torch(*, cuda: bool | str, nccl: bool, prelude: str = "") -> str:
    """``torch/__init__.py`` with just what the environment probe and the pre-flight check read: version
    (from a ``torch/version.py`` the caller writes), CUDA available with one device or not (``cuda``: a
    bool, or a Python expression evaluated at each call, e.g. whether a flag file exists; ``cuda.init()``
    raises as torch's does without one), ``zeros`` (a tiny tensor), no MPS, gloo, NCCL or not.
    ``prelude`` runs first (e.g. a wait on a gate file, an import)."""
    return f"""{prelude}from . import version
__version__ = version.__version__
class _Tensor:
    def __add__(self, other): return self
    def sum(self): return self
    def __float__(self): return 1.0
def zeros(*shape, device=None):
    if device == "cuda" and not ({cuda}):
        raise RuntimeError("No CUDA GPUs are available")
    return _Tensor()
def _init():
    if not ({cuda}):
        raise RuntimeError("No CUDA GPUs are available")
class cuda:
    is_available = staticmethod(lambda: {cuda})
    device_count = staticmethod(lambda: int({cuda}))
    init = staticmethod(_init)
class backends:
    class mps:
        is_built = staticmethod(lambda: False)
        is_available = staticmethod(lambda: False)
class distributed:
    is_available = staticmethod(lambda: True)
    is_gloo_available = staticmethod(lambda: True)
    is_nccl_available = staticmethod(lambda: {nccl})
    is_mpi_available = staticmethod(lambda: False)
"""
