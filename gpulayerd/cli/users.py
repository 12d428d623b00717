"""``gpulayer users``: fair share, every user the daemon knows with usage, priority and what each holds now;
``gpulayer history`` (finished jobs over a period) and ``gpulayer report`` (accounting over a period).

(Same name as :mod:`gpulayerd.core.users`: the same idea (users and their share), the command here
and the pure rules there.)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_OK, UsageError
from gpulayerd.cli.http import call_daemon

if TYPE_CHECKING:
    from gpulayerd.models import UserUsageView

__all__ = ["add_parsers", "parse_since", "render_report", "render_users", "usage_words"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parsers(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``users``, ``history`` and ``report`` to the ``gpulayer`` subcommands."""
    u = sub.add_parser(
        "users", help="fair share: each user's decayed usage, priority, jobs and what they hold now",
        description="One row per user known to this daemon's fair-share book, the next served first. "
        "Usage is decayed (half-life fairshare_half_life_s, a day by default) and learned from every "
        "node's heartbeat, kept across restarts; priority 1 is served first. GPU USE and SLOT USE are "
        "decayed GPU- and CPU-slot-hours (below 0.1 hour in seconds: '312 s'); QUEUED and RUNNING count "
        "this daemon's jobs; HOLDS is what the user's runs hold now, per host.")
    u.add_argument("--json", action="store_true", help="print the rows as JSON")
    u.set_defaults(func=_cmd_users)

    h = sub.add_parser(
        "history", help="finished jobs over a period: when they ended, how, where",
        description="The finished jobs of every owner of the lab that answers (another user's command and "
        "environment concealed, as in jobs), the latest first. Finished jobs are kept history_keep_days "
        "(daemon config, 90 days by default), across restarts.")
    h.add_argument("--since", default="7d", metavar="DURATION", help="how far back: 90m, 12h, 7d (default 7d)")
    h.add_argument("--user", metavar="USER", help="only this user's jobs")
    h.add_argument("--state", action="append", default=[], metavar="STATE",
                   help="only jobs that ended so (repeatable): succeeded, failed, timeout, cancelled, lost, rejected")
    h.add_argument("--json", action="store_true", help="print the jobs as JSON")
    h.set_defaults(func=_cmd_history)

    r = sub.add_parser(
        "report", help="accounting over a period: jobs, GPU-hours, CPU slot-hours, failures, median wait",
        description="Accounting of the jobs owned by this daemon (or, with --lab, by every owner of the lab that "
        "answers) over a period: jobs that ended and how many failed (failed, timeout, lost), GPU-hours and "
        "CPU slot-hours held within the period (not decayed), and the median wait from submission to first "
        "start. Rows by user, host (where the attempts ran) or GPU model.")
    r.add_argument("--since", default="30d", metavar="DURATION", help="how far back: 12h, 7d, 30d (default 30d)")
    r.add_argument("--by", choices=("user", "host", "gpu-model"), default="user", help="the rows (default user)")
    r.add_argument("--lab", action="store_true", help="every owner of the lab, not only this daemon's jobs")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=_cmd_report)


def parse_since(value: str, flag: str = "--since") -> float:
    """Seconds in a ``--since`` duration (``7d``, ``12h``, ``90m``, ``3600``).

    Raises:
        UsageError: not a duration above 0 (naming the flag and the allowed forms).
    """
    from gpulayerd.core.job_policy import parse_duration

    try:
        return parse_duration(value)
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None


_FINISHED = ("succeeded", "failed", "timeout", "cancelled", "lost", "rejected")


def _cmd_history(args: argparse.Namespace) -> int:
    import json
    import time

    since = time.time() - parse_since(args.since)
    bad = [s for s in args.state if s not in _FINISHED]
    if bad:
        raise UsageError(f"--state: {', '.join(map(repr, bad))} is not a finished state; allowed: "
                         f"{', '.join(_FINISHED)}")
    jobs = call_daemon(args, lambda c: c.jobs(states=args.state or _FINISHED, scope="cluster", user=args.user))
    ended = sorted((j for j in jobs if (j.get("updated_at") or 0) >= since),
                   key=lambda j: j.get("updated_at") or 0, reverse=True)
    if args.json:
        print(fmt.json_out(json.dumps(ended, ensure_ascii=False, separators=(",", ":"))))
        return EXIT_OK
    if not ended:
        print(f"no job ended in the last {args.since}")
        return EXIT_OK
    now = time.time()
    rows = [[fmt.escape(j["id"]), fmt.escape(j.get("name") or fmt.DASH), fmt.escape(_user_of(j)), j["status"],
             fmt.DASH if j.get("exit_code") is None else j["exit_code"], fmt.ago(j.get("updated_at"), now),
             fmt.escape(j.get("where_name") or j.get("holder_name") or fmt.DASH),
             fmt.escape(fmt.one_line(j.get("reason"), 60))]
            for j in ended]
    print(fmt.table(["ID", "NAME", "USER", "STATE", "EXIT", "ENDED", "WHERE", "HOW"], rows))
    return EXIT_OK


def _user_of(job: dict[str, Any]) -> str:
    from gpulayerd.core.job_facts import job_user

    return job_user((job.get("spec") or {}).get("user"), job.get("submitted_by")) or "?"


def _cmd_report(args: argparse.Namespace) -> int:
    since_s = parse_since(args.since)
    report = call_daemon(args, lambda c: c.report(since_s, args.by, "lab" if args.lab else "daemon"))
    if args.json:
        import json

        print(fmt.json_out(json.dumps(report, ensure_ascii=False, separators=(",", ":"))))
        return EXIT_OK
    print(render_report(report, fmt.age(since_s)))
    return EXIT_OK


def render_report(report: dict[str, Any], since: str) -> str:
    """The ``gpulayer report`` table, under a line saying what it covers."""
    owners = ", ".join(fmt.escape(o) for o in report.get("owners", []))
    scope = f"the jobs owned by {owners}" if report.get("scope") != "lab" else f"the lab's jobs (owners: {owners})"
    head = f"{scope}, last {since}"
    if report.get("missing"):
        head += f"; not answering: {', '.join(fmt.escape(m) for m in report['missing'])}"
    rows = [[fmt.escape(r["key"]), r["jobs"], r["failures"], f"{r['gpu_hours']:.2f}", f"{r['cpu_slot_hours']:.2f}",
             fmt.DASH if r.get("median_wait_s") is None else fmt.age(r["median_wait_s"])]
            for r in report.get("rows", [])]
    if not rows:
        return head + "\nnothing ran or ended in that period"
    key = {"user": "USER", "host": "HOST", "gpu-model": "GPU MODEL"}.get(report.get("by", ""), "KEY")
    return head + "\n" + fmt.table([key, "JOBS", "FAILED", "GPU-HOURS", "SLOT-HOURS", "MEDIAN WAIT"], rows)


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
