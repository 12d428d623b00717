"""Messages of the peer protocol (``/v1/peer/...`` over mutual TLS), versioned by path.

Every message carries a ``msg_id``; handlers are idempotent on (sender, msg id) and on
(job, attempt). The sender's node id is never taken from a message alone: the peer
API checks it against the node id of the TLS client certificate.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpulayerd.core.job_policy import WARN_SIGNALS
from gpulayerd.models import LOG_CHUNK_BYTES

__all__ = [
    "JOB_ACTIONS",
    "MAX_HOLDINGS_USERS",
    "MAX_JOB_MATCHES",
    "MAX_REVOKED",
    "MAX_STATUSES",
    "Ack",
    "Claim",
    "ClaimReply",
    "Commit",
    "EnrollJoin",
    "EnrollRenew",
    "EnrollReply",
    "Heartbeat",
    "HeartbeatReply",
    "Hold",
    "HoldReply",
    "JobMatches",
    "JobReply",
    "JobRequest",
    "JobsRequest",
    "Kill",
    "LogRequest",
    "Offer",
    "Release",
    "Revoked",
    "RunReport",
    "RunReportReply",
    "UsageReportRequest",
    "new_msg_id",
]


MAX_LEASE_S = 86_400.0
"""The longest lease (and hold) a peer may ask for, seconds: a job's ``policy.lease_s`` allows no more."""
MAX_HOLDINGS_USERS = 256
"""The most users a heartbeat's ``holdings`` may name."""


def new_msg_id() -> str:
    """A random message id (the idempotency key every message carries)."""
    return secrets.token_hex(8)


class _Msg(BaseModel):
    model_config = ConfigDict(extra="ignore")


MAX_REVOKED = 256
"""The most revocation entries one heartbeat carries."""


class Revoked(_Msg):
    """A revocation entry (:mod:`gpulayerd.net.revocation`): verified against the CA by each receiver."""

    node_id: str = Field(max_length=64)
    at: int
    sig: str = Field(max_length=200)


class HeartbeatReply(_Msg):
    """A daemon's own membership facts (the answer to a heartbeat, and its body).

    ``caps_digest`` changes whenever the daemon's capabilities (devices, grants,
    environments) change, so the receiver refetches them only then.
    """

    node_id: str
    name: str
    version: str
    cluster: str
    port: int
    addresses: list[str] = Field(default_factory=list)
    ep: str = ""
    caps_digest: str = ""
    holdings: dict[str, tuple[int, int]] | None = None
    """Fair share: what the SENDER holds now, user -> (GPUs, CPU slots) of the attempts
    starting or running on it; at most :data:`MAX_HOLDINGS_USERS` users. None: not sent."""
    revoked: list[Revoked] | None = Field(default=None, max_length=MAX_REVOKED)
    """Revocation entries the sender knows (signed by the CA; each receiver verifies them)."""

    @field_validator("holdings")
    @classmethod
    def _bounded(cls, v: dict[str, tuple[int, int]] | None) -> dict[str, tuple[int, int]] | None:
        if v is None:
            return v
        if len(v) > MAX_HOLDINGS_USERS:
            raise ValueError(f"holdings: at most {MAX_HOLDINGS_USERS} users, not {len(v)}")
        for user, (gpus, slots) in v.items():
            if len(user) > 256:
                raise ValueError("holdings: a user name is at most 256 characters")
            if not (0 <= gpus <= 1_000_000 and 0 <= slots <= 1_000_000):
                raise ValueError(f"holdings of {user[:32]!r}: GPUs and CPU slots must be 0 to 1000000")
        return v


class Heartbeat(HeartbeatReply):
    """Membership: sent every 1-2 s to every known peer (advisory, never used for safety)."""

    msg_id: str


class Offer(_Msg):
    """Owner -> worker: this queued job fits you; claim it if you can run it now."""

    msg_id: str
    owner: str
    job_id: str
    spec: dict[str, Any]
    lease_s: float = Field(ge=1.0, le=MAX_LEASE_S)
    submitted_at: float | None = Field(default=None, ge=0.0, le=1e11)
    """When the job was submitted (the owner's Unix time, s): a worker claims one user's offers in
    this order (None, from an older owner: in the order they arrived)."""


class Ack(_Msg):
    """A plain acknowledgement."""

    ok: bool = True
    reason: str = ""


class Claim(_Msg):
    """Worker -> owner: I re-checked locally and can run it now."""

    msg_id: str
    worker: str
    job_id: str
    placement: dict[str, Any] | None = None


class ClaimReply(_Msg):
    """Owner -> worker: GRANT (granted, the attempt number = fencing token) or DENY."""

    granted: bool
    attempt: int = 0
    lease_s: float = Field(default=0.0, ge=0.0, le=MAX_LEASE_S)
    spec: dict[str, Any] | None = None
    reason: str = ""


class RunReport(_Msg):
    """Worker -> owner: an attempt started, renews its lease, exited, or was lost."""

    msg_id: str
    worker: str
    job_id: str
    attempt: int
    kind: Literal["started", "renew", "exited", "lost"]
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    """A process's exit status (0 to 255), or -N: killed by signal N (what the owner stores and
    judges ``--retry-exit-codes`` by; an SQLite integer only holds 64 bits)."""
    reason: str = ""
    never_started: bool = False
    timed_out: bool = False
    """``exited`` at its time limit (``--time``): the job ends ``timeout`` or retries."""
    preflight_failed: bool = False
    """``lost`` (never started): its pre-flight check failed on this worker (``reason``: ``FRAMEWORK: error``);
    the owner queues the job again for another worker."""
    where: str = Field(default="", max_length=200, pattern=r"^[A-Za-z0-9._,\[\]-]*$")
    """``started``: where the attempt runs besides the worker (a Slurm worker: Slurm's node list), for WHERE.
    ``renew`` of an attempt not started yet may carry a ``reason``: the claimed job's when it is ``SlurmPending: ...``
    on one line (the owner keeps no other)."""


class RunReportReply(_Msg):
    """Owner -> worker. ``stale``: that attempt is not current any more; kill it."""

    ok: bool
    stale: bool = False
    current_attempt: int = 0


class Kill(_Msg):
    """Owner -> worker: stop this attempt (cancel, lost lease, gang abort)."""

    msg_id: str
    owner: str
    job_id: str
    attempt: int
    reason: str
    signal: str = ""
    """The name of the signal the job's processes get first (``cancel --signal``; "" is SIGTERM): one
    of :data:`~gpulayerd.core.job_policy.WARN_SIGNALS`; any other (KILL, STOP, a name this machine
    lacks) is read as "" so the kill still happens, with SIGTERM."""

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        return v if v in WARN_SIGNALS else ""


class LogRequest(_Msg):
    """Owner -> worker: bytes of a remote attempt's log (``limit``: at most that many, 1 to
    :data:`~gpulayerd.models.LOG_CHUNK_BYTES`, checked by the receiver; None: up to that; a worker
    from before ``limit`` sends up to that)."""

    job_id: str
    attempt: int
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = 0
    limit: int | None = None


JOB_ACTIONS = ("show", "explain", "logs", "cancel")
"""What a node may ask of another about a job (``/v1/peer/job/<action>``)."""

MAX_JOB_MATCHES = 16
"""The most job ids a :class:`JobMatches` names (in ``owned``, and in ``held``)."""


class JobRequest(_Msg):
    """Any node -> a job's owner (or a worker that runs it): a person's request about a job.

    ``/v1/peer/job/find`` takes ``job_id`` as an id prefix; ``/v1/peer/job/<action>`` (one of
    :data:`JOB_ACTIONS`) as an id. ``user`` is who asks on the sending node: the receiver
    believes the name only when the sender's certificate vouches for it
    (:func:`gpulayerd.core.users.vouches`), and decides itself, from its own ``admin_group``,
    whether that user is an admin there. ``admin`` is what the sender thinks and is not used.
    ``stream``, ``offset``, ``attempt``, ``rank`` and ``limit`` are for ``logs`` (``limit``: bytes,
    1 to :data:`~gpulayerd.models.LOG_CHUNK_BYTES`; None: up to that).
    """

    msg_id: str
    job_id: str = Field(max_length=64)
    user: str = Field(default="", max_length=256)
    admin: bool = False
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = Field(default=0, ge=0, le=2**53)
    attempt: int | None = None
    rank: int | None = Field(default=None, ge=0, le=4096)
    limit: int | None = Field(default=None, ge=1, le=LOG_CHUNK_BYTES)


MAX_STATUSES = 16
"""The most job states a :class:`JobsRequest` names."""


class UsageReportRequest(_Msg):
    """Any node -> an owner: its accounting of the jobs it owns over the last ``since_s`` seconds, by
    ``by`` (``gpulayer report --lab``): counts, GPU- and CPU-slot-hours and waits per user, host or
    GPU model, as every user of the lab may see them (``gpulayer users`` shows usage alike)."""

    msg_id: str
    since_s: float = Field(gt=0, le=10 * 366 * 86400.0)
    by: Literal["user", "host", "gpu-model"] = "user"


class JobsRequest(_Msg):
    """Any node -> an owner: the jobs it owns (for a person's ``gpulayer jobs`` on the sender).

    ``user`` is who asks on the sending node, believed only as far as the sender's certificate
    vouches for it: the owner conceals every other user's spec, as ``show`` does for the same
    requester, and environment values go only to the node that runs the job. ``statuses``: only
    jobs in these states (empty: all).
    """

    msg_id: str
    user: str = Field(default="", max_length=256)
    statuses: list[str] = Field(default_factory=list, max_length=MAX_STATUSES)


class JobMatches(_Msg):
    """The answer to ``/v1/peer/job/find``: the jobs the answering node owns whose id starts
    with the prefix (``owned``), and the runs it holds for other owners (``held``: job id ->
    owner node id), at most :data:`MAX_JOB_MATCHES` of each."""

    owned: list[str] = Field(default_factory=list, max_length=MAX_JOB_MATCHES)
    held: dict[str, str] = Field(default_factory=dict)

    @field_validator("held")
    @classmethod
    def _few(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_JOB_MATCHES:
            raise ValueError(f"held: at most {MAX_JOB_MATCHES} runs, not {len(v)}")
        return v


class JobReply(_Msg):
    """The answer to ``/v1/peer/job/<action>``: ``body`` (a JobView, ExplanationModel or
    LogChunk as JSON) when ``error`` is empty; else ``error`` is the domain error's code
    (``not_found``, ``forbidden``, ``peer_unreachable``, ...) and ``message`` its words."""

    error: str = Field(default="", max_length=64)
    message: str = Field(default="", max_length=4096)
    body: dict[str, Any] | None = None


class Hold(_Msg):
    """Owner -> worker (gang): reserve what this member needs for ``ttl_s`` seconds."""

    msg_id: str
    owner: str
    job_id: str
    hold_id: str
    spec: dict[str, Any]
    ttl_s: float = Field(gt=0.0, le=MAX_LEASE_S)
    """As the owner asks; a worker keeps a hold at most its own ``hold_ttl_s``."""


class HoldReply(_Msg):
    """Worker -> owner (gang): held (with the worker's LAN address and a reserved port) or refused."""

    held: bool
    address: str = ""
    interface: str = ""
    port: int = 0
    reason: str = ""


class Release(_Msg):
    """Owner -> worker (gang): drop a hold."""

    msg_id: str
    owner: str
    hold_id: str


class Commit(_Msg):
    """Owner -> worker (gang): run your rank of the job under the held resources."""

    msg_id: str
    owner: str
    job_id: str
    hold_id: str
    attempt: int
    lease_s: float = Field(ge=1.0, le=MAX_LEASE_S)
    spec: dict[str, Any]
    """Only its ``env`` is used: the environment values the hold went without; the rest was
    judged at the hold."""
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int


class EnrollJoin(_Msg):
    """Joining node -> signer (enrollment listener): a CSR with the token's id and secret."""

    token_id: str = Field(max_length=64)
    secret: str = Field(max_length=128)
    csr_pem: str = Field(max_length=8192)
    mode: str = Field(max_length=16)
    user: str = Field(max_length=256)


class EnrollRenew(_Msg):
    """Member -> signer: a CSR for the key of the (valid) client certificate it connects with."""

    csr_pem: str = Field(max_length=8192)


class EnrollReply(_Msg):
    """Signer -> node: the new node certificate (PEM)."""

    cert_pem: str
