"""``gpulayer tui`` in a real terminal: tmux, 100x30, against a real gpulayerd."""

from __future__ import annotations

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


def test_gpulayer_tui_lists_jobs_switches_views_and_quits(real_daemon: RealDaemon, tmux: list[str]) -> None:
    job = real_daemon.call(lambda c: c.submit({"command": ["true"], "workdir": str(real_daemon.work),
                                               "name": "in-tmux"}, submitted_by="tester"))
    command = f"{tool('gpulayer')} --state-dir {real_daemon.state_dir} tui"
    env = {**clean_env(), "TERM": "xterm-256color"}
    subprocess.run([*tmux, "new-session", "-d", "-x", "100", "-y", "30", "-s", "tui", command], env=env,
                   check=True, timeout=10)
    # the Jobs view lists the job, and the footer shows the keys
    wait_screen(tmux, job.id, "in-tmux", "Jobs (j)", "⏎ Detail", "c Cancel", "l Logs", "/ Filter", "q Quit")
    subprocess.run([*tmux, "send-keys", "-t", "tui", "d"], check=True, timeout=10)
    wait_screen(tmux, "CPU only")
    subprocess.run([*tmux, "send-keys", "-t", "tui", "q"], check=True, timeout=10)
    end = time.monotonic() + 10
    while subprocess.run([*tmux, "has-session", "-t", "tui"], capture_output=True, timeout=10,
                         check=False).returncode == 0:
        assert time.monotonic() < end, f"q did not quit:\n{capture(tmux)}"
        time.sleep(0.1)
