"""``gpulayer tui`` in a real terminal: tmux, 80x24, against a real gpulayerd; and on a pty that goes away."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
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


HANGUP_CHILD = """
import fcntl, signal, sys, termios
fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the pty becomes the controlling terminal of this new session
if sys.argv[1] == "nohup":
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup: the kernel's hang-up signal does nothing
from gpulayer_tui.launch import main
sys.exit(main(["--socket", sys.argv[2]]))
"""


class PtyTui:
    """``python -m gpulayer_tui`` (through :func:`gpulayer_tui.launch.main`) on a fresh pty of 80x24."""

    def __init__(self, mode: str, socket: str) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {**clean_env(), "TERM": "xterm-256color"}
        self.proc = subprocess.Popen([sys.executable, "-c", HANGUP_CHILD, mode, socket], stdin=slave, stdout=slave,
                                     stderr=slave, start_new_session=True, env=env, close_fds=True)
        os.close(slave)
        self.output = b""

    def read(self, until: bytes | None, timeout_s: float) -> bool:
        """Read what the TUI wrote, until ``until`` shows (True), the pty closes or the time is up (False)."""
        end = time.monotonic() + timeout_s
        while until is None or until not in self.output:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                return False
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process closed the terminal
                return False
            if not chunk:
                return False
            self.output += chunk
        return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            os.close(self.master)


def test_a_lost_terminal_or_sighup_ends_the_tui_within_2_s() -> None:
    """The issue: a killed tmux session left the TUI at 99 % CPU on a deleted pty (SIGHUP ignored, Textual
    reading end-of-file in a loop). Both ways a terminal goes away end it: the hang-up itself, and SIGHUP."""
    socket = "/nonexistent/gltui.sock"  # the TUI runs and says the daemon is not reachable
    nohup, hup = PtyTui("nohup", socket), PtyTui("hup", socket)
    try:
        for tui in (nohup, hup):
            assert tui.read(b"daemon not reachable", timeout_s=30), tui.output[-2000:]
        os.close(nohup.master)  # the terminal goes away; SIGHUP is ignored
        hup.proc.send_signal(signal.SIGHUP)  # the terminal stays; the TUI leaves it as it found it
        start = time.monotonic()
        assert nohup.proc.wait(timeout=10) == 128 + signal.SIGHUP
        took = time.monotonic() - start
        assert took < 2.0, f"the TUI ended {took:.2f} s after its terminal"
        hup.read(None, timeout_s=10)  # its last words, until it closes the pty
        assert hup.proc.wait(timeout=10) == 128 + signal.SIGHUP
        assert time.monotonic() - start < 2.0
        last = hup.output.rsplit(b"daemon not reachable", 1)[-1]
        assert b"\x1b[?1049l" in last, last[-300:]  # back from the alternate screen: the terminal restored
    finally:
        nohup.kill()
        hup.kill()
