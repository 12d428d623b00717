"""Revocation entries: "node X is out of the cluster", signed with the cluster CA key.

``gpulayer cluster remove NODE`` on a signer makes an entry (:func:`sign_entry`) and adds it
to ``identity/revocations.json`` (0600, under the identity lock). Members pass entries on in
heartbeats; each receiver checks the signature against its CA certificate
(:func:`verify_entry`), keeps the valid ones in its own ``revocations.json`` and refuses the
node on every connection from then on. An entry not signed by the CA is ignored.

The signed bytes are ``b"gpulayer-revoke\\0" + cluster_id + b"\\0" + node_id + b"\\0" + str(at)``
(``at``: integer unix seconds), ECDSA P-256 with SHA-256, base64url without padding.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpulayerd.net.enroll import locked
from gpulayerd.net.identity import CA_CERT, CA_KEY, TlsError, cluster_id_of, write_file

__all__ = ["REVOCATIONS_JSON", "Revocation", "add_entries", "load_entries", "revoke_node", "sign_entry",
           "verify_entry"]

REVOCATIONS_JSON = "revocations.json"
REMOVED_MARK = "removed"
"""Beside a node's identity: written when a member refused this node as removed from the cluster
(``<epoch seconds> <the member's words>``); ``gpulayer cluster show`` says so."""
_MAX_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Revocation:
    """One signed entry: ``node_id`` is out of the cluster since ``at`` (unix seconds)."""

    node_id: str
    at: int
    sig: str


def _signed_bytes(cluster_id: str, node_id: str, at: int) -> bytes:
    return b"gpulayer-revoke\0" + cluster_id.encode() + b"\0" + node_id.encode() + b"\0" + str(at).encode()


def sign_entry(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, node_id: str,
               at: int | None = None) -> Revocation:
    """A revocation entry for ``node_id`` signed with the CA key (``at`` default: now)."""
    when = int(time.time()) if at is None else at
    sig = ca_key.sign(_signed_bytes(cluster_id_of(ca), node_id, when), ec.ECDSA(hashes.SHA256()))
    return Revocation(node_id, when, base64.urlsafe_b64encode(sig).decode("ascii").rstrip("="))


def verify_entry(ca: x509.Certificate, entry: Revocation) -> bool:
    """Whether ``entry`` is signed by the key of ``ca`` (for ``ca``'s cluster). Never raises."""
    pub = ca.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey) or len(entry.sig) > 200 or len(entry.node_id) > 64:
        return False
    try:
        sig = base64.urlsafe_b64decode(entry.sig + "=" * (-len(entry.sig) % 4))
        pub.verify(sig, _signed_bytes(cluster_id_of(ca), entry.node_id, entry.at), ec.ECDSA(hashes.SHA256()))
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True


def load_entries(idir: Path) -> list[Revocation]:
    """The verified entries in ``revocations.json`` (unsigned or damaged ones are skipped).

    Raises:
        TlsError: the CA certificate is unreadable.
    """
    try:
        raw = json.loads((idir / REVOCATIONS_JSON).read_bytes())
    except (FileNotFoundError, ValueError):
        return []
    except OSError as e:
        raise TlsError(f"{idir / REVOCATIONS_JSON}: cannot read: {e.strerror or e}") from e
    ca = _ca(idir)
    out = []
    for item in raw if isinstance(raw, list) else []:
        try:
            entry = Revocation(str(item["node_id"]), int(item["at"]), str(item["sig"]))
        except (KeyError, TypeError, ValueError):
            continue
        if verify_entry(ca, entry):
            out.append(entry)
    return out


def add_entries(idir: Path, entries: list[Revocation]) -> list[Revocation]:
    """Verify ``entries`` and store the new valid ones; returns those that were new.

    Raises:
        TlsError: the file cannot be written, or the CA certificate is unreadable.
    """
    ca = _ca(idir)
    with locked(idir):
        known = {e.node_id: e for e in load_entries(idir)}
        new = [e for e in entries if e.node_id not in known and verify_entry(ca, e)]
        for e in new:
            known[e.node_id] = e
        if new:
            rows = [{"node_id": e.node_id, "at": e.at, "sig": e.sig} for e in list(known.values())[-_MAX_ENTRIES:]]
            write_file(idir / REVOCATIONS_JSON, (json.dumps(rows, indent=1) + "\n").encode())
    return new


def revoke_node(idir: Path, node_id: str) -> Revocation:
    """On a signer: sign an entry for ``node_id`` and store it. Returns the entry.

    Raises:
        TlsError: not a signer, ``node_id`` is this node, or the file cannot be written.
    """
    try:
        ca_key = serialization.load_pem_private_key((idir / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as e:
        raise TlsError(f"this node is not a signer (no {idir / CA_KEY}): run 'gpulayer cluster remove' on a signer"
                       ) from e
    except (OSError, ValueError, TypeError) as e:
        raise TlsError(f"{idir / CA_KEY}: cannot read: {e}") from e
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TlsError(f"{idir / CA_KEY}: not an EC key")
    entry = sign_entry(_ca(idir), ca_key, node_id)
    add_entries(idir, [entry])
    return entry


def _ca(idir: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate((idir / CA_CERT).read_bytes())
    except (OSError, ValueError) as e:
        raise TlsError(f"{idir / CA_CERT}: cannot read: {e}") from e
