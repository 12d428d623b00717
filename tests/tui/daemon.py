"""A real gpulayerd for TUI tests: ``gpulayerd --state-dir ROOT/state --device-lock-dir ROOT/locks``.

The root is a short ``/tmp/gltui-*`` directory (unix socket paths are limited to ~100 bytes).
:meth:`RealDaemon.stop` is SIGTERM then SIGKILL; :meth:`RealDaemon.close` also kills the
jobs it left running and removes the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from gpulayerd.api.client import DaemonClient

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0  # the first start probes the environment (imports torch in a subprocess)

_T = TypeVar("_T")


def tool(name: str) -> str:
    """The venv's console script ``name``."""
    for d in (Path(sys.executable).parent, REPO_ROOT / ".venv" / "bin"):
        if (d / name).is_file():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e .)")
    return found


def clean_env() -> dict[str, str]:
    """This environment without GPULAYER_* (a developer's settings must not leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}


class RealDaemon:
    """One gpulayerd subprocess on its own state dir; restartable on the same dir."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gltui-", dir="/tmp"))
        self.state_dir = self.root / "state"
        self.lock_dir = self.root / "locks"
        self.work = self.root / "work"
        self.work.mkdir()
        self.log_path = self.root / "gpulayerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "run" / "gpulayerd.sock"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> RealDaemon:
        """Start and wait until the socket answers ``devices`` (the first probe is done)."""
        argv = [tool("gpulayerd"), "--state-dir", str(self.state_dir), "--device-lock-dir", str(self.lock_dir),
                "--cpu-slots", "4", "--log-level", "DEBUG"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=clean_env(), cwd=self.root, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"gpulayerd exited with {self.proc.returncode}\n{self.log_tail()}")
            if self.socket_path.exists():
                with contextlib.suppress(Exception):
                    self.call(lambda c: c.devices(), timeout_s=max(1.0, end - time.monotonic()))
                    return self
            if time.monotonic() > end:
                raise AssertionError(f"gpulayerd did not answer within {timeout_s} s\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Stop the daemon, kill whatever of its jobs is left, remove the root."""
        try:
            self.stop()
            me = os.getpid()
            marker = str(self.root)
            victims = []
            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    if p.pid != me and (any(marker in a for a in p.cmdline()) or p.cwd().startswith(marker)):
                        victims.append(p)
            for p in victims:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            psutil.wait_procs(victims, timeout=5)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no daemon log)"

    def call(self, fn: Callable[[DaemonClient], Awaitable[_T]], timeout_s: float = 30.0) -> _T:
        """Run one client call in a fresh event loop (from synchronous code only)."""
        async def go() -> _T:
            async with DaemonClient(self.socket_path, timeout_s=timeout_s) as c:
                return await fn(c)

        return asyncio.run(go())

    def cli(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``gpulayer --state-dir STATE ARGS...`` in the work dir."""
        return subprocess.run([tool("gpulayer"), "--state-dir", str(self.state_dir), *args], cwd=self.work,
                              env=clean_env(), capture_output=True, text=True, timeout=timeout_s, check=False)

    def cli_json(self, *args: str) -> Any:
        r = self.cli(*args)
        assert r.returncode == 0, f"gpulayer {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout)
