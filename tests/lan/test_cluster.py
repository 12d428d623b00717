"""Membership over a LAN of namespaces: mDNS discovery, trust, foreign clusters, the peer
port's refusal of anything that is not mutual TLS against the cluster CA, and static
peers when the network drops multicast.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpulayerd.net.identity import load_or_create_identity
from tests.lan.harness import FAST_CLUSTER, GPULAYER, Host, Lan

PORT = 7171
MDNS = ["--interface", "eth0"]  # mDNS on (the default), advertised on the LAN interface only
QUIET = "INFO"  # the daemon's DEBUG log is mostly aiosqlite statements

# Connects to HOST:PORT from inside a namespace and reports, as one JSON line, how far it
# got: {"handshake": bool, "response": first bytes the server answered, "error": str}.
# Modes: "member" (cert + key, verifies the server against CA: a correct peer), "client-cert"
# (presents cert + key, does not verify the server, so only the server can refuse),
# "no-cert" (TLS without a client certificate), "plain" (no TLS: a raw HTTP request); a
# "+tls12" suffix limits TLS to 1.2, where the server's refusal ends the handshake itself.
PROBE = r"""
import json, socket, ssl, sys
mode, host, port, path, body, cert, key, ca = sys.argv[1:9]
port = int(port)
method = "GET" if path.endswith("capabilities") else "POST"
request = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body.encode())}\r\nConnection: close\r\n\r\n{body}").encode()
out = {"handshake": False, "response": "", "error": ""}
raw = socket.create_connection((host, port), timeout=5)
try:
    if mode == "plain":
        sock = raw
        out["handshake"] = None
    else:
        tls12 = mode.endswith("+tls12")
        mode = mode.removesuffix("+tls12")
        if mode == "member":
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
            ctx.check_hostname = False
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if tls12:  # the server checks a client certificate within the handshake (TLS 1.3: after it)
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        if mode != "no-cert":
            ctx.load_cert_chain(cert, key)
        sock = ctx.wrap_socket(raw, server_hostname=host)
        out["handshake"] = True
    sock.sendall(request)
    data = b""
    while len(data) < 4096:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    out["response"] = data[:300].decode("latin-1")
except (OSError, ssl.SSLError) as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _probe(host: Host, mode: str, target: Host, path: str, body: str, cert: Path, key: Path,
           ca: Path) -> dict[str, Any]:
    r = host.run([sys.executable, "-c", PROBE, mode, target.ip, str(PORT), path, body, str(cert), str(key), str(ca)],
                 check=True, timeout_s=30)
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def _self_signed(directory: Path) -> tuple[Path, Path, str]:
    """A self-signed EC certificate and key (an outsider's own 'CA') as PEM files, and the
    node id that certificate would prove."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from gpulayerd.net.tls import peer_node_id

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intruder")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "intruder.crt", directory / "intruder.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, peer_node_id(cert.public_bytes(serialization.Encoding.DER))


def _peer_table(h: Host) -> set[tuple[str, bool, str | None]]:
    """(node id, trusted, cluster) of each peer h lists (states flap with heartbeats; these must not)."""
    return {(p.node_id, p.trusted, p.cluster) for p in h.api(lambda c: c.peers()) if p.state != "self"}


def _job_table(h: Host) -> list[tuple[str, str, int, str | None]]:
    return [(j.id, j.status, j.attempt, j.holder) for j in h.api(lambda c: c.jobs())]


def _parallel(*calls: Callable[[], object]) -> list[object]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def test_mdns_discovery_trust_and_a_foreign_cluster(lan_factory: Callable[..., Lan]) -> None:
    lan = lan_factory(4)
    h1, h2, h3, h4 = lan.hosts
    # h1 makes the cluster and, as its signer, enrolls h2 (token on stdin) and h3 (token in a file) ONLINE.
    token = h1.cluster_init("--uses", "2", "--address", f"{h1.ip}:{PORT + 1}")
    h4.cluster_init()
    h1.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=1, log_level=QUIET)
    lan.wait((h1.identity_dir / "enroll.json").exists, timeout_s=10, what="h1's enrollment listener")
    _parallel(lambda: h2.cluster_join(token).stdout, lambda: h3.cluster_join(token, token_file=True).stdout)
    ca_key = (h1.identity_dir / "ca.key").read_bytes()
    for h in (h2, h3):  # no CA private key anywhere under a joined node's state
        assert not (h.identity_dir / "ca.key").exists()
        assert not [f for f in h.daemon_state_dir.rglob("*") if f.is_file() and ca_key.strip() in f.read_bytes()]
    # The token is one-time (2 uses): a third join is refused, and nothing is installed.
    again = h4.run([GPULAYER, "--state-dir", str(h4.root / "third"), "cluster", "join", "-"], input=token)
    assert again.returncode == 1 and "already used" in again.stderr, again
    ids = {h.name: h.node_id for h in lan.hosts}
    assert len(set(ids.values())) == 4
    cluster_of = {h.name: load_or_create_identity(h.state_dir).cluster_id for h in (h1, h4)}
    assert cluster_of["h1"] == load_or_create_identity(h3.state_dir).cluster_id
    assert cluster_of["h1"] != cluster_of["h4"]

    # h1..h3 have one CPU slot each (their jobs overflow); h4, of another cluster, has four.
    h4.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=4, log_level=QUIET)
    h2.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=1, log_level=QUIET)
    spawned = time.monotonic()
    h3.start_daemon(config=FAST_CLUSTER, extra_args=MDNS, cpu_slots=1, log_level=QUIET)
    started = time.monotonic()
    waited = lan.wait_cluster(h1, h2, h3, timeout_s=15, capabilities=False)
    assert waited <= 3.0, (f"the cluster formed {waited:.2f} s after the last daemon answered "
                           f"({waited + started - spawned:.2f} s after it was spawned); target 3 s")

    # Only mDNS told them about each other: no --peer, and fresh state dirs hold no saved peers.
    members = (h1, h2, h3)
    for h in members:
        peers = {p.node_id: p for p in h.api(lambda c: c.peers())}
        for o in members:
            if o is not h:
                p = peers[ids[o.name]]
                assert (p.state, p.trusted, p.cluster, p.name) == ("up", True, cluster_of["h1"], o.hostname), p
                assert o.ip in p.addresses and p.port == PORT
    # h4 is foreign to them, and they to h4: listed, never trusted.
    for h in members:
        lan.wait(lambda h=h: h.peer_states().get(ids["h4"]) == ("foreign", False), timeout_s=10,  # type: ignore[misc]
                 what=f"{h.name} to list h4 as foreign")
        h4_view = next(p for p in h.api(lambda c: c.peers()) if p.node_id == ids["h4"])
        assert h4_view.cluster == cluster_of["h4"] and h4_view.capabilities is None
    lan.wait(lambda: all(h4.peer_states().get(ids[h.name]) == ("foreign", False) for h in members),
             timeout_s=10, what="h4 to list h1..h3 as foreign")

    # Work submitted on h1..h3 overflows their single slots, yet never goes to the idle h4.
    spec = {"command": ["sh", "-c", "sleep 0.7; hostname"]}
    jobs = [(h, h.submit(spec).id) for h in members for _ in range(3)]
    # The last one waits behind five (a running job's explain has its state, not the table).
    explained = jobs[-1][0].api(lambda c: c.explain(jobs[-1][1]))
    assert explained.state is None, explained.state
    assert {w.worker for w in explained.workers} == {ids["h1"], ids["h2"], ids["h3"]}
    for h, job_id in jobs:
        view = h.wait_job(job_id, timeout_s=60)
        assert view.status == "succeeded", (h.name, view.reason)
        assert [a.worker for a in view.attempts] != [] and all(a.worker != ids["h4"] for a in view.attempts)
        assert view.attempts[-1].worker in {ids["h1"], ids["h2"], ids["h3"]}
    assert h4.api(lambda c: c.jobs()) == []
    assert not any((h4.state_dir / "runs").iterdir()), "h4 ran something"

    # The peer port refuses everything but mutual TLS against the cluster CA, before any
    # state changes. A queued job on h1 is the bait (CUDA: no host here can run it).
    bait = h1.submit({"command": ["true"], "requirements": {"accelerator": "cuda"}}).id
    assert h1.wait_job(bait, states={"queued"}).attempt == 0
    time.sleep(1.0)  # let the reason settle
    jobs_before, peers_before = _job_table(h1), _peer_table(h1)

    def claim(worker: str) -> str:
        return json.dumps({"msg_id": secrets.token_hex(8), "worker": worker, "job_id": bait, "placement": {}})

    def heartbeat(node: str) -> str:
        return json.dumps({"msg_id": secrets.token_hex(8), "node_id": node, "name": "intruder", "version": "0.1.0",
                           "cluster": cluster_of["h1"], "port": PORT, "addresses": [h4.ip]})

    i4 = h4.identity_dir
    h4_files = (i4 / "node.crt", i4 / "node.key", i4 / "ca.crt")
    intruder_cert, intruder_key, intruder_id = _self_signed(lan.root / "intruder")

    # The probe works: a member (h2, with its own files) gets an answer from h1.
    i2 = h2.identity_dir
    ok = _probe(h2, "member", h1, "/v1/peer/capabilities", "", i2 / "node.crt", i2 / "node.key", i2 / "ca.crt")
    assert ok["handshake"] and ok["response"].startswith("HTTP/1.1 200"), ok

    # h4 with its own cluster's files: its CA does not know h1, so the handshake fails.
    r = _probe(h4, "member", h1, "/v1/peer/claim", claim(ids["h4"]), *h4_files)
    assert not r["handshake"] and "CERTIFICATE_VERIFY_FAILED" in r["error"], r
    # h4 trusting anything: h1 refuses h4's certificate (signed by another cluster's CA).
    attempts = {
        "h4 cert, claim": _probe(h4, "client-cert", h1, "/v1/peer/claim", claim(ids["h4"]), *h4_files),
        "h4 cert, heartbeat": _probe(h4, "client-cert", h1, "/v1/peer/heartbeat", heartbeat(ids["h4"]), *h4_files),
        "self-signed, claim": _probe(h4, "client-cert", h1, "/v1/peer/claim", claim(intruder_id), intruder_cert,
                                     intruder_key, intruder_cert),
        "self-signed, heartbeat": _probe(h4, "client-cert", h1, "/v1/peer/heartbeat", heartbeat(intruder_id),
                                         intruder_cert, intruder_key, intruder_cert),
        "no cert, claim": _probe(h4, "no-cert", h1, "/v1/peer/claim", claim(ids["h4"]), *h4_files),
        "plain HTTP, claim": _probe(h4, "plain", h1, "/v1/peer/claim", claim(ids["h4"]), *h4_files),
        "plain HTTP, heartbeat": _probe(h4, "plain", h1, "/v1/peer/heartbeat", heartbeat(ids["h4"]), *h4_files),
    }
    for what, res in attempts.items():
        assert "HTTP/" not in res["response"], f"{what}: the peer port answered over HTTP: {res}"
    for what, (cert, key) in {"h4 cert": h4_files[:2], "self-signed": (intruder_cert, intruder_key)}.items():
        for mode in ("client-cert+tls12", "no-cert+tls12"):
            res = _probe(h4, mode, h1, "/v1/peer/claim", claim(ids["h4"]), cert, key, cert)
            # The server ends the handshake (an alert, or asyncio just closes the connection).
            assert not res["handshake"] and res["error"].startswith("SSL"), f"{what}, {mode}: {res}"
    curl = h4.run(["curl", "-sS", "-m", "5", "-X", "POST", "-H", "Content-Type: application/json",
                   "-d", heartbeat(ids["h4"]), f"http://{h1.ip}:{PORT}/v1/peer/heartbeat"], timeout_s=30)
    assert curl.returncode != 0 and "HTTP/" not in curl.stdout, (curl.returncode, curl.stdout, curl.stderr)

    time.sleep(1.0)  # anything that got through would show by now
    assert _job_table(h1) == jobs_before
    after = h1.job(bait)
    assert (after.status, after.attempt, after.holder, after.attempts) == ("queued", 0, None, [])
    assert not [e for e in after.events if e.kind != "queued" and e.to_status not in (None, "queued")], after.events
    assert _peer_table(h1) == peers_before
    assert h1.peer_states()[ids["h4"]] == ("foreign", False)
    assert all(p.name != "intruder" for p in h1.api(lambda c: c.peers()))


def test_static_peers_when_multicast_is_dropped(lan3: Lan) -> None:
    lan = lan3
    h1, h2, _ = lan.hosts
    lan.drop_multicast()  # before any daemon starts: mDNS can never work here
    lan.form_cluster()
    h2.set_fake_gpus([24576])  # the only GPU of the LAN
    for h in lan.hosts:
        peers = [a for o in lan.hosts if o is not h for a in ("--peer", o.endpoint(PORT))]
        h.start_daemon(config=FAST_CLUSTER, extra_args=[*MDNS, *peers], wait=False, log_level=QUIET)
    for h in lan.hosts:
        h.wait_daemon()
    lan.wait_cluster(timeout_s=15)
    ids = {h.name: h.node_id for h in lan.hosts}
    for h in lan.hosts:
        states = h.peer_states()
        assert {n: states.get(ids[n]) for n in ids if n != h.name} == {
            n: ("up", True) for n in ids if n != h.name}, states

    job = h1.submit({"command": ["sh", "-c", 'echo "$(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'],
                     "requirements": {"accelerator": "cuda"}})
    view = h1.wait_job(job.id, timeout_s=30)
    assert view.status == "succeeded", view.reason
    assert [a.worker for a in view.attempts] == [ids["h2"]]
    out = h1.api(lambda c: c.logs(job.id)).data
    assert out == f"{h2.hostname} CUDA_VISIBLE_DEVICES=0\n", out
