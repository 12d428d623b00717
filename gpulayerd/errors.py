"""Domain errors of the daemon's services.

The services raise these (and the peer errors at the end: a failed call to a peer, a refusal,
a malformed peer message); the local API (:mod:`gpulayerd.api.server`) maps each
``code`` to an HTTP status and a stable error body, and the CLI maps the body's code
to an exit status (``not_found`` and ``bad_request`` are usage errors, exit 2).
"""

from __future__ import annotations

__all__ = ["AmbiguousJob", "BadRequest", "Forbidden", "GpulayerError", "InvalidSpec", "NoSuchJob", "PeerBadRequest",
           "PeerCallError", "PeerRefused", "PeerUnreachable", "SubmissionKeyReused"]


class GpulayerError(Exception):
    """Base of every domain error: ``code`` is stable, ``message`` is for people."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoSuchJob(GpulayerError):
    """No job (or no such attempt of a job) matches the reference given."""

    code = "not_found"


class AmbiguousJob(GpulayerError):
    """A job id prefix matches more than one job."""

    code = "ambiguous_id"


class BadRequest(GpulayerError):
    """A request field has a value outside the allowed ones (the message names both)."""

    code = "bad_request"


class InvalidSpec(GpulayerError):
    """A job spec that cannot be accepted at all (not stored)."""

    code = "invalid_spec"


class SubmissionKeyReused(GpulayerError):
    """A submission key that was used before for a job with a different spec (HTTP 409): a key
    names one submission, so its reuse with another spec is refused, never answered with the old job."""

    code = "key_conflict"


class Forbidden(GpulayerError):
    """The requester may not do this (another user's job, another account's personal daemon)."""

    code = "forbidden"


class PeerUnreachable(GpulayerError):
    """The peer that holds what was asked for did not answer."""

    code = "peer_unreachable"


# ---------------------------------------------------------------------------- the peer protocol


class PeerCallError(Exception):
    """A call to a peer failed: unreachable, TLS refused, timed out, or an error reply."""


class PeerRefused(PeerCallError):
    """The peer answered 403: the sender does not hold the role the route needs (see
    :mod:`gpulayerd.routes`), and nothing changed there. ``reason`` is the peer's own words
    (``job 0123 belongs to alice``); the message adds where it was refused."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = message if reason is None else reason


class PeerBadRequest(Exception):
    """Raised by a peer route's handler: the message is malformed (e.g. a log offset out of range);
    answered 400, nothing changed."""
