"""Enrollment without the CA key: join tokens, the signer's side, and the joining node's side.

A join token (``gpl2.`` + base64url(JSON)) holds the cluster id and name, the SHA-256 of
the CA certificate, the node id and HOST:PORT addresses of a **signer** (a node that holds
``ca.key``), a token id, a one-time secret and an expiry; never the CA key. The signer
keeps only the SHA-256 of each secret, in ``identity/tokens.json`` (0600), changed only
under the identity directory's lock (``identity/.lock``, ``flock``), so consuming a token is
atomic between the daemon and ``gpulayer cluster token`` run at the same time: the CLI works
on that file directly, whether or not the daemon runs (the daemon reads it on each
enrollment).

Joining (:func:`gpulayerd.net.joining.online_join`): fetch the CA certificate from the signer's enrollment
listener over a TLS connection that verifies nothing (``GET /v1/enroll/ca``), check its
SHA-256 against the token **before anything secret is sent**, connect again with that
certificate as the only trust anchor (and the signer's node id from the token), then send a
CSR with the token id and secret (``POST /v1/enroll/join``). The signer checks and consumes
the secret (:func:`enroll_signed`) and answers a node certificate valid for
:data:`~gpulayerd.net.identity.NODE_VALIDITY`; members renew it before it ends
(``POST /v1/enroll/renew`` with their current certificate, :func:`renew_signed`).

The enrollment listener is served by signers on the peer port + :data:`ENROLL_PORT_OFFSET`
(another free port if that one is taken); the daemon writes its bound addresses to
``identity/enroll.json`` so that ``gpulayer cluster token`` puts them in new tokens.


(Same name as :mod:`gpulayerd.api.enroll`, the same idea one layer down: this module is enrollment
itself, that one serves it over HTTP.)
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpulayerd.host import filelocks
from gpulayerd.net.identity import (
    CA_CERT,
    CA_KEY,
    CLUSTER_JSON,
    TlsError,
    cert_mode_user,
    make_node_cert,
    node_id_from_public_key,
    spki,
    write_file,
)

__all__ = [
    "DEFAULT_TTL_S",
    "ENROLL_JSON",
    "ENROLL_PORT_OFFSET",
    "MAX_USES",
    "TOKENS_JSON",
    "TOKEN_PREFIX",
    "EnrollRefused",
    "JoinToken",
    "TokenError",
    "TokenInfo",
    "ca_sha256",
    "decode_token",
    "default_addresses",
    "enroll_signed",
    "is_signer",
    "list_tokens",
    "locked",
    "make_token",
    "read_signers",
    "renew_signed",
    "revoke_token",
    "split_address",
]

TOKEN_PREFIX = "gpl2."
TOKEN_VERSION = 2
TOKENS_JSON = "tokens.json"
ENROLL_JSON = "enroll.json"
ENROLL_PORT_OFFSET = 1
DEFAULT_PEER_PORT = 7171
DEFAULT_TTL_S = 3600.0
MAX_USES = 1000
MAX_TTL_S = 30 * 86400.0


class TokenError(TlsError):
    """A join token is garbled, truncated, of an unknown version, or expired (bad user input)."""


class EnrollRefused(TlsError):
    """A signer refused an enrollment or renewal (unknown, used, expired or revoked token, bad CSR...)."""


@dataclass(frozen=True, slots=True)
class JoinToken:
    """What a join token holds (no CA key). ``expires`` is a unix time; ``secret`` 32 random bytes, base64url.

    ``mode`` and ``user`` are what the signer's admin chose for the nodes it enrolls: a
    ``system`` node (vouches for every user: a token only for machines an admin runs) or a
    ``personal`` node bound to ``user``. The signer enforces its own record of them (the
    copy in the token only lets the joining side say what it is for); nobody joining picks.
    """

    cluster_id: str
    name: str
    ca_sha256: str
    signer: str
    addresses: tuple[str, ...]
    token_id: str
    secret: str
    expires: float
    mode: str = "personal"
    user: str = ""

    def encode(self) -> str:
        """The token text: ``gpl2.`` + base64url(JSON), no padding."""
        body = {"v": TOKEN_VERSION, "cluster_id": self.cluster_id, "name": self.name, "ca_sha256": self.ca_sha256,
                "signer": self.signer, "addresses": list(self.addresses), "id": self.token_id,
                "secret": self.secret, "exp": int(self.expires), "mode": self.mode, "user": self.user}
        raw = json.dumps(body, separators=(",", ":")).encode()
        return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as a signer lists it (``gpulayer cluster token --list``); never the secret."""

    token_id: str
    created: float
    expires: float
    uses_left: int
    used: int
    mode: str = ""
    user: str = ""


def ca_sha256(ca_pem_or_der: bytes) -> str:
    """SHA-256 (hex) of a CA certificate's DER encoding (PEM is converted first).

    Raises:
        TlsError: not a certificate.
    """
    try:
        cert = (x509.load_pem_x509_certificate(ca_pem_or_der) if ca_pem_or_der.lstrip().startswith(b"-----")
                else x509.load_der_x509_certificate(ca_pem_or_der))
    except ValueError as e:
        raise TlsError(f"not a certificate: {e}") from e
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


@contextlib.contextmanager
def locked(idir: Path) -> Iterator[None]:
    """Hold ``idir/.lock`` (flock): serialises token and cluster changes between processes.

    Not re-entrant: do not nest it in one process.

    Raises:
        TlsError: the lock file cannot be opened.
    """
    try:
        fd = os.open(idir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TlsError(f"{idir / '.lock'}: cannot open: {e.strerror or e}") from e
    try:
        filelocks.lock(fd)
        yield
    finally:
        os.close(fd)


def is_signer(idir: Path) -> bool:
    """Whether this node holds the cluster CA key (``ca.key``)."""
    return (idir / CA_KEY).exists()


def split_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) -> (host, port).

    Raises:
        TokenError: no port, or a port outside 1-65535.
    """
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TokenError(f"address {text!r}: use HOST:PORT with a port of 1 to 65535")
    return host.strip("[]"), int(port)


def read_signers(idir: Path) -> list[str]:
    """The signer addresses (HOST:PORT) recorded in cluster.json at join; [] when none."""
    try:
        data = json.loads((idir / CLUSTER_JSON).read_bytes())
    except (OSError, ValueError):
        return []
    signers = data.get("signers") if isinstance(data, dict) else None
    return [s for s in signers if isinstance(s, str)] if isinstance(signers, list) else []


def default_addresses(idir: Path) -> list[str]:
    """Where a new token says the signer is: the addresses the running daemon wrote to
    ``enroll.json``; else each LAN address with the default peer port + 1."""
    try:
        data = json.loads((idir / ENROLL_JSON).read_bytes())
        addrs = [a for a in data.get("addresses", []) if isinstance(a, str)]
        if addrs:
            return addrs
    except (OSError, ValueError, AttributeError):
        pass
    from gpulayerd.net.interfaces import lan_addresses

    port = DEFAULT_PEER_PORT + ENROLL_PORT_OFFSET
    return [f"{ip}:{port}" for _, ip in lan_addresses(None)] or [f"127.0.0.1:{port}"]


# ---------------------------------------------------------------- tokens (signer side)


def make_token(idir: Path, cluster_id: str, name: str, *, uses: int = 1, ttl_s: float = DEFAULT_TTL_S,
               addresses: list[str] | None = None, lock: bool = True, mode: str, user: str = "") -> JoinToken:
    """Make a join token on a signer and store its secret's SHA-256 in ``tokens.json``.

    Args:
        idir: the signer's identity dir (holds ca.key and ca.crt).
        uses: how many nodes may join with it (1 to :data:`MAX_USES`).
        ttl_s: seconds until it expires (1 to 30 days).
        addresses: HOST:PORT of this signer's enrollment listener (default: :func:`default_addresses`).
        lock: take the identity lock (False when the caller holds it).
        mode, user: what the nodes it enrolls are: ``system`` (``user`` ""), or ``personal``
            bound to ``user`` (required). The signer refuses a join asking for anything else.

    Raises:
        TlsError: not a signer; bad ``uses``, ``ttl_s``, addresses, mode or user; the file cannot be written.
    """
    if mode not in ("personal", "system"):
        raise TlsError(f"mode {mode!r}: use 'personal' or 'system'")
    if (mode == "personal") != bool(user) or not user.isprintable() or len(user) > 64:
        raise TlsError("a personal-mode token names the one user its node is bound to (--user NAME); "
                       "a system-mode token names none")
    if not 1 <= uses <= MAX_USES:
        raise TlsError(f"uses {uses}: use 1 to {MAX_USES}")
    if not 1 <= ttl_s <= MAX_TTL_S:
        raise TlsError(f"ttl {ttl_s:g} s: use 1 s to 30 days")
    if not is_signer(idir):
        raise TlsError(f"this node is not a signer (no {idir / CA_KEY}): make tokens on a signer "
                       "(the node that ran 'gpulayer cluster init', or one made with 'gpulayer cluster signer add')")
    addrs = list(addresses) if addresses else default_addresses(idir)
    for a in addrs:
        split_address(a)
    ca_pem = (idir / CA_CERT).read_bytes()
    signer = node_id_from_public_key(_load_node_cert(idir).public_key())
    token_id = secrets.token_hex(4)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    now = time.time()
    tok = JoinToken(cluster_id, name, ca_sha256(ca_pem), signer, tuple(addrs), token_id, secret, now + ttl_s,
                    mode, user)
    entry = {"hash": _hash(secret), "created": now, "expires": tok.expires, "uses_left": uses, "used": 0,
             "mode": mode, "user": user}
    with locked(idir) if lock else contextlib.nullcontext():
        table = _read_tokens(idir)
        table = {k: v for k, v in table.items() if v.get("expires", 0) > now - 7 * 86400}  # forget old ones
        table[token_id] = entry
        _write_tokens(idir, table)
    return tok


def list_tokens(idir: Path) -> list[TokenInfo]:
    """The tokens this signer made (expired and used ones too, for a week), oldest first."""
    out = [TokenInfo(k, float(v.get("created", 0)), float(v.get("expires", 0)), int(v.get("uses_left", 0)),
                     int(v.get("used", 0)), str(v.get("mode", "")), str(v.get("user", "")))
           for k, v in _read_tokens(idir).items()]
    return sorted(out, key=lambda t: t.created)


def revoke_token(idir: Path, token_id: str) -> bool:
    """Forget a token: nobody can join with it any more. Returns whether it existed.

    Raises:
        TlsError: ``tokens.json`` cannot be written.
    """
    with locked(idir):
        table = _read_tokens(idir)
        if table.pop(token_id, None) is None:
            return False
        _write_tokens(idir, table)
    return True


def enroll_signed(idir: Path, token_id: str, secret: str, csr_pem: bytes, mode: str, user: str,
                  is_revoked: Callable[[str], bool] = lambda node_id: False) -> bytes:
    """The signer's side of a join: check the CSR, consume the token atomically, sign.

    A CSR whose key is a removed node's (``is_revoked`` of its node id) is refused before the
    token is touched: its certificate would be refused everywhere, and the use would be lost.

    Returns:
        The new node certificate (PEM).

    Raises:
        EnrollRefused: unknown, revoked, expired or used token, wrong secret, bad CSR or
            mode/user (the message says which; nothing is consumed then).
    """
    pub = _csr_key(csr_pem)
    node_id = node_id_from_public_key(pub)
    if is_revoked(node_id):
        raise EnrollRefused(f"node {node_id} was removed from this cluster: a removed machine joins again only "
                            "with a new key (move its identity directory aside first)")
    ca, ca_key = _load_ca(idir)
    try:
        cert = make_node_cert(pub, ca, ca_key, node_id, mode, user)
    except TlsError as e:
        raise EnrollRefused(str(e)) from e
    now = time.time()
    with locked(idir):
        table = _read_tokens(idir)
        entry = table.get(token_id)
        if entry is None:
            raise EnrollRefused(f"join token {token_id!r} is unknown to this signer (revoked, forgotten, or made "
                                "by another signer): make a new one with 'gpulayer cluster token' on a signer")
        if not hmac.compare_digest(str(entry.get("hash", "")), _hash(secret)):
            raise EnrollRefused(f"join token {token_id!r}: wrong secret (copy the whole token again)")
        if float(entry.get("expires", 0)) <= now:
            raise EnrollRefused(f"join token {token_id!r} expired at {time.ctime(float(entry['expires']))}: "
                                "make a new one with 'gpulayer cluster token' on a signer")
        if (entry.get("mode"), entry.get("user") or "") != (mode, user if mode == "personal" else ""):
            made = ("system-mode nodes" if entry.get("mode") == "system"
                    else f"personal-mode nodes of {entry.get('user')!r}" if entry.get("mode") == "personal"
                    else "nothing (it predates per-token modes)")
            asked = "a system-mode node" if mode == "system" else f"a personal-mode node of {user!r}"
            raise EnrollRefused(f"join token {token_id!r} enrolls {made}, not {asked}: ask the signer's admin for a "
                                "token made for it ('gpulayer cluster token --system' or '--user NAME')")
        if int(entry.get("uses_left", 0)) <= 0:
            raise EnrollRefused(f"join token {token_id!r} was already used (tokens are one-time): make a new one "
                                "with 'gpulayer cluster token' on a signer")
        entry["uses_left"] = int(entry["uses_left"]) - 1
        entry["used"] = int(entry.get("used", 0)) + 1
        _write_tokens(idir, table)
    return cert.public_bytes(serialization.Encoding.PEM)


def renew_signed(idir: Path, client_cert_der: bytes, csr_pem: bytes) -> bytes:
    """The signer's side of a renewal: a new certificate for the same key, mode and user.

    ``client_cert_der`` is the certificate the (TLS-verified, not revoked) client presented.

    Raises:
        EnrollRefused: the CSR's key is not the certificate's, or the certificate records no user.
    """
    pub = _csr_key(csr_pem)
    cert = x509.load_der_x509_certificate(client_cert_der)
    if spki(cert.public_key()) != spki(pub):
        raise EnrollRefused("the CSR's key is not the key of the certificate that asks for renewal")
    mode, user = cert_mode_user(cert)
    ca, ca_key = _load_ca(idir)
    try:
        new = make_node_cert(pub, ca, ca_key, node_id_from_public_key(pub), mode, user)
    except TlsError as e:
        raise EnrollRefused(f"cannot renew: {e}; re-join the cluster") from e
    return new.public_bytes(serialization.Encoding.PEM)


# ---------------------------------------------------------------- the joining node


def decode_token(text: str) -> JoinToken:
    """Parse a join token (whitespace is ignored).

    Raises:
        TokenError: garbled, truncated, an old version (``gpl1.``, which carried the CA key),
            or already expired.
    """
    text = "".join(text.split())
    cut = "the join token is truncated or garbled; copy the whole token again"
    if text.startswith("gpl1."):
        raise TokenError("this is an old join token (version 1, which carried the cluster CA key): it is no longer "
                         "accepted. Make a new one with 'gpulayer cluster token' on a signer")
    if not text.startswith(TOKEN_PREFIX):
        raise TokenError(f"not a gpulayer join token (it should start with {TOKEN_PREFIX!r}); copy it again "
                         "from 'gpulayer cluster token' on a signer")
    payload = text[len(TOKEN_PREFIX):]
    try:
        body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError) as e:
        raise TokenError(f"{cut} ({e})") from e
    if not isinstance(body, dict) or body.get("v") != TOKEN_VERSION:
        raise TokenError(cut)
    strs = [body.get(k) for k in ("cluster_id", "name", "ca_sha256", "signer", "id", "secret")]
    addrs = body.get("addresses")
    exp = body.get("exp")
    if (not all(isinstance(f, str) and f and f.isprintable() for f in strs) or not isinstance(addrs, list)
            or not addrs or not all(isinstance(a, str) for a in addrs) or not isinstance(exp, int)):
        raise TokenError(f"{cut} (missing fields)")
    for a in addrs:
        split_address(a)
    cluster_id, name, digest, signer, token_id, secret = (str(f) for f in strs)
    mode, user = body.get("mode", "personal"), body.get("user", "")
    if mode not in ("personal", "system") or not isinstance(user, str) or not user.isprintable():
        raise TokenError(f"{cut} (mode)")
    if exp <= time.time():
        raise TokenError(f"join token {token_id!r} expired at {time.ctime(exp)}: make a new one with "
                         "'gpulayer cluster token' on a signer")
    return JoinToken(cluster_id, name, digest, signer, tuple(addrs), token_id, secret, float(exp), mode, user)


# ---------------------------------------------------------------- private


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _csr_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey:
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as e:
        raise EnrollRefused(f"csr_pem: not a PEM certificate signing request: {e}") from e
    pub = csr.public_key()
    if not csr.is_signature_valid or not isinstance(pub, ec.EllipticCurvePublicKey):
        raise EnrollRefused("csr_pem: the CSR's signature is invalid or its key is not an EC key")
    return pub


def _load_ca(idir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        ca = x509.load_pem_x509_certificate((idir / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((idir / CA_KEY).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise EnrollRefused(f"this node cannot sign (no usable {idir / CA_KEY}): {e}") from e
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise EnrollRefused(f"{idir / CA_KEY}: not an EC key")
    return ca, ca_key


def _load_node_cert(idir: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate((idir / "node.crt").read_bytes())
    except (OSError, ValueError) as e:
        raise TlsError(f"{idir / 'node.crt'}: cannot read: {e}") from e


def _read_tokens(idir: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((idir / TOKENS_JSON).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise TlsError(f"{idir / TOKENS_JSON}: cannot read: {e}") from e
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def _write_tokens(idir: Path, table: dict[str, dict[str, Any]]) -> None:
    write_file(idir / TOKENS_JSON, (json.dumps(table, indent=1) + "\n").encode())
