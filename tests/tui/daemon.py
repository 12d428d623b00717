"""A real gpulayerd for TUI tests, from the one daemon-process harness (:mod:`tests.fakes.daemon_process`):
``gpulayerd --state-dir ROOT/state --device-lock-dir ROOT/locks --cpu-slots 4`` on its embedded defaults
(or another slot count, and a fake nvidia-smi replaying recorded answers).

The root is a short ``/tmp/gltui-*`` directory (unix socket paths are limited to ~100 bytes).
:meth:`RealDaemon.close` stops it, kills the jobs it left running and removes the root.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.fakes import install_fake_tool
from tests.fakes.daemon_process import REPO_ROOT, Daemon, clean_env, kill_leftovers, tool

__all__ = ["REPO_ROOT", "RealDaemon", "clean_env", "tool"]


class RealDaemon(Daemon):
    """One gpulayerd subprocess on its own state dir; restartable on the same dir."""

    def __init__(self, cpu_slots: int = 4, nvidia_smi: list[dict[str, Any]] | None = None,
                 interpreter: str | None = None) -> None:
        """A daemon with ``cpu_slots`` CPU slots.

        Args:
            cpu_slots: its CPU slots for jobs.
            nvidia_smi: recorded answers of a fake nvidia-smi on its PATH (:func:`tests.fakes.install_fake_tool`;
                None: no GPU).
            interpreter: the one workload interpreter it probes (None: its own, with torch: the first
                daemon of a test process waits seconds for that torch check before it runs a job).
        """
        root = Path(tempfile.mkdtemp(prefix="gltui-", dir="/tmp"))
        env = {}
        if nvidia_smi is not None:
            install_fake_tool(root / "bin", "nvidia-smi", nvidia_smi)
            env["PATH"] = clean_env(root / "bin")["PATH"]
        settings: dict[str, Any] = {} if interpreter is None else {"interpreters": [interpreter]}
        super().__init__(root, lock_dir=root / "locks", cpu_slots=cpu_slots, fake=None, settings=settings, env=env)
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
