"""The rendered systemd unit's command line, run by hand as systemd would run it (Type=notify).

CI has no systemd as PID 1 and no user instance, so ``systemctl --user start`` cannot be
tried. Instead: ``gpulayer service install`` renders the unit into a temporary HOME, the
test runs its ``ExecStart=`` command line with ``NOTIFY_SOCKET`` pointing at a unix
datagram socket it bound itself (and ``JOURNAL_STREAM`` set, as journald does), and
checks the protocol systemd relies on: ``READY=1`` comes from the main process only once
the local API answers, ``STOPPING=1`` follows SIGTERM, and the exit is clean.
"""

from __future__ import annotations

import json
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.api.client import DaemonClient
from gpulayerd.models import HealthView
from tests.integration.conftest import GPULAYER, GPULAYERD, START_TIMEOUT_S, clean_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="systemd's protocol, on Linux")

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class Message:
    fields: dict[str, str]
    sender_pid: int | None


@dataclass
class Box:
    """A temporary HOME (short path: unix sockets) with XDG dirs, and a bound notify socket."""

    root: Path
    env: dict[str, str]
    notify: socket.socket
    notify_path: Path

    def receive(self, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> Message:
        """The next datagram, with the sender's pid from SCM_CREDENTIALS (what NotifyAccess=main checks)."""
        end = time.monotonic() + timeout_s
        while True:
            ready, _, _ = select.select([self.notify], [], [], 0.1)
            if ready:
                data, ancdata, _, _ = self.notify.recvmsg(4096, socket.CMSG_SPACE(_CREDS.size))
                pid = None
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        pid = _CREDS.unpack(payload[: _CREDS.size])[0]
                text = data.decode("utf-8")
                return Message(dict(line.split("=", 1) for line in text.split("\n") if line), pid)
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"gpulayerd exited with {proc.returncode} before notifying\n{self.log()}")
            if time.monotonic() > end:
                raise AssertionError(f"no notification within {timeout_s} s\n{self.log()}")

    def log(self) -> str:
        path = self.root / "gpulayerd.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else "(no log)"


@pytest.fixture
def box() -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="glsvc-", dir="/tmp"))
    home = root / "home"
    runtime = root / "run"
    for d in (home, runtime):
        d.mkdir(mode=0o700)
    env = {k: v for k, v in clean_env().items()
           if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM") and not k.startswith("XDG_")}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(runtime), XDG_STATE_HOME=str(home / ".local" / "state"),
               XDG_CACHE_HOME=str(home / ".cache"),
               # Not the machine's /tmp/gpulayer-locks: its gpulayerd.lock allows one daemon per machine.
               GPULAYER_DEVICE_LOCK_DIR=str(root / "locks"))
    notify_path = root / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(notify_path))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        yield Box(root, env, sock, notify_path)
    finally:
        sock.close()
        shutil.rmtree(root, ignore_errors=True)


def exec_start(unit_text: str) -> list[str]:
    """The ExecStart= command line as systemd splits it (our renderer's quoting; %% and $$ undone)."""
    (line,) = [ln for ln in unit_text.splitlines() if ln.startswith("ExecStart=")]
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line.removeprefix("ExecStart="))]


def health_now(sock_path: Path) -> HealthView:
    import asyncio

    async def go() -> HealthView:
        async with DaemonClient(sock_path, timeout_s=5.0) as c:
            return await c.health()

    return asyncio.run(go())


def install_and_start(box: Box) -> tuple[subprocess.Popen[bytes], Message]:
    """Render the unit with ``gpulayer service install``, run its ExecStart= by hand; wait for READY=1."""
    r = subprocess.run([GPULAYER, "service", "install", "--os", "linux", "--python", sys.executable],
                       env=box.env, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    unit = Path(box.env["HOME"]) / ".config" / "systemd" / "user" / "gpulayerd.service"
    argv = exec_start(unit.read_text())
    assert argv == [GPULAYERD, "--python", sys.executable]
    env = {**box.env, "NOTIFY_SOCKET": str(box.notify_path), "JOURNAL_STREAM": "8:12345"}
    with open(box.root / "gpulayerd.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=box.env["HOME"], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        return proc, box.receive(START_TIMEOUT_S, proc)
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def service_status(box: Box, *global_args: str) -> dict[str, Any]:
    r = subprocess.run([GPULAYER, *global_args, "service", "status", "--json"], env=box.env, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_exec_start_notifies_ready_after_the_api_answers_and_stopping_on_sigterm(box: Box) -> None:
    proc, ready = install_and_start(box)
    try:
        assert ready.fields.get("READY") == "1", ready
        serving = ready.fields.get("STATUS", "")
        assert serving.startswith("serving /"), ready
        socket_path = Path(serving.removeprefix("serving "))
        # The API answers at the moment READY=1 arrives: no retry, no wait.
        health = health_now(socket_path)
        assert health.ok and health.pid == proc.pid
        assert ready.sender_pid == proc.pid, "READY=1 must come from the main process (NotifyAccess=main)"

        status = service_status(box, "--socket", str(socket_path))
        assert (status["installed"], status["file"], status["this_installation"]) == (True, "generated", True)
        assert (status["enabled"], status["running"]) == (False, True)
        assert status["daemon"]["pid"] == proc.pid and status["interpreters"] == [sys.executable]

        proc.send_signal(signal.SIGTERM)
        stopping = box.receive(10.0)
        assert stopping.fields.get("STOPPING") == "1" and stopping.sender_pid == proc.pid, stopping
        assert proc.wait(timeout=20) == 0, box.log()
    finally:
        stop(proc)
    # Under journald (JOURNAL_STREAM set) lines carry no timestamp of their own.
    lines = box.log().splitlines()
    assert any(ln.startswith("INFO gpulayerd.daemon: gpulayerd ") for ln in lines), box.log()


def test_gpulayer_with_default_settings_finds_the_service_daemon(box: Box) -> None:
    proc, ready = install_and_start(box)
    try:
        assert service_status(box)["running"] is True, ready
    finally:
        stop(proc)


def test_without_notify_socket_the_daemon_runs_as_before(box: Box) -> None:
    with open(box.root / "gpulayerd.log", "wb") as log:
        proc = subprocess.Popen([GPULAYERD], env=box.env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + START_TIMEOUT_S
        while "serving /" not in box.log():
            assert proc.poll() is None and time.monotonic() < end, box.log()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, box.log()
    finally:
        stop(proc)
    ready, _, _ = select.select([box.notify], [], [], 0)
    assert not ready  # nothing was sent anywhere
