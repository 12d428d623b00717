"""``gpulayer service install|status|uninstall --system``: the system unit and the LaunchDaemon.

Written into a temporary root (``--root``), as root (tests run as root): the owner and mode
the installer sets are the real ones. The system unit is checked with ``systemd-analyze
verify`` (system scope; works as root without a running systemd).
"""

from __future__ import annotations

import configparser
import os
import plistlib
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpulayerd import cli
from gpulayerd.host.service_system import render_launchd_daemon, render_systemd_system_unit, set_system_owner
from gpulayerd.host.service_user import LAUNCHD_LABEL, PLACEHOLDER_GPULAYERD, find_gpulayerd, is_pristine

REPO_ROOT = Path(__file__).resolve().parents[3]
REPO_SYSTEM_UNIT = REPO_ROOT / "systemd" / "gpulayerd-system.service"
REPO_DAEMON_PLIST = REPO_ROOT / "launchd" / "io.gpulayer.gpulayerd.system.plist"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tree standing for /; no daemon answers on the CLI's socket."""
    r = tmp_path / "root"
    r.mkdir()
    monkeypatch.setenv("GPULAYER_SOCKET", str(tmp_path / "no-daemon.sock"))
    return r


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def this_gpulayerd() -> str:
    found = find_gpulayerd()
    assert found is not None
    return found


def verify_system_unit(unit: Path) -> list[str]:
    """``systemd-analyze verify`` (system scope) of ``unit``: the lines naming it ([] = clean)."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze not found: install Debian's systemd package")
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    r = subprocess.run([exe, "verify", "--man=no", "--generators=no", str(unit)], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 0, f"systemd-analyze verify {unit} exited {r.returncode}:\n" + "\n".join(lines)
    return [ln for ln in lines if "gpulayerd" in ln]


def settings(text: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    return cp


def test_system_unit_runs_gpulayerd_system_as_root_and_passes_verify(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "service", "install", "--system", "--os", "linux", "--root", str(root))
    assert code == 0, err
    unit = root / "etc" / "systemd" / "system" / "gpulayerd.service"
    st = unit.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)
    service = settings(unit.read_text())["Service"]
    assert service["ExecStart"] == f"{this_gpulayerd()} --system"
    assert os.path.isabs(service["ExecStart"].split()[0])
    assert "User" not in service and "DynamicUser" not in service  # root: it starts each job as its user
    assert service["LimitNOFILE"] == "65536"
    assert (service["KillMode"], service["NoNewPrivileges"], service["PrivateTmp"]) == ("process", "yes", "no")
    assert settings(unit.read_text())["Install"]["WantedBy"] == "multi-user.target"
    assert "  sudo systemctl daemon-reload && sudo systemctl enable --now gpulayerd\n" in out
    assert verify_system_unit(unit) == []


def test_repo_system_files_are_the_renderings_and_the_unit_passes_verify(tmp_path: Path) -> None:
    assert REPO_SYSTEM_UNIT.read_text() == render_systemd_system_unit(PLACEHOLDER_GPULAYERD, [])
    assert REPO_DAEMON_PLIST.read_text() == render_launchd_daemon(PLACEHOLDER_GPULAYERD, [],
                                                                  "/Library/Logs/gpulayer/gpulayerd.log")
    assert is_pristine(REPO_SYSTEM_UNIT.read_text()) and is_pristine(REPO_DAEMON_PLIST.read_text())
    unit = tmp_path / "gpulayerd.service"
    unit.write_text(REPO_SYSTEM_UNIT.read_text().replace(f"ExecStart={PLACEHOLDER_GPULAYERD}",
                                                         f"ExecStart={this_gpulayerd()}"))
    assert verify_system_unit(unit) == []


def test_verify_catches_a_bad_limit_in_the_system_unit(tmp_path: Path) -> None:
    unit = tmp_path / "gpulayerd.service"
    unit.write_text(render_systemd_system_unit(this_gpulayerd(), []).replace("LimitNOFILE=65536",
                                                                             "LimitNOFILE=lots"))
    assert any("LimitNOFILE" in c or "resource value" in c for c in verify_system_unit(unit))


def test_launch_daemon_is_roots_0644_with_absolute_paths_and_no_user_name(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "service", "install", "--system", "--os", "macos", "--root", str(root),
                             "--python", "/usr/bin/python3")
    assert code == 0, err
    plist = root / "Library" / "LaunchDaemons" / f"{LAUNCHD_LABEL}.plist"
    st = plist.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)  # root:wheel on macOS
    with plist.open("rb") as f:
        data = plistlib.load(f)
    assert "UserName" not in data and "GroupName" not in data
    assert data["Label"] == LAUNCHD_LABEL
    assert data["ProgramArguments"] == [this_gpulayerd(), "--system", "--python", "/usr/bin/python3"]
    assert data["SoftResourceLimits"] == data["HardResourceLimits"] == {"NumberOfFiles": 10240}
    assert data["StandardOutPath"] == data["StandardErrorPath"] == "/Library/Logs/gpulayer/gpulayerd.log"
    paths = [a for a in data["ProgramArguments"] if not a.startswith("--")] + [data["StandardOutPath"]]
    assert all(os.path.isabs(p) for p in paths), paths
    logs = root / "Library" / "Logs" / "gpulayer"
    assert logs.is_dir() and stat.S_IMODE(logs.stat().st_mode) == 0o755 and logs.stat().st_uid == 0
    assert f"sudo launchctl bootstrap system /Library/LaunchDaemons/{LAUNCHD_LABEL}.plist" in out


def test_set_system_owner_makes_a_users_file_roots(tmp_path: Path) -> None:
    f = tmp_path / "x.plist"
    f.write_text("x")
    os.chown(f, 1234, 1234)
    f.chmod(0o666)
    set_system_owner(f)
    st = f.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o644)


def test_system_install_status_uninstall(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "service", "status", "--system", "--os", "linux", "--root", str(root))
    assert code == 0 and "systemd system unit" in out and "sudo gpulayer service install --system" in out
    assert run_cli(capsys, "service", "install", "--system", "--os", "linux", "--root", str(root))[0] == 0
    code, out, _ = run_cli(capsys, "service", "install", "--system", "--os", "linux", "--root", str(root))
    assert code == 0 and "already installed" in out
    code, out, _ = run_cli(capsys, "service", "status", "--system", "--os", "linux", "--root", str(root))
    assert code == 0 and "installed: yes" in out and "enabled:   no" in out
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir()
    (wants / "gpulayerd.service").symlink_to("../gpulayerd.service")
    code, _, err = run_cli(capsys, "service", "uninstall", "--system", "--os", "linux", "--root", str(root))
    assert code == 1 and "sudo systemctl disable --now gpulayerd" in err
    (wants / "gpulayerd.service").unlink()
    code, out, _ = run_cli(capsys, "service", "uninstall", "--system", "--os", "linux", "--root", str(root))
    assert code == 0 and "removed" in out
    assert not (root / "etc" / "systemd" / "system" / "gpulayerd.service").exists()


def test_system_install_needs_root(root: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, _, err = run_cli(capsys, "service", "install", "--system", "--os", "linux", "--root", str(root))
    assert code == 1 and "sudo" in err
    assert list(root.iterdir()) == []
    code, out, _ = run_cli(capsys, "service", "install", "--system", "--os", "linux", "--dry-run")
    assert code == 0 and "--system" in out  # a dry run writes nothing: no root needed


def test_root_without_system_is_a_usage_error(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "service", "install", "--os", "linux", "--root", str(root))
    assert code == 2 and "--root goes with --system" in err
