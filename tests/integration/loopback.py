"""Two or more :class:`~tests.integration.conftest.Daemon` in one cluster on 127.0.0.1.

No network namespace and no mDNS: every daemon's peer API listens on 127.0.0.1 on its
own port, and each one knows the first ("founding") daemon as a static peer (``peers``
in its config file, what ``--peer`` sets); the founder learns the others from their
heartbeats. The cluster is made with ``gpulayer cluster init`` on the founder (a signer),
which then starts; the others enroll ONLINE at its enrollment listener with
``gpulayer cluster join -`` (the token from ``gpulayer cluster token`` on stdin) and start.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .conftest import GPULAYER, Daemon, Lab, clean_env, wait_until

__all__ = ["LOOPBACK", "free_port", "join", "loopback_cluster", "node_id", "wait_cluster"]

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now on ``host`` (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def node_id(d: Daemon) -> str:
    """The node id of the running daemon ``d`` (``GET /v1/health``)."""
    return d.call(lambda c: c.health(), timeout_s=10).node_id


def loopback_cluster(
    lab: Lab, cpu_slots: Sequence[int], settings: Mapping[str, Any] | None = None, timeout_s: float = 30.0,
    each: Sequence[Mapping[str, Any]] | None = None, system: bool = False,
) -> list[Daemon]:
    """Start ``len(cpu_slots)`` daemons of ``lab`` (daemon i with ``cpu_slots[i]`` CPU slots) in
    one new cluster on 127.0.0.1 and wait until each lists every other one as up, trusted
    and with its capabilities. ``settings`` are config keys for every daemon (e.g. timings); ``each[i]``
    more keyword arguments of :meth:`Lab.daemon` for daemon i (its fake GPUs, its interpreters).
    ``system``: every daemon in system mode, enrolled so (``cluster init/join --system``).

    Returns the daemons, the founder first.
    """
    port = free_port()
    common: dict[str, Any] = {"mdns": "false", **({"mode": "system"} if system else {}), **(settings or {})}  # "false": TOML has no bare False in repr
    # Each daemon stands for a machine of its own: its own lock dir (one gpulayerd per machine).
    own = list(each or [{} for _ in cpu_slots])
    founder = lab.daemon(cpu_slots=cpu_slots[0], start=False, listen=f"{LOOPBACK}:{port}",
                         lock_dir=lab.root / "locks-0", **common, **own[0])
    others = [
        lab.daemon(cpu_slots=n, start=False, listen=f"{LOOPBACK}:0", peers=[f"{LOOPBACK}:{port}"],
                   lock_dir=lab.root / f"locks-{i}", **common, **own[i])
        for i, n in enumerate(cpu_slots[1:], start=1)
    ]
    daemons = [founder, *others]
    for d in daemons:
        d.work.mkdir(parents=True, exist_ok=True)  # the CLI's working directory
    founder.cli_ok("cluster", "init", *(["--system"] if system else []))
    founder.start()
    if others:
        token = json.loads(founder.cli_ok("cluster", "token", "--uses", str(len(others)), "--json"))["token"]
        for d in others:
            join(d, token, system)
            d.start()
    wait_cluster(daemons, timeout_s)
    return daemons


def join(d: Daemon, token: str, system: bool = False) -> str:
    """``gpulayer cluster join -`` (``--system``) for ``d`` with ``token`` on stdin (its signer must run);
    returns stdout."""
    r = subprocess.run([GPULAYER, "--state-dir", str(d.state_dir), "cluster", "join", *(["--system"] if system else []),
                        "-"], input=token,
                       cwd=d.work, env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, f"gpulayer cluster join -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def wait_cluster(daemons: Sequence[Daemon], timeout_s: float = 30.0) -> float:
    """Until every daemon lists each other one as up and trusted, with capabilities.

    Returns the time waited in seconds.
    """
    ids = {d: node_id(d) for d in daemons}
    seen: dict[str, Any] = {}

    def formed() -> bool:
        for d in daemons:
            peers = {p.node_id: p for p in d.call(lambda c: c.peers(), timeout_s=10)}
            seen[ids[d][:12]] = {n[:12]: (p.state, p.trusted, p.capabilities is not None) for n, p in peers.items()}
            for other in daemons:
                p = peers.get(ids[other])
                if other is not d and (p is None or p.state != "up" or not p.trusted or p.capabilities is None):
                    return False
        return True

    t0 = time.monotonic()
    try:
        wait_until(formed, timeout_s, "the loopback cluster to form", interval_s=0.1)
    except AssertionError as e:
        raise AssertionError(f"{e}; peers seen (state, trusted, capabilities): {seen}") from None
    return time.monotonic() - t0
