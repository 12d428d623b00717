"""gpulayerd as a systemd user unit or a launchd agent: the files, where they go, how they are written.

System mode (the lab install, run as root) has its own renderings in :mod:`gpulayerd.host.service_system`
and its targets here (:func:`system_service_target`).

Linux gets a systemd *user* unit (``~/.config/systemd/user/gpulayerd.service``, or under
``$XDG_CONFIG_HOME``), macOS a LaunchAgent (``~/Library/LaunchAgents/io.gpulayer.gpulayerd.plist``).
Both run this installation's ``gpulayerd`` (found next to ``sys.executable``) with the
chosen ``--python`` interpreters, as absolute paths.

A rendered file carries the SHA-256 of the rest of its text in a header comment, so a
file changed by hand is told apart from one this command wrote: ``install`` and
``uninstall`` refuse to replace or remove a changed file without ``--force``. Nothing
here runs ``systemctl`` or ``launchctl``. The ``gpulayer service`` commands are in
:mod:`gpulayerd.cli.service`; this module knows nothing of the CLI.
The repo's ``systemd/gpulayerd.service`` and ``launchd/io.gpulayer.gpulayerd.plist``
are these renderings with placeholder paths (:data:`PLACEHOLDER_GPULAYERD`,
:data:`PLACEHOLDER_HOME`); a test keeps them in sync.
"""

from __future__ import annotations

import hashlib
import os
import plistlib
import re
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from xml.sax.saxutils import escape

from gpulayerd.host.atomic import write_atomic
from gpulayerd.host.service_system import (
    LAUNCHD_LABEL,
    render_launchd_daemon,
    render_systemd_system_unit,
    set_system_owner,
)
from gpulayerd.host.service_system import seal as _seal
from gpulayerd.host.service_system import systemd_arg as _systemd_arg

__all__ = [
    "LAUNCHD_LABEL",
    "PLACEHOLDER_GPULAYERD",
    "PLACEHOLDER_HOME",
    "SYSTEMD_UNIT_NAME",
    "FileState",
    "OsName",
    "ServiceTarget",
    "file_state",
    "find_gpulayerd",
    "is_pristine",
    "prune_empty_dirs",
    "read_service_file",
    "render_launchd_plist",
    "render_systemd_unit",
    "service_argv",
    "service_target",
    "system_service_target",
    "write_service_file",
]

OsName = Literal["linux", "macos"]
FileState = Literal["missing", "current", "outdated", "modified"]
"""``current``: exactly what we would render now; ``outdated``: written by us, unchanged since,
but rendered for other paths; ``modified``: changed by hand (or never ours)."""

SYSTEMD_UNIT_NAME = "gpulayerd.service"
PLACEHOLDER_GPULAYERD = "/usr/local/bin/gpulayerd"
PLACEHOLDER_HOME = "/Users/you"

_DIGEST_RE = re.compile(r"gpulayer-sha256: ([0-9a-f]{64})")

_SYSTEMD_UNIT = """\
# gpulayerd as a systemd *user* service: one daemon per user, running as that user.
# "gpulayer service install" writes it, with this installation's paths, as
# ~/.config/systemd/user/gpulayerd.service; then:
#   systemctl --user daemon-reload && systemctl --user enable --now gpulayerd
#   loginctl enable-linger $USER    (keeps it running without a login session)
# Change settings with "systemctl --user edit gpulayerd" (a drop-in, kept on reinstall).

[Unit]
Description=gpulayer daemon: shares this workstation's GPUs with the lab

[Service]
# gpulayerd sends READY=1 to $NOTIFY_SOCKET once its local API answers on its unix socket
# (so "systemctl --user start" returns when gpulayer commands work), STOPPING=1 on SIGTERM.
Type=notify
# Only gpulayerd itself may notify: its jobs inherit NOTIFY_SOCKET with its environment.
NotifyAccess=main
ExecStart={exec_start}
Restart=on-failure
RestartSec=5s
# Stop gpulayerd only, never its jobs. Each job runs in a session of its own under a
# per-job watchdog process, inside this unit's cgroup: the default KillMode=control-group
# would kill every running job on "systemctl --user stop/restart gpulayerd". With
# "process" SIGTERM goes to gpulayerd alone, the jobs go on, and the restarted daemon
# re-adopts them (systemd then notes "left-over process" lines; that is expected).
# Stop a job with "gpulayer cancel". Jobs still end when the user's service manager
# stops (logout without linger, shutdown).
KillMode=process
TimeoutStopSec=30s
# Room for many peers, clients and jobs: a file limit (soft and hard) above the usual 1024;
# gpulayerd raises its soft limit to the hard one at start.
LimitNOFILE=65536
# journald timestamps every line; gpulayerd leaves out its own when JOURNAL_STREAM is set.
# Read with: journalctl --user -u gpulayerd
StandardOutput=journal
StandardError=journal
SyslogIdentifier=gpulayerd

# Hardening, mild on purpose: jobs are the user's own programs and need what a login
# shell gives them.
# No privilege gain through setuid/setgid binaries or file capabilities, for gpulayerd
# and every job (a job cannot use sudo or a setuid container runtime).
NoNewPrivileges=yes
# The machine's real /tmp: the device locks in /tmp/gpulayer-locks are shared by every
# user's gpulayerd on this machine (a private /tmp would let two daemons grant the same
# GPU), and jobs may exchange files in /tmp.
PrivateTmp=no
# No realtime scheduling: a runaway job at realtime priority can freeze the workstation.
RestrictRealtime=yes
# No personality(2) changes (execution domains); no job needs one.
LockPersonality=yes
# Deliberately not set:
# - PrivateDevices=, DevicePolicy=, DeviceAllow=: jobs must reach the GPU device nodes
#   (/dev/nvidia*, /dev/nvidia-uvm, /dev/dri/*, /dev/kfd).
# - ProtectSystem=, ProtectHome=, ReadWritePaths=: jobs write their work directories
#   anywhere in $HOME and on shared filesystems (NFS, /scratch).
# - MemoryDenyWriteExecute=: JIT compilers (PyTorch, Triton, CUDA's PTX JIT, numba)
#   need memory that is writable and executable.
# - SystemCallFilter=, RestrictNamespaces=: jobs may run containers (user namespaces)
#   and make any system call a scientific program makes.

[Install]
WantedBy=default.target
"""

# XML comments must not contain two hyphens in a row: no option names in them.
_LAUNCHD_PLIST = """\
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- gpulayerd as a launchd agent of the logged-in user. "gpulayer service install" writes it,
     with this installation's paths, as ~/Library/LaunchAgents/io.gpulayer.gpulayerd.plist;
     then: launchctl bootstrap gui/$UID ~/Library/LaunchAgents/io.gpulayer.gpulayerd.plist -->
<plist version="1.0">
<dict>
\t<key>Label</key>
\t<string>{label}</string>
\t<key>ProgramArguments</key>
\t<array>
{program_arguments}\t</array>
\t<!-- launchd gives an agent only /usr/bin:/bin:/usr/sbin:/sbin: without this PATH, tools from
\t     Homebrew or /usr/local (and python3 there) are invisible to gpulayerd and to its probes. -->
\t<key>EnvironmentVariables</key>
\t<dict>
\t\t<key>PATH</key>
\t\t<string>{path}</string>
\t</dict>
\t<key>RunAtLoad</key>
\t<true/>
\t<!-- Start again after a crash or a failed start (at most every 10 s), not after a clean stop. -->
\t<key>KeepAlive</key>
\t<dict>
\t\t<key>SuccessfulExit</key>
\t\t<false/>
\t</dict>
\t<!-- Stop gpulayerd only, never its jobs: they must survive a restart of the daemon, which
\t     re-adopts them. Jobs and their watchdogs run in sessions of their own; this also keeps
\t     launchd from killing what is left of gpulayerd's process group when it exits. -->
\t<key>AbandonProcessGroup</key>
\t<true/>
\t<!-- Unspecified, launchd throttles the CPU and I/O of the agent and of the jobs it starts. -->
\t<key>ProcessType</key>
\t<string>Standard</string>
\t<!-- Room for many peers, clients and jobs: launchd starts agents with 256 open files. -->
\t<key>SoftResourceLimits</key>
\t<dict>
\t\t<key>NumberOfFiles</key>
\t\t<integer>10240</integer>
\t</dict>
\t<key>HardResourceLimits</key>
\t<dict>
\t\t<key>NumberOfFiles</key>
\t\t<integer>10240</integer>
\t</dict>
\t<!-- No journal here: one file, and gpulayerd writes its own timestamps. -->
\t<key>StandardOutPath</key>
\t<string>{log_path}</string>
\t<key>StandardErrorPath</key>
\t<string>{log_path}</string>
</dict>
</plist>
"""


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    """Where the service file of one OS lives for one user.

    Attributes:
        os_name: ``linux`` (systemd user unit) or ``macos`` (launchd agent).
        home: the user's home directory; empty directories left by ``uninstall`` are
            removed up to it.
        path: the unit or plist file.
        enabled_link: systemd's ``default.target.wants`` symlink that ``systemctl --user
            enable`` creates; None for launchd (only ``launchctl`` knows).
        logs_dir: launchd's log directory (the agent's stdout/stderr); None for systemd.
        system: a system-mode service (systemd system unit, LaunchDaemon) rather than a user's.
        root: the tree the paths are under (``/`` but for packaging and tests).
    """

    os_name: OsName
    home: Path
    path: Path
    enabled_link: Path | None
    logs_dir: Path | None
    system: bool = False
    root: Path = Path("/")

    @property
    def kind(self) -> str:
        """``systemd user unit``, ``launchd agent``, ``systemd system unit`` or ``launchd daemon``."""
        if self.system:
            return "systemd system unit" if self.os_name == "linux" else "launchd daemon"
        return "systemd user unit" if self.os_name == "linux" else "launchd agent"

    def live(self, path: Path) -> Path:
        """Where ``path`` (under :attr:`root`) is once the tree is in place, e.g. in printed commands."""
        return Path("/") / path.relative_to(self.root)

    def render(self, gpulayerd: str, interpreters: Sequence[str]) -> str:
        """The file's text for these absolute paths."""
        if self.system:
            if self.os_name == "linux":
                return render_systemd_system_unit(gpulayerd, interpreters)
            assert self.logs_dir is not None
            return render_launchd_daemon(gpulayerd, interpreters, str(self.live(self.logs_dir) / "gpulayerd.log"))
        if self.os_name == "linux":
            return render_systemd_unit(gpulayerd, interpreters)
        assert self.logs_dir is not None
        return render_launchd_plist(gpulayerd, interpreters, str(self.logs_dir / "gpulayerd.log"))

    def start_command(self, *, update: bool = False) -> str:
        """The command that (re)loads and starts the service after the file was written."""
        if self.system:
            if self.os_name == "linux":
                action = "restart gpulayerd" if update else "enable --now gpulayerd"
                return f"sudo systemctl daemon-reload && sudo systemctl {action}"
            bootstrap = f"sudo launchctl bootstrap system {shlex.quote(str(self.live(self.path)))}"
            return f"sudo launchctl bootout system/{LAUNCHD_LABEL}; {bootstrap}" if update else bootstrap
        if self.os_name == "linux":
            action = "restart gpulayerd" if update else "enable --now gpulayerd"
            return f"systemctl --user daemon-reload && systemctl --user {action}"
        bootstrap = f"launchctl bootstrap gui/{os.getuid()} {shlex.quote(str(self.path))}"
        return f"launchctl bootout gui/{os.getuid()}/{LAUNCHD_LABEL}; {bootstrap}" if update else bootstrap

    def stop_command(self) -> str:
        """The command that stops the service (running jobs go on)."""
        if self.system:
            if self.os_name == "linux":
                return "sudo systemctl disable --now gpulayerd"
            return f"sudo launchctl bootout system/{LAUNCHD_LABEL}"
        if self.os_name == "linux":
            return "systemctl --user disable --now gpulayerd"
        return f"launchctl bootout gui/{os.getuid()}/{LAUNCHD_LABEL}"


def service_target(os_name: OsName, environ: Mapping[str, str] | None = None) -> ServiceTarget:
    """The service file's location for ``os_name``, from ``$HOME`` (and ``$XDG_CONFIG_HOME`` on Linux).

    A relative ``XDG_CONFIG_HOME`` is ignored, as the XDG spec says.
    """
    env = os.environ if environ is None else environ
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    if os_name == "linux":
        xdg = env.get("XDG_CONFIG_HOME", "")
        unit_dir = (Path(xdg) if os.path.isabs(xdg) else home / ".config") / "systemd" / "user"
        return ServiceTarget("linux", home, unit_dir / SYSTEMD_UNIT_NAME,
                             unit_dir / "default.target.wants" / SYSTEMD_UNIT_NAME, None)
    return ServiceTarget("macos", home, home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist", None,
                         home / "Library" / "Logs" / "gpulayer")


def system_service_target(os_name: OsName, root: Path = Path("/")) -> ServiceTarget:
    """The system-mode service file's location (``/etc/systemd/system``, ``/Library/LaunchDaemons``) under ``root``.

    ``root`` is ``/`` except to build a tree for packaging (``--root``) or in tests.
    """
    if os_name == "linux":
        unit_dir = root / "etc" / "systemd" / "system"
        return ServiceTarget("linux", unit_dir, unit_dir / SYSTEMD_UNIT_NAME,
                             unit_dir / "multi-user.target.wants" / SYSTEMD_UNIT_NAME, None, True, root)
    daemons = root / "Library" / "LaunchDaemons"
    return ServiceTarget("macos", daemons, daemons / f"{LAUNCHD_LABEL}.plist", None,
                         root / "Library" / "Logs" / "gpulayer", True, root)


def render_systemd_unit(gpulayerd: str, interpreters: Sequence[str]) -> str:
    """The systemd user unit running ``gpulayerd --python P ...``, sealed with its digest header."""
    argv = [gpulayerd, *(a for p in interpreters for a in ("--python", p))]
    body = _SYSTEMD_UNIT.replace("{exec_start}", " ".join(_systemd_arg(a) for a in argv))
    return _seal(body, 0, lambda d: f"# gpulayer-sha256: {d} (written by \"gpulayer service install\", which "
                                    "replaces a changed file only with --force)\n")


LAUNCHD_PATH: tuple[str, ...] = ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")
"""The agent's PATH after this installation's own ``bin``: Homebrew (Apple silicon, then Intel) before the
system's directories, instead of launchd's bare ``/usr/bin:/bin:/usr/sbin:/sbin``."""


def render_launchd_plist(gpulayerd: str, interpreters: Sequence[str], log_path: str) -> str:
    """The LaunchAgent plist running ``gpulayerd --python P ...``, logging to ``log_path``, sealed; its
    ``EnvironmentVariables`` PATH is ``gpulayerd``'s directory, then :data:`LAUNCHD_PATH`."""
    argv = [gpulayerd, *(a for p in interpreters for a in ("--python", p))]
    path = ":".join(dict.fromkeys([os.path.dirname(gpulayerd), *LAUNCHD_PATH]))
    body = (_LAUNCHD_PLIST.replace("{label}", LAUNCHD_LABEL)
            .replace("{path}", escape(path))
            .replace("{program_arguments}", "".join(f"\t\t<string>{escape(a)}</string>\n" for a in argv))
            .replace("{log_path}", escape(log_path)))
    return _seal(body, 1, lambda d: f"<!-- gpulayer-sha256: {d} (written by gpulayer service install, which "
                                    "replaces a changed file only when forced) -->\n")


def is_pristine(text: str) -> bool:
    """Whether ``text`` is a rendering of ours, unchanged: its header digest matches the rest."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines[:3]):
        m = _DIGEST_RE.search(line)
        if m is not None:
            rest = "".join(lines[:i] + lines[i + 1:])
            return hashlib.sha256(rest.encode("utf-8")).hexdigest() == m.group(1)
    return False


def file_state(text: str | None, rendered: str) -> FileState:
    """Compare the file on disk (None: no file) with what we would write now."""
    if text is None:
        return "missing"
    if text == rendered:
        return "current"
    return "outdated" if is_pristine(text) else "modified"


def find_gpulayerd() -> str | None:
    """Absolute path of THIS installation's ``gpulayerd`` script, or None.

    Looks next to ``sys.executable`` (a virtual environment's ``bin/``), then in this
    interpreter's scripts directory, then (outside a virtual environment) in the user
    scheme's (``pip install --user``). Never on ``$PATH``: that may be another installation.
    """
    dirs = [os.path.dirname(os.path.abspath(sys.executable))] if sys.executable else []
    dirs.append(sysconfig.get_path("scripts"))
    if sys.prefix == sys.base_prefix:
        dirs.append(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user")))
    for d in dirs:
        found = shutil.which("gpulayerd", path=d)
        if found is not None:
            return os.path.abspath(found)
    return None


def read_service_file(path: Path) -> str | None:
    """The text of the service file at ``path`` (undecodable bytes replaced), or None when there is none."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def write_service_file(target: ServiceTarget, text: str) -> None:
    """Write ``text`` as ``target``'s service file (mode 0644), atomically, creating its directories.

    For launchd also creates the log directory (launchd does not). A system target's file
    (and log directory) is made root's (:func:`~gpulayerd.host.service_system.set_system_owner`).
    Raises ``OSError``.
    """
    target.path.parent.mkdir(parents=True, exist_ok=True)
    if target.logs_dir is not None:
        target.logs_dir.mkdir(parents=True, exist_ok=True)  # launchd does not create it
    write_atomic(target.path, text, mode=0o644)
    if target.system:
        set_system_owner(target.path)
        if target.logs_dir is not None:
            set_system_owner(target.logs_dir, 0o755)


def prune_empty_dirs(start: Path, stop: Path) -> None:
    """Remove ``start`` and its parents while they are empty, stopping below ``stop``."""
    d = start
    while stop in d.parents:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


def service_argv(text: str, os_name: OsName) -> list[str]:
    """The command line a service file runs (best effort; [] when it cannot be read)."""
    if os_name == "macos":
        try:
            data = plistlib.loads(text.encode("utf-8"))
        except (plistlib.InvalidFileException, ValueError):
            return []
        args = data.get("ProgramArguments") if isinstance(data, dict) else None
        return [str(a) for a in args] if isinstance(args, list) else []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ExecStart":
            try:
                return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]
            except ValueError:
                return []
    return []
