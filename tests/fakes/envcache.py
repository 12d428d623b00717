"""A seed for the daemons' environment-probe cache, shared by the test daemons of one process.

The daemon caches its environment probe (an interpreter started with torch imported, ~2 s) in
``<state>/cache/environments``, keyed on the interpreter's files. The first daemon of a process
probes cold; later daemons (integration and LAN alike) start with a copy of its cache. Only an
optimisation: every failure to copy leaves a daemon to probe cold.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from pathlib import Path

__all__ = ["drop_env_cache", "keep_env_cache", "seed_env_cache"]

_SEED: dict[str, Path] = {}  # "dir": the seed, once a daemon has probed


def seed_env_cache(state_dir: Path) -> None:
    """Give a daemon about to start in ``state_dir`` a copy of the seed (when there is one)."""
    target = state_dir / "cache" / "environments"
    seed = _SEED.get("dir")
    if seed is not None and seed.is_dir() and not target.exists():
        with contextlib.suppress(OSError):
            shutil.copytree(seed, target)


def keep_env_cache(state_dir: Path) -> None:
    """After a daemon in ``state_dir`` probed: make its cache the seed, or add what it has new
    (the torch-checked answer lands after start-up, from a background check)."""
    source = state_dir / "cache" / "environments"
    seed_dir = _SEED.get("dir")
    if seed_dir is not None and source.is_dir():
        with contextlib.suppress(OSError):
            for f in source.iterdir():
                if not (seed_dir / f.name).exists():
                    shutil.copy2(f, seed_dir / f.name)
        return
    if seed_dir is None and source.is_dir() and any(source.iterdir()):
        seed = Path(tempfile.mkdtemp(prefix="glit-envcache-", dir="/tmp")) / "environments"
        try:
            shutil.copytree(source, seed)
        except OSError:
            shutil.rmtree(seed.parent, ignore_errors=True)
            return
        _SEED["dir"] = seed


def drop_env_cache() -> None:
    """Remove the seed (at the end of the test session; also at exit)."""
    seed = _SEED.pop("dir", None)
    if seed is not None:
        shutil.rmtree(seed.parent, ignore_errors=True)


atexit.register(drop_env_cache)
