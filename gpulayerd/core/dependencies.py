"""Job dependencies, decided: ``--after ID[:ok|any|notok]`` (pure).

A job that names dependencies waits (reason ``Dependency``) until each is satisfied, as Slurm's
``afterok``/``afterany``/``afternotok``: ``ok`` (the default) when the job named succeeded, ``any``
when it ended however, ``notok`` when it ended otherwise than succeeded. An array is named by its
id and counts as the job it is: it succeeds when every task did, and ends when every task has. A
dependency that can no longer be satisfied (``ok`` of a job that failed, ``notok`` of one that
succeeded) ends the waiting job ``cancelled`` with ``DependencyNeverSatisfied``, as Slurm's
``kill_invalid_depend``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpulayerd.core.job_facts import TERMINAL_STATES

__all__ = [
    "After",
    "Condition",
    "DependencyError",
    "Never",
    "Satisfied",
    "Waiting",
    "cycle_through",
    "judge",
    "parse_after",
]


_JOB_REF = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")
"""A job id or id prefix as ``--after`` takes it (what the peer API accepts as one): at most 64
characters, letters, digits, ``_`` and ``-``."""


class DependencyError(ValueError):
    """A malformed dependency; the message names what is wrong and what is allowed."""


class Condition(str, enum.Enum):
    """When a dependency is satisfied (the job named has ended ...)."""

    OK = "ok"  # ... and succeeded
    ANY = "any"  # ... however
    NOTOK = "notok"  # ... otherwise than succeeded


@dataclass(frozen=True, slots=True)
class After:
    """One dependency: the job (or task, or array) ``job_id``, and when it is satisfied."""

    job_id: str
    condition: Condition = Condition.OK

    def __str__(self) -> str:
        return f"{self.job_id}:{self.condition.value}"


def parse_after(text: str) -> After:
    """``ID``, ``ID:ok``, ``ID:any`` or ``ID:notok`` (an id may be a unique prefix until resolved).

    Raises:
        DependencyError: an empty id, one that is no job id (over 64 characters, or other characters
            than letters, digits, ``_`` and ``-``), or another condition.
    """
    job_id, sep, cond = text.strip().partition(":")
    shown = repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text)} characters)"
    if not job_id:
        raise DependencyError(f"{shown}: no job id; allowed: ID, ID:ok, ID:any or ID:notok")
    if not _JOB_REF.fullmatch(job_id):
        raise DependencyError(f"{shown}: not a job id (at most 64 letters, digits, _ and -); allowed: ID, ID:ok, "
                              "ID:any or ID:notok")
    try:
        condition = Condition(cond) if sep else Condition.OK
    except ValueError as e:
        raise DependencyError(f"{shown}: condition {cond[:20]!r} is not one of ok, any, notok") from e
    return After(job_id, condition)


@dataclass(frozen=True, slots=True)
class Satisfied:
    """Every dependency is satisfied: the job may be scheduled."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """``after`` (the first dependency not yet satisfied) has not ended: the job waits."""

    after: After


@dataclass(frozen=True, slots=True)
class Never:
    """``after`` ended as ``status``, which can never satisfy it: the job is cancelled."""

    after: After
    status: str


def judge(deps: Sequence[After], states: Mapping[str, str | None]) -> Satisfied | Waiting | Never:
    """Whether ``deps`` are satisfied, given each named job's state.

    Args:
        deps: the dependencies, in the order written.
        states: job id -> its state (queued, ..., succeeded, failed, ...); None or missing: not known
            now (its owner did not answer): waits.

    Returns:
        :class:`Never` for the first dependency that can never be satisfied, else :class:`Waiting` for
        the first one not yet satisfied, else :class:`Satisfied`.
    """
    waiting: Waiting | None = None
    for after in deps:
        status = states.get(after.job_id)
        if status not in TERMINAL_STATES:
            waiting = waiting or Waiting(after)
            continue
        ok = status == "succeeded"
        if (after.condition is Condition.OK and not ok) or (after.condition is Condition.NOTOK and ok):
            return Never(after, status or "")
    return waiting or Satisfied()


def cycle_through(job_id: str, deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle through ``job_id`` (the ids in order, ``job_id`` first), or None.

    Args:
        job_id: the job being submitted (or changed).
        deps: job id -> the ids it depends on (those of ``job_id`` included).
    """
    # Depth first without recursion (a chain of thousands of waiting jobs is no RecursionError): each frame is a
    # node on the path and the iterator over what it depends on.
    path: list[str] = [job_id]
    stack = [iter(deps.get(job_id, ()))]
    seen: set[str] = set()
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
        if nxt == job_id:
            return path
        if nxt not in seen:
            seen.add(nxt)
            path.append(nxt)
            stack.append(iter(deps.get(nxt, ())))
    return None
