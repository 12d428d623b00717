"""The read-only board: ``gpulayer tui --read-only``, and every viewer of ``gpulayer tui --serve``.

A read-only board shows what every user of the lab may see: the devices, the queue with each
job's state and reason, users' names and counts. It never cancels, never shows a log, a command,
an environment or a working directory, whoever runs it (an admin's board included).

This is enforced in the data, not only in the keys: the app's client is wrapped in
:class:`ReadOnlyApi`, whose ``cancel``, ``logs``, ``job`` and ``explain`` raise
:class:`ReadOnlyRefused` without asking the daemon, and whose listed jobs come concealed
(:func:`board_view`) as the daemon conceals another user's job, and more. The app also refuses to
open a job's detail or to ask for a cancel (:class:`gpulayer_tui.app.GpulayerApp`), and the Jobs
table does not offer those keys.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Collection

from gpulayer_tui.api import ApiRequestError, ChangeEvent, DaemonApi
from gpulayerd.models import ExplanationModel, HealthView, JobView, LogChunk, PeerView
from gpulayerd.models.metrics import MetricsView
from gpulayerd.models.views import ApiErrorBody

__all__ = ["HIDDEN", "READ_ONLY", "ReadOnlyApi", "ReadOnlyRefused", "board_view"]

HIDDEN = "<hidden>"
"""What a concealed job's command and paths read (as the daemon writes another user's)."""

READ_ONLY = "read-only board: no cancel, no job detail, no logs"
"""What the board says when a key asks for more than it shows."""


class ReadOnlyRefused(ApiRequestError):
    """A read-only board asked for what it may not do (HTTP-like status 403, code ``read_only``)."""

    def __init__(self, what: str) -> None:
        super().__init__(403, ApiErrorBody(code="read_only", message=f"{what}: {READ_ONLY}"))


def board_view(job: JobView) -> JobView:
    """``job`` as a read-only board shows it: id, name, user, state, place, reason and counts.

    The command is ``[HIDDEN]``; environment, working directory, PATH and shipping are dropped, as are
    the stored explanation, the attempts and the history; the working directory is written
    ``HIDDEN`` wherever else it appears (the reason).
    """
    spec = job.spec.model_copy(update={"command": [HIDDEN], "env": {}, "workdir": None, "path": None,
                                       "ship": None})
    view = job.model_copy(update={"spec": spec, "spec_hidden": True, "explanation": None, "attempts": [],
                                  "events": []})
    workdir = job.spec.workdir
    if not workdir or workdir == "/":
        return view
    dumped, escaped = view.model_dump_json(), json.dumps(workdir)[1:-1]
    return JobView.model_validate_json(dumped.replace(escaped, HIDDEN)) if escaped in dumped else view


class ReadOnlyApi:
    """``client`` for a read-only board (see the module): reads the queue, the peers and the metrics,
    conceals every job, refuses cancel, logs, a job's detail and its explanation.

    Args:
        client: the daemon's API (closed with this one).
    """

    def __init__(self, client: DaemonApi) -> None:
        self._client = client

    async def health(self) -> HealthView:
        return await self._client.health()

    async def peers(self) -> list[PeerView]:
        return await self._client.peers()

    async def jobs(self, statuses: list[str] | None = None, limit: int | None = None,
                   scope: str = "local", ids: Collection[str] | None = None) -> list[JobView]:
        jobs = await self._client.jobs(statuses=statuses, limit=limit, scope=scope, ids=ids)
        return [board_view(j) for j in jobs]

    async def job(self, job_ref: str) -> JobView:
        raise ReadOnlyRefused(f"job {job_ref}")

    async def explain(self, job_ref: str) -> ExplanationModel:
        raise ReadOnlyRefused(f"explain {job_ref}")

    async def cancel(self, job_ref: str) -> JobView:
        raise ReadOnlyRefused(f"cancel {job_ref}")

    async def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0,
                   attempt: int | None = None, *, limit: int | None = None) -> LogChunk:
        raise ReadOnlyRefused(f"logs of {job_ref}")

    async def metrics(self) -> MetricsView:
        return await self._client.metrics()

    def events(self) -> AsyncIterator[ChangeEvent]:
        return self._client.events()

    async def close(self) -> None:
        await self._client.close()
