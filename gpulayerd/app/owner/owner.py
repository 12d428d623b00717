"""The owner: the jobs submitted to this daemon, their views, cancel and logs; grants and reports from workers."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.logread import read_log
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.owned_jobs import Granted, OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.requester import DEFAULT_JOB_PATH, Requester, conceal, hide_path
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.owner import explainer
from gpulayerd.app.owner.array_book import ArrayBook
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.app.owner.idempotency import Submitted, same_spec
from gpulayerd.app.owner.listing import in_states, select_rows, with_open_arrays
from gpulayerd.app.owner.profile_expansion import expand_at_submit
from gpulayerd.app.owner.queue_context import QueueContext
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.starter import Starter
from gpulayerd.core.job_facts import job_user
from gpulayerd.core.matching.evaluate import explain, validate
from gpulayerd.core.matching.targeting import unknown_worker
from gpulayerd.core.protocol import claims
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.reasons import removed_reason
from gpulayerd.core.types import SupportMatrix
from gpulayerd.core.users import account_rejection
from gpulayerd.core.verdict import FitState, RejectionCode
from gpulayerd.errors import BadRequest, InvalidSpec, NoSuchJob, PeerCallError, PeerUnreachable, SubmissionKeyReused
from gpulayerd.models import (
    AttemptView,
    EventView,
    ExplanationModel,
    JobView,
    LogChunk,
    SubmitRequest,
    capped,
    job_spec_from_mapping,
)
from gpulayerd.models.jobs_query import JobsQuery, select
from gpulayerd.models.stored import dump_placement, explanation_of, read_placement
from gpulayerd.net.transport import JOBS, LOGS, PeerTransport, Sender
from gpulayerd.net.wire import Claim, ClaimReply, JobsRequest, LogRequest, RunReport, RunReportReply, new_msg_id
from gpulayerd.store import AttemptRow, JobRow, Store, retry_json

__all__ = ["OwnerService", "new_job_id"]

log = logging.getLogger(__name__)

_B32 = "0123456789abcdefghjkmnpqrstvwxyz"


_HOLDER_JOB = re.compile(r"\bjob ([0-9a-z]{12})\b( \()?")
"""A job id as a reason names a holder (``GPU 0 is granted to job m8… (on ws-1)``)."""


def new_job_id(now_wall: float, rng: random.Random) -> str:
    """A 12-character id, sortable by submission time (Crockford base32, lower case).

    Args:
        now_wall: seconds since the epoch (the submission time; milliseconds count).
        rng: where the id's 20 random low bits come from (``random.SystemRandom`` in the daemon).
    """
    n = (int(now_wall * 1000) << 20) | rng.getrandbits(20)
    chars = []
    for _ in range(12):
        chars.append(_B32[n & 31])
        n >>= 5
    return "".join(reversed(chars))


class OwnerService:
    """Submit, list, show, explain, cancel and read the logs of the jobs owned here; grant claims; take reports."""

    def __init__(self, *, node_id: str, store: Store, jobs: OwnedJobs, gangs: GangCoordinator, machine: Machine,
                 starter: Starter, transport: PeerTransport, directory: Directory | None, names: Names,
                 support: SupportMatrix, signals: Signals, clock: Clock, rng: random.Random,
                 max_time_limit_s: float | None = None, arrays: ArrayBook | None = None) -> None:
        """``max_time_limit_s``: the longest ``time_limit`` a job may ask for (the daemon's
        ``max_time_limit``; a job that names none gets it); None: no cap."""
        self.node_id = node_id
        self._max_time_limit_s = max_time_limit_s
        self._store = store
        self._jobs = jobs
        self._gangs = gangs
        self._machine = machine
        self._starter = starter
        self._transport = transport
        self._directory = directory
        self._names = names
        self._support = support
        self._signals = signals
        self._clock = clock
        self._rng = rng
        self.arrays = arrays  # arrays and dependencies (None: neither is accepted)
        self.queue = QueueContext(store=store, machine=machine, directory=directory, clock=clock)  # show's position

    # ------------------------------------------------------------- local API

    async def submit(self, request: SubmitRequest, requester: Requester | None = None) -> JobView:
        """The job :meth:`submit_keyed` stored or found (in-process callers that need not know which)."""
        return (await self.submit_keyed(request, requester)).job

    async def submit_keyed(self, request: SubmitRequest, requester: Requester | None = None) -> Submitted:
        """Validate and store a job (``queued``, or ``rejected`` with its reasons); wake the scheduler.

        The job belongs to ``requester``: ``spec.user`` and ``submitted_by`` become its user
        name whatever the body said, and ``spec.path`` is ``request.path`` (empty:
        :data:`~gpulayerd.app.common.requester.DEFAULT_JOB_PATH`). ``requester`` None is the daemon
        itself (in-process callers and tests): the body's ``submitted_by`` and ``spec.user``
        are kept as given.

        ``request.key`` (not empty): the submission key, unique per user; a submission whose key
        was stored before stores nothing and answers that job (an idempotent retry; durable;
        ``replayed`` in the answer) when the spec is the same, else raises.

        Raises:
            InvalidSpec: no absolute workdir, a PATH with a NUL byte, a bad key. SpecError: the spec does not parse.
            SubmissionKeyReused: the key was used before for a job with a different spec.
        """
        raw_workdir = request.spec.get("workdir")
        if not isinstance(raw_workdir, str) or not os.path.isabs(raw_workdir):
            # The daemon's own working directory means nothing to the submitter.
            raise InvalidSpec("job spec: workdir: must be an absolute path (the CLI resolves it)")
        if "\0" in request.path:
            raise InvalidSpec("path: must not contain a NUL byte")
        if request.key and (len(request.key) > 128 or not request.key.isascii() or not request.key.isprintable()):
            raise InvalidSpec("key: at most 128 printable ASCII characters (gpulayer submit makes a uuid4)")
        data = dict(request.spec)
        submitted_by = request.submitted_by
        if requester is not None:
            data["user"] = submitted_by = requester.user
            data["path"] = request.path or DEFAULT_JOB_PATH
        else:
            data["path"] = request.path or data.get("path") or DEFAULT_JOB_PATH
        data = await expand_at_submit(data, personal=self._machine.accounts.mode == "personal")  # profile
        # The workdir is absolute: no base dir is needed (and Path.cwd() would touch the file system).
        spec = capped(job_spec_from_mapping(data, source="job spec", base_dir="/"), self._max_time_limit_s)
        now = self._clock.wall()
        job_id = new_job_id(now, self._rng)
        also = None
        if self.arrays is not None:
            spec, also = await self.arrays.prepare(spec, job_id)
        elif spec.array or spec.after or spec.array_task:
            raise InvalidSpec("array, after: not accepted by this daemon")
        req = spec.to_core(job_id)
        if (unknown := unknown_worker(req.worker, self._names.worker_names())) is not None:
            raise InvalidSpec(f"job spec: {unknown}")  # --worker NAME: exit 2, the known names listed
        rejections = validate(req, self._support)
        root_refusal = None if rejections else self._root_refusal(req.user)
        status = JobStatus.REJECTED if rejections or root_refusal else JobStatus.QUEUED
        if rejections:
            reason, explanation = "; ".join(r.message for r in rejections), ExplanationModel.from_core(
                explain(req, [], self._support))
        elif root_refusal is not None:
            reason, explanation = root_refusal, None
        else:
            reason, explanation = "waiting for the scheduler", None
        row = JobRow(
            id=job_id, name=spec.name, submitted_by=submitted_by, spec_json=spec.model_dump_json(),
            status=status, attempt=0, holder=None, retries_left=spec.policy.retries, lease_s=spec.policy.lease_s,
            retry_json=retry_json(spec.policy.retry_policy()),
            lease_expires_at=None, cancel_requested=False, reason=reason,
            explanation_json=None if explanation is None else explanation.model_dump_json(),
            exit_code=None, submitted_at=now, updated_at=now, seq=None,
        )
        key = (submitted_by, request.key) if request.key else None
        stored = await self._store.jobs.insert_job(row, reason, stimulus_id=f"submit-{job_id}", key=key, also=also)
        if stored.id != job_id:  # a retry of a submission stored before: that job, as it is now
            if not same_spec(stored.spec_json, spec):  # a key names one submission (Stripe's rule)
                raise SubmissionKeyReused(f"key {request.key} was already used for job {stored.id} with a "
                                          "different spec")
            latest = await self._store.jobs.latest_attempts([stored.id] if stored.attempt > 0 else [])
            return Submitted(conceal(self._placed(self.view(stored), latest.get(stored.id)), requester), True)
        self._jobs.remember(job_id, spec)
        if also is not None and self.arrays is not None:
            self.arrays.stored(job_id)
        self._signals.job_changed(job_id)
        self._signals.wake()
        return Submitted(self.view(stored), False)

    def _root_refusal(self, user: str | None) -> str | None:
        """Why a job of root can run nowhere this owner knows (None if some worker may run it): a
        system-mode daemon runs root's jobs only with ``allow_root_jobs``, and every known peer says
        in its capabilities whether it does. Such a job is rejected at submit, not left waiting."""
        if user != "root":
            return None
        accounts = self._machine.accounts
        if accounts.mode != "system" or accounts.allow_root_jobs:
            return None  # (a personal daemon of root's runs them)
        peers = self._directory.worker_snapshots() if self._directory is not None else []
        if any(account_rejection("root", w) is None for w in peers):
            return None
        where = f"{self._names.hostname} and its {len(peers)} known peers" if peers else self._names.hostname
        return (f"no worker runs root's jobs: allow_root_jobs is off on {where} (set allow_root_jobs = true in the "
                "daemon's config of a machine that should, or submit as another user)")

    async def list_jobs(self, statuses: list[str] | None, limit: int | None, scope: str = "local",
                        requester: Requester | None = None, query: JobsQuery | None = None) -> list[JobView]:
        """Jobs in submission order, without attempts and history.

        ``query`` (:mod:`gpulayerd.models.jobs_query`): given ids, one user's jobs, the latest finished
        ones, the last ``query.limit`` (then ``limit`` is not used); the stored rows are selected
        before any view is built, and the merged list of the cluster again. ``query.left_out`` is set.
        Given ids, each job comes exactly as the listing without ids would show it (concealed alike).

        ``scope="cluster"`` adds the jobs every trusted peer that is up owns (asked
        concurrently; a peer that does not answer in time is left out). Every user's jobs are
        listed; the spec of a job that is not ``requester``'s is concealed
        (:func:`~gpulayerd.app.common.requester.conceal`; None: the daemon itself sees everything).

        Raises:
            BadRequest: a status that is not one of the job states.
        """
        wanted = None
        if statuses:
            try:
                wanted = [JobStatus(s) for s in statuses]
            except ValueError as e:
                allowed = ", ".join(s.value for s in JobStatus)
                raise BadRequest(f"state must be one of: {allowed}") from e
        if query is not None and query.active:
            rows = await select_rows(self._store, wanted, query, self.user_of)
        else:
            rows = await self._store.jobs.list_jobs(wanted, limit)
        rows = await with_open_arrays(self._store, rows, wanted)
        latest = await self._store.jobs.latest_attempts([r.id for r in rows if r.attempt > 0])
        explained = query is None or query.explanations
        local = [conceal(self._placed(self.view(r, explained), latest.get(r.id)), requester) for r in rows]
        local = in_states(await self.arrays.summarize(local) if self.arrays is not None else local, statuses)
        if scope != "cluster" or self._directory is None:
            return local
        peers = self._directory.up_ids()
        ask = JobsRequest(msg_id=new_msg_id(), user=requester.user if requester is not None else "",
                          statuses=list(statuses or ()))
        results = await asyncio.gather(*(self._transport.call(p, JOBS, ask) for p in peers),
                                       return_exceptions=True)
        merged = list(local)
        for peer, res in zip(peers, results, strict=True):
            if not isinstance(res, BaseException):
                for j in res.jobs:
                    j.owner_name = self._directory.name_of(peer)
                merged.extend(conceal(j, requester) for j in res.jobs)
        merged.sort(key=lambda j: (j.submitted_at, j.id))
        if query is not None:
            left_here = query.left_out
            merged = select(merged, query, _view_user, lambda j: j.status, lambda j: j.id,
                            is_task=lambda j: j.array_id is not None)
            query.left_out += left_here
            return merged
        return merged[-limit:] if limit else merged

    async def get_job(self, job_ref: str, requester: Requester | None = None) -> JobView:
        """One job with its attempts and full history; its spec concealed unless it is ``requester``'s.

        Raises:
            NoSuchJob, AmbiguousJob.
        """
        row = await self._jobs.row(job_ref)
        attempts = await self._store.jobs.attempts(row.id)
        events = await self._store.jobs.events(row.id)
        view = self.view(row)
        if row.status is JobStatus.QUEUED and view.explanation is not None and view.explanation.verdict != "fits now":
            judged = await self._judge(row)
            view.explanation.hints = judged.hints  # show: the ways forward, judged now
            await self.queue.fill_waiting(view, row, judged, view.spec)  # position, holders, estimate
        elif row.status in (JobStatus.RUNNING, JobStatus.CLAIMED):
            await self.queue.fill_running(view, row)  # its usual duration: a number, never the command
        view.attempts = []
        for a in attempts:
            stored = read_placement(a.placement_json)
            view.attempts.append(AttemptView(
                attempt=a.attempt, worker=a.worker, worker_name=self._names.name_of(a.worker), state=a.state,
                placement=stored.placement, gang=stored.gang, run_dir=a.run_dir or None,
                started_at=a.started_at, ended_at=a.ended_at, exit_code=a.exit_code, reason=a.reason,
            ))
        self._placed(view, next((a for a in attempts if a.attempt == row.attempt), None))
        view.events = [
            EventView(seq=e.seq, at=e.at, kind=e.kind, from_status=e.from_status, to_status=e.to_status,
                      attempt=e.attempt, reason=self._names.readable(e.reason), stimulus_id=e.stimulus_id)
            for e in events
        ]
        view = (await self.arrays.summarize([view]))[0] if self.arrays is not None else view
        return conceal(view, requester)

    async def explain(self, job_ref: str, requester: Requester | None = None) -> ExplanationModel:
        """Why the job is where it is.

        A queued job is judged against this machine and every known peer now (the worker x
        requirement table and a verdict). Any other job gets its ``state`` (see
        :mod:`gpulayerd.app.owner.explainer`): where it runs or ran, how it ended, why and by
        whom; a failed job's stderr tail only for its user and admins (``requester`` None:
        the daemon itself).

        Raises:
            NoSuchJob, AmbiguousJob.
        """
        row = await self._jobs.row(job_ref)
        if row.status is not JobStatus.QUEUED:
            return await self._explain_state(row, requester)
        fresh = explainer.held_back(_keep_fair_share(await self._judge(row), row), row.reason)
        await self.queue.fill_waiting(fresh, row, fresh, self._jobs.spec(row))  # position, holders, estimate
        req = self._jobs.spec(row).to_core(row.id)
        if requester is not None and not requester.may_manage(self.user_of(row)):
            fresh = hide_path(fresh, req.workdir)  # the job's user's (and admins') to see, like its spec
        return fresh

    async def _judge(self, row: JobRow) -> ExplanationModel:
        """A queued job judged against this machine and the peers now, with its nearest-miss hints."""
        spec = self._jobs.spec(row)
        req = spec.to_core(row.id)
        worker = await self._machine.snapshot(refresh_apps=True, workdirs=[(req.user, req.workdir)])
        remote = self._directory.worker_snapshots() if self._directory is not None else []
        return explainer.explain_with_hints(req, [worker, *remote], self._support, origins=spec.requirement_origins)

    async def _explain_state(self, row: JobRow, requester: Requester | None) -> ExplanationModel:
        """``explain`` of a job that is not queued: its state section (see :func:`explainer.build_state`)."""
        attempts = await self._store.jobs.attempts(row.id)
        events = await self._store.jobs.events(row.id)
        lease = self._jobs.record(row).lease_expires_at
        lease_wall = None if lease is None else self._clock.wall() + (lease - self._clock.monotonic())
        tail = None
        if row.status is JobStatus.FAILED and row.attempt > 0:
            tail = await self._stderr_tail(row, attempts, requester)
        state = explainer.build_state(row, attempts, events, owner_name=self._names.hostname,
                                      name_of=self._names.name_of, readable=self._names.readable,
                                      lease_expires_at=lease_wall, tail=tail)
        base = explanation_of(row.explanation_json) if row.status is JobStatus.REJECTED else None
        explained = explainer.state_explanation(row.id, state, base)
        if requester is not None and not requester.may_manage(self.user_of(row)):
            workdir = self._jobs.spec(row).workdir
            if workdir:  # in reasons and events (a start failure names it): the job's user's to see
                explained = hide_path(explained, workdir)
        return explained

    async def _stderr_tail(self, row: JobRow, attempts: list[AttemptRow],
                           requester: Requester | None) -> explainer.Tail:
        """The end of the last attempt's stderr, where it ran; none for who may not read the job's logs."""
        user = self.user_of(row)
        if requester is not None and not requester.may_manage(user):
            return explainer.Tail(None, f"hidden: only {user or 'its user'} and admins see its stderr")
        worker = next((a.worker for a in attempts if a.attempt == row.attempt), self.node_id)
        try:
            if self._directory is not None and worker != self.node_id:
                return await explainer.remote_tail(lambda offset: self.logs(row.id, "stderr", offset, row.attempt))
            return await explainer.local_tail(self._starter.log_path(row.id, row.attempt, "stderr"))
        except (PeerUnreachable, NoSuchJob) as e:
            return explainer.Tail(None, f"cannot read stderr: {e}")

    async def cancel(self, job_ref: str, requester: Requester | None = None, signal: str = "") -> JobView:
        """Cancel: a queued job at once; a running one by SIGTERM (or ``signal``, a name of
        :data:`~gpulayerd.core.job_policy.WARN_SIGNALS`), grace, SIGKILL.

        Only the job's user and admins may: that is the route's role, checked before (local
        ``cancel``: :class:`~gpulayerd.app.roles.LocalRoles`; relayed: :class:`~gpulayerd.app.roles.PeerRoles`).
        ``requester`` (None: the daemon itself) is named in the job's history.

        Raises:
            NoSuchJob, AmbiguousJob.
        """
        who = f" by {requester.user}" if requester is not None else ""  # explain's "by whom"
        try:
            row = await self._jobs.row(job_ref)
        except NoSuchJob:  # a task of an array not materialized yet: written cancelled ahead of the cursor
            pending = await self.arrays.cancel_pending(
                job_ref, requester.may_manage if requester is not None else None, who) if self.arrays else None
            if pending is None:
                raise
            return self.view(pending)
        await self._jobs.apply(row.id, claims.CancelRequested(reason=f"cancelled{who or ' by user'}",
                                                              stimulus_id=f"cancel-{row.id}", signal=signal),
                               kind=f"cancel requested{who}")
        if self.arrays is not None and self.arrays.is_array(self._jobs.spec(row)):
            await self.arrays.cancel_rest(row.id, who)  # every task not yet ended
        return self.view(await self._jobs.row(row.id))

    async def logs(self, job_ref: str, stream: str, offset: int, attempt: int | None,
                   requester: Requester | None = None, rank: int | None = None,
                   limit: int | None = None) -> LogChunk:
        """Bytes of a job's log from ``offset`` (at most ``limit``, at most and by default 1 MiB), as
        text, wherever the attempt ran.

        Only the job's user and admins may read them: that is the route's role, checked before
        (see :meth:`cancel`). ``rank``: of a multi-host job, node rank ``rank``'s log, read from
        the member that ran it (None: the log on the attempt's worker, for a multi-host job this
        owner's own rank); a one-host job has only rank 0.

        Raises:
            NoSuchJob: no such job or attempt. PeerUnreachable: the worker that ran it did not answer.
            BadRequest: no such rank.
        """
        del requester  # the role check decided; the log itself is the same for everyone who may read it
        row = await self._jobs.row(job_ref)
        if attempt is not None and not 1 <= attempt <= row.attempt:
            raise NoSuchJob(f"job {row.id} has no attempt {attempt} (attempts: 1 to {row.attempt})"
                            if row.attempt else f"job {row.id} has not run yet")
        n = attempt if attempt is not None else row.attempt
        terminal = row.status in claims.TERMINAL or (attempt is not None and attempt < row.attempt)
        if n <= 0:
            return LogChunk(job_id=row.id, attempt=0, stream=stream, offset=0, next_offset=0, data="",
                            complete=row.status in claims.TERMINAL)
        if self._directory is not None or rank is not None:
            tried = next((a for a in await self._store.jobs.attempts(row.id) if a.attempt == n), None)
            worker = tried.worker if tried is not None else self.node_id
            if rank is not None:
                worker = _rank_member(row.id, n, tried, rank) or worker
            if worker != self.node_id:
                try:
                    chunk = await self._transport.call(worker, LOGS, LogRequest(
                        job_id=row.id, attempt=n, stream=stream, offset=offset, limit=limit))
                except PeerCallError as e:
                    raise PeerUnreachable(f"cannot read the log on {worker[:12]}: {e}") from e
                return chunk.model_copy(update={"complete": chunk.complete or (
                    terminal and chunk.next_offset == chunk.offset)})
        path = self._starter.log_path(row.id, n, stream)
        return await read_log(path, row.id, n, stream, offset, terminal, limit)

    def _placed(self, view: JobView, latest: AttemptRow | None) -> JobView:
        """``view`` with WHERE (``where_*``) from its current attempt's row; none while it waits."""
        if latest is None or view.status in (JobStatus.QUEUED.value, JobStatus.REJECTED.value):
            return view
        stored = read_placement(latest.placement_json)
        view.where_node = latest.worker
        view.where_name = self._names.name_of(latest.worker)
        if latest.place:  # a Slurm worker's node
            view.where_name = f"{view.where_name or latest.worker[:12]}/{latest.place}"
        view.where_hosts = [self._names.name_of(m) or m[:12] for m in stored.gang]
        if not stored.gang:
            view.where_devices = stored.device_indices
        return view

    def user_of(self, row: JobRow) -> str:
        """The user a job owned here belongs to: its spec's ``user``, else (older jobs) ``submitted_by``."""
        return job_user(self._jobs.spec(row).user, row.submitted_by)

    def _reason(self, row: JobRow) -> str:
        """``row``'s reason as shown: node ids as host names, a holder job owned here with its name and
        user (``job m8… (train, alice; on ws-1)``), and a waiting job of a machine removed from the cluster says
        so first."""
        reason = self._names.readable(row.reason)
        if row.status is JobStatus.QUEUED and "job " in reason:
            reason = _HOLDER_JOB.sub(self._holder_words, reason)
        if row.status is JobStatus.QUEUED and self._directory is not None and self._directory.removed:
            return removed_reason(reason)
        return reason

    def _holder_words(self, m: re.Match[str]) -> str:
        """``job ID`` as named in a reason, with the job's name and user when its spec is at hand here."""
        spec = self._jobs.cached_spec(m.group(1))
        if spec is None:
            return m.group(0)
        who = ", ".join(w for w in (spec.name, spec.user) if w)
        if not who:
            return m.group(0)
        return f"job {m.group(1)} ({who}; " if m.group(2) else f"job {m.group(1)} ({who})"

    def view(self, row: JobRow, explanation: bool = True) -> JobView:
        """The API's view of a job owned here (without attempts and history; without the last
        explanation too when ``explanation`` is False: a listing that does not show it)."""
        return JobView(
            id=row.id, name=row.name, submitted_by=row.submitted_by, owner=self.node_id,
            owner_name=self._names.hostname, status=row.status.value,
            attempt=row.attempt, holder=row.holder, holder_name=self._names.name_of(row.holder),
            retries_left=row.retries_left, cancel_requested=row.cancel_requested,
            reason=self._reason(row), exit_code=row.exit_code,
            submitted_at=row.submitted_at, updated_at=row.updated_at, spec=self._jobs.spec(row),
            array_id=None if (task := self._jobs.spec(row).array_task) is None else task.array_id,
            # The last matching is the answer only while the job waits (or was rejected at submit):
            # a running or finished job is told by `explain`'s state, never by a stale "fits".
            explanation=(None if row.explanation_json is None or not explanation
                         or row.status not in (JobStatus.QUEUED, JobStatus.REJECTED)
                         else explanation_of(row.explanation_json)),
        )

    # ------------------------------------------------------------- peer routes

    def env_for(self, node: str, job: JobView) -> JobView:
        """``job`` as node ``node`` may have it: environment values go only to the node that runs the
        job (its holder, or a member of its gang); for any other node ``spec.env`` keeps its names
        and every value is ``""``."""
        spec = job.spec
        if spec is None or not spec.env or self._runs_on(node, job):
            return job
        return job.model_copy(update={"spec": spec.model_copy(update={"env": dict.fromkeys(spec.env, "")})})

    def _runs_on(self, node: str, job: JobView) -> bool:
        """True if the current attempt of ``job`` runs on ``node`` (its holder, or a rank of its gang)."""
        if job.status not in (JobStatus.CLAIMED.value, JobStatus.RUNNING.value):
            return False
        g = self._gangs.attempt(job.id)
        if g is not None and g.attempt == job.attempt and node in g.members:
            return True
        return job.holder == node

    async def claim(self, sender: Sender, msg: Claim) -> ClaimReply:
        """Peer route ``claim`` (role: a worker the job was offered to, that fits it and may run its
        user's jobs): the compare-and-set, then GRANT (with the spec, environment values included:
        the sender runs it) or DENY."""
        worker, job_id = sender.node_id, msg.job_id
        # Where its logs go, when the claimer is this machine (shown with the attempt).
        here = (lambda n: str(self._starter.run_dir(job_id, n))) if worker == self.node_id else None
        # Read, decided and written in one transaction of the store.
        granted = await self._jobs.grant(job_id, worker, msg.msg_id, dump_placement(msg.placement, worker),
                                         run_dir_of=here)
        if not isinstance(granted, Granted):
            self._signals.stats["claim_requests_denied"] += 1
            return ClaimReply(granted=False, reason=granted)
        if granted.fresh:
            self._signals.stats["claim_requests_granted"] += 1
        spec = await self._jobs.spec_of(job_id)  # (cached: parsed at submit)
        return ClaimReply(granted=True, attempt=granted.attempt, lease_s=granted.lease_s,
                          spec=spec.model_dump(mode="json") if spec is not None else None)

    async def report(self, sender: Sender, msg: RunReport) -> RunReportReply:
        """Peer route ``report`` (role: the holder of the attempt, or of an earlier one): a worker
        reports on an attempt of one of our jobs (started, renew, exited, lost).

        A report on an attempt that is not current is answered "stale" by the claim machine
        (the sender stops that run), and then nothing is stored.
        """
        worker = sender.node_id
        row = await self._jobs.current(msg.job_id)  # (kept while active: decided without a read)
        if row is None:
            return RunReportReply(ok=False, stale=True)
        gang_reply = await self._gangs.report(row, sender, msg)
        if gang_reply is not None:
            return gang_reply
        # One decision of the claim machine; the attempt row and the job row written together.
        actions = await self._jobs.reported(row.id, msg.kind, msg.attempt, worker, exit_code=msg.exit_code,
                                            reason=msg.reason, never_started=msg.never_started,
                                            stimulus_id=msg.msg_id, row=row, timed_out=msg.timed_out,
                                            preflight=msg.preflight_failed, where=msg.where)
        stale = next((a for a in actions if isinstance(a, claims.ReplyStale)), None)
        if stale is not None:
            return RunReportReply(ok=False, stale=True, current_attempt=stale.current_attempt)
        persisted = next((a for a in actions if isinstance(a, claims.PersistJob)), None)
        if msg.kind == "started" and persisted is not None and msg.reason.startswith("Transfer: "):  # --ship
            await self._store.jobs.add_event(msg.job_id, "transfer", msg.reason[:500], attempt=msg.attempt,
                                             now_wall=self._clock.wall())
        return RunReportReply(ok=True, current_attempt=persisted.record.attempt if persisted is not None
                              else row.attempt)

    async def check_leases(self, grace_s: float) -> None:
        """Owner side of the lease tick: attempts whose lease ran out are lost."""
        await self._jobs.check_leases(grace_s)


def _view_user(job: JobView) -> str:
    """The user a listed job belongs to (its spec's ``user``; jobs from before users: ``submitted_by``)."""
    return job_user(job.spec.user, job.submitted_by)


def _rank_member(job_id: str, attempt: int, tried: AttemptRow | None, rank: int) -> str | None:
    """The node that ran node rank ``rank`` of the attempt (None: a one-host job's rank 0).

    Raises:
        BadRequest: the attempt has no such rank.
    """
    gang = read_placement(tried.placement_json).gang if tried is not None else []
    if not gang:
        if rank == 0:
            return None
        raise BadRequest(f"job {job_id} attempt {attempt} ran on one host: it has only rank 0")
    if not 0 <= rank < len(gang):
        raise BadRequest(f"job {job_id} attempt {attempt} has ranks 0 to {len(gang) - 1}")
    return gang[rank]


def _keep_fair_share(fresh: ExplanationModel, row: JobRow) -> ExplanationModel:
    """``fresh`` with the fair-share rejections of the scheduler's last pass kept.

    ``explain`` recomputes the match, which knows devices, not the queue: that a queued job
    waits because another user's job went first (FAIR_SHARE, set by the scheduler's pass) is
    only in the stored explanation. It is carried into each worker row still busy now.
    """
    stored = explanation_of(row.explanation_json) if row.status is JobStatus.QUEUED else None
    if stored is None:
        return fresh
    fair = {r.worker: r for w in stored.workers for r in w.rejections if r.code == RejectionCode.FAIR_SHARE.value}
    if not fair:
        return fresh
    for w in fresh.workers:
        kept = fair.get(w.worker)
        if kept is not None and w.state == FitState.FITS_BUT_BUSY.value and all(
                r.code != kept.code for r in w.rejections):
            w.rejections.insert(0, kept)
    if any(w.rejections and w.rejections[0].code == RejectionCode.FAIR_SHARE.value for w in fresh.workers):
        first = next(w.rejections[0] for w in fresh.workers
                     if w.rejections and w.rejections[0].code == RejectionCode.FAIR_SHARE.value)
        fresh.summary = f"{fresh.verdict}: {first.message}"
    return fresh
