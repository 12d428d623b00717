"""Revocation over the real peer port (issue 12): ``gpulayer cluster remove h3`` on the signer h1.

h3 (the only host with a GPU) runs a job before; then h1 removes it. Within a few heartbeat
rounds h2 (which learns it only from h1's heartbeats) closes the connection h3 held open to
it and answers h3's new connections 403, h1 does too, and a new GPU job stays queued: it is
never offered to h3 again.
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
s.sendall(f"GET /v1/peer/jobs HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
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
    hold = h3.popen([sys.executable, "-c", HOLD, h2.ip, str(PORT), *files], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout is not None
        assert hold.stdout.readline().split() == ["open", "200"]
        assert _call(h3, h2, "/v1/peer/jobs")[0] == 200

        h1.cli_ok("cluster", "remove", h3.node_id)
        removed = time.monotonic()
        out, _ = hold.communicate(timeout=30)
        closed_after = time.monotonic() - removed
    finally:
        if hold.poll() is None:
            hold.kill()
            hold.wait()
    print(f"h3's open connection to h2 closed {closed_after:.2f} s after 'cluster remove' returned")
    assert out.split() == ["closed"], out
    assert closed_after < 3.0, f"h2 closed h3's connection {closed_after:.2f} s after the removal"
    for member in (h1, h2):
        status, body = _call(h3, member, "/v1/peer/jobs")
        assert status == 403 and "removed from the cluster" in str(body), (member.name, status, body)

    # Not offered to h3 any more: a GPU job (only h3 has a GPU) stays queued with no attempt.
    after = h1.submit(GPU_JOB).id
    time.sleep(3.0)  # several offer intervals (1 s): an offer to h3 would have been claimed by now
    view = h1.job(after)
    assert (view.status, view.attempts) == ("queued", []), view
