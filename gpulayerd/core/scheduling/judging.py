"""The scheduler's judgements beside the matcher: queue keys, frozen snapshots and their path answers, peer loads,
the size of each peer's fit and the peer an offer goes to (best fit, then least loaded), fair
share in a waiting job's reason (pure)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace

from gpulayerd.core import fairshare
from gpulayerd.core.matching.shapes import ShapeBook, freeze
from gpulayerd.core.protocol.targets import Fit, OfferRound, WorkerLoad, fit_size
from gpulayerd.core.scheduling.steps import Key, QueuedJob
from gpulayerd.core.types import DeviceKind, DeviceSnapshot, DeviceState, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Explanation, FitState, Placement, Rejection, RejectionCode, Verdict

__all__ = ["elsewhere", "fit_of", "order_key", "others_hold_gpus", "pair_key", "paths_changed", "peer_fits",
           "peer_loads", "smaller_than_here", "spread", "with_fair_share", "without_paths"]

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
              remote: Sequence[WorkerSnapshot], offers: OfferRound) -> Fit | None:
    """The peer a device job that fits this machine (``worker``) now at ``here`` goes to instead: one
    whose fit now is strictly smaller (:meth:`~gpulayerd.core.protocol.targets.OfferRound.smaller_than`,
    promised in ``offers``, the walk's round), or None: it is claimed here. A CPU job stays here.
    (A peer's workdir is checked only when it claims: the caller bounds how long a job is left.)"""
    if req.gpu_count == 0 or not remote:
        return None
    fits = [fit_of(r.placement, w) for w in remote
            if (r := book.row(req, w)).state is FitState.FITS_NOW and r.placement is not None]
    return offers.smaller_than(fit_of(here, worker), fits)


def smaller_than_here(fits: Sequence[Fit], e: Explanation, worker: WorkerSnapshot) -> list[Fit]:
    """``fits`` (peers') strictly smaller than this machine's (``worker``'s) fit in ``e``, if it fits now."""
    row = next((r for r in e.workers if r.worker == worker.node_id), None)
    if row is None or row.state is not FitState.FITS_NOW or row.placement is None:
        return list(fits)
    mine = fit_of(row.placement, worker).size
    return [f for f in fits if f.size < mine]


def spread(e: Explanation, offers: OfferRound, previous: str | None, fits: Sequence[Fit],
           here: WorkerSnapshot | None = None) -> Explanation:
    """``e`` placed on the peer ``offers`` (:class:`~gpulayerd.core.protocol.targets.OfferRound`) picks
    among ``fits`` (:func:`peer_fits` of ``e``): the best fit, then the least loaded, instead of always
    the lowest node id; the choice is counted into the round. ``here``: this machine, when the walk
    left the job (which fits here) to a smaller fit (:func:`elsewhere`): only fits smaller than its own
    count (none left: ``e`` as it is)."""
    fit = offers.choose(smaller_than_here(fits, e, here) if here is not None else fits, previous)
    if fit is None:
        return e
    row = next(r for r in e.workers if r.worker == fit.worker)
    return replace(e, placement=row.placement)


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
