"""The scheduler's judgements beside the matcher: queue keys, frozen snapshots and their path answers, peer loads,
the size of each peer's fit and the peer an offer goes to (best fit, then least loaded; not the
worker a retry avoids while another fits), fair share in a waiting job's reason (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import FreezeMemo, ShapeBook, freeze
from gpulayerd.core.matching.targeting import workstation_first
from gpulayerd.core.protocol.targets import Fit, OfferRound, WorkerLoad, choose_target, fit_size
from gpulayerd.core.scheduling.retrying import OfferAges, prefer_others
from gpulayerd.core.scheduling.steps import Key, MachineRead, QueuedJob, SendOffer
from gpulayerd.core.types import DeviceKind, DeviceSnapshot, DeviceState, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, Placement, Rejection, RejectionCode, Verdict

__all__ = ["BUSY_OFFERS", "StandingOffers", "busy_target", "due_offers", "elsewhere", "fair_order", "fit_of",
           "order_key", "others_hold_gpus", "overflow_waits", "pair_key", "pass_inputs", "paths_changed", "peer_fits",
           "peer_loads", "settled_for", "smaller_than_here", "spread", "user_ranks", "with_fair_share", "without_paths"]

_HELD = frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS})

BUSY_OFFERS = 2
"""Standing offers of jobs that wait for a busy peer, per user and peer in one pass (see
:func:`busy_target`): the heads of each user's line, so that the peer chooses among every waiting
user's jobs by fair share when its devices free up."""

# ---------------------------------------------------------------------------------------- helpers


def order_key(job: QueuedJob, user: str, scores: Mapping[str, float]) -> Key:
    """:func:`gpulayerd.core.fairshare.order`'s key of a queued job: user's score, seq, id, user."""
    return (scores.get(user, 0.0), float(job.seq if job.seq is not None else 0), job.id, user)


def user_ranks(users: Iterable[str], usage: Mapping[str, fairshare.Usage] | None) -> tuple[tuple[float, str], ...]:
    """Each of ``users``' rank by fair-share score, by user name (equal scores, equal ranks; 0 without
    a usage book)."""
    names = sorted(users)
    if usage is None:
        return tuple((0.0, u) for u in names)
    scores = {u: fairshare.score(usage, u) for u in names}
    rank = {sc: float(i) for i, sc in enumerate(sorted(set(scores.values())))}
    return tuple((rank[scores[u]], u) for u in names)


def pass_inputs(users: Iterable[str], remote: Sequence[WorkerSnapshot], usage: Mapping[str, fairshare.Usage] | None,
                memo: FreezeMemo) -> object:
    """What a scheduler pass reads that changes without a wake-up: the peers' snapshots (``remote``,
    frozen with ``memo``, whose round then turns) and the fair-share order of ``users`` (by ``usage``)."""
    order: list[str] = []
    names = sorted(users)
    if usage is not None and names:
        order = [c.user for c in fairshare.order((fairshare.Candidate(u, u, 0.0) for u in names), usage)]
    frozen = freeze(sorted(remote, key=lambda w: w.node_id), memo)
    memo.turn()  # a round: from one call here to the next (a pass, or an idle check)
    return (frozen, tuple(order))


def due_offers(offers: Sequence[tuple[str, str]], offered: dict[str, tuple[str, float]], now: float,
               interval_s: float, ages: OfferAges | None = None) -> Iterator[SendOffer]:
    """A :class:`SendOffer` for each (job, target) of ``offers`` but those offered to the same target
    less than ``interval_s`` before ``now`` (monotonic s); each one sent is recorded in ``offered``
    (job -> (target, when)) and in ``ages``."""
    for job_id, target in offers:
        last = offered.get(job_id)
        if last is not None and last[0] == target and now - last[1] < interval_s:
            continue
        offered[job_id] = (target, now)
        if ages is not None:
            ages.sent(job_id, target, now)
        yield SendOffer(job_id, target)


def pair_key(pair: tuple[str | None, str | None]) -> tuple[str, str]:
    """A ``(user, workdir)`` pair's sort key (None sorts as "")."""
    return (pair[0] or "", pair[1] or "")


def without_paths(worker: WorkerSnapshot, *, cpu_slots: bool = True, memo: FreezeMemo | None = None) -> Hashable:
    """``worker`` frozen (with ``memo``), but for its answers about paths (and its CPU slots unless ``cpu_slots``)."""
    out = replace(worker, existing_paths=None, denied_paths=frozenset(), unanswered_paths=frozenset())
    return freeze(out if cpu_slots else replace(out, cpu_slots_free=None, cpu_slots_total=None), memo)


def paths_changed(worker: WorkerSnapshot, old: WorkerSnapshot, workdirs: set[str]) -> bool:
    """Whether ``worker``'s answers about any of ``workdirs`` differ from ``old``'s (the same machine)."""
    if (worker.existing_paths is None) != (old.existing_paths is None):
        return True
    changed = set((worker.existing_paths or frozenset()) ^ (old.existing_paths or frozenset()))
    changed |= worker.unanswered_paths ^ old.unanswered_paths
    changed |= {p for _, p in worker.denied_paths ^ old.denied_paths}
    return bool(changed & workdirs)


def peer_loads(remote: Sequence[WorkerSnapshot]) -> dict[str, WorkerLoad]:
    """Each peer's busy CPU slots of its capacity, from its last snapshot."""
    out: dict[str, WorkerLoad] = {}
    for w in remote:
        total = w.cpu_slots_total if w.cpu_slots_total is not None else (w.cpu_count or 1)
        free = w.cpu_slots_free if w.cpu_slots_free is not None else total
        out[w.node_id] = WorkerLoad(in_use=max(0, total - free), capacity=max(1, total))
    return out


def _device_id(d: DeviceSnapshot) -> str:
    return d.uuid or f"#{d.accelerator.value}{d.index}"


def _twin_key(d: DeviceSnapshot) -> tuple[object, ...]:
    """What makes two devices interchangeable for any job (every device requirement reads only these)."""
    return (d.accelerator, d.kind, d.name, d.memory_total_bytes, d.memory_kind, d.compute_capability, d.float64,
            d.driver_version, d.execution_supported)


def fit_of(placement: Placement, worker: WorkerSnapshot) -> Fit:
    """The :class:`~gpulayerd.core.protocol.targets.Fit` of ``placement`` on ``worker`` (its snapshot):
    the chosen devices' total memory and newest compute capability as its size, and the worker's free
    devices interchangeable with the chosen ones as its pool. A placement of no device: size ``()``."""
    wanted = list(zip(placement.device_indices, placement.device_uuids, strict=True))
    if not wanted:
        return Fit(placement.worker)
    kind = [d for d in worker.devices if d.accelerator is placement.accelerator]
    chosen = [d for i, u in wanted for d in kind
              if (d.uuid == u if u is not None else d.uuid is None and d.index == i and d.kind is DeviceKind.GPU)]
    caps = [d.compute_capability for d in chosen if d.compute_capability is not None]
    size = fit_size(sum(d.memory_total_bytes or 0 for d in chosen), max(caps) if caps else None)
    keys = {_twin_key(d) for d in chosen}
    twins = [d for d in sorted(kind, key=lambda d: d.sort_key)
             if d not in chosen and _twin_key(d) in keys and not d.busy and d.state is DeviceState.OK
             and not (d.kind is DeviceKind.GPU and d.mig_enabled)]
    return Fit(placement.worker, size, tuple(_device_id(d) for d in [*chosen, *twins]), len(wanted))


def peer_fits(e: Explanation, peers: Mapping[str, WorkerSnapshot], me: str) -> list[Fit]:
    """The :class:`~gpulayerd.core.protocol.targets.Fit` of every peer (not ``me``) that fits ``e``'s job
    now, from its row's placement and its snapshot in ``peers`` (node id -> snapshot)."""
    out: list[Fit] = []
    for r in e.workers:
        if r.worker != me and r.state is FitState.FITS_NOW and r.placement is not None:
            w = peers.get(r.worker)
            out.append(fit_of(r.placement, w) if w is not None else Fit(r.worker))
    return out


def elsewhere(book: ShapeBook, req: JobRequest, here: Placement, worker: WorkerSnapshot,
              remote: Sequence[WorkerSnapshot], offers: OfferRound, avoid: str | None = None) -> Fit | None:
    """The peer a device job that fits this machine (``worker``) now at ``here`` goes to instead: one
    whose fit now is strictly smaller (:meth:`~gpulayerd.core.protocol.targets.OfferRound.smaller_than`,
    promised in ``offers``, the walk's round), or None: it is claimed here. A CPU job stays here.
    ``avoid``: a retry's worker to avoid (``--retry-elsewhere``): never the peer chosen; when it is
    this machine, any peer that fits the job now (CPU jobs too; :meth:`OfferRound.choose`).
    (A peer's workdir is checked only when it claims: the caller bounds how long a job is left.)"""
    mine = avoid is not None and avoid == worker.node_id
    last = worker.kind == "slurm"  # [slurm] prefer = last: a workstation that fits now takes it (targeting)
    if (req.gpu_count == 0 and not mine and not last) or not remote:
        return None
    fitting = [(w, r.placement) for w in remote
               if w.node_id != avoid and (r := book.row(req, w)).state is FitState.FITS_NOW and r.placement is not None]
    if last and workstation_first(worker, [w for w, _ in fitting]):
        return offers.choose([fit_of(p, w) for w, p in fitting if w.kind != "slurm"])
    fits = [fit_of(p, w) for w, p in fitting]
    return offers.choose(fits) if mine else offers.smaller_than(fit_of(here, worker), fits)


def smaller_than_here(fits: Sequence[Fit], e: Explanation, worker: WorkerSnapshot) -> list[Fit]:
    """``fits`` (peers') strictly smaller than this machine's (``worker``'s) fit in ``e``, if it fits now."""
    row = next((r for r in e.workers if r.worker == worker.node_id), None)
    if row is None or row.state is not FitState.FITS_NOW or row.placement is None:
        return list(fits)
    mine = fit_of(row.placement, worker).size
    return [f for f in fits if f.size < mine]


def spread(e: Explanation, offers: OfferRound, previous: str | None, fits: Sequence[Fit],
           here: WorkerSnapshot | None = None, avoid: str | None = None, stale: str | None = None) -> Explanation:
    """``e`` placed on the peer ``offers`` (:class:`~gpulayerd.core.protocol.targets.OfferRound`) picks
    among ``fits`` (:func:`peer_fits` of ``e``): the best fit, then the least loaded, instead of always
    the lowest node id; the choice is counted into the round. ``here``: this machine, when the walk
    left the job (which fits here) to a smaller fit (:func:`elsewhere`): only fits smaller than its own
    count (none left: ``e`` as it is). ``avoid``: a retry's worker to avoid: chosen only when no other
    fits (:func:`~gpulayerd.core.scheduling.retrying.prefer_others`); when it is ``here``, every fit counts.
    ``stale``: a peer that held the job's offer unclaimed too long (:class:`~.retrying.OfferAges`), chosen
    only when no other fits (and then not kept as ``previous``)."""
    if here is not None and here.node_id != avoid:
        fits = smaller_than_here(fits, e, here)
    fit = offers.choose(prefer_others(prefer_others(fits, avoid), stale), None if previous == stale else previous)
    if fit is None:
        return e
    row = next(r for r in e.workers if r.worker == fit.worker)
    return replace(e, placement=row.placement)


def others_hold_gpus(req: JobRequest, workers: Sequence[WorkerSnapshot]) -> bool:
    """Whether ``req`` asks for GPUs while another user holds some of a worker's in ``workers``: then
    whether it is passed over (:func:`with_fair_share`) depends on usage figures that change with the clock."""
    return fairshare.gpus_of(req) > 0 and any(n > 0 and u != req.user
                                              for w in workers for u, n in w.gpus_held_by_user.items())


def busy_target(e: Explanation, loads: dict[str, WorkerLoad], previous: str | None, me: str,
                avoid: str | None = None) -> str | None:
    """The peer (not ``me``) to hold a standing offer of a job that fits but waits (``e``'s verdict
    "fits but busy"): :func:`gpulayerd.core.protocol.targets.choose_target` among the peers whose
    devices would fit it once freed, counted into ``loads``. A worker that holds the offers of every
    user whose jobs wait for it chooses among them by fair share when its devices free up (an offer
    made only once a device is free would lose that race to offers kept from earlier). None when
    no peer is such a worker. ``avoid``: a retry's worker to avoid, chosen only when no other is such a worker."""
    if e.verdict is not Verdict.FITS_BUT_BUSY:
        return None
    busy = sorted(r.worker for r in e.workers if r.worker != me and r.state is FitState.FITS_BUT_BUSY)
    busy = [w for w in busy if w != avoid] or busy
    target = choose_target(busy, loads, previous)
    if target is not None:
        loads[target] = loads.get(target, WorkerLoad()).plus_one()
    return target


class StandingOffers:
    """One pass's standing offers (:func:`busy_target`): at most :data:`BUSY_OFFERS` per user and peer.

    Args:
        remote: the peers' snapshots (their loads spread the offers).
        me: this machine's node id (never a target).
        offered: job id -> (peer, when) of the offers made before (a job stays with its peer).
    """

    def __init__(self, remote: Sequence[WorkerSnapshot], me: str, offered: Mapping[str, tuple[str, float]]) -> None:
        self._loads = peer_loads(remote)
        self._me = me
        self._offered = offered
        self._count: Counter[tuple[str, str]] = Counter()

    def target(self, e: Explanation, user: str, job_id: str, avoid: str | None = None) -> str | None:
        """The peer to send ``job_id`` (of ``user``; explained by ``e``; a retry avoiding ``avoid``) a
        standing offer now; None when no peer's busy devices fit it, or :data:`BUSY_OFFERS` of
        ``user``'s jobs go there in this pass."""
        target = busy_target(e, self._loads, self._offered.get(job_id, ("", 0.0))[0] or None, self._me, avoid)
        if target is None or self._count[(user, target)] >= BUSY_OFFERS:
            return None
        self._count[(user, target)] += 1
        return target


def fair_order(ids: list[str], queue: Mapping[str, QueuedJob], user_of: Callable[[str], str],
               usage: Mapping[str, fairshare.Usage] | None) -> list[str]:
    """``ids`` (queued, in ``queue``) in fair-share order (``user_of``: a job's user; without a usage book,
    as given)."""
    if usage is None:
        return ids
    seqs = [queue[j].seq for j in ids]
    cands = [fairshare.Candidate(j, user_of(j), float(seq if seq is not None else i))
             for i, (j, seq) in enumerate(zip(ids, seqs, strict=True))]
    return [c.job_id for c in fairshare.order(cands, usage)]


def settled_for(settled: tuple[Hashable, Hashable, WorkerSnapshot, set[str]] | None, worker: WorkerSnapshot, *,
                devices_only: bool = False, memo: FreezeMemo | None = None) -> bool:
    """Whether every job the last pass walked still cannot be placed on ``worker`` (this machine):
    it is as that pass left it (``settled``: frozen without paths, the same without CPU slots, the
    snapshot, the workdirs), but for the answers about paths no job of that pass has. With
    ``devices_only``, whether every job that asks for devices still cannot: the same, but for the
    free CPU slots too (a judgement of such a job never reads them). ``memo``: the caller's frozen
    snapshots (:class:`~gpulayerd.core.matching.shapes.FreezeMemo`)."""
    if settled is None:
        return False
    frozen, dev_frozen, old, workdirs = settled
    if devices_only:
        if without_paths(worker, cpu_slots=False, memo=memo) != dev_frozen:
            return False
    elif without_paths(worker, memo=memo) != frozen:
        return False
    return not paths_changed(worker, old, workdirs)


def with_fair_share(e: Explanation, req: JobRequest, workers: Mapping[str, WorkerSnapshot],
                    usage: Mapping[str, fairshare.Usage], ahead: Mapping[str, None]) -> Explanation:
    """``e`` with a FAIR_SHARE rejection on each row of a worker in ``workers`` (node id -> snapshot:
    this machine, and the peers with the holdings their heartbeats report) where the job waits (fits,
    but busy) while a user with less usage waits ahead of it in this owner's queue (``ahead``: users
    in order), or, where none of the devices it could use is held, holds a GPU there. (Devices held
    while nobody with less usage waits ahead: the holders decide, a ``Resources`` reason.)
    """
    if e.verdict is not Verdict.FITS_BUT_BUSY:
        return e
    rows = list(e.workers)
    changed = False
    for i, row in enumerate(rows):
        worker = workers.get(row.worker)
        if worker is None or row.state is not FitState.FITS_BUT_BUSY:
            continue
        if any(r.code is RejectionCode.USER_GPU_CAP for r in row.rejections):
            continue  # the per-user cap says it better
        winner = fairshare.passed_over_by(req.user, list(ahead), usage)
        if winner is None and fairshare.gpus_of(req) > 0 and not any(r.code in _HELD for r in row.rejections):
            # A user with less usage holds GPUs there, none waits ahead: that user's next job would go
            # first. Not said while devices the job could use are held: then the holders decide.
            winner = fairshare.passed_over_by(req.user, [u for u, n in worker.gpus_held_by_user.items() if n > 0],
                                              usage)
        if winner is None:
            continue
        text = fairshare.fair_share_reason(req.user, winner, usage, gpus=fairshare.gpus_of(req) > 0)
        rej = Rejection(RejectionCode.FAIR_SHARE, "fair_share", req.user or "(unknown user)", winner,
                        worker.node_id, text)
        rows[i] = replace(row, rejections=(rej, *row.rejections))
        changed = True
    return replace(e, workers=tuple(rows)) if changed else e


def overflow_waits(jobs: Iterable[QueuedJob], request: Callable[[str], JobRequest],
                   machine: MachineRead) -> tuple[dict[str, float], bool]:
    """``[slurm] prefer = "overflow-after = D"``: the queued ``jobs`` whose ``waited_s`` (``request``'s) moves to
    the largest D of the Slurm workers of ``machine`` (this one and its peers) that their wait since
    ``submitted_at`` passed at its wall-clock time (job id -> its new value), and whether a job still waits
    for a larger D (passes go on until then)."""
    workers = [machine.local, *machine.remote] if machine.local is not None else list(machine.remote)
    marks = sorted({w.slurm_overflow_after_s for w in workers
                    if w.kind == "slurm" and w.slurm_overflow_after_s is not None})
    now = machine.wall
    if not marks or now is None:
        return {}, False
    moved, waiting = {}, False
    for job in jobs:
        if job.submitted_at is None:
            continue
        passed = max((m for m in marks if now - job.submitted_at >= m), default=0.0)
        waiting = waiting or passed < marks[-1]
        if request(job.id).waited_s != passed:
            moved[job.id] = passed
    return moved, waiting
