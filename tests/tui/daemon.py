"""A real gpulayerd for TUI tests, from the one daemon-process harness (:mod:`tests.fakes.daemon_process`):
``gpulayerd --state-dir ROOT/state --device-lock-dir ROOT/locks --cpu-slots 4`` on its embedded defaults.

The root is a short ``/tmp/gltui-*`` directory (unix socket paths are limited to ~100 bytes).
:meth:`RealDaemon.close` stops it, kills the jobs it left running and removes the root.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.fakes.daemon_process import REPO_ROOT, Daemon, clean_env, kill_leftovers, tool

__all__ = ["REPO_ROOT", "RealDaemon", "clean_env", "tool"]


class RealDaemon(Daemon):
    """One gpulayerd subprocess on its own state dir; restartable on the same dir."""

    def __init__(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="gltui-", dir="/tmp"))
        super().__init__(root, lock_dir=root / "locks", cpu_slots=4, fake=None, settings={})
        self.work.mkdir()

    def close(self) -> None:
        """Stop the daemon, kill whatever of its jobs is left, remove the root."""
        try:
            self.stop()
            kill_leftovers(self.root, self.job_ids_on_disk())
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def cli_json(self, *args: str) -> Any:
        """``gpulayer --state-dir STATE ARGS`` decoded (asserts exit 0)."""
        return super().cli_json(*args)
