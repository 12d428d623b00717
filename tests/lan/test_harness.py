"""The LAN harness itself: namespaces, bridge, multicast, daemons, fake GPUs, teardown.

These do not depend on the peer protocol; they check what the protocol's tests rely on.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import signal
import subprocess
import sys
from collections.abc import Callable

import psutil
import pytest

from tests.lan.harness import Host, Lan, _ns_id, _pids_in, netns_list, netns_pids, sweep_stale

GROUP = "224.0.0.251"  # the mDNS group, on a port of our own
PORT = 5399

RECEIVER = r"""
import socket, sys
group, port, iface, timeout_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((group, port))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + socket.inet_aton(iface))
print("ready", flush=True)
s.settimeout(timeout_s)
try:
    data, (src, _) = s.recvfrom(1500)
except TimeoutError:
    print("timeout", flush=True)
    sys.exit(1)
print(data.decode(), src, flush=True)
"""

SENDER = r"""
import socket, sys, time
group, port, iface, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface))
for _ in range(15):
    s.sendto(payload.encode(), (group, port))
    time.sleep(0.05)
"""


def _receivers(hosts: list[Host], timeout_s: float) -> list[subprocess.Popen[str]]:
    procs = [h.popen([sys.executable, "-c", RECEIVER, GROUP, str(PORT), h.ip, str(timeout_s)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in hosts]
    for h, p in zip(hosts, procs, strict=True):
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        assert line == "ready", f"[{h.name}] receiver: {line!r} {p.stderr.read() if p.stderr else ''}"
    return procs


def _multicast_round(sender: Host, receivers: list[Host], payload: str, timeout_s: float = 1.5) -> dict[str, str]:
    """Send ``payload`` from ``sender`` to the group; what each receiver got ("" for nothing)."""
    procs = _receivers(receivers, timeout_s)
    sender.run([sys.executable, "-c", SENDER, GROUP, str(PORT), sender.ip, payload], check=True)
    got = {}
    for h, p in zip(receivers, procs, strict=True):
        out, err = p.communicate(timeout=timeout_s + 10)
        got[h.name] = out.strip() if p.returncode == 0 else ""
        assert p.returncode in (0, 1), f"[{h.name}] receiver exit {p.returncode}: {err}"
    return got


def test_hosts_are_namespaces_on_one_bridge(lan3: Lan) -> None:
    assert lan3.subnet is not None
    names = set(netns_list())
    assert {lan3.bridge_ns, *(h.ns for h in lan3.hosts)} <= names
    assert all(len(ns) <= 15 for ns in lan3.namespaces)
    for a, b in itertools.permutations(lan3.hosts, 2):
        assert a.ping(b), f"{a} cannot ping {b}"
    for h in lan3.hosts:
        assert ipaddress.ip_address(h.ip) in lan3.subnet
        assert h.run(["hostname"], check=True).stdout.strip() == h.hostname
        addrs = h.run(["ip", "-4", "-o", "addr", "show"], check=True).stdout
        assert f"{h.ip}/24" in addrs
    # Nothing of the LAN is in the root namespace.
    root = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    assert str(lan3.subnet.network_address)[:-1] not in root
    assert not any(h.ip in root for h in lan3.hosts)


def test_multicast_crosses_the_bridge_until_dropped(lan3: Lan) -> None:
    h1, h2, h3 = lan3.hosts
    got = _multicast_round(h1, [h2, h3], "hello")
    assert got == {"h2": f"hello {h1.ip}", "h3": f"hello {h1.ip}"}

    lan3.drop_multicast()
    assert _multicast_round(h1, [h2, h3], "dropped") == {"h2": "", "h3": ""}
    assert h1.ping(h2) and h2.ping(h3), "unicast must still pass"

    lan3.allow_multicast()
    lan3.drop_multicast(h3)  # only h3 is cut off
    assert _multicast_round(h1, [h2, h3], "partial") == {"h2": f"partial {h1.ip}", "h3": ""}
    assert h1.ping(h3)

    lan3.allow_multicast()
    assert _multicast_round(h1, [h3], "back") == {"h3": f"back {h1.ip}"}


def test_daemon_runs_a_job_in_its_namespace(lan3: Lan) -> None:
    h1 = lan3.host(1)
    h1.start_daemon()
    assert h1.cli_json("jobs", "--json") == []
    health = h1.api(lambda c: c.health())
    assert health.hostname == h1.hostname
    job = json.loads(h1.cli_ok("submit", "--json", "--", "sh", "-c", "echo hi; hostname; ip -4 -o addr show eth0"))

    def finished() -> dict[str, object] | None:
        shown: dict[str, object] = h1.cli_json("show", "--json", job["id"])
        return shown if shown["status"] in ("succeeded", "failed", "lost", "cancelled", "rejected") else None

    shown = lan3.wait(finished, timeout_s=30, what="the job to finish")
    assert shown["status"] == "succeeded", f"{shown}\n{h1.log_tail()}"
    out = h1.cli_ok("logs", job["id"])
    assert out.startswith(f"hi\n{h1.hostname}\n"), out
    assert f"{h1.ip}/24" in out  # the job ran in h1's namespace
    assert h1.kill_daemon(signal.SIGTERM) == 0


def test_fake_gpus_on_one_host_only(lan3: Lan) -> None:
    h1, h3 = lan3.host(1), lan3.host(3)
    fake = h3.set_fake_gpus([24576, 81920])
    on_h3 = h3.cli_json("devices", "--json")
    assert [d["uuid"] for d in on_h3["devices"]] == fake.uuids
    assert on_h3["hostname"] == h3.hostname
    assert h1.cli_json("devices", "--json")["devices"] == []
    h3.start_daemon()
    assert [d.uuid for d in h3.api(lambda c: c.devices()).devices] == fake.uuids


def _is_dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_teardown_leaves_no_namespace_and_no_process() -> None:
    lan = Lan(2)
    with lan:
        h1, h2 = lan.hosts
        h1.start_daemon()
        job = json.loads(h1.cli_ok("submit", "--json", "--", "sleep", "300"))
        lan.wait(lambda: h1.cli_json("show", "--json", job["id"])["status"] == "running", timeout_s=30,
                 what="the job to run")
        h2.popen("setsid sleep 300 < /dev/null > /dev/null 2>&1 &")  # escapes its parent
        lan.wait(lambda: len(netns_pids(h2.ns)) >= 1, timeout_s=5, what="the detached sleeper")
        ns_ids = [_ns_id(ns) for ns in lan.namespaces]
        pids = {p for ns in lan.namespaces for p in netns_pids(ns)}
        assert lan.root.is_dir()
    assert None not in ns_ids and len(pids) >= 3  # daemon, job, sleeper at least
    assert not [ns for ns in netns_list() if ns.startswith(lan.prefix)]
    assert all(not _pids_in(i) for i in ns_ids if i is not None)
    assert [p for p in pids if not _is_dead(p)] == []
    assert not lan.root.exists()
    lan.close()  # idempotent


def test_teardown_runs_when_the_test_body_fails() -> None:
    lan = Lan(1)
    with pytest.raises(RuntimeError, match="boom"), lan:
        lan.host(1).popen(["sleep", "300"])
        raise RuntimeError("boom")
    assert not [ns for ns in netns_list() if ns.startswith(lan.prefix)]


def test_sweep_removes_namespaces_of_dead_runs(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (lan.root / "owner").write_text(f"{dead.pid} 0.000", encoding="ascii")  # as if its run was killed
    from tests.lan import harness

    harness._LIVE.pop(lan.prefix)
    try:
        assert sorted(sweep_stale()) == sorted(lan.namespaces)
        assert not [ns for ns in netns_list() if ns.startswith(lan.prefix)]
        assert not lan.root.exists()
    finally:
        harness._LIVE[lan.prefix] = lan  # the fixture's close() finds nothing left to remove
