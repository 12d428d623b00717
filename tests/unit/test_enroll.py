"""Enrollment without the CA key and revocation (net.enroll, net.revocation, api.enroll), over real TLS on 127.0.0.1.

The blocking enrollment client (http.client, as the CLI uses it) runs in a thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.client
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from gpulayerd.api.enroll import make_enroll_app
from gpulayerd.api.peer import PeerClient, PeerRouter, TlsNetwork, make_peer_app, start_peer_site
from gpulayerd.errors import PeerRefused
from gpulayerd.models import JobList
from gpulayerd.net import ca, enroll, identity, joining, revocation, tls
from gpulayerd.net.enroll import EnrollRefused
from gpulayerd.net.identity import Identity
from gpulayerd.net.revocation import Revocation
from gpulayerd.net.transport import JOBS, Sender
from gpulayerd.net.wire import JobsRequest, new_msg_id


@asynccontextmanager
async def _signer(state_dir: Path, revoked: set[str] | None = None) -> AsyncIterator[tuple[int, list[str]]]:
    """The enrollment listener of the signer ``state_dir``: (port, paths of the requests it answered)."""
    ident = await asyncio.to_thread(identity.load_or_create_identity, state_dir)
    gone = revoked if revoked is not None else set()
    app = make_enroll_app(ident.key_path.parent, gone.__contains__)
    seen: list[str] = []

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        seen.append(request.path)

    app.on_response_prepare.append(record)
    runner, port = await start_peer_site(app, "127.0.0.1", 0, tls.enroll_ssl_context(ident))
    try:
        yield port, seen
    finally:
        await runner.cleanup()


def _idir(state: Path) -> Path:
    return state / "identity"


@pytest.mark.asyncio
async def test_online_join_installs_no_ca_key_and_a_token_is_one_time(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    async with _signer(a) as (port, _):
        token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        joined = await asyncio.to_thread(ca.cluster_join, b, token)
        with pytest.raises(EnrollRefused, match="already used"):
            await asyncio.to_thread(ca.cluster_join, c, token)
    assert joined.in_cluster and joined.cluster_name == "lab"
    assert joined.cluster_id == (await asyncio.to_thread(identity.load_or_create_identity, a)).cluster_id
    assert not (await asyncio.to_thread(identity.load_or_create_identity, c)).in_cluster
    ca_key = (_idir(a) / "ca.key").read_bytes().strip()
    assert not [f for f in b.rglob("*") if f.is_file() and (f.name == "ca.key" or ca_key in f.read_bytes())]
    assert json.loads((_idir(b) / "cluster.json").read_text())["signers"] == [f"127.0.0.1:{port}"]
    assert joined.cert_path is not None
    cert = x509.load_pem_x509_certificate(joined.cert_path.read_bytes())
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert dt.timedelta(days=30) <= life <= dt.timedelta(days=30, hours=1)
    assert (joined.mode, joined.user) == ("personal", ca.this_user())
    rows = await asyncio.to_thread(enroll.list_tokens, _idir(a))  # cluster init's token, then ours
    assert [(r.uses_left, r.used) for r in rows] == [(1, 0), (0, 1)]


@pytest.mark.asyncio
async def test_expired_wrong_and_revoked_tokens_are_refused_and_consume_nothing(tmp_path: Path) -> None:
    a = tmp_path / "a"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    async with _signer(a) as (port, _):
        token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        tok = enroll.decode_token(token)
        wrong = enroll.JoinToken(**{**{f: getattr(tok, f) for f in tok.__slots__}, "secret": "x" * 43}).encode()
        with pytest.raises(EnrollRefused, match="wrong secret"):
            await asyncio.to_thread(ca.cluster_join, tmp_path / "w", wrong)
        table = json.loads((_idir(a) / "tokens.json").read_text())
        table[tok.token_id]["expires"] = 1.0
        (_idir(a) / "tokens.json").write_text(json.dumps(table))
        with pytest.raises(EnrollRefused, match="expired"):
            await asyncio.to_thread(ca.cluster_join, tmp_path / "x", token)
        other = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        assert await asyncio.to_thread(enroll.revoke_token, _idir(a), enroll.decode_token(other).token_id)
        with pytest.raises(EnrollRefused, match="unknown to this signer"):
            await asyncio.to_thread(ca.cluster_join, tmp_path / "y", other)
    assert [t.used for t in await asyncio.to_thread(enroll.list_tokens, _idir(a))] == [0]  # init's; ours was forgotten (expired long ago)
    # A token whose own expiry has passed is refused without contacting anyone.
    stale = enroll.JoinToken(**{**{f: getattr(tok, f) for f in tok.__slots__}, "expires": 1.0}).encode()
    with pytest.raises(enroll.TokenError, match="expired"):
        enroll.decode_token(stale)


@pytest.mark.asyncio
async def test_a_signer_with_another_ca_gets_no_secret(tmp_path: Path) -> None:
    a, mitm = tmp_path / "a", tmp_path / "mitm"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    await asyncio.to_thread(ca.cluster_init, mitm, "evil", addresses=["127.0.0.1:1"])
    async with _signer(mitm) as (port, seen):
        # a's token, but the address is the intruder's
        token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        with pytest.raises(EnrollRefused, match="refused before sending the secret"):
            await asyncio.to_thread(ca.cluster_join, tmp_path / "b", token)
    assert seen == ["/v1/enroll/ca"]  # never /join: the secret was not sent
    assert not (await asyncio.to_thread(identity.load_or_create_identity, tmp_path / "b")).in_cluster
    assert [t.uses_left for t in await asyncio.to_thread(enroll.list_tokens, _idir(a))] == [1, 1]


@pytest.mark.asyncio
async def test_renewal_needs_a_valid_unrevoked_certificate_and_no_other_route_answers(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    token = await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    member = await asyncio.to_thread(ca.cluster_join, b, token, signer=a)
    key = await asyncio.to_thread(identity.load_or_create_key, _idir(b))
    revoked: set[str] = set()
    async with _signer(a, revoked) as (port, _):
        addr = [f"127.0.0.1:{port}"]
        pem = await asyncio.to_thread(joining.renew_online, _idir(b), key, addr)
        new = x509.load_pem_x509_certificate(pem)
        assert identity.cert_mode_user(new) == (member.mode, member.user)
        assert identity.node_id_from_public_key(new.public_key()) == member.node_id
        # Without a certificate: the enrollment listener serves no peer route, and no renewal.
        assert await asyncio.to_thread(_anonymous, port, "GET", "/v1/peer/capabilities") == 404
        assert await asyncio.to_thread(_anonymous, port, "POST", "/v1/peer/heartbeat") == 404
        assert await asyncio.to_thread(_anonymous, port, "POST", "/v1/enroll/renew") == 401
        revoked.add(member.node_id)
        with pytest.raises(EnrollRefused, match="removed from the cluster"):
            await asyncio.to_thread(joining.renew_online, _idir(b), key, addr)


def _anonymous(port: int, method: str, path: str) -> int:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    try:
        conn.request(method, path, body=b"{}" if method == "POST" else None)
        return conn.getresponse().status
    finally:
        conn.close()


# ---------------------------------------------------------------------------- revocation


def test_revocation_entries_verify_only_with_the_cluster_ca(tmp_path: Path) -> None:
    a, other = tmp_path / "a", tmp_path / "o"
    ca.cluster_init(a, "lab", addresses=["127.0.0.1:1"])
    ca.cluster_init(other, "other", addresses=["127.0.0.1:1"])
    victim = "v" * 52
    entry = revocation.revoke_node(_idir(a), victim)
    ca_a = x509.load_pem_x509_certificate((_idir(a) / "ca.crt").read_bytes())
    assert revocation.verify_entry(ca_a, entry)
    assert not revocation.verify_entry(ca_a, Revocation("w" * 52, entry.at, entry.sig))  # another node
    assert not revocation.verify_entry(ca_a, Revocation(victim, entry.at + 1, entry.sig))  # another time
    assert not revocation.verify_entry(ca_a, Revocation(victim, entry.at, "garbage!"))
    # Signed by another cluster's CA: ignored, not stored.
    ca_o = x509.load_pem_x509_certificate((_idir(other) / "ca.crt").read_bytes())
    forged_key = _key(_idir(other) / "ca.key")
    forged = revocation.sign_entry(ca_o, forged_key, "f" * 52)
    assert revocation.add_entries(_idir(a), [forged]) == []
    assert [e.node_id for e in revocation.load_entries(_idir(a))] == [victim]
    # A member stores a valid entry from gossip once, and skips a forged line in its file.
    b = tmp_path / "b"
    ca.cluster_join(b, ca.new_token(a, addresses=["127.0.0.1:1"]), signer=a)
    assert revocation.add_entries(_idir(b), [entry, forged]) == [entry]
    assert revocation.add_entries(_idir(b), [entry]) == []
    rows = json.loads((_idir(b) / "revocations.json").read_text())
    rows.append({"node_id": "g" * 52, "at": 1, "sig": forged.sig})
    (_idir(b) / "revocations.json").write_text(json.dumps(rows))
    assert revocation.load_entries(_idir(b)) == [entry]


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


class _Allow:
    async def check(self, route: object, sender: Sender, body: object) -> str | None:
        return None


async def _no_jobs(sender: Sender, msg: JobsRequest) -> JobList:
    return JobList()


@pytest.mark.asyncio
async def test_peer_api_refuses_a_revoked_node_before_any_route(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    token = await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"], uses=2)
    ids: dict[str, Identity] = {n: await asyncio.to_thread(ca.cluster_join, tmp_path / n, token, signer=a)
                                for n in ("b", "c")}
    revoked = {ids["c"].node_id}
    server = await asyncio.to_thread(identity.load_or_create_identity, a)
    router = PeerRouter({"jobs.listing": _no_jobs}, _Allow())
    runner, port = await start_peer_site(make_peer_app(router, revoked.__contains__), "127.0.0.1", 0,
                                         tls.server_ssl_context(server))
    try:
        good = PeerClient(tls.client_ssl_context(await asyncio.to_thread(identity.load_or_create_identity, b)))
        bad = PeerClient(tls.client_ssl_context(await asyncio.to_thread(identity.load_or_create_identity, c)))
        try:
            ask = JobsRequest(msg_id=new_msg_id())
            reply, who = await good.call_at("127.0.0.1", port, JOBS, ask)
            assert (reply.jobs, who.node_id) == ([], server.node_id)
            with pytest.raises(PeerRefused, match=r"removed from the cluster"):
                await bad.call_at("127.0.0.1", port, JOBS, ask)
        finally:
            await good.close()
            await bad.close()
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_daemon_renews_a_members_certificate_through_its_signer(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from typing import cast

    from gpulayerd.app.cluster.trust import Trust
    from gpulayerd.app.common.clock import Clock

    a, b = tmp_path / "a", tmp_path / "b"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    async with _signer(a) as (port, seen):
        token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        member = await asyncio.to_thread(ca.cluster_join, b, token)
        assert member.cert_path is not None
        old = await asyncio.to_thread(member.cert_path.read_bytes)
        trust = Trust(member, cast(Clock, None), TlsNetwork())
        trust.contexts = [tls.client_ssl_context(member)]
        await trust._renew_if_due()  # 30 days left: nothing to do
        assert await asyncio.to_thread(member.cert_path.read_bytes) == old and "/v1/enroll/renew" not in seen
        monkeypatch.setattr(identity, "RENEW_BEFORE", dt.timedelta(days=31))
        await trust._renew_if_due()
    new = x509.load_pem_x509_certificate(await asyncio.to_thread(member.cert_path.read_bytes))
    assert seen.count("/v1/enroll/renew") == 1
    assert new.serial_number != x509.load_pem_x509_certificate(old).serial_number
    assert identity.node_id_from_public_key(new.public_key()) == member.node_id
    assert not (b / "identity" / "ca.key").exists()


@pytest.mark.asyncio
async def test_a_removed_nodes_key_cannot_join_again_and_spends_no_token(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    await asyncio.to_thread(ca.cluster_init, a, "lab", addresses=["127.0.0.1:1"])
    removed = (await asyncio.to_thread(identity.load_or_create_identity, b)).node_id  # b's key, removed
    async with _signer(a, revoked={removed}) as (port, _):
        token = await asyncio.to_thread(ca.new_token, a, addresses=[f"127.0.0.1:{port}"])
        with pytest.raises(EnrollRefused, match="was removed from this cluster"):
            await asyncio.to_thread(ca.cluster_join, b, token)
        left = {t.token_id: t.uses_left for t in await asyncio.to_thread(enroll.list_tokens, _idir(a))}
        assert left[enroll.decode_token(token).token_id] == 1  # not spent
        await asyncio.to_thread(ca.cluster_join, tmp_path / "c", token)  # a new key joins with it

