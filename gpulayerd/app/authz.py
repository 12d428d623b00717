"""Refused peer messages: counted, and logged once per peer and kind.

Every peer route checks the sender's role (its node id comes from its TLS certificate):
only an attempt's holder reports on it, only a job's owner offers, holds, commits or
kills it and reads its remote logs, environment values go only to the node that runs the
job. A message that fails its check changes nothing; the service answers it "stale" or
raises :class:`~gpulayerd.api.peer.PeerForbidden` (HTTP 403) and tells :class:`Refusals`,
which logs a warning the first time a peer is refused for a kind of message (a hostile or
confused member must not flood the log) and counts every refusal in the daemon's stats.
"""

from __future__ import annotations

import logging
from collections import Counter

__all__ = ["REFUSED_STAT", "Refusals"]

REFUSED_STAT = "peer_messages_refused"
"""The stats counter (``/v1/health``) of refused peer messages."""


class Refusals:
    """Logs refused peer messages once per (peer, kind) and counts them all.

    Args:
        logger: where the warnings go (the refusing service's logger).
        stats: the daemon's protocol counters; :data:`REFUSED_STAT` and ``refused_<kind>`` grow by one per refusal.
    """

    def __init__(self, logger: logging.Logger, stats: Counter[str]) -> None:
        self._log = logger
        self._stats = stats
        self._seen: set[tuple[str, str]] = set()

    def refuse(self, peer: str, kind: str, detail: str) -> None:
        """Record that ``peer``'s message of ``kind`` (e.g. ``"report exited"``, ``"kill"``) was refused.

        The first refusal per (peer, kind) is a warning, later ones are debug messages.
        """
        self._stats[REFUSED_STAT] += 1
        self._stats[f"refused_{kind.replace(' ', '_')}"] += 1
        first = (peer, kind) not in self._seen
        if first:
            self._seen.add((peer, kind))
        self._log.log(logging.WARNING if first else logging.DEBUG,
                      "refused %s from peer %s: %s%s", kind, peer[:12], detail,
                      " (further refusals of this kind from this peer are logged at debug level)" if first else "")

    def seen(self) -> set[tuple[str, str]]:
        """The (peer, kind) pairs refused so far (for tests and diagnostics)."""
        return set(self._seen)
