"""``gpulayer users``: fair share, every user the daemon knows with usage, priority and what each holds now.

(Same name as :mod:`gpulayerd.core.users`: the same idea (users and their share), the command here
and the pure rules there.)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_OK
from gpulayerd.cli.http import call_daemon

if TYPE_CHECKING:
    from gpulayerd.models import UserUsageView

__all__ = ["add_parser", "render_users", "usage_words"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``users`` to the ``gpulayer`` subcommands."""
    u = sub.add_parser(
        "users", help="fair share: each user's decayed usage, priority, jobs and what they hold now",
        description="One row per user known to this daemon's fair-share book, the next served first. "
        "Usage is decayed (half-life fairshare_half_life_s, a day by default) and learned from every "
        "node's heartbeat, kept across restarts; priority 1 is served first. GPU USE and SLOT USE are "
        "decayed GPU- and CPU-slot-hours (below 0.1 hour in seconds: '312 s'); QUEUED and RUNNING count "
        "this daemon's jobs; HOLDS is what the user's runs hold now, per host.")
    u.add_argument("--json", action="store_true", help="print the rows as JSON")
    u.set_defaults(func=_cmd_users)


def _cmd_users(args: argparse.Namespace) -> int:
    users = call_daemon(args, lambda c: c.users())  # decoded JSON (cli.http.Record): no models needed
    if args.json:
        import json

        rows = ",".join(json.dumps(u, ensure_ascii=False, separators=(",", ":")) for u in users)
        print(fmt.json_out(f"[{rows}]"))
        return EXIT_OK
    print(render_users(users))
    return EXIT_OK


def render_users(users: Sequence[UserUsageView]) -> str:
    """The ``gpulayer users`` table (a line saying so when no user is known)."""
    if not users:
        return "no users known yet (usage is learned from the runs on each machine)"
    rows = []
    for u in users:
        holds = ", ".join(f"{fmt.escape(h.host)}: " + _held(h.gpus, h.cpu_slots) for h in u.holding) or fmt.DASH
        rows.append([fmt.escape(u.user) or "(unknown)", u.rank, usage_words(u.gpu_hours),
                     usage_words(u.cpu_slot_hours), u.jobs_queued, u.jobs_running, holds])
    return fmt.table(["USER", "PRIORITY", "GPU USE", "SLOT USE", "QUEUED", "RUNNING", "HOLDS"], rows)


def usage_words(hours: float) -> str:
    """Decayed usage in words precise enough to explain the order: ``6.1 h`` from 0.1 hour up, else
    whole seconds (``312 s``; ``0 s`` for none)."""
    if hours >= 0.1:
        return f"{hours:.1f} h"
    return f"{max(0.0, hours) * 3600:.0f} s"


def _held(gpus: int, slots: int) -> str:
    parts = []
    if gpus:
        parts.append(f"{gpus} GPU" + ("s" if gpus != 1 else ""))
    if slots:
        parts.append(f"{slots} slot" + ("s" if slots != 1 else ""))
    return " + ".join(parts) or "0"
