"""One gpulayerd per machine: the machine lock, system-mode settings, the socket's directory and modes.

flock belongs to an open file description: a second ``open`` + ``flock`` in this very process
conflicts with the first, so a second daemon is played by a second acquisition here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from aiohttp import ClientSession, UnixConnector, web

from gpulayerd import __main__ as daemon_main
from gpulayerd.api.unixsite import _clear_socket_path, start_unix_site
from gpulayerd.api.unixsite import socket_answers as _answers
from gpulayerd.config import SYSTEM_RUNTIME_DIR, SYSTEM_STATE_DIR, DaemonConfig
from gpulayerd.host.machinelock import (
    LOCK_NAME,
    Holder,
    MachineLocked,
    acquire_machine_lock,
    lock_holder_pids,
    read_holder,
    release_machine_lock,
)
from gpulayerd.host.privdirs import UnsafeDirectory, make_public_dir

ME = Holder(pid=1234, mode="system", socket="/run/gpulayer/gpulayerd.sock", state_dir="/var/lib/gpulayer", uid=0)
OTHER = Holder(pid=99, mode="personal", socket="/tmp/x.sock", state_dir="/tmp/x", uid=1000)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ------------------------------------------------------------------------- machine lock


def test_the_second_holder_is_told_who_runs_and_how_to_reach_it(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    fd = acquire_machine_lock(locks, ME)
    try:
        with pytest.raises(MachineLocked) as info:
            acquire_machine_lock(locks, OTHER)
        assert str(info.value) == ("gpulayerd is already running on this machine (pid 1234, system mode, socket "
                                   "/run/gpulayer/gpulayerd.sock); use it, or stop it first")
        assert info.value.holder == ME
        assert read_holder(locks / LOCK_NAME) == ME  # the refused one wrote nothing
    finally:
        release_machine_lock(fd)
    assert read_holder(locks / LOCK_NAME) is None  # cleared on release
    fd = acquire_machine_lock(locks, OTHER)
    assert json.loads((locks / LOCK_NAME).read_text())["pid"] == 99
    release_machine_lock(fd)


def test_lock_dir_is_sticky_and_shared_and_the_lock_file_opens_for_every_account(tmp_path: Path) -> None:
    locks = tmp_path / "a" / "locks"
    old = os.umask(0o077)
    try:
        fd = acquire_machine_lock(locks, ME)
    finally:
        os.umask(old)
    release_machine_lock(fd)
    assert mode_of(locks) == 0o1777
    assert mode_of(locks / LOCK_NAME) == 0o666


def test_a_lock_file_of_another_account_is_locked_read_only() -> None:
    base = Path(tempfile.mkdtemp(prefix="glml-", dir="/tmp"))  # pytest's tmp_path is closed to other accounts
    base.chmod(0o755)
    try:
        _lock_as_another_account(base / "locks")
    finally:
        shutil.rmtree(base)


def _lock_as_another_account(locks: Path) -> None:
    locks.mkdir(mode=0o1777)
    (locks / LOCK_NAME).write_text("")
    os.chown(locks / LOCK_NAME, 65534, 65534)
    os.chmod(locks / LOCK_NAME, 0o644)
    os.chmod(locks, 0o1777)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: an unprivileged daemon
        try:
            os.setgid(65534)
            os.setuid(65533)
            fd = acquire_machine_lock(locks, OTHER)
            os._exit(0 if fd >= 0 else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_symlink_or_a_hard_link_in_place_of_the_lock_file_is_refused(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (locks / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError, match="machine lock"):
        acquire_machine_lock(locks, ME)
    (locks / LOCK_NAME).unlink()
    os.link(victim, locks / LOCK_NAME)
    with pytest.raises(OSError, match="not a plain file with one link"):
        acquire_machine_lock(locks, ME)
    assert victim.read_text() == "precious"


def test_garbled_holder_details_still_refuse(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    fd = acquire_machine_lock(locks, ME)
    os.pwrite(fd, b"{not json", 0)
    try:
        with pytest.raises(MachineLocked, match=r"already running on this machine \(its details are not in"):
            acquire_machine_lock(locks, OTHER)
    finally:
        release_machine_lock(fd)


# ------------------------------------------------------------------------------ settings


def test_system_mode_defaults_and_what_still_wins(tmp_path: Path) -> None:
    c = DaemonConfig.load(None, {"mode": "system"})
    assert (c.state_dir, c.runtime_dir, c.socket_path) == (SYSTEM_STATE_DIR, SYSTEM_RUNTIME_DIR,
                                                           SYSTEM_RUNTIME_DIR / "gpulayerd.sock")
    c = DaemonConfig.load(None, {"mode": "system", "state_dir": tmp_path / "s", "runtime_dir": tmp_path / "r"})
    assert (c.state_dir, c.socket_path) == (tmp_path / "s", tmp_path / "r" / "gpulayerd.sock")
    c = DaemonConfig.load(None, {"mode": "system", "state_dir": tmp_path / "s"})
    assert c.socket_path == tmp_path / "s" / "run" / "gpulayerd.sock"
    toml = tmp_path / "gpulayerd.toml"
    toml.write_text('mode = "system"\n')
    assert DaemonConfig.load(toml, {}).socket_path == SYSTEM_RUNTIME_DIR / "gpulayerd.sock"
    personal = DaemonConfig.load(None, {})
    assert personal.mode == "personal" and personal.state_dir != SYSTEM_STATE_DIR


@pytest.mark.parametrize("how", [["--system"], ["--config", "{toml}"]])
def test_system_mode_not_as_root_exits_2_and_touches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: list[str]) -> None:
    toml = tmp_path / "gpulayerd.toml"
    toml.write_text('mode = "system"\n')
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    argv = [a.replace("{toml}", str(toml)) for a in how]
    code = daemon_main.main([*argv, "--state-dir", str(tmp_path / "s"), "--device-lock-dir", str(tmp_path / "l")])
    assert code == 2
    assert "system mode runs as root" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpulayerd.toml"]


# ------------------------------------------------------------------ the socket and its dir


def test_public_dir_is_0755_and_refused_when_world_writable_or_another_accounts(tmp_path: Path) -> None:
    d = tmp_path / "run" / "gpulayer"
    old = os.umask(0o077)
    try:
        make_public_dir(d)
    finally:
        os.umask(old)
    assert mode_of(d) == 0o755
    d.chmod(0o700)
    make_public_dir(d)
    assert mode_of(d) == 0o755
    d.chmod(0o1777)
    with pytest.raises(UnsafeDirectory, match="anyone may write"):
        make_public_dir(d)
    assert mode_of(d) == 0o1777
    d.chmod(0o755)
    os.chown(d, 65534, 65534)
    with pytest.raises(UnsafeDirectory, match="owned by uid 65534"):
        make_public_dir(d)


def test_a_live_socket_and_its_directory_are_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    path = d / "gpulayerd.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen(1)
        ino = path.lstat().st_ino
        with pytest.raises(OSError, match="another gpulayerd serves on"):
            _clear_socket_path(path)  # personal mode would make the directory 0700
        assert (path.lstat().st_ino, mode_of(d)) == (ino, 0o755)
    assert not _answers(path)  # closed: refused, stale
    _clear_socket_path(path)
    assert not path.exists() and mode_of(d) == 0o700


def test_a_socket_with_a_full_backlog_counts_as_alive(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as busy:
        busy.bind(str(path))
        busy.listen(0)
        waiting = []
        try:
            for _ in range(4):  # fill the backlog without accepting
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.setblocking(False)
                waiting.append(c)
                try:
                    c.connect(str(path))
                except BlockingIOError:
                    break
            assert _answers(path)
        finally:
            for c in waiting:
                c.close()


async def _pong(_: web.Request) -> web.Response:
    return web.Response(text="pong")


@pytest.mark.asyncio
@pytest.mark.parametrize(("public", "modes"), [(False, (0o600, 0o700)), (True, (0o666, 0o755))])
async def test_socket_modes_and_a_deleted_socket_is_made_again(
        tmp_path: Path, public: bool, modes: tuple[int, int]) -> None:
    path = tmp_path / "rt" / "gpulayerd.sock"
    app = web.Application()
    app.router.add_get("/ping", _pong)
    local = await start_unix_site(app, path, public=public)
    try:
        assert await asyncio.to_thread(lambda: (mode_of(path), mode_of(path.parent))) == modes
        assert await local.check() is False  # nothing changed: one stat
        await asyncio.to_thread(path.unlink)
        assert await local.check() is True
        assert await asyncio.to_thread(lambda: (stat.S_ISSOCK(path.lstat().st_mode), mode_of(path))) == (
            True, modes[0])
        async with ClientSession(connector=UnixConnector(path=str(path))) as session, \
                session.get("http://local/ping") as resp:
            assert await resp.text() == "pong"  # the new socket serves the same app
    finally:
        await local.close()
    assert not await asyncio.to_thread(path.exists)


@pytest.mark.asyncio
async def test_close_leaves_a_socket_that_is_not_ours(tmp_path: Path) -> None:
    path = tmp_path / "rt" / "gpulayerd.sock"
    local = await start_unix_site(web.Application(), path)
    await asyncio.to_thread(path.unlink)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await asyncio.to_thread(other.bind, str(path))
        other.listen(1)
        assert await local.check() is False  # another one answers there: left alone
        await local.close()
        assert await asyncio.to_thread(path.exists)
    finally:
        other.close()


# ------------------------------------------------------------------------- CLI discovery


def test_the_cli_finds_the_system_socket_when_no_personal_daemon_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from gpulayerd import config
    from gpulayerd.cli.http import socket_path
    from gpulayerd.host import sockets

    system = tmp_path / "run" / "gpulayerd.sock"
    monkeypatch.setattr(sockets, "SYSTEM_SOCKET_PATH", system)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    (tmp_path / "xdg").mkdir(mode=0o700)
    personal = config.socket_path_for(None)
    assert personal.is_relative_to(tmp_path / "xdg")
    args = argparse.Namespace(socket=None, state_dir=None)
    assert socket_path(args) == personal  # neither exists: the personal one (its "not running" message)
    system.parent.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sys_sock:
        sys_sock.bind(str(system))
        sys_sock.listen(1)
        assert socket_path(args) == system  # no personal daemon answers
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mine:
            mine.bind(str(personal))
            mine.listen(1)
            assert socket_path(args) == personal  # a personal daemon answers: it wins
        assert socket_path(argparse.Namespace(socket=tmp_path / "x.sock", state_dir=None)) == tmp_path / "x.sock"
        assert socket_path(argparse.Namespace(socket=None, state_dir=tmp_path / "s")) == (
            tmp_path / "s" / "run" / "gpulayerd.sock")


# A process that opens the lock file read-only, holds a flock on it, says "locked" and waits.
_SQUAT = ("import fcntl, os, sys, time; fd = os.open(sys.argv[-1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
          "print('locked', flush=True); time.sleep(60)")


def _squat(path: Path, *extra: str) -> subprocess.Popen[str]:
    import sys

    p = subprocess.Popen([sys.executable, "-c", _SQUAT, *extra, str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def _stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()
    if p.stdout is not None:
        p.stdout.close()


def test_a_process_that_is_not_gpulayerd_cannot_keep_the_system_daemon_from_starting(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    fd = acquire_machine_lock(lock_dir, OTHER)  # made the file; let go of it
    release_machine_lock(fd)
    squatter = _squat(lock_dir / LOCK_NAME)
    try:
        probe = os.open(lock_dir / LOCK_NAME, os.O_RDONLY)
        try:
            assert lock_holder_pids(probe) == [squatter.pid]  # the kernel's answer (/proc/locks)
        finally:
            os.close(probe)
        with pytest.raises(MachineLocked):  # a personal daemon believes any lock
            acquire_machine_lock(lock_dir, OTHER)
        fd = acquire_machine_lock(lock_dir, ME)  # the system daemon starts anyway
        release_machine_lock(fd)
    finally:
        _stop(squatter)


def test_a_gpulayerd_holding_the_lock_stops_the_system_daemon(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    release_machine_lock(acquire_machine_lock(lock_dir, OTHER))
    daemon_like = _squat(lock_dir / LOCK_NAME, "gpulayerd")  # its command line names gpulayerd
    try:
        with pytest.raises(MachineLocked, match="already running"):
            acquire_machine_lock(lock_dir, ME)
    finally:
        _stop(daemon_like)


def test_a_lock_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "root-owned"
    target.mkdir()
    (tmp_path / "locks").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        acquire_machine_lock(tmp_path / "locks", ME)
    assert list(target.iterdir()) == []  # nothing made through the link
