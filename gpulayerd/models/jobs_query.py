"""``GET /v1/jobs``'s filters applied by the daemon: given ids, one user's jobs, the latest finished ones, the last N.

Pure selection over jobs already in submission order; :meth:`OwnerService.list_jobs` applies it
to its stored rows before it builds any view (and again to the merged list of the cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpulayerd.core.job_facts import TERMINAL_STATES

__all__ = ["FINISHED_STATES", "MAX_IDS", "JobsQuery", "select"]

FINISHED_STATES = TERMINAL_STATES
"""The states a job ends in (:data:`gpulayerd.core.job_facts.TERMINAL_STATES`)."""

MAX_IDS = 500
"""The most job ids one ``GET /v1/jobs?ids=`` may name (a client asks for more in several requests):
500 ids of 12 characters keep the request line under aiohttp's 8,190 bytes."""

_T = TypeVar("_T")


@dataclass
class JobsQuery:
    """What ``GET /v1/jobs`` asks beyond states and scope.

    Attributes:
        ids: only the jobs with these exact ids (unknown ones are left out silently); None: any.
        user: only this user's jobs (the spec's ``user``, else ``submitted_by``); None: everyone's.
        finished: at most this many finished jobs, the latest ones (every unfinished job is kept);
            None: all of them.
        limit: at most this many jobs, the latest ones; None: all.
        explanations: whether the views carry their last explanation (False when the listing
            does not show it: ``fields`` without ``explanation``).
        left_out: set by the selection: how many jobs ``finished`` and ``limit`` left out.
    """

    ids: frozenset[str] | None = None
    user: str | None = None
    finished: int | None = None
    limit: int | None = None
    explanations: bool = True
    left_out: int = field(default=0)

    @property
    def active(self) -> bool:
        """Whether the query filters anything (else the plain listing does)."""
        return self.ids is not None or self.user is not None or self.finished is not None or self.limit is not None


def select(items: Sequence[_T], query: JobsQuery, user_of: Callable[[_T], str],
           status_of: Callable[[_T], str], id_of: Callable[[_T], str] | None = None, *,
           is_task: Callable[[_T], bool] | None = None) -> list[_T]:
    """``items`` (in submission order) that ``query`` keeps, in the same order; sets ``query.left_out``.

    ``id_of``: an item's job id, needed when ``query.ids`` is set (ValueError without it).
    ``is_task``: whether an item is an array's task: with ``query.finished``, a finished task is
    left out and not counted (its array's row counts it), so a big array hides no other job.
    """
    if query.ids is not None:
        if id_of is None:
            raise ValueError("select: query.ids needs id_of")
        wanted = query.ids
        items = [i for i in items if id_of(i) in wanted]
    kept = [i for i in items if query.user is None or user_of(i) == query.user]
    if query.finished is not None and is_task is not None:
        kept = [i for i in kept if status_of(i) not in FINISHED_STATES or not is_task(i)]
    before = len(kept)
    if query.finished is not None:
        done = [i for i in kept if status_of(i) in FINISHED_STATES]
        drop = {id(i) for i in done[:max(0, len(done) - query.finished)]}
        kept = [i for i in kept if id(i) not in drop]
    if query.limit is not None and len(kept) > query.limit:
        kept = kept[len(kept) - query.limit:]
    query.left_out = before - len(kept)
    return kept
