"""Stopping an attempt of a job owned here, wherever it runs: what the owner's claim machine asks for
(``KillRun``, ``ReplyStale``). Built before the owner's jobs and the worker, which both use it.
"""

from __future__ import annotations

import logging

from gpulayerd.app.common.signals import Signals
from gpulayerd.errors import PeerCallError
from gpulayerd.net.transport import KILL, PeerTransport
from gpulayerd.net.wire import Kill, new_msg_id

__all__ = ["AttemptStopper"]

log = logging.getLogger(__name__)


class AttemptStopper:
    """Stops attempts of jobs owned here with a ``kill`` message to the worker that runs them (this
    node's own worker through the self-first transport: the same route and role check).

    Args:
        node_id: this node.
        transport: the peer API.
        signals: where background sends are spawned.
    """

    def __init__(self, *, node_id: str, transport: PeerTransport, signals: Signals) -> None:
        self.node_id = node_id
        self._transport = transport
        self._signals = signals

    async def kill_attempt(self, job_id: str, attempt: int, worker: str, reason: str, *, remote: bool,
                           signal: str = "") -> None:
        """Stop ``attempt`` of a job owned here: here if it runs here, else (``remote``) on ``worker``.

        Without ``remote`` (a stale reply to ``worker``), only an attempt that ``worker`` runs
        is stopped: a run here is stopped only when ``worker`` is this node, so that a
        peer's stale (or forged) report about an attempt running here never kills it (a peer
        that reports stale attempts of its own is answered "stale" and stops them itself).
        ``signal``: the name of the signal the job gets first ("" is SIGTERM).
        """
        if worker and (remote or worker == self.node_id):
            self._signals.spawn(self._send_kill(worker, job_id, attempt, reason, signal))

    async def _send_kill(self, worker: str, job_id: str, attempt: int, reason: str, signal: str = "") -> None:
        msg = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=job_id, attempt=attempt, reason=reason,
                   signal=signal)
        try:
            await self._transport.call(worker, KILL, msg)
        except PeerCallError as e:
            log.info("job_id=%s: kill of attempt %d on %s failed: %s", job_id, attempt, worker[:12], e)
