"""What the jobs table shows, without widgets: a job's row, the filter, the sort orders, column widths
(and the widest cells they follow), which finished jobs are hidden as old, and which tasks of arrays
are folded into their array's row.

Every text that comes from a user or a peer (names, reasons, users, hosts) is escaped with
:func:`gpulayerd.text.escape` here, before any terminal sees it; rows are drawn as plain
segments, so Rich markup in a name is shown as typed, never interpreted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from rich.cells import cell_len

from gpulayer_tui.state import TERMINAL
from gpulayerd import text as fmt
from gpulayerd.models import FINISHED_SHOWN, JobView, job_user

__all__ = [
    "COLUMNS",
    "FILTER_KEYS",
    "SORTS",
    "SORT_COLUMN",
    "ArrayFold",
    "ColumnNeeds",
    "JobFilter",
    "OldFinished",
    "Row",
    "column_widths",
    "job_cells",
    "reason_cell",
    "sort_key",
    "sort_label",
    "sort_mark",
    "submission_key",
]


class Row(NamedTuple):
    """The text of one job's row, a field per column of :data:`COLUMNS` (all escaped)."""

    id: str
    state: str
    reason: str
    name: str
    user: str
    where: str
    age: str


COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "ID"),
    ("state", "STATE"),
    ("reason", "REASON"),
    ("name", "NAME"),
    ("user", "USER"),
    ("where", "WHERE"),
    ("age", "AGE"),
)
"""(key, header) of each column, in order: the state and the reason (code first) right after the id."""

FIXED: dict[str, int] = {"id": 12, "age": 4}
"""Widths in cells of the columns whose text has one width (a job id; an age such as "17m")."""

LEAST: dict[str, int] = {"state": 7, "where": 12}
"""Cells these columns take even when their cells are narrower: the states of a live queue
("running", "queued", "claimed") and a host name with a GPU fit, so a job that starts repaints
one line, not the whole table with new widths (a finished or cancelling job's longer state
widens STATE once)."""

NARROW = 90
"""Below this many columns ID gives way to REASON (the highlighted job's id is in the status line)."""

SHRINK_WIDE: tuple[tuple[str, int], ...] = (
    ("name", 32), ("reason", 64), ("where", 16), ("name", 20), ("user", 12), ("reason", 48), ("name", 14),
    ("where", 12), ("id", 0), ("reason", 32), ("user", 8), ("name", 8), ("where", 8), ("reason", 16),
    ("name", 6), ("user", 4), ("where", 0), ("reason", 8),
)
"""From 100 columns on: (column, floor) in the order columns give way when the content is wider than
the terminal (:func:`gpulayerd.text.fit_widths`): a long NAME first, REASON keeps 64 cells before
WHERE and NAME go on, and 48 (its code and the deciding words) until ID is hidden too."""

SHRINK_NARROW: tuple[tuple[str, int], ...] = (
    ("name", 16), ("where", 16), ("user", 8), ("name", 12), ("where", 12), ("id", 0), ("reason", 56), ("where", 0),
    ("reason", 48), ("name", 10), ("reason", 40), ("user", 6), ("name", 8), ("user", 4), ("reason", 24),
    ("name", 6), ("reason", 8),
)
"""Below 100 columns REASON comes before NAME and WHERE: WHERE is hidden (the status line under the
table names it) before REASON goes below 56 cells, NAME goes to 10 cells before REASON below 48."""

_GIVE_BACK = ("reason", "name", "where", "user")
"""Cells a step freed beyond the need go back to the columns it cut, in this order."""

SORTS: tuple[str, ...] = ("submitted", "state", "reason", "name", "user", "where")
"""Sort orders that ``s`` cycles through (``S`` reverses); ties keep submission order."""

SORT_COLUMN: dict[str, str] = {"submitted": "age", "state": "state", "reason": "reason", "name": "name",
                               "user": "user", "where": "where"}
"""The column whose header shows the ▲/▼ mark for each sort order (submission order: AGE, oldest
first, which shows as ▼ and reversed as ▲; every other order shows ▲ and reversed ▼)."""

_SORT_UP, _SORT_DOWN = "▲", "▼"


def sort_mark(order: str, reverse: bool) -> tuple[str, str]:
    """(key of the column whose header is marked, "▲" or "▼") for a sort order of :data:`SORTS`.

    Submission order marks AGE ▼ (oldest, the largest age, first); every other order ▲; reversed: the other.
    """
    down = reverse != (order == "submitted")
    return SORT_COLUMN.get(order, ""), _SORT_DOWN if down else _SORT_UP


def sort_label(order: str, reverse: bool) -> str:
    """A sort order as the header marks it: "AGE▼ oldest first", "AGE▲ newest first", "STATE▲", "STATE▼ reversed"."""
    key, mark = sort_mark(order, reverse)
    head = f"{dict(COLUMNS).get(key, key.upper())}{mark}"
    if order == "submitted":
        return f"{head} {'newest' if reverse else 'oldest'} first"
    return f"{head} reversed" if reverse else head


_STATE_RANK = {s: i for i, s in enumerate(
    ("running", "cancelling", "claimed", "queued", "failed", "timeout", "lost", "rejected", "cancelled",
     "succeeded"))}


def reason_cell(job: JobView) -> str:
    """A job's reason with its code first (``"Resources: cpu slots 0 free of 4 …"``), escaped, on one line.

    A queued job not judged yet reads ``Pending: …``; a finished job's reason has no code.
    """
    reason = fmt.escape(job.reason)
    code = job.reason_code
    if not code or reason.startswith(f"{code}:"):
        return reason
    return f"{code}: {reason}" if reason else code


def job_cells(job: JobView, now: float, devices: Mapping[tuple[str, int], str] | None = None) -> Row:
    """The text of a job's row (see :class:`Row`).

    Args:
        job: the job.
        now: wall time (seconds since the epoch) the age is measured to.
        devices: (node id, device index) -> the name WHERE shows instead of the index (a MIG
            instance: "vm MIG 3g.40gb on GPU 4"; :func:`gpulayer_tui.widgets.devices_table.mig_names`).
    """
    state = "cancelling" if job.cancel_requested and job.status not in TERMINAL else job.status
    if job.where_node is not None or job.where_hosts:  # kept after the job ends; GPU indices included
        node = job.where_node or ""
        names = {i: devices[(node, i)] for i in job.where_devices if (node, i) in devices} if devices else None
        where = fmt.where(job.where_name or node[:12], job.where_devices, job.where_hosts, names)
    else:
        where = job.holder_name or (job.holder[:12] if job.holder else None)
    return Row(
        id=fmt.escape(job.id),
        state=state,
        reason=reason_cell(job),
        name=fmt.escape(fmt.text(job.name)),
        user=fmt.escape(job_user(job.spec.user, job.submitted_by) or fmt.DASH),
        where=fmt.escape(fmt.text(where)),
        age=fmt.age(now - job.submitted_at),
    )


def sort_key(order: str) -> Callable[[Row], tuple[object, ...]] | None:
    """The key of a sort order of :data:`SORTS` over rows (None: submission order)."""
    if order == "submitted":
        return None
    if order == "state":
        return lambda row: (_STATE_RANK.get(row.state, 99),)
    col = [k for k, _ in COLUMNS].index(order)
    return lambda row: (row[col].lower(),)


def column_widths(width: int, *, show_user: bool, needs: Mapping[str, int]) -> tuple[int, ...]:
    """Cells of each column of :data:`COLUMNS` for a table ``width`` cells wide (0: hidden).

    Every column is preceded by one blank cell and the line ends with one. Each column is as
    wide as its widest cell (``needs``: column key -> cells of its widest cell), its header with
    the sort mark and :data:`LEAST` at least (ID and AGE: :data:`FIXED`); when that is wider than
    the terminal the columns give way along :data:`SHRINK_WIDE` (:data:`SHRINK_NARROW` below 100
    columns). REASON takes what is left over. ID is hidden below :data:`NARROW` columns, USER
    when ``show_user`` is False.
    """
    natural = []
    for key, header in COLUMNS:
        if (key == "id" and width < NARROW) or (key == "user" and not show_user):
            natural.append(0)
        else:
            natural.append(FIXED.get(key) or max(LEAST.get(key, 0), cell_len(header) + 1, needs.get(key, 0)))
    index = {k: i for i, (k, _) in enumerate(COLUMNS)}
    order = SHRINK_NARROW if width < 100 else SHRINK_WIDE
    widths = fmt.fit_widths(natural, width - 1, [(index[k], floor) for k, floor in order], gap=1)
    spare = width - 1 - sum(w + 1 for w in widths if w)
    for key in _GIVE_BACK:
        i = index[key]
        if spare > 0 and widths[i]:
            more = min(spare, natural[i] - widths[i])
            widths[i] += more
            spare -= more
    widths[index["reason"]] += max(0, spare)
    return tuple(widths)


_MEASURED = tuple((key, i) for i, (key, _) in enumerate(COLUMNS) if key in ("state", "reason", "name", "user", "where"))
"""Columns whose width follows their widest cell (:func:`column_widths`' ``needs``): (key, index)."""


class ColumnNeeds:
    """What the column widths follow: the widest cell of each measured column (``needs``, cells) and
    whether USER is shown (only while the shown rows have more than one user)."""

    def __init__(self) -> None:
        self.needs: dict[str, int] = {}
        self.show_user = True

    def reset(self, rows: Iterable[Row]) -> None:
        """Measure ``rows`` afresh."""
        self.needs = {}
        for row in rows:
            self.measure(row)

    def measure(self, row: Row) -> bool:
        """Count ``row`` in the widest cells; True when a column got wider."""
        wider = False
        for key, i in _MEASURED:
            n = cell_len(row[i])
            if n > self.needs.get(key, 0):
                self.needs[key] = n
                wider = True
        return wider

    def check_user(self, rows: Mapping[str, Row], added: Row | None = None) -> bool:
        """Whether USER is shown for the shown ``rows`` (``added``: the one row just added to them);
        True when that changed."""
        if added is not None and self.show_user:
            show = True  # one more row cannot make every user the same
        elif added is not None:  # every other shown row has one user: compare with any of them
            other = next((c for c in rows.values() if c is not added), added)
            show = other.user != added.user
        else:
            it = iter(rows.values())
            first = next(it, None)
            show = first is not None and any(c.user != first.user for c in it)
        changed, self.show_user = show != self.show_user, show
        return changed


_FIELDS = {"state": "state", "status": "state", "s": "state", "acc": "acc", "accelerator": "acc", "user": "user",
           "u": "user", "name": "name", "n": "name", "id": "id", "where": "where", "host": "where", "code": "code",
           "reason": "reason"}

FILTER_KEYS: tuple[str, ...] = ("state", "acc", "user", "name", "id", "where", "code", "reason")
"""The ``field:`` keys of the filter, as its help and its complaint about an unknown key list them
(``status:`` is ``state:``; ``s: u: n: host: accelerator:`` also work)."""


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What ``/`` typed: ``field:value`` terms and free words; a job is shown when all of them match.

    Fields: ``state:`` (prefix of the state: ``state:run``), ``acc:`` (the accelerator the job
    asks for, exactly: ``cpu``, ``cuda``, ``mps``, ``rocm``), ``user:``, ``name:``, ``id:``,
    ``where:``/``host:``, ``code:`` (the reason's code, exactly) and ``reason:`` (words in the
    reason); a value may list alternatives with commas (``state:queued,running``). Free words
    must appear somewhere in the row's text. All case-insensitive. An unknown ``field:value``
    (``stat:queued``) is matched as a free word and named in :attr:`unknown`, so the screen can
    say so instead of showing no job without a reason.
    """

    terms: tuple[tuple[str, tuple[str, ...]], ...] = ()
    words: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    """The unknown keys typed (``("stat",)``), in order, each once."""

    @classmethod
    def parse(cls, text: str) -> JobFilter:
        """The filter that ``text`` describes (empty text: everything matches)."""
        terms: list[tuple[str, tuple[str, ...]]] = []
        words: list[str] = []
        unknown: dict[str, None] = {}
        for token in text.lower().split():
            key, sep, value = token.partition(":")
            if sep and key in _FIELDS and value:
                terms.append((_FIELDS[key], tuple(v for v in value.split(",") if v)))
            else:
                words.append(token)
                if sep and value and key.isalpha():  # "stat:queued"; not "12:30", "Resources:"
                    unknown[key] = None
        return cls(tuple(terms), tuple(words), tuple(unknown))

    @property
    def problem(self) -> str:
        """What is wrong with the filter, in words ("" when nothing): the unknown keys and the known ones
        ("unknown key stat: · keys: state: acc: …")."""
        if not self.unknown:
            return ""
        keys = " ".join(f"{k}:" for k in FILTER_KEYS)
        named = ", ".join(f"{fmt.escape(k)}:" for k in self.unknown)
        return f"unknown key{'s' if len(self.unknown) > 1 else ''} {named} · keys: {keys}"

    @property
    def empty(self) -> bool:
        """True when everything matches."""
        return not self.terms and not self.words

    @property
    def names_state(self) -> bool:
        """True when a ``state:`` term picks the states (then every finished job it names is shown,
        as ``gpulayer jobs --state`` shows them)."""
        return any(field == "state" for field, _ in self.terms)

    def matches(self, job: JobView, row: Row) -> bool:
        """True when ``job`` (shown as ``row``) matches every term and word."""
        for field, values in self.terms:
            if not any(_term(field, v, job, row) for v in values):
                return False
        if self.words:
            hay = " ".join(row).lower()
            return all(w in hay for w in self.words)
        return True


def _term(field: str, value: str, job: JobView, row: Row) -> bool:
    if field == "state":
        return row.state.startswith(value) or job.status.startswith(value)
    if field == "acc":
        return job.spec.requirements.accelerator.value.lower() == value
    if field == "code":
        return job.reason_code.lower() == value
    return value in {"user": row.user, "name": row.name, "id": row.id, "where": row.where,
                     "reason": row.reason}[field].lower()



class OldFinished:
    """Which finished jobs are hidden as old, as ``gpulayer jobs`` hides them: all but the latest
    :data:`~gpulayerd.models.FINISHED_SHOWN` (in submission order) of those that match the filter.

    Attributes:
        seq: each job's number in submission order (the order first seen).
        finished: the finished jobs that match the filter.
        kept: the latest ``FINISHED_SHOWN`` of them (all of them while :attr:`active` is False).
        active: whether old finished jobs are hidden at all.
    """

    def __init__(self) -> None:
        self.seq: dict[str, int] = {}
        self.finished: set[str] = set()
        self.kept: set[str] = set()
        self.active = True
        self._next = 0

    def reset(self, job_ids: Iterable[str]) -> None:
        """Number ``job_ids`` (in submission order) afresh; nothing is finished."""
        self.seq = {k: i for i, k in enumerate(job_ids)}
        self._next = len(self.seq)
        self.finished = set()
        self.kept = set()

    def number(self, job_id: str) -> None:
        """Give a job not seen before the next number."""
        if job_id not in self.seq:
            self.seq[job_id] = self._next
            self._next += 1

    def is_last(self, job_id: str) -> bool:
        """Whether ``job_id`` is the latest job seen."""
        return self.seq.get(job_id) == self._next - 1

    def mark(self, job_id: str, finished: bool) -> bool:
        """Note whether a job is a finished job that matches the filter; True if that changed."""
        if finished == (job_id in self.finished):
            return False
        self.finished.symmetric_difference_update((job_id,))
        return True

    def forget(self, job_id: str) -> bool:
        """A job is gone; True if it was a finished one."""
        self.seq.pop(job_id, None)
        if job_id in self.finished:
            self.finished.discard(job_id)
            return True
        return False

    def update_kept(self) -> set[str]:
        """Recompute :attr:`kept`; returns the jobs that entered or left it."""
        if not self.active:
            kept: set[str] = set()
        elif len(self.finished) <= FINISHED_SHOWN:
            kept = set(self.finished)
        else:
            kept = set(heapq.nlargest(FINISHED_SHOWN, self.finished, key=self.seq.__getitem__))
        moved, self.kept = kept ^ self.kept, kept
        return moved

    def shown(self, job_id: str) -> bool:
        """Whether a job that matches the filter is shown (an old finished one is not, while active)."""
        return not self.active or job_id in self.kept or job_id not in self.finished

    @property
    def hidden_count(self) -> int:
        """How many finished jobs that match the filter are hidden."""
        return len(self.finished) - len(self.kept) if self.active else 0


class ArrayFold:
    """Which tasks of arrays are folded into their array's row, as ``gpulayer jobs`` shows an array
    (one line; the daemon counts its tasks by state in its REASON: ``Array: 3 running, 12 pending of
    20``): a task (``array_id`` set) is folded while its array's row is known and not unfolded.

    Attributes:
        unfolded: the arrays whose tasks are shown (ids), each task after its array in submission order.
    """

    def __init__(self) -> None:
        self.unfolded: set[str] = set()

    def folded(self, job: JobView, jobs: Mapping[str, JobView]) -> bool:
        """Whether ``job`` is a task hidden in its array's row (``jobs``: every job known, by id)."""
        return job.array_id is not None and job.array_id in jobs and job.array_id not in self.unfolded

    @staticmethod
    def array_of(job: JobView) -> str | None:
        """The array ``job`` is (its id) or is a task of; None: neither."""
        return job.array_id or (job.id if job.array is not None else None)

    def toggle(self, job: JobView) -> str | None:
        """Fold or unfold the tasks of ``job``'s array (``job``: the array or one of its tasks); its id
        (None: ``job`` is no array's)."""
        array_id = self.array_of(job)
        if array_id is not None:
            self.unfolded.symmetric_difference_update((array_id,))
        return array_id

    def forget(self, job_id: str) -> None:
        """A job is gone (an array's tasks, if any remain, are no longer folded into it)."""
        self.unfolded.discard(job_id)


def submission_key(job: JobView, seq: Mapping[str, int]) -> tuple[int, int]:
    """Where ``job`` goes in submission order (``seq``: job id -> its number): its own place; an
    unfolded task's: right after its array, by index."""
    array_id = job.array_id
    if array_id is not None and array_id in seq:
        index = job.id[len(array_id) + 1:]
        return seq[array_id], int(index) if index.isdigit() else 0
    return seq[job.id], -1

