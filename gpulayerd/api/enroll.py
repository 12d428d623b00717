"""A signer's enrollment listener: ``/v1/enroll/`` over TLS with an OPTIONAL client certificate.

Served only by signers (nodes that hold ``ca.key``), on its own port (the peer port + 1,
see :mod:`gpulayerd.net.enroll`), so that the peer API keeps refusing every connection
without a cluster certificate in the handshake. Three routes, nothing else:

- ``GET /v1/enroll/ca``: the CA certificate (public; the joining node checks its SHA-256
  against its token before it trusts it).
- ``POST /v1/enroll/join`` (:class:`~gpulayerd.net.wire.EnrollJoin`): a CSR with a token id
  and secret; the token is consumed atomically and a node certificate returned
  (:class:`~gpulayerd.net.wire.EnrollReply`). Refusals are 403 with the reason.
- ``POST /v1/enroll/renew`` (:class:`~gpulayerd.net.wire.EnrollRenew`): needs a client
  certificate signed by the cluster CA, of a node that is not revoked; a new certificate
  for the same key, mode and user.

The signing runs in a thread (file locks, signatures): the event loop never blocks.


(Same name as :mod:`gpulayerd.net.enroll`, the same idea one layer up: that module is enrollment
itself (tokens, the signer's checks), this one serves it over HTTP.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from pydantic import ValidationError

from gpulayerd.models import ApiErrorBody
from gpulayerd.net.enroll import EnrollRefused, enroll_signed, renew_signed
from gpulayerd.net.identity import CA_CERT, TlsError
from gpulayerd.net.tls import peer_node_id
from gpulayerd.net.wire import EnrollJoin, EnrollRenew, EnrollReply

__all__ = ["make_enroll_app"]

log = logging.getLogger(__name__)


def _error(code: str, message: str, status: int) -> web.Response:
    return web.Response(text=ApiErrorBody(code=code, message=message).model_dump_json(), status=status,
                        content_type="application/json")


def make_enroll_app(idir: Path, is_revoked: Callable[[str], bool]) -> web.Application:
    """The enrollment application of the signer whose identity dir is ``idir``."""
    app = web.Application(client_max_size=64 * 1024)

    async def ca(request: web.Request) -> web.Response:
        pem = await asyncio.to_thread((idir / CA_CERT).read_bytes)
        return web.Response(body=pem, content_type="application/x-pem-file")

    async def join(request: web.Request) -> web.Response:
        try:
            msg = EnrollJoin.model_validate_json(await request.read())
        except ValidationError as e:
            return _error("bad_request", f"invalid EnrollJoin: {e.error_count()} error(s)", 400)
        try:
            pem = await asyncio.to_thread(enroll_signed, idir, msg.token_id, msg.secret, msg.csr_pem.encode(),
                                          msg.mode, msg.user, is_revoked)
        except EnrollRefused as e:
            log.info("enrollment from %s refused: %s", request.remote, e)
            return _error("refused", str(e), 403)
        log.info("enrolled a node from %s with token %s", request.remote, msg.token_id)
        return web.Response(text=EnrollReply(cert_pem=pem.decode("ascii")).model_dump_json(),
                            content_type="application/json")

    async def renew(request: web.Request) -> web.Response:
        ssl_obj = request.transport.get_extra_info("ssl_object") if request.transport else None
        der = ssl_obj.getpeercert(binary_form=True) if ssl_obj is not None else None
        if not der:
            return _error("unauthorized", "renewal needs this node's current certificate", 401)
        try:
            node = peer_node_id(der)
        except TlsError as e:
            return _error("unauthorized", str(e), 401)
        if is_revoked(node):
            return _error("revoked", "this node was removed from the cluster", 403)
        try:
            msg = EnrollRenew.model_validate_json(await request.read())
        except ValidationError as e:
            return _error("bad_request", f"invalid EnrollRenew: {e.error_count()} error(s)", 400)
        try:
            pem = await asyncio.to_thread(renew_signed, idir, der, msg.csr_pem.encode())
        except EnrollRefused as e:
            return _error("refused", str(e), 403)
        log.info("renewed the certificate of node %s", node[:12])
        return web.Response(text=EnrollReply(cert_pem=pem.decode("ascii")).model_dump_json(),
                            content_type="application/json")

    app.router.add_get("/v1/enroll/ca", ca)
    app.router.add_post("/v1/enroll/join", join)
    app.router.add_post("/v1/enroll/renew", renew)
    return app
