"""``gpulayer service``: the rendered files, install/status/uninstall in a temporary HOME, sd_notify.

The systemd unit is checked with ``systemd-analyze --user verify`` (works as root without a
running systemd when ``XDG_RUNTIME_DIR`` is given); it is a hard requirement: without
Debian's ``systemd`` package these tests fail and say so. Nothing here runs systemctl or
launchctl.
"""

from __future__ import annotations

import configparser
import json
import os
import plistlib
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayerd import cli
from gpulayerd.host.notify import notify, notify_ready, notify_status, notify_stopping
from gpulayerd.host.service_user import (
    LAUNCHD_LABEL,
    PLACEHOLDER_GPULAYERD,
    PLACEHOLDER_HOME,
    file_state,
    find_gpulayerd,
    is_pristine,
    render_launchd_plist,
    render_systemd_unit,
    service_target,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
REPO_UNIT = REPO_ROOT / "systemd" / "gpulayerd.service"
REPO_PLIST = REPO_ROOT / "launchd" / "io.gpulayer.gpulayerd.plist"
START = "systemctl --user daemon-reload && systemctl --user enable --now gpulayerd"
INSTALL_HINT = ("install Debian's systemd package (apt-get install systemd; scripts/test does it when run "
                "as root) so that the unit can be checked")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME; no daemon answers on the CLI's socket."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GPULAYER_STATE_DIR", raising=False)
    monkeypatch.setenv("GPULAYER_SOCKET", str(tmp_path / "no-daemon.sock"))
    return h


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def unit_path(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / "gpulayerd.service"


def plist_path(home: Path) -> Path:
    return home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def status_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code, out, err = run_cli(capsys, "service", "status", "--json", *extra)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def this_gpulayerd() -> str:
    found = find_gpulayerd()
    assert found is not None
    return found


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------ systemd-analyze verify


def verify_unit(unit: Path, scratch: Path) -> list[str]:
    """``systemd-analyze --user verify`` of ``unit``: its complaints about the unit ([] = clean).

    systemd only warns about a bad setting (exit code 0), so every output line that names
    the unit counts as a failure.
    """
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail(f"systemd-analyze not found: {INSTALL_HINT}")
    runtime = scratch / "xdg-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "NOTIFY_SOCKET")}
    env.update(HOME=str(scratch), XDG_RUNTIME_DIR=str(runtime))
    r = subprocess.run([exe, "--user", "verify", "--man=no", "--generators=no", str(unit)], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 0, f"systemd-analyze verify {unit} exited {r.returncode}:\n" + "\n".join(lines)
    return [ln for ln in lines if "gpulayerd" in ln]


def test_repo_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # The repo file runs a placeholder path; verify needs an executable: point it at ours.
    text = REPO_UNIT.read_text()
    assert text.count(f"ExecStart={PLACEHOLDER_GPULAYERD}\n") == 1
    unit = tmp_path / "gpulayerd.service"
    unit.write_text(text.replace(f"ExecStart={PLACEHOLDER_GPULAYERD}", f"ExecStart={this_gpulayerd()}"))
    assert verify_unit(unit, tmp_path) == []


def test_rendered_unit_passes_systemd_analyze_verify(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux", "--python", sys.executable)
    assert code == 0, err
    assert f"ExecStart={this_gpulayerd()} --python {sys.executable}\n" in unit_path(home).read_text()
    assert verify_unit(unit_path(home), home) == []


def test_systemd_analyze_check_catches_a_bad_setting(tmp_path: Path) -> None:
    unit = tmp_path / "gpulayerd.service"
    text = render_systemd_unit(this_gpulayerd(), [])
    unit.write_text(text.replace("KillMode=process", "KillMode=proces"))
    complaints = verify_unit(unit, tmp_path)
    assert any("KillMode" in c or "kill mode" in c for c in complaints), complaints


def test_odd_paths_are_quoted_for_systemd_and_read_back(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = executable(home / "envs" / 'my env %h $HOME "q" \\ x' / "python")
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux", "--python", str(odd))
    assert code == 0, err
    assert verify_unit(unit_path(home), home) == []
    assert status_json(capsys, "--os", "linux")["interpreters"] == [str(odd)]


# ------------------------------------------------------------------------- unit contents


def unit_settings(text: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    return cp


def test_unit_keeps_jobs_on_stop_and_leaves_gpus_tmp_and_home_reachable() -> None:
    unit = unit_settings(REPO_UNIT.read_text())
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["Restart"] == "on-failure"
    assert service["KillMode"] == "process"  # jobs survive "systemctl --user restart gpulayerd"
    assert service["PrivateTmp"] == "no"  # device locks in /tmp/gpulayer-locks are machine-wide
    assert service["LimitNOFILE"] == "65536"
    for key in ("NoNewPrivileges", "RestrictRealtime", "LockPersonality"):
        assert service[key] == "yes"
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectSystem", "ProtectHome",
                "ReadWritePaths", "MemoryDenyWriteExecute", "SystemCallFilter", "ProtectKernelTunables"):
        assert key not in service, key
    assert unit["Install"]["WantedBy"] == "default.target"
    # Every setting is explained in a comment above it.
    for key in ("Type", "KillMode", "PrivateTmp", "NoNewPrivileges", "RestrictRealtime", "LockPersonality"):
        lines = REPO_UNIT.read_text().splitlines()
        i = next(n for n, ln in enumerate(lines) if ln.startswith(f"{key}="))
        assert lines[i - 1].startswith("#"), key


def test_repo_files_are_the_renderings_with_placeholder_paths() -> None:
    regen = ("regenerate them: .venv/bin/python -c 'from pathlib import Path; from gpulayerd.host.service_user import *; "
             "Path(\"systemd/gpulayerd.service\").write_text(render_systemd_unit(PLACEHOLDER_GPULAYERD, [])); "
             "Path(\"launchd/io.gpulayer.gpulayerd.plist\").write_text(render_launchd_plist(PLACEHOLDER_GPULAYERD, "
             "[], PLACEHOLDER_HOME + \"/Library/Logs/gpulayer/gpulayerd.log\"))'")
    assert REPO_UNIT.read_text() == render_systemd_unit(PLACEHOLDER_GPULAYERD, []), regen
    plist = render_launchd_plist(PLACEHOLDER_GPULAYERD, [], f"{PLACEHOLDER_HOME}/Library/Logs/gpulayer/gpulayerd.log")
    assert REPO_PLIST.read_text() == plist, regen
    assert is_pristine(REPO_UNIT.read_text()) and is_pristine(REPO_PLIST.read_text())


def test_digest_header_tells_hand_edits_apart() -> None:
    rendered = render_systemd_unit("/opt/gpulayer/bin/gpulayerd", [])
    other = render_systemd_unit("/opt/gpulayer/bin/gpulayerd", ["/usr/bin/python3"])
    assert file_state(None, rendered) == "missing"
    assert file_state(rendered, rendered) == "current"
    assert file_state(other, rendered) == "outdated"
    assert file_state(other.replace("RestartSec=5s", "RestartSec=1s"), rendered) == "modified"
    assert file_state("[Service]\nExecStart=/bin/true\n", rendered) == "modified"
    assert not is_pristine(rendered + "# one more line\n")


# ------------------------------------------------------------------------------- launchd


def test_repo_plist_is_a_valid_plist_with_absolute_placeholder_paths() -> None:
    with REPO_PLIST.open("rb") as f:
        data = plistlib.load(f)
    assert data["ProgramArguments"] == [PLACEHOLDER_GPULAYERD]
    assert data["StandardErrorPath"].startswith(f"{PLACEHOLDER_HOME}/Library/Logs/gpulayer/")


def test_rendered_plist_loads_and_every_path_is_absolute(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = executable(home / "envs" / "a&b <c>" / "python")
    code, out, err = run_cli(capsys, "service", "install", "--os", "macos", "--python", sys.executable,
                             "--python", str(odd))
    assert code == 0, err
    with plist_path(home).open("rb") as f:
        data = plistlib.load(f)
    assert set(data) == {"Label", "ProgramArguments", "RunAtLoad", "KeepAlive", "AbandonProcessGroup",
                         "ProcessType", "StandardOutPath", "StandardErrorPath", "SoftResourceLimits",
                         "HardResourceLimits", "EnvironmentVariables"}
    assert data["EnvironmentVariables"] == {"PATH": ":".join(dict.fromkeys(
        [os.path.dirname(this_gpulayerd()), "/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin",
         "/sbin"]))}
    assert data["SoftResourceLimits"] == data["HardResourceLimits"] == {"NumberOfFiles": 10240}
    assert data["Label"] == LAUNCHD_LABEL
    assert data["ProgramArguments"] == [this_gpulayerd(), "--python", sys.executable, "--python", str(odd)]
    assert data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}
    assert data["AbandonProcessGroup"] is True
    logs = home / "Library" / "Logs" / "gpulayer"
    assert data["StandardOutPath"] == data["StandardErrorPath"] == str(logs / "gpulayerd.log")
    assert logs.is_dir()  # launchd does not create it
    paths = [a for a in data["ProgramArguments"] if not a.startswith("--")]
    paths += [data["StandardOutPath"], data["StandardErrorPath"]]
    assert all(os.path.isabs(p) for p in paths), paths
    assert f"launchctl bootstrap gui/{os.getuid()} {plist_path(home)}" in out
    assert status_json(capsys, "--os", "macos")["enabled"] is None  # only launchctl knows


# ------------------------------------------------------------------ install / uninstall


@pytest.mark.parametrize("os_name", ["linux", "macos"])
def test_dry_run_prints_the_file_and_next_command_and_writes_nothing(
        home: Path, capsys: pytest.CaptureFixture[str], os_name: str) -> None:
    code, out, err = run_cli(capsys, "service", "install", "--os", os_name, "--python", sys.executable, "--dry-run")
    assert code == 0, err
    assert tree(home) == []
    if os_name == "linux":
        assert out == render_systemd_unit(this_gpulayerd(), [sys.executable])
        assert f"next: {START}" in err
    else:
        assert plistlib.loads(out.encode())["ProgramArguments"] == [this_gpulayerd(), "--python", sys.executable]
        assert f"next: launchctl bootstrap gui/{os.getuid()} {plist_path(home)}" in err
    assert "would write" in err
    code, _, _ = run_cli(capsys, "service", "install", "--os", os_name, "--python", sys.executable)
    assert code == 0
    target = unit_path(home) if os_name == "linux" else plist_path(home)
    assert target.read_text() == out  # the dry run printed exactly what install writes


@pytest.mark.parametrize("os_name", ["linux", "macos"])
def test_install_status_uninstall_leaves_nothing_behind(
        home: Path, capsys: pytest.CaptureFixture[str], os_name: str) -> None:
    assert status_json(capsys, "--os", os_name)["installed"] is False
    code, out, err = run_cli(capsys, "service", "install", "--os", os_name)
    assert code == 0, err
    target = unit_path(home) if os_name == "linux" else plist_path(home)
    assert target.is_file() and stat.S_IMODE(target.stat().st_mode) == 0o644
    if os_name == "linux":
        assert f"  {START}\n" in out and "loginctl enable-linger $USER" in out

    st = status_json(capsys, "--os", os_name)
    assert st["installed"] is True and st["file"] == "generated" and st["this_installation"] is True
    assert st["path"] == str(target) and st["gpulayerd"] == this_gpulayerd() and st["interpreters"] == []
    assert st["enabled"] is (False if os_name == "linux" else None)
    assert st["running"] is False and st["daemon"] is None and "no-daemon.sock" in st["problem"]
    code, text, _ = run_cli(capsys, "service", "status", "--os", os_name)
    assert code == 0 and "installed: yes" in text and "running:   no" in text

    code, out, err = run_cli(capsys, "service", "uninstall", "--os", os_name)
    assert code == 0, err
    assert f"removed {target}" in out
    assert tree(home) == []
    code, out, _ = run_cli(capsys, "service", "uninstall", "--os", os_name)
    assert code == 0 and "not installed" in out


def test_install_twice_changes_nothing(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "service", "install", "--os", "linux", "--python", sys.executable)[0] == 0
    before = unit_path(home).stat()
    code, out, _ = run_cli(capsys, "service", "install", "--os", "linux", "--python", sys.executable)
    assert code == 0 and "already installed" in out
    after = unit_path(home).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_own_file_for_other_paths_is_updated_without_force(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "service", "install", "--os", "linux", "--python", sys.executable)[0] == 0
    code, out, err = run_cli(capsys, "service", "install", "--os", "linux")
    assert code == 0, err
    assert out.startswith("updated") and "systemctl --user daemon-reload && systemctl --user restart gpulayerd" in out
    assert unit_path(home).read_text() == render_systemd_unit(this_gpulayerd(), [])


@pytest.mark.parametrize("os_name", ["linux", "macos"])
def test_hand_edited_file_is_refused_without_force(
        home: Path, capsys: pytest.CaptureFixture[str], os_name: str) -> None:
    assert run_cli(capsys, "service", "install", "--os", os_name)[0] == 0
    target = unit_path(home) if os_name == "linux" else plist_path(home)
    edited = (target.read_text().replace("RestartSec=5s", "RestartSec=1s") if os_name == "linux"
              else target.read_text().replace("<string>Standard</string>", "<string>Background</string>"))
    assert edited != target.read_text()
    target.write_text(edited)

    code, out, err = run_cli(capsys, "service", "install", "--os", os_name)
    assert code == cli.EXIT_FAILURE
    assert "changed by hand" in err and "--force" in err and out == ""
    assert target.read_text() == edited
    assert status_json(capsys, "--os", os_name)["file"] == "hand-edited"
    code, _, err = run_cli(capsys, "service", "uninstall", "--os", os_name)
    assert code == cli.EXIT_FAILURE and "changed by hand" in err and target.read_text() == edited

    code, out, err = run_cli(capsys, "service", "install", "--os", os_name, "--force")
    assert code == 0, err
    assert out.startswith("replaced")
    assert is_pristine(target.read_text()) and target.read_text() != edited
    assert run_cli(capsys, "service", "uninstall", "--os", os_name)[0] == 0
    assert tree(home) == []


def test_a_file_we_did_not_write_is_never_replaced_without_force(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unit_path(home).parent.mkdir(parents=True)
    unit_path(home).write_text("[Service]\nExecStart=/bin/true\n")
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux")
    assert code == cli.EXIT_FAILURE and "changed by hand" in err
    assert unit_path(home).read_text() == "[Service]\nExecStart=/bin/true\n"


def test_enabled_unit_must_be_disabled_first(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "service", "install", "--os", "linux")[0] == 0
    wants = unit_path(home).parent / "default.target.wants"
    wants.mkdir()
    (wants / "gpulayerd.service").symlink_to(unit_path(home))  # what "systemctl --user enable" does
    assert status_json(capsys, "--os", "linux")["enabled"] is True

    code, _, err = run_cli(capsys, "service", "uninstall", "--os", "linux")
    assert code == cli.EXIT_FAILURE
    assert "still enabled" in err and "systemctl --user disable --now gpulayerd" in err
    assert unit_path(home).is_file()
    code, _, _ = run_cli(capsys, "service", "uninstall", "--os", "linux", "--dry-run")
    assert code == cli.EXIT_FAILURE and unit_path(home).is_file()  # --dry-run does not bypass the check

    code, _, err = run_cli(capsys, "service", "uninstall", "--os", "linux", "--force")
    assert code == 0, err
    assert tree(home) == []


def test_uninstall_dry_run_removes_nothing(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "service", "install", "--os", "linux")[0] == 0
    code, out, _ = run_cli(capsys, "service", "uninstall", "--os", "linux", "--dry-run")
    assert code == 0 and f"would remove {unit_path(home)}" in out
    assert unit_path(home).is_file()


def test_macos_uninstall_keeps_logs(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "service", "install", "--os", "macos")[0] == 0
    log = home / "Library" / "Logs" / "gpulayer" / "gpulayerd.log"
    log.write_text("INFO gpulayerd.daemon: ...\n")
    code, out, _ = run_cli(capsys, "service", "uninstall", "--os", "macos")
    assert code == 0 and "kept the logs" in out and log.is_file()
    assert f"launchctl bootout gui/{os.getuid()}/{LAUNCHD_LABEL}" in out
    assert not plist_path(home).exists()


# ------------------------------------------------------------------------- paths, flags


def test_xdg_config_home_is_honored_when_absolute(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "h"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    assert service_target("linux", env).path == tmp_path / "cfg" / "systemd" / "user" / "gpulayerd.service"
    env["XDG_CONFIG_HOME"] = "relative/cfg"  # invalid per the XDG spec: ignored
    assert service_target("linux", env).path == tmp_path / "h" / ".config" / "systemd" / "user" / "gpulayerd.service"
    mac = service_target("macos", env)
    assert mac.path == tmp_path / "h" / "Library" / "LaunchAgents" / "io.gpulayer.gpulayerd.plist"
    assert mac.enabled_link is None


def test_install_honors_xdg_config_home(home: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "cfg"))
    assert run_cli(capsys, "service", "install", "--os", "linux")[0] == 0
    assert (home / "cfg" / "systemd" / "user" / "gpulayerd.service").is_file()


def test_interpreters_become_absolute_and_symlinks_stay(home: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = home / "bin"
    executable(bin_dir / "fakepython")
    (bin_dir / "venvpython").symlink_to(sys.executable)  # a venv's python is a symlink: keep it
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(home)
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux", "--python", "fakepython",
                           "--python", "bin/venvpython", "--python", "fakepython")
    assert code == 0, err
    assert status_json(capsys, "--os", "linux")["interpreters"] == [str(bin_dir / "fakepython"),
                                                                    str(bin_dir / "venvpython")]


@pytest.mark.parametrize("python", ["/no/such/python", "no-such-python-anywhere", "{tmp}/not-executable",
                                    "{tmp}"])
def test_bad_interpreter_is_a_usage_error(home: Path, capsys: pytest.CaptureFixture[str], python: str) -> None:
    (home.parent / "not-executable").write_text("print()\n")
    python = python.replace("{tmp}", str(home.parent))
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux", "--python", python)
    assert code == cli.EXIT_USAGE and f"--python {python}" in err
    assert tree(home) == []


def test_gpulayerd_is_found_next_to_this_interpreter() -> None:
    beside = Path(sys.executable).parent / "gpulayerd"
    if beside.is_file():
        assert find_gpulayerd() == os.path.abspath(beside)
    else:
        assert find_gpulayerd() is not None


def test_missing_gpulayerd_fails_clearly(home: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpulayerd.host.service_user.find_gpulayerd", lambda: None)
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux")
    assert code == cli.EXIT_FAILURE and "cannot find this installation's gpulayerd" in err


@pytest.mark.parametrize("argv", [["service"], ["service", "install", "--os", "windows"], ["service", "start"]])
def test_service_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert run_cli(capsys, *argv)[0] == cli.EXIT_USAGE


# ------------------------------------------------------------------------------ sd_notify


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "notify.sock"
    if len(os.fsencode(path)) > 100:  # unix socket paths are short
        path = Path(f"/tmp/gl-notify-{uuid.uuid4().hex[:8]}.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(5.0)
        try:
            yield s, str(path)
        finally:
            path.unlink(missing_ok=True)


def test_notify_sends_one_datagram(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path}
    assert notify_ready("serving /run/x.sock", environ=env)
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving /run/x.sock"
    assert notify_stopping(environ=env)
    assert sock.recv(4096) == b"STOPPING=1"
    assert notify_status("two\nlines", environ=env)
    assert sock.recv(4096) == b"STATUS=two lines"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets are Linux-only")
def test_notify_abstract_socket() -> None:
    name = f"gpulayer-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(b"\0" + name.encode())
        s.settimeout(5.0)
        assert notify("READY=1", environ={"NOTIFY_SOCKET": f"@{name}"})
        assert s.recv(4096) == b"READY=1"


def test_notify_reads_the_process_environment(notify_socket: tuple[socket.socket, str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify_ready()
    assert sock.recv(4096) == b"READY=1"


@pytest.mark.parametrize("value", [None, "", "relative.sock", "vsock:2:1234", "/no/such/dir/notify.sock",
                                   "/" + "x" * 300, "/tmp/nul\0byte", "@"])
def test_notify_without_a_usable_socket_does_nothing_and_never_raises(
        monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    env = {} if value is None else {"NOTIFY_SOCKET": value}
    assert notify_ready(environ=env) is False or value == "@"  # "@" is a valid (empty) abstract name
    assert isinstance(notify_stopping(environ=env), bool)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify_ready() is False
