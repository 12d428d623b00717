"""``gpulayer tui`` in a real terminal: tmux, 80x24, against a real gpulayerd."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.tui.daemon import RealDaemon, clean_env, tool


@pytest.fixture
def tmux() -> Iterator[list[str]]:
    """A private tmux server (``tmux -L NAME``), killed at teardown."""
    path = shutil.which("tmux")
    if path is None:
        pytest.fail("tmux is not installed; this test needs it (apt-get install -y tmux)")
    argv = [path, "-L", f"gltui-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
    try:
        yield argv
    finally:
        subprocess.run([*argv, "kill-server"], capture_output=True, timeout=10, check=False)


def capture(tmux: list[str]) -> str:
    r = subprocess.run([*tmux, "capture-pane", "-p", "-t", "tui"], capture_output=True, text=True, timeout=10,
                       check=False)
    return r.stdout


def wait_screen(tmux: list[str], *wanted: str, timeout_s: float = 20.0) -> str:
    """The pane's text once every string of ``wanted`` is on it (the terminal is drawn piece by piece)."""
    end = time.monotonic() + timeout_s
    while True:
        screen = capture(tmux)
        if all(w in screen for w in wanted):
            return screen
        if time.monotonic() > end:
            raise AssertionError(f"{wanted!r} not on screen after {timeout_s} s:\n{screen}")
        time.sleep(0.1)


def submit(daemon: RealDaemon, *args: str) -> str:
    r = daemon.cli("submit", "--json", *args)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return str(json.loads(r.stdout)["id"])


def send(tmux: list[str], *keys: str) -> None:
    subprocess.run([*tmux, "send-keys", "-t", "tui", *keys], check=True, timeout=10)


def test_gpulayer_tui_shows_a_waiting_jobs_reason_at_80x24_and_quits(real_daemon: RealDaemon,
                                                                     tmux: list[str]) -> None:
    # a job holding all 4 CPU slots, and one behind it that waits: "Resources: cpu slots 0 free of 4 …"
    holder = submit(real_daemon, "--name", "holder", "--nproc", "4", "--", "sleep", "120")
    # (it may wait a moment for the environment's torch check: the waiting job must come after it runs)
    real_daemon.wait_status(holder, {"running"}, timeout_s=60.0)
    waiting = submit(real_daemon, "--name", "in-tmux", "--", "true")
    try:
        command = f"{tool('gpulayer')} --state-dir {real_daemon.state_dir} tui"
        env = {**clean_env(), "TERM": "xterm-256color"}
        subprocess.run([*tmux, "new-session", "-d", "-x", "80", "-y", "24", "-s", "tui", command], env=env,
                       check=True, timeout=10)
        # the Jobs view shows the reason's code and deciding words in the waiting job's row
        screen = wait_screen(tmux, "in-tmux", "Resources: cpu slots 0 free of 4", "2 Jobs", "q Quit", "? Help")
        row = next(line for line in screen.splitlines() if "in-tmux" in line)
        assert "queued" in row and "Resources: cpu slots 0 free of 4" in row, screen
        send(tmux, "d")
        wait_screen(tmux, "CPU only")
        send(tmux, "2", "?")  # back to the jobs, and the help panel lists the keys
        wait_screen(tmux, "Reverse sort")
        send(tmux, "C-c")
        end = time.monotonic() + 10
        while subprocess.run([*tmux, "has-session", "-t", "tui"], capture_output=True, timeout=10,
                             check=False).returncode == 0:
            assert time.monotonic() < end, f"ctrl+c did not quit:\n{capture(tmux)}"
            time.sleep(0.1)
    finally:
        for job_id in (waiting, holder):
            real_daemon.cli("cancel", job_id)
