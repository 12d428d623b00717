"""The rows ``GET /v1/jobs`` lists from the store, and arrays listed by the state they show.

:func:`select_rows` reads the rows a :class:`~gpulayerd.models.jobs_query.JobsQuery` keeps (the
latest finished ones by SQL, newest first with a ``LIMIT``; an array's finished tasks are never
among them: its row counts them). An array's row is stored ``queued`` until every task has ended
but shows ``running`` while a task runs (:func:`gpulayerd.core.arrays.shown_state`):
:func:`with_open_arrays` adds the open arrays' rows when the states asked for could include them,
and :func:`in_states` keeps the views whose shown state was asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from gpulayerd.core.arrays import split_task_id
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models import JobView
from gpulayerd.models.jobs_query import FINISHED_STATES, JobsQuery, select
from gpulayerd.store import JobRow, Store

__all__ = ["in_states", "is_task", "select_rows", "with_open_arrays"]


def is_task(row: JobRow) -> bool:
    """Whether ``row`` is an array's task (``ID_7``)."""
    return split_task_id(row.id) is not None


async def select_rows(store: Store, wanted: list[JobStatus] | None, query: JobsQuery,
                      user_of: Callable[[JobRow], str]) -> list[JobRow]:
    """The stored rows ``query`` keeps, in submission order (sets ``query.left_out``). Given ids, only
    those rows are read; without a user, the latest finished ones are read by SQL, not every stored
    job."""
    if query.ids is not None:
        rows = await store.jobs.jobs_by_ids(query.ids)
        rows = [r for r in rows if wanted is None or r.status in wanted]
        return select(rows, query, user_of, lambda r: r.status.value, lambda r: r.id, is_task=is_task)
    if query.user is not None or query.finished is None or query.limit is not None:
        return select(await store.jobs.list_jobs(wanted, None), query, user_of, lambda r: r.status.value,
                      is_task=is_task)
    states = set(wanted) if wanted is not None else set(JobStatus)
    done = {s for s in states if s.value in FINISHED_STATES}
    rows = await store.jobs.list_jobs(states - done, None) if states - done else []
    if done:
        latest, total = await store.arrays.latest_not_tasks([s.value for s in done], query.finished)
        rows += latest
        query.left_out = max(0, total - query.finished)
    rows.sort(key=lambda r: r.seq or 0)
    return rows


async def with_open_arrays(store: Store, rows: list[JobRow], wanted: Collection[JobStatus] | None) -> list[JobRow]:
    """``rows`` (selected by stored state) with the open arrays' rows added when ``wanted`` names a
    state an open array may show (``running``) but not ``queued``, the state they are stored in."""
    if wanted is None or JobStatus.QUEUED in wanted or JobStatus.RUNNING not in wanted:
        return rows
    have = {r.id for r in rows}
    more = [r for r in await store.jobs.jobs_by_ids(await store.arrays.open_ids()) if r.id not in have]
    return sorted([*rows, *more], key=lambda r: r.seq or 0) if more else rows


def in_states(views: list[JobView], statuses: Collection[str] | None) -> list[JobView]:
    """The views whose (shown) state is one of ``statuses`` (None: all): an array whose task runs is
    ``running``, not ``queued``."""
    if not statuses:
        return views
    return [v for v in views if v.status in statuses]
