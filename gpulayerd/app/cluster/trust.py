"""This daemon's cluster trust at run time: revocations, the enrollment listener, certificate renewal.

- Revocations (:mod:`gpulayerd.net.revocation`): loaded at start, re-read each heartbeat
  round when ``revocations.json`` changed (``gpulayer cluster remove`` on this signer writes
  it), and merged from heartbeats (each entry verified against the CA certificate; forged
  ones are ignored). :meth:`Trust.is_revoked` is what the peer API and the peer client check.
- A signer serves the enrollment listener (the route table's ``ENROLL_ROUTES``, through the
  :class:`~gpulayerd.net.transport.PeerNetwork` it is given) on the peer port + 1
  (another free port if taken) and writes its addresses to ``identity/enroll.json`` for
  ``gpulayer cluster token``.
- Renewal: about hourly, if ``node.crt`` ends within
  :data:`~gpulayerd.net.identity.RENEW_BEFORE`, a signer re-signs it itself and a member asks
  the signers it joined through; the new certificate is loaded into the TLS contexts for new
  connections.

All file work runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gpulayerd.net.identity import Identity, TlsError
from gpulayerd.net.joining import renew_if_due
from gpulayerd.net.limits import ConnectionLimits
from gpulayerd.net.transport import PeerNetwork
from gpulayerd.net.wire import MAX_REVOKED, Revoked

if TYPE_CHECKING:
    from gpulayerd.app.common.clock import Clock
    from gpulayerd.net.revocation import Revocation

__all__ = ["RENEW_CHECK_S", "Trust"]

log = logging.getLogger(__name__)

RENEW_CHECK_S = 3600.0
ENROLL_MAX_CONNECTIONS = 128  # the enrollment listener: open connections in all
ENROLL_MAX_PER_ADDRESS = 8  # ... and from one address
ENROLL_MAX_CONNECTION_S = 15.0  # no enrollment connection stays open longer (slow or unfinished requests)
"""How often the daemon checks whether its certificate needs renewing (seconds)."""


class Trust:
    """Revoked nodes, the enrollment listener and renewal of one daemon."""

    def __init__(self, identity: Identity, clock: Clock, network: PeerNetwork) -> None:
        self._identity = identity
        self._network = network
        self._idir = identity.key_path.parent
        self._clock = clock
        self._revoked: dict[str, Revocation] = {}
        self._mtime: float | None = None
        self._pending: dict[str, Revoked] = {}
        self._absorbing: asyncio.Task[None] | None = None
        self._next_renew = 0.0
        self._removed = False  # this node was refused as removed (its mark, read at load)
        self.enroll_port = 0
        self.contexts: list[ssl.SSLContext] = []
        """TLS contexts that present this node's certificate (reloaded after a renewal)."""
        self.on_revoked: Callable[[], Awaitable[None]] | None = None
        """Called after gossip revoked new nodes (close their connections)."""

    # ------------------------------------------------------------------ revocations

    def is_revoked(self, node_id: str) -> bool:
        """Whether ``node_id`` was removed from the cluster (a verified entry is known)."""
        return node_id in self._revoked

    @property
    def removed(self) -> bool:
        """Whether THIS node was removed from the cluster: a member refused it as removed, or a verified
        revocation of it arrived; kept in ``removed`` beside its identity (``gpulayer cluster show``)."""
        return self._removed or self._identity.node_id in self._revoked

    async def note_removed(self, words: str) -> None:
        """A member answered that this node was removed (``words``): keep it beside the identity, once."""
        from gpulayerd.net.revocation import REMOVED_MARK

        mark = self._idir / REMOVED_MARK
        self._removed = True
        if await asyncio.to_thread(mark.exists):
            return
        log.warning("this node was removed from the cluster (a member said: %s): run 'gpulayer cluster leave', "
                    "then join again with a new token", words)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(mark.write_text, f"{int(self._clock.wall())} {words}\n", "utf-8")

    def entries(self) -> list[Revoked] | None:
        """What heartbeats carry: the newest :data:`MAX_REVOKED` entries (None when none)."""
        if not self._revoked:
            return None
        newest = sorted(self._revoked.values(), key=lambda e: e.at)[-MAX_REVOKED:]
        return [Revoked(node_id=e.node_id, at=e.at, sig=e.sig) for e in newest]

    async def load(self) -> None:
        """Read ``revocations.json`` and this node's ``removed`` mark (at start)."""
        from gpulayerd.net.revocation import REMOVED_MARK

        self._removed = await asyncio.to_thread((self._idir / REMOVED_MARK).exists)
        await self._reload()

    def offer(self, entries: list[Revoked]) -> None:
        """Entries from a peer: the unknown ones are verified and stored in the background."""
        for e in entries:
            if e.node_id not in self._revoked and len(self._pending) < MAX_REVOKED:
                self._pending[e.node_id] = e
        if self._pending and (self._absorbing is None or self._absorbing.done()):
            self._absorbing = asyncio.create_task(self._absorb())

    async def refresh(self) -> bool:
        """Each heartbeat round: re-read ``revocations.json`` if it changed, and check the
        certificate's renewal when due. Returns whether new nodes were revoked."""
        if self._clock.monotonic() >= self._next_renew:
            self._next_renew = self._clock.monotonic() + RENEW_CHECK_S
            await self._renew_if_due()
        return await self._reload()

    async def _reload(self) -> bool:
        from gpulayerd.net.revocation import REVOCATIONS_JSON, load_entries

        path = self._idir / REVOCATIONS_JSON
        try:
            mtime: float | None = (await asyncio.to_thread(path.stat)).st_mtime
        except OSError:
            mtime = None
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            entries = await asyncio.to_thread(load_entries, self._idir)
        except TlsError as e:
            log.warning("revocations: %s", e)
            return False
        return self._note(entries)

    def _note(self, entries: list[Revocation]) -> bool:
        new = [e for e in entries if e.node_id not in self._revoked]
        for e in new:
            self._revoked[e.node_id] = e
            log.warning("node %s was removed from the cluster (revoked at %d): refusing its connections",
                        e.node_id[:12], e.at)
        return bool(new)

    async def _absorb(self) -> None:
        from gpulayerd.net.revocation import Revocation, add_entries

        batch = [Revocation(e.node_id, e.at, e.sig) for e in self._pending.values()]
        self._pending.clear()
        try:
            new = await asyncio.to_thread(add_entries, self._idir, batch)
        except TlsError as e:
            log.warning("revocations from a peer not stored: %s", e)
            return
        if self._note(new) and self.on_revoked is not None:
            await self.on_revoked()

    # ------------------------------------------------------------------ enrollment listener

    async def start_enrollment(self, host: str, peer_port: int, lan: list[str]) -> None:
        """On a signer: serve the enrollment listener and write ``enroll.json``; elsewhere nothing.

        Raises:
            OSError: no port could be bound.
        """
        from gpulayerd.host.atomic import write_atomic
        from gpulayerd.net.enroll import ENROLL_JSON, ENROLL_PORT_OFFSET, is_signer
        from gpulayerd.net.tls import enroll_ssl_context

        if not await asyncio.to_thread(is_signer, self._idir):
            return
        ctx = enroll_ssl_context(self._identity)
        self.contexts.append(ctx)
        # Strangers may connect here (no client certificate): fewer slots per address, and no
        # connection may hold one longer than an enrollment takes (a slow or unfinished request).
        limits = ConnectionLimits(ENROLL_MAX_CONNECTIONS, ENROLL_MAX_PER_ADDRESS, time.monotonic)
        try:
            self.enroll_port = await self._network.serve_enroll(
                host, peer_port + ENROLL_PORT_OFFSET, ctx, identity_dir=self._idir, limits=limits,
                max_connection_s=ENROLL_MAX_CONNECTION_S, is_revoked=self.is_revoked)
        except OSError as e:
            log.warning("enrollment port %d: %s; using another one", peer_port + ENROLL_PORT_OFFSET, e)
            self.enroll_port = await self._network.serve_enroll(
                host, 0, ctx, identity_dir=self._idir, limits=limits, max_connection_s=ENROLL_MAX_CONNECTION_S,
                is_revoked=self.is_revoked)
        hosts = lan if host in ("0.0.0.0", "::", "") else [host]
        addrs = [f"[{h}]:{self.enroll_port}" if ":" in h else f"{h}:{self.enroll_port}" for h in hosts or ["127.0.0.1"]]
        body = json.dumps({"port": self.enroll_port, "addresses": addrs}) + "\n"
        await asyncio.to_thread(write_atomic, self._idir / ENROLL_JSON, body, 0o600)
        log.info("signer: enrollment listener on %s", ", ".join(addrs))

    async def close(self) -> None:
        """Stop background work (the enrollment listener stops with the network's listeners)."""
        if self._absorbing is not None:
            self._absorbing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._absorbing

    # ------------------------------------------------------------------ renewal

    async def _renew_if_due(self) -> None:
        try:
            renewed = await asyncio.to_thread(renew_if_due, self._identity)
        except TlsError as e:
            log.warning("node certificate renewal failed (will retry within the hour): %s", e)
            return
        if renewed:
            from gpulayerd.net.tls import reload_identity

            for ctx in self.contexts:
                reload_identity(ctx, self._identity)
            log.info("node certificate renewed")
