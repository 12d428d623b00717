"""Revocation over the real peer port (issue 12): ``gpulayer cluster remove h3`` on the signer h1.

h3 (the only host with a GPU) runs a job before; then h1 removes it. Within a heartbeat round
of h1 (which reads the entry at its next round), h1 and h2 (which learns it only from h1's
heartbeats) close the connections h3 held open to them and answer h3's new connections 403,
and a new GPU job stays queued: it is never offered to h3 again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.lan.harness import FAST_CLUSTER, Lan
from tests.lan.test_authz_lan import MDNS, PORT, QUIET, _call

pytestmark = pytest.mark.slow

# Holds one keep-alive connection to the peer port with a member's files; prints "open STATUS"
# after the first answer, then "closed" when the server closes it (or "timeout").
HOLD = r"""
import socket, ssl, sys
host, port, cert, key, ca = sys.argv[1:6]
ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
ctx.check_hostname = False
ctx.load_cert_chain(cert, key)
s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=60), server_hostname=host)
s.sendall(f"GET /v1/peer/capabilities HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
first = s.recv(65536)
print("open", first.split(b"\r\n")[0].decode().split()[1], flush=True)
try:
    while s.recv(65536):
        pass
    print("closed", flush=True)
except TimeoutError:
    print("timeout", flush=True)
except OSError:
    print("closed", flush=True)
"""

GPU_JOB = {"command": ["sleep", "1"], "requirements": {"accelerator": "cuda"}}


def test_removed_node_is_refused_by_every_member(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    lan.form_cluster()  # h1 is the signer
    h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, wait=False)
    h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, wait=False)
    h3.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, fake_gpus=[(16384, "7.5")], wait=False)
    for h in (h1, h2, h3):
        h.wait_daemon()
    lan.wait_cluster(timeout_s=20)

    before = h1.submit(GPU_JOB).id
    done = h1.wait_job(before, timeout_s=30)
    assert (done.status, done.attempts[0].worker) == ("succeeded", h3.node_id), done.reason

    i3 = h3.identity_dir
    files = [str(i3 / "node.crt"), str(i3 / "node.key"), str(i3 / "ca.crt")]
    holds = {m.name: h3.popen([sys.executable, "-c", HOLD, m.ip, str(PORT), *files], stdout=subprocess.PIPE,
                              text=True) for m in (h1, h2)}  # h3 keeps a connection open to each member
    closed_after = {}
    try:
        for hold in holds.values():
            assert hold.stdout is not None
            assert hold.stdout.readline().split() == ["open", "200"]
        assert _call(h3, h2, "/v1/peer/capabilities")[0] == 200

        h1.cli_ok("cluster", "remove", h3.node_id)
        removed = time.monotonic()
        for name, hold in holds.items():
            out, _ = hold.communicate(timeout=30)
            assert out.split() == ["closed"], (name, out)
            closed_after[name] = time.monotonic() - removed
    finally:
        for hold in holds.values():
            if hold.poll() is None:
                hold.kill()
                hold.wait()
    print(f"h3's open connections closed after 'cluster remove' returned: {closed_after}")
    # h1 reads the entry at its next heartbeat round and sends it with the one after: h2 learns it
    # within a round of h1 (0.5 s here); 1.5 s = three rounds, leaving room for a loaded machine.
    assert max(closed_after.values()) < 1.5, f"h3's connections closed {closed_after} s after the removal"
    for member in (h1, h2):
        status, body = _call(h3, member, "/v1/peer/capabilities")
        assert status == 403 and "removed from the cluster" in str(body), (member.name, status, body)

    # Not offered to h3 any more: a GPU job (only h3 has a GPU) stays queued with no attempt.
    after = h1.submit(GPU_JOB).id
    time.sleep(3.0)  # several offer intervals (1 s): an offer to h3 would have been claimed by now
    view = h1.job(after)
    assert (view.status, view.attempts) == ("queued", []), view

    # The removal is visible (issue 28): the members list h3 as removed, not "trusted, down"; h3 itself,
    # refused at its next heartbeats, says so in `peers` and `cluster show`.
    for member in (h1, h2):
        row = next(line for line in member.cli_ok("peers").splitlines() if line.startswith(h3.node_id[:12]))
        assert "removed" in row.split() and "trusted" not in row.split(), (member.name, row)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "removed:" not in h3.cli_ok("cluster", "show"):
        time.sleep(0.3)
    shown = h3.cli_ok("cluster", "show")
    assert "removed:    removed from the cluster" in shown and "gpulayer cluster leave" in shown, shown
    me = next(line for line in h3.cli_ok("peers").splitlines() if line.startswith(h3.node_id[:12]))
    assert "removed" in me.split(), me
    assert "this node was removed from the cluster" in h3.cli("jobs").stderr
    # A job h3 cannot run itself waits saying the removal is why nobody else takes it.
    alone = h3.submit({"command": ["true"], "requirements": {"accelerator": "cuda", "gpu_memory_gb": 40}}).id
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and h3.job(alone).reason_code == "Pending":
        time.sleep(0.3)
    waiting = h3.job(alone)
    assert waiting.status == "queued" and waiting.reason_code == "Removed", waiting.reason
    assert "removed from the cluster" in waiting.reason and "Memory: " in waiting.reason, waiting.reason
    listed = h1.cli("jobs")
    assert f"jobs owned by {h3.hostname} are not listed: removed from the cluster" in listed.stderr, listed.stderr
