"""``gpulayer cluster init|join|show``: make a cluster, join one, show this node's identity.

These commands edit ``<state dir>/identity/`` directly and need no running daemon. The
state dir is the global ``--state-dir`` (env ``GPULAYER_STATE_DIR``), else the default,
the same rule gpulayerd uses. A running gpulayerd keeps its old identity until restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpulayerd.cli.client import socket_path
from gpulayerd.cli.errors import EXIT_OK, CommandFailed, UsageError

if TYPE_CHECKING:
    from gpulayerd.net.identity import Identity

__all__ = ["add_parser"]

_R = TypeVar("_R")
_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``cluster`` and its subcommands to the ``gpulayer`` parser."""
    c = sub.add_parser(
        "cluster",
        help="this machine's cluster membership: init, join, show",
        description="Machines trust each other through a cluster CA: 'cluster init' on one machine "
        "prints a join token, 'cluster join TOKEN' on each other machine. The token is a secret: "
        "whoever has it can add machines to the cluster. Restart gpulayerd after init or join.",
    )
    cs = c.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    cs.required = True

    i = cs.add_parser("init", help="make a new cluster with this machine in it; prints the join token")
    i.add_argument("--name", type=_cluster_name, help="a name for people (default: the cluster id)")
    i.add_argument("--force", action="store_true", help="replace the cluster this machine is in")
    i.add_argument("--system", action="store_true", help=_SYSTEM_HELP)
    i.set_defaults(func=_cmd_init)

    j = cs.add_parser("join", help="join the cluster of a token printed by 'gpulayer cluster init'")
    j.add_argument("token", metavar="TOKEN")
    j.add_argument("--force", action="store_true", help="leave the cluster this machine is in for this one")
    j.add_argument("--system", action="store_true", help=_SYSTEM_HELP)
    j.set_defaults(func=_cmd_join)

    s = cs.add_parser("show", help="node id, cluster and identity files")
    s.add_argument("--token", action="store_true", help="print the join token (a secret)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_cmd_show)


_SYSTEM_HELP = ("enroll this machine's system-mode daemon (root only): its certificate vouches for every "
                "user's jobs; without it the certificate is personal, bound to the user running this command")


def _mode(args: argparse.Namespace) -> str:
    """``system`` (root only) or ``personal``, from ``--system``."""
    if not args.system:
        return "personal"
    if os.geteuid() != 0:
        raise CommandFailed(f"cluster {args.cluster_command} --system: only root may enroll a system-mode "
                            "node (run it with sudo)")
    return "system"


def _cluster_name(text: str) -> str:
    if not text or len(text) > 64 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: use 1 to 64 printable characters")
    return text


def _state_dir(args: argparse.Namespace) -> Path:
    from gpulayerd.config import default_state_dir

    return Path(args.state_dir) if args.state_dir is not None else default_state_dir()


def _daemon_running(args: argparse.Namespace) -> bool:
    """Whether a gpulayerd answers on this state dir's socket."""
    path = socket_path(args)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _restart_hint(args: argparse.Namespace) -> str:
    if _daemon_running(args):
        return "gpulayerd is running on this state dir: restart it to use the new identity."
    return "Start (or restart) gpulayerd on this machine to use it."


def _run(action: Callable[[], _R]) -> _R:
    """Run a tls call; a bad token is a usage error (exit 2), anything else a failure (exit 1)."""
    from gpulayerd.net.ca import TokenError
    from gpulayerd.net.identity import TlsError

    try:
        return action()
    except TokenError as e:
        raise UsageError(str(e)) from e
    except TlsError as e:
        raise CommandFailed(str(e)) from e


def _cmd_init(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca, identity

    state_dir = _state_dir(args)
    mode = _mode(args)
    token = _run(lambda: ca.cluster_init(state_dir, args.name, force=args.force, mode=mode))
    ident = _run(lambda: identity.load_or_create_identity(state_dir))
    print(f"Created cluster {_label(ident)} with this machine (node {ident.node_id}, {_mode_label(ident)}) in it.")
    print()
    print("Join token (a secret: whoever has it can add machines to this cluster; send it privately):")
    print()
    print(token)
    print()
    print("Next, on each other machine: gpulayer cluster join TOKEN, then restart gpulayerd there.")
    print(_restart_hint(args))
    print("Print the token again with: gpulayer cluster show --token")
    return EXIT_OK


def _cmd_join(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca

    state_dir = _state_dir(args)
    mode = _mode(args)
    ident = _run(lambda: ca.cluster_join(state_dir, args.token, force=args.force, mode=mode))
    print(f"Joined cluster {_label(ident)} as node {ident.node_id} ({_mode_label(ident)}).")
    print(_restart_hint(args))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca, identity

    state_dir = _state_dir(args)
    ident = _run(lambda: identity.load_or_create_identity(state_dir))
    token: str | None = None
    if args.token:
        if not ident.in_cluster:
            raise CommandFailed("this machine is not in a cluster: run 'gpulayer cluster init' first")
        token = _run(lambda: ca.join_token(state_dir))
    if args.json:
        print(json.dumps(_show_json(ident, token), indent=2))
        return EXIT_OK
    if token is not None:
        print(token)
        return EXIT_OK
    print(f"node id:    {ident.node_id}")
    print(f"state dir:  {ident.state_dir}")
    if ident.in_cluster:
        print(f"cluster:    {_label(ident)}")
        print(f"mode:       {_mode_label(ident)}")
    else:
        print("cluster:    none (run 'gpulayer cluster init', or 'gpulayer cluster join TOKEN')")
    print("files:")
    for label, path in _files(ident).items():
        print(f"  {label:<15} {path if path.exists() else f'{path} (missing)'}")
    return EXIT_OK


def _show_json(ident: Identity, token: str | None) -> dict[str, object]:
    out: dict[str, object] = {
        "node_id": ident.node_id,
        "state_dir": str(ident.state_dir),
        "in_cluster": ident.in_cluster,
        "cluster_id": ident.cluster_id,
        "cluster_name": ident.cluster_name,
        "mode": ident.mode if ident.in_cluster else None,
        "user": (ident.user or None) if ident.in_cluster else None,
        "files": {k: str(p) if p.exists() else None for k, p in _files(ident).items()},
    }
    if token is not None:
        out["token"] = token
    return out


def _files(ident: Identity) -> dict[str, Path]:
    from gpulayerd.net import identity

    d = ident.key_path.parent
    return {
        "node_key": d / identity.NODE_KEY,
        "node_cert": d / identity.NODE_CERT,
        "ca_cert": d / identity.CA_CERT,
        "ca_key": d / identity.CA_KEY,
        "cluster": d / identity.CLUSTER_JSON,
    }


def _mode_label(ident: Identity) -> str:
    if ident.mode == "system":
        return "system mode: vouches for every user's jobs"
    if ident.user:
        return f"personal mode: {ident.user}'s jobs only"
    return "personal mode, bound to no user (an old certificate: re-join to vouch for your jobs)"


def _label(ident: Identity) -> str:
    if ident.cluster_name is None or ident.cluster_name == ident.cluster_id:
        return f"{ident.cluster_id}"
    return f"{ident.cluster_name!r} ({ident.cluster_id})"

