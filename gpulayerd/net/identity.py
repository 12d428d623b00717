"""This daemon's identity: its key, its certificate, and where the cluster files live.

With :mod:`gpulayerd.net.ca`, :mod:`~gpulayerd.net.enroll`, :mod:`~gpulayerd.net.joining` and
:mod:`~gpulayerd.net.revocation`, the only modules that import ``cryptography``. Files live in
``<state dir>/identity/`` (directory mode 0700; every file 0600, written atomically and
never readable by others, not even while being written):

- ``node.key``: this daemon's private key (EC P-256, PEM). Created on first use; the node
  id is derived from its public key, so it never changes while the key stays.
- ``node.crt``: this daemon's certificate, signed by the cluster CA (in a cluster only). It
  records the node's mode and, in personal mode, the one user it is bound to (see
  :func:`make_node_cert`): who a peer vouches for is read from its certificate.
- ``ca.crt``: the cluster CA certificate (in a cluster only; see :mod:`gpulayerd.net.ca`).
- ``ca.key``: the cluster CA's private key, on **signers** only (the node that ran
  ``cluster init``, and those given it with ``cluster signer add``). Other members never
  see it: they enroll online (:mod:`gpulayerd.net.enroll`) and renew their certificate
  through a signer.
- ``cluster.json``: ``{cluster_id, name, created_at, signers}``; written last, so a node is
  in a cluster exactly when this file exists (an interrupted init or join leaves it out).
  ``signers`` lists the HOST:PORT enrollment addresses the node renews its certificate at.
- ``tokens.json`` and ``revocations.json``: a signer's join tokens (hashed) and the
  revocation entries this node knows (:mod:`gpulayerd.net.enroll`, :mod:`gpulayerd.net.revocation`).

A signer renews its own certificate with its CA key (:func:`load_or_create_identity`);
a member asks a signer (the daemon's renewal loop).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpulayerd.host.atomic import create_exclusive, write_atomic

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CLOCK_SKEW",
    "CLUSTER_JSON",
    "IDENTITY_DIR",
    "MODES",
    "NODE_CERT",
    "NODE_KEY",
    "NODE_VALIDITY",
    "RENEW_BEFORE",
    "Identity",
    "ModeMismatch",
    "PeerIdentity",
    "TlsError",
    "b32",
    "cert_mode_user",
    "check_mode",
    "cluster_id_of",
    "identity_dir",
    "key_pem",
    "load_or_create_identity",
    "load_or_create_key",
    "make_node_cert",
    "node_id_from_cert_der",
    "node_id_from_public_key",
    "peer_identity_from_cert_der",
    "read_cluster_json",
    "spki",
    "utc_now",
    "write_file",
]

log = logging.getLogger(__name__)

NODE_VALIDITY = dt.timedelta(days=30)
"""The lifetime of every node certificate a signer issues (members renew before it ends)."""
# Certificates start this far in the past so that a peer whose clock is a little behind accepts them.
CLOCK_SKEW = dt.timedelta(hours=1)
# A node renews its certificate when it has less than this left (a signer itself, in
# load_or_create_identity; a member, through a signer, in the daemon's renewal loop).
RENEW_BEFORE = dt.timedelta(days=10)

IDENTITY_DIR = "identity"
NODE_KEY = "node.key"
NODE_CERT = "node.crt"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CLUSTER_JSON = "cluster.json"


MODES = ("personal", "system")
"""A node's modes: ``personal`` (one user's daemon) or ``system`` (root's daemon, each job as its user)."""

# How a node certificate records its mode and user (subject attributes, read with the x509 API):
# one OU attribute that is exactly one of these values, and, for a personal node, one
# USER_ID (0.9.2342.19200300.100.1.1) attribute with the user name bound at enrollment.
_MODE_OU = {"personal": "gpulayer-mode=personal", "system": "gpulayer-mode=system"}
_OU_MODE = {v: k for k, v in _MODE_OU.items()}


class TlsError(Exception):
    """The identity or cluster files are missing, invalid or inconsistent; the message says which."""


class ModeMismatch(TlsError, ValueError):
    """This node's certificate was enrolled in another mode than the daemon is configured for."""


class PeerIdentity(NamedTuple):
    """Who a node certificate says its node is.

    Attributes:
        node_id: SHA-256 of the certificate's public key (:func:`node_id_from_public_key`).
        mode: ``personal`` or ``system``.
        user: the user name a personal-mode certificate is bound to; "" for a system-mode
            one, and for a certificate made before modes were recorded (which then counts
            as personal and vouches for no user name).
    """

    node_id: str
    mode: str
    user: str


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
        mode: the mode ``node.crt`` records (``personal`` outside a cluster, and for a
            certificate made before modes were recorded).
        user: the user a personal-mode ``node.crt`` is bound to ("" if none).
    """

    node_id: str
    state_dir: Path
    key_path: Path
    cert_path: Path | None = None
    ca_path: Path | None = None
    cluster_id: str | None = None
    cluster_name: str | None = None
    mode: str = "personal"
    user: str = ""

    @property
    def in_cluster(self) -> bool:
        """Whether this node has a CA-signed certificate (and so can talk to peers)."""
        return self.cert_path is not None and self.ca_path is not None and self.cluster_id is not None


def node_id_from_public_key(pub: PublicKeyTypes) -> str:
    """SHA-256 of the DER SubjectPublicKeyInfo, base32, lower case, no padding (52 characters)."""
    return b32(hashlib.sha256(spki(pub)).digest())


def node_id_from_cert_der(der: bytes) -> str:
    """The node id of the key in a DER certificate.

    Raises:
        ValueError: ``der`` is not a DER certificate.
    """
    return node_id_from_public_key(x509.load_der_x509_certificate(der).public_key())


def peer_identity_from_cert_der(der: bytes) -> PeerIdentity:
    """Node id, mode and bound user of a DER node certificate (see :func:`cert_mode_user`).

    Raises:
        ValueError: ``der`` is not a DER certificate.
    """
    cert = x509.load_der_x509_certificate(der)
    mode, user = cert_mode_user(cert)
    return PeerIdentity(node_id_from_public_key(cert.public_key()), mode, user)


def cert_mode_user(cert: x509.Certificate) -> tuple[str, str]:
    """(mode, user) recorded in a node certificate's subject.

    The subject holds one OU attribute ``gpulayer-mode=personal`` or ``gpulayer-mode=system``
    and, in personal mode, one USER_ID attribute (the user name bound at enrollment).
    Anything else (no OU: a certificate made before modes were recorded; an unknown or
    repeated value; a system certificate naming a user) reads as ``("personal", "")``: a
    node that vouches for no user name.
    """
    ous = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)]
    users = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.USER_ID)]
    modes = [_OU_MODE[v] for v in ous if isinstance(v, str) and v in _OU_MODE]
    if len(modes) != 1 or len(users) > 1:
        return "personal", ""
    user = users[0] if users else ""
    if not isinstance(user, str):
        return "personal", ""
    if modes[0] == "system":
        return ("system", "") if not user else ("personal", "")
    return ("personal", user) if _valid_user(user) else ("personal", "")


def check_mode(identity: Identity, mode: str) -> None:
    """Check that a node in a cluster was enrolled in ``mode`` (the daemon's configured mode).

    Raises:
        ModeMismatch: its certificate records another mode (the message says how to re-join).
    """
    if not identity.in_cluster or identity.mode == mode:
        return
    how = ("as root: 'sudo gpulayer cluster join --force --system -'" if mode == "system"
           else "as the daemon's user, without --system: 'gpulayer cluster join --force -'")
    raise ModeMismatch(f"this node's certificate {identity.cert_path} was enrolled in {identity.mode} mode "
                       f"but gpulayerd is configured for {mode} mode; re-join the cluster {how}")


def _valid_user(name: str) -> bool:
    """A user name a certificate may carry: 1 to 64 printable characters, no spaces or ':'."""
    return 0 < len(name) <= 64 and name.isprintable() and not any(c.isspace() or c in ":/" for c in name)


def load_or_create_identity(state_dir: Path) -> Identity:
    """This daemon's identity: creates the node key on first use, loads the cluster files if any.

    Also renews ``node.crt`` when it expires within :data:`RENEW_BEFORE` on a signer (a node
    that holds ``ca.key``); other members renew through a signer (the daemon's loop).

    Raises:
        TlsError: a file is unreadable or malformed, ``node.crt`` does not belong to
            ``node.key``, or it is not signed by ``ca.crt``.
    """
    idir = identity_dir(state_dir)
    key = load_or_create_key(idir)
    node_id = node_id_from_public_key(key.public_key())
    info = read_cluster_json(idir)
    if info is None:
        return Identity(node_id=node_id, state_dir=state_dir, key_path=idir / NODE_KEY)
    ca = _read_cert(idir / CA_CERT)
    cluster_id, name = info
    if cluster_id_of(ca) != cluster_id:
        raise TlsError(f"{idir / CLUSTER_JSON}: cluster id {cluster_id} does not match {idir / CA_CERT} "
                       f"(cluster {cluster_id_of(ca)}); run 'gpulayer cluster join --force -' to repair")
    cert = _read_cert(idir / NODE_CERT)
    if spki(cert.public_key()) != spki(key.public_key()):
        raise TlsError(f"{idir / NODE_CERT} does not match this node's key {idir / NODE_KEY}; "
                       "run 'gpulayer cluster join --force -' to sign a new certificate")
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as e:
        raise TlsError(f"{idir / NODE_CERT} is not signed by the cluster CA {idir / CA_CERT}; "
                       "run 'gpulayer cluster join --force -' to sign a new certificate") from e
    mode, user = cert_mode_user(cert)
    if cert.not_valid_after_utc - utc_now() < RENEW_BEFORE:
        _renew_node_cert(idir, key, ca, node_id, mode, user)
    return Identity(node_id=node_id, state_dir=state_dir, key_path=idir / NODE_KEY, cert_path=idir / NODE_CERT,
                    ca_path=idir / CA_CERT, cluster_id=cluster_id, cluster_name=name, mode=mode, user=user)


def make_node_cert(key: ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey, ca: x509.Certificate,
                   ca_key: ec.EllipticCurvePrivateKey, node_id: str, mode: str, user: str) -> x509.Certificate:
    """A node certificate for ``key`` (a node's private key or its public key, e.g. from a
    CSR), signed with the cluster CA's key ``ca_key``.

    Subject CN and DNS SAN are ``node_id``; the subject also records ``mode`` (an OU
    attribute ``gpulayer-mode=<mode>``) and, in personal mode, the bound ``user`` (a
    USER_ID attribute), read back by :func:`cert_mode_user`. Valid from
    :data:`CLOCK_SKEW` ago for :data:`NODE_VALIDITY` (never past the CA's end); for TLS
    server and client auth.

    Raises:
        TlsError: ``mode`` is not one of :data:`MODES`; a personal ``user`` that is not 1 to
            64 printable characters without spaces, ':' or '/'; a system mode with a user.
    """
    if mode not in _MODE_OU:
        raise TlsError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "personal" and not _valid_user(user):
        raise TlsError(f"user {user!r}: a personal-mode certificate needs a user name of 1 to 64 printable "
                       "characters without spaces, ':' or '/'")
    if mode == "system" and user:
        raise TlsError(f"user {user!r}: a system-mode certificate is bound to no user")
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, node_id),
             x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, _MODE_OU[mode])]
    if user:
        attrs.append(x509.NameAttribute(NameOID.USER_ID, user))
    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    now = utc_now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca.subject)
        .public_key(pub)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(pub), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def identity_dir(state_dir: Path) -> Path:
    """``<state dir>/identity``, created with mode 0700 (made 0700 if others could read it).

    Raises:
        TlsError: it cannot be created.
    """
    idir = state_dir / IDENTITY_DIR
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        idir.mkdir(exist_ok=True, mode=0o700)
        if idir.stat().st_mode & 0o077:
            os.chmod(idir, 0o700)
    except OSError as e:
        raise TlsError(f"{idir}: cannot create the identity directory: {e.strerror or e}") from e
    return idir


def load_or_create_key(idir: Path) -> ec.EllipticCurvePrivateKey:
    """This node's private key in ``idir``; created (EC P-256) on first use, once even when raced.

    Raises:
        TlsError: the key file is unreadable or not an unencrypted EC PEM key.
    """
    path = idir / NODE_KEY
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        if _create_exclusive(path, key_pem(key)):
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
                       "run 'gpulayer cluster join --force -' to repair") from e
    except ValueError as e:
        raise TlsError(f"{path}: not a PEM certificate: {e}") from e


def read_cluster_json(idir: Path) -> tuple[str, str] | None:
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


def cluster_id_of(ca: x509.Certificate) -> str:
    """The cluster id of a CA: the first 16 base32 characters of SHA-256 of its public key."""
    return b32(hashlib.sha256(spki(ca.public_key())).digest())[:16]


def spki(pub: PublicKeyTypes) -> bytes:
    """The DER SubjectPublicKeyInfo of a public key."""
    return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def b32(digest: bytes) -> str:
    """``digest`` in lower-case base32 without padding."""
    return base64.b32encode(digest).decode("ascii").rstrip("=").lower()


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def utc_now() -> dt.datetime:
    """The wall-clock time now, in UTC."""
    return dt.datetime.now(dt.timezone.utc)


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, mode 0600 (:func:`gpulayerd.host.atomic.write_atomic`).

    Raises:
        TlsError: the file cannot be written.
    """
    try:
        write_atomic(path, data, 0o600)
    except OSError as e:
        raise TlsError(f"{path}: cannot write: {e.strerror or e}") from e


def _create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` (mode 0600) atomically unless it exists; returns whether this call created it."""
    try:
        return create_exclusive(path, data, 0o600)
    except OSError as e:
        raise TlsError(f"{path}: cannot write: {e.strerror or e}") from e


def _renew_node_cert(idir: Path, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, node_id: str,
                     mode: str, user: str) -> None:
    if not (idir / CA_KEY).exists():
        return  # not a signer: the daemon's renewal loop asks one
    try:
        ca_key = _read_key(idir / CA_KEY)
    except TlsError as e:
        log.warning("node certificate %s expires soon and cannot be renewed: %s", idir / NODE_CERT, e)
        return
    if mode == "personal" and not user:
        log.warning("node certificate %s expires soon and records no user: re-join the cluster to renew it",
                    idir / NODE_CERT)
        return
    cert = make_node_cert(key, ca, ca_key, node_id, mode, user)
    write_file(idir / NODE_CERT, cert.public_bytes(serialization.Encoding.PEM))
    log.info("renewed node certificate %s (valid until %s)", idir / NODE_CERT, cert.not_valid_after_utc)
