"""The cluster CA: making a cluster, and joining one through a signer.

``gpulayer cluster init`` makes the CA on one machine, which becomes a **signer** (it keeps
``ca.key``, 0600), and prints a join token; ``gpulayer cluster join`` on every other machine
enrolls it online at a signer (:mod:`gpulayerd.net.enroll`): the token carries the CA
certificate's SHA-256, the signer's address and a one-time secret, never the CA key, and the
joined node stores no CA key. The files are those of :mod:`gpulayerd.net.identity`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import pwd
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpulayerd.host.atomic import fsync_dir
from gpulayerd.net.enroll import (
    DEFAULT_TTL_S,
    TOKEN_PREFIX,
    TOKENS_JSON,
    EnrollRefused,
    TokenError,
    ca_sha256,
    decode_token,
    enroll_signed,
    locked,
    make_token,
)
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
from gpulayerd.net.joining import make_csr, online_join

__all__ = ["CA_VALIDITY", "TOKEN_PREFIX", "TokenError", "cluster_init", "cluster_join", "new_token", "this_user"]

CA_VALIDITY = dt.timedelta(days=3652)
_MAX_NAME_CHARS = 64


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
                 user: str | None = None, addresses: list[str] | None = None, uses: int = 1,
                 ttl_s: float = DEFAULT_TTL_S) -> str:
    """Create a new cluster with this node as its first member and signer; returns a join token.

    Args:
        state_dir: the daemon's state dir.
        name: a human name for the cluster (at most 64 printable characters); None uses
            the cluster id.
        force: replace the cluster this node is in (it then leaves that cluster).
        mode: ``personal`` or ``system``, recorded in this node's certificate.
        user: the user a personal-mode certificate is bound to (None: :func:`this_user`);
            ignored in system mode.
        addresses, uses, ttl_s: of the join token (:func:`gpulayerd.net.enroll.make_token`).

    Returns:
        The join token (a secret until it is used or expires).

    Raises:
        TlsError: already in a cluster and not ``force``, a bad name, mode or user.
    """
    if name is not None:
        _check_name(name)
    mode, user = _mode_user(mode, user)
    idir = identity_dir(state_dir)
    with locked(idir):
        key = load_or_create_key(idir)
        if not force:
            current = _current_cluster(state_dir)
            if current is not None:
                raise TlsError(f"this node is already in cluster {_label(*current)}; "
                               "use --force to make a new cluster (this node then leaves the old one)")
        ca_key = ec.generate_private_key(ec.SECP256R1())
        cluster_id = b32(hashlib.sha256(spki(ca_key.public_key())).digest())[:16]
        ca = _make_ca_cert(ca_key, cluster_id, name or cluster_id)
        node_cert = make_node_cert(key, ca, ca_key, node_id_from_public_key(key.public_key()), mode, user)
        _install(idir, ca.public_bytes(serialization.Encoding.PEM), node_cert.public_bytes(serialization.Encoding.PEM),
                 name or cluster_id, [], ca_key=ca_key)
        (idir / TOKENS_JSON).unlink(missing_ok=True)  # an old cluster's tokens: its CA is gone
        tok = make_token(idir, cluster_id, name or cluster_id, uses=uses, ttl_s=ttl_s, addresses=addresses,
                         lock=False, mode=mode, user=user or "")
    return tok.encode()


def new_token(state_dir: Path, *, uses: int = 1, ttl_s: float = DEFAULT_TTL_S,
              addresses: list[str] | None = None, mode: str | None = None, user: str | None = None) -> str:
    """A new join token of this node's cluster (this node must be a signer).

    ``mode``/``user``: what the enrolled node will be (see :func:`gpulayerd.net.enroll.make_token`);
    None: this signer's own mode and, in personal mode, its own user.

    Raises:
        TlsError: not in a cluster, not a signer, bad ``uses``/``ttl_s``/addresses/mode/user.
    """
    ident = load_or_create_identity(state_dir)
    if not ident.in_cluster or ident.cluster_id is None:
        raise TlsError(f"no cluster in {state_dir}: run 'gpulayer cluster init' or 'gpulayer cluster join'")
    if mode is None:
        mode = "personal" if user else ident.mode
    if user is None:
        user = (ident.user or "") if mode == "personal" else ""
    return make_token(identity_dir(state_dir), ident.cluster_id, ident.cluster_name or ident.cluster_id, uses=uses,
                      ttl_s=ttl_s, addresses=addresses, mode=mode, user=user).encode()


def cluster_join(state_dir: Path, token: str, *, force: bool = False, mode: str = "personal",
                 user: str | None = None, signer: Path | None = None) -> Identity:
    """Join the cluster of ``token``: enroll at its signer and install the CA certificate and
    this node's new certificate (no CA key).

    Joining the cluster this node is already in, in the same mode for the same user,
    changes nothing (and uses no token); in another mode (or for another user) it enrolls again.

    Args:
        mode: ``personal`` or ``system``, recorded in this node's certificate.
        user: the user a personal-mode certificate is bound to (None: :func:`this_user`).
        signer: OFFLINE enrollment (an admin or a test harness with access to the signer's
            files): the signer's state dir; the token is checked and consumed there exactly
            as the signer's daemon would. None: enroll online at the token's addresses.

    Raises:
        TokenError: the token is garbled, truncated, of an old version, or expired.
        EnrollRefused: the signer's CA does not match the token (nothing secret sent), or
            the signer refused (unknown, used or expired token...).
        TlsError: already in a different cluster and not ``force``; a bad mode or user.
    """
    mode, user = _mode_user(mode, user)
    tok = decode_token(token)
    if (tok.mode, tok.user if tok.mode == "personal" else "") != (mode, user if mode == "personal" else ""):
        made = "a system-mode node (join with --system, as root)" if tok.mode == "system" else \
            f"a personal-mode node of {tok.user!r} (join as {tok.user}, without --system)"
        raise TokenError(f"this token enrolls {made}; ask the signer's admin for a token made for this node "
                         "('gpulayer cluster token --system' or '--user NAME')")
    idir = identity_dir(state_dir)
    with locked(idir):
        key = load_or_create_key(idir)
        current = _current_cluster(state_dir)
        if current is not None and current[0] == tok.cluster_id:
            with contextlib.suppress(TlsError):
                ident = load_or_create_identity(state_dir)
                if (ident.mode, ident.user) == (mode, user):
                    return ident
        elif current is not None and not force:
            raise TlsError(f"this node is already in cluster {_label(*current)}; joining cluster "
                           f"{_label(tok.cluster_id, tok.name)} would make it leave. Use --force to switch clusters")
        if signer is None:
            ca_pem, cert_pem, _ = online_join(tok, key, mode, user)
        else:
            sdir = signer / IDENTITY_DIR
            ca_pem = (sdir / CA_CERT).read_bytes()
            if ca_sha256(ca_pem) != tok.ca_sha256:
                raise EnrollRefused(f"the CA of {signer} does not match the token: refused before using the secret")
            cert_pem = enroll_signed(sdir, tok.token_id, tok.secret, make_csr(key), mode, user)
        ca = x509.load_pem_x509_certificate(ca_pem)
        if cluster_id_of(ca) != tok.cluster_id:
            raise EnrollRefused(f"the signer's CA is cluster {cluster_id_of(ca)}, the token says {tok.cluster_id}")
        _install(idir, ca_pem, cert_pem, tok.name, list(tok.addresses))
    return load_or_create_identity(state_dir)


def _install(idir: Path, ca_pem: bytes, cert_pem: bytes, name: str, signers: list[str],
             ca_key: ec.EllipticCurvePrivateKey | None = None) -> None:
    """Write the cluster files; cluster.json goes last, so an interrupted run leaves no cluster.

    ``ca.key`` is written only with ``ca_key`` (a new cluster); otherwise any old one is removed.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(idir / CLUSTER_JSON)
    if ca_key is None:
        for stale in (CA_KEY, "tokens.json", "revocations.json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(idir / stale)
    fsync_dir(idir)
    if ca_key is not None:
        write_file(idir / CA_KEY, key_pem(ca_key))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(idir / "revocations.json")
    write_file(idir / CA_CERT, ca_pem)
    write_file(idir / NODE_CERT, cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    info = {"cluster_id": cluster_id_of(ca), "name": name, "created_at": time.time(), "signers": signers}
    write_file(idir / CLUSTER_JSON, (json.dumps(info, indent=2) + "\n").encode())


def _current_cluster(state_dir: Path) -> tuple[str, str] | None:
    """(cluster id, name) this node is in, even when its other cluster files are broken."""
    try:
        return read_cluster_json(state_dir / IDENTITY_DIR)
    except TlsError:
        return ("unknown", "unreadable cluster.json")


def _label(cluster_id: str, name: str) -> str:
    return cluster_id if name == cluster_id else f"{name!r} ({cluster_id})"


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


