"""The scheduler's pass as messages: what the pass keeps of a queued job, the actions it asks
for and the answers it is sent (see :mod:`gpulayerd.core.scheduling`)."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass

from gpulayerd.core import fairshare
from gpulayerd.core.types import JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, Placement

__all__ = ["Action", "Answer", "Claim", "ClaimAnswered", "Count", "Key", "MachineRead", "Pass", "QueueChanges",
           "QueueLoaded", "QueuedJob", "ReadChanges", "ReadMachine", "ReadQueue", "Resume", "SendOffer",
           "StoreReasons", "ToGang", "Yield"]

# ---------------------------------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A queued job as the scheduler keeps it.

    Attributes:
        id: the job id.
        seq: its submission sequence number (None sorts as 0).
        reason: the reason line stored for it now.
        request: its requirements: needed when the job is new to the queue (:meth:`SchedulerCore.queued`
            says which are not), not kept afterwards (one request per shape is).
        avoid: a retry's worker to avoid (``--retry-elsewhere``: its last attempt's node id), or None.
        retry_at: a retry's end of backoff (wall-clock s): neither claimed nor offered before, or None.
        submitted_at: when it was submitted (wall-clock s; its waiting time for ``[slurm] prefer =
            "overflow-after = D"``), or None.
    """

    id: str
    seq: int | None
    reason: str
    request: JobRequest | None = None
    avoid: str | None = None
    retry_at: float | None = None
    submitted_at: float | None = None


Key = tuple[float, float, str, str]
"""A queued job's place in fair-share order: (user's rank, seq, job id, user)."""


# ---------------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class ReadChanges:
    """Read the queue's changes since event ``since`` (answer :class:`QueueChanges`)."""

    since: int


@dataclass(frozen=True, slots=True)
class ReadQueue:
    """Read every queued job (answer :class:`QueueLoaded`): the kept queue disagrees with the store."""


@dataclass(frozen=True, slots=True)
class ReadMachine:
    """Read the peers' last snapshots and the usage and, with ``local``, snapshot this machine,
    answering for ``workdirs`` ((user, workdir) pairs) (answer :class:`MachineRead`)."""

    workdirs: tuple[tuple[str | None, str | None], ...]
    local: bool = True


@dataclass(frozen=True, slots=True)
class Claim:
    """Claim ``job`` for this machine with ``placement`` (answer :class:`ClaimAnswered`)."""

    job: QueuedJob
    placement: Placement


@dataclass(frozen=True, slots=True)
class ToGang:
    """Hand the multi-host ``job`` to the gang coordinator, with this machine as ``local`` (answer :class:`Resume`)."""

    job: QueuedJob
    local: WorkerSnapshot


@dataclass(frozen=True, slots=True)
class StoreReasons:
    """Store each job's new reason line and explanation, in one transaction (answer :class:`Resume`).

    ``items``: (job, reason line, explanation; the explanation's ``job_id`` may be another job's of the same shape).
    """

    items: tuple[tuple[QueuedJob, str, Explanation], ...]


@dataclass(frozen=True, slots=True)
class SendOffer:
    """Offer the queued job ``job_id`` to the peer ``worker`` (no answer: sent in the background)."""

    job_id: str
    worker: str


@dataclass(frozen=True, slots=True)
class Yield:
    """Let the event loop run other work (answer :class:`Resume`)."""


@dataclass(frozen=True, slots=True)
class Count:
    """Count one ``stat`` (a daemon statistic; answer :class:`Resume`)."""

    stat: str


Action = ReadChanges | ReadQueue | ReadMachine | Claim | ToGang | StoreReasons | SendOffer | Yield | Count

# ---------------------------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class QueueChanges:
    """The store's answer to :class:`ReadChanges`.

    Attributes:
        head: the last event applied.
        count: how many jobs are queued in the store.
        changed: the jobs with an event since: (job, still queued).
    """

    head: int
    count: int
    changed: tuple[tuple[QueuedJob, bool], ...]


@dataclass(frozen=True, slots=True)
class QueueLoaded:
    """The store's answer to :class:`ReadQueue`: its last event and every queued job, in submission order."""

    head: int
    queued: tuple[QueuedJob, ...]


@dataclass(frozen=True, slots=True)
class MachineRead:
    """The answer to :class:`ReadMachine`: this machine (None when not asked for), the peers, each
    user's decayed usage (None: no fair share), the monotonic time (s) and the wall-clock time (s;
    None: unknown, no retry is held back by its backoff)."""

    local: WorkerSnapshot | None
    remote: tuple[WorkerSnapshot, ...]
    usage: Mapping[str, fairshare.Usage] | None
    now: float
    wall: float | None = None


@dataclass(frozen=True, slots=True)
class ClaimAnswered:
    """The answer to :class:`Claim`: ``granted``, and this machine after it (``local``, when granted);
    ``gone``: not granted because the job left the queue meanwhile (nothing else is in doubt)."""

    granted: bool
    local: WorkerSnapshot | None = None
    gone: bool = False


@dataclass(frozen=True, slots=True)
class Resume:
    """The answer to an action that returns nothing."""


Answer = QueueChanges | QueueLoaded | MachineRead | ClaimAnswered | Resume | None

Pass = Generator[Action, Answer, None]
"""One scheduling pass: yields actions, is sent their answers."""
