"""Cluster-wide job control: ``show``, ``explain``, ``logs`` and ``cancel`` of any job id on any machine.

A job lives on its owner (the daemon it was submitted to). :class:`RemoteJobs` answers the
local API's requests about a job wherever it lives:

- Finding (:meth:`RemoteJobs.locate`): a full id owned here is answered here at once.
  Otherwise every trusted peer is asked at once, within ``time_limit_s``, which jobs it owns
  whose id starts with the reference and which runs of other owners' jobs it holds
  (``/v1/peer/job/find``); the runs held here count too (only peers that are up are asked
  when the reference also matches a job owned here). One match: the request goes to its
  owner (``/v1/peer/job/<action>``) with the requesting user's name. Several:
  :class:`~gpulayerd.errors.AmbiguousJob` listing each id with its owner. None:
  :class:`~gpulayerd.errors.NoSuchJob`, or :class:`~gpulayerd.errors.PeerUnreachable`
  ("owner h1 unreachable") when a peer did not answer (it may own the job).
- The rules on the owner (the peer routes ``job_*`` and ``jobs``): the user name a peer sends
  is believed only when the peer's certificate vouches for it (:func:`~gpulayerd.core.users.vouches`:
  a system-mode node for any name, a personal-mode node for its bound user only), and whether
  that user is an admin is decided here, from this node's own ``admin_group`` (a personal
  node's user is never an admin elsewhere): :func:`~gpulayerd.app.roles.relayed_requester`.
  Logs and cancel are the role ``RELAYED_JOB_USER_OR_ADMIN``, checked before the handler
  (:mod:`gpulayerd.app.roles`). Everyone sees and explains the job with its spec concealed
  unless it is theirs (:func:`~gpulayerd.app.common.requester.conceal`), and environment values go only
  to the node that runs the job, in ``show`` as in the ``jobs`` listing.
- A worker answers for the runs it holds: when the owner does not answer, ``show`` and
  ``explain`` say what the worker knows of the run (running there since, attempt) and that
  the owner is unreachable; ``logs`` are read from the run's directory (the same rule, with
  the user of the run's spec). ``cancel`` needs the owner.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpulayerd.app.common.logread import read_log
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.requester import Requester, Requesters, conceal
from gpulayerd.app.owner.owner import OwnerService
from gpulayerd.app.roles import relayed_requester
from gpulayerd.core.arrays import split_task_id
from gpulayerd.core.users import SYSTEM
from gpulayerd.errors import (
    AmbiguousJob,
    BadRequest,
    Forbidden,
    GpulayerError,
    InvalidSpec,
    NoSuchJob,
    PeerCallError,
    PeerRefused,
    PeerUnreachable,
)
from gpulayerd.models import ExplanationModel, JobList, JobView, LogChunk
from gpulayerd.models.stored import spec_of
from gpulayerd.net.transport import JOB_ACTION_ROUTES, JOB_FIND, PeerTransport, Sender
from gpulayerd.net.wire import MAX_JOB_MATCHES, JobMatches, JobReply, JobRequest, JobsRequest, new_msg_id
from gpulayerd.store import AmbiguousJobId, JobNotFound, RemoteRunRow, Store

__all__ = ["JOB_ID_LEN", "Located", "RemoteJobs"]

log = logging.getLogger(__name__)

JOB_ID_LEN = 12
"""Length of a full job id (:func:`gpulayerd.app.owner.owner.new_job_id`)."""

_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,63}")  # what the peer API accepts as a job id (or prefix)
_ERRORS: dict[str, type[GpulayerError]] = {
    cls.code: cls for cls in (NoSuchJob, AmbiguousJob, BadRequest, InvalidSpec, Forbidden, PeerUnreachable)}
_SHOWN = 10  # matches listed in an ambiguity message

T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Located:
    """Where a job is: its full id, its owner's node id, and the nodes that hold a run of it."""

    job_id: str
    owner: str
    holders: tuple[str, ...] = ()


def _when(ts: float | None) -> str:
    if ts is None:
        return "an unknown time"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class RemoteJobs:
    """Finds a job's owner in the cluster and forwards requests to it; answers peers' requests.

    Args:
        node_id: this daemon's node id.
        owner: the jobs owned here.
        store: the runs held here (``store.runs``) and the jobs owned here.
        transport: calls to peers; ``directory``: who they are (None outside a cluster: only
            the jobs owned here exist).
        names: node ids to host names.
        requesters: who is an admin here, by name (for requests relayed by peers).
        time_limit_s: how long a peer may take to say which jobs it has (seconds).
    """

    def __init__(self, *, node_id: str, owner: OwnerService, store: Store, transport: PeerTransport,
                 directory: Directory | None, names: Names, requesters: Requesters | None = None,
                 time_limit_s: float = 3.0) -> None:
        self.node_id = node_id
        self._owner = owner
        self._store = store
        self._transport = transport
        self._directory = directory
        self._names = names
        self._requesters = requesters or Requesters(mode="personal", admin_group="")
        self._time_limit_s = time_limit_s

    # ------------------------------------------------------------------ the local API's requests

    async def show(self, job_ref: str, requester: Requester | None) -> JobView:
        """The job as ``requester`` may see it, from its owner (or, owner unreachable, a worker of it).

        Raises:
            NoSuchJob, AmbiguousJob, PeerUnreachable (the owner did not answer and no holder of
            a run of it did either).
        """
        where = await self.locate(job_ref)
        if where.owner == self.node_id:
            return await self._owner.get_job(where.job_id, requester)
        return await self._forward(where, "show", requester, JobView)

    async def explain(self, job_ref: str, requester: Requester | None) -> ExplanationModel:
        """The job's explanation from its owner (see :meth:`show` for the errors)."""
        where = await self.locate(job_ref)
        if where.owner == self.node_id:
            return await self._owner.explain(where.job_id, requester)
        return await self._forward(where, "explain", requester, ExplanationModel)

    async def logs(self, job_ref: str, stream: str, offset: int, attempt: int | None, requester: Requester | None,
                   rank: int | None = None, limit: int | None = None) -> LogChunk:
        """A chunk of the job's log (see :meth:`OwnerService.logs`), from its owner; owner
        unreachable, from a run of it held here (or by a peer that answers).

        Raises:
            NoSuchJob, AmbiguousJob, Forbidden (not the job's user nor an admin), PeerUnreachable.
        """
        where = await self.locate(job_ref)
        if where.owner == self.node_id:
            return await self._owner.logs(where.job_id, stream, offset, attempt, requester, rank=rank, limit=limit)
        return await self._forward(where, "logs", requester, LogChunk, stream=stream, offset=offset,
                                   attempt=attempt, rank=rank, limit=limit)

    async def cancel(self, job_ref: str, requester: Requester | None, signal: str = "") -> JobView:
        """Cancel the job on its owner (``signal``, the first signal's name, only for a job owned here: a
        peer's job is cancelled with SIGTERM).

        Raises:
            NoSuchJob, AmbiguousJob, Forbidden, PeerUnreachable (the owner did not answer).
        """
        try:
            where = await self.locate(job_ref)
        except NoSuchJob:
            task = split_task_id(job_ref)  # a task not materialized yet: its array's owner writes it cancelled
            if task is None:
                raise
            where = replace(await self.locate(task[0]), job_id=job_ref, holders=())
        if where.owner == self.node_id:
            return await self._owner.cancel(where.job_id, requester, signal)
        return await self._forward(where, "cancel", requester, JobView)

    # ------------------------------------------------------------------ finding a job

    async def locate(self, job_ref: str) -> Located:
        """The one job ``job_ref`` (a full id or an id prefix) names in the cluster.

        Raises:
            NoSuchJob: no machine that answered knows it, and every peer answered.
            AmbiguousJob: the prefix matches several jobs (the message lists ids and owners).
            PeerUnreachable: nothing that answered knows it, and some peers did not answer
                (``owner <name> unreachable``, naming them).
        """
        owned = await self._owned_matches(job_ref)
        if self._directory is None or not _ID.fullmatch(job_ref) or (
                job_ref in owned and len(job_ref) >= JOB_ID_LEN):
            return self._only(job_ref, dict.fromkeys(owned, self.node_id), {}, [])
        peers = self._directory.up_ids() if owned else self._directory.trusted_ids()
        peers = [p for p in peers if p != self.node_id]
        answers = await asyncio.gather(*(self._find(p, job_ref) for p in peers), return_exceptions=True)
        owners: dict[str, str] = dict.fromkeys(owned, self.node_id)
        holders: dict[str, list[str]] = {}
        silent: list[str] = []
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, JobMatches):
                for job_id in answer.owned:  # an owner's own word wins over what holders say
                    if job_id.startswith(job_ref) and _ID.fullmatch(job_id):
                        owners[job_id] = peer
            elif isinstance(answer, Exception):
                silent.append(peer)
            else:
                raise answer
        for job_id, owner in (await self._held_matches(job_ref)).items():
            owners.setdefault(job_id, owner)
            holders.setdefault(job_id, []).append(self.node_id)
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, JobMatches):
                for job_id, owner in answer.held.items():
                    if job_id.startswith(job_ref) and _ID.fullmatch(job_id) and owner != peer:
                        owners.setdefault(job_id, owner)
                        holders.setdefault(job_id, []).append(peer)
        return self._only(job_ref, owners, holders, silent)

    def _only(self, job_ref: str, owners: dict[str, str], holders: dict[str, list[str]],
              silent: list[str]) -> Located:
        if job_ref in owners:  # an exact id always wins
            return Located(job_ref, owners[job_ref], tuple(holders.get(job_ref, ())))
        if len(owners) == 1:
            ((job_id, owner),) = owners.items()
            return Located(job_id, owner, tuple(holders.get(job_id, ())))
        if owners:
            ids = sorted(owners)
            shown = ", ".join(f"{i} (owner {self._names.name_of(owners[i])})" for i in ids[:_SHOWN])
            more = f", and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
            raise AmbiguousJob(f"job id prefix {job_ref!r} matches several jobs: {shown}{more}")
        if silent:
            names = " or ".join(sorted(str(self._names.name_of(p)) for p in silent))
            raise PeerUnreachable(f"job {job_ref!r}: no machine that answered knows it, and {names} did not answer "
                                  "(if it is its owner, ask again when it is back)")
        raise NoSuchJob(f"no job {job_ref!r}")

    async def _find(self, peer: str, job_ref: str) -> JobMatches:
        msg = JobRequest(msg_id=new_msg_id(), job_id=job_ref)
        return await asyncio.wait_for(self._transport.call(peer, JOB_FIND, msg), self._time_limit_s)

    async def _owned_matches(self, prefix: str) -> list[str]:
        """Ids of the jobs owned here that start with ``prefix`` (an exact id alone), at most 16."""
        try:
            return [await self._store.jobs.resolve_job_id(prefix)]
        except JobNotFound:
            return []
        except AmbiguousJobId:  # rare: every job is read to list them all
            rows = await self._store.jobs.list_jobs(None, None)
            return sorted(r.id for r in rows if r.id.startswith(prefix))[:MAX_JOB_MATCHES]

    async def _held_matches(self, prefix: str) -> dict[str, str]:
        """Job id -> owner of the runs held here for other owners whose job id starts with ``prefix``."""
        out: dict[str, str] = {}
        for r in await self._store.runs.remote_runs():
            if r.job_id.startswith(prefix) and r.owner != self.node_id:
                out[r.job_id] = r.owner
        return dict(sorted(out.items())[:MAX_JOB_MATCHES])

    async def held_views(self, listed: set[str], requester: Requester | None) -> list[JobView]:
        """Runs held here for another owner that are not in ``listed`` (their owner did not answer
        the listing): each as this worker knows it ("owner X unreachable: what ws-2 knows: ...")."""
        out = []
        for run in await self._store.runs.remote_runs(active=True):
            if run.owner == self.node_id or run.job_id in listed:
                continue
            why = f"owner {self._names.name_of(run.owner)} unreachable"
            view = await self._held_answer("show", run.job_id, requester, why)
            if isinstance(view, JobView):
                out.append(view)
        return out

    async def _held_run(self, job_id: str) -> RemoteRunRow | None:
        """The latest run of ``job_id`` held here for another owner."""
        runs = [r for r in await self._store.runs.remote_runs() if r.job_id == job_id and r.owner != self.node_id]
        return max(runs, key=lambda r: r.attempt) if runs else None

    # ------------------------------------------------------------------ forwarding

    async def _forward(self, where: Located, action: str, requester: Requester | None, reply: type[T],
                       **extra: Any) -> T:
        owner_name = self._names.name_of(where.owner)
        try:
            return await self._ask(where.owner, action, where.job_id, requester, reply, **extra)
        except PeerRefused as e:
            raise Forbidden(e.reason) from e
        except PeerCallError as e:
            failure = e
        why = f"owner {owner_name} unreachable"
        log.info("job %s: %s (%s)", where.job_id, why, failure)
        if action != "cancel":
            for holder in where.holders:
                if holder == self.node_id:
                    body = await self._held_answer(action, where.job_id, requester, why, **extra)
                    return reply.model_validate(body.model_dump(mode="json"))
                try:
                    return await self._ask(holder, action, where.job_id, requester, reply, **extra)
                except PeerRefused as e:
                    raise Forbidden(e.reason) from e
                except PeerCallError:
                    continue
        raise PeerUnreachable(f"job {where.job_id}: {why} ({failure})")

    async def _ask(self, node: str, action: str, job_id: str, requester: Requester | None, reply: type[T],
                   **extra: Any) -> T:
        """Ask ``node`` to do ``action`` on ``job_id`` for ``requester``.

        Raises:
            PeerRefused: it refused (the requester lacks the role there). PeerCallError: it did not
            answer. The domain error it answered with (NoSuchJob, ...).
        """
        user, admin = _who(requester)
        msg = JobRequest(msg_id=new_msg_id(), job_id=job_id, user=user, admin=admin,
                         **{k: v for k, v in extra.items() if v is not None})
        answer = await self._transport.call(node, JOB_ACTION_ROUTES[action], msg)
        if answer.error:
            raise _ERRORS.get(answer.error, GpulayerError)(answer.message)
        try:
            return reply.model_validate(answer.body or {})
        except ValidationError as e:
            raise PeerCallError(f"{self._names.name_of(node)} answered an invalid {reply.__name__}") from e

    # ------------------------------------------------------------------ peers' requests

    async def find(self, sender: Sender, msg: JobRequest) -> JobMatches:
        """Peer route ``job_find`` (any member): the jobs owned here and runs held here whose id
        starts with ``msg.job_id`` (at most :data:`~gpulayerd.net.wire.MAX_JOB_MATCHES` each)."""
        return JobMatches(owned=await self._owned_matches(msg.job_id), held=await self._held_matches(msg.job_id))

    async def relayed(self, sender: Sender, user: str) -> Requester:
        """Who a request that ``sender`` relays for ``user`` is made by here (see
        :func:`~gpulayerd.app.roles.relayed_requester`; admin rights from this node's own ``admin_group``)."""
        is_admin = sender.mode == SYSTEM and await self._requesters.admin_by_name(user)
        return relayed_requester(sender, user, is_admin)

    async def listing(self, sender: Sender, msg: JobsRequest) -> JobList:
        """Peer route ``jobs`` (any member): the jobs owned here for a person's ``gpulayer jobs`` on
        ``sender``, concealed exactly as ``show`` conceals them for the same requester."""
        requester = await self.relayed(sender, msg.user)
        jobs = await self._owner.list_jobs(msg.statuses or None, None, scope="local", requester=requester)
        return JobList(jobs=[self._owner.env_for(sender.node_id, j) for j in jobs])

    async def peer_show(self, sender: Sender, msg: JobRequest) -> JobReply:
        """Peer route ``job_show`` (any member): the job as the relayed user may see it."""
        return await self.answer(sender, "show", msg)

    async def peer_explain(self, sender: Sender, msg: JobRequest) -> JobReply:
        """Peer route ``job_explain`` (any member)."""
        return await self.answer(sender, "explain", msg)

    async def peer_logs(self, sender: Sender, msg: JobRequest) -> JobReply:
        """Peer route ``job_logs`` (role: the job's user or an admin, relayed)."""
        return await self.answer(sender, "logs", msg)

    async def peer_cancel(self, sender: Sender, msg: JobRequest) -> JobReply:
        """Peer route ``job_cancel`` (role: the job's user or an admin, relayed)."""
        return await self.answer(sender, "cancel", msg)

    async def answer(self, sender: Sender, action: str, msg: JobRequest) -> JobReply:
        """Do ``action`` on a job owned here (or, not owned here, answer from a run of it held here)
        for the user ``msg`` names, under the rules of the module docstring. Every domain error is
        an answer (``JobReply.error``), never an exception."""
        try:
            requester = await self.relayed(sender, msg.user)
            body = await self._answer(sender, action, msg, requester)
        except GpulayerError as e:
            return JobReply(error=e.code, message=e.message)
        if isinstance(body, JobView):
            body = self._owner.env_for(sender.node_id, body)
        return JobReply(body=body.model_dump(mode="json"))

    async def _answer(self, sender: Sender, action: str, msg: JobRequest, requester: Requester) -> BaseModel:
        task = split_task_id(msg.job_id)
        if action == "cancel" and task is not None and task[0] in await self._owned_matches(task[0]):
            return await self._owner.cancel(msg.job_id, requester)  # (a task not materialized yet too)
        if msg.job_id in await self._owned_matches(msg.job_id):
            calls: dict[str, Callable[[], Awaitable[BaseModel]]] = {
                "show": lambda: self._owner.get_job(msg.job_id, requester),
                "explain": lambda: self._owner.explain(msg.job_id, requester),
                "cancel": lambda: self._owner.cancel(msg.job_id, requester),
                "logs": lambda: self._owner.logs(msg.job_id, msg.stream, msg.offset, msg.attempt, requester,
                                                 rank=msg.rank, limit=msg.limit),
            }
            return await calls[action]()
        if action == "cancel":
            raise NoSuchJob(f"no job {msg.job_id!r} owned by {self._names.hostname}")
        run = await self._held_run(msg.job_id)
        why = (f"owner {self._names.name_of(run.owner)} unreachable from {self._names.name_of(sender.node_id)}"
               if run is not None else "")
        return await self._held_answer(action, msg.job_id, requester, why, stream=msg.stream, offset=msg.offset,
                                       attempt=msg.attempt, rank=msg.rank, limit=msg.limit)

    async def _held_answer(self, action: str, job_id: str, requester: Requester | None, why: str, *,
                           stream: str = "stdout", offset: int = 0, attempt: int | None = None,
                           rank: int | None = None, limit: int | None = None) -> BaseModel:
        """What this worker knows of ``job_id`` from the latest run of it held here.

        ``rank`` is ignored: the log held here is this worker's rank's.

        Who may read the logs is the route's role, checked before (locally or for the relaying peer).

        Raises:
            NoSuchJob: no run of it is held here (or not that attempt).
        """
        del rank
        run = await self._held_run(job_id)
        me = self._names.hostname
        if run is None or (attempt is not None and attempt != run.attempt):
            raise NoSuchJob(f"no job {job_id!r} on {me}" if run is None
                            else f"{me} holds attempt {run.attempt} of job {job_id}, not {attempt}")
        spec = spec_of(run.spec_json)
        user = spec.user or ""
        if run.state == "running":
            state, status = f"attempt {run.attempt} running on {me} since {_when(run.started_at)}", "running"
        else:
            how = "lost" if run.state == "lost" else f"exited {run.exit_code}"
            state = f"attempt {run.attempt} {how} on {me} at {_when(run.ended_at)}"
            status = "lost" if run.state == "lost" else ("succeeded" if run.exit_code == 0 else "failed")
        knows = f"{why}: what {me} knows: {state}"
        if action == "logs" and requester is not None and not requester.may_manage(user):
            raise Forbidden(f"job {job_id} belongs to {user or 'nobody'}")  # (checked before too: not trusted alone)
        if action == "logs":
            return await read_log(Path(run.run_dir) / f"{stream}.log", job_id, run.attempt, stream, offset,
                                  run.state != "running", limit)
        if action == "explain":
            return ExplanationModel(job_id=job_id, verdict=status, summary=knows)
        view = JobView(id=job_id, name=spec.name, submitted_by=user, owner=run.owner,
                       owner_name=self._names.name_of(run.owner), status=status, attempt=run.attempt,
                       holder=self.node_id, holder_name=me, reason=knows, exit_code=run.exit_code,
                       submitted_at=run.started_at or 0.0, updated_at=run.ended_at or run.started_at or 0.0,
                       spec=spec)
        return conceal(view, requester)


def _who(requester: Requester | None) -> tuple[str, bool]:
    """The user name and admin claim a request of ``requester`` carries (None: the daemon itself, an admin)."""
    if requester is None:
        return "", True
    return requester.user, requester.admin
