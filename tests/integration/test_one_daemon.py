"""One gpulayerd per machine (issue 11): the machine lock, the socket's modes, a deleted socket.

Every daemon here shares the lab's lock dir (temporary, unique to the run), which stands for
the machine's ``/tmp/gpulayer-locks``. A second daemon, in either mode, stops with exit 1 and
a message naming the running one, and leaves its socket and state dir alone.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.accounts import Account, Accounts, SharedPython

from .conftest import GPULAYER, GPULAYERD, Daemon, Lab, clean_env, wait_until

REFUSAL = "gpulayerd is already running on this machine (pid {pid}, {mode} mode, socket {socket}); use it, or stop it first"


class SystemDaemon(Daemon):
    """A system-mode daemon (``mode = "system"`` in its config file) with its own state and runtime dirs."""

    @property
    def socket_path(self) -> Path:
        return self.root / "rt" / "gpulayerd.sock"


def system_daemon(lab: Lab) -> SystemDaemon:
    d = SystemDaemon(lab.root / f"sys{len(lab.daemons)}", lock_dir=lab.lock_dir, cpu_slots=2, fake=None,
                     settings={"schedule_interval_s": 0.5, "probe_interval_s": 300.0, "mode": "system",  # type: ignore[dict-item]
                               "runtime_dir": str(lab.root / f"sys{len(lab.daemons)}" / "rt")})  # type: ignore[dict-item]
    lab.daemons.append(d)
    return d


def second_daemon(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpulayerd ARGS --device-lock-dir LAB_LOCKS``, expected to stop at once."""
    return subprocess.run([GPULAYERD, "--device-lock-dir", str(lab.lock_dir), "--no-mdns", *args], env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)


def cli(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPULAYER, "--socket", str(sock), *args], env=clean_env(), capture_output=True,
                          text=True, timeout=60, check=False)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def assert_serves(d: Daemon, sock: Path) -> None:
    r = cli(sock, "jobs")
    assert r.returncode == 0, r.stderr
    assert d.proc is not None and d.call(lambda c: c.health()).pid == d.proc.pid


def test_a_second_daemon_in_either_mode_stops_and_the_first_keeps_serving(lab: Lab) -> None:
    first = lab.daemon()
    assert first.proc is not None
    sock = first.socket_path
    before = sock.lstat()
    refusal = REFUSAL.format(pid=first.proc.pid, mode="personal", socket=sock)

    # The same state dir (so the same socket path): the case that used to delete the first one's socket.
    same = second_daemon(lab, "--state-dir", str(first.state_dir))
    # Another state dir, personal mode; then system mode with its own state and runtime dirs.
    other = second_daemon(lab, "--state-dir", str(lab.root / "other"))
    system = second_daemon(lab, "--system", "--state-dir", str(lab.root / "sysstate"),
                           "--runtime-dir", str(lab.root / "sysrun"))
    for r in (same, other, system):
        assert r.returncode == 1, r.stderr
        assert f"gpulayerd: {refusal}\n" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    # Nothing of theirs was made, nothing of the first one's changed.
    assert not (lab.root / "other").exists() and not (lab.root / "sysstate").exists()
    assert not (lab.root / "sysrun").exists()
    after = sock.lstat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert_serves(first, sock)

    # Personal mode: socket 0600 in a 0700 directory.
    assert (mode_of(sock), mode_of(sock.parent)) == (0o600, 0o700)


def test_system_mode_socket_is_0666_in_a_0755_dir_and_a_personal_daemon_is_refused(lab: Lab) -> None:
    first = system_daemon(lab).start()
    assert first.proc is not None
    sock = first.socket_path
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    assert (mode_of(sock), mode_of(sock.parent)) == (0o666, 0o755)
    assert (sock.lstat().st_uid, sock.parent.lstat().st_uid) == (0, 0)
    assert mode_of(first.state_dir) == 0o700

    r = second_daemon(lab, "--state-dir", str(lab.root / "personal"))
    assert r.returncode == 1
    assert REFUSAL.format(pid=first.proc.pid, mode="system", socket=sock) in r.stderr, r.stderr
    assert not (lab.root / "personal").exists()
    assert_serves(first, sock)


def test_a_deleted_socket_comes_back(lab: Lab) -> None:
    d = lab.daemon()
    sock = d.socket_path
    sock.unlink()
    wait_until(sock.exists, 15.0, "the socket to be re-created")  # (it may get the old inode number back)
    assert mode_of(sock) == 0o600
    assert_serves(d, sock)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A temporary directory every account can enter (the lab root is root's only); its locks/ stands for
    the machine's lock dir."""
    root = Path(tempfile.mkdtemp(prefix="glone-", dir="/tmp"))
    root.chmod(0o1777)  # like /tmp: each account makes its own things in it
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_account(shared_python: SharedPython, account: Account, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([shared_python.python, "-m", "gpulayerd", "--no-mdns", "--cpu-slots", "1", *args],
                            env=shared_python.env(account), user=account.name, cwd=str(account.home),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_system_daemon_needs_root(shared_python: SharedPython, accounts: Accounts, shared_root: Path) -> None:
    alice = accounts.user("alice")
    p = as_account(shared_python, alice, "--system", "--device-lock-dir", str(shared_root / "locks"))
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and f"system mode runs as root (it starts each job as its user); this is uid {alice.uid}" in out, out
    assert list(shared_root.iterdir()) == []  # not even the lock dir


def test_a_users_personal_daemon_and_the_system_daemon_exclude_each_other(
        shared_python: SharedPython, accounts: Accounts, shared_root: Path) -> None:
    alice = accounts.user("alice")
    locks = shared_root / "locks"
    state = alice.home / "state"
    p = as_account(shared_python, alice, "--state-dir", str(state), "--device-lock-dir", str(locks))
    try:
        sock = state / "run" / "gpulayerd.sock"
        wait_until(lambda: sock.exists() or p.poll() is not None, 60.0, "alice's daemon to serve")
        assert p.poll() is None, p.communicate()[0]
        assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
        assert (locks / "gpulayerd.lock").stat().st_uid == alice.uid

        r = subprocess.run([GPULAYERD, "--system", "--no-mdns", "--device-lock-dir", str(locks), "--state-dir",
                            str(shared_root / "sys"), "--runtime-dir", str(shared_root / "sysrun")],
                           env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 1, r.stderr
        assert REFUSAL.format(pid=p.pid, mode="personal", socket=sock) in r.stderr, r.stderr
        assert not (shared_root / "sys").exists() and sock.exists()
    finally:
        p.terminate()
        p.communicate(timeout=30)
    assert p.returncode == 0
    # Alice's daemon is gone: root's system daemon takes the lock file she made, and then refuses hers.
    # (--python: with --system, the jobs' interpreter must be one every account can run; the venv's is root's)
    with subprocess.Popen([GPULAYERD, "--system", "--python", "/usr/bin/python3", "--no-mdns", "--cpu-slots", "1",
                           "--device-lock-dir", str(locks),
                           "--state-dir", str(shared_root / "sys"), "--runtime-dir", str(shared_root / "sysrun")],
                          env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as system:
        try:
            sys_sock = shared_root / "sysrun" / "gpulayerd.sock"
            wait_until(lambda: sys_sock.exists() or system.poll() is not None, 60.0, "the system daemon to serve")
            assert system.poll() is None
            second = as_account(shared_python, alice, "--state-dir", str(state), "--device-lock-dir", str(locks))
            out, _ = second.communicate(timeout=60)
            assert second.returncode == 1, out
            assert REFUSAL.format(pid=system.pid, mode="system", socket=sys_sock) in out, out
            assert sys_sock.exists()
        finally:
            system.terminate()
            system.communicate(timeout=30)


# Inside a private mount namespace with its own /run: a system daemon on its defaults for /run/gpulayer,
# then a personal daemon with a lock dir of its own (not the shared one: a lock dir planted or emptied by
# someone), which must still find the system daemon through /run/gpulayer/gpulayerd.lock.
BESIDE_SYSTEM = r"""
set -u
mount -t tmpfs -o mode=0755 tmpfs /run
"$GPULAYERD" --system --python /usr/bin/python3 --no-mdns --cpu-slots 1 --state-dir "$ROOT/sys" \
    --runtime-dir /run/gpulayer --device-lock-dir "$ROOT/locks" >"$ROOT/sys.log" 2>&1 &
sys_pid=$!
for _ in $(seq 600); do [ -S /run/gpulayer/gpulayerd.sock ] && break; sleep 0.1; done
echo "system pid $sys_pid"
echo "modes: $(stat -c '%a %U' /run/gpulayer /run/gpulayer/gpulayerd.lock | tr '\n' ' ')"
timeout 30 "$GPULAYERD" --no-mdns --cpu-slots 1 --state-dir "$ROOT/personal" --device-lock-dir "$ROOT/other-locks"
echo "personal exit $?"
kill -TERM $sys_pid; wait $sys_pid; echo "system exit $?"
"""


def test_a_personal_daemon_with_another_lock_dir_still_finds_the_system_daemon(lab: Lab) -> None:
    """Issue 24: the system daemon keeps its lock in /run/gpulayer (root's, 0755), and every daemon
    checks it there (read-only; flock works on a read-only descriptor)."""
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", BESIDE_SYSTEM],
                       env={**clean_env(), "GPULAYERD": GPULAYERD, "ROOT": str(lab.root)}, capture_output=True,
                       text=True, timeout=120, check=False)
    out = r.stdout + r.stderr
    pid = next(line.split()[-1] for line in out.splitlines() if line.startswith("system pid"))
    assert "modes: 755 root 644 root " in out, out  # the run dir, the lock file
    assert REFUSAL.format(pid=pid, mode="system", socket="/run/gpulayer/gpulayerd.sock") in out, out
    assert "personal exit 1" in out and "system exit 0" in out, out
    assert not (lab.root / "personal").exists(), "the refused daemon made nothing"
