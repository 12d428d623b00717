"""A node certificate records the node's mode and (personal) bound user; the peer API passes them on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from gpulayerd.api.peer import PeerClient, make_peer_app, start_peer_site
from gpulayerd.cli import main
from gpulayerd.net import ca, enroll, identity, tls
from gpulayerd.net.enroll import TokenError
from gpulayerd.net.identity import Identity, ModeMismatch, TlsError
from gpulayerd.net.transport import JOB_ACTION_ROUTES, OFFER, Sender
from gpulayerd.net.wire import Ack, JobReply, JobRequest, Offer, new_msg_id
from tests.fakes.routers import router_of


def _cert_der(ident: Identity) -> bytes:
    assert ident.cert_path is not None
    return x509.load_pem_x509_certificate(ident.cert_path.read_bytes()).public_bytes(serialization.Encoding.DER)


def test_personal_certificate_is_bound_to_its_user(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice")
    a = identity.load_or_create_identity(tmp_path / "a")
    assert (a.mode, a.user) == ("personal", "alice")
    assert tls.peer_identity(_cert_der(a)) == (a.node_id, "personal", "alice")
    assert tls.peer_identity(_cert_der(a)).user == "alice"


def test_default_user_is_the_account_running_the_command(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", None)
    a = identity.load_or_create_identity(tmp_path / "a")
    assert (a.mode, a.user) == ("personal", ca.this_user())


def test_system_certificate_vouches_for_no_single_user(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice", addresses=["127.0.0.1:1"])
    token = ca.new_token(tmp_path / "a", mode="system", addresses=["127.0.0.1:1"])  # the signer chooses
    b = ca.cluster_join(tmp_path / "b", token, mode="system", signer=tmp_path / "a")
    assert (b.mode, b.user) == ("system", "")
    assert tls.peer_identity(_cert_der(b)) == (b.node_id, "system", "")
    cert = x509.load_der_x509_certificate(_cert_der(b))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)] == [
        "gpulayer-mode=system"]
    assert cert.subject.get_attributes_for_oid(NameOID.USER_ID) == []


def test_rejoining_in_another_mode_signs_a_new_certificate_for_the_same_node(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice", addresses=["127.0.0.1:1"])
    signer = tmp_path / "a"
    token = ca.new_token(signer, user="bob", addresses=["127.0.0.1:1"])
    b = ca.cluster_join(tmp_path / "b", token, user="bob", signer=signer)
    assert ca.cluster_join(tmp_path / "b", token, user="bob", signer=signer) == b  # same mode and user: unchanged
    system_token = ca.new_token(signer, mode="system", addresses=["127.0.0.1:1"])
    s = ca.cluster_join(tmp_path / "b", system_token, mode="system", signer=signer)
    assert (s.node_id, s.mode, s.user) == (b.node_id, "system", "")
    assert identity.load_or_create_identity(tmp_path / "b").mode == "system"


def test_a_certificate_from_before_modes_reads_as_personal_bound_to_nobody(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice")
    idir = tmp_path / "a" / "identity"
    key = serialization.load_pem_private_key((idir / "node.key").read_bytes(), password=None)
    ca_key = serialization.load_pem_private_key((idir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((idir / "ca.crt").read_bytes())
    node_id = identity.load_or_create_identity(tmp_path / "a").node_id
    now = identity.utc_now()
    old = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
           .issuer_name(ca_cert.subject).public_key(key.public_key())  # type: ignore[arg-type]
           .serial_number(x509.random_serial_number())
           .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=300))
           .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    identity.write_file(idir / "node.crt", old.public_bytes(serialization.Encoding.PEM))
    a = identity.load_or_create_identity(tmp_path / "a")
    assert (a.mode, a.user) == ("personal", "")
    assert tls.peer_identity(old.public_bytes(serialization.Encoding.DER)) == (node_id, "personal", "")


@pytest.mark.parametrize("user", ["", "a b", "x:y", "a" * 65, "tab\there"])
def test_bad_user_names_are_refused_at_enrollment(tmp_path: Path, user: str) -> None:
    with pytest.raises(TlsError, match="user"):
        ca.cluster_init(tmp_path / "a", "lab", user=user)


def test_bad_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="mode 'root': use one of personal, system"):
        ca.cluster_init(tmp_path / "a", "lab", mode="root")


def test_renewal_keeps_mode_and_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice")
    before = _cert_der(identity.load_or_create_identity(tmp_path / "a"))
    monkeypatch.setattr(identity, "RENEW_BEFORE", dt.timedelta(days=100000))
    a = identity.load_or_create_identity(tmp_path / "a")
    assert _cert_der(a) != before  # renewed
    assert tls.peer_identity(_cert_der(a)) == (a.node_id, "personal", "alice")


def test_daemon_mode_must_match_the_certificate(tmp_path: Path) -> None:
    ca.cluster_init(tmp_path / "a", "lab", user="alice")
    a = identity.load_or_create_identity(tmp_path / "a")
    identity.check_mode(a, "personal")
    with pytest.raises(ModeMismatch) as e:
        identity.check_mode(a, "system")
    assert "enrolled in personal mode but gpulayerd is configured for system mode" in str(e.value)
    assert "sudo gpulayer cluster join --force --system -" in str(e.value)
    assert isinstance(e.value, ValueError)  # gpulayerd's main prints it and exits 2
    identity.check_mode(identity.load_or_create_identity(tmp_path / "z"), "system")  # not in a cluster: no check


def test_cli_system_flag_is_for_root_only(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sd = str(tmp_path / "s")
    monkeypatch.setattr("gpulayerd.cli.cluster.os.geteuid", lambda: 1000)
    assert main(["--state-dir", sd, "cluster", "init", "--system"]) == 1
    assert "only root may enroll a system-mode node" in capsys.readouterr().err
    monkeypatch.setattr("gpulayerd.cli.cluster.os.geteuid", lambda: 0)
    assert main(["--state-dir", sd, "cluster", "init", "--system"]) == 0
    assert "system mode" in capsys.readouterr().out
    assert main(["--state-dir", sd, "cluster", "show"]) == 0
    assert "mode:       system mode: vouches for every user's jobs" in capsys.readouterr().out


# ---------------------------------------------------------------------- over the peer API


class _Offers:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    async def offer(self, sender: Sender, msg: Offer) -> Ack:
        self.seen.append((sender.node_id, sender.mode, sender.user))
        return Ack(ok=True)


@pytest.fixture
def three_nodes(tmp_path: Path) -> tuple[Identity, Identity, Identity]:
    """A system-mode worker, bob's personal node and another system-mode node, in one cluster."""
    token = ca.cluster_init(tmp_path / "w", "lab", mode="system", addresses=["127.0.0.1:1"])
    worker = identity.load_or_create_identity(tmp_path / "w")
    bobs = ca.new_token(tmp_path / "w", user="bob", addresses=["127.0.0.1:1"])
    return (worker, ca.cluster_join(tmp_path / "bob", bobs, user="bob", signer=tmp_path / "w"),
            ca.cluster_join(tmp_path / "sys", token, mode="system", signer=tmp_path / "w"))


@pytest.mark.asyncio
async def test_peer_api_gives_offers_the_senders_mode_and_user(three_nodes: tuple[Identity, Identity, Identity]
                                                               ) -> None:
    worker, bob, root = three_nodes
    service = _Offers()
    runner, port = await start_peer_site(make_peer_app(router_of({"worker.offer": service.offer})), "127.0.0.1", 0,
                                         tls.server_ssl_context(worker))
    try:
        for sender in (bob, root):
            client = PeerClient(tls.client_ssl_context(sender))
            try:
                offer = Offer(msg_id=new_msg_id(), owner=sender.node_id, job_id="j1", lease_s=10.0,
                              spec={"command": ["true"], "workdir": "/", "user": "alice"})
                ack, who = await client.call_at("127.0.0.1", port, OFFER, offer, expect_node=worker.node_id)
                assert ack.ok and who.node_id == worker.node_id
            finally:
                await client.close()
    finally:
        await runner.cleanup()
    assert service.seen == [(bob.node_id, "personal", "bob"), (root.node_id, "system", "")]


class _JobDesk:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str, str]] = []

    def handler(self, action: str) -> Callable[[Sender, JobRequest], Awaitable[JobReply]]:
        async def answer(sender: Sender, msg: JobRequest) -> JobReply:
            self.seen.append((sender.node_id, action, sender.mode, sender.user, msg.user))
            return JobReply(error="forbidden", message="no")
        return answer


@pytest.mark.asyncio
async def test_peer_api_gives_job_requests_the_senders_mode_and_user(
        three_nodes: tuple[Identity, Identity, Identity]) -> None:
    worker, bob, root = three_nodes
    service = _JobDesk()
    router = router_of({f"jobs.peer_{a}": service.handler(a) for a in ("logs", "cancel")})
    runner, port = await start_peer_site(make_peer_app(router), "127.0.0.1", 0, tls.server_ssl_context(worker))
    try:
        for sender, action in ((bob, "logs"), (root, "cancel")):
            client = PeerClient(tls.client_ssl_context(sender))
            try:
                msg = JobRequest(msg_id=new_msg_id(), job_id="j1", user="alice", admin=True)
                reply, _ = await client.call_at("127.0.0.1", port, JOB_ACTION_ROUTES[action], msg,
                                                expect_node=worker.node_id)
                assert (reply.error, reply.message) == ("forbidden", "no")
            finally:
                await client.close()
    finally:
        await runner.cleanup()
    assert service.seen == [(bob.node_id, "logs", "personal", "bob", "alice"),
                            (root.node_id, "cancel", "system", "", "alice")]


def test_the_signer_not_the_joiner_chooses_mode_and_user(tmp_path: Path) -> None:
    """A token for bob's personal node cannot enroll a system-mode node or alice's (both sides check)."""
    ca.cluster_init(tmp_path / "w", "lab", mode="system", addresses=["127.0.0.1:1"])
    bobs = ca.new_token(tmp_path / "w", user="bob", addresses=["127.0.0.1:1"])
    with pytest.raises(TokenError, match="personal-mode node of 'bob'"):
        ca.cluster_join(tmp_path / "x", bobs, mode="system", signer=tmp_path / "w")
    with pytest.raises(TokenError, match="personal-mode node of 'bob'"):
        ca.cluster_join(tmp_path / "x", bobs, user="alice", signer=tmp_path / "w")
    # A joiner that edits its copy of the token is refused by the signer's own record, and spends nothing.
    forged = enroll.decode_token(bobs)
    forged = enroll.JoinToken(**{**{f: getattr(forged, f) for f in forged.__slots__}, "mode": "system", "user": ""})
    with pytest.raises(enroll.EnrollRefused, match="enrolls personal-mode nodes of 'bob', not a system-mode node"):
        ca.cluster_join(tmp_path / "x", forged.encode(), mode="system", signer=tmp_path / "w")
    assert [t.uses_left for t in enroll.list_tokens(identity.identity_dir(tmp_path / "w")) if t.user == "bob"] == [1]
    assert ca.cluster_join(tmp_path / "b", bobs, user="bob", signer=tmp_path / "w").user == "bob"
