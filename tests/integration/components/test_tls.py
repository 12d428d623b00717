"""Cluster trust (net.identity, net.ca, net.tls): identity files, join tokens, mutual TLS over 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import socket
import ssl
import stat
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest

from gpulayerd.cli import main
from gpulayerd.net import ca, identity, tls
from gpulayerd.net.enroll import EnrollRefused, TokenError
from gpulayerd.net.identity import Identity, TlsError

B32 = set("abcdefghijklmnopqrstuvwxyz234567")
HANDSHAKE_TIMEOUT_S = 5.0


@pytest.fixture
def cluster(tmp_path: Path) -> tuple[Identity, Identity, str]:
    """Two nodes (a made the cluster, b joined it) and the join token."""
    token = ca.cluster_init(tmp_path / "a", "lab", uses=10, addresses=["127.0.0.1:1"])
    b = ca.cluster_join(tmp_path / "b", token, signer=tmp_path / "a")
    return identity.load_or_create_identity(tmp_path / "a"), b, token


@pytest.fixture
def foreign(tmp_path: Path) -> Identity:
    """A node of another cluster."""
    ca.cluster_init(tmp_path / "c", "other")
    return identity.load_or_create_identity(tmp_path / "c")


# ---------------------------------------------------------------------- identity files


def test_node_id_is_52_base32_characters_and_stable(tmp_path: Path) -> None:
    first = identity.load_or_create_identity(tmp_path)
    again = identity.load_or_create_identity(tmp_path)
    assert len(first.node_id) == 52
    assert set(first.node_id) <= B32
    assert again.node_id == first.node_id
    assert not first.in_cluster
    assert first.cert_path is None and first.ca_path is None and first.cluster_id is None


def test_node_id_is_sha256_of_the_public_key(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    ident = identity.load_or_create_identity(tmp_path)
    key = serialization.load_pem_private_key(ident.key_path.read_bytes(), password=None)
    assert identity.node_id_from_public_key(key.public_key()) == ident.node_id


def test_two_state_dirs_have_different_node_ids(tmp_path: Path) -> None:
    assert identity.load_or_create_identity(tmp_path / "x").node_id != identity.load_or_create_identity(tmp_path / "y").node_id


def test_key_files_are_private_even_with_an_open_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        identity.load_or_create_identity(tmp_path)
        ca.cluster_init(tmp_path, None)
    finally:
        os.umask(old)
    idir = tmp_path / "identity"
    assert stat.S_IMODE(idir.stat().st_mode) == 0o700
    assert stat.S_IMODE((idir / "node.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((idir / "ca.key").stat().st_mode) == 0o600
    for f in idir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
    assert not [f for f in idir.iterdir() if f.name.endswith(".tmp")]


def test_loose_identity_dir_is_tightened(tmp_path: Path) -> None:
    (tmp_path / "identity").mkdir(mode=0o755)
    os.chmod(tmp_path / "identity", 0o755)
    identity.load_or_create_identity(tmp_path)
    assert stat.S_IMODE((tmp_path / "identity").stat().st_mode) == 0o700


# ------------------------------------------------------------------- init and join


def test_init_then_join_share_the_cluster_with_own_node_ids(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, _ = cluster
    assert a.in_cluster and b.in_cluster
    assert a.cluster_id == b.cluster_id
    assert a.cluster_id is not None and len(a.cluster_id) == 16 and set(a.cluster_id) <= B32
    assert a.cluster_name == b.cluster_name == "lab"
    assert a.node_id != b.node_id
    info = json.loads((b.state_dir / "identity" / "cluster.json").read_text())
    assert info["cluster_id"] == a.cluster_id and info["name"] == "lab" and info["created_at"] > 0


def test_node_certificate_names_the_node(cluster: tuple[Identity, Identity, str]) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    _, b, _ = cluster
    assert b.cert_path is not None
    cert = x509.load_pem_x509_certificate(b.cert_path.read_bytes())
    assert tls.peer_node_id(cert.public_bytes(Encoding.DER)) == b.node_id
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [b.node_id]


def test_joining_keeps_the_node_id(tmp_path: Path) -> None:
    before = identity.load_or_create_identity(tmp_path / "b").node_id
    token = ca.cluster_init(tmp_path / "a", None, addresses=["127.0.0.1:1"])
    assert ca.cluster_join(tmp_path / "b", token, signer=tmp_path / "a").node_id == before


def test_tokens_are_made_by_signers_only_and_members_hold_no_ca_key(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, token = cluster
    assert (a.state_dir / "identity" / "ca.key").exists()
    assert not (b.state_dir / "identity" / "ca.key").exists()
    again = ca.new_token(a.state_dir, addresses=["127.0.0.1:1"])
    assert again != token and again.startswith("gpl2.")
    with pytest.raises(TlsError, match="not a signer"):
        ca.new_token(b.state_dir, addresses=["127.0.0.1:1"])


def test_joining_the_same_cluster_again_is_idempotent(cluster: tuple[Identity, Identity, str]) -> None:
    _, b, token = cluster
    assert b.cert_path is not None
    cert = b.cert_path.read_bytes()
    assert ca.cluster_join(b.state_dir, token, signer=a_dir(b)) == b
    assert b.cert_path.read_bytes() == cert


def test_joining_a_different_cluster_needs_force(cluster: tuple[Identity, Identity, str], foreign: Identity) -> None:
    _, b, _ = cluster
    other = ca.new_token(foreign.state_dir, addresses=["127.0.0.1:1"])
    with pytest.raises(TlsError, match=r"already in cluster 'lab'.*--force"):
        ca.cluster_join(b.state_dir, other, signer=foreign.state_dir)
    assert identity.load_or_create_identity(b.state_dir) == b
    moved = ca.cluster_join(b.state_dir, other, force=True, signer=foreign.state_dir)
    assert moved.cluster_id == foreign.cluster_id and moved.node_id == b.node_id


def test_init_twice_needs_force(cluster: tuple[Identity, Identity, str]) -> None:
    a, _, token = cluster
    with pytest.raises(TlsError, match="already in cluster"):
        ca.cluster_init(a.state_dir, "again")
    new = ca.cluster_init(a.state_dir, "again", force=True)
    assert new != token
    assert identity.load_or_create_identity(a.state_dir).cluster_name == "again"


def test_not_in_a_cluster_has_no_token_and_no_contexts(tmp_path: Path) -> None:
    ident = identity.load_or_create_identity(tmp_path)
    with pytest.raises(TlsError, match="cluster init"):
        ca.new_token(tmp_path)
    with pytest.raises(TlsError, match="not in a cluster"):
        tls.server_ssl_context(ident)
    with pytest.raises(TlsError, match="not in a cluster"):
        tls.client_ssl_context(ident)


def test_certificate_of_another_key_is_refused(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, _ = cluster
    assert a.cert_path is not None and b.cert_path is not None
    b.cert_path.write_bytes(a.cert_path.read_bytes())
    with pytest.raises(TlsError, match="does not match this node's key"):
        identity.load_or_create_identity(b.state_dir)


def test_certificate_not_signed_by_the_ca_is_refused(cluster: tuple[Identity, Identity, str],
                                                     foreign: Identity) -> None:
    _, b, _ = cluster
    assert b.ca_path is not None and foreign.ca_path is not None
    b.ca_path.write_bytes(foreign.ca_path.read_bytes())
    cluster_json = b.state_dir / "identity" / "cluster.json"
    cluster_json.write_text(json.dumps({"cluster_id": foreign.cluster_id, "name": "x", "created_at": 0}))
    with pytest.raises(TlsError, match="not signed by the cluster CA"):
        identity.load_or_create_identity(b.state_dir)
    # A broken install can be repaired by joining again.
    again = ca.new_token(foreign.state_dir, addresses=["127.0.0.1:1"])
    assert ca.cluster_join(b.state_dir, again, force=True, signer=foreign.state_dir).in_cluster


def a_dir(b: Identity) -> Path:
    """The founding node's state dir next to ``b``'s (the ``cluster`` fixture)."""
    return b.state_dir.parent / "a"


def _token(body: object, prefix: str = "gpl2.") -> str:
    return prefix + base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda t: t[: len(t) // 2], "truncated or garbled"),
        (lambda t: t[:-3], "truncated or garbled"),
        (lambda t: t[:40] + "!!!" + t[43:], "truncated or garbled"),
        (lambda t: t[:20] + ("A" if t[20] != "A" else "B") + t[21:], "truncated or garbled"),
        (lambda t: "gpl1.", "old join token"),
        (lambda t: "hello", "not a gpulayer join token"),
        (lambda t: "gpl3." + t[5:], "not a gpulayer join token"),
        (lambda t: _token({"v": 7}), "truncated or garbled"),
        (lambda t: _token(["not", "an", "object"]), "truncated or garbled"),
        (lambda t: _token({"v": 2, "cluster_id": "x"}), "missing fields"),
    ],
    ids=["half", "last-chars", "bad-base64", "flipped-char", "empty", "not-a-token", "prefix-version",
         "body-version", "not-object", "missing-fields"],
)
def test_bad_token_is_refused_clearly(tmp_path: Path, mangle: object, message: str) -> None:
    token = ca.cluster_init(tmp_path / "a", "lab", addresses=["127.0.0.1:1"])
    assert callable(mangle)
    with pytest.raises(TokenError, match=message):
        ca.cluster_join(tmp_path / "b", mangle(token), signer=tmp_path / "a")
    assert not identity.load_or_create_identity(tmp_path / "b").in_cluster


def test_token_holds_no_ca_key_and_a_foreign_signer_is_refused(cluster: tuple[Identity, Identity, str],
                                                               foreign: Identity) -> None:
    _, _, token = cluster
    body = json.loads(base64.urlsafe_b64decode(token[5:] + "=="))
    assert "PRIVATE KEY" not in json.dumps(body) and set(body) == {
        "v", "cluster_id", "name", "ca_sha256", "signer", "addresses", "id", "secret", "exp", "mode", "user"}
    with pytest.raises(EnrollRefused, match="does not match the token"):
        ca.cluster_join(foreign.state_dir.parent / "e", token, signer=foreign.state_dir)


def test_token_with_whitespace_from_copy_paste_is_accepted(cluster: tuple[Identity, Identity, str],
                                                            tmp_path: Path) -> None:
    a, _, token = cluster
    wrapped = "\n".join(token[i:i + 60] for i in range(0, len(token), 60)) + "\n"
    assert ca.cluster_join(tmp_path / "w", f"  {wrapped}", signer=a.state_dir).cluster_id == a.cluster_id


# ------------------------------------------------------------------------ mutual TLS


class _Server:
    """A TLS echo server that records its handler's calls and the node id of every peer."""

    def __init__(self) -> None:
        self.calls = 0
        self.peers: list[str] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.calls += 1
        try:
            self.peers.append(tls.peer_node_id(writer.get_extra_info("ssl_object")))
            line = await reader.readline()
            writer.write(b"echo " + line)
            await writer.drain()
        finally:
            await _close(writer)


@asynccontextmanager
async def _serving(ctx: ssl.SSLContext) -> AsyncIterator[_Server]:
    srv = _Server()
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0, ssl=ctx,
                                        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
    srv.port = server.sockets[0].getsockname()[1]
    try:
        yield srv
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)  # let refused handshakes finish closing their transports


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()


async def _exchange(port: int, ctx: ssl.SSLContext) -> tuple[str, bytes, str | None]:
    """Connect, send one line; returns (server's node id, reply, TLS version)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx), HANDSHAKE_TIMEOUT_S)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        server_id = tls.peer_node_id(ssl_object)
        writer.write(b"hello\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), HANDSHAKE_TIMEOUT_S)
        return server_id, reply, ssl_object.version()
    finally:
        await _close(writer)


async def _refused(port: int, ctx: ssl.SSLContext) -> None:
    """The connection fails during the handshake or the first read; no reply ever comes."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx), HANDSHAKE_TIMEOUT_S)
    except (ssl.SSLError, ConnectionError):
        return
    try:
        writer.write(b"hello\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), HANDSHAKE_TIMEOUT_S)
    except (ssl.SSLError, ConnectionError):
        return
    finally:
        await _close(writer)
    assert reply == b"", f"got an application reply: {reply!r}"


@pytest.mark.asyncio
async def test_mutual_tls_between_members_identifies_both(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, _ = cluster
    async with _serving(tls.server_ssl_context(a)) as srv:
        server_id, reply, version = await _exchange(srv.port, tls.client_ssl_context(b))
    assert reply == b"echo hello\n"
    assert server_id == a.node_id
    assert srv.peers == [b.node_id]
    assert version == "TLSv1.3"


@pytest.mark.asyncio
async def test_tls_1_2_also_works_between_members(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, _ = cluster
    client = tls.client_ssl_context(b)
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    async with _serving(tls.server_ssl_context(a)) as srv:
        server_id, reply, version = await _exchange(srv.port, client)
    assert (server_id, reply, version) == (a.node_id, b"echo hello\n", "TLSv1.2")
    assert srv.peers == [b.node_id]


def test_contexts_require_tls_1_2_or_later_and_a_peer_certificate(cluster: tuple[Identity, Identity, str]) -> None:
    a, b, _ = cluster
    assert tls.server_ssl_context(a).minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.client_ssl_context(b).minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.server_ssl_context(a).verify_mode == tls.client_ssl_context(b).verify_mode == ssl.CERT_REQUIRED
    assert tls.client_ssl_context(b).check_hostname is False


@pytest.mark.asyncio
async def test_another_cluster_cannot_connect_either_way(cluster: tuple[Identity, Identity, str],
                                                          foreign: Identity) -> None:
    a, _, _ = cluster
    async with _serving(tls.server_ssl_context(a)) as srv:
        await _refused(srv.port, tls.client_ssl_context(foreign))
        # Even a foreign client that skips checking the server is refused by the server.
        careless = tls.client_ssl_context(foreign)
        careless.verify_mode = ssl.CERT_NONE
        await _refused(srv.port, careless)
    assert srv.calls == 0
    async with _serving(tls.server_ssl_context(foreign)) as srv:
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.wait_for(asyncio.open_connection("127.0.0.1", srv.port, ssl=tls.client_ssl_context(a)),
                                   HANDSHAKE_TIMEOUT_S)
    assert srv.calls == 0


@pytest.mark.asyncio
async def test_client_without_certificate_is_refused_before_the_handler(
        cluster: tuple[Identity, Identity, str]) -> None:
    a, _, _ = cluster
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False
    anonymous.verify_mode = ssl.CERT_NONE
    async with _serving(tls.server_ssl_context(a)) as srv:
        await _refused(srv.port, anonymous)
    assert srv.calls == 0


@pytest.mark.asyncio
async def test_plain_http_to_the_tls_port_gets_no_application_reply(
        cluster: tuple[Identity, Identity, str]) -> None:
    a, _, _ = cluster
    async with _serving(tls.server_ssl_context(a)) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            writer.write(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await writer.drain()
            try:
                reply = await asyncio.wait_for(reader.read(), HANDSHAKE_TIMEOUT_S)
            except ConnectionError:
                reply = b""
        finally:
            await _close(writer)
    assert b"HTTP" not in reply and b"echo" not in reply
    assert reply == b"" or reply[0] == 0x15  # nothing, or a TLS alert record
    assert srv.calls == 0


def test_peer_node_id_without_certificate_is_an_error() -> None:
    with pytest.raises(TlsError, match="no certificate"):
        tls.peer_node_id(b"")
    with pytest.raises(TlsError, match="does not parse"):
        tls.peer_node_id(b"\x30\x03\x02\x01\x00")


# ------------------------------------------------------------------------------ CLI


def _cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_init_token_join_show_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, e = tmp_path / "d", tmp_path / "e"
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "init", "--name", "lab", "--address", "127.0.0.1:1")
    assert code == 0
    token = next(line for line in out.splitlines() if line.startswith("gpl2."))
    assert "gpulayer cluster join -" in out and "signer" in out

    # The token on the command line is refused (ps shows it); a file works (here: no signer answers).
    code, _, err = _cli(capsys, "--state-dir", e, "cluster", "join", token)
    assert code == 2 and "visible to every local user" in err
    (tmp_path / "tok").write_text(token + "\n")
    code, _, err = _cli(capsys, "--state-dir", e, "cluster", "join", "--token-file", tmp_path / "tok")
    assert code == 1 and "no signer address of the token answered" in err and "127.0.0.1:1" in err
    assert not identity.load_or_create_identity(e).in_cluster

    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "show", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["signer"] is True and shown["cluster_name"] == "lab"
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "show")
    assert "signer:     yes" in out

    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "token", "--uses", "3", "--ttl", "30m", "--address",
                        "127.0.0.1:1", "--json")
    assert code == 0 and json.loads(out)["token"].startswith("gpl2.")
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "token", "--list", "--json")
    rows = json.loads(out)
    assert [r["uses_left"] for r in rows] == [1, 3]
    assert 1700 < rows[1]["expires"] - rows[1]["created"] < 1900
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "token", "--revoke", rows[0]["id"])
    assert code == 0 and "revoked" in out
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "token", "--list", "--json")
    assert [r["id"] for r in json.loads(out)] == [rows[1]["id"]]
    assert _cli(capsys, "--state-dir", d, "cluster", "token", "--uses", "0")[0] == 2
    assert _cli(capsys, "--state-dir", d, "cluster", "token", "--ttl", "40d")[0] == 2

    victim = identity.load_or_create_identity(e).node_id
    assert _cli(capsys, "--state-dir", d, "cluster", "remove", "abc")[0] == 2
    code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "remove", victim)
    assert code == 0 and victim in out
    from gpulayerd.net.revocation import load_entries

    assert [r.node_id for r in load_entries(d / "identity")] == [victim]


def test_cli_uses_the_state_dir_from_the_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULAYER_STATE_DIR", str(tmp_path / "env"))
    code, _, _ = _cli(capsys, "cluster", "init")
    assert code == 0
    assert identity.load_or_create_identity(tmp_path / "env").in_cluster


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, e, f = tmp_path / "d", tmp_path / "e", tmp_path / "f"
    assert _cli(capsys, "--state-dir", d, "cluster", "init")[0] == 0
    (tmp_path / "garbage").write_text("gpl2.garbage")
    code, _, err = _cli(capsys, "--state-dir", e, "cluster", "join", "--token-file", tmp_path / "garbage")
    assert code == 2 and "truncated or garbled" in err
    code, _, err = _cli(capsys, "--state-dir", d, "cluster", "init")
    assert code == 1 and "already in cluster" in err and "--force" in err
    assert _cli(capsys, "--state-dir", f, "cluster", "init")[0] == 0
    code, out, _ = _cli(capsys, "--state-dir", f, "cluster", "token", "--json")
    (tmp_path / "f-token").write_text(json.loads(out)["token"])
    code, _, err = _cli(capsys, "--state-dir", d, "cluster", "join", "--token-file", tmp_path / "f-token")
    assert code == 1 and "already in cluster" in err
    code, _, err = _cli(capsys, "--state-dir", e, "cluster", "token")
    assert code == 1 and "cluster init" in err
    code, _, err = _cli(capsys, "--state-dir", e, "cluster", "remove", "a" * 52)
    assert code == 1 and "not a signer" in err
    code, out, _ = _cli(capsys, "--state-dir", e, "cluster", "show", "--json")
    assert code == 0 and json.loads(out)["in_cluster"] is False
    assert _cli(capsys, "--state-dir", e, "cluster", "init", "--name", "")[0] == 2


def test_cli_says_a_running_daemon_must_restart(request: pytest.FixtureRequest,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # A short directory: unix socket paths are limited to about 100 bytes.
    d = Path(tempfile.mkdtemp(prefix="gltls-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    sock_path = d / "run" / "gpulayerd.sock"
    sock_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(sock_path))
        listener.listen(1)
        code, out, _ = _cli(capsys, "--state-dir", d, "cluster", "init")
    assert code == 0
    assert "gpulayerd is running on this state dir: restart it" in out
