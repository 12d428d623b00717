"""What the TUI needs from the daemon: the subset of :class:`gpulayerd.api.client.DaemonClient` it calls.

Tests and the benchmark pass a fake with the same methods; errors are the client's own
(:class:`DaemonUnreachable`, :class:`ApiRequestError`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from typing import Protocol

from gpulayerd.api.client import ApiRequestError, ChangeEvent, DaemonUnreachable, connection_problem
from gpulayerd.models import ExplanationModel, HealthView, JobView, LogChunk, PeerView
from gpulayerd.models.metrics import MetricsView

__all__ = ["ApiRequestError", "ChangeEvent", "DaemonApi", "DaemonUnreachable", "connection_problem"]


class DaemonApi(Protocol):
    """The local daemon's API as the TUI uses it."""

    async def health(self) -> HealthView:
        """Identity of the daemon (host name, version) and who asks (``requester``: user, admin or not)."""
        ...

    async def peers(self) -> list[PeerView]:
        """Every gpulayerd known, this one first, with capabilities."""
        ...

    async def jobs(self, statuses: list[str] | None = None, limit: int | None = None,
                   scope: str = "local", ids: Collection[str] | None = None) -> list[JobView]:
        """Jobs in submission order, without history; ``ids``: only these (at most ``MAX_IDS``), gone ones left out."""
        ...

    async def job(self, job_ref: str) -> JobView:
        """One job with attempts and history."""
        ...

    async def explain(self, job_ref: str) -> ExplanationModel:
        """A fresh explanation: verdict and the worker x requirement table."""
        ...

    async def cancel(self, job_ref: str) -> JobView:
        """Cancel a job."""
        ...

    async def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0,
                   attempt: int | None = None, *, limit: int | None = None) -> LogChunk:
        """A chunk of a job's log from byte ``offset``, at most ``limit`` bytes (None: up to 1 MiB)."""
        ...

    async def metrics(self) -> MetricsView:
        """This machine's live GPU metrics; reading them keeps the daemon's sampler running a few seconds."""
        ...

    def events(self) -> AsyncIterator[ChangeEvent]:
        """Changes as they happen; the first is ``resync``. Ends when the daemon goes away."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
