"""``gpulayer service install|uninstall|status``: gpulayerd as a systemd user unit or a launchd agent.

With ``--system`` (run with sudo): the lab install, a systemd system unit or a LaunchDaemon running
``gpulayerd --system`` as root.

The files and where they go are :mod:`gpulayerd.host.service_user`'s (imported when a command runs);
this module is the command line: what to write or remove, when to refuse, what to print. Nothing
here runs ``systemctl`` or ``launchctl``: the commands print the exact next command.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError
from gpulayerd.cli.http import socket_path

if TYPE_CHECKING:
    from gpulayerd.host.service_user import OsName, ServiceTarget

__all__ = ["HEALTH_TIMEOUT_S", "add_parser"]

HEALTH_TIMEOUT_S = 2.0
"""How long ``service status`` waits for the daemon's health answer, seconds."""

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``service install|uninstall|status`` to the ``gpulayer`` subcommands."""
    s = sub.add_parser(
        "service",
        help="install gpulayerd as a systemd user service (Linux) or a launchd agent (macOS); "
        "--system: as the machine's system service (lab install)",
        description="Write, remove or inspect the service file that runs this installation's gpulayerd "
        "at login (Linux: systemd user unit; macOS: LaunchAgent), or with --system (run with sudo) at boot "
        "as root in system mode, one daemon for every account of the machine (Linux: "
        "/etc/systemd/system/gpulayerd.service; macOS: /Library/LaunchDaemons). Never runs systemctl or "
        "launchctl: prints the exact command to run next.",
    )
    ssub = s.add_subparsers(dest="service_command", metavar="ACTION")
    ssub.required = True

    i = ssub.add_parser("install", help="write the service file (idempotent)",
                        description="Write the service file for this installation's gpulayerd. Installing "
                        "again changes nothing; a file changed by hand is replaced only with --force. "
                        "--dry-run prints the file on stdout (and what would happen on stderr).")
    i.add_argument("--python", action="append", metavar="PATH", default=None,
                   help="workload interpreter (repeatable, in preference order; default: gpulayerd's own)")
    i.add_argument("--dry-run", action="store_true", help="print the file and the next command; write nothing")
    i.add_argument("--force", action="store_true", help="replace a service file changed by hand")
    _add_os_arg(i)
    i.set_defaults(func=_cmd_install)

    u = ssub.add_parser("uninstall", help="remove the service file (stop it first: the command is printed)")
    u.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    u.add_argument("--force", action="store_true",
                   help="remove a file changed by hand, or one still enabled (and its enable link)")
    _add_os_arg(u)
    u.set_defaults(func=_cmd_uninstall)

    st = ssub.add_parser("status", help="whether the service is installed, enabled and running")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    _add_os_arg(st)
    st.set_defaults(func=_cmd_status)


# --------------------------------------------------------------------------- commands


def _cmd_install(args: argparse.Namespace) -> int:
    from gpulayerd.host import service_user as svc

    target = _target(args)
    gpulayerd = _this_gpulayerd()
    if target.system and not args.dry_run:
        _need_root(args, "install")
    interpreters = list(dict.fromkeys(_absolute_interpreter(p) for p in args.python or []))
    if target.system and args.root == Path("/"):  # (a tree for packaging is checked where it is installed)
        from gpulayerd.host.service_system import shared_install_problem

        problem = shared_install_problem(interpreters or [sys.executable], str(Path(__file__).resolve().parents[1]),
                                         own_python=sys.executable)
        if problem is not None and not args.dry_run:
            raise CommandFailed(f"not installing the system service: {problem}")
        if problem is not None:
            print(f"note: without --dry-run this would refuse: {problem}", file=sys.stderr)
    rendered = target.render(gpulayerd, interpreters)
    state = svc.file_state(svc.read_service_file(target.path), rendered)
    next_command = target.start_command(update=state in ("outdated", "modified"))

    if args.dry_run:
        sys.stdout.write(rendered)
        doing = {"missing": "would write", "current": "already installed, unchanged:",
                 "outdated": "would update", "modified": "would replace (changed by hand)"}[state]
        print(f"dry run, nothing written: {doing} {target.path}", file=sys.stderr)
        if state == "modified" and not args.force:
            print("  (only with --force: the file was changed by hand)", file=sys.stderr)
        print(f"next: {next_command}", file=sys.stderr)
        return EXIT_OK
    if state == "current":
        print(f"already installed: {target.path} (unchanged)")
        print(f"to start it, if it is not running: {target.start_command()}")
        return EXIT_OK
    if state == "modified" and not args.force:
        raise CommandFailed(
            f"{target.path} was changed by hand (or not written by gpulayer); not replacing it.\n"
            f"See what would be written with: gpulayer service install --dry-run{_os_flag(args)}\n"
            f"Replace it with: gpulayer service install --force{_os_flag(args)}")
    svc.write_service_file(target, rendered)
    done = {"missing": "installed", "outdated": "updated", "modified": "replaced"}[state]
    print(f"{done} {target.kind}: {target.path}")
    system = " --system" if target.system else ""
    print(f"  runs: {gpulayerd}{system}" + "".join(f" --python {shlex.quote(p)}" for p in interpreters))
    print("next:")
    print(f"  {next_command}")
    if target.system:
        print("  then, once per cluster: sudo gpulayer cluster init --system (or cluster join --system on the others)")
    elif target.os_name == "linux":
        print("  loginctl enable-linger $USER    # once: keep it running without a login session")
    return EXIT_OK


def _cmd_uninstall(args: argparse.Namespace) -> int:
    from gpulayerd.host import service_user as svc

    target = _target(args)
    if target.system and not args.dry_run:
        _need_root(args, "uninstall")
    text = svc.read_service_file(target.path)
    link = target.enabled_link
    linked = link is not None and os.path.lexists(link)
    if text is None and not linked:
        print(f"not installed: no {target.path}")
        return EXIT_OK
    if text is not None and not svc.is_pristine(text) and not args.force:
        raise CommandFailed(
            f"{target.path} was changed by hand (or not written by gpulayer); not removing it.\n"
            f"Remove it anyway with: gpulayer service uninstall --force{_os_flag(args)}")
    if linked and not args.force:
        raise CommandFailed(
            f"gpulayerd is still enabled ({link}). Stop and disable it first:\n"
            f"  {target.stop_command()}\n"
            "then run 'gpulayer service uninstall' again (running jobs keep running; "
            "--force removes the files anyway)")
    doomed = [p for p in (target.path if text is not None else None, link if linked else None) if p is not None]
    if args.dry_run:
        for p in doomed:
            print(f"dry run, nothing removed: would remove {p}")
        return EXIT_OK
    for p in doomed:
        p.unlink()
        print(f"removed {p}")
    for p in doomed:
        svc.prune_empty_dirs(p.parent, target.home)
    if target.logs_dir is not None:
        if target.logs_dir.is_dir() and any(target.logs_dir.iterdir()):
            print(f"kept the logs in {target.logs_dir}")
        else:
            svc.prune_empty_dirs(target.logs_dir, target.home)
    if target.system and target.os_name == "linux":
        print("next: sudo systemctl daemon-reload")
        print("  (if gpulayerd still runs: sudo systemctl stop gpulayerd; running jobs keep running)")
    elif target.os_name == "linux":
        print("next: systemctl --user daemon-reload")
        print("  (if gpulayerd still runs: systemctl --user stop gpulayerd; running jobs keep running)")
    else:
        print(f"next, if it is still loaded: {target.stop_command()}")
    return EXIT_OK


class _Status(NamedTuple):  # not a dataclass: `dataclasses` costs 5 ms of every CLI start
    os: OsName
    kind: str
    path: str
    installed: bool
    file: Literal["missing", "generated", "hand-edited"]
    gpulayerd: str | None
    this_installation: bool | None
    interpreters: list[str]
    enabled: bool | None
    running: bool
    socket: str
    daemon: dict[str, object] | None
    problem: str | None


def _cmd_status(args: argparse.Namespace) -> int:
    from gpulayerd.config import SYSTEM_SOCKET_PATH
    from gpulayerd.host import service_user as svc

    target = _target(args)
    text = svc.read_service_file(target.path)
    argv = [] if text is None else svc.service_argv(text, target.os_name)
    this = svc.find_gpulayerd()
    sock = SYSTEM_SOCKET_PATH if target.system and args.socket is None else socket_path(args)
    health, problem = _health(sock)
    status = _Status(
        os=target.os_name,
        kind=target.kind,
        path=str(target.path),
        installed=text is not None,
        file="missing" if text is None else "generated" if svc.is_pristine(text) else "hand-edited",
        gpulayerd=argv[0] if argv else None,
        this_installation=None if not argv or this is None else argv[0] == this,
        interpreters=[argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--python"],
        enabled=None if target.enabled_link is None else os.path.lexists(target.enabled_link),
        running=health is not None,
        socket=str(sock),
        daemon=health,
        problem=problem,
    )
    if args.json:
        import json

        print(json.dumps(status._asdict(), indent=2))
    else:
        print(_render_status(status, target))
    return EXIT_OK


def _render_status(s: _Status, target: ServiceTarget) -> str:
    from gpulayerd.host.service_user import LAUNCHD_LABEL

    if not s.installed:
        sudo, system = ("sudo ", " --system") if target.system else ("", "")
        installed = f"no    ({sudo}gpulayer service install{system}{'' if s.os == 'linux' else ' --os macos'})"
    else:
        how = "as written by gpulayer service install" if s.file == "generated" else "changed by hand"
        whose = ("" if s.this_installation is None else ", this installation's gpulayerd" if s.this_installation
                 else f", another gpulayerd: {s.gpulayerd}")
        installed = f"yes   ({how}{whose})"
    if s.enabled is None:
        domain = "system" if target.system else f"gui/{os.getuid()}"
        enabled = f"unknown (launchd: launchctl print {domain}/{LAUNCHD_LABEL})"
    else:
        enabled = "yes" if s.enabled else f"no    ({target.start_command()})" if s.installed else "no"
    if s.daemon is not None:
        running = f"yes   (gpulayerd {s.daemon.get('version')}, pid {s.daemon.get('pid')}, {s.socket})"
    else:
        running = f"no    ({s.problem})"
    return "\n".join([f"{s.kind}: {s.path}", f"installed: {installed}", f"enabled:   {enabled}",
                      f"running:   {running}"])




# ---------------------------------------------------------------------------- helpers


def _add_os_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--os", choices=["linux", "macos"], default=None,
                   help="render for this OS instead of the running one (Linux: systemd; macOS: launchd)")
    p.add_argument("--system", action="store_true",
                   help="the machine's system service (run with sudo): gpulayerd --system as root, for every "
                   "account (/etc/systemd/system/gpulayerd.service; macOS: "
                   "/Library/LaunchDaemons/io.gpulayer.gpulayerd.plist, root:wheel 0644)")
    p.add_argument("--root", type=Path, metavar="DIR", default=Path("/"),
                   help="with --system: the tree to write into instead of / (for packaging)")


def _target(args: argparse.Namespace) -> ServiceTarget:
    """The service file's place: the user's (HOME), or with ``--system`` the machine's (under ``--root``)."""
    from gpulayerd.host import service_user as svc

    os_name = _os_name(args.os)
    if args.system:
        return svc.system_service_target(os_name, Path(args.root).absolute())
    if args.root != Path("/"):
        raise UsageError("service: --root goes with --system (a user's service lives in their HOME)")
    return svc.service_target(os_name)


def _need_root(args: argparse.Namespace, action: str) -> None:
    if os.geteuid() != 0:
        raise CommandFailed(f"service {action} --system changes the machine's service files, owned by root: run "
                            f"it with sudo (sudo {shlex.quote(sys.argv[0]) if sys.argv else 'gpulayer'} "
                            f"service {action} --system)")


def _os_name(requested: str | None) -> OsName:
    if requested == "linux" or (requested is None and sys.platform.startswith("linux")):
        return "linux"
    if requested == "macos" or (requested is None and sys.platform == "darwin"):
        return "macos"
    raise UsageError(f"service: {sys.platform} has no supported service manager; give --os linux|macos")


def _os_flag(args: argparse.Namespace) -> str:
    flags = f" --os {args.os}" if args.os else ""
    if args.system:
        flags += " --system" + (f" --root {shlex.quote(str(args.root))}" if args.root != Path("/") else "")
    return flags


def _this_gpulayerd() -> str:
    from gpulayerd.host import service_user as svc

    found = svc.find_gpulayerd()
    if found is None:
        raise CommandFailed(f"cannot find this installation's gpulayerd next to {sys.executable} "
                            "(reinstall gpulayer with pip)")
    return found


def _absolute_interpreter(text: str) -> str:
    """``--python`` as an absolute path, symlinks kept (a venv's python is a symlink that must stay one)."""
    if any(ord(c) < 32 for c in text):
        raise UsageError(f"--python {text!r}: control characters in a path")
    if "/" in text:
        path = os.path.abspath(os.path.expanduser(text))
    else:
        import shutil

        found = shutil.which(text)
        if found is None:
            raise UsageError(f"--python {text}: not found on PATH")
        path = os.path.abspath(found)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise UsageError(f"--python {text}: {path} is not an executable file")
    return path


def _health(sock: Path) -> tuple[dict[str, object] | None, str | None]:
    """Ask the daemon on ``sock`` for its health: (health fields, None) or (None, why not)."""
    import asyncio

    from gpulayerd.api.client import ApiRequestError, DaemonClient, DaemonUnreachable

    async def ask() -> dict[str, object]:
        async with DaemonClient(sock, timeout_s=HEALTH_TIMEOUT_S) as client:
            return (await client.health()).model_dump()

    try:
        return asyncio.run(ask()), None
    except DaemonUnreachable as e:
        return None, str(e)
    except ApiRequestError as e:
        return None, f"gpulayerd at {sock} answered with an error: {e}"
    except (TimeoutError, asyncio.TimeoutError):
        return None, f"no answer from {sock} within {HEALTH_TIMEOUT_S:g} s"
    except (OSError, ValueError) as e:
        return None, f"cannot ask gpulayerd at {sock}: {e}"
