"""What every layer agrees a job is (pure, no imports: the CLI reads it at start-up): its states in
order, which of them end it, whose job it is, and how many finished jobs a listing shows.

The one definition: :mod:`gpulayerd.core.protocol.claims` (the owner's state machine),
``gpulayerd.models`` (re-exported for the TUI), the CLI, the store's listings and the TUI use these.
"""

from __future__ import annotations

__all__ = ["ACTIVE_STATES", "FINISHED_SHOWN", "JOB_STATES", "TERMINAL_STATES", "job_user"]

JOB_STATES = (
    "queued", "claimed", "running", "succeeded", "failed", "timeout", "cancelled", "lost", "rejected",
)
"""Every state of a job, in the order of its life (``gpulayer jobs --state`` accepts these). ``timeout``:
its attempt reached its time limit (``--time``) and was stopped, its own exit code recorded."""

TERMINAL_STATES = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost", "rejected"})
"""States a job never leaves."""

ACTIVE_STATES = frozenset({"claimed", "running"})
"""States in which an attempt holds devices on a worker."""

FINISHED_SHOWN = 20
"""How many finished jobs ``gpulayer jobs`` and the TUI show unless asked for all: the latest ones
in submission order (older finished jobs are hidden; ``--all``, ``a`` in the TUI, shows them)."""


def job_user(spec_user: str | None, submitted_by: str | None) -> str:
    """Whose job it is: the account its spec names (set at submit from the submitter's kernel
    credentials), else who submitted it (jobs stored before specs named their user); "" if neither."""
    return spec_user or submitted_by or ""
