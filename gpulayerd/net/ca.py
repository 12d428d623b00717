"""The cluster CA: making a cluster, joining one, and the join token that carries the CA.

``gpulayer cluster init`` makes the CA on one machine and prints a join token;
``gpulayer cluster join TOKEN`` on every other machine installs the CA and signs that
machine's own certificate. The token carries the CA's private key: it is a secret, and
whoever has it can add machines to the cluster. The files are those of
:mod:`gpulayerd.net.identity`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import os
import pwd
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpulayerd.atomic import fsync_dir
from gpulayerd.net.identity import (
    CA_CERT,
    CA_KEY,
    CLOCK_SKEW,
    CLUSTER_JSON,
    IDENTITY_DIR,
    MODES,
    NODE_CERT,
    Identity,
    TlsError,
    b32,
    cluster_id_of,
    identity_dir,
    key_pem,
    load_or_create_identity,
    load_or_create_key,
    make_node_cert,
    node_id_from_public_key,
    read_cluster_json,
    spki,
    utc_now,
    write_file,
)

__all__ = ["CA_VALIDITY", "TOKEN_PREFIX", "TOKEN_VERSION", "TokenError", "cluster_init", "cluster_join", "join_token",
           "this_user"]

TOKEN_PREFIX = "gpl1."
TOKEN_VERSION = 1
CA_VALIDITY = dt.timedelta(days=3652)
_MAX_TOKEN_JSON_BYTES = 64 * 1024
_MAX_NAME_CHARS = 64


class TokenError(TlsError):
    """A join token is garbled, truncated, of an unknown version or inconsistent (bad user input)."""


def this_user() -> str:
    """The name of this process's real user (``os.getuid()``): who a personal-mode node is bound to.

    Raises:
        TlsError: the uid has no entry in the user database.
    """
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError as e:
        raise TlsError(f"uid {uid} has no entry in the user database: a personal-mode node is bound to "
                       "a user name") from e


def _mode_user(mode: str, user: str | None) -> tuple[str, str]:
    if mode not in MODES:
        raise TlsError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "system":
        return mode, ""
    return mode, this_user() if user is None else user


def cluster_init(state_dir: Path, name: str | None, *, force: bool = False, mode: str = "personal",
                 user: str | None = None) -> str:
    """Create a new cluster with this node as its first member; returns the join token.

    Args:
        state_dir: the daemon's state dir.
        name: a human name for the cluster (at most 64 printable characters); None uses
            the cluster id.
        force: replace the cluster this node is in (it then leaves that cluster).
        mode: ``personal`` or ``system``, recorded in this node's certificate.
        user: the user a personal-mode certificate is bound to (None: :func:`this_user`);
            ignored in system mode.

    Returns:
        The join token (a secret, see :func:`join_token`).

    Raises:
        TlsError: already in a cluster and not ``force``, a bad name, mode or user.
    """
    if name is not None:
        _check_name(name)
    mode, user = _mode_user(mode, user)
    idir = identity_dir(state_dir)
    with _locked(idir):
        key = load_or_create_key(idir)
        if not force:
            current = _current_cluster(state_dir)
            if current is not None:
                raise TlsError(f"this node is already in cluster {_label(*current)}; "
                               "use --force to make a new cluster (this node then leaves the old one)")
        ca_key = ec.generate_private_key(ec.SECP256R1())
        cluster_id = b32(hashlib.sha256(spki(ca_key.public_key())).digest())[:16]
        ca = _make_ca_cert(ca_key, cluster_id, name or cluster_id)
        _install(idir, key, ca, ca_key, name or cluster_id, mode, user)
    return join_token(state_dir)


def cluster_join(state_dir: Path, token: str, *, force: bool = False, mode: str = "personal",
                 user: str | None = None) -> Identity:
    """Join the cluster of ``token``: install its CA and sign this node's own certificate.

    Joining the cluster this node is already in, in the same mode for the same user,
    changes nothing; in another mode (or for another user) it signs a new certificate.

    Args:
        mode: ``personal`` or ``system``, recorded in this node's certificate.
        user: the user a personal-mode certificate is bound to (None: :func:`this_user`).

    Raises:
        TokenError: the token is garbled, truncated or of an unsupported version.
        TlsError: already in a different cluster and not ``force``; a bad mode or user.
    """
    mode, user = _mode_user(mode, user)
    cluster_id, name, ca, ca_key = _decode_token(token)
    idir = identity_dir(state_dir)
    with _locked(idir):
        key = load_or_create_key(idir)
        current = _current_cluster(state_dir)
        if current is not None and current[0] == cluster_id:
            with contextlib.suppress(TlsError):
                ident = load_or_create_identity(state_dir)
                if (ident.mode, ident.user) == (mode, user):
                    return ident
        elif current is not None and not force:
            raise TlsError(f"this node is already in cluster {_label(*current)}; joining cluster "
                           f"{_label(cluster_id, name)} would make it leave. Use --force to switch clusters")
        _install(idir, key, ca, ca_key, name, mode, user)
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


def _install(idir: Path, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate,
             ca_key: ec.EllipticCurvePrivateKey, name: str, mode: str, user: str) -> None:
    """Write the cluster files; cluster.json goes last, so an interrupted run leaves no cluster."""
    node_cert = make_node_cert(key, ca, ca_key, node_id_from_public_key(key.public_key()), mode, user)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(idir / CLUSTER_JSON)
    fsync_dir(idir)
    write_file(idir / CA_KEY, key_pem(ca_key))
    write_file(idir / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    write_file(idir / NODE_CERT, node_cert.public_bytes(serialization.Encoding.PEM))
    info = {"cluster_id": cluster_id_of(ca), "name": name, "created_at": time.time()}
    write_file(idir / CLUSTER_JSON, (json.dumps(info, indent=2) + "\n").encode())


def _current_cluster(state_dir: Path) -> tuple[str, str] | None:
    """(cluster id, name) this node is in, even when its other cluster files are broken."""
    try:
        return read_cluster_json(state_dir / IDENTITY_DIR)
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
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or spki(ca_key.public_key()) != spki(ca.public_key()):
        raise TokenError(f"{cut} (the CA key does not match the CA certificate)")
    if cluster_id_of(ca) != cluster_id:
        raise TokenError(f"{cut} (cluster id {cluster_id} does not match the CA)")
    try:
        bc = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise TokenError("the join token's certificate is not a CA certificate")
    if ca.not_valid_after_utc <= utc_now():
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
    now = utc_now()
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
