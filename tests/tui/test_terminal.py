"""``gpulayer tui`` in a real terminal: tmux at 80x24 (and 200x60), against a real gpulayerd; and on a pty
that goes away."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

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


def resize(tmux: list[str], width: int, height: int, timeout_s: float = 10.0) -> None:
    """Resize the window to ``width`` x ``height`` cells and wait until tmux reports that size."""
    end = time.monotonic() + timeout_s
    while True:
        subprocess.run([*tmux, "resize-window", "-t", "tui", "-x", str(width), "-y", str(height)], check=True,
                       timeout=10)
        size = subprocess.run([*tmux, "display-message", "-p", "-t", "tui", "#{window_width}x#{window_height}"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        if size == f"{width}x{height}":
            return
        assert time.monotonic() < end, f"tmux window is {size}, not {width}x{height}"
        time.sleep(0.1)


def lines_with(screen: str, *needles: str) -> list[str]:
    return [line for line in screen.splitlines() if all(n in line for n in needles)]


def test_devices_as_the_cli_names_them_and_columns_fit_at_80x24_and_200x60(
        tmux: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A lab box (2x A6000, a 4090 with a foreign process, a lost GPU, an A100 with 3 MIG instances) behind a
    real daemon with one CPU slot: one TUI, resized from 80x24 to 200x60."""
    from gpulayerd.cli import main
    from gpulayerd.gpu.metrics import metrics_argv
    from tests.fakes.nvidia_recorded import lab_box

    base_python = str(Path(sys.base_prefix) / "bin" / "python3")  # no torch to check: jobs start at once
    host, me = socket.gethostname(), pwd.getpwuid(os.getuid()).pw_name  # the daemon's name, the jobs' user
    daemon = RealDaemon(cpu_slots=1, nvidia_smi=lab_box(metrics_argv("nvidia-smi", 1000)[1:]), interpreter=base_python)
    try:
        daemon.start()
        holder = submit(daemon, "--name", "holder", "--", "sleep", "120")
        on_mig = submit(daemon, "--name", "mig-job", "--accelerator", "cuda", "--gpu-memory-gb", "30", "--",
                        "sleep", "120")
        daemon.wait_status(holder, {"running"}, timeout_s=60.0)
        submit(daemon, "--name", "resnet50-imagenet-sweep-lr-3e-4-warmup-cosine-bs256", "--", "true")
        assert daemon.wait_status(on_mig, {"running"}).where_devices == [5000]  # the MIG 3g.40gb instance

        # the CLI at 80 columns: every line fits, the MIG instance's holder by name and user
        monkeypatch.setenv("COLUMNS", "80")
        capsys.readouterr()
        assert main(["--state-dir", str(daemon.state_dir), "devices"]) == 0
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert f"granted to mig-job ({me})" in out and "1 slot (0 free)" in out
        assert main(["--state-dir", str(daemon.state_dir), "peers"]) == 0
        assert "1x NVIDIA A100 80GB PCIe, 1x NVIDIA GeForce RTX 4090, 2x NVIDIA RTX A6000" in capsys.readouterr().out

        command = f"{tool('gpulayer')} --state-dir {daemon.state_dir} tui"
        env = {**clean_env(), "TERM": "xterm-256color"}
        subprocess.run([*tmux, "new-session", "-d", "-x", "80", "-y", "24", "-s", "tui", command], env=env,
                       check=True, timeout=10)
        # Jobs at 80: the waiting job's reason keeps its code and deciding words; NAME gave way; AGE is on screen
        screen = wait_screen(tmux, "Resources: cpu slots 0 free of 1", "mig-job")
        (row,) = lines_with(screen, "Resources: cpu slots 0 free of 1")
        assert "queued" in row and "resnet50-" in row and "warmup-cosine" not in row, screen
        assert re.search(r" \d+[smhd]\s*$", row), screen  # the last column is there: no sideways scrolling
        # Devices at 80: MIG instances by profile, the lost GPU says so, the CPU slots
        send(tmux, "d")
        screen = wait_screen(tmux, "MIG 3g.40gb", "1 slot (0 free)", "lost: Unable")
        assert len(lines_with(screen, "cuda", "MIG")) == 0  # KIND gave way at 80 columns
        (mig_row,) = lines_with(screen, "MIG 3g.40gb")
        assert "5000" in mig_row and f"mig-job ({me})" in mig_row, screen
        assert not lines_with(screen, "nvidia-smi ok"), screen  # a GPU is lost: the status line says so

        resize(tmux, 200, 60)
        # Devices at 200: every column whole; the live panel greys the lost GPU with nvidia-smi's words and
        # lists the MIG instances under their GPU
        screen = wait_screen(tmux, "DRIVER", "PROBE", "no live readings", "°C", f"granted to mig-job ({me})")
        (lost_row,) = lines_with(screen, "GPU at 0000:41:00.0")
        assert "lost: Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error" in lost_row
        (lost_card,) = lines_with(screen, "GPU 3 at 0000:41:00.0 lost:")
        assert "no live readings" in lost_card and "°C" not in lost_card
        assert lines_with(screen, "cuda/mig", "MIG 2g.20gb on GPU 4")
        assert lines_with(screen, "MIG 3g.40gb", f"granted to mig-job ({me})"), screen  # the live panel
        # Jobs at 200: the whole reason and name; WHERE names the MIG instance
        send(tmux, "2")
        screen = wait_screen(tmux, "resnet50-imagenet-sweep-lr-3e-4-warmup-cosine-bs256", f"{host} MIG 3g.40gb on GPU 4")
        assert lines_with(screen, "resnet50-imagenet-sweep-lr-3e-4-warmup-cosine-bs256", "(needs 1)"), screen
        assert lines_with(screen, "mig-job", f"{host} MIG 3g.40gb on GPU 4"), screen
        send(tmux, "C-c")
    finally:
        daemon.kill()  # no need to wait for a clean stop: close() kills the jobs it left
        daemon.close()
