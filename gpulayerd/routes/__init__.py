"""THE declaration of every route gpulayerd serves: path, method, request and reply types, the
role a caller must hold, and the handler's name. Standard library only (no pydantic, aiohttp or
asyncio): the ``gpulayer`` CLI reads its paths here at start-up.

Three tables:

- :data:`LOCAL_ROUTES`: the local API on the unix socket (``/v1/...``). Who asks comes from the
  kernel (``SO_PEERCRED``), never from the request.
- :data:`PEER_ROUTES`: the peer API over mutual TLS (``/v1/peer/...``). Who sends comes from the
  client certificate (node id, mode, bound user), never from the body.
- :data:`ENROLL_ROUTES`: a signer's enrollment listener (peer port + 1), the only listener that
  takes connections without a cluster certificate.

Everything else is built from these tables: the aiohttp servers and the role check that runs
before every handler (:mod:`gpulayerd.api`), the mutual-TLS client, the self-first transport and
the tests' loopback (:mod:`gpulayerd.net.transport` binds each peer route to its pydantic models),
the CLI's client (:mod:`gpulayerd.cli.http`), the route tables in ``docs/architecture.md`` and the
generated test that sends every route from a caller without its role
(``tests/unit/test_route_table.py``).

A role names who may call a route, decided from facts the caller cannot forge (see
:class:`Role`). Routes open to every member (or every local user) are ``public``: the generated
test sends them from a revoked and from a foreign-cluster certificate instead.
"""

from __future__ import annotations

import enum

TYPE_CHECKING = False  # `typing` costs ~2 ms of every CLI start; mypy reads this name as true
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["BEGIN_DOC", "END_DOC", "ENROLL", "ENROLL_ROUTES", "LOCAL", "LOCAL_ROUTES", "PEER", "PEER_ROUTES", "Role",
           "Route", "all_routes", "local_path", "markdown", "splice"]


class Role(str, enum.Enum):
    """Who may call a route. The value is the words the docs and refusals use.

    The facts behind each role are ones the caller cannot forge: the local requester's uid (from
    the kernel), the peer's node id, mode and bound user (from its certificate), and the job rows,
    offers, holds, runs and grants in this daemon's store and memory.
    """

    # --- local API (unix socket)
    LOCAL_USER = "any local user"
    """Public: any account this daemon serves (a personal daemon: its own user only)."""
    JOB_USER_OR_ADMIN = "the job's user or an admin"
    """The requester is the job's user, root, or in ``admin_group`` (system mode); a personal
    daemon's own user is its admin. For a job owned elsewhere the owner decides (relayed)."""

    # --- peer API (mutual TLS)
    MEMBER = "any member"
    """Public: any node with a valid, unrevoked certificate of this cluster."""
    JOB_OWNER = "the job's owner"
    """The sender is the owner the message names, the job id is not bound here to another owner,
    and the sender vouches for the job's user (a system-mode node for anyone, a personal-mode node
    for its bound user only)."""
    OFFERED_WORKER = "a worker it was offered to, that fits it and may run its user's jobs"
    """The job is owned here; this owner offered it to the sender (an offer still standing), the
    sender fits it as this owner last saw it (now or once busy devices free), and the sender may
    run the job's user's jobs (a personal-mode node only its bound user's; its account exists
    there; root's only where allowed). The holder asking again for its grant also holds it."""
    HOLDER = "the holder of (owner, job, attempt)"
    """The job is owned here and the sender holds that attempt (its worker, or a member of its
    gang)."""
    SHIP_HOLDER = "the holder of a shipped job's current attempt, for a content its manifest lists"
    """The job is owned here and shipped, the sender holds its current attempt (claimed or running),
    and the content asked for is that job's snapshot's manifest or a file it lists."""
    RUN_OWNER = "the owner of the run"
    """The attempt runs (or ran) here for the sender: worker-side runs, grants and logs are keyed
    by (owner node, job id, attempt)."""
    HOLD_OWNER = "the owner of the hold"
    """A gang hold kept here was placed by the sender (and, for a commit, for that job)."""
    RELAYED_JOB_USER_OR_ADMIN = "the job's user or an admin, relayed"
    """A person's request relayed by the sender: the user name counts only if the sender vouches
    for it; admin rights are decided here, from this node's own ``admin_group`` (a personal-mode
    node's user is never an admin elsewhere)."""

    # --- enrollment (a signer's listener)
    ANYONE = "anyone"
    """No certificate needed: only the CA certificate, which the joining node checks against the
    SHA-256 in its token."""
    TOKEN_HOLDER = "the holder of a join token"
    """Proof of a one-time enrollment secret (consumed atomically by the signer)."""
    RENEWING_MEMBER = "a member renewing its own key"
    """A valid, unrevoked certificate of this cluster; the new certificate is for the same key,
    mode and user."""

    @property
    def public(self) -> bool:
        """True for the roles open to every local user or every member."""
        return self in (Role.LOCAL_USER, Role.MEMBER, Role.ANYONE)


class Route:
    """One route: where it is, what it takes and answers, who may call it, who answers it.

    Attributes:
        name: unique within its table (``"claim"``).
        method: ``"GET"`` or ``"POST"``.
        path: the URL path; ``{job}`` marks a path parameter (local routes).
        request: the name of the request body's model (``"Claim"``), or ``""`` (no body;
            ``query`` names its query parameters).
        reply: the name of the reply's model (``"ClaimReply"``; ``"list[JobView]"``; ``"text"``
            for a PEM or an event stream).
        role: the role the caller must hold, checked before the handler.
        handler: the name of the handler (``"owner.claim"``): the daemon binds each name once.
        refusal: how a refusal is answered: ``"403"`` (an error body), or ``"stale"`` (a
            :class:`RunReportReply` with ``stale`` true: the sender must stop that attempt).
        query: the query parameters a GET takes.
        doc: one line for people.
    """

    __slots__ = ("doc", "handler", "method", "name", "path", "query", "refusal", "reply", "request", "role")

    def __init__(self, name: str, method: str, path: str, request: str, reply: str, role: Role, handler: str,
                 doc: str, *, refusal: str = "403", query: tuple[str, ...] = ()) -> None:
        self.name = name
        self.method = method
        self.path = path
        self.request = request
        self.reply = reply
        self.role = role
        self.handler = handler
        self.refusal = refusal
        self.query = query
        self.doc = doc

    def __repr__(self) -> str:
        return f"Route({self.method} {self.path} role={self.role.name})"


_JOB = "{job}"

LOCAL_ROUTES: tuple[Route, ...] = (
    Route("health", "GET", "/v1/health", "", "HealthView", Role.LOCAL_USER, "local.health",
          "liveness, identity, protocol counters and who asks (user, admin: from the kernel)"),
    Route("devices", "GET", "/v1/devices", "", "Capabilities", Role.LOCAL_USER, "local.async_capabilities",
          "this machine's devices (with grant state), environments and probe health"),
    Route("peers", "GET", "/v1/peers", "", "list[PeerView]", Role.LOCAL_USER, "local.async_peers",
          "every gpulayerd known, this one first"),
    Route("users", "GET", "/v1/users", "", "list[UserUsageView]", Role.LOCAL_USER, "local.async_users",
          "fair share: every user known, in priority order"),
    Route("metrics", "GET", "/v1/metrics", "", "MetricsView", Role.LOCAL_USER, "local.async_metrics",
          "live GPU metrics of this machine"),
    Route("events", "GET", "/v1/events", "", "text", Role.LOCAL_USER, "local.feed",
          "server-sent events: what changed (no job's spec)"),
    Route("submit", "POST", "/v1/jobs", "SubmitRequest", "JobView", Role.LOCAL_USER, "local.async_submit",
          "store a job of the requester (its user is the requester, whatever the body says)"),
    Route("jobs", "GET", "/v1/jobs", "", "list[JobView]", Role.LOCAL_USER, "local.async_list_jobs",
          "every user's jobs; another user's spec concealed",
          query=("state", "status", "limit", "scope", "user", "finished", "fields", "ids")),
    Route("job", "GET", f"/v1/jobs/{_JOB}", "", "JobView", Role.LOCAL_USER, "local.async_get_job",
          "one job with attempts and history; another user's spec concealed"),
    Route("explain", "GET", f"/v1/jobs/{_JOB}/explain", "", "ExplanationModel", Role.LOCAL_USER, "local.async_explain",
          "why the job is where it is; another user's workdir and stderr concealed"),
    Route("cancel", "POST", f"/v1/jobs/{_JOB}/cancel", "", "JobView", Role.JOB_USER_OR_ADMIN, "local.async_cancel",
          "cancel a job"),
    Route("logs", "GET", f"/v1/jobs/{_JOB}/logs", "", "LogChunk", Role.JOB_USER_OR_ADMIN, "local.async_logs",
          "a chunk of a job's log", query=("stream", "offset", "attempt", "rank", "limit")),
    Route("prometheus", "GET", "/metrics", "", "text", Role.LOCAL_USER, "local.async_prometheus",
          "this daemon in the Prometheus text format: counts by state, reason code and user; no job's id or spec"),
    Route("report", "GET", "/v1/report", "", "ReportView", Role.LOCAL_USER, "local.async_report",
          "accounting: jobs, GPU- and CPU-slot-hours, failures and waits by user, host or GPU model",
          query=("since", "by", "scope")),
    Route("snapshot", "POST", "/v1/snapshots", "SnapshotRequest", "SnapshotView", Role.LOCAL_USER,
          "local.async_snapshot", "offer (then commit) a manifest of the requester's workdir: the contents to "
          "upload, or a refusal over a cap"),
    Route("snapshot_blob", "POST", "/v1/snapshots/blobs", "bytes", "BlobView", Role.LOCAL_USER,
          "local.async_snapshot_blob", "a chunk of a content an offer of the requester found missing",
          query=("digest", "offset")),
    Route("fetch", "POST", f"/v1/jobs/{_JOB}/fetch", "FetchRequest", "FetchChunk", Role.JOB_USER_OR_ADMIN,
          "local.async_fetch", "files of a finished attempt of a shipped job owned here, from the tree its worker "
          "keeps (the job's user or root)"),
)
"""The local API (unix socket)."""

PEER_ROUTES: tuple[Route, ...] = (
    Route("heartbeat", "POST", "/v1/peer/heartbeat", "Heartbeat", "HeartbeatReply", Role.MEMBER,
          "cluster.heartbeat", "membership; the sender's holdings count only for users it may run jobs for"),
    Route("capabilities", "GET", "/v1/peer/capabilities", "", "Capabilities", Role.MEMBER,
          "machine.capabilities", "this node's devices, environments and grant state"),
    Route("jobs", "POST", "/v1/peer/jobs", "JobsRequest", "JobList", Role.MEMBER, "jobs.listing",
          "the jobs owned here, concealed as show conceals them for the same requester"),
    Route("usage_report", "POST", "/v1/peer/usage-report", "UsageReportRequest", "ReportView", Role.MEMBER,
          "accounting.peer_report", "the accounting of the jobs owned here over a period (no job's id or spec)"),
    Route("offer", "POST", "/v1/peer/offer", "Offer", "Ack", Role.JOB_OWNER, "worker.offer",
          "an owner offers a queued job (no environment values)"),
    Route("claim", "POST", "/v1/peer/claim", "Claim", "ClaimReply", Role.OFFERED_WORKER, "owner.claim",
          "a worker claims an offered job: the owner's compare-and-set grants one claim"),
    Route("report", "POST", "/v1/peer/report", "RunReport", "RunReportReply", Role.HOLDER, "owner.report",
          "the holder reports an attempt started, renewed, exited or lost", refusal="stale"),
    Route("kill", "POST", "/v1/peer/kill", "Kill", "Ack", Role.RUN_OWNER, "worker.kill",
          "the owner stops an attempt it runs here"),
    Route("logs", "POST", "/v1/peer/logs", "LogRequest", "LogChunk", Role.RUN_OWNER, "worker.logs",
          "the owner reads the log of an attempt that runs or ran here for it"),
    Route("hold", "POST", "/v1/peer/hold", "Hold", "HoldReply", Role.JOB_OWNER, "member.hold",
          "gang: reserve devices, CPU slots and a port for one member"),
    Route("release", "POST", "/v1/peer/release", "Release", "Ack", Role.HOLD_OWNER, "member.release",
          "gang: drop a hold"),
    Route("commit", "POST", "/v1/peer/commit", "Commit", "Ack", Role.HOLD_OWNER, "member.commit",
          "gang: start this member's rank under its hold"),
    Route("job_find", "POST", "/v1/peer/job/find", "JobRequest", "JobMatches", Role.MEMBER, "jobs.find",
          "which job ids owned (or runs held) here start with a prefix"),
    Route("job_show", "POST", "/v1/peer/job/show", "JobRequest", "JobReply", Role.MEMBER, "jobs.peer_show",
          "a job as the relayed user may see it"),
    Route("job_explain", "POST", "/v1/peer/job/explain", "JobRequest", "JobReply", Role.MEMBER, "jobs.peer_explain",
          "why a job is where it is, as the relayed user may see it"),
    Route("job_logs", "POST", "/v1/peer/job/logs", "JobRequest", "JobReply", Role.RELAYED_JOB_USER_OR_ADMIN,
          "jobs.peer_logs", "a chunk of a job's log for the relayed user"),
    Route("job_cancel", "POST", "/v1/peer/job/cancel", "JobRequest", "JobReply", Role.RELAYED_JOB_USER_OR_ADMIN,
          "jobs.peer_cancel", "cancel a job for the relayed user"),
    Route("ship_fetch", "POST", "/v1/peer/ship/fetch", "ShipFetch", "ShipChunk", Role.SHIP_HOLDER,
          "shipping.fetch", "a worker fetches a chunk of a shipped job's manifest or of a file it lists"),
    Route("ship_output", "POST", "/v1/peer/ship/output", "OutputChunk", "Ack", Role.HOLDER,
          "shipping.output", "the holder of an attempt sends a chunk of its outputs back"),
    Route("ship_files", "POST", "/v1/peer/ship/files", "TreeFiles", "ShipChunk", Role.RUN_OWNER,
          "trees.files", "the owner of a shipped job gets files of an ended attempt's tree kept here (gpulayer fetch)"),
)
"""The peer API (mutual TLS against the cluster CA)."""

ENROLL_ROUTES: tuple[Route, ...] = (
    Route("ca", "GET", "/v1/enroll/ca", "", "text", Role.ANYONE, "enroll.ca",
          "the CA certificate (the joining node checks its SHA-256 against its token)"),
    Route("join", "POST", "/v1/enroll/join", "EnrollJoin", "EnrollReply", Role.TOKEN_HOLDER, "enroll.join",
          "a CSR with a one-time secret: a node certificate in the token's mode"),
    Route("renew", "POST", "/v1/enroll/renew", "EnrollRenew", "EnrollReply", Role.RENEWING_MEMBER,
          "enroll.renew", "a new certificate for the caller's own key, mode and user"),
)
"""A signer's enrollment listener (peer port + 1; served only by nodes that hold the CA key)."""

LOCAL: dict[str, Route] = {r.name: r for r in LOCAL_ROUTES}
"""Local routes by name."""
PEER: dict[str, Route] = {r.name: r for r in PEER_ROUTES}
"""Peer routes by name."""
ENROLL: dict[str, Route] = {r.name: r for r in ENROLL_ROUTES}
"""Enrollment routes by name."""


def all_routes() -> Iterator[tuple[str, Route]]:
    """Every declared route with its table's name (``"local"``, ``"peer"``, ``"enroll"``)."""
    for table, routes in (("local", LOCAL_ROUTES), ("peer", PEER_ROUTES), ("enroll", ENROLL_ROUTES)):
        for r in routes:
            yield table, r


def local_path(name: str, job: str = "") -> str:
    """The path of local route ``name``, with ``job`` (already percent-encoded) in place of ``{job}``.

    Raises:
        KeyError: no such local route.
    """
    return LOCAL[name].path.replace(_JOB, job)


BEGIN_DOC = "<!-- route tables: made by `python -m gpulayerd.routes --write docs/architecture.md`; do not edit -->"
END_DOC = "<!-- end of the route tables -->"
"""The markers around the generated route tables in ``docs/architecture.md``."""


def markdown() -> str:
    """The route tables as Markdown (path, method, role, handler, what for), between :data:`BEGIN_DOC`
    and :data:`END_DOC`; ``tests/unit/test_route_table.py`` checks that the doc holds exactly this."""
    out = [BEGIN_DOC]
    titles = {"local": "Local API (unix socket; who asks: the kernel's peer credentials)",
              "peer": "Peer API (mutual TLS; who sends: the client certificate's node id, mode and user)",
              "enroll": "Enrollment (a signer's listener, peer port + 1; no cluster certificate needed)"}
    for table, rows in (("local", LOCAL_ROUTES), ("peer", PEER_ROUTES), ("enroll", ENROLL_ROUTES)):
        out += ["", f"**{titles[table]}**", "", "| method | path | role | handler | what for |",
                "|---|---|---|---|---|"]
        for r in rows:
            role = f"{r.role.value} (public)" if r.role.public else r.role.value
            if r.refusal == "stale":
                role += "; refused: answered stale"
            out.append(f"| {r.method} | `{r.path}` | {role} | `{r.handler}` | {r.doc} |")
    out += ["", END_DOC]
    return "\n".join(out)


def splice(doc: str) -> str:
    """``doc`` with the text between :data:`BEGIN_DOC` and :data:`END_DOC` replaced by :func:`markdown`.

    Raises:
        ValueError: the markers are missing.
    """
    start, end = doc.find(BEGIN_DOC), doc.find(END_DOC)
    if start < 0 or end < start:
        raise ValueError(f"the doc has no {BEGIN_DOC!r} ... {END_DOC!r} block")
    return doc[:start] + markdown() + doc[end + len(END_DOC):]
