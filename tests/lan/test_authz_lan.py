"""Authorization by role over the real peer port (issue 12): a valid member that does not hold a job
posts forged reports and kills with its own certificate, and nothing changes.

h1 owns a CUDA job that only h2 (fake GPU) can run; h3, a member of the same cluster with its
own valid certificate, tells h1 the job exited and was lost, renews it, tells h2 to kill it
and asks h2 for its log (also with a traversal job id and a negative offset). The job runs to
its own end on h2 as attempt 1, and its environment values reach h2 but not h3.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.lan.harness import FAST_CLUSTER, Host, Lan

pytestmark = pytest.mark.slow

PORT = 7171
MDNS = ["--interface", "eth0"]
QUIET = "INFO"

# One HTTPS request with a member's own files (cert, key, CA); prints {"status": int, "body": str}.
CALL = r"""
import json, socket, ssl, sys
method, host, port, path, body, cert, key, ca = sys.argv[1:9]
ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
ctx.check_hostname = False
ctx.load_cert_chain(cert, key)
request = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body.encode())}\r\nConnection: close\r\n\r\n{body}").encode()
with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5), server_hostname=host) as s:
    s.sendall(request)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": payload.decode("utf-8", "replace")}))
"""


def _call(sender: Host, target: Host, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """``sender`` calls ``target``'s peer port with its own certificate; (HTTP status, JSON body or text)."""
    i = sender.identity_dir
    method = "GET" if body is None else "POST"
    r = sender.run([sys.executable, "-c", CALL, method, target.ip, str(PORT), path,
                    "" if body is None else json.dumps(body), str(i / "node.crt"), str(i / "node.key"),
                    str(i / "ca.crt")], check=True, timeout_s=30)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    try:
        return out["status"], json.loads(out["body"])
    except json.JSONDecodeError:
        return out["status"], out["body"]


def test_a_member_that_does_not_hold_a_job_can_change_nothing(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    lan.form_cluster()
    h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, wait=False)
    h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, fake_gpus=[(16384, "7.5")], wait=False)
    h3.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, log_level=QUIET, wait=False)
    for h in (h1, h2, h3):
        h.wait_daemon()
    lan.wait_cluster(timeout_s=20)

    go = h1.root / f"go-{secrets.token_hex(4)}"  # the job ends once the checks are through (not on a timer)
    job = h1.submit({"command": ["sh", "-c", f"echo started; while [ ! -e {go} ]; do sleep 0.1; done; echo done"],
                     "env": {"HF_TOKEN": "s3cret"},
                     "requirements": {"accelerator": "cuda"}, "policy": {"retries": 1}}).id
    before = h1.wait_job(job, states={"running"})
    assert (before.attempt, before.holder) == (1, h2.node_id)
    log = h2.state_dir / "runs" / job / "1" / "stdout.log"
    lan.wait(log.exists, timeout_s=10, what="the job's log on h2")
    attempts_before = [(a.attempt, a.worker, a.state, a.ended_at) for a in before.attempts]

    def report(kind: str, **kw: Any) -> dict[str, Any]:
        return {"msg_id": secrets.token_hex(8), "worker": h3.node_id, "job_id": job, "attempt": 1, "kind": kind,
                **kw}

    # h3's own, valid certificate: the messages are authenticated, but h3 holds nothing.
    for body in (report("exited", exit_code=0), report("lost", reason="forged"), report("renew")):
        status, reply = _call(h3, h1, "/v1/peer/report", body)
        assert (status, reply["ok"], reply["stale"]) == (200, False, True), (body["kind"], status, reply)
    kill = {"msg_id": secrets.token_hex(8), "owner": h3.node_id, "job_id": job, "attempt": 1, "reason": "forged"}
    assert _call(h3, h2, "/v1/peer/kill", kill)[0] == 403
    assert _call(h3, h2, "/v1/peer/logs", {"job_id": job, "attempt": 1})[0] == 403
    assert _call(h3, h2, "/v1/peer/logs", {"job_id": "../../../identity", "attempt": 1})[0] == 400
    assert _call(h1, h2, "/v1/peer/logs", {"job_id": job, "attempt": 1, "offset": -1})[0] == 400
    status, chunk = _call(h1, h2, "/v1/peer/logs", {"job_id": job, "attempt": 1})  # the owner may read it
    assert (status, chunk["data"]) == (200, "started\n"), chunk
    # Environment values go to the node that runs the job only.
    asks = {"msg_id": secrets.token_hex(8), "user": "root"}  # the job's user, on h2 or on h3
    envs = {h.name: {j["id"]: j["spec"]["env"] for j in _call(h, h1, "/v1/peer/jobs", asks)[1]["jobs"]}
            for h in (h2, h3)}
    assert envs == {"h2": {job: {"HF_TOKEN": "s3cret"}}, "h3": {job: {"HF_TOKEN": ""}}}, envs

    time.sleep(1.0)  # anything that got through would show by now
    now = h1.job(job)
    assert (now.status, now.attempt, now.holder) == ("running", 1, h2.node_id), now.reason
    assert [(a.attempt, a.worker, a.state, a.ended_at) for a in now.attempts] == attempts_before
    go.touch()
    done = h1.wait_job(job, timeout_s=30)
    assert (done.status, done.exit_code, len(done.attempts)) == ("succeeded", 0, 1), done.reason
    assert log.read_text() == "started\ndone\n"
    assert not (h3.state_dir / "runs" / job).exists() and not (h1.state_dir / "runs" / job).exists()
