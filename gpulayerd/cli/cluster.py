"""``gpulayer cluster init|join|token|remove|signer|show``: make a cluster, join one, manage it.

These commands edit ``<state dir>/identity/`` directly, under its lock, whether or not the
daemon runs (``cluster join`` needs a running SIGNER elsewhere: it enrolls online). The
state dir is the global ``--state-dir`` (env ``GPULAYER_STATE_DIR``), else the default,
the same rule gpulayerd uses. ``cluster token`` and ``cluster remove`` write files the
running daemon reads when it needs them (tokens at each enrollment, revocations each
heartbeat round); after init or join, restart gpulayerd.


(Same name as the package :mod:`gpulayerd.app.cluster`: the same idea (this machine in a cluster),
the commands here and the service there.)
"""

from __future__ import annotations

import argparse
import json  # 1 ms; socket is imported where used
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError
from gpulayerd.cli.http import socket_path
from gpulayerd.text import escape as fmt_escape

if TYPE_CHECKING:
    from gpulayerd.net.identity import Identity

__all__ = ["add_parser"]

_R = TypeVar("_R")
_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``cluster`` and its subcommands to the ``gpulayer`` parser."""
    c = sub.add_parser(
        "cluster",
        help="this machine's cluster membership: init, join, token, remove, signer, show",
        description="Machines trust each other through a cluster CA: 'cluster init' on one machine (a "
        "signer: it keeps the CA key) prints a one-time join token; with its gpulayerd running, "
        "'cluster join -' on each other machine reads the token from stdin and enrolls online. "
        "Restart gpulayerd after init or join.",
    )
    cs = c.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    cs.required = True

    i = cs.add_parser("init", help="make a new cluster with this machine in it; prints the join token")
    i.add_argument("--name", type=_cluster_name, help="a name for people (default: the cluster id)")
    i.add_argument("--force", action="store_true", help="replace the cluster this machine is in")
    i.add_argument("--system", action="store_true", help=_SYSTEM_HELP)
    _token_options(i)
    i.set_defaults(func=_cmd_init)

    j = cs.add_parser("join", help="join a cluster with a token from 'gpulayer cluster token' (read from stdin "
                      "or --token-file, never from the command line)")
    j.add_argument("token", metavar="-", nargs="?", help="'-': read the token from stdin (also the default)")
    j.add_argument("--token-file", type=Path, metavar="PATH", help="read the token from this file")
    j.add_argument("--force", action="store_true", help="leave the cluster this machine is in for this one")
    j.add_argument("--system", action="store_true", help=_SYSTEM_HELP)
    j.set_defaults(func=_cmd_join)

    t = cs.add_parser("token", help="on a signer: make a join token (one-time, expiring), list or revoke them",
                      description="Make a join token. The token fixes what the machine joining with it will be: "
                      "a system-mode node (--system: it vouches for every user's jobs, so give such tokens only "
                      "to machines an admin runs) or a personal-mode node of one user (--user NAME). Default: "
                      "this signer's own mode (and user).")
    _token_options(t)
    who = t.add_mutually_exclusive_group()
    who.add_argument("--system", action="store_true", help="the token enrolls a system-mode node")
    who.add_argument("--user", metavar="NAME", help="the token enrolls a personal-mode node bound to user NAME")
    t.add_argument("--list", action="store_true", help="list this signer's tokens (never their secrets)")
    t.add_argument("--revoke", metavar="ID", help="forget token ID: nobody can join with it any more")
    t.add_argument("--json", action="store_true", help="print the token (or with --list the tokens) as JSON")
    t.set_defaults(func=_cmd_token)

    r = cs.add_parser("remove", help="on a signer: remove NODE from the cluster (a signed revocation that "
                      "members pass on; they refuse its connections)")
    r.add_argument("node", metavar="NODE", help="the whole node id (52 characters, from 'gpulayer peers --json')")
    r.set_defaults(func=_cmd_remove)

    g = cs.add_parser("signer", help="signers: the nodes that hold the cluster CA key")
    gs = g.add_subparsers(dest="signer_command", metavar="SUBCOMMAND")
    gs.required = True
    ga = gs.add_parser("add", help="print the commands that copy the CA key to NODE (a current member), "
                       "making it a signer too")
    ga.add_argument("node", metavar="NODE", help="the member's node id")
    ga.add_argument("--host", default="NODE-HOST", help="NODE's host name, for the printed commands")
    ga.set_defaults(func=_cmd_signer_add)

    s = cs.add_parser("show", help="node id, cluster, signer or not, and identity files")
    s.add_argument("--json", action="store_true", help="print the cluster membership as JSON")
    s.set_defaults(func=_cmd_show)


def _token_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--uses", type=_uses, default=1, help="how many machines may join with the token (default 1)")
    p.add_argument("--ttl", type=_ttl, default=3600.0, metavar="DURATION",
                   help="how long the token is valid: 90s, 30m, 1h (default), 2d; at most 30d")
    p.add_argument("--address", action="append", metavar="HOST:PORT",
                   help="this signer's enrollment address to put in the token (repeatable; default: what the "
                   "running daemon serves, else each LAN address with port 7172: the peer port + 1)")


def _uses(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: use a number of 1 to 1000")
    return int(text)


def _ttl(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    num, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(num) * units[unit]
    except ValueError:
        value = -1.0
    if not 1 <= value <= 30 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: use a duration of 1s to 30d, e.g. 90s, 30m, 1h, 2d")
    return value


_SYSTEM_HELP = ("enroll this machine's system-mode daemon (root only; its state in /var/lib/gpulayer unless "
                "--state-dir): its certificate vouches for every user's jobs; without it the certificate is "
                "personal, bound to the user running this command")


def _mode(args: argparse.Namespace) -> str:
    """``system`` (root only) or ``personal``, from ``--system``.

    Without ``--system``, root working on the system daemon's state dir (``_state_dir``'s
    fallback on a lab machine) enrolls it in system mode too: a personal certificate there
    would keep the system daemon from starting.
    """
    from gpulayerd.config import SYSTEM_STATE_DIR

    if not args.system and not (os.geteuid() == 0 and _state_dir(args) == SYSTEM_STATE_DIR):
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
    """The state dir a cluster command works on.

    ``--state-dir`` if given; else with ``--system`` the system daemon's (``/var/lib/gpulayer``);
    else root on a machine whose system daemon is enrolled and whose root has no personal
    identity also gets the system one (``sudo gpulayer cluster show`` on a lab machine); else
    the personal default.
    """
    from gpulayerd.config import SYSTEM_STATE_DIR, default_state_dir

    if args.state_dir is not None:
        return Path(args.state_dir)
    if getattr(args, "system", False):
        return SYSTEM_STATE_DIR
    personal = default_state_dir()
    if os.geteuid() == 0 and not (personal / "identity").exists() and (SYSTEM_STATE_DIR / "identity").exists():
        return SYSTEM_STATE_DIR
    return personal


def _daemon_running(args: argparse.Namespace) -> bool:
    """Whether a gpulayerd answers on this state dir's socket."""
    path = socket_path(args)
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _restart_hint(args: argparse.Namespace) -> str:
    from gpulayerd.config import SYSTEM_STATE_DIR

    service = " (sudo systemctl restart gpulayerd)" if _state_dir(args) == SYSTEM_STATE_DIR else ""
    if _daemon_running(args):
        return f"gpulayerd is running on this state dir: restart it to use the new identity{service}."
    return f"Start (or restart) gpulayerd on this machine to use it{service}."


def _run(action: Callable[[], _R]) -> _R:
    """Run a tls call; a bad token is a usage error (exit 2), anything else a failure (exit 1)."""
    from gpulayerd.net.enroll import TokenError
    from gpulayerd.net.identity import TlsError

    try:
        return action()
    except TokenError as e:
        raise UsageError(str(e)) from e
    except TlsError as e:
        raise CommandFailed(str(e)) from e
    except OSError as e:  # e.g. another account's state dir
        where = f"{e.filename}: " if e.filename else ""
        raise CommandFailed(f"{where}{e.strerror or e} (is this the right --state-dir, and your account's?)") from e


def _cmd_init(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca, identity

    state_dir = _state_dir(args)
    mode = _mode(args)
    token = _run(lambda: ca.cluster_init(state_dir, args.name, force=args.force, mode=mode, uses=args.uses,
                                         ttl_s=args.ttl, addresses=args.address))
    ident = _run(lambda: identity.load_or_create_identity(state_dir))
    print(f"Created cluster {_label(ident)} with this machine (node {ident.node_id}, {_mode_label(ident)}) in it.")
    print("This machine is a signer: it keeps the cluster CA key and enrolls the others (gpulayerd must run).")
    print()
    _print_token(token, args.uses, args.ttl, system=mode == "system")
    print(_restart_hint(args))
    return EXIT_OK


def _print_token(token: str, uses: int, ttl_s: float, *, system: bool = False) -> None:
    print(f"Join token (a secret until used: {uses} use(s), expires {time.ctime(time.time() + ttl_s)}; "
          "it holds no CA key):")
    print()
    print(token)
    print()
    join = "sudo gpulayer cluster join --system" if system else "gpulayer cluster join"
    print("On each other machine (with this machine's gpulayerd running), paste it into:")
    print(f"  {join} -          (or: {join} --token-file FILE)")
    print("then restart gpulayerd there. More tokens: gpulayer cluster token [--uses N] [--ttl 1h]")


def _cmd_join(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca

    state_dir = _state_dir(args)
    mode = _mode(args)
    text = _read_token(args)
    ident = _run(lambda: ca.cluster_join(state_dir, text, force=args.force, mode=mode))
    print(f"Joined cluster {_label(ident)} as node {ident.node_id} ({_mode_label(ident)}).")
    print(_restart_hint(args))
    return EXIT_OK


def _read_token(args: argparse.Namespace) -> str:
    """The token from ``--token-file`` or stdin; a token given as an argument is refused (``ps`` shows it)."""
    if args.token not in (None, "-"):
        raise UsageError("a join token on the command line is visible to every local user (ps): pipe it in "
                         "('gpulayer cluster join -', then paste it) or use --token-file PATH")
    if args.token_file is not None:
        try:
            return str(args.token_file.read_text(encoding="utf-8", errors="replace"))[:65536]
        except OSError as e:
            raise UsageError(f"--token-file {args.token_file}: {e.strerror or e}") from e
    if sys.stdin.isatty():
        print("Paste the join token, then press Enter:", file=sys.stderr)
        return sys.stdin.readline()
    return sys.stdin.read(65536)


def _cmd_token(args: argparse.Namespace) -> int:
    from gpulayerd.net import ca, enroll, identity

    state_dir = _state_dir(args)
    idir = _run(lambda: identity.identity_dir(state_dir))
    if args.revoke is not None:
        if not _run(lambda: enroll.revoke_token(idir, args.revoke)):
            raise CommandFailed(f"no token {args.revoke!r} on this signer (see 'gpulayer cluster token --list')")
        print(f"Token {args.revoke} revoked: nobody can join with it any more.")
        return EXIT_OK
    if args.list:
        rows = _run(lambda: enroll.list_tokens(idir))
        if args.json:
            print(json.dumps([{"id": t.token_id, "created": t.created, "expires": t.expires,
                               "uses_left": t.uses_left, "used": t.used, "mode": t.mode, "user": t.user}
                              for t in rows], indent=2))
            return EXIT_OK
        now = time.time()
        print(f"{'ID':<10}{'USES LEFT':>10}{'USED':>6}  {'ENROLLS':<24}EXPIRES")
        for t in rows:
            state = "expired" if t.expires <= now else time.ctime(t.expires)
            what = "system node" if t.mode == "system" else f"personal: {t.user}" if t.mode else "-"
            print(f"{t.token_id:<10}{t.uses_left:>10}{t.used:>6}  {fmt_escape(what):<24}{state}")
        return EXIT_OK
    mode = "system" if args.system else "personal" if args.user else None
    token = _run(lambda: ca.new_token(state_dir, uses=args.uses, ttl_s=args.ttl, addresses=args.address,
                                      mode=mode, user=args.user))
    if args.json:
        print(json.dumps({"token": token}))
        return EXIT_OK
    _print_token(token, args.uses, args.ttl)
    return EXIT_OK


def _cmd_remove(args: argparse.Namespace) -> int:
    from gpulayerd.net import identity, revocation

    state_dir = _state_dir(args)
    ident = _run(lambda: identity.load_or_create_identity(state_dir))
    node = args.node.strip().lower()
    if len(node) != 52 or not node.isalnum():
        raise UsageError(f"NODE {args.node!r}: give the whole node id (52 letters and digits, from 'gpulayer peers "
                         "--json' or 'gpulayer cluster show' on that machine)")
    if node == ident.node_id:
        raise UsageError("NODE is this machine: remove it from another signer")
    entry = _run(lambda: revocation.revoke_node(identity.identity_dir(state_dir), node))
    print(f"Node {node} removed from the cluster (revocation signed at {time.ctime(entry.at)}).")
    print("The running gpulayerd passes it on with its heartbeats; members then refuse that node's connections.")
    return EXIT_OK


def _cmd_signer_add(args: argparse.Namespace) -> int:
    from gpulayerd.net import enroll, identity

    state_dir = _state_dir(args)
    idir = _run(lambda: identity.identity_dir(state_dir))
    if not enroll.is_signer(idir):
        raise CommandFailed("this machine is not a signer (no CA key here): run it on a signer")
    key = idir / identity.CA_KEY
    print(f"Making node {args.node} a signer copies the cluster CA key {key} to it: whoever can read that key")
    print("can add machines to the cluster. Copy it over a private channel, as the daemon's account on both ends:")
    print()
    print(f"  scp -p {key} {args.host}:STATE_DIR/identity/ca.key   # STATE_DIR: that daemon's state dir")
    print(f"  ssh {args.host} 'chmod 600 STATE_DIR/identity/ca.key'")
    print()
    print("then restart gpulayerd there: it serves enrollment (peer port + 1), and "
          "'gpulayer cluster token' works there.",
          sep="")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from gpulayerd import text as fmt
    from gpulayerd.net import identity

    state_dir = _state_dir(args)
    ident = _run(lambda: identity.load_or_create_identity(state_dir))
    if args.json:
        print(json.dumps(_show_json(ident, None), indent=2))
        return EXIT_OK
    print(f"node id:    {ident.node_id}")
    print(f"state dir:  {ident.state_dir}")
    if ident.in_cluster:
        print(f"cluster:    {_label(ident)}")
        print(f"mode:       {_mode_label(ident)}")
        print(f"signer:     {'yes (holds the CA key)' if _is_signer(ident) else 'no'}")
        removed = _removed(ident)
        if removed is not None:
            print(f"removed:    {fmt.escape(removed)}: members refuse this node; run 'gpulayer cluster leave', "
                  "then join again with a new token")
    else:
        print("cluster:    none (run 'gpulayer cluster init', or 'gpulayer cluster join -')")
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
        "signer": ident.in_cluster and _is_signer(ident),
        "removed": ident.in_cluster and _removed(ident) is not None,
        "files": {k: str(p) if p.exists() else None for k, p in _files(ident).items()},
    }
    if token is not None:
        out["token"] = token
    return out


def _removed(ident: Identity) -> str | None:
    """When and how this node learnt it was removed from the cluster (its ``removed`` mark), or None."""
    from gpulayerd.net.revocation import REMOVED_MARK

    try:
        at, _, words = (ident.key_path.parent / REMOVED_MARK).read_text(encoding="utf-8").strip().partition(" ")
    except OSError:
        return None
    when = time.ctime(int(at)) if at.isdigit() else "at some time"
    return f"removed from the cluster (learnt {when}; a member said: {words[:200]})"


def _is_signer(ident: Identity) -> bool:
    from gpulayerd.net.enroll import is_signer

    return is_signer(ident.key_path.parent)


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

