"""``gpulayerd``: the daemon's entry point (args -> config -> daemon.run()); nothing else.

(Every ``__main__.py`` of the package is the same idea: the entry point of its package.)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulayerd",
        description="The gpulayer daemon: probes this machine, keeps its job queue in SQLite, runs jobs "
        "and serves the local API on a unix socket. Runs in the foreground (the service files run it).",
    )
    from gpulayerd import __version__

    p.add_argument("--version", action="version", version=f"gpulayerd {__version__}",
                   help="print the version and exit")
    p.add_argument("--system", action="store_const", const="system", dest="mode", default=None,
                   help="system mode, the lab install (same as mode = \"system\" in --config): run as root for "
                   "every local account, state in /var/lib/gpulayer, socket /run/gpulayer/gpulayerd.sock (0666; "
                   "each request's user comes from the kernel); --state-dir and --runtime-dir still win")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="TOML settings file: most flags as a key with _ for - (e.g. cpu_slots = 4; but --python "
                   "is interpreters = [...], --peer is peers = [...], --no-mdns is mdns = false, --system is "
                   "mode = \"system\"), plus workdir_timeout_s and the other settings the README lists")
    p.add_argument("--python", action="append", metavar="PATH", dest="interpreters",
                   help="workload interpreter (repeatable, in preference order; default: this one)")
    env_state = os.environ.get("GPULAYER_STATE_DIR")
    p.add_argument("--state-dir", type=Path, metavar="DIR", default=Path(env_state) if env_state else None,
                   help="SQLite store and job logs (env GPULAYER_STATE_DIR; default: the platform's user state dir)")
    p.add_argument("--runtime-dir", type=Path, metavar="DIR",
                   help="directory of the local API socket (default: <state-dir>/run when --state-dir is "
                   "given, else the platform's user runtime dir)")
    env_locks = os.environ.get("GPULAYER_DEVICE_LOCK_DIR")
    p.add_argument("--device-lock-dir", type=Path, metavar="DIR", default=Path(env_locks) if env_locks else None,
                   help="machine-wide lock files: one per device, and gpulayerd.lock (one daemon per machine, "
                   "whatever its mode); every daemon of the machine must use the same one "
                   "(env GPULAYER_DEVICE_LOCK_DIR; default /tmp/gpulayer-locks)")
    p.add_argument("--cpu-slots", type=int, metavar="N",
                   help="CPU processes run at once (default: the CPUs this daemon may use, from its affinity "
                   "mask and its cgroup's CPU quota)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="where the peer API listens (mutual TLS; it serves only once this machine is in a "
                   "cluster: gpulayer cluster init/join), default 0.0.0.0:7171; the enrollment port is PORT+1")
    p.add_argument("--peer", action="append", metavar="HOST:PORT", dest="peers",
                   help="a static peer (repeatable), for networks that block multicast")
    p.add_argument("--no-mdns", action="store_false", dest="mdns", default=None,
                   help="do not advertise or browse over mDNS")
    p.add_argument("--interface", metavar="NAME", help="the LAN interface to advertise (default: all LAN ones)")
    p.add_argument("--isolated", action="store_const", const=True, default=None,
                   help="run beside another gpulayerd of this machine: CPU slots only (no GPU), no machine-wide "
                   "lock (give --device-lock-dir a directory of its own), no cluster")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="how much the daemon logs (stderr; default INFO)")
    return p


def _configure_logging(level: str) -> None:
    # Under systemd (JOURNAL_STREAM set) journald adds timestamps itself.
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else (
        "%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    # aiosqlite logs every statement at DEBUG: keep --log-level DEBUG readable.
    logging.getLogger("aiosqlite").setLevel(max(logging.INFO, logging.getLevelName(level)))


def _raise_file_limit() -> None:
    """Raise the soft limit on open files to the hard one (peers, jobs and clients each hold some)."""
    import resource

    log = logging.getLogger("gpulayerd")
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == hard:
            log.info("open files limit: %s (already the hard limit)", soft)
            return
        # macOS refuses more than OPEN_MAX (10240) as the soft limit even when the hard one is unlimited.
        target = hard if hard != resource.RLIM_INFINITY else (10240 if sys.platform == "darwin" else 1 << 20)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("open files limit raised from %s to %d", soft, target)
    except (ValueError, OSError) as e:
        log.warning("cannot raise the open files limit: %s", e)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns the exit code.

    Exit codes: 0 after a clean stop, 1 on a start-up failure (another gpulayerd runs on this
    machine, an unsafe directory, a damaged store: one message, no traceback) or when the
    store's file was removed while running, 2 on bad settings (system mode when not root too).
    """
    args = _parser().parse_args(argv)
    _configure_logging(args.log_level)
    from gpulayerd.config import ConfigError, DaemonConfig
    from gpulayerd.daemon import DaemonAlreadyRunning, SharedInstallProblem, StateLost, run
    from gpulayerd.store import StoreError

    overrides: dict[str, object] = {
        "interpreters": args.interpreters,
        "state_dir": args.state_dir,
        "runtime_dir": args.runtime_dir,
        "device_lock_dir": args.device_lock_dir,
        "cpu_slots": args.cpu_slots,
        "listen": args.listen,
        "peers": args.peers,
        "mdns": args.mdns,
        "interface": args.interface,
        "mode": args.mode,
        "isolated": args.isolated,
    }
    try:
        config = DaemonConfig.load(args.config, overrides)
    except ConfigError as e:
        print(f"gpulayerd: {e}", file=sys.stderr)
        return 2
    if config.mode == "system" and os.geteuid() != 0:
        print(f"gpulayerd: system mode runs as root (it starts each job as its user); this is uid {os.geteuid()}. "
              "Run it as a system service (sudo gpulayer service install --system), or leave out --system "
              "(and mode = \"system\") for a personal daemon", file=sys.stderr)
        return 2
    _raise_file_limit()
    try:
        # --system (how the system unit starts it): every account must be able to run the jobs' interpreters.
        asyncio.run(run(config, check_shared_install=args.mode == "system"))
    except (DaemonAlreadyRunning, StoreError, StateLost, SharedInstallProblem) as e:
        print(f"gpulayerd: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"gpulayerd: cannot start: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # e.g. --interface names no usable interface
        print(f"gpulayerd: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
