"""The joining node's side of enrollment: fetch and check the CA, send the CSR, renew.

Blocking (``http.client`` over ``ssl``): the CLI calls it directly, the daemon in a thread.
See :mod:`gpulayerd.net.enroll` for the protocol and the signer's side.
"""

from __future__ import annotations

import hmac
import http.client
import json
import ssl
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpulayerd.net.enroll import EnrollRefused, JoinToken, ca_sha256, split_address
from gpulayerd.net.identity import CA_CERT, Identity, TlsError, node_id_from_cert_der, spki

__all__ = ["fetch_ca", "make_csr", "online_join", "renew_if_due", "renew_online"]

_TIMEOUT_S = 10.0
_MAX_REPLY = 64 * 1024
_TRIES = 3
"""Connections to one signer address tried at most (0.5 s, then 1 s apart) when the request was never
sent (a busy or flooded enrollment listener closing a connection before or during its handshake)."""


class _Unsent(OSError):
    """The connection or its TLS handshake failed: the request was never sent (asking again is safe)."""


def make_csr(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A CSR (PEM) for ``key``: proves possession of the key; the subject is the signer's to set."""
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


def fetch_ca(host: str, port: int, timeout_s: float = _TIMEOUT_S) -> bytes:
    """The CA certificate (PEM) a signer's enrollment listener serves, over TLS that verifies
    nothing: check it against the token before trusting it.

    Raises:
        EnrollRefused: unreachable, or no certificate in the answer.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    status, raw, _ = _http(host, port, ctx, "GET", "/v1/enroll/ca", None, timeout_s, None)
    if status != 200:
        raise EnrollRefused(f"{host}:{port}: HTTP {status} fetching the CA certificate")
    return raw


def online_join(token: JoinToken, key: ec.EllipticCurvePrivateKey, mode: str, user: str,
                timeout_s: float = _TIMEOUT_S) -> tuple[bytes, bytes, str]:
    """Enroll at the token's signer: returns (CA certificate PEM, node certificate PEM, the address used).

    Tries each address of the token in turn. The secret is sent only on a connection
    whose server certificate is signed by a CA whose SHA-256 is the token's and whose
    node id is the token's signer.

    Raises:
        EnrollRefused: the CA does not match the token (nothing secret was sent), the signer
            refused (its message), or no address answered.
    """
    errors: list[str] = []
    for addr in token.addresses:
        host, port = split_address(addr)
        for n in range(1, _TRIES + 1):  # the CA is public and sending for it consumes nothing: asked again
            try:
                ca_pem = fetch_ca(host, port, timeout_s)
                break
            except (EnrollRefused, _Unsent, OSError, http.client.HTTPException) as e:
                if n == _TRIES:
                    errors.append(f"{addr}: {e}")
                else:
                    time.sleep(0.5 * n)
        else:
            continue
        if not hmac.compare_digest(_sha_or_empty(ca_pem), token.ca_sha256):
            raise EnrollRefused(f"{addr} serves a CA certificate whose SHA-256 is not the token's: refused before "
                                "sending the secret (a wrong address, or someone in between)")
        ctx = _trusting(ca_pem)
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
        body = {"token_id": token.token_id, "secret": token.secret, "csr_pem": make_csr(key).decode("ascii"),
                "mode": mode, "user": user}
        status, raw, failed = 0, b"", ""
        for n in range(1, _TRIES + 1):
            try:
                status, raw, _ = _http(host, port, ctx, "POST", "/v1/enroll/join", body, timeout_s, token.signer)
                failed = ""
                break
            except _Unsent as e:  # never sent: the token was not consumed, asked again
                failed = f"{addr}: {e}"
                if n < _TRIES:
                    time.sleep(0.5 * n)
            except (OSError, http.client.HTTPException) as e:  # maybe consumed: never sent twice
                failed = f"{addr}: {e}"
                break
        if failed:
            errors.append(failed)
            continue
        reply = _json_reply(raw, f"{addr}")
        if status != 200:
            raise EnrollRefused(f"the signer at {addr} refused: {reply.get('message', raw[:200])}")
        cert_pem = str(reply.get("cert_pem", "")).encode("ascii")
        _check_issued(cert_pem, ca_pem, key)
        return ca_pem, cert_pem, addr
    raise EnrollRefused("no signer address of the token answered: " + "; ".join(errors))


def renew_online(idir: Path, key: ec.EllipticCurvePrivateKey, addresses: list[str],
                 timeout_s: float = _TIMEOUT_S) -> bytes:
    """Ask a signer for a new certificate for this node (its current one authenticates it).

    Blocking (the daemon runs it in a thread). Returns the new certificate (PEM), not yet written.

    Raises:
        EnrollRefused: no signer renewed it (the messages say why).
    """
    ca_pem = (idir / CA_CERT).read_bytes()
    errors = []
    for addr in addresses:
        host, port = split_address(addr)
        ctx = _trusting(ca_pem)
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
        ctx.load_cert_chain(idir / "node.crt", idir / "node.key")
        try:
            status, raw, _ = _http(host, port, ctx, "POST", "/v1/enroll/renew",
                                   {"csr_pem": make_csr(key).decode("ascii")}, timeout_s, None)
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            errors.append(f"{addr}: {e}")
            continue
        reply = _json_reply(raw, addr)
        if status != 200:
            errors.append(f"{addr}: {reply.get('message', raw[:200])}")
            continue
        cert_pem = str(reply.get("cert_pem", "")).encode("ascii")
        _check_issued(cert_pem, ca_pem, key)
        return cert_pem
    raise EnrollRefused("no signer renewed this node's certificate: " + "; ".join(errors or ["no signer known"]))


# ---------------------------------------------------------------- private


def _sha_or_empty(pem: bytes) -> str:
    try:
        return ca_sha256(pem)
    except TlsError:
        return ""


def _trusting(ca_pem: bytes) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _http(host: str, port: int, ctx: ssl.SSLContext, method: str, path: str, body: dict[str, str] | None,
          timeout_s: float, expect_node: str | None) -> tuple[int, bytes, str]:
    """One HTTPS request; with ``expect_node``, the server's certificate must be that node's
    (checked after the handshake, before the request is sent)."""
    conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=ctx)
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as e:  # (ssl.SSLError is an OSError: named for the reader)
            raise _Unsent(str(e) or type(e).__name__) from e
        der = conn.sock.getpeercert(binary_form=True) if isinstance(conn.sock, ssl.SSLSocket) else None
        node = node_id_from_cert_der(der) if der else ""
        if expect_node is not None and node != expect_node:
            raise EnrollRefused(f"{host}:{port} is node {node[:12] or '?'}, not the token's signer "
                                f"{expect_node[:12]}: refused before sending the secret")
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read(_MAX_REPLY), node
    finally:
        conn.close()


def _json_reply(raw: bytes, where: str) -> dict[str, object]:
    try:
        reply = json.loads(raw)
    except ValueError as e:
        raise EnrollRefused(f"{where}: not a JSON reply: {raw[:100]!r}") from e
    if not isinstance(reply, dict):
        raise EnrollRefused(f"{where}: not a JSON object")
    return reply


def _check_issued(cert_pem: bytes, ca_pem: bytes, key: ec.EllipticCurvePrivateKey) -> None:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except Exception as e:
        raise EnrollRefused(f"the signer's certificate does not verify against the cluster CA: {e}") from e
    if spki(cert.public_key()) != spki(key.public_key()):
        raise EnrollRefused("the signer's certificate is not for this node's key")


def renew_if_due(identity: Identity) -> bool:
    """Renew ``node.crt`` if it ends within RENEW_BEFORE (by its own CA key on a signer, else online
    from a signer); returns whether it was renewed. Blocking (files, network).

    Raises:
        TlsError, OSError: as the renewal fails (the certificate is kept).
    """
    from gpulayerd.net.enroll import is_signer, read_signers
    from gpulayerd.net.identity import (
        NODE_CERT,
        RENEW_BEFORE,
        load_or_create_identity,
        load_or_create_key,
        utc_now,
        write_file,
    )

    idir = identity.key_path.parent
    before = (idir / NODE_CERT).read_bytes()
    if x509.load_pem_x509_certificate(before).not_valid_after_utc - utc_now() >= RENEW_BEFORE:
        return False
    if is_signer(idir):
        load_or_create_identity(identity.state_dir)  # re-signs it with ca.key
    else:
        write_file(idir / NODE_CERT, renew_online(idir, load_or_create_key(idir), read_signers(idir)))
    return (idir / NODE_CERT).read_bytes() != before
