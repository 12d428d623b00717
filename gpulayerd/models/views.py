"""API bodies: jobs, their attempts and history, logs, errors, health and peers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from gpulayerd.core.reasons import code_for
from gpulayerd.core.users import may_manage
from gpulayerd.models.capabilities import Capabilities
from gpulayerd.models.explanation import ExplanationModel, HolderView, PlacementModel
from gpulayerd.models.spec import JobSpec

__all__ = [
    "ApiErrorBody",
    "ArraySummary",
    "AttemptView",
    "EventView",
    "HealthView",
    "JobList",
    "JobView",
    "LogChunk",
    "PeerView",
    "ReportRowView",
    "ReportView",
    "SubmitRequest",
    "UserHoldingView",
    "UserUsageView",
]


class SubmitRequest(BaseModel):
    """``POST /v1/jobs`` body: a job spec (already resolved: absolute workdir)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any]
    submitted_by: str = ""
    """Ignored: the daemon takes the user from the kernel (``SO_PEERCRED``)."""
    path: str = ""
    """The submitter's ``PATH`` (the CLI captures it); the job runs with it."""
    key: str = ""
    """The submission key the client made (``gpulayer submit``: a uuid4; at most 128 printable
    ASCII characters): unique per user, a retry with the same key gets the job stored the first
    time, never a second one (empty: no key)."""


class AttemptView(BaseModel):
    """One attempt of a job: where it ran and how it ended."""

    model_config = ConfigDict(extra="ignore")

    attempt: int
    worker: str
    worker_name: str | None = None
    state: str
    placement: PlacementModel | None = None
    gang: list[str] = Field(default_factory=list)
    """Node ids of a multi-host job's members, by node rank (empty for a one-host job)."""
    run_dir: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""


class EventView(BaseModel):
    """One row of a job's append-only history."""

    model_config = ConfigDict(extra="ignore")

    seq: int
    at: float
    kind: str
    from_status: str | None = None
    to_status: str | None = None
    attempt: int | None = None
    reason: str = ""
    stimulus_id: str = ""


class JobView(BaseModel):
    """A job as the API shows it (``gpulayer show --json``).

    Everyone sees every job's id, name, user, state, place and reason. The job's command,
    environment, workdir and PATH are for its user and admins only: anyone else gets the
    view with ``spec_hidden`` true and a spec that keeps ``name``, ``requirements``,
    ``distributed``, ``policy`` and ``user`` while ``command`` is ``["<hidden>"]``, ``env``
    is empty and ``workdir`` and ``path`` are null (:func:`gpulayerd.app.common.requester.conceal`).

    Attributes:
        submitted_by: the user the job belongs to (its submitter's account, from the kernel).
        status: queued, claimed, running, succeeded, failed, timeout, cancelled, lost or rejected.
        reason: the last state change's reason, or for a waiting job why it waits:
            ``"<Code>: <words>"`` (:mod:`gpulayerd.core.reasons`).
        reason_code: the code of ``reason`` (``Busy``, ``Framework``, ...; ``Pending`` for a
            queued job not judged yet, ``Rejected`` for a rejected one, ``""`` for other states).
        holder: node id of the worker running the current attempt.
        holder_name: that worker's host name, when known.
        explanation: the last explanation (waiting and rejected jobs).
        where_*: where the latest attempt ran or runs (node, host name, device indices,
            a multi-host job's hosts): WHERE of ``gpulayer jobs``, kept for finished jobs.
        spec_hidden: True when the requester is neither the job's user nor an admin (see above).
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    name: str | None = None
    submitted_by: str = ""
    owner: str | None = None
    """Node id of the daemon that owns the job (where it was submitted)."""
    owner_name: str | None = None
    status: str
    attempt: int = 0
    holder: str | None = None
    holder_name: str | None = None
    retries_left: int = 0
    cancel_requested: bool = False
    reason: str = ""
    exit_code: int | None = None
    submitted_at: float
    updated_at: float
    spec: JobSpec
    spec_hidden: bool = False
    explanation: ExplanationModel | None = None
    attempts: list[AttemptView] = Field(default_factory=list)
    events: list[EventView] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reason_code(self) -> str:
        """The short code ``reason`` starts with (see the class docstring); in ``--json``."""
        return code_for(self.status, self.reason)
    where_node: str | None = None
    """Node id of the worker of the job's latest attempt, kept after the job ends (None: it
    has not run, or it waits again for a retry). A multi-host job: the owner; see ``where_hosts``."""
    where_name: str | None = None
    """That worker's host name, when known."""
    where_devices: list[int] = Field(default_factory=list)
    """Device (GPU) indices the latest attempt was given on ``where_node`` (empty: CPU only, or a
    multi-host job, whose devices each member chose)."""
    where_hosts: list[str] = Field(default_factory=list)
    """A multi-host job's hosts (names, else node ids) by node rank; empty for a one-host job."""
    array_id: str | None = None
    """A task of an array (``ID_7``): the array's id."""
    array: ArraySummary | None = None
    """An array's own job (``ID``): its tasks counted by state (``gpulayer jobs`` shows it as one line)."""
    position: int | None = None
    """A waiting job (``show``): its place among the jobs queued at its owner that want the same devices
    (the same requirements), in submission order; 1: next. None: not a waiting job, or not asked."""
    holders: list[HolderView] = Field(default_factory=list, max_length=64)
    """A waiting job (``show``): the jobs holding the devices it waits for (on the workers where it fits
    but they are busy)."""
    estimate: str | None = None
    """A waiting job (``show``): when it may start, in words, with the basis (``unknown`` without one)."""
    usual_duration_s: float | None = None
    """A running job (``show``): the median duration (s) of its user's earlier succeeded runs of the same
    command, computed by its owner (the command never leaves it); None: no such run."""
    usual_runs: int = 0
    """How many runs ``usual_duration_s`` is the median of."""


class ArraySummary(BaseModel):
    """An array's tasks: ``total`` in all, ``max_running`` at once (None: no ``%MAX``), and how many are
    in each state (``pending``: not materialized yet; the job states for the others)."""

    expr: str
    total: int
    max_running: int | None = None
    counts: dict[str, int] = Field(default_factory=dict)


class JobList(BaseModel):
    """A list of jobs (a peer's own jobs, for ``gpulayer jobs`` across the cluster)."""

    model_config = ConfigDict(extra="ignore")

    jobs: list[JobView] = Field(default_factory=list)


LOG_CHUNK_BYTES = 1 << 20
"""The most one :class:`LogChunk` carries (1 MiB): the default and the largest ``limit`` of a log read."""


class LogChunk(BaseModel):
    """``GET /v1/jobs/{id}/logs``: bytes ``[offset, next_offset)`` of one log, as text.

    A reader that wants a window asks for ``limit`` bytes from ``offset``, e.g. the last 64 KiB
    with ``offset = size - 65536`` (``size`` from any earlier chunk). ``data`` is decoded as UTF-8
    (invalid bytes as U+FFFD), so its length in bytes may differ from ``next_offset - offset``:
    read on from ``next_offset``.
    """

    model_config = ConfigDict(extra="ignore")

    job_id: str
    attempt: int
    stream: Literal["stdout", "stderr"]
    offset: int
    next_offset: int
    data: str
    complete: bool
    """True when the job has ended and the chunk reaches the end of the log."""
    size: int | None = None
    """The log's whole size in bytes when it was read (None: not told, by an older daemon)."""


class ApiErrorBody(BaseModel):
    """The body of every API error: a stable code, a message and details."""

    model_config = ConfigDict(extra="ignore")

    code: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class RequesterView(BaseModel):
    """Who asks the local API, as the daemon sees them (from the kernel's peer credentials of the
    socket, never from the request).

    Attributes:
        uid: the asking process's user id.
        user: its account name (``"uid N"`` when the user database has none).
        admin: may cancel any job and read any job's logs and spec (root; a member of the admin
            group in system mode; the daemon's own user in personal mode). Others manage only
            their own jobs.
    """

    model_config = ConfigDict(extra="ignore")

    uid: int
    user: str
    admin: bool = False

    def may_manage(self, owner_user: str) -> bool:
        """True if this requester may cancel, read the logs and see the full spec of a job of ``owner_user``
        (:func:`gpulayerd.core.users.may_manage`, the rule the daemon checks)."""
        return may_manage(self.user, self.admin, owner_user)


class HealthView(BaseModel):
    """``GET /v1/health``."""

    model_config = ConfigDict(extra="ignore")

    ok: bool
    version: str
    node_id: str
    hostname: str
    pid: int
    state_dir: str
    counters: dict[str, int] = Field(default_factory=dict)
    """Protocol counters: offers sent/received, claims sent/granted/denied/failed, ..."""
    requester: RequesterView | None = None
    """Who asked this health (the TUI offers cancel on the jobs they may manage); None from a daemon
    before this field."""
    ship_default: bool = False
    """The daemon's ``ship`` setting (a lab default): ``gpulayer submit`` ships the workdir of a job that
    does not say (``--ship``, ``--no-ship``, ``ship`` in its file)."""


class PeerView(BaseModel):
    """One gpulayerd this daemon knows of (``gpulayer peers``), itself included.

    Attributes:
        state: ``self``, ``up``, ``suspect`` (missed heartbeats), ``down``, or ``foreign``
            (another cluster: listed, never used).
        trusted: True if it proved membership of our cluster (mutual TLS).
        last_heartbeat_at: wall-clock time of its last heartbeat (seconds since the epoch).
        capabilities: its devices and environments, when fetched.
    """

    model_config = ConfigDict(extra="ignore")

    node_id: str
    name: str
    addresses: list[str] = Field(default_factory=list)
    port: int | None = None
    version: str | None = None
    cluster: str | None = None
    trusted: bool = False
    state: str = "up"
    last_heartbeat_at: float | None = None
    capabilities: Capabilities | None = None


class UserHoldingView(BaseModel):
    """What one user's runs hold on one host now (fair share)."""

    model_config = ConfigDict(extra="ignore")

    node_id: str
    host: str
    gpus: int = 0
    cpu_slots: int = 0


class UserUsageView(BaseModel):
    """One user known to this daemon's fair-share book (``GET /v1/users``, ``gpulayer users``).

    Attributes:
        gpu_hours: decayed GPU-seconds / 3600 (half-life ``fairshare_half_life_s``).
        cpu_slot_hours: decayed CPU-slot-seconds / 3600.
        score: ``gpu-seconds + 0.1 × CPU-slot-seconds`` (lower is served first).
        rank: 1 for the user served first; users with equal scores share a rank.
        jobs_queued / jobs_running: this daemon's jobs of the user in those states.
        holding: what the user's runs hold now, per host (as each host last reported).
    """

    model_config = ConfigDict(extra="ignore")

    user: str
    gpu_hours: float = 0.0
    cpu_slot_hours: float = 0.0
    score: float = 0.0
    rank: int = 1
    jobs_queued: int = 0
    jobs_running: int = 0
    holding: list[UserHoldingView] = Field(default_factory=list)


class ReportRowView(BaseModel):
    """One row of ``gpulayer report``: a user, host or GPU model over the period.

    Attributes:
        key: the user, the host (its name) or the GPU model (``cpu`` for CPU-only attempts).
        jobs: jobs that ended in the period; failures: of them, failed, timed out or lost.
        gpu_hours: GPU-seconds held within the period / 3600 (not decayed); cpu_slot_hours likewise.
        median_wait_s: the median of the ended jobs' waits, submit to first start (s); None without any.
        waits: the wait samples (s; at most 10,000): what a lab-wide report merges.
    """

    model_config = ConfigDict(extra="ignore")

    key: str = Field(max_length=300)
    jobs: int = 0
    failures: int = 0
    gpu_hours: float = 0.0
    cpu_slot_hours: float = 0.0
    median_wait_s: float | None = None
    waits: list[float] = Field(default_factory=list, max_length=10_000)


class ReportView(BaseModel):
    """``GET /v1/report`` (``gpulayer report``): accounting over a period, by user, host or GPU model.

    Attributes:
        scope: ``daemon`` (the jobs owned by this daemon) or ``lab`` (every owner that answered).
        owners: the owners whose jobs it covers (names); missing: the peers up that did not answer.
        since, until: the period, wall s.
        by: ``user``, ``host`` or ``gpu-model``.
    """

    model_config = ConfigDict(extra="ignore")

    scope: str
    owners: list[str] = Field(default_factory=list, max_length=10_000)
    missing: list[str] = Field(default_factory=list, max_length=10_000)
    since: float
    until: float
    by: str
    rows: list[ReportRowView] = Field(default_factory=list, max_length=100_000)
