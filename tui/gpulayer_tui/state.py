"""What the TUI knows about the daemon: plain data, no widgets.

The app owns one :class:`ClusterState`; it changes it as changes arrive and publishes
them to the screens, which read it once when they mount. The feed's changes are gathered in
:class:`PendingChanges` and applied a batch at a time (:class:`JobsUpdate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from textual.signal import Signal

from gpulayerd import text as fmt
from gpulayerd.models import TERMINAL_STATES, JobView, PeerView, RequesterView, job_user

__all__ = ["TERMINAL", "WAITING", "ClusterState", "Connection", "ConnectionState", "JobsUpdate", "PendingChanges",
           "StateSource", "cancel_refusal", "may_not_manage"]

ConnectionState = Literal["connecting", "connected", "unreachable"]

TERMINAL = TERMINAL_STATES
"""Job states that never change again (``gpulayerd.models.TERMINAL_STATES``)."""

WAITING = frozenset({"queued", "claimed"})
"""Job states of a job that waits for a worker."""


@dataclass(frozen=True, slots=True)
class Connection:
    """The link to the local daemon.

    Attributes:
        state: ``connecting`` (first try), ``connected``, or ``unreachable`` (retrying).
        message: why it is unreachable, or whom it is connected to.
        since: wall time of the last change of ``state`` (seconds since the epoch).
    """

    state: ConnectionState = "connecting"
    message: str = ""
    since: float = 0.0


@dataclass(slots=True)
class ClusterState:
    """Jobs (in submission order), peers, and the connection, as last read from the daemon."""

    jobs: dict[str, JobView] = field(default_factory=dict)
    peers: list[PeerView] = field(default_factory=list)
    connection: Connection = field(default_factory=Connection)
    daemon: str = ""
    """Whom the app talks to: "host (gpulayerd VERSION)", once known."""
    requester: RequesterView | None = None
    """Who the app runs as, as the daemon sees it (its health answer); None: not known yet, or an older
    daemon (then cancel is offered on every job and the daemon decides)."""

    def reset_jobs(self, jobs: Iterable[JobView]) -> None:
        """Replace every job (after a resync)."""
        self.jobs = {j.id: j for j in jobs}

    def put_job(self, job: JobView) -> None:
        """Add or replace one job."""
        self.jobs[job.id] = job

    def put_jobs(self, update: JobsUpdate) -> None:
        """Add or replace ``update.jobs``, forget ``update.gone``."""
        for job in update.jobs:
            self.jobs[job.id] = job
        for job_id in update.gone:
            self.jobs.pop(job_id, None)


@dataclass(frozen=True, slots=True)
class JobsUpdate:
    """Jobs read again after the daemon said they changed, applied together.

    Attributes:
        jobs: their new views, in submission order (as the listing shows them: no history).
        gone: ids asked for that the daemon no longer lists (removed).
    """

    jobs: tuple[JobView, ...] = ()
    gone: tuple[str, ...] = ()


@dataclass(slots=True)
class PendingChanges:
    """Changes from the daemon's feed not applied yet, coalesced: each job id once, the peers once,
    and a ``resync`` (re-read everything) covering all of them.

    Attributes:
        job_ids: ids of changed jobs, in the order first seen.
        peers: the peers (devices, membership) changed.
        resync: everything must be re-read.
        received: changes added since :meth:`settled` last counted them.
    """

    job_ids: dict[str, None] = field(default_factory=dict)
    peers: bool = False
    resync: bool = False
    received: int = 0

    def add(self, kind: str, key: str = "") -> None:
        """Note one change of the feed: ``job`` (``key``: its id), ``devices``, ``peers`` or ``resync``."""
        self.received += 1
        if kind == "resync":
            self.resync = True
            self.job_ids.clear()
            self.peers = False
        elif self.resync:
            return  # the re-read covers it
        elif kind == "job" and key:
            self.job_ids[key] = None
        elif kind in ("devices", "peers"):
            self.peers = True

    def take_job_ids(self, at_most: int) -> list[str]:
        """Up to ``at_most`` changed job ids, oldest first; they are no longer pending."""
        taken: list[str] = []
        for job_id in self.job_ids:
            if len(taken) == at_most:
                break
            taken.append(job_id)
        for job_id in taken:
            del self.job_ids[job_id]
        return taken

    def settled(self) -> int:
        """How many changes were received since the last call, if nothing is pending now (else 0)."""
        if self:
            return 0
        n, self.received = self.received, 0
        return n

    def __bool__(self) -> bool:
        return self.resync or self.peers or bool(self.job_ids)


def may_not_manage(job: JobView, requester: RequesterView | None) -> str | None:
    """Why ``requester`` may not cancel ``job`` or read its logs ("job X is bob's: only bob or an admin
    may cancel it"), escaped; None when they may, or when who asks is not known."""
    owner = job_user(job.spec.user, job.submitted_by)
    if requester is None or requester.may_manage(owner):
        return None
    you = fmt.escape(requester.user)
    if not owner:
        return f"job {fmt.escape(job.id)} names no user: only an admin may cancel it (you are {you})"
    return f"job {fmt.escape(job.id)} is {fmt.escape(owner)}'s: only {fmt.escape(owner)} or an admin may cancel it " \
           f"(you are {you})"


def cancel_refusal(job: JobView, requester: RequesterView | None) -> str | None:
    """Why ``job`` cannot be cancelled by ``requester`` now (finished, already cancelling, another user's
    job), in words and escaped; None when cancel may be offered."""
    if job.status in TERMINAL:
        return f"job {fmt.escape(job.id)} has ended ({job.status}): nothing to cancel"
    if job.cancel_requested:
        return f"job {fmt.escape(job.id)} is being cancelled already"
    return may_not_manage(job, requester)


class StateSource(Protocol):
    """What screens read and subscribe to (the app): the state and a signal per kind of change.

    A screen reads :attr:`state` once when it mounts, then follows the signals.
    """

    state: ClusterState
    jobs_updated: Signal[JobsUpdate]
    jobs_reset: Signal[list[JobView]]
    peers_updated: Signal[list[PeerView]]
    connection_changed: Signal[Connection]
