"""Stopping an attempt of a job owned here, wherever it runs: what the owner's claim machine asks for
(``KillRun``, ``ReplyStale``). Built before the owner's jobs and the worker, which both use it.
"""

from __future__ import annotations

import asyncio
import logging

from gpulayerd.app.common.ledger import Ledger
from gpulayerd.app.common.signals import Signals
from gpulayerd.errors import PeerCallError
from gpulayerd.net.transport import KILL, PeerTransport
from gpulayerd.net.wire import Kill, new_msg_id
from gpulayerd.runs.runner import Runner

__all__ = ["AttemptStopper"]

log = logging.getLogger(__name__)


class AttemptStopper:
    """Stops attempts of jobs owned here: a run of this machine through its watchdog, a run on a
    peer with a ``kill`` message.

    Args:
        node_id: this node.
        ledger: what runs here (a run of a job owned here has no peer owner).
        runner: the watchdogs.
        transport: the peer API.
        signals: where background sends are spawned.
    """

    def __init__(self, *, node_id: str, ledger: Ledger, runner: Runner, transport: PeerTransport,
                 signals: Signals) -> None:
        self.node_id = node_id
        self._ledger = ledger
        self._runner = runner
        self._transport = transport
        self._signals = signals

    async def kill_attempt(self, job_id: str, attempt: int, worker: str, reason: str, *, remote: bool) -> None:
        """Stop ``attempt`` of a job owned here: here if it runs here, else (``remote``) on ``worker``.

        Without ``remote`` (a stale reply to ``worker``), only an attempt that ``worker`` runs
        is stopped: a run here is stopped only when ``worker`` is this node, so that a
        peer's stale (or forged) report about an attempt running here never kills it.
        """
        entry = self._ledger.get((job_id, attempt))
        if entry is not None and entry.owner is None and (remote or worker == self.node_id):
            await asyncio.to_thread(self._runner.cancel, entry.handle)
        elif remote and worker and worker != self.node_id:
            self._signals.spawn(self._send_kill(worker, job_id, attempt, reason))

    async def _send_kill(self, worker: str, job_id: str, attempt: int, reason: str) -> None:
        msg = Kill(msg_id=new_msg_id(), owner=self.node_id, job_id=job_id, attempt=attempt, reason=reason)
        try:
            await self._transport.call(worker, KILL, msg)
        except PeerCallError as e:
            log.info("job_id=%s: kill of attempt %d on %s failed: %s", job_id, attempt, worker[:12], e)
