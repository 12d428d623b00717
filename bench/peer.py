"""Figures for the peer port under attack: ``python bench/peer.py`` (the flood part as root).

Prints one line per figure with its target; asserts nothing.

- authorizing one peer message, in this process (no network): the sender's identity from its
  certificate (node id, mode, bound user), the message's id and number checks, and THE role
  check of each route as the peer router runs it before the handler (gpulayerd/app/roles.py),
  on real services with real SQLite stores (tests/fakes: an owner and two workers on the
  loopback network): a report from the attempt's holder and from another member (the whole
  refusal: stale, counted, logged), a claim from the worker the job was offered to (its fit
  re-judged) and from one it was not, a log read and a kill from the run's owner and from
  another member. Target <= 0.1 ms a check (the median of many). The checks decide from what the
  services keep in memory (the holder cache, the offer book, the spec cache, the ledger, the stored
  runs read once): none reads SQLite per message.
- local API during a flood (root: two hosts as network namespaces, tests/lan/harness.py):
  h2's daemon (defaults, a cluster of one) answers ``GET /v1/health`` and ``GET /v1/jobs``
  one at a time over its unix socket, p50/p99, first alone and then (spread over the
  flood) while h1, which has no
  certificate, holds 2,000 idle TCP connections to h2's peer port from eight addresses and
  reopens each one the daemon closes (the flood of tests/lan/test_flood_lan.py). Also the
  daemon's peak open file descriptors during the flood. The target for the flooded p99 is
  the unflooded p99 plus 50 ms.
- local socket flood (root; issue 24): the account ``nobody`` holds 2,000 idle and 2,000
  slowloris connections to a system daemon's socket and reopens each one closed; the account
  ``daemon`` submits a job (a raw request, as the CLI sends it) and root runs ``gpulayer jobs``.
  Targets: the other account's job running within 5 s of its submit, root's ``gpulayer jobs``
  within 3 s, the daemon's log grown by at most 100 KB, its descriptors at most one account's
  share (64) + root's reserve (64) + 200.
- peer ports flood (root; issue 24): four hosts as network namespaces; h1 floods h2 from 32
  addresses (2,000 plain connections to the peer port, 200 slowloris TLS connections to the
  enrollment port: tests/lan/test_flood_members_lan.py). Figures: a job placed on the member
  h3 (submit -> succeeded, median of 3) without and with the flood (target: the unflooded
  figure + 2 s, measured in the same run), a ``gpulayer cluster join`` of h4 during the flood
  (target 5 s), and how many members h2 marks down (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
from bench_report import line as report_line
from bench_report import percentile

from gpulayerd.api.client import DaemonClient
from gpulayerd.api.peer import request_problem
from gpulayerd.net import ca, identity, tls
from gpulayerd.net.wire import RunReport, new_msg_id

AUTHZ_TARGET_MS = 0.1
FLOOD_MARGIN_MS = 50.0




def line(label: str, value: float, unit: str, target: float | None = None, *, fmt: str = ".3f") -> None:
    """:func:`bench_report.line` with three decimals by default."""
    report_line(label, value, unit, target, fmt=fmt)


def per_call_ms(fn: Callable[[], object], n: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of one call of ``fn`` over ``n`` calls, in ms."""
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        means.append((time.perf_counter() - t0) / n * 1000)
    return percentile(means, 50)


# ------------------------------------------------------------------ authorization


async def _per_check_ms(fn: Callable[[], Awaitable[object]], n: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of one awaited call of ``fn`` over ``n`` calls, in ms."""
    means = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        means.append((time.perf_counter() - t0) / n * 1000)
    return percentile(means, 50)


async def _authz_figures(n: int) -> list[tuple[str, float]]:
    """The role checks of the route table on real services and SQLite stores (tests/fakes: an owner and
    workers w1, w2 on the loopback network, a job of the owner running on w1, one queued and offered
    to w1): each check as the peer router runs it before the handler, allowed and refused."""
    from gpulayerd import routes
    from gpulayerd.net.transport import BY_NAME, Sender
    from gpulayerd.net.wire import Claim, Kill, LogRequest, RunReport
    from tests.fakes.daemons import OWNER, W1, W2, d, three_daemons
    from tests.unit.test_route_table import queued_offered_to_w1, running_on_w1

    logging.getLogger("gpulayerd").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="glbench-") as tmp:
        async with three_daemons(Path(tmp)) as lab:
            running = await running_on_w1(lab)
            queued = await queued_offered_to_w1(lab)
            owner, w1 = d(lab, "owner").services, d(lab, "w1").services
            assert owner.router is not None and w1.router is not None
            owner_roles, w1_roles = owner.router._roles, w1.router._roles
            holder, member, its_owner = (Sender(W1, "personal", "root"), Sender(W2, "personal", "root"),
                                         Sender(OWNER, "personal", "root"))
            report = RunReport(msg_id=new_msg_id(), worker=W1, job_id=running, attempt=1, kind="renew")
            forged = report.model_copy(update={"worker": W2})
            claim = Claim(msg_id=new_msg_id(), worker=W1, job_id=queued)
            logs = LogRequest(job_id=running, attempt=1)
            kill = Kill(msg_id=new_msg_id(), owner=OWNER, job_id=running, attempt=1, reason="x")

            async def check(roles: Any, name: str, sender: Sender, body: Any, allowed: bool) -> None:
                why = await roles.check(routes.PEER[name], sender, body)
                assert (why is None) is allowed, (name, why)

            async def refused_report() -> None:  # the whole refusal: role check, counted, logged, "stale"
                reply = await owner.router.dispatch(BY_NAME["report"], member, forged)
                assert reply.stale

            cases: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                ("report from its holder (allowed; the owner's holder cache, no read)",
                 lambda: check(owner_roles, "report", holder, report, True)),
                ("report from another member (refused: stale, counted, logged; no read)", refused_report),
                ("claim from the worker it was offered to (the offer book, the cached spec, the fit re-judged)",
                 lambda: check(owner_roles, "claim", holder, claim, True)),
                ("claim from a member it was not offered to (refused: the offer book; no read)",
                 lambda: check(owner_roles, "claim", member, claim.model_copy(update={"worker": W2}), False)),
                ("claim of a job with no standing offer (one not known here, or after an owner restart; "
                 "refused: the holder and spec caches, no read)",
                 lambda: check(owner_roles, "claim", member, Claim(msg_id=new_msg_id(), worker=W2,
                                                                   job_id="zzzzzzzzzzzz"), False)),
                ("logs from the run's owner (allowed; the worker's ledger, no read)",
                 lambda: check(w1_roles, "logs", its_owner, logs, True)),
                ("logs from another member (refused: the job's stored runs, kept in memory; no read)",
                 lambda: check(w1_roles, "logs", member, logs, False)),
                ("kill from the run's owner (allowed; the worker's ledger, no read)",
                 lambda: check(w1_roles, "kill", its_owner, kill, True)),
            ]
            out = []
            for label, fn in cases:
                for _ in range(50):
                    await fn()
                out.append((label, await _per_check_ms(fn, n)))
            return out


def bench_authz(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="glbench-") as tmp:
        ca.cluster_init(Path(tmp) / "a", "bench")
        node = identity.load_or_create_identity(Path(tmp) / "a")
        assert node.cert_path is not None
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        der = x509.load_pem_x509_certificate(node.cert_path.read_bytes()).public_bytes(serialization.Encoding.DER)
    report = RunReport(msg_id=new_msg_id(), worker="w" * 52, job_id="j1", attempt=1, kind="exited", exit_code=0)
    ident = per_call_ms(lambda: tls.peer_identity(der), max(1, n // 10))
    check = per_call_ms(lambda: request_problem(report), n)
    roles = asyncio.run(_authz_figures(max(1, n // 10)))
    print(f"authorizing one peer message (in process, median of 5 rounds; the role checks on real services "
          f"and SQLite stores, {max(1, n // 10)} checks a round):")
    line("  sender identity from its certificate (node id, mode, user)", ident, "ms")
    line("  id and number checks of the message", check, "ms")
    for label, ms in roles:
        line(f"  role check: {label}", ms, "ms", AUTHZ_TARGET_MS)
    worst = max(ms for _, ms in roles)
    line("  authorizing a renewal (the commonest message: every lease/3 per run)", roles[0][1], "ms", AUTHZ_TARGET_MS)
    line("  authorizing one message, the slowest route's check", worst, "ms", AUTHZ_TARGET_MS)
    line("  ... with the certificate parse and message checks of the request",
         ident + check + worst, "ms")


# -------------------------------------------------------------------------- flood


async def api_latencies(socket_path: Path, n: int, spread_s: float = 0.0) -> dict[str, list[float]]:
    """``n`` calls of each kind, one at a time, spread evenly over about ``spread_s`` seconds; ms each."""
    out: dict[str, list[float]] = {"health": [], "jobs": []}
    async with DaemonClient(socket_path, timeout_s=15.0) as c:
        for _ in range(n):
            for name, call in (("health", c.health), ("jobs", c.jobs)):
                t0 = time.perf_counter()
                await call()
                out[name].append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(spread_s / n)
    return out


def bench_flood(n: int, flood_s: float) -> None:
    from tests.lan.harness import Lan, check_environment
    from tests.lan.test_flood_lan import FLOOD, PER_SOURCE, SOURCES

    problems = check_environment()
    if problems:
        print(f"local API during a flood: skipped ({'; '.join(problems)})", flush=True)
        return
    with Lan(2) as lan:
        h1, h2 = lan.hosts
        lan.form_cluster(h2)
        daemon = h2.start_daemon(extra_args=["--no-mdns"], log_level="WARNING")
        quiet = asyncio.run(api_latencies(h2.socket_path, n))
        prefix = h1.ip.rsplit(".", 1)[0]
        sources = [h1.ip] + [f"{prefix}.{200 + i}" for i in range(1, SOURCES)]
        for address in sources[1:]:
            h1.run(["ip", "addr", "add", f"{address}/24", "dev", "eth0"], check=True)
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], len(os.listdir(f"/proc/{daemon.pid}/fd")))
                stop.wait(0.05)

        baseline = len(os.listdir(f"/proc/{daemon.pid}/fd"))
        flood = h1.popen([sys.executable, "-c", FLOOD, h2.ip, "7171", str(flood_s), ",".join(sources),
                          str(PER_SOURCE)], stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        sampler = threading.Thread(target=sample, daemon=True)
        try:
            if flood.stdout.readline().strip() != "ready":
                raise RuntimeError("the flood did not start")
            sampler.start()
            flooded = asyncio.run(api_latencies(h2.socket_path, n, spread_s=max(1.0, flood_s - 5.0)))
            still = flood.poll() is None
            flood.wait(flood_s + 30)
            summary = json.loads(flood.stdout.read().strip().splitlines()[-1])
        finally:
            stop.set()
            if flood.poll() is None:
                flood.kill()
            flood.wait(10)
        sampler.join(5)
    print(f"local API of a daemon (defaults) whose peer port is flooded, {n} calls of each, one at a time:")
    for name in ("health", "jobs"):
        q50, q99 = round(percentile(quiet[name], 50), 1), round(percentile(quiet[name], 99), 1)
        line(f"  GET /v1/{name} p50, no flood", q50, "ms", fmt=".2f")
        line(f"  GET /v1/{name} p99, no flood", q99, "ms", fmt=".2f")
        line(f"  GET /v1/{name} p50, flooded", percentile(flooded[name], 50), "ms", q50 + FLOOD_MARGIN_MS, fmt=".2f")
        line(f"  GET /v1/{name} p99, flooded", percentile(flooded[name], 99), "ms", q99 + FLOOD_MARGIN_MS, fmt=".2f")
    print(f"  flood: {SOURCES * PER_SOURCE} idle connections from {SOURCES} addresses, "
          f"{summary['opened']} opened in all, {summary['closed_by_server']} closed by the daemon"
          f"{'' if still else ' (it ended before the measurement did)'}", flush=True)
    line("  daemon's open file descriptors, peak during the flood", peak[0], "", baseline + 512 + 100, fmt="d")


# ------------------------------------------------------------- local socket flood (issue 24)

# Another account's submit, without the gpulayer CLI (the bench's venv may be closed to other
# accounts): one raw request on the socket, as the CLI sends it. Prints the status line and the body.
RAW_SUBMIT = r"""
import json, socket, sys
body = json.dumps({"spec": {"command": ["sh", "-c", "echo ran"], "workdir": "/tmp", "name": "beside-a-flood"},
                   "path": "/usr/bin:/bin"}).encode()
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: gpulayerd\r\nContent-Type: application/json\r\n"
          + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, payload = data.partition(b"\r\n\r\n")
print(head.split(b"\r\n")[0].decode())
print(payload.decode())
"""

LOCAL_FLOOD_IDLE = LOCAL_FLOOD_SLOW = 2000
SUBMIT_START_TARGET_S = 5.0
ROOT_JOBS_TARGET_S = 3.0
LOG_GROWTH_TARGET_KB = 100.0


def bench_local_flood(flood_s: float) -> None:
    """One account (``nobody``) holds 2,000 idle and 2,000 slowloris connections to a system daemon's
    socket (the flood of tests/integration/test_hostile_host.py); another (``daemon``) submits a job,
    root lists the jobs. Root only (a system daemon, other accounts)."""
    import pwd

    from tests.integration.test_hostile_host import FLOOD as LOCAL_FLOOD

    if os.geteuid() != 0:
        print("local socket flood: skipped (needs root: a system daemon and other accounts)", flush=True)
        return
    nobody, other = pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    gpulayerd = str(Path(sys.executable).with_name("gpulayerd"))
    gpulayer = str(Path(sys.executable).with_name("gpulayer"))
    root = Path(tempfile.mkdtemp(prefix="glbench-", dir="/tmp"))
    os.chmod(root, 0o755)
    runtime, state = root / "run", root / "state"
    config = root / "gpulayerd.toml"
    config.write_text('mode = "system"\nallow_root_jobs = true\nschedule_interval_s = 0.2\n')
    log_path = root / "gpulayerd.log"
    with open(log_path, "ab") as log:
        daemon = subprocess.Popen([gpulayerd, "--config", str(config), "--state-dir", str(state), "--runtime-dir",
                                   str(runtime), "--device-lock-dir", str(root / "locks"), "--no-mdns",
                                   "--python", "/usr/bin/python3", "--cpu-slots", "2", "--isolated"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    sock = runtime / "gpulayerd.sock"
    flood: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        subprocess.run([gpulayer, "--socket", str(sock), "jobs"], check=True, capture_output=True, timeout=60)
        log_before = log_path.stat().st_size
        flood = subprocess.Popen(["/usr/bin/python3", "-c", LOCAL_FLOOD, str(sock), str(LOCAL_FLOOD_IDLE),
                                  str(LOCAL_FLOOD_SLOW), str(flood_s)], user=nobody.pw_uid, group=nobody.pw_gid,
                                 cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        if flood.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the flood did not start: {flood.stderr.read() if flood.stderr else ''}")
        time.sleep(min(4.0, flood_s / 3))  # slow heads have dripped for longer than the request timeout
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/python3", "-c", RAW_SUBMIT, str(sock)], check=False, user=other.pw_uid,
                           group=other.pw_gid, cwd="/", capture_output=True, text=True, timeout=60)
        answered_s = time.perf_counter() - t0
        if " 201 " not in r.stdout.splitlines()[0] and " 200 " not in r.stdout.splitlines()[0]:
            raise RuntimeError(f"the other account's submit failed: {r.stdout} {r.stderr}")
        job = json.loads(r.stdout.splitlines()[1])["id"]

        async def started() -> float:
            async with DaemonClient(sock, timeout_s=30.0) as c:
                while (await c.job(job)).status not in ("running", "succeeded", "failed"):
                    await asyncio.sleep(0.02)
            return time.perf_counter() - t0

        start_s = asyncio.run(started())
        t1 = time.perf_counter()
        subprocess.run([gpulayer, "--socket", str(sock), "jobs"], check=True, capture_output=True, timeout=60)
        jobs_s = time.perf_counter() - t1
        fds = len(os.listdir(f"/proc/{daemon.pid}/fd"))
        out, _ = flood.communicate(timeout=flood_s + 60)
        summary = json.loads(out.strip().splitlines()[-1])
        grown_kb = (log_path.stat().st_size - log_before) / 1000
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait(10)
        daemon.terminate()
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(f"local socket of a system daemon (defaults) flooded by one account: {LOCAL_FLOOD_IDLE} idle and "
          f"{LOCAL_FLOOD_SLOW} slowloris connections, reopened when closed, for {flood_s:g} s:")
    line("  another account's submit answered", answered_s, "s", SUBMIT_START_TARGET_S, fmt=".3f")
    line("  ... and its job running (from the submit)", start_s, "s", SUBMIT_START_TARGET_S, fmt=".3f")
    line("  root's gpulayer jobs (the whole command)", jobs_s, "s", ROOT_JOBS_TARGET_S, fmt=".3f")
    line("  daemon's log growth during the flood", grown_kb, "KB", LOG_GROWTH_TARGET_KB, fmt=".1f")
    line("  daemon's open descriptors during the flood", fds, "", 64 + 64 + 200, fmt="d")
    print(f"  flood: {summary['opened']} opened in all, {summary['closed_by_server']} closed by the daemon "
          f"(over the account's 64, or a request head slower than 10 s), {summary['refused_at_once']} refused "
          "at connect", flush=True)


# ------------------------------------------------------------ peer ports flood (issue 24)

JOIN_TARGET_S = 5.0
PLACEMENT_MARGIN_S = 2.0


def bench_member_flood(flood_s: float) -> None:
    """The flood of tests/lan/test_flood_members_lan.py (2,000 plain connections to the peer port from
    32 addresses, 200 slowloris TLS connections to the enrollment port) against h2, a cluster of h2 and
    h3: a job placed on h3 (submit -> succeeded) with and without the flood, and a ``gpulayer cluster
    join`` of h4 during it."""
    from tests.lan.harness import FAST_CLUSTER, Lan, check_environment
    from tests.lan.test_flood_members_lan import ENROLL_PORT, FLOOD, GPU, PEER_FLOOD, PORT, SLOWLORIS, SOURCES

    problems = check_environment()
    if problems:
        print(f"peer ports flood: skipped ({'; '.join(problems)})", flush=True)
        return
    spec = {"command": ["true"], "requirements": {"accelerator": "cuda", "gpu_memory_gb": 8}}
    with Lan(4) as lan:
        h1, h2, h3, h4 = lan.hosts
        token = h2.cluster_init("--uses", "2", "--address", f"{h2.ip}:{ENROLL_PORT}")
        h2.start_daemon(config={**FAST_CLUSTER, "peer_handshake_timeout_s": 2.0}, extra_args=["--no-mdns"],
                        cpu_slots=1, log_level="WARNING")
        lan.wait((h2.identity_dir / "enroll.json").exists, timeout_s=10, what="h2's enrollment listener")
        h3.cluster_join(token)
        h3.start_daemon(config=FAST_CLUSTER, extra_args=["--no-mdns", "--peer", h2.endpoint(PORT)], cpu_slots=1,
                        fake_gpus=GPU, log_level="WARNING")
        lan.wait_cluster(h2, h3, timeout_s=20)

        def placed_s() -> float:
            t0 = time.perf_counter()
            view = h2.wait_job(h2.submit(spec).id, timeout_s=60)
            if view.status != "succeeded":
                raise RuntimeError(f"the placed job ended {view.status}: {view.reason}")
            return time.perf_counter() - t0

        quiet = sorted(placed_s() for _ in range(3))[1]
        prefix = h1.ip.rsplit(".", 1)[0]
        sources = [h1.ip] + [f"{prefix}.{200 + i}" for i in range(1, SOURCES)]
        for address in sources[1:]:
            h1.run(["ip", "addr", "add", f"{address}/24", "dev", "eth0"], check=True)
        flood = h1.popen([sys.executable, "-c", FLOOD, h2.ip, str(PORT), str(ENROLL_PORT), str(flood_s),
                          ",".join(sources), str(PEER_FLOOD), str(SLOWLORIS)], stdout=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None
            if flood.stdout.readline().strip() != "ready":
                raise RuntimeError("the flood did not start")
            time.sleep(3.0)
            flooded = sorted(placed_s() for _ in range(3))[1]
            t0 = time.perf_counter()
            joined = h4.cluster_join(token, check=False)
            join_s = time.perf_counter() - t0
            down = [p for p, (state, _) in h2.peer_states().items() if state == "down"]
            summary = json.loads(flood.communicate(timeout=flood_s + 60)[0].strip().splitlines()[-1])
        finally:
            if flood.poll() is None:
                flood.kill()
            flood.wait(10)
    print(f"peer ports of h2 flooded from {SOURCES} addresses ({PEER_FLOOD} plain connections to the peer port, "
          f"{SLOWLORIS} slowloris TLS connections to the enrollment port) for {flood_s:g} s:")
    line("  a job placed on the member h3, submit -> succeeded, no flood (median of 3)", quiet, "s", fmt=".2f")
    line("  the same, flooded (median of 3)", flooded, "s", round(quiet + PLACEMENT_MARGIN_S, 2), fmt=".2f")
    line(f"  gpulayer cluster join of h4, flooded ({'exit 0' if joined.returncode == 0 else 'FAILED'})", join_s,
         "s", JOIN_TARGET_S, fmt=".2f")
    line("  members h2 marks down during the flood", len(down), "", 0, fmt="d")
    print(f"  flood: {summary.get('plain_opened', 0)} plain connections opened, "
          f"{summary.get('plain_closed_by_server', 0)} closed by h2; {summary.get('slow_handshakes', 0)} slowloris "
          f"handshakes, {summary.get('slow_closed', 0)} closed", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20000, help="calls per authorization figure (default 20000)")
    p.add_argument("--calls", type=int, default=300, help="local API calls of each kind (default 300)")
    p.add_argument("--flood-s", type=float, default=15.0,
                   help="how long the flood lasts, seconds; the flooded calls are spread over all but 5 s of it "
                   "(default 15)")
    p.add_argument("--no-flood", action="store_true", help="only the in-process figures (no root needed)")
    args = p.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}", flush=True)
    bench_authz(args.iterations)
    if not args.no_flood:
        bench_flood(args.calls, args.flood_s)
        bench_local_flood(max(20.0, args.flood_s))
        bench_member_flood(max(25.0, args.flood_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
