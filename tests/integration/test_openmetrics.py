"""``GET /metrics`` (issue 38): the daemon's series in the Prometheus text format, on the local socket for
every user and on an optional TCP listener that needs the bearer token. A real daemon; the text is
parsed with prometheus_client's own parser."""

from __future__ import annotations

import getpass
import os
import secrets
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import Lab
from .loopback import free_port


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_on_the_socket_and_behind_a_token_on_tcp(lab: Lab) -> None:
    token = lab.root / "metrics.token"
    token.write_text(secrets.token_hex(24) + "\n")
    os.chmod(token, 0o640)
    port = free_port()
    d = lab.daemon(fake=lab.fake_gpus([24576]), cpu_slots=1, metrics_listen=f"127.0.0.1:{port}",
                   metrics_token_file=str(token))
    me = getpass.getuser()
    release = lab.root / "release"
    running = d.submit("--", "sh", "-c", f"while [ ! -e {release} ]; do sleep 0.1; done")
    d.wait_status(running, {"running"})
    waiting = d.submit("--name", "secret-name-xyz", "--", "sh", "-c", "echo secret-command-xyz")
    d.wait_reason(waiting, lambda j: (j.reason or "").startswith("Resources"))

    r = subprocess.run(["curl", "-sS", "--unix-socket", str(d.socket_path), "http://x/metrics"],
                       capture_output=True, text=True, timeout=30, check=True)
    got = samples(r.stdout)
    assert got[("gpulayer_jobs", (("state", "running"), ("user", me)))] == 1.0
    assert got[("gpulayer_jobs", (("state", "queued"), ("user", me)))] == 1.0
    assert got[("gpulayer_jobs_waiting", (("reason", "Resources"), ("user", me)))] == 1.0
    assert got[("gpulayer_devices", (("accelerator", "cuda"), ("granted", "no")))] == 1.0
    assert ("gpulayer_claim_conflicts_total", ()) in got and ("gpulayer_lease_losses_total", ()) in got
    assert got[("gpulayer_claims_granted_total", ())] >= 1.0
    assert any(name == "gpulayer_probe_ok" for name, _ in got)
    assert "secret-name-xyz" not in r.stdout and "secret-command-xyz" not in r.stdout and waiting not in r.stdout

    url = f"http://127.0.0.1:{port}/metrics"
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            raise AssertionError("the TCP listener answered without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
    ok = urllib.request.urlopen(urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token.read_text().strip()}"}), timeout=10)
    assert samples(ok.read().decode())[("gpulayer_jobs", (("state", "running"), ("user", me)))] == 1.0
    release.touch()

    # A token file others may read stops the start, naming the key.
    os.chmod(token, 0o644)
    bad = lab.daemon(cpu_slots=1, start=False, metrics_listen=f"127.0.0.1:{free_port()}",
                     metrics_token_file=str(token))
    with pytest.raises(AssertionError, match="gpulayerd exited with 2"):
        bad.start(timeout_s=30)
    assert "metrics_token_file" in bad.log_tail() and "must be 0640" in bad.log_tail(), bad.log_tail()
