"""What running jobs as their users costs per job start: ``sudo python bench/users.py [--starts 20]``.

Prints figures against the target (running a job as its user adds at most 5 ms to
submit->start); asserts nothing.

- identity lookup: :func:`gpulayerd.runs.launch.resolve_job_user` (``pwd`` + ``os.getgrouplist``,
  what the Starter does per start) and :func:`gpulayerd.runs.account.check_still_maps` (what the
  watchdog does right before ``exec``); median of many calls.
- the workdir check as the user (:class:`gpulayerd.app.worker.machine.PathChecker`'s forked helper,
  once per (user, workdir) and pass): median.
- privilege drop per start: the watchdog's own start of a trivial job (``true``; ``spawn_s`` of
  ``job.json``: fork, setgroups/setgid/setuid, chdir as the user, exec) as the daemon's account (no
  ``user``: today's path) and as a throwaway account made with ``useradd`` (removed at the end,
  also on Ctrl-C); medians over ``--starts`` starts each. The figure against the target is
  lookup + re-check + the difference of the two.
- the whole :meth:`Runner.start` (start of the watchdog's python to the job running), alternating
  root and the user; on a loaded machine its noise is larger than the difference.

Needs root (it creates an account and switches to it); without root only the lookup of the
current user is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

from gpulayerd.app.worker import machine
from gpulayerd.runs.account import JobUser, check_still_maps, lookup_user, this_user
from gpulayerd.runs.launch import resolve_job_user
from gpulayerd.runs.runner import Runner

TARGET_MS = 5.0


def line(label: str, value_ms: float, target_ms: float | None = None) -> None:
    text = f"{label}: {value_ms:.2f} ms"
    if target_ms is None:
        print(f"{text} (no target)")
        return
    ok = value_ms <= target_ms
    print(f"{text} (target <= {target_ms:g} ms: {'ok' if ok else 'MISSED'}, {value_ms / target_ms:.2f}x of target)")


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def start_ms(runner: Runner, n: int, user: JobUser, workdir: Path) -> tuple[float, float]:
    """Medians of ``Runner.start`` of ``true`` (returns once the job runs) as the daemon and as ``user``.

    The two alternate, so that a change of the machine's load hits both alike.
    """
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n * 2):
        as_user = i % 2 == 1
        t0 = time.perf_counter()
        h = runner.start(f"start{i}", 1, ["true"], {"PATH": "/usr/bin:/bin"}, workdir, user=user if as_user else None)
        times[as_user].append((time.perf_counter() - t0) * 1000)
        end = time.monotonic() + 10
        while runner.poll(h).running and time.monotonic() < end:
            time.sleep(0.005)
    return statistics.median(times[False]), statistics.median(times[True])


def spawn_ms(runner: Runner, n: int, user: JobUser | None, workdir: Path) -> float:
    """Median of the watchdog's own start of the job (``spawn_s`` in ``job.json``: fork, account switch,
    chdir, exec), which the load of the machine disturbs far less than the whole start."""
    times = []
    for i in range(n):
        h = runner.start(f"spawn-{'user' if user else 'root'}{i}", 1, ["true"], {"PATH": "/usr/bin:/bin"}, workdir,
                         user=user)
        times.append(float(json.loads((h.run_dir / "job.json").read_text())["spawn_s"]) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20, help="job starts per variant (default 20)")
    parser.add_argument("--lookups", type=int, default=500, help="lookups to take the median of (default 500)")
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    me = this_user()
    line(f"identity lookup of {me.name} (pwd + getgrouplist, per start)",
         median_ms(lambda: resolve_job_user(me.name, "personal", False), args.lookups))
    line("uid -> name re-check in the watchdog (per start)", median_ms(lambda: check_still_maps(me), args.lookups))
    if os.geteuid() != 0:
        print("not root: the account switch is not measured (run with sudo)")
        return
    name = f"glbench-{secrets.token_hex(3)}"
    root = Path(tempfile.mkdtemp(prefix="gpulayer-bench-users-"))
    try:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
                       check=True, capture_output=True)
        user = lookup_user(name)
        line(f"identity lookup of {name} (pwd + getgrouplist, per start)",
             median_ms(lambda: resolve_job_user(name, "system", False), args.lookups))
        workdir_check = median_ms(lambda: machine._enter_as(user.home, name, 5.0), max(args.starts, 20))
        line(f"workdir check as {name} (forked helper, per workdir and pass)", workdir_check)
        work = Path(user.home)
        runner = Runner(root / "runs", grace_s=1.0, poll_interval_s=0.1, log_cap_bytes=1 << 20)
        plain, switched = spawn_ms(runner, args.starts, None, work), spawn_ms(runner, args.starts, user, work)
        line("the watchdog's start of the job as its own account (root), median", plain)
        line(f"the watchdog's start of the job as {name} (setgroups/setgid/setuid, chdir as it), median", switched)
        lookup = median_ms(lambda: resolve_job_user(name, "system", False), args.lookups)
        check = median_ms(lambda: check_still_maps(user), args.lookups)
        line("added to submit->start by running as the user (lookup + re-check + privilege drop)",
             lookup + check + switched - plain, TARGET_MS)
        line("... and with one workdir check as the user before the claim (the scheduler's pass)",
             workdir_check + lookup + check + switched - plain, TARGET_MS)
        as_daemon, as_user = start_ms(runner, args.starts, user, work)
        line("whole Runner.start (watchdog start to job running) as root, median; noisy on a loaded machine",
             as_daemon)
        line(f"whole Runner.start as {name}, median", as_user)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
        subprocess.run(["userdel", "--remove", "--force", name], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
