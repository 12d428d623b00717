"""The table of ``gpulayer jobs``: columns chosen with ``-o`` (like squeue's), fitted to the terminal.

Widths are terminal cells (:func:`gpulayerd.text.width`: a CJK character takes two). The line
width is ``COLUMNS`` when set, else the terminal's when stdout is one, else unlimited (a pipe
gets every cell whole, and a column is not padded for one far longer cell: that cell overflows);
``--wide`` never cuts. When a line is too wide NAME and REASON give
way first (below :data:`NARROW` cells NAME down to 8 cells before REASON), then WHERE, USER
and OWNER; a cut cell ends in "…". REASON starts with the reason
code and the deciding words (:mod:`gpulayerd.core.reasons` puts file paths last), so its cut
end is the least useful part. Every cell is escaped (:func:`gpulayerd.text.escape`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence

from gpulayerd import text as fmt
from gpulayerd.cli.exits import UsageError
from gpulayerd.core.job_facts import job_user

TYPE_CHECKING = False  # `typing` costs ~2 ms of every CLI start; mypy reads this name as true
if TYPE_CHECKING:
    from gpulayerd.models import JobView

__all__ = ["COLUMNS", "DEFAULT", "NARROW", "columns_help", "default_columns", "line_width", "parse_columns",
           "render_jobs", "task_count", "tasks_by_index", "where_of"]

_GAP = "  "


class _Column:
    """A column: its header, a job's cell (None prints as "—"), its line in ``-o``'s help. A plain
    class: ``dataclasses`` costs 5 ms and ``typing.NamedTuple`` 2 ms of every CLI start."""

    __slots__ = ("header", "help", "value")

    def __init__(self, header: str, value: Callable[[JobView, float], str | None], help_line: str) -> None:
        self.header = header
        self.value = value
        self.help = help_line


def _user_of(j: JobView) -> str:
    return job_user(j.spec.user, j.submitted_by)


def where_of(j: JobView) -> str | None:
    """WHERE: the latest attempt's host and GPUs (kept after the job ends), else its holder."""
    if j.where_node is not None or j.where_hosts:
        return fmt.where(j.where_name or (j.where_node or "")[:12], j.where_devices, j.where_hosts)
    return j.holder_name or (j.holder[:12] if j.holder else None)


def _reason(j: JobView, _: float) -> str:
    from gpulayerd.cli.render import reason_cell

    return reason_cell(j, width=10**6)


COLUMNS: dict[str, _Column] = {
    "id": _Column("ID", lambda j, _: j.id, "job id"),
    "name": _Column("NAME", lambda j, _: j.name, "job name"),
    "user": _Column("USER", lambda j, _: _user_of(j) or None, "the account the job runs as"),
    "owner": _Column("OWNER", lambda j, _: j.owner_name or (j.owner or "")[:12] or None,
                     "the daemon the job was submitted to"),
    "state": _Column("STATE", lambda j, _: j.status, "queued, running, succeeded, failed, ..."),
    "where": _Column("WHERE", lambda j, _: where_of(j), "host and GPU indices of the latest attempt"),
    "age": _Column("AGE", lambda j, now: fmt.age(now - j.submitted_at), "time since submit"),
    "code": _Column("CODE", lambda j, _: j.reason_code or None, "the reason's code (Busy, Framework, ...)"),
    "reason": _Column("REASON", _reason, "why it waits or how it ended: code, then the deciding words"),
    "exit": _Column("EXIT", lambda j, _: None if j.exit_code is None else str(j.exit_code), "exit code"),
    "attempt": _Column("ATTEMPT", lambda j, _: str(j.attempt), "attempt number (retries count up)"),
    "submitted": _Column("SUBMITTED", lambda j, _: fmt.clock(j.submitted_at), "submit time (local)"),
}
"""Every column ``-o`` accepts, by name."""

DEFAULT = ("id", "name", "user", "state", "where", "age", "reason")
"""The columns without ``-o`` (``owner`` is added after ``user`` when jobs of several daemons are listed)."""

# (column, floor): shrink in this order, each down to its floor, until the line fits.
_SHRINK: tuple[tuple[str, int], ...] = (
    ("name", 32), ("reason", 64), ("name", 16), ("reason", 40), ("name", 12), ("where", 14), ("owner", 10),
    ("user", 8), ("name", 8), ("reason", 24), ("where", 6), ("owner", 6), ("name", 6), ("reason", 12),
    ("submitted", 10), ("user", 4), ("reason", 4), ("name", 3),
)

NARROW = 100
"""Below this many cells REASON has priority over NAME (:data:`_SHRINK_NARROW`): the deciding words
of why a job waits matter more than the rest of its name."""

_SHRINK_NARROW: tuple[tuple[str, int], ...] = (
    ("name", 16), ("name", 8), ("where", 14), ("owner", 10), ("user", 8), ("reason", 40), ("where", 6),
    ("owner", 6), ("reason", 24), ("name", 6), ("reason", 12), ("submitted", 10), ("user", 4), ("reason", 4),
    ("name", 3),
)


def default_columns(jobs: Sequence[JobView], me: str | None = None) -> list[str]:
    """The columns without ``-o``: :data:`DEFAULT`, without USER when every job is ``me``'s (the
    account running the CLI: nothing to tell apart), with OWNER after it when jobs of several
    daemons are listed. Another user's jobs always show whose they are."""
    columns = list(DEFAULT)
    if len(jobs) > 0 and {_user_of(j) for j in jobs} == {me}:
        columns.remove("user")
    if len({j.owner for j in jobs}) > 1:
        columns.insert(columns.index("state"), "owner")
    return columns


def parse_columns(spec: str) -> list[str]:
    """``-o``'s comma list ("id,state,reason", any case) as column names.

    Raises:
        UsageError: an unknown or empty column name (the message lists the allowed ones).
    """
    names = [n.strip().lower() for n in spec.split(",")]
    bad = [n for n in names if n not in COLUMNS]
    if bad or not names:
        raise UsageError(f"-o: unknown column {', '.join(repr(b) for b in bad) or repr(spec)}; "
                         f"columns: {','.join(COLUMNS)}")
    return names


def line_width(wide: bool) -> int | None:
    """The most cells a line may take: None (no limit) with ``--wide`` or when stdout is no
    terminal and ``COLUMNS`` is unset; else ``COLUMNS`` (a positive integer), else the terminal's."""
    if wide:
        return None
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        if not sys.stdout.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    return fmt.terminal_columns()  # shutil.get_terminal_size's answer, without importing shutil


def render_jobs(jobs: Sequence[JobView], columns: Sequence[str], limit: int | None, now: float | None = None) -> str:
    """The table of ``jobs`` with ``columns`` (names of :data:`COLUMNS`), every line at most
    ``limit`` terminal cells (None: no limit); a REASON (the last column) too long for its width goes
    on over more lines in its column. Unknown values print as "—"."""
    at = time.time() if now is None else now
    cells = [[fmt.escape(fmt.text(COLUMNS[c].value(j, at))) for c in columns] for j in jobs]
    headers = [COLUMNS[c].header for c in columns]
    if limit is None:  # a pipe: every cell whole, a column padded for most of its cells (fmt.padded_width)
        widths = [fmt.padded_width([fmt.width(r[i]) for r in cells], fmt.width(h)) for i, h in enumerate(headers)]
    else:
        widths = _fit(list(columns), [max([fmt.width(h), *(fmt.width(r[i]) for r in cells)])
                                      for i, h in enumerate(headers)], limit)

    def line(parts: Sequence[str]) -> str:
        if limit is None:
            return _GAP.join(fmt.ljust(p, w) for p, w in zip(parts, widths, strict=True)).rstrip()
        out = _GAP.join(fmt.ljust(fmt.cut(p, w), w) for p, w in zip(parts, widths, strict=True)).rstrip()
        return fmt.cut(out, limit)  # only when even the floors do not fit

    def lines(parts: Sequence[str]) -> list[str]:
        """One row; a REASON that is the last column and does not fit goes on over more lines in its
        column (the deciding words are never cut away)."""
        if limit is None or columns[-1] != "reason" or fmt.width(parts[-1]) <= widths[-1] or widths[-1] < 12:
            return [line(parts)]
        first, *rest = fmt.wrap(parts[-1], widths[-1])
        indent = " " * (sum(widths[:-1]) + len(_GAP) * (len(widths) - 1))
        return [line([*parts[:-1], first]), *(fmt.cut(indent + more, limit) for more in rest)]

    return "\n".join([line(headers), *(text for r in cells for text in lines(r))])


def _fit(columns: list[str], widths: list[int], limit: int) -> list[int]:
    """Widths shrunk along :data:`_SHRINK` (:data:`_SHRINK_NARROW` below :data:`NARROW` cells) until
    the line (with gaps) fits ``limit`` cells."""
    widths = list(widths)
    excess = sum(widths) + len(_GAP) * (len(widths) - 1) - limit
    for name, floor in _SHRINK_NARROW if limit < NARROW else _SHRINK:
        if excess <= 0:
            break
        if name not in columns:
            continue
        i = columns.index(name)
        give = min(excess, max(0, widths[i] - floor))
        widths[i] -= give
        excess -= give
    return widths


def columns_help() -> str:
    """``-o``'s help: every column name with what it shows."""
    return "; ".join(f"{n}: {c.help}" for n, c in COLUMNS.items())


def task_count(expr: str) -> str:
    """``20 tasks (at most 3 at once)`` for an accepted array expression (its task ids are ``ID_0``...)."""
    from gpulayerd.core.arrays import ArrayError, parse_array

    try:
        parsed = parse_array(expr, max_size=10**9)  # (the daemon accepted it under its own max_array_size)
    except ArrayError:
        return "tasks"
    at_once = f" (at most {parsed.max_running} at once)" if parsed.max_running else ""
    return f"{parsed.count} task{'s' if parsed.count != 1 else ''}{at_once}"


def tasks_by_index(jobs: list[JobView]) -> list[JobView]:
    """``jobs`` with each array's tasks in index order, in the places its tasks had (a task cancelled ahead
    is written, and listed, before the tasks materialized after it)."""
    from gpulayerd.core.arrays import split_task_id

    places: dict[str, list[tuple[int, int]]] = {}  # array id -> (place, task index) of its tasks
    for i, j in enumerate(jobs):
        task = split_task_id(j.id) if getattr(j, "array_id", None) else None  # (the listing has no spec.array_task)
        if task is not None:
            places.setdefault(task[0], []).append((i, task[1]))
    out = list(jobs)
    for at in places.values():
        for (i, _), (k, _) in zip(at, sorted(at, key=lambda p: p[1]), strict=True):
            out[i] = jobs[k]
    return out
