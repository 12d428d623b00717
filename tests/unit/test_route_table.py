"""Generated from the route table: every declared route, sent by a caller WITHOUT its role, is refused
and changes nothing.

For each route of :mod:`gpulayerd.routes` whose role is not public there is a refusal case below
(a route added without one fails :func:`test_every_route_has_a_refusal_case`). A case builds the
situation in a lab of real services over the loopback network (an owner, workers w1 and w2, real
SQLite stores), then a valid member (w2) or another local user (bob) that does not hold the role
sends a well-formed message through the same dispatcher the servers use. Each case asserts:

- the refusal: 403 (``PeerRefused`` / ``Forbidden``), or for ``report`` a "stale" answer;
- that the answer holds no field of the job's spec (its command, environment values, workdir);
- that a logical dump of every daemon is equal before and after: the stores' tables (jobs,
  attempts, events, grants, remote runs, gangs, submission keys, peers; the liveness columns in
  :data:`LIVENESS` excluded), the owner's standing offers, each worker's kept offers, runs, holds
  and owed reports (the worker core's state), the fair-share book and the runs on each machine.

Public routes (any member, any local user) are sent instead from a revoked node's and a
foreign cluster's certificate over real mutual TLS (peer routes), and from another local user
over the real unix socket (local routes: answered, but with no field of another user's spec).
The enrollment routes are sent with a wrong secret, from a revoked node and from a stranger.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import BaseModel

from gpulayerd import routes
from gpulayerd.api.client import ApiRequestError, DaemonClient
from gpulayerd.api.peer import PeerClient, TlsNetwork, make_peer_app, start_peer_site
from gpulayerd.api.server import make_local_app
from gpulayerd.app.common.requester import Requester, Requesters
from gpulayerd.errors import PeerCallError, PeerRefused
from gpulayerd.models import SubmitRequest
from gpulayerd.models.snapshots import Manifest, ManifestEntry, OutputChunk, ShipFetch, TreeFiles
from gpulayerd.net import ca, identity, tls
from gpulayerd.net.enroll import decode_token
from gpulayerd.net.identity import Identity
from gpulayerd.net.limits import ConnectionLimits
from gpulayerd.net.transport import BY_NAME, PeerRoute
from gpulayerd.net.wire import (
    Claim,
    Commit,
    EnrollJoin,
    EnrollRenew,
    Heartbeat,
    Hold,
    JobRequest,
    JobsRequest,
    Kill,
    LogRequest,
    Offer,
    Release,
    RunReport,
    UsageReportRequest,
    new_msg_id,
)
from tests.fakes.daemons import LEASE_S, OWNER, W1, W2, FakeDaemon, Lab, d, three_daemons

SECRET = "7f3a9c"  # in the jobs' command and environment: no refused answer may carry it
LIVENESS = {("peers", "last_seen_at")}
"""Columns a refused message may change (liveness only): none of the jobs' or runs'."""


# ---------------------------------------------------------------------------- the logical dump


def _tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                           "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        for table in names:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            keep = [c for c in cols if (table, c) not in LIVENESS]
            out[table] = sorted(con.execute(f"SELECT {', '.join(keep)} FROM {table}").fetchall(), key=repr)
        return out
    finally:
        con.close()


async def dump(lab: Lab, *, settle: bool = True) -> dict[str, Any]:
    """Everything a refused message must leave as it was, of every daemon of ``lab`` (after letting its
    background work settle; ``settle`` False while a local API client keeps a connection open, which
    the lab would count as work)."""
    if settle:
        await lab.settle()
    out: dict[str, Any] = {}
    for name, x in sorted(lab.daemons.items()):
        s = x.services
        usage = s.usage
        out[name] = {
            "tables": await asyncio.to_thread(_tables, x.config.db_path),
            "offers sent": s.jobs.offers(),
            "offers kept": {k: v.model_dump() for k, v in s.worker.offers_kept().items()},
            "worker core": s.ledger.state,
            "holds": sorted(s.ledger.held_devices().items()),
            "holdings": s.ledger.holdings(),
            "usage": (usage.usage(), usage.held_now()) if usage is not None else None,
            "runs": sorted((k, x.runner.get(*k).cancels) for k in x.runner.running()),  # type: ignore[union-attr]
        }
    return out


def leaks(answer: object) -> list[str]:
    """The job-spec fields of the lab's jobs that ``answer`` (a reply or an error) carries."""
    text = answer.model_dump_json() if isinstance(answer, BaseModel) else str(answer)
    return [s for s in (SECRET, "train.py") if s in text]


# ---------------------------------------------------------------------------- the situations


async def job_of(lab: Lab, owner: FakeDaemon, *, cpus: int = 2, nnodes: int | None = None, user: str = "root") -> str:
    spec: dict[str, Any] = {"command": ["python", "train.py", f"--token={SECRET}"], "workdir": str(lab.workdir),
                            "env": {"HF_TOKEN": SECRET}, "user": user,
                            "distributed": {"nnodes": nnodes or 1, "nproc_per_node": cpus},
                            "policy": {"retries": 0, "lease_s": LEASE_S}}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by=user))).id
    await lab.settle()
    return job


async def running_on_w1(lab: Lab) -> str:
    """A job of root owned by the owner (1 CPU slot), running on w1 (it needs 2): attempt 1."""
    owner = d(lab, "owner")
    job = await job_of(lab, owner)
    await lab.schedule()
    await lab.schedule()
    v = await lab.job(owner, job)
    assert (v.status, v.attempt, v.holder) == ("running", 1, W1)
    return job


async def queued_offered_to_w1(lab: Lab) -> str:
    """A queued job of root that the owner offered to w1 only."""
    job = await job_of(lab, d(lab, "owner"))
    d(lab, "owner").services.jobs.offered(job, W1)
    return job


async def hold_on_w1(lab: Lab) -> tuple[str, str, dict[str, Any]]:
    """A gang hold the owner placed on w1 for one of its jobs: (job id, hold id, spec)."""
    owner = d(lab, "owner")
    job = await job_of(lab, owner, nnodes=2)
    row = await owner.services.jobs.get(job)
    assert row is not None
    spec = owner.services.jobs.spec(row).model_dump(mode="json")
    hold = Hold(msg_id=new_msg_id(), owner=OWNER, job_id=job, hold_id="00112233aabbccdd", spec=spec, ttl_s=60.0)
    assert (await owner.node.call(W1, BY_NAME["hold"], hold)).held
    return job, hold.hold_id, spec


@dataclass
class Send:
    """One message: ``sender`` (its certificate's node id, mode and user) sends ``body`` on ``route`` to ``target``."""

    target: str
    route: PeerRoute[Any, Any]
    body: BaseModel
    sender: str = W2
    mode: str = "personal"
    user: str = "root"


Case = Callable[[Lab], Awaitable[Send]]


async def offer_of_a_job_id_another_owner_runs_here(lab: Lab) -> Send:
    job = await running_on_w1(lab)  # w1 runs it for the owner: the id is the owner's on w1
    return Send(W1, BY_NAME["offer"], Offer(msg_id=new_msg_id(), owner=W2, job_id=job, lease_s=LEASE_S,
                                            spec={"command": ["true"], "workdir": "/", "user": "root"}))


async def offer_for_a_user_it_does_not_vouch_for(lab: Lab) -> Send:
    await running_on_w1(lab)
    return Send(W1, BY_NAME["offer"], Offer(msg_id=new_msg_id(), owner=W2, job_id="0123456789ab", lease_s=LEASE_S,
                                            spec={"command": ["true"], "workdir": "/", "user": "alice"}))


async def claim_without_an_offer(lab: Lab) -> Send:
    job = await queued_offered_to_w1(lab)
    return Send(OWNER, BY_NAME["claim"], Claim(msg_id=new_msg_id(), worker=W2, job_id=job))


async def claim_by_a_personal_node_of_another_user(lab: Lab) -> Send:
    job = await queued_offered_to_w1(lab)
    d(lab, "owner").services.jobs.offered(job, W2)  # even with an offer: bob's node may not run root's job
    return Send(OWNER, BY_NAME["claim"], Claim(msg_id=new_msg_id(), worker=W2, job_id=job), user="bob")


async def report_by_a_non_holder(lab: Lab) -> Send:
    job = await running_on_w1(lab)
    return Send(OWNER, BY_NAME["report"], RunReport(msg_id=new_msg_id(), worker=W2, job_id=job, attempt=1,
                                                    kind="exited", exit_code=0))


async def kill_of_another_owners_run(lab: Lab) -> Send:
    job = await running_on_w1(lab)
    return Send(W1, BY_NAME["kill"], Kill(msg_id=new_msg_id(), owner=W2, job_id=job, attempt=1, reason="forged"))


async def logs_of_another_owners_run(lab: Lab) -> Send:
    job = await running_on_w1(lab)
    return Send(W1, BY_NAME["logs"], LogRequest(job_id=job, attempt=1))


async def hold_under_another_owners_hold_id(lab: Lab) -> Send:
    job, hold_id, spec = await hold_on_w1(lab)
    return Send(W1, BY_NAME["hold"], Hold(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id=hold_id, spec=spec,
                                          ttl_s=60.0))


async def release_of_another_owners_hold(lab: Lab) -> Send:
    _, hold_id, _ = await hold_on_w1(lab)
    return Send(W1, BY_NAME["release"], Release(msg_id=new_msg_id(), owner=W2, hold_id=hold_id))


async def commit_of_another_owners_hold(lab: Lab) -> Send:
    job, hold_id, spec = await hold_on_w1(lab)
    return Send(W1, BY_NAME["commit"], Commit(msg_id=new_msg_id(), owner=W2, job_id=job, hold_id=hold_id, attempt=1,
                                              lease_s=LEASE_S, spec=spec, node_rank=1, nnodes=2,
                                              master_addr="127.0.0.1", master_port=1))


def relayed(action: str, *, mode: str, user: str, as_user: str) -> Case:
    async def case(lab: Lab) -> Send:
        job = await running_on_w1(lab)
        return Send(OWNER, BY_NAME[f"job_{action}"], JobRequest(msg_id=new_msg_id(), job_id=job, user=as_user,
                                                                admin=True), mode=mode, user=user)
    case.__name__ = f"{action}_relayed_by_{mode}_node_of_{user or 'nobody'}_for_{as_user}"
    return case


async def _pending_task_of_root(lab: Lab) -> str:
    """Task 5 of root's array owned by the owner, not written yet (``%1``: one task at a time)."""
    owner = d(lab, "owner")
    spec: dict[str, Any] = {"command": ["sleep", "60"], "workdir": str(lab.workdir), "user": "root",
                            "array": "0-9%1", "policy": {"lease_s": LEASE_S}}
    array = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="root"))).id
    await lab.settle()
    return f"{array}_5"


def relayed_pending(*, mode: str, user: str, as_user: str) -> Case:
    async def case(lab: Lab) -> Send:
        task = await _pending_task_of_root(lab)
        return Send(OWNER, BY_NAME["job_cancel"], JobRequest(msg_id=new_msg_id(), job_id=task, user=as_user,
                                                             admin=True), mode=mode, user=user)
    case.__name__ = f"cancel_of_a_pending_array_task_relayed_by_{mode}_node_of_{user or 'nobody'}_for_{as_user}"
    return case


async def ship_fetch_by_a_member_that_does_not_hold_the_job(lab: Lab) -> Send:
    job = await running_on_w1(lab)  # w1 holds attempt 1: w2 may fetch none of its contents
    return Send(OWNER, BY_NAME["ship_fetch"], ShipFetch(job_id=job, attempt=1, digest="ab" * 32))


async def ship_fetch_by_the_holder_of_a_job_that_is_not_shipped(lab: Lab) -> Send:
    job = await running_on_w1(lab)  # its holder, asking a content of a job with no snapshot
    return Send(OWNER, BY_NAME["ship_fetch"], ShipFetch(job_id=job, attempt=1, digest="ab" * 32), sender=W1,
                mode="system", user="")


async def ship_output_by_a_member_that_did_not_run_it(lab: Lab) -> Send:
    job = await running_on_w1(lab)
    return Send(OWNER, BY_NAME["ship_output"], OutputChunk(worker=W2, job_id=job, attempt=1, path="results/a.json",
                                                           data="eyJ4IjoxfQ==", last=True))


async def ship_files_by_a_member_that_does_not_own_the_job(lab: Lab) -> Send:
    job = await running_on_w1(lab)  # w1 runs (and keeps) attempt 1 for the owner: w2, a valid member, gets no file
    return Send(W1, BY_NAME["ship_files"], TreeFiles(job_id=job, attempt=1, patterns=["**"]))


PEER_REFUSALS: dict[str, list[Case]] = {
    "offer": [offer_of_a_job_id_another_owner_runs_here, offer_for_a_user_it_does_not_vouch_for],
    "claim": [claim_without_an_offer, claim_by_a_personal_node_of_another_user],
    "report": [report_by_a_non_holder],
    "kill": [kill_of_another_owners_run],
    "logs": [logs_of_another_owners_run],
    "hold": [hold_under_another_owners_hold_id],
    "release": [release_of_another_owners_hold],
    "commit": [commit_of_another_owners_hold],
    "job_logs": [relayed("logs", mode="personal", user="bob", as_user="root"),
                 relayed("logs", mode="system", user="", as_user="bob")],
    "job_cancel": [relayed("cancel", mode="personal", user="bob", as_user="root"),
                   relayed("cancel", mode="system", user="", as_user="bob"),
                   relayed_pending(mode="personal", user="bob", as_user="root")],
    "ship_fetch": [ship_fetch_by_a_member_that_does_not_hold_the_job,
                   ship_fetch_by_the_holder_of_a_job_that_is_not_shipped],
    "ship_output": [ship_output_by_a_member_that_did_not_run_it],
    "ship_files": [ship_files_by_a_member_that_does_not_own_the_job],
}
"""Every peer route that is not public -> the ways a member without its role is refused."""

LOCAL_REFUSALS = ("cancel", "logs", "fetch")
"""Every local route that is not public: another local user (bob) asks about root's job."""


PUBLIC_PEER = ("heartbeat", "capabilities", "jobs", "job_find", "job_show", "job_explain", "usage_report")
"""Sent from a revoked node and a foreign cluster over mutual TLS (see below)."""
PUBLIC_LOCAL = ("health", "devices", "peers", "users", "metrics", "events", "submit", "jobs", "job", "explain",
                "snapshot", "snapshot_blob", "report", "prometheus")
"""Sent by another local user over the unix socket: answered, with no field of another user's spec."""
ENROLL_CASES = ("ca", "join", "renew")
"""Sent without a certificate, with a wrong secret, from a revoked node and from a stranger."""


def test_every_route_has_a_refusal_case(capsys: pytest.CaptureFixture[str]) -> None:
    for _, r in routes.all_routes():
        assert isinstance(r.role, routes.Role), r  # every route declares a role
        assert r.refusal in ("403", "stale"), r
    assert set(PEER_REFUSALS) == {r.name for r in routes.PEER_ROUTES if not r.role.public}, \
        "a peer route without a refusal case (or a case for no route)"
    assert set(PUBLIC_PEER) == {r.name for r in routes.PEER_ROUTES if r.role.public}
    assert set(LOCAL_REFUSALS) == {r.name for r in routes.LOCAL_ROUTES if not r.role.public}
    assert set(PUBLIC_LOCAL) == {r.name for r in routes.LOCAL_ROUTES if r.role.public}
    assert set(ENROLL_CASES) == set(routes.ENROLL)
    covered = ({("peer", n) for n in [*PEER_REFUSALS, *PUBLIC_PEER]} | {("local", n) for n in
               [*LOCAL_REFUSALS, *PUBLIC_LOCAL]} | {("enroll", n) for n in ENROLL_CASES})
    declared = {(t, r.name) for t, r in routes.all_routes()}
    assert covered == declared
    with capsys.disabled():
        sys.stderr.write(f"\nroute table: {len(declared)} routes declared ({len(routes.LOCAL_ROUTES)} local, "
                         f"{len(routes.PEER_ROUTES)} peer, {len(routes.ENROLL_ROUTES)} enrollment); "
                         f"{len(covered & declared)} of {len(declared)} sent by a caller without their role "
                         f"({100 * len(covered & declared) // len(declared)} %)\n")


@pytest.mark.asyncio
@pytest.mark.parametrize(("route", "case"), [(r, c) for r, cases in PEER_REFUSALS.items() for c in cases],
                         ids=[f"{r}-{c.__name__}" for r, cases in PEER_REFUSALS.items() for c in cases])
async def test_a_member_without_the_role_is_refused_and_nothing_changes(tmp_path: Path, route: str,
                                                                        case: Case) -> None:
    async with three_daemons(tmp_path) as lab:
        send = await case(lab)
        assert send.route.name == route
        before = await dump(lab)
        target = next(x for x in lab.daemons.values() if x.node_id == send.target)
        stats = target.services.signals.stats
        refused_before = stats["peer_messages_refused"]
        try:
            answer: object = await target.node.dispatch(send.route, send.sender, send.body, mode=send.mode,
                                                        user=send.user)
        except PeerRefused as e:
            answer = e
            assert send.route.route.refusal == "403"
        else:
            assert send.route.route.refusal == "stale", f"{route} was answered: {answer!r}"
            assert (getattr(answer, "ok", None), getattr(answer, "stale", None)) == (False, True), answer
        assert leaks(answer) == [], answer
        assert stats["peer_messages_refused"] == refused_before + 1
        assert await dump(lab) == before


# ---------------------------------------------------------------------------- public peer routes over TLS


@dataclass
class Certs:
    """A cluster (signer ``a``, member ``m``, revoked ``r``) and a stranger ``f`` of another cluster."""

    a: Identity
    m: Identity
    r: Identity
    f: Identity


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    token = ca.cluster_init(tmp_path / "a", "lab", mode="system", addresses=["127.0.0.1:1"], uses=2)
    m = ca.cluster_join(tmp_path / "m", token, mode="system", signer=tmp_path / "a")
    r = ca.cluster_join(tmp_path / "r", token, mode="system", signer=tmp_path / "a")
    ca.cluster_init(tmp_path / "f", "elsewhere", mode="system", addresses=["127.0.0.1:1"])
    return Certs(identity.load_or_create_identity(tmp_path / "a"), m, r,
                 identity.load_or_create_identity(tmp_path / "f"))


def _public_message(route: PeerRoute[Any, Any], sender: Identity, job: str) -> BaseModel | None:
    if route.name == "heartbeat":
        return Heartbeat(msg_id=new_msg_id(), node_id=sender.node_id, name="x", version="0", cluster="lab", port=1)
    if route.name == "jobs":
        return JobsRequest(msg_id=new_msg_id(), user="bob")
    if route.name.startswith("job_"):
        return JobRequest(msg_id=new_msg_id(), job_id=job, user="bob")
    if route.name == "usage_report":
        return UsageReportRequest(msg_id=new_msg_id(), since_s=86400.0, by="user")
    return None


@pytest.mark.asyncio
async def test_public_peer_routes_refuse_a_revoked_node_and_a_foreign_cluster(tmp_path: Path, certs: Certs) -> None:
    public = [BY_NAME[name] for name in PUBLIC_PEER]
    async with three_daemons(tmp_path / "lab") as lab:
        job = await running_on_w1(lab)
        router = d(lab, "owner").services.router
        assert router is not None
        runner, port = await start_peer_site(make_peer_app(router, {certs.r.node_id}.__contains__), "127.0.0.1", 0,
                                             tls.server_ssl_context(certs.a))
        clients = {n: PeerClient(tls.client_ssl_context(i), timeout_s=5.0)
                   for n, i in (("m", certs.m), ("r", certs.r), ("f", certs.f))}
        try:
            before = await dump(lab)
            for route in public:
                with pytest.raises(PeerRefused, match="removed from the cluster"):
                    await clients["r"].call_at("127.0.0.1", port, route, _public_message(route, certs.r, job))
                with pytest.raises(PeerCallError) as stranger:  # refused in the handshake, before any route
                    await clients["f"].call_at("127.0.0.1", port, route, _public_message(route, certs.f, job))
                assert not isinstance(stranger.value, PeerRefused) and leaks(stranger.value) == []
            assert await dump(lab) == before
            # A valid member is answered (this lab has no cluster service: no heartbeat handler, a 404),
            # and what a member sees of root's job as bob holds no field of its spec.
            for route in public:
                msg = _public_message(route, certs.m, job)
                if route.name == "heartbeat":
                    with pytest.raises(PeerCallError, match="HTTP 404"):
                        await clients["m"].call_at("127.0.0.1", port, route, msg)
                    continue
                reply, _ = await clients["m"].call_at("127.0.0.1", port, route, msg)
                assert leaks(reply) == [], (route.name, reply)
        finally:
            for c in clients.values():
                await c.close()
            await runner.cleanup()


# ---------------------------------------------------------------------------- enrollment routes


def _digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.asyncio
async def test_enrollment_routes_refuse_a_wrong_secret_a_revoked_node_and_a_stranger(certs: Certs) -> None:
    assert {name: routes.ENROLL[name].role for name in ENROLL_CASES} == {
        "ca": routes.Role.ANYONE, "join": routes.Role.TOKEN_HOLDER, "renew": routes.Role.RENEWING_MEMBER}
    idir = certs.a.key_path.parent
    net = TlsNetwork()
    revoked = {certs.r.node_id}.__contains__
    port = await net.serve_enroll("127.0.0.1", 0, tls.enroll_ssl_context(certs.a), identity_dir=idir,
                                  limits=ConnectionLimits(16, 8, lambda: 0.0), max_connection_s=10.0,
                                  is_revoked=revoked)
    token = await asyncio.to_thread(ca.new_token, idir.parent, addresses=[f"127.0.0.1:{port}"])
    before = await asyncio.to_thread(_digest, idir)

    def post(path: str, body: BaseModel, who: Identity | None) -> tuple[int, str]:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(idir / "ca.crt"))
        ctx.check_hostname = False
        if who is not None:
            assert who.cert_path is not None
            ctx.load_cert_chain(str(who.cert_path), str(who.key_path))
        import http.client

        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        try:
            conn.request("POST" if path != routes.ENROLL["ca"].path else "GET", path,
                         body=body.model_dump_json() if path != routes.ENROLL["ca"].path else None,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    try:
        status, pem = await asyncio.to_thread(post, routes.ENROLL["ca"].path, Release(msg_id="", owner="", hold_id="x"),
                                              None)  # anyone: the CA certificate and nothing else
        assert status == 200 and pem == await asyncio.to_thread((idir / "ca.crt").read_text)
        csr = _csr()
        wrong = EnrollJoin(token_id=decode_token(token).token_id, secret="not-the-secret", csr_pem=csr,
                           mode="system", user="")
        status, text = await asyncio.to_thread(post, routes.ENROLL["join"].path, wrong, None)
        assert status == 403 and "wrong secret" in text
        renew = EnrollRenew(csr_pem=csr)
        assert (await asyncio.to_thread(post, routes.ENROLL["renew"].path, renew, certs.r))[0] == 403
        with pytest.raises((ssl.SSLError, ConnectionError)):  # a stranger's certificate: refused in the handshake
            await asyncio.to_thread(post, routes.ENROLL["renew"].path, renew, certs.f)
        assert await asyncio.to_thread(_digest, idir) == before  # no token spent, no file written
    finally:
        await net.close()


def _csr() -> str:
    """A well-formed CSR for a fresh key (what a joining node sends)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "joiner")])).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


# ---------------------------------------------------------------------------- local routes


class _EveryoneIsBob(Requesters):
    """The user database of these tests: every uid is bob (no admin); the kernel still names the uid."""

    def lookup(self, uid: int) -> Requester:
        return Requester(uid=uid, user="bob")


@contextlib.asynccontextmanager
async def local_api(lab: Lab, short_dir: Path) -> AsyncIterator[Path]:
    from gpulayerd.app.local import LocalApi
    from gpulayerd.app.roles import LocalRoles

    o = d(lab, "owner")
    api = LocalApi(node_id=OWNER, hostname="owner", version="test", state_dir=str(o.config.state_dir),
                   owner=o.services.owner, machine=o.services.machine, directory=None, signals=o.services.signals,
                   clock=lab.clock, requesters=_EveryoneIsBob(mode="system", admin_group=""),
                   roles=LocalRoles(store=o.store, jobs=o.services.jobs),
                   accounting=o.services.api.accounting, openmetrics=o.services.api.openmetrics)
    runner = web.AppRunner(make_local_app(api, events_keepalive_s=0.05), handle_signals=False, access_log=None)
    await runner.setup()
    path = short_dir / "api.sock"
    await web.UnixSite(runner, str(path)).start()
    try:
        yield path
    finally:
        await runner.cleanup()


@pytest.fixture
def short_dir() -> Any:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="glrt", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.asyncio
async def test_local_routes_another_users_job_refused_or_concealed(tmp_path: Path, short_dir: Path) -> None:
    async with three_daemons(tmp_path) as lab:
        owner = d(lab, "owner")
        job = await job_of(lab, owner, cpus=1)  # root's job, queued on the owner
        async with local_api(lab, short_dir) as sock, DaemonClient(sock) as c:
            before = await dump(lab, settle=False)
            for name in LOCAL_REFUSALS:
                call = c.cancel(job) if name == "cancel" else c.fetch(job) if name == "fetch" else c.logs(job)
                with pytest.raises(ApiRequestError) as err:
                    await call
                assert (err.value.status, err.value.code) == (403, "forbidden")
                assert err.value.body.message == f"job {job} belongs to root" and leaks(err.value.body) == []
            assert await dump(lab, settle=False) == before
            # The public routes answer bob, with no field of root's spec, and change nothing.
            answers: dict[str, object] = {
                "health": await c.health(), "devices": await c.devices(), "peers": await c.peers(),
                "users": await c.users(), "jobs": await c.jobs(), "job": await c.job(job),
                "explain": await c.explain(job), "report": await c.report(86400),
                "prometheus": await c.prometheus(),
            }
            assert await dump(lab, settle=False) == before
            answers["metrics"] = await c.metrics()  # (its sampler runs on for a while: read after the dump)
            async with contextlib.aclosing(c.events()) as events:
                async for event in events:
                    answers["events"] = event
                    break
            manifest = Manifest(entries=[ManifestEntry(path="a.txt", kind="file", size=1, sha256="ab" * 32)])
            for name, call in (("snapshot", c.snapshot(manifest)), ("snapshot_blob", c.snapshot_blob("ab" * 32, 0, b"x"))):
                with pytest.raises(ApiRequestError) as refused:  # (this API has no shipping: a 400, nothing stored)
                    await call
                answers[name] = refused.value.body
            mine = await c.submit({"command": ["true"], "workdir": str(lab.workdir)})
            assert (mine.submitted_by, mine.spec.user) == ("bob", "bob")  # submit: always as the kernel's user
        for name, answer in answers.items():
            assert leaks(answer.model_dump_json() if isinstance(answer, BaseModel)
                         else json.dumps(answer, default=str)) == [], name
        assert set(PUBLIC_LOCAL) == set(answers) | {"submit"}


def test_the_architecture_doc_shows_the_route_tables_of_the_code() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = doc.find(routes.BEGIN_DOC), doc.find(routes.END_DOC)
    assert 0 <= start < end, "docs/architecture.md has no generated route tables"
    assert doc[start:end + len(routes.END_DOC)] == routes.markdown(), (
        "docs/architecture.md and the route table differ: run python -m gpulayerd.routes --write docs/architecture.md")
    for _, r in routes.all_routes():
        assert f"`{r.path}`" in doc and f"`{r.handler}`" in doc


@pytest.mark.asyncio
async def test_the_daemon_binds_a_handler_to_every_peer_route(tmp_path: Path) -> None:
    async with three_daemons(tmp_path) as lab:
        router = d(lab, "owner").services.router
        assert router is not None
        # Outside a ClusterNode (this lab's loopback) only the heartbeat is the cluster service's to answer.
        assert router.bound() == set(routes.PEER) - {"heartbeat"}
    declared = {r.handler for r in routes.PEER_ROUTES}
    assert "cluster.heartbeat" in declared and len(declared) == len(routes.PEER_ROUTES)  # one handler per route
