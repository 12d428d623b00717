"""THE role checks: whether the caller of a route holds the role the route table declares.

Every peer message passes :meth:`PeerRoles.check` (through :class:`gpulayerd.api.peer.PeerRouter`)
and every local request :meth:`LocalRoles.check` (through the local API), before any handler
runs. A check only reads facts the caller cannot forge and changes nothing:

- the sender's node id, mode and bound user, from its TLS certificate (:class:`Sender`);
- the local requester's uid, from the kernel (:class:`~gpulayerd.app.common.requester.Requester`);
- the job rows, attempts, offers, gangs, runs, holds and grants this daemon keeps.

The roles (see :class:`gpulayerd.routes.Role` for their words):

- ``JOB_OWNER`` (offer, hold): the sender vouches for the job's user (a system-mode node for
  anyone, a personal-mode node for its bound user only) and the job id is not bound here to
  another owner: on a worker a job id belongs to one owner (this daemon's own jobs, and every
  offer, hold, run and stored run of a peer's), so runs, grants and logs keyed by (job id,
  attempt) are keyed by (owner, job id, attempt).
- ``OFFERED_WORKER`` (claim): the job is owned here, this owner offered it to the sender (an
  offer still standing), the sender fits it as this owner last saw the sender (now, or once its
  busy devices free), and the sender may run the job's user's jobs: a personal-mode node (its
  certificate says so, whatever its capabilities say) only its bound user's. The holder of the
  current attempt asking again for its grant holds the role too.
- ``HOLDER`` (report): the job is owned here and the sender holds that attempt (its worker,
  or a member of its gang).
- ``RUN_OWNER`` (kill, logs, ship_files): the attempt runs or ran here for the sender.
- ``HOLD_OWNER`` (release, commit): the hold, if kept here, was placed by the sender (for that job).
- ``RELAYED_JOB_USER_OR_ADMIN`` (a peer's logs and cancel) and ``JOB_USER_OR_ADMIN`` (local
  logs and cancel): the job's user, or an admin. For a relayed request the user name counts
  only if the sender vouches for it, and admin rights are decided here from this node's own
  ``admin_group``: a personal-mode node's user is never an admin elsewhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from gpulayerd import routes
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger
from gpulayerd.app.common.names import Names
from gpulayerd.app.common.owned_jobs import OwnedJobs
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.common.requester import Requester, Requesters
from gpulayerd.app.owner.gang_placement import GangCoordinator
from gpulayerd.core.arrays import split_task_id
from gpulayerd.core.job_facts import job_user
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.types import SupportMatrix, WorkerSnapshot
from gpulayerd.core.users import PERSONAL, SYSTEM, vouch_refusal, vouches
from gpulayerd.core.verdict import FitState
from gpulayerd.errors import AmbiguousJob, Forbidden, NoSuchJob
from gpulayerd.models.snapshots import OutputChunk, ShipFetch, TreeFiles
from gpulayerd.models.stored import spec_of
from gpulayerd.net.transport import Sender
from gpulayerd.net.wire import Claim, Commit, Hold, JobRequest, Kill, LogRequest, Offer, Release, RunReport
from gpulayerd.store import Store

__all__ = ["LocalRoles", "PeerRoles", "relayed_requester"]

Role = routes.Role


def relayed_requester(sender: Sender, user: str, is_admin: bool) -> Requester:
    """Who a request relayed by ``sender`` is made by, as far as its certificate vouches.

    Args:
        sender: the relaying node (its certificate's mode and bound user).
        user: the user name the request carries.
        is_admin: whether ``user`` is an admin on THIS node (its own ``admin_group``; the
            sender's word is never taken for it).

    Returns:
        A requester named ``user`` if the sender vouches for it (else named ``""``: nobody's
        jobs), admin only if vouched, the sender is a system-mode node and ``is_admin``. Its uid is -1.
    """
    vouched = vouches(sender.mode, sender.user, user)
    return Requester(uid=-1, user=user if vouched else "",
                     admin=vouched and sender.mode == SYSTEM and is_admin)


def _vouch_words(sender: Sender, user: str, name: str) -> str:
    if not user:
        return f"{name} named no user"
    if sender.mode == PERSONAL and sender.user:
        return (f"{name} is {sender.user}'s personal-mode node: it speaks only for {sender.user}, "
                f"not for {user!r} (only a system-mode node vouches for other users)")
    return f"{name}'s certificate vouches for no user: it cannot ask for {user!r}"


class PeerRoles:
    """The role checks of the peer routes (a :class:`~gpulayerd.net.transport.RoleCheck`).

    Args:
        node_id: this node.
        store: job rows, attempts, remote runs (reads only).
        jobs: the jobs owned here: rows, specs, the offers sent.
        gangs: the gang attempts being run (their members).
        ledger: offers kept, runs, holds on this worker.
        directory: what this node knows of its peers (None outside a cluster).
        requesters: who is an admin here (by name, from the user database).
        support: the support matrix (the fit of a claimer).
        clock: monotonic time (offers stand for a while).
        names: node ids -> host names, for the refusals' words.
        own: this machine's snapshot now (the fit of this node's own claims; None: not known).
    """

    def __init__(self, *, node_id: str, store: Store, jobs: OwnedJobs, gangs: GangCoordinator, ledger: Ledger,
                 directory: Directory | None, requesters: Requesters, support: SupportMatrix, clock: Clock,
                 names: Names | None = None, own: Callable[[], Awaitable[WorkerSnapshot]] | None = None) -> None:
        self.node_id = node_id
        self._store = store
        self._jobs = jobs
        self._gangs = gangs
        self._ledger = ledger
        self._directory = directory
        self._requesters = requesters
        self._support = support
        self._clock = clock
        self._names = names
        self._own = own
        self.listed: Callable[[str, str], Awaitable[bool]] | None = None
        """``(snapshot id, digest) -> whether that snapshot's manifest lists the content`` (the owner's
        content store, set once it exists; None: no shipped job is served)."""

    def _name(self, node_id: str) -> str:
        name = self._names.name_of(node_id) if self._names is not None else None
        return name or f"node {node_id[:12]}"

    async def check(self, route: routes.Route, sender: Sender, body: BaseModel | None) -> str | None:
        """None if ``sender`` holds ``route.role`` for ``body``; else why not. Changes nothing."""
        role = route.role
        if role.public:
            return None
        if role is Role.JOB_OWNER and isinstance(body, (Offer, Hold)):
            return await self._job_owner(sender, body)
        if role is Role.OFFERED_WORKER and isinstance(body, Claim):
            return await self._offered_worker(sender, body)
        if role is Role.HOLDER and isinstance(body, (RunReport, OutputChunk)):
            return await self._holder(sender, body)
        if role is Role.SHIP_HOLDER and isinstance(body, ShipFetch):
            return await self._ship_holder(sender, body)
        if role is Role.RUN_OWNER and isinstance(body, (Kill, LogRequest, TreeFiles)):
            return await self._run_owner(sender, body)
        if role is Role.HOLD_OWNER and isinstance(body, (Release, Commit)):
            return self._hold_owner(sender, body)
        if role is Role.RELAYED_JOB_USER_OR_ADMIN and isinstance(body, JobRequest):
            return await self._relayed_user(sender, body)
        return f"no check of role {role.name} for {type(body).__name__}"  # a route the table and this disagree on

    # ------------------------------------------------------------------ worker side

    async def _other_owner(self, job_id: str, owner: str,
                           stored: list[tuple[str, int | None]] | None = None, *, runs_only: bool = False
                           ) -> str | None:
        """Another owner this worker knows job ``job_id`` under (this node for its own job), or None.

        ``stored``: :meth:`~gpulayerd.store.RunsTable.job_claims` of the job, when read already.
        ``runs_only``: only runs bind the id (offers and holds of other owners do not: any member
        may send them, so they must not keep the real owner's offers out).
        """
        for known in self._ledger.state.owners_of(job_id, runs_only=runs_only):
            if (known or self.node_id) != owner:
                return known or self.node_id
        for known, _ in stored if stored is not None else await self._store.runs.job_claims(job_id):
            if (known or self.node_id) != owner:
                return known or self.node_id
        return None

    async def _job_owner(self, sender: Sender, msg: Offer | Hold) -> str | None:
        raw = msg.spec.get("user")
        user = raw if isinstance(raw, str) and raw else (sender.user if sender.mode == PERSONAL else "")
        if sender.node_id != self.node_id:
            why = vouch_refusal(sender.mode, sender.user, user, self._name(sender.node_id))
            if why is not None:
                return why
        if isinstance(msg, Hold):
            h = self._ledger.state.holds.get(msg.hold_id)
            if h is not None and (h.owner != sender.node_id or h.job_id != msg.job_id):
                return f"hold {msg.hold_id} is another owner's or another job's"
        # This node's own offer: its job is owned here, so only a peer's run stored under the same
        # id can bind it to another owner (from memory; a peer's offer reads every claim of the id).
        own: list[tuple[str, int | None]] | None = [(o, a) for o, a in await self._store.runs.stored_runs(
            msg.job_id)] if sender.node_id == self.node_id else None
        other = await self._other_owner(msg.job_id, sender.node_id, own, runs_only=True)
        if other is not None:
            return f"job id {msg.job_id} is another owner's here ({other[:12]})"
        return None

    async def _run_owner(self, sender: Sender, msg: Kill | LogRequest | TreeFiles) -> str | None:
        entry = self._ledger.state.runs.get((msg.job_id, msg.attempt))
        if entry is not None and entry.owner == sender.node_id:
            return None  # it runs here for the sender (its job id was bound to it when the run began)
        # Every run of the job stored here (from memory after the first look: no read per message).
        stored = await self._store.runs.stored_runs(msg.job_id)
        for known in self._ledger.state.owners_of(msg.job_id, runs_only=True):
            if (known or self.node_id) != sender.node_id:
                return f"job {msg.job_id} is another owner's here ({(known or self.node_id)[:12]})"
        other = next((owner for owner, _ in stored if owner != sender.node_id), None)
        if other is not None:
            return f"job {msg.job_id} is another owner's here ({other[:12]})"
        if (sender.node_id, msg.attempt) in stored:
            return None
        return f"no attempt {msg.attempt} of job {msg.job_id!r} runs here for it"

    def _hold_owner(self, sender: Sender, msg: Release | Commit) -> str | None:
        h = self._ledger.state.holds.get(msg.hold_id)
        if h is None:
            return None  # nothing kept: the handler finds nothing to release or commit
        if h.owner != sender.node_id:
            return f"hold {msg.hold_id} was placed by {h.owner[:12]}"
        if isinstance(msg, Commit) and h.job_id != msg.job_id:
            return f"hold {msg.hold_id} is for job {h.job_id}, not {msg.job_id}"
        return None

    # ------------------------------------------------------------------ owner side

    async def _ship_holder(self, sender: Sender, msg: ShipFetch) -> str | None:
        held = self._jobs.holder_of(msg.job_id)
        if held is None or held != (msg.attempt, sender.node_id):
            facts = await self._store.jobs.holder_facts(msg.job_id, msg.attempt)
            if facts is None:
                return f"no job {msg.job_id} here"
            if (facts[0], facts[1]) != (msg.attempt, sender.node_id):
                return f"job {msg.job_id} attempt {msg.attempt} is not held by it now"
        spec = self._jobs.cached_spec(msg.job_id) or await self._jobs.spec_of(msg.job_id)
        snapshot = spec.ship.snapshot if spec is not None and spec.ship is not None else None
        if snapshot is None:
            return f"job {msg.job_id} is not shipped"
        if msg.digest == snapshot:
            return None  # its manifest
        if self.listed is None or not await self.listed(snapshot, msg.digest):
            return f"the snapshot of job {msg.job_id} lists no content {msg.digest[:12]!r}"
        return None

    async def _holder(self, sender: Sender, msg: RunReport | OutputChunk) -> str | None:
        g = self._gangs.attempt(msg.job_id)
        if g is not None and g.attempt == msg.attempt and sender.node_id in g.members:
            return None
        cached = self._jobs.holder_of(msg.job_id)
        if cached is not None and cached[0] == msg.attempt:  # the current attempt: decided without a read
            if cached[1] == sender.node_id:
                return None  # its holder (a renewal, say); the claim machine decides what it means
            return f"job {msg.job_id} attempt {msg.attempt} is held by {(cached[1] or 'nobody')[:12]}"
        facts = await self._store.jobs.holder_facts(msg.job_id, msg.attempt)  # one read
        if facts is None:
            return f"no job {msg.job_id} here"
        current, holder, held = facts
        if msg.attempt == current and holder == sender.node_id:
            self._jobs.note_holder(msg.job_id, current, holder)
            return None
        if msg.attempt <= current and sender.node_id in held:
            return None  # that attempt's holder (an earlier one: the claim machine answers it "stale")
        return f"job {msg.job_id} attempt {msg.attempt} is held by {(holder or 'nobody')[:12]}"

    async def _offered_worker(self, sender: Sender, msg: Claim) -> str | None:
        held = self._jobs.holder_of(msg.job_id)
        if held is not None and held[1] == sender.node_id:
            return None  # the holder asking again for its grant (a lost reply)
        user = self._jobs.standing_offer(msg.job_id, sender.node_id)  # the offer this owner sent: no read
        if user is None:
            others = self._jobs.offered_to_others(msg.job_id, sender.node_id)
            if others is not None:  # offered now, to other workers only (and not its holder): no read
                if others and sender.mode != SYSTEM and not vouches(sender.mode, sender.user, others):
                    return f"it is {sender.user or 'nobody'}'s personal-mode node: it may not run {others}'s jobs"
                return f"job {msg.job_id} was not offered to it"
            # No read: the holder cache knows every active job owned here (recovery fills it at start,
            # every grant and end keeps it), so a holder asking again was let through above; the
            # job's user, for the words, comes from the spec cache when it is there.
            spec = self._jobs.cached_spec(msg.job_id)
            user = (spec.user or "") if spec is not None else ""
            if user and sender.mode != SYSTEM and not vouches(sender.mode, sender.user, user):
                return f"it is {sender.user or 'nobody'}'s personal-mode node: it may not run {user}'s jobs"
            if held is not None:
                return f"job {msg.job_id} was not offered to it (attempt {held[0]} is {(held[1] or '?')[:12]}'s)"
            return f"job {msg.job_id} was not offered to it (no standing offer here)"
        # (a job that names no user runs as the user its owner is bound to: see Accounts.vet)
        if user and sender.mode != SYSTEM and not vouches(sender.mode, sender.user, user):
            return f"it is {sender.user or 'nobody'}'s personal-mode node: it may not run {user}'s jobs"
        if sender.node_id == self.node_id:  # this node's own claim: judged on this machine as it is now
            snapshot = await self._own() if self._own is not None else None
        else:
            snapshot = self._directory.snapshot_of(sender.node_id) if self._directory is not None else None
        if snapshot is None:
            return "its capabilities are not known here"
        spec = self._jobs.cached_spec(msg.job_id) or await self._jobs.spec_of(msg.job_id)
        if spec is None:
            return f"no job {msg.job_id} here"
        if sender.mode != SYSTEM:  # a personal certificate binds it, whatever the worker says of itself
            snapshot = snapshot.with_identity(sender.mode, sender.user)
        verdict = evaluate(spec.to_core(msg.job_id), snapshot, self._support)
        if verdict.state is FitState.NO_FIT:  # busy or "offline" (it is claiming) is the worker's to judge
            first = verdict.rejections[0].message if verdict.rejections else verdict.state.value
            return f"job {msg.job_id} does not fit it: {first}"
        return None  # queued or not is the claim machine's to decide (the compare-and-set)

    async def _relayed_user(self, sender: Sender, msg: JobRequest) -> str | None:
        user = await self._job_user(msg.job_id)
        if user is None:
            return None  # not known here: the handler answers "no such job"
        is_admin = sender.mode == SYSTEM and await self._requesters.admin_by_name(msg.user)
        requester = relayed_requester(sender, msg.user, is_admin)
        if requester.may_manage(user):
            return None
        if not requester.user and not requester.admin:
            return _vouch_words(sender, msg.user, self._name(sender.node_id))
        return f"job {msg.job_id} belongs to {user or 'nobody'}"

    async def _job_user(self, job_id: str) -> str | None:
        """The user of job ``job_id`` owned here, else of the latest run of it held here; None if neither."""
        row = await self._jobs.get(job_id)
        if row is not None:
            return job_user(self._jobs.spec(row).user, row.submitted_by)
        pending = await _array_user(self._jobs, job_id)  # a task of an array owned here, not written yet
        return pending if pending is not None else await self._store.runs.held_user(job_id)


class LocalRoles:
    """The role checks of the local routes.

    Args:
        store: job rows and held runs (reads only).
        jobs: the jobs owned here.
    """

    def __init__(self, *, store: Store, jobs: OwnedJobs) -> None:
        self._store = store
        self._jobs = jobs

    async def check(self, route: routes.Route, requester: Requester, job_ref: str | None) -> None:
        """Return if ``requester`` holds ``route.role`` (for the job ``job_ref`` names); changes nothing.

        A job not owned here and not held here is decided by its owner when the request is
        relayed there (:attr:`~gpulayerd.routes.Role.RELAYED_JOB_USER_OR_ADMIN`).

        Raises:
            Forbidden: ``job <id> belongs to <user>``.
        """
        if route.role.public or job_ref is None:
            return
        try:
            row = await self._jobs.row(job_ref)
        except (NoSuchJob, AmbiguousJob):
            row = None
        pending = await _array_user(self._jobs, job_ref) if row is None else None
        if row is not None:
            user = job_user(self._jobs.spec(row).user, row.submitted_by)
            job_id = row.id
        elif pending is not None:  # a task of an array owned here, not written yet: the array's user's
            user, job_id = pending, job_ref
        else:
            held = await self._store.runs.held_user(job_ref)
            if held is None:  # an id prefix: the runs held here it names, resolved as the handler will
                named = await self._held_by_prefix(job_ref)
                if len(named) != 1:
                    return  # none (the owner decides) or several (the handler answers "ambiguous")
                (job_id, held), = named.items()
            else:
                job_id = job_ref
            user = held
        if not requester.may_manage(user):
            raise Forbidden(f"job {job_id} belongs to {user or 'nobody'}")

    async def _held_by_prefix(self, prefix: str) -> dict[str, str]:
        """Job id -> user of the latest run of each job held here for another owner whose id starts
        with ``prefix``."""
        latest: dict[str, tuple[int, str]] = {}
        for r in await self._store.runs.remote_runs():
            if r.job_id.startswith(prefix) and r.attempt >= latest.get(r.job_id, (-1, ""))[0]:
                latest[r.job_id] = (r.attempt, spec_of(r.spec_json).user or "")
        return {job_id: user for job_id, (_, user) in latest.items()}


async def _array_user(jobs: OwnedJobs, job_ref: str) -> str | None:
    """The user of task ``job_ref`` (``ID_7``) of an array owned here when it has no row yet (its array's
    user: the task is theirs), else None."""
    task = split_task_id(job_ref)
    row = await jobs.get(task[0]) if task is not None else None
    if row is None:
        return None
    spec = jobs.spec(row)
    return job_user(spec.user, row.submitted_by) if spec.array is not None and spec.array_task is None else None
