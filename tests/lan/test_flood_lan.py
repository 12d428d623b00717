"""A flood of idle connections to the peer port (issue 12): the local API keeps answering.

h1, a machine with no certificate, holds 2,000 plain TCP connections to h2's peer port from
eight addresses (250 each) and opens a new one whenever one is closed; none ever starts a
TLS handshake. h2's daemon runs with an open-files limit of 1,024 (set on the running
process, as a distribution's default would be): before the limits, about 1,100 such
connections exhausted it and ``gpulayer jobs`` failed. Now every ``gpulayer jobs`` on h2
during the flood exits 0 within its timeout, and h2's daemon never holds more file
descriptors than its connection limit plus a margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import psutil
import pytest

from tests.lan.harness import Lan

pytestmark = pytest.mark.slow

PORT = 7171
TOTAL = 512  # the default peer_max_connections
PER_ADDRESS = 64  # the default peer_max_connections_per_address
UNAUTHENTICATED = 256  # the default peer_max_unauthenticated
SOURCES = 8
PER_SOURCE = 250
FLOOD_S = 10.0
MARGIN_FDS = 100

# Holds PER_SOURCE idle connections from each source address until the deadline, reopening
# closed ones (at most 500 a second); prints "ready", then a JSON summary.
FLOOD = r"""
import collections, json, resource, selectors, socket, sys, time
target, port, duration, sources, per_source = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \
    sys.argv[4].split(","), int(sys.argv[5])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
sel = selectors.DefaultSelector()
count = {"opened": 0, "closed_by_server": 0}

def open_one(src):
    s = socket.socket()
    s.setblocking(False)
    s.bind((src, 0))
    s.connect_ex((target, port))
    sel.register(s, selectors.EVENT_READ, src)
    count["opened"] += 1

for src in sources:
    for _ in range(per_source):
        open_one(src)
print("ready", flush=True)
pending = collections.deque()
end = time.monotonic() + duration
budget, last = 0.0, time.monotonic()
while time.monotonic() < end:
    for key, _ in sel.select(0.05):
        s = key.fileobj
        try:
            data = s.recv(1)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if not data:
            sel.unregister(s)
            s.close()
            count["closed_by_server"] += 1
            pending.append(key.data)
    now = time.monotonic()
    budget, last = min(500.0, budget + 500.0 * (now - last)), now
    while pending and budget >= 1:
        open_one(pending.popleft())
        budget -= 1
count["open_at_end"] = len(sel.get_map())
print(json.dumps(count), flush=True)
"""


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_local_api_answers_while_the_peer_port_is_flooded(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(2)
    h1, h2 = lan.hosts
    lan.form_cluster(h2)
    daemon = h2.start_daemon(config={"peer_handshake_timeout_s": 2.0}, extra_args=["--no-mdns"], log_level="INFO")
    assert "gpulayerd" in " ".join(psutil.Process(daemon.pid).cmdline())
    subprocess.run(["prlimit", f"--pid={daemon.pid}", "--nofile=1024:1024"], check=True)
    assert h2.cli("jobs", timeout_s=15).returncode == 0
    baseline = _fds(daemon.pid)

    prefix = h1.ip.rsplit(".", 1)[0]
    sources = [h1.ip] + [f"{prefix}.{200 + i}" for i in range(1, SOURCES)]
    for address in sources[1:]:
        h1.run(["ip", "addr", "add", f"{address}/24", "dev", "eth0"], check=True)

    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(_fds(daemon.pid))
            except OSError:
                return
            stop.wait(0.05)

    flood = h1.popen([sys.executable, "-c", FLOOD, h2.ip, str(PORT), str(FLOOD_S), ",".join(sources),
                      str(PER_SOURCE)], stdout=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=sample, daemon=True)
    try:
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "ready"
        sampler.start()
        calls: list[tuple[int, float, str]] = []
        while flood.poll() is None:
            t0 = time.monotonic()
            r = h2.cli("jobs", timeout_s=15)
            calls.append((r.returncode, time.monotonic() - t0, r.stderr[-300:]))
        summary = json.loads(flood.stdout.read().strip().splitlines()[-1])
    finally:
        stop.set()
        if flood.poll() is None:
            flood.kill()
        flood.wait(10)
    sampler.join(5)

    assert len(calls) >= 3, calls
    assert all(code == 0 for code, _, _ in calls), calls
    assert summary["opened"] >= SOURCES * PER_SOURCE
    assert summary["closed_by_server"] > SOURCES * PER_SOURCE - TOTAL, summary  # the ones over the limits
    peak = max(samples)
    # The flood did reach the daemon: its /24 holds at most half of the strangers' budget (issue 24:
    # peer_max_unauthenticated, 256 of the 512 slots), and reopens faster than the handshake deadline.
    assert peak > baseline + UNAUTHENTICATED // 2 - 28, (baseline, peak)
    assert peak < baseline + TOTAL + MARGIN_FDS, (baseline, peak)
    assert h2.daemon_running()
    assert "refused a connection from" in h2.log_tail(200_000)
    assert h2.cli("jobs", timeout_s=15).returncode == 0
