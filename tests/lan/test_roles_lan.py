"""The route table's roles over the real peer port (issue 23): a valid member without the role is refused.

A 3-host LAN of network namespaces: h1 a system-mode signer (the owner of gsxb's jobs), h2 a
system-mode member with one fake GPU (their worker), and on h3 a personal-mode node of user gsxa
(its certificate, issued by h1's admin for gsxa; the attacker sends raw HTTPS requests with it).
gsxa and gsxb are real throwaway accounts; gsxb submits through h1's socket as herself. Each of
the five attacks measured before the route table, reproduced with real daemons and real
certificates, is refused, and the owner's and the worker's stores are unchanged:

1. a claim without an offer (h2, a member that could run it, for a job never offered to it);
2. a claim by a personal node for another user's job (gsxa's node for gsxb's job);
3. a log read after a job id is reused by another owner (gsxa's node offers the id of gsxb's
   finished job to h2, restarted meanwhile, then asks for its log);
4. a heartbeat reporting usage for users it holds nothing for (gsxa's node for gsxb; h2 for
   more GPUs than it has);
5. ``/v1/peer/jobs`` from a personal node (gsxb's specs concealed as ``show`` conceals them).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.net.ca import cluster_init, cluster_join, new_token
from tests.fakes.accounts import Account, Accounts, SharedPython
from tests.lan.harness import FAST_CLUSTER, Host, Lan

pytestmark = pytest.mark.slow

PORT = 7171
SECRET = "s3cret-9d2e"
QUIET = "INFO"

# One HTTPS request with a node's own files (cert, key, CA); prints {"status": int, "body": str}.
CALL = r"""
import json, socket, ssl, sys
method, host, port, path, body, cert, key, ca = sys.argv[1:9]
ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
ctx.check_hostname = False
ctx.load_cert_chain(cert, key)
request = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body.encode())}\r\nConnection: close\r\n\r\n{body}").encode()
with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host) as s:
    s.sendall(request)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": payload.decode("utf-8", "replace")}))
"""


def call(on: Host, identity_dir: Path, target: Host, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """From ``on``'s namespace, with the certificate in ``identity_dir``, POST ``body`` to ``target``'s peer port."""
    r = on.run([sys.executable, "-c", CALL, "POST", target.ip, str(PORT), path, json.dumps(body),
                str(identity_dir / "node.crt"), str(identity_dir / "node.key"), str(identity_dir / "ca.crt")],
               check=True, timeout_s=30)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    try:
        return out["status"], json.loads(out["body"])
    except json.JSONDecodeError:
        return out["status"], out["body"]


STORED = {"jobs": "id, status, attempt, holder, retries_left, cancel_requested, exit_code, spec_json",
          "attempts": "*", "events": "*", "grants": "*", "remote_runs": "*", "submission_keys": "*",
          "gangs": "*"}
"""What a refused message must not change in a daemon's store (the jobs' reason lines and explanations,
which the scheduler refreshes by itself, and the peers' last-seen times are left out)."""


def stored(host: Host) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of :data:`STORED` in ``host``'s store, read-only beside the running daemon."""
    con = sqlite3.connect(f"file:{host.daemon_state_dir / 'gpulayer.sqlite3'}?mode=ro", uri=True)
    try:
        return {t: sorted(con.execute(f"SELECT {cols} FROM {t}").fetchall(), key=repr) for t, cols in STORED.items()}
    finally:
        con.close()


def submit_as(shared: SharedPython, who: Account, host: Host, *args: str) -> str:
    sock = host.root / "run" / "gpulayerd.sock"
    r = shared.cli(who, "--socket", str(sock), "submit", "--workdir", str(who.home), "--env", f"TOKEN={SECRET}",
                   "--json", *args)
    assert r.returncode == 0, f"submit as {who.name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return str(json.loads(r.stdout)["id"])


def test_five_attacks_of_a_member_without_the_role_are_refused_and_change_nothing(
        lan_factory: Callable[..., Lan], accounts: Accounts, shared_python: SharedPython,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Host, "socket_path", property(lambda h: h.root / "run" / "gpulayerd.sock"))
    gsxa, gsxb = accounts.user("gsxa"), accounts.user("gsxb")
    lan = lan_factory(3)
    h1, h2, h3 = lan.hosts
    token = cluster_init(h1.daemon_state_dir, None, mode="system", uses=1, addresses=[f"{h1.ip}:{PORT + 1}"])
    cluster_join(h2.daemon_state_dir, token, mode="system", signer=h1.daemon_state_dir)
    personal = new_token(h1.daemon_state_dir, user=gsxa.name, addresses=[f"{h1.ip}:{PORT + 1}"])
    gsxa_node = cluster_join(h3.root / "gsxa-state", personal, user=gsxa.name, signer=h1.daemon_state_dir)
    assert (gsxa_node.mode, gsxa_node.user) == ("personal", gsxa.name)
    attacker = gsxa_node.key_path.parent  # gsxa's node's identity dir: node.crt, node.key, ca.crt
    for h, gpus in ((h1, None), (h2, [(16384, "8.6")])):
        run = h.root / "run"
        run.mkdir(mode=0o755, exist_ok=True)
        h.start_daemon(config={**FAST_CLUSTER, "mode": "system"}, extra_args=["--runtime-dir", str(run)],
                       cpu_slots=2, log_level=QUIET, fake_gpus=gpus, wait=False)
    for h in (h1, h2):
        h.wait_daemon()
    lan.wait_cluster(h1, h2, timeout_s=20)

    # gsxb's jobs on h1: one runs on h2 (its GPU) and ends; one needs two GPUs and fits nowhere.
    ran = submit_as(shared_python, gsxb, h1, "--accelerator", "cuda", "--", "sh", "-c", "echo gsxb-output")
    waiting = submit_as(shared_python, gsxb, h1, "--accelerator", "cuda", "--gpus", "2", "--", "python3",
                        "train.py", f"--key={SECRET}")
    done = h1.wait_job(ran, timeout_s=60)
    assert (done.status, done.attempts[-1].worker) == ("succeeded", h2.node_id), done.reason
    assert h1.job(waiting).status == "queued"
    time.sleep(1.0)  # the end's report and the grants' release are written
    owner_before, worker_before = stored(h1), stored(h2)
    usage_before = {u.user: u for u in h1.api(lambda c: c.users())}

    # 1. A claim without an offer: h2 could run it (if it had two GPUs), but it was never offered to it.
    claim = {"msg_id": secrets.token_hex(8), "worker": h2.node_id, "job_id": waiting, "placement": {}}
    status, reply = call(h2, h2.identity_dir, h1, "/v1/peer/claim", claim)
    assert (status, reply["code"]) == (403, "forbidden") and "was not offered to it" in reply["message"], reply
    # 2. A claim by gsxa's personal node for gsxb's job (never offered to it, and not its user's).
    claim = {**claim, "msg_id": secrets.token_hex(8), "worker": gsxa_node.node_id}
    status, reply = call(h3, attacker, h1, "/v1/peer/claim", claim)
    assert status == 403 and f"{gsxa.name}'s personal-mode node" in reply["message"], reply
    assert SECRET not in json.dumps(reply)

    # 3. After a restart of the worker, gsxa's node offers the id of gsxb's finished job and reads its log.
    h2.stop_daemon()
    h2.start_daemon(config={**FAST_CLUSTER, "mode": "system"}, extra_args=["--runtime-dir", str(h2.root / "run")],
                    cpu_slots=2, log_level=QUIET, fake_gpus=[(16384, "8.6")])
    worker_before = stored(h2)  # (a restart writes nothing of the jobs; re-read for the comparison)
    offer = {"msg_id": secrets.token_hex(8), "owner": gsxa_node.node_id, "job_id": ran, "lease_s": 30.0,
             "spec": {"command": ["sh", "-c", "true"], "workdir": str(gsxa.home), "user": gsxa.name}}
    status, reply = call(h3, attacker, h2, "/v1/peer/offer", offer)
    assert status == 403 and "is another owner's here" in reply["message"], reply
    status, reply = call(h3, attacker, h2, "/v1/peer/logs", {"job_id": ran, "attempt": 1})
    assert status == 403 and "gsxb-output" not in json.dumps(reply), reply
    # The owner still reads it, as gsxb.
    out = shared_python.cli(gsxb, "--socket", str(h1.socket_path), "logs", ran)
    assert (out.returncode, out.stdout) == (0, "gsxb-output\n"), out

    # 4. Heartbeats that speak for users the sender holds nothing for, or for more than it has.
    cluster = h1.api(lambda c: c.peers())[0].cluster  # this node's own row: the cluster's id
    assert cluster
    beat = {"msg_id": secrets.token_hex(8), "node_id": gsxa_node.node_id, "name": "gsx3", "version": "0",
            "cluster": cluster, "port": PORT, "holdings": {gsxb.name: [1_000_000, 1_000_000]}}
    assert call(h3, attacker, h1, "/v1/peer/heartbeat", beat)[0] == 200  # public: answered, not counted
    beat = {**beat, "msg_id": secrets.token_hex(8), "node_id": h2.node_id, "name": "h2",
            "holdings": {gsxb.name: [1_000_000, 0]}}  # h2 advertises one GPU
    assert call(h2, h2.identity_dir, h1, "/v1/peer/heartbeat", beat)[0] == 200
    time.sleep(2.0)  # a forged report taken would have accrued by now (and would be held for 30 s)
    usage = {u.user: u for u in h1.api(lambda c: c.users())}
    b, was = usage.get(gsxb.name), usage_before.get(gsxb.name)
    assert b is not None and was is not None
    # Taken, either report would have added about 1,000,000 GPUs x 2 s = 555 GPU-h by now.
    assert b.gpu_hours <= was.gpu_hours + 1e-3 and b.holding == [], (b, was)
    assert h1.api(lambda c: c.health()).counters.get("refused_holdings", 0) >= 2

    # 5. /v1/peer/jobs from gsxa's personal node: gsxb's specs concealed, as show conceals them.
    for as_user in (gsxa.name, gsxb.name):  # gsxb's name from gsxa's node is nobody's
        status, reply = call(h3, attacker, h1, "/v1/peer/jobs", {"msg_id": secrets.token_hex(8), "user": as_user})
        assert status == 200
        jobs = {j["id"]: j for j in reply["jobs"]}
        assert set(jobs) >= {ran, waiting}
        for j in (jobs[ran], jobs[waiting]):
            assert (j["spec_hidden"], j["spec"]["command"], j["spec"]["env"]) == (True, ["<hidden>"], {}), j
        assert SECRET not in json.dumps(reply) and "train.py" not in json.dumps(reply)
        show = call(h3, attacker, h1, "/v1/peer/job/show", {"msg_id": secrets.token_hex(8), "job_id": waiting,
                                                              "user": as_user})[1]["body"]
        assert (show["spec_hidden"], show["spec"]["command"]) == (jobs[waiting]["spec_hidden"],
                                                                   jobs[waiting]["spec"]["command"])

    time.sleep(1.0)
    assert stored(h1) == owner_before
    assert stored(h2) == worker_before
    counters = h1.api(lambda c: c.health()).counters
    assert counters.get("refused_claim", 0) == 2, counters
    assert h2.api(lambda c: c.health()).counters.get("refused_offer", 0) == 1
