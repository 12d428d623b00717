"""The scheduler's judgements beside the matcher: queue keys, frozen snapshots, peer loads,
spreading offers over peers, fair share in a waiting job's reason (pure)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import freeze
from gpulayerd.core.protocol.claims import WorkerLoad, choose_target
from gpulayerd.core.scheduling.steps import Key, QueuedJob
from gpulayerd.core.types import JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, Rejection, RejectionCode, Verdict

__all__ = ["busy_target", "order_key", "others_hold_gpus", "pair_key", "peer_loads", "spread", "with_fair_share",
           "without_paths"]

_HELD = frozenset({RejectionCode.RESERVED, RejectionCode.FOREIGN_PROCESS})

# ---------------------------------------------------------------------------------------- helpers


def order_key(job: QueuedJob, user: str, scores: Mapping[str, float]) -> Key:
    """:func:`gpulayerd.core.fairshare.order`'s key of a queued job: user's score, seq, id, user."""
    return (scores.get(user, 0.0), float(job.seq if job.seq is not None else 0), job.id, user)


def pair_key(pair: tuple[str | None, str | None]) -> tuple[str, str]:
    """A ``(user, workdir)`` pair's sort key (None sorts as "")."""
    return (pair[0] or "", pair[1] or "")


def without_paths(worker: WorkerSnapshot, *, cpu_slots: bool = True) -> Hashable:
    """``worker`` frozen, but for its answers about paths (and its CPU slots unless ``cpu_slots``)."""
    out = replace(worker, existing_paths=None, denied_paths=frozenset(), unanswered_paths=frozenset())
    return freeze(out if cpu_slots else replace(out, cpu_slots_free=None, cpu_slots_total=None))


def peer_loads(remote: Sequence[WorkerSnapshot]) -> dict[str, WorkerLoad]:
    """Each peer's busy CPU slots of its capacity, from its last snapshot."""
    out: dict[str, WorkerLoad] = {}
    for w in remote:
        total = w.cpu_slots_total if w.cpu_slots_total is not None else (w.cpu_count or 1)
        free = w.cpu_slots_free if w.cpu_slots_free is not None else total
        out[w.node_id] = WorkerLoad(in_use=max(0, total - free), capacity=max(1, total))
    return out


def spread(e: Explanation, loads: dict[str, WorkerLoad], previous: str | None, me: str) -> Explanation:
    """``e`` placed on the peer :func:`gpulayerd.core.protocol.claims.choose_target` picks among the peers
    (not ``me``) that fit now, counted into ``loads``, instead of always the lowest node id."""
    rows = {r.worker: r for r in e.workers
            if r.worker != me and r.state is FitState.FITS_NOW and r.placement is not None}
    target = choose_target(sorted(rows), loads, previous)
    if target is None:
        return e
    loads[target] = loads.get(target, WorkerLoad()).plus_one()
    return replace(e, placement=rows[target].placement)


def others_hold_gpus(req: JobRequest, workers: Sequence[WorkerSnapshot]) -> bool:
    """Whether ``req`` asks for GPUs while another user holds some of a worker's in ``workers``: then
    whether it is passed over (:func:`with_fair_share`) depends on usage figures that change with the clock."""
    return fairshare.gpus_of(req) > 0 and any(n > 0 and u != req.user
                                              for w in workers for u, n in w.gpus_held_by_user.items())


def busy_target(e: Explanation, loads: dict[str, WorkerLoad], previous: str | None, me: str) -> str | None:
    """The peer (not ``me``) to hold a standing offer of a job that fits but waits (``e``'s verdict
    "fits but busy"): :func:`gpulayerd.core.protocol.claims.choose_target` among the peers whose
    devices would fit it once freed, counted into ``loads``. A worker that holds the offers of every
    user whose jobs wait for it chooses among them by fair share when its devices free up (an offer
    made only once a device is free would lose that race to offers kept from earlier). None when
    no peer is such a worker."""
    if e.verdict is not Verdict.FITS_BUT_BUSY:
        return None
    busy = sorted(r.worker for r in e.workers if r.worker != me and r.state is FitState.FITS_BUT_BUSY)
    target = choose_target(busy, loads, previous)
    if target is not None:
        loads[target] = loads.get(target, WorkerLoad()).plus_one()
    return target


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
