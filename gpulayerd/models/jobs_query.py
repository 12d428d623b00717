"""``GET /v1/jobs``'s filters applied by the daemon: one user's jobs, the latest finished ones, the last N.

Pure selection over jobs already in submission order; :meth:`OwnerService.list_jobs` applies it
to its stored rows before it builds any view (and again to the merged list of the cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpulayerd.core.job_facts import TERMINAL_STATES

__all__ = ["FINISHED_STATES", "JobsQuery", "select"]

FINISHED_STATES = TERMINAL_STATES
"""The states a job ends in (:data:`gpulayerd.core.job_facts.TERMINAL_STATES`)."""

_T = TypeVar("_T")


@dataclass
class JobsQuery:
    """What ``GET /v1/jobs`` asks beyond states and scope.

    Attributes:
        user: only this user's jobs (the spec's ``user``, else ``submitted_by``); None: everyone's.
        finished: at most this many finished jobs, the latest ones (every unfinished job is kept);
            None: all of them.
        limit: at most this many jobs, the latest ones; None: all.
        explanations: whether the views carry their last explanation (False when the listing
            does not show it: ``fields`` without ``explanation``).
        left_out: set by the selection: how many jobs ``finished`` and ``limit`` left out.
    """

    user: str | None = None
    finished: int | None = None
    limit: int | None = None
    explanations: bool = True
    left_out: int = field(default=0)

    @property
    def active(self) -> bool:
        """Whether the query filters anything (else the plain listing does)."""
        return self.user is not None or self.finished is not None or self.limit is not None


def select(items: Sequence[_T], query: JobsQuery, user_of: Callable[[_T], str],
           status_of: Callable[[_T], str]) -> list[_T]:
    """``items`` (in submission order) that ``query`` keeps, in the same order; sets ``query.left_out``."""
    kept = [i for i in items if query.user is None or user_of(i) == query.user]
    before = len(kept)
    if query.finished is not None:
        done = [i for i in kept if status_of(i) in FINISHED_STATES]
        drop = {id(i) for i in done[:max(0, len(done) - query.finished)]}
        kept = [i for i in kept if id(i) not in drop]
    if query.limit is not None and len(kept) > query.limit:
        kept = kept[len(kept) - query.limit:]
    query.left_out = before - len(kept)
    return kept
