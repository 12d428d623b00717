"""gpulayerd in system mode, the lab install: a systemd system unit or a launchd daemon, run as root.

``sudo gpulayer service install --system`` writes ``/etc/systemd/system/gpulayerd.service``
(Linux) or ``/Library/LaunchDaemons/io.gpulayer.gpulayerd.plist`` (macOS, owned root:wheel,
mode 0644, as launchd demands of a daemon's plist). Both run ``gpulayerd --system`` as root,
with no ``User=``/``UserName``: the daemon starts each job as the user who submitted it.
The renderings are sealed like the user ones (:mod:`gpulayerd.host.service_user`); the repo keeps them
with placeholder paths as ``systemd/gpulayerd-system.service`` and
``launchd/io.gpulayer.gpulayerd.system.plist``. The sealing and the ExecStart quoting shared
with the user renderings live here too (:func:`seal`, :func:`systemd_arg`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["LAUNCHD_LABEL", "SYSTEM_FILE_MODE", "closed_to_others", "render_launchd_daemon",
           "render_systemd_system_unit", "seal", "set_system_owner", "shared_install_problem", "systemd_arg"]

LAUNCHD_LABEL = "io.gpulayer.gpulayerd"
"""The launchd label of gpulayerd, agent or daemon."""
_SYSTEMD_PLAIN_ARG = re.compile(r"[A-Za-z0-9_@%$+=:,./-]+")

SYSTEM_FILE_MODE = 0o644
"""A system service file's mode: root writes, everyone reads (launchd refuses a daemon plist writable by others)."""

_SYSTEMD_SYSTEM_UNIT = """\
# gpulayerd in system mode: one daemon per machine, run as root, starting each job as the
# user who submitted it. "sudo gpulayer service install --system" writes it, with this
# installation's paths, as /etc/systemd/system/gpulayerd.service; then:
#   sudo systemctl daemon-reload && sudo systemctl enable --now gpulayerd
# State: /var/lib/gpulayer (0700). Socket: /run/gpulayer/gpulayerd.sock (0666; every local
# account submits through it, and each request's user comes from the kernel).
# Change settings with "systemctl edit gpulayerd" (a drop-in, kept on reinstall).

[Unit]
Description=gpulayer daemon (system mode): shares this machine's GPUs with the lab
# The peer API and mDNS need the network; jobs' work directories may be on NFS; the users
# whose jobs are started must be known (LDAP, SSSD).
Wants=network-online.target
After=network-online.target remote-fs.target nss-user-lookup.target

[Service]
# gpulayerd sends READY=1 to $NOTIFY_SOCKET once its local API answers on its unix socket
# (so "systemctl start" returns when gpulayer commands work), STOPPING=1 on SIGTERM.
Type=notify
# Only gpulayerd itself may notify, never one of its jobs.
NotifyAccess=main
ExecStart={exec_start}
Restart=on-failure
RestartSec=5s
# Stop gpulayerd only, never its jobs: with the default KillMode=control-group
# "systemctl restart gpulayerd" would kill every user's running job. The jobs go on under
# their watchdogs, and the restarted daemon re-adopts them.
KillMode=process
TimeoutStopSec=30s
# Room for many peers, clients and jobs: a file limit (soft and hard) above the usual 1024;
# gpulayerd raises its soft limit to the hard one at start.
LimitNOFILE=65536
# journald timestamps every line; gpulayerd leaves out its own when JOURNAL_STREAM is set.
# Read with: journalctl -u gpulayerd
StandardOutput=journal
StandardError=journal
SyslogIdentifier=gpulayerd

# Hardening, mild on purpose: the jobs are users' own programs, started from here.
# No privilege gain through setuid/setgid binaries or file capabilities, for gpulayerd and
# every job. Root dropping to a user (setgroups, setgid, setuid before a job's exec) is a
# loss of privilege, not a gain, and works under it.
NoNewPrivileges=yes
# The machine's real /tmp: the lock files in /tmp/gpulayer-locks (one daemon per machine,
# one job per GPU) are shared with any other gpulayerd, and jobs may exchange files in /tmp.
PrivateTmp=no
# No realtime scheduling: a runaway job at realtime priority can freeze the machine.
RestrictRealtime=yes
# No personality(2) changes (execution domains); no job needs one.
LockPersonality=yes
# Deliberately not set:
# - User=, DynamicUser=: gpulayerd must be root to start each job as its user.
# - PrivateDevices=, DevicePolicy=, DeviceAllow=: jobs must reach the GPU device nodes.
# - ProtectSystem=, ProtectHome=, ReadWritePaths=: jobs write their work directories
#   anywhere in their users' homes and on shared filesystems (NFS, /scratch).
# - MemoryDenyWriteExecute=: JIT compilers (PyTorch, Triton, CUDA's PTX JIT, numba).
# - SystemCallFilter=, RestrictNamespaces=: jobs may run containers and make any system
#   call a scientific program makes.

[Install]
WantedBy=multi-user.target
"""

# XML comments must not contain two hyphens in a row: no option names in them.
_LAUNCHD_DAEMON = """\
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- gpulayerd in system mode: one daemon per machine, run as root (no UserName), starting each
     job as the user who submitted it. "sudo gpulayer service install" with the system flag writes
     it as /Library/LaunchDaemons/io.gpulayer.gpulayerd.plist (root:wheel, 0644); then:
     sudo launchctl bootstrap system /Library/LaunchDaemons/io.gpulayer.gpulayerd.plist -->
<plist version="1.0">
<dict>
\t<key>Label</key>
\t<string>{label}</string>
\t<key>ProgramArguments</key>
\t<array>
{program_arguments}\t</array>
\t<key>RunAtLoad</key>
\t<true/>
\t<!-- Start again after a crash or a failed start (at most every 10 s), not after a clean stop. -->
\t<key>KeepAlive</key>
\t<dict>
\t\t<key>SuccessfulExit</key>
\t\t<false/>
\t</dict>
\t<!-- Stop gpulayerd only, never its jobs: they survive a restart of the daemon, which
\t     re-adopts them. -->
\t<key>AbandonProcessGroup</key>
\t<true/>
\t<!-- Unspecified, launchd throttles the CPU and I/O of the daemon and of the jobs it starts. -->
\t<key>ProcessType</key>
\t<string>Standard</string>
\t<!-- Room for many peers, clients and jobs: launchd starts daemons with 256 open files. -->
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


def render_systemd_system_unit(gpulayerd: str, interpreters: Sequence[str]) -> str:
    """The systemd system unit running ``gpulayerd --system --python P ...`` as root, sealed with its digest."""
    argv = [gpulayerd, "--system", *(a for p in interpreters for a in ("--python", p))]
    body = _SYSTEMD_SYSTEM_UNIT.replace("{exec_start}", " ".join(systemd_arg(a) for a in argv))
    return seal(body, 0, lambda d: f"# gpulayer-sha256: {d} (written by \"gpulayer service install --system\", "
                                    "which replaces a changed file only with --force)\n")


def render_launchd_daemon(gpulayerd: str, interpreters: Sequence[str], log_path: str) -> str:
    """The LaunchDaemon plist running ``gpulayerd --system --python P ...`` as root, logging to ``log_path``."""
    argv = [gpulayerd, "--system", *(a for p in interpreters for a in ("--python", p))]
    body = (_LAUNCHD_DAEMON.replace("{label}", LAUNCHD_LABEL)
            .replace("{program_arguments}", "".join(f"\t\t<string>{escape(a)}</string>\n" for a in argv))
            .replace("{log_path}", escape(log_path)))
    return seal(body, 1, lambda d: f"<!-- gpulayer-sha256: {d} (written by gpulayer service install, which "
                                    "replaces a changed file only when forced) -->\n")


def set_system_owner(path: Path, mode: int = SYSTEM_FILE_MODE) -> None:
    """Make ``path`` root's (uid 0, gid 0: ``root:wheel`` on macOS, ``root:root`` on Linux) with ``mode``.

    launchd refuses a LaunchDaemon plist that is not root's or that others may write.

    Raises:
        OSError: not permitted (not root), or no such file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def systemd_arg(arg: str) -> str:
    """One ExecStart word: specifiers (%) and variables ($) doubled, quoted when needed."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SYSTEMD_PLAIN_ARG.fullmatch(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def seal(body: str, line_index: int, header: Callable[[str], str]) -> str:
    """``body`` with the header line (made from its SHA-256) inserted at ``line_index``."""
    lines = body.splitlines(keepends=True)
    lines.insert(line_index, header(hashlib.sha256(body.encode("utf-8")).hexdigest()))
    return "".join(lines)


def closed_to_others(path: str, *, need: int = 0o005) -> str | None:
    """The first place on the way to ``path`` that an account other than its owner cannot pass: a
    directory without ``o+x``, or ``path`` itself without the ``need`` bits for others (``o+rx`` by
    default). Symbolic links are followed, each one's target checked the same way; None if open.

    Blocking (stat calls): the CLI and the daemon's start-up only.
    """
    seen: set[str] = set()
    todo = [os.path.abspath(path)]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        parts = Path(current).parts
        for i in range(1, len(parts)):
            d = str(Path(*parts[:i]))
            try:
                st = os.stat(d)
            except OSError:
                return d
            if not st.st_mode & 0o001:
                return d
        try:
            lst = os.lstat(current)
        except OSError:
            return current
        if os.path.islink(current):
            target = os.readlink(current)
            todo.append(os.path.normpath(os.path.join(os.path.dirname(current), target)))
            continue
        if lst.st_mode & need != need:
            return current
    return None


_VENV_FIX = ("Make the lab's venv from /usr/bin/python3 where every account can read it (python3 -m venv "
             "/opt/gpulayer; /opt/gpulayer/bin/pip install /path/to/gpulayer) and install the service from there")


def shared_install_problem(interpreters: Sequence[str], package_dir: str, *, own_python: str | None = None
                           ) -> str | None:
    """Why other accounts cannot use this installation in system mode (None if they can): each
    workload interpreter must be executable by every account (jobs run as their users, and a job's
    ``python`` is the environment's interpreter), the package readable, and, with ``own_python``
    (the CLI's check at ``service install --system``), this installation's own Python executable by
    them too (every user's ``gpulayer`` runs with it).

    The answer names the closed directory and the fix, e.g. a venv made from ``/usr/bin/python3``
    in ``/opt/gpulayer`` rather than one of root's own Pythons (pyenv under ``/root``, mode 0700).
    """
    if own_python is not None:
        closed = closed_to_others(own_python)
        if closed is not None:
            return (f"this installation's Python {own_python} cannot be run by other accounts: {closed} is closed "
                    f"to them, so every user's gpulayer would fail with 'Permission denied'. {_VENV_FIX}")
    for interpreter in interpreters:
        closed = closed_to_others(interpreter)
        if closed is not None:
            return (f"the interpreter {interpreter} cannot be run by other accounts: {closed} is closed to them, "
                    f"so every job would fail with 'Permission denied'. {_VENV_FIX}, or pass --python with an "
                    "interpreter they can run")
    closed = closed_to_others(os.path.join(package_dir, "__init__.py"), need=0o004)
    if closed is not None:
        return (f"the gpulayer package in {package_dir} cannot be read by other accounts: {closed} is closed to "
                f"them. {_VENV_FIX}")
    return None
