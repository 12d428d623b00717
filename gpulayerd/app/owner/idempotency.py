"""Idempotent submission: whether ``POST /v1/jobs`` answered a job stored before under the same key.

A client sends a submission key with each job (``gpulayer submit`` makes a uuid4, or ``--key``);
the owner (:meth:`gpulayerd.app.owner.owner.OwnerService.submit`) stores nothing for a key it has seen
and answers that job, if the spec is the same (else
:class:`gpulayerd.errors.SubmissionKeyReused`, HTTP 409), like Stripe's idempotency keys. The
local API tells the client such an answer is a replay with the header :data:`REPLAYED_HEADER`
(``true``): the owner marks the :class:`SubmitOutcome` the API handler opened with
:func:`watch_submit` (a context variable holding a mutable object, so the mark survives a task
boundary between them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

TYPE_CHECKING = False  # this module is read by the CLI too: no typing or pydantic at run time
if TYPE_CHECKING:
    from gpulayerd.models import JobSpec

__all__ = ["REPLAYED_HEADER", "SubmitOutcome", "note_replay", "same_spec", "watch_submit"]

REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header of ``POST /v1/jobs``: ``true`` when the answer is a job stored before with that key."""


class SubmitOutcome:
    """What one submission did: ``replayed`` is True when it answered a job stored before."""

    __slots__ = ("replayed",)

    def __init__(self) -> None:
        self.replayed = False


_OUTCOME: ContextVar[SubmitOutcome | None] = ContextVar("gpulayerd_submit_outcome", default=None)


@contextlib.contextmanager
def watch_submit() -> Iterator[SubmitOutcome]:
    """Open a :class:`SubmitOutcome` for the submission made inside the ``with`` block."""
    outcome = SubmitOutcome()
    token = _OUTCOME.set(outcome)
    try:
        yield outcome
    finally:
        _OUTCOME.reset(token)


def note_replay() -> None:
    """Mark the watched submission (if any) as answered with a job stored before."""
    outcome = _OUTCOME.get()
    if outcome is not None:
        outcome.replayed = True


def same_spec(stored_json: str, spec: JobSpec) -> bool:
    """Whether the spec stored with a job (its ``spec_json``) is ``spec``, both normalised: the
    stored JSON validated again with ``spec``'s model (so fields added since read as their
    defaults) and both compared as JSON data. The submission key is not part of a spec. A stored
    spec that no longer validates is not the same."""
    try:
        before = type(spec).model_validate_json(stored_json)
    except ValueError:
        return False
    return bool(before.model_dump(mode="json") == spec.model_dump(mode="json"))
