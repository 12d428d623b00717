"""Idempotent submission: whether ``POST /v1/jobs`` answered a job stored before under the same key.

A client sends a submission key with each job (``gpulayer submit`` makes a uuid4, or ``--key``);
the owner (:meth:`gpulayerd.app.owner.owner.OwnerService.submit_keyed`) stores nothing for a key it
has seen and answers that job, if the spec is the same (else
:class:`gpulayerd.errors.SubmissionKeyReused`, HTTP 409), like Stripe's idempotency keys; it returns
a :class:`Submitted` that says so, and the local API tells the client with the header
:data:`REPLAYED_HEADER` (``true``).
"""

from __future__ import annotations

TYPE_CHECKING = False  # this module is read by the CLI too: no typing or pydantic at run time
if TYPE_CHECKING:
    from gpulayerd.models import JobSpec, JobView

__all__ = ["REPLAYED_HEADER", "Submitted", "same_spec"]

REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header of ``POST /v1/jobs``: ``true`` when the answer is a job stored before with that key."""


class Submitted:
    """What one submission did: the job, and ``replayed`` (True when it answered a job stored
    before under the same key, nothing stored now)."""

    __slots__ = ("job", "replayed")

    def __init__(self, job: JobView, replayed: bool) -> None:
        self.job = job
        self.replayed = replayed


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
