"""Mutual-TLS contexts between the daemons of a cluster, and who is on the other side.

Peers are identified by node id, not by host name: contexts accept any certificate signed
by the cluster CA (:mod:`gpulayerd.net.ca`), and the caller checks :func:`peer_node_id`
after the handshake (:func:`peer_identity` also gives the mode and bound user its
certificate records: who the peer vouches for). The certificate and key are this node's
(:mod:`gpulayerd.net.identity`).
"""

from __future__ import annotations

import ssl

from gpulayerd.net.identity import Identity, PeerIdentity, TlsError, node_id_from_cert_der, peer_identity_from_cert_der

__all__ = ["PeerIdentity", "client_ssl_context", "enroll_ssl_context", "peer_identity", "peer_node_id",
           "reload_identity", "server_ssl_context"]


def server_ssl_context(identity: Identity) -> ssl.SSLContext:
    """A TLS server context that requires a client certificate signed by the cluster CA.

    Raises:
        TlsError: the identity is not in a cluster, or the files do not load.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(ctx, identity)
    return ctx


def enroll_ssl_context(identity: Identity) -> ssl.SSLContext:
    """The TLS server context of a signer's enrollment listener: a client certificate is
    optional (a joining node has none yet), but one that is presented must be signed by the
    cluster CA (else the handshake fails). Routes that need a member check it themselves.

    Raises:
        TlsError: the identity is not in a cluster, or the files do not load.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(ctx, identity)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def reload_identity(ctx: ssl.SSLContext, identity: Identity) -> None:
    """Make ``ctx`` present the (renewed) certificate of ``identity`` on new connections.

    Raises:
        TlsError: the files do not load.
    """
    if identity.cert_path is None:
        raise TlsError("no node certificate to load")
    try:
        ctx.load_cert_chain(identity.cert_path, identity.key_path)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the TLS identity in {identity.cert_path.parent}: {e}") from e


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
    der = _peer_der(ssl_object_or_der)
    try:
        return node_id_from_cert_der(der)
    except ValueError as e:
        raise TlsError(f"the peer's certificate does not parse: {e}") from e


def peer_identity(ssl_object_or_der: ssl.SSLObject | ssl.SSLSocket | bytes) -> PeerIdentity:
    """(node id, mode, bound user) of the peer of a verified TLS connection (or of a DER certificate).

    A certificate made before modes were recorded reads as personal mode bound to no user
    (it vouches for no user name); see :func:`gpulayerd.net.identity.cert_mode_user`.

    Raises:
        TlsError: the peer sent no certificate, or it does not parse.
    """
    der = _peer_der(ssl_object_or_der)
    try:
        return peer_identity_from_cert_der(der)
    except ValueError as e:
        raise TlsError(f"the peer's certificate does not parse: {e}") from e


# ------------------------------------------------------------------------- private


def _peer_der(ssl_object_or_der: ssl.SSLObject | ssl.SSLSocket | bytes) -> bytes:
    if isinstance(ssl_object_or_der, bytes):
        der: bytes | None = ssl_object_or_der
    else:
        der = ssl_object_or_der.getpeercert(binary_form=True)
    if not der:
        raise TlsError("the peer sent no certificate")
    return der


def _configure(ctx: ssl.SSLContext, identity: Identity) -> None:
    if not identity.in_cluster or identity.cert_path is None or identity.ca_path is None:
        raise TlsError(f"node {identity.node_id[:12]} is not in a cluster: run 'gpulayer cluster init' "
                       "or 'gpulayer cluster join -'")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")  # TLS 1.2 only; TLS 1.3 suites are always AEAD
    try:
        ctx.load_cert_chain(identity.cert_path, identity.key_path)
        ctx.load_verify_locations(cafile=identity.ca_path)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the TLS identity in {identity.cert_path.parent}: {e}") from e
