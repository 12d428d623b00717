"""The scheduler's judgements beside the matcher: queue keys, frozen snapshots, peer loads,
spreading offers over peers, fair share in a waiting job's reason (pure)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import FreezeMemo, freeze
from gpulayerd.core.protocol.claims import WorkerLoad, choose_target
from gpulayerd.core.scheduling.steps import Key, QueuedJob
from gpulayerd.core.types import JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, Rejection, RejectionCode, Verdict

__all__ = ["order_key", "others_hold_gpus", "pair_key", "peer_loads", "spread", "with_fair_share", "without_paths"]

# ---------------------------------------------------------------------------------------- helpers


def order_key(job: QueuedJob, user: str, scores: Mapping[str, float]) -> Key:
    """:func:`gpulayerd.core.fairshare.order`'s key of a queued job: user's score, seq, id, user."""
    return (scores.get(user, 0.0), float(job.seq if job.seq is not None else 0), job.id, user)


def pair_key(pair: tuple[str | None, str | None]) -> tuple[str, str]:
    """A ``(user, workdir)`` pair's sort key (None sorts as "")."""
    return (pair[0] or "", pair[1] or "")


def without_paths(worker: WorkerSnapshot, *, cpu_slots: bool = True, memo: FreezeMemo | None = None) -> Hashable:
    """``worker`` frozen (with ``memo``), but for its answers about paths (and its CPU slots unless ``cpu_slots``)."""
    out = replace(worker, existing_paths=None, denied_paths=frozenset(), unanswered_paths=frozenset())
    return freeze(out if cpu_slots else replace(out, cpu_slots_free=None, cpu_slots_total=None), memo)


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


def others_hold_gpus(req: JobRequest, worker: WorkerSnapshot) -> bool:
    """Whether ``req`` asks for GPUs while another user holds some of ``worker``'s: then whether
    it is passed over (:func:`with_fair_share`) depends on usage figures that change with the clock."""
    return fairshare.gpus_of(req) > 0 and any(n > 0 and u != req.user for u, n in worker.gpus_held_by_user.items())


def with_fair_share(e: Explanation, req: JobRequest, worker: WorkerSnapshot, usage: Mapping[str, fairshare.Usage],
                    ahead: Mapping[str, None]) -> Explanation:
    """``e`` with a FAIR_SHARE rejection on this machine's row when the job waits here (fits, but
    busy) while a user with less usage holds a GPU here or waits ahead of it."""
    if e.verdict is not Verdict.FITS_BUT_BUSY:
        return e
    rows = list(e.workers)
    i = next((k for k, r in enumerate(rows) if r.worker == worker.node_id), None)
    if i is None or rows[i].state is not FitState.FITS_BUT_BUSY:
        return e
    if any(r.code is RejectionCode.USER_GPU_CAP for r in rows[i].rejections):
        return e  # the per-user cap says it better
    others = list(ahead)  # distinct users, in order
    if fairshare.gpus_of(req) > 0:
        others += [u for u, n in worker.gpus_held_by_user.items() if n > 0]
    winner = fairshare.passed_over_by(req.user, others, usage)
    if winner is None:
        return e
    text = fairshare.fair_share_reason(req.user, winner, usage, gpus=fairshare.gpus_of(req) > 0)
    rej = Rejection(RejectionCode.FAIR_SHARE, "fair_share", req.user or "(unknown user)", winner, worker.node_id,
                    text)
    rows[i] = replace(rows[i], rejections=(rej, *rows[i].rejections))
    return replace(e, workers=tuple(rows))
