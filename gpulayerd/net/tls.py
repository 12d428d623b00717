"""Cluster trust: this daemon's key, the cluster CA, join tokens and mutual-TLS contexts.

The only module that imports ``cryptography``. Files live in ``<state dir>/identity/``
(directory mode 0700; every file 0600, written atomically and never readable by others,
not even while being written):

- ``node.key``: this daemon's private key (EC P-256, PEM). Created on first use; the node
  id is derived from its public key, so it never changes while the key stays.
- ``node.crt``: this daemon's certificate, signed by the cluster CA (in a cluster only).
- ``ca.crt`` and ``ca.key``: the cluster CA (in a cluster only).
- ``cluster.json``: ``{cluster_id, name, created_at}``; written last, so a node is in a
  cluster exactly when this file exists (an interrupted init or join leaves it out).

``gpulayer cluster init`` makes the CA on one machine and prints a join token;
``gpulayer cluster join TOKEN`` on every other machine installs the CA and signs that
machine's own certificate. The token carries the CA's private key: it is a secret, and
whoever has it can add machines to the cluster. Every member keeps ``ca.key`` so that it
can renew its own certificate and print the token again.

Peers are identified by node id, not by host name: contexts accept any certificate signed
by the cluster CA, and the caller checks :func:`peer_node_id` after the handshake.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import ssl
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "Identity",
    "TlsError",
    "TokenError",
    "client_ssl_context",
    "cluster_init",
    "cluster_join",
    "join_token",
    "load_or_create_identity",
    "node_id_from_public_key",
    "peer_node_id",
]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "gpl1."
TOKEN_VERSION = 1
CA_VALIDITY = dt.timedelta(days=3652)
NODE_VALIDITY = dt.timedelta(days=730)
# Certificates start this far in the past so that a peer whose clock is a little behind accepts them.
CLOCK_SKEW = dt.timedelta(hours=1)
# load_or_create_identity signs a new node certificate when the old one has less than this left.
RENEW_BEFORE = dt.timedelta(days=30)
_MAX_TOKEN_JSON_BYTES = 64 * 1024
_MAX_NAME_CHARS = 64

IDENTITY_DIR = "identity"
NODE_KEY = "node.key"
NODE_CERT = "node.crt"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CLUSTER_JSON = "cluster.json"


class TlsError(Exception):
    """The identity or cluster files are missing, invalid or inconsistent; the message says which."""


class TokenError(TlsError):
    """A join token is garbled, truncated, of an unknown version or inconsistent (bad user input)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """This daemon's identity, as found in ``<state dir>/identity/``.

    Attributes:
        node_id: SHA-256 of the public key, base32, 52 lower-case characters.
        state_dir: the daemon's state dir.
        key_path: the private key (always present).
        cert_path: this node's certificate; None before joining a cluster.
        ca_path: the cluster CA certificate; None before joining a cluster.
        cluster_id: 16 base32 characters derived from the CA key; None outside a cluster.
        cluster_name: the name given at ``cluster init``; None outside a cluster.
    """

    node_id: str
    state_dir: Path
    key_path: Path
    cert_path: Path | None = None
    ca_path: Path | None = None
    cluster_id: str | None = None
    cluster_name: str | None = None

    @property
    def in_cluster(self) -> bool:
        """Whether this node has a CA-signed certificate (and so can talk to peers)."""
        return self.cert_path is not None and self.ca_path is not None and self.cluster_id is not None


def node_id_from_public_key(pub: PublicKeyTypes) -> str:
    """SHA-256 of the DER SubjectPublicKeyInfo, base32, lower case, no padding (52 characters)."""
    return _b32(hashlib.sha256(_spki(pub)).digest())


def load_or_create_identity(state_dir: Path) -> Identity:
    """This daemon's identity: creates the node key on first use, loads the cluster files if any.

    Also renews ``node.crt`` when it expires within :data:`RENEW_BEFORE` (the CA key is on
    every member).

    Raises:
        TlsError: a file is unreadable or malformed, ``node.crt`` does not belong to
            ``node.key``, or it is not signed by ``ca.crt``.
    """
    idir = _identity_dir(state_dir)
    key = _load_or_create_key(idir)
    node_id = node_id_from_public_key(key.public_key())
    info = _read_cluster_json(idir)
    if info is None:
        return Identity(node_id=node_id, state_dir=state_dir, key_path=idir / NODE_KEY)
    ca = _read_cert(idir / CA_CERT)
    cluster_id, name = info
    if _cluster_id(ca) != cluster_id:
        raise TlsError(f"{idir / CLUSTER_JSON}: cluster id {cluster_id} does not match {idir / CA_CERT} "
                       f"(cluster {_cluster_id(ca)}); run 'gpulayer cluster join TOKEN --force' to repair")
    cert = _read_cert(idir / NODE_CERT)
    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise TlsError(f"{idir / NODE_CERT} does not match this node's key {idir / NODE_KEY}; "
                       "run 'gpulayer cluster join TOKEN --force' to sign a new certificate")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as e:
        raise TlsError(f"{idir / NODE_CERT} is not signed by the cluster CA {idir / CA_CERT}; "
                       "run 'gpulayer cluster join TOKEN --force' to sign a new certificate") from e
    if cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        _renew_node_cert(idir, key, ca, node_id)
    return Identity(node_id=node_id, state_dir=state_dir, key_path=idir / NODE_KEY, cert_path=idir / NODE_CERT,
                    ca_path=idir / CA_CERT, cluster_id=cluster_id, cluster_name=name)


def cluster_init(state_dir: Path, name: str | None, *, force: bool = False) -> str:
    """Create a new cluster with this node as its first member; returns the join token.

    Args:
        state_dir: the daemon's state dir.
        name: a human name for the cluster (at most 64 printable characters); None uses
            the cluster id.
        force: replace the cluster this node is in (it then leaves that cluster).

    Returns:
        The join token (a secret, see :func:`join_token`).

    Raises:
        TlsError: already in a cluster and not ``force``, or a bad name.
    """
    if name is not None:
        _check_name(name)
    idir = _identity_dir(state_dir)
    with _locked(idir):
        key = _load_or_create_key(idir)
        if not force:
            current = _current_cluster(state_dir)
            if current is not None:
                raise TlsError(f"this node is already in cluster {_label(*current)}; "
                               "use --force to make a new cluster (this node then leaves the old one)")
        ca_key = ec.generate_private_key(ec.SECP256R1())
        cluster_id = _b32(hashlib.sha256(_spki(ca_key.public_key())).digest())[:16]
        ca = _make_ca_cert(ca_key, cluster_id, name or cluster_id)
        _install(idir, key, ca, ca_key, name or cluster_id)
    return join_token(state_dir)


def cluster_join(state_dir: Path, token: str, *, force: bool = False) -> Identity:
    """Join the cluster of ``token``: install its CA and sign this node's own certificate.

    Joining the cluster this node is already in changes nothing.

    Raises:
        TokenError: the token is garbled, truncated or of an unsupported version.
        TlsError: already in a different cluster and not ``force``.
    """
    cluster_id, name, ca, ca_key = _decode_token(token)
    idir = _identity_dir(state_dir)
    with _locked(idir):
        key = _load_or_create_key(idir)
        current = _current_cluster(state_dir)
        if current is not None and current[0] == cluster_id:
            with contextlib.suppress(TlsError):
                return load_or_create_identity(state_dir)
        elif current is not None and not force:
            raise TlsError(f"this node is already in cluster {_label(*current)}; joining cluster "
                           f"{_label(cluster_id, name)} would make it leave. Use --force to switch clusters")
        _install(idir, key, ca, ca_key, name)
    return load_or_create_identity(state_dir)


def join_token(state_dir: Path) -> str:
    """The join token of this node's cluster: ``gpl1.`` + base64url(zlib(JSON)).

    The token holds the cluster CA's private key. It is a secret: whoever has it can add
    machines to the cluster (and so run jobs on it and receive its jobs). Send it over a
    private channel.

    Raises:
        TlsError: not in a cluster, or the CA files are missing.
    """
    ident = load_or_create_identity(state_dir)
    if not ident.in_cluster or ident.ca_path is None:
        raise TlsError(f"no cluster in {state_dir}: run 'gpulayer cluster init' or 'gpulayer cluster join TOKEN'")
    ca_key_path = ident.ca_path.parent / CA_KEY
    try:
        ca_key_pem = ca_key_path.read_text(encoding="ascii")
    except OSError as e:
        raise TlsError(f"{ca_key_path}: cannot read the cluster CA key: {e.strerror or e}") from e
    body = {
        "v": TOKEN_VERSION,
        "cluster_id": ident.cluster_id,
        "name": ident.cluster_name,
        "ca_cert_pem": ident.ca_path.read_text(encoding="ascii"),
        "ca_key_pem": ca_key_pem,
    }
    packed = zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 9)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(packed).decode("ascii").rstrip("=")


def server_ssl_context(identity: Identity) -> ssl.SSLContext:
    """A TLS server context that requires a client certificate signed by the cluster CA.

    Raises:
        TlsError: the identity is not in a cluster, or the files do not load.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(ctx, identity)
    return ctx


def client_ssl_context(identity: Identity) -> ssl.SSLContext:
    """A TLS client context that presents this node's certificate and requires a cluster-signed server.

    Host names are not checked: compare :func:`peer_node_id` with the node id you meant to reach.

    Raises:
        TlsError: the identity is not in a cluster, or the files do not load.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    _configure(ctx, identity)
    return ctx


def peer_node_id(ssl_object_or_der: ssl.SSLObject | ssl.SSLSocket | bytes) -> str:
    """The node id of the peer of a verified TLS connection (or of a DER certificate).

    Raises:
        TlsError: the peer sent no certificate, or it does not parse.
    """
    if isinstance(ssl_object_or_der, bytes):
        der: bytes | None = ssl_object_or_der
    else:
        der = ssl_object_or_der.getpeercert(binary_form=True)
    if not der:
        raise TlsError("the peer sent no certificate")
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as e:
        raise TlsError(f"the peer's certificate does not parse: {e}") from e
    return node_id_from_public_key(cert.public_key())


# ------------------------------------------------------------------------- private


def _configure(ctx: ssl.SSLContext, identity: Identity) -> None:
    if not identity.in_cluster or identity.cert_path is None or identity.ca_path is None:
        raise TlsError(f"node {identity.node_id[:12]} is not in a cluster: run 'gpulayer cluster init' "
                       "or 'gpulayer cluster join TOKEN'")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")  # TLS 1.2 only; TLS 1.3 suites are always AEAD
    try:
        ctx.load_cert_chain(identity.cert_path, identity.key_path)
        ctx.load_verify_locations(cafile=identity.ca_path)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the TLS identity in {identity.cert_path.parent}: {e}") from e


def _install(idir: Path, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate,
             ca_key: ec.EllipticCurvePrivateKey, name: str) -> None:
    """Write the cluster files; cluster.json goes last, so an interrupted run leaves no cluster."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(idir / CLUSTER_JSON)
    _fsync_dir(idir)
    node_id = node_id_from_public_key(key.public_key())
    _write_atomic(idir / CA_KEY, _key_pem(ca_key))
    _write_atomic(idir / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    _write_atomic(idir / NODE_CERT, _make_node_cert(key, ca, ca_key, node_id).public_bytes(serialization.Encoding.PEM))
    info = {"cluster_id": _cluster_id(ca), "name": name, "created_at": time.time()}
    _write_atomic(idir / CLUSTER_JSON, (json.dumps(info, indent=2) + "\n").encode())


def _renew_node_cert(idir: Path, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, node_id: str) -> None:
    try:
        ca_key = _read_key(idir / CA_KEY)
    except TlsError as e:
        log.warning("node certificate %s expires soon and cannot be renewed: %s", idir / NODE_CERT, e)
        return
    cert = _make_node_cert(key, ca, ca_key, node_id)
    _write_atomic(idir / NODE_CERT, cert.public_bytes(serialization.Encoding.PEM))
    log.info("renewed node certificate %s (valid until %s)", idir / NODE_CERT, cert.not_valid_after_utc)


def _current_cluster(state_dir: Path) -> tuple[str, str] | None:
    """(cluster id, name) this node is in, even when its other cluster files are broken."""
    try:
        return _read_cluster_json(state_dir / IDENTITY_DIR)
    except TlsError:
        return ("unknown", "unreadable cluster.json")


def _label(cluster_id: str, name: str) -> str:
    return cluster_id if name == cluster_id else f"{name!r} ({cluster_id})"


def _decode_token(token: str) -> tuple[str, str, x509.Certificate, ec.EllipticCurvePrivateKey]:
    text = "".join(token.split())
    if not text.startswith(TOKEN_PREFIX):
        head = text.split(".", 1)[0]
        if "." in text and head.startswith("gpl") and head[3:].isdigit():
            raise TokenError(f"join token version {head[3:]} is not supported by this gpulayer "
                             f"(it reads version {TOKEN_VERSION}); upgrade gpulayer or make a new token")
        raise TokenError(f"not a gpulayer join token (it should start with {TOKEN_PREFIX!r}); "
                         "copy it again from 'gpulayer cluster show --token'")
    cut = "the join token is truncated or garbled; copy the whole token again from 'gpulayer cluster show --token'"
    payload = text[len(TOKEN_PREFIX):]
    try:
        packed = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except (binascii.Error, ValueError) as e:
        raise TokenError(f"{cut} (bad base64: {e})") from e
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(packed, _MAX_TOKEN_JSON_BYTES)
    except zlib.error as e:
        raise TokenError(f"{cut} ({e})") from e
    if not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise TokenError(cut)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise TokenError(f"{cut} (bad JSON: {e})") from e
    if not isinstance(body, dict):
        raise TokenError(cut)
    if body.get("v") != TOKEN_VERSION:
        raise TokenError(f"join token version {body.get('v')!r} is not supported by this gpulayer "
                         f"(it reads version {TOKEN_VERSION})")
    fields = [body.get(k) for k in ("cluster_id", "name", "ca_cert_pem", "ca_key_pem")]
    if not all(isinstance(f, str) and f for f in fields):
        raise TokenError(f"{cut} (missing fields)")
    cluster_id, name, cert_pem, key_pem = (str(f) for f in fields)
    try:
        ca = x509.load_pem_x509_certificate(cert_pem.encode())
        ca_key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as e:
        raise TokenError(f"{cut} (bad CA: {e})") from e
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or _spki(ca_key.public_key()) != _spki(ca.public_key()):
        raise TokenError(f"{cut} (the CA key does not match the CA certificate)")
    if _cluster_id(ca) != cluster_id:
        raise TokenError(f"{cut} (cluster id {cluster_id} does not match the CA)")
    try:
        bc = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise TokenError("the join token's certificate is not a CA certificate")
    if ca.not_valid_after_utc <= _now():
        raise TlsError(f"the cluster CA in this token expired on {ca.not_valid_after_utc:%Y-%m-%d}; "
                       "make a new cluster with 'gpulayer cluster init --force'")
    try:
        _check_name(name)
    except TlsError as e:
        raise TokenError(f"the join token's {e}") from e
    return cluster_id, name, ca, ca_key


def _check_name(name: str) -> None:
    if not name or len(name) > _MAX_NAME_CHARS or not name.isprintable():
        raise TlsError(f"cluster name {name!r}: use 1 to {_MAX_NAME_CHARS} printable characters")


def _make_ca_cert(ca_key: ec.EllipticCurvePrivateKey, cluster_id: str, name: str) -> x509.Certificate:
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, name),
        x509.NameAttribute(NameOID.COMMON_NAME, f"gpulayer cluster {cluster_id}"),
    ])
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _make_node_cert(key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                    node_id: str) -> x509.Certificate:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + NODE_VALIDITY, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node_id)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _identity_dir(state_dir: Path) -> Path:
    idir = state_dir / IDENTITY_DIR
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        idir.mkdir(exist_ok=True, mode=0o700)
        if idir.stat().st_mode & 0o077:
            os.chmod(idir, 0o700)
    except OSError as e:
        raise TlsError(f"{idir}: cannot create the identity directory: {e.strerror or e}") from e
    return idir


def _load_or_create_key(idir: Path) -> ec.EllipticCurvePrivateKey:
    path = idir / NODE_KEY
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        if _create_exclusive(path, _key_pem(key)):
            log.info("created node key %s", path)
            return key
        # Another process created it first: use theirs, so that both agree on the node id.
    return _read_key(path)


def _read_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                log.warning("%s was readable by others; making it 0600", path)
                os.chmod(path, 0o600)
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as e:
        raise TlsError(f"{path}: cannot read: {e.strerror or e}") from e
    except (ValueError, TypeError) as e:
        raise TlsError(f"{path}: not an unencrypted PEM private key: {e}") from e
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsError(f"{path}: expected an EC private key, found {type(key).__name__}")
    return key


def _read_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as e:
        raise TlsError(f"{path}: cannot read: {e.strerror or e}; "
                       "run 'gpulayer cluster join TOKEN --force' to repair") from e
    except ValueError as e:
        raise TlsError(f"{path}: not a PEM certificate: {e}") from e


def _read_cluster_json(idir: Path) -> tuple[str, str] | None:
    """(cluster id, name) from cluster.json; None when there is none (not in a cluster)."""
    path = idir / CLUSTER_JSON
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TlsError(f"{path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:
        raise TlsError(f"{path}: malformed JSON: {e}") from e
    cluster_id = data.get("cluster_id") if isinstance(data, dict) else None
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(cluster_id, str) or not cluster_id:
        raise TlsError(f"{path}: no cluster_id")
    return cluster_id, name if isinstance(name, str) and name else cluster_id


def _cluster_id(ca: x509.Certificate) -> str:
    return _b32(hashlib.sha256(_spki(ca.public_key())).digest())[:16]


def _spki(pub: PublicKeyTypes) -> bytes:
    return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _b32(digest: bytes) -> str:
    return base64.b32encode(digest).decode("ascii").rstrip("=").lower()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _write_tmp(path: Path, data: bytes) -> Path:
    """Write ``data`` to a private temporary file next to ``path``, mode 0600 from creation."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crashed process with the same pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        tmp = _write_tmp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
    except OSError as e:
        raise TlsError(f"{path}: cannot write: {e.strerror or e}") from e


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` atomically unless it exists; returns whether this call created it."""
    try:
        tmp = _write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        _fsync_dir(path.parent)
    except OSError as e:
        raise TlsError(f"{path}: cannot write: {e.strerror or e}") from e
    return True


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _locked(idir: Path) -> Iterator[None]:
    """Serialise cluster changes on one state dir (two ``gpulayer cluster`` commands at once)."""
    try:
        fd = os.open(idir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise TlsError(f"{idir / '.lock'}: cannot open: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
