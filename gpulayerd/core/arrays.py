"""Job arrays, decided: the ``--array`` expression, task ids and late materialization (pure).

An array is one submission of many tasks, as Slurm's ``--array`` and HTCondor's late
materialization: ``0-99`` (indices 0 to 99), ``0-99:2`` (every second), ``1,5,9`` (a list),
each with an optional ``%MAX`` (at most MAX tasks queued or running at once, lab-wide: only the
array's owner materializes its tasks, so the bound holds wherever they run). The array is one job
row (``ID``); a task becomes a job row of its own (``ID_7``, Slurm's task id) only when it is
materialized: while fewer than ``MAX`` (or :data:`WINDOW` without one) of its tasks are queued or
running, the next indices in order. So a 100,000-task array is one row plus the tasks that run or
ran. Materialization is a count of positions taken from a cursor (:func:`to_materialize`): the
store writes the rows and the new cursor in one transaction, so no index is materialized twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_ARRAY_SIZE",
    "LOW_WATER",
    "WINDOW",
    "ArrayError",
    "ArraySpec",
    "parse_array",
    "shown_state",
    "split_task_id",
    "task_command",
    "task_id",
    "to_materialize",
]

DEFAULT_MAX_ARRAY_SIZE = 10_000
"""Most tasks one array may have (the daemon's ``max_array_size`` setting by default)."""

WINDOW = 256
"""Most tasks of an array without ``%MAX`` queued or running at once (materialized ahead)."""

LOW_WATER = WINDOW - 64
"""An array without ``%MAX`` materializes again only once at most this many of its tasks are queued or
running (then up to :data:`WINDOW`): its tasks are written, and judged by the scheduler, in batches of at
least ``WINDOW - LOW_WATER`` (64), not one or two at each end of a task; a lab with more free slots than
that still keeps at least ``LOW_WATER`` of them running."""

MAX_INDEX = 10_000_000
"""The largest task index accepted (Slurm's MaxArraySize is at most 4,000,001)."""

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::(-?[0-9]+))?)?")  # ASCII digits only
_ALLOWED = ("a range START-END (0-99), with a step (0-99:2), or a list (1,5,9), each with an optional %MAX "
            "(0-99%8): indices 0 to 10000000, at most max_array_size tasks")


class ArrayError(ValueError):
    """A malformed or out-of-range array expression; the message names what is wrong and what is allowed."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """A parsed array expression.

    Attributes:
        indices: the task indices in the order they are materialized (ascending ranges, a list as
            written, duplicates refused).
        max_running: at most this many tasks queued or running at once (``%MAX``); None: no bound
            but :data:`WINDOW`.
    """

    indices: tuple[int, ...]
    max_running: int | None = None

    @property
    def count(self) -> int:
        """How many tasks the array has."""
        return len(self.indices)

    def index_at(self, position: int) -> int:
        """The task index materialized at ``position`` (0 first)."""
        return self.indices[position]


def parse_array(text: str, max_size: int = DEFAULT_MAX_ARRAY_SIZE) -> ArraySpec:
    """Parse ``--array`` / ``array =``: ``0-99``, ``0-99:2``, ``1,5,9``, ``3``, each with ``%MAX``.

    Args:
        text: the expression as the user wrote it.
        max_size: most tasks allowed (the daemon's ``max_array_size``).

    Raises:
        ArrayError: malformed (``5-1`` reversed, step 0, ``%0``, not numbers), an index out of
            range, a duplicate index, or more tasks than ``max_size``; the message says which.
    """
    body, sep, limit = text.strip().partition("%")
    max_running: int | None = None
    if sep:
        if not re.fullmatch(r"[0-9]{1,9}", limit) or int(limit) < 1:
            raise ArrayError(f"{text!r}: %MAX must be a whole number of at least 1 (got {limit!r}); allowed: "
                             + _ALLOWED)
        max_running = int(limit)
    if not body:
        raise ArrayError(f"{text!r}: no indices; allowed: {_ALLOWED}")
    indices: list[int] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ArrayError(f"{text!r}: {part!r} is not an index, a range or a range with a step; allowed: "
                             + _ALLOWED)
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) is not None else start
        step = int(m.group(3)) if m.group(3) is not None else 1
        if step < 1:
            raise ArrayError(f"{text!r}: step {step} in {part!r} must be at least 1; allowed: {_ALLOWED}")
        if end < start:
            raise ArrayError(f"{text!r}: range {part!r} is reversed (end {end} < start {start}); allowed: "
                             + _ALLOWED)
        if end > MAX_INDEX:
            raise ArrayError(f"{text!r}: index {end} is above {MAX_INDEX}; allowed: {_ALLOWED}")
        if len(indices) + (end - start) // step + 1 > max_size:
            raise ArrayError(f"{text!r}: more than max_array_size = {max_size} tasks; allowed: {_ALLOWED}")
        indices.extend(range(start, end + 1, step))
    if len(set(indices)) != len(indices):
        raise ArrayError(f"{text!r}: an index appears twice; allowed: {_ALLOWED}")
    return ArraySpec(tuple(indices), max_running)


def to_materialize(spec: ArraySpec, materialized: int, active: int) -> int:
    """How many more tasks to materialize now (the next positions from ``materialized``).

    Args:
        spec: the array.
        materialized: positions materialized so far (the cursor).
        active: the array's tasks now queued, claimed or running.

    Returns:
        At least 0; never more than lets ``active`` exceed ``max_running`` (or :data:`WINDOW`), never
        past the last position; 0 for an array without ``max_running`` while more than
        :data:`LOW_WATER` of its tasks are active.
    """
    if spec.max_running is None and active > LOW_WATER:
        return 0
    bound = spec.max_running if spec.max_running is not None else WINDOW
    return max(0, min(bound - active, spec.count - materialized))


def task_id(array_id: str, index: int) -> str:
    """A task's job id, Slurm style: ``ID_7``."""
    return f"{array_id}_{index}"


def split_task_id(job_id: str) -> tuple[str, int] | None:
    """``(array id, index)`` of a task id ``ID_7``; None for any other id."""
    array_id, sep, index = job_id.rpartition("_")
    if not sep or not array_id or not (index.isascii() and index.isdigit()) or len(index) > 9:
        return None  # (only 0-9: str.isdigit also takes other scripts' digits, which int() reads)
    return array_id, int(index)


def task_command(command: list[str], index: int) -> list[str]:
    """The command with every ``{task}`` replaced by the task's index."""
    return [arg.replace("{task}", str(index)) for arg in command]


def shown_state(stored: str, counts: Mapping[str, int]) -> str:
    """The state an array shows: its row is stored ``queued`` until every task has ended; it shows
    ``running`` while any task is claimed or running.

    Args:
        stored: the array's row's state.
        counts: its tasks by state (``pending`` for those not materialized).
    """
    if stored == "queued" and (counts.get("running") or counts.get("claimed")):
        return "running"
    return stored

