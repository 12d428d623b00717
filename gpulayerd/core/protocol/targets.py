"""Where an owner offers a job that fits several workers now: the best fit, then the least loaded (pure).

The owner's scheduler judges each waiting job against every peer (:mod:`gpulayerd.core.scheduling`)
and hands the peers that fit it now to :class:`OfferRound`, one round per pass:

1. Best fit across hosts: the worker whose placement takes the smallest device(s) wins (the
   placement's :data:`FitSize`: the chosen devices' total memory in whole GiB, then their compute
   capability), so a 16 GB job goes to the idle 24 GB card, not the idle 94 GB one. Within one
   host the matcher already picks the smallest fitting device; this carries that lab-wide.
2. Then the least loaded (busy CPU slots of its capacity, plus the offers this round made), so a
   burst of CPU jobs, or of equal-size GPU jobs, spreads over every idle worker.
3. Then the lowest node id: every choice is deterministic.

A round remembers the devices it promised: a later job of the same pass whose placement on a
worker needs more of that worker's interchangeable free devices than the round left unpromised
goes to the next best fit instead of piling onto a card an earlier job was just offered (if
every fitting worker is spoken for, the best fit is offered anyway: the worker re-checks before
it claims). A job keeps the worker it was offered to in an earlier pass while that worker still
fits it and is still among the best fits (equal :data:`FitSize`): an offer is not moved pass
after pass for load alone, but one to a big card moves when a smaller card fits now (the worker
first offered may still claim it: the owner grants one claim, whichever comes first).

CPU-only placements have the empty size ``()``: CPU jobs go by load alone, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = ["GIB", "Fit", "FitSize", "OfferRound", "WorkerLoad", "choose_target", "fit_size", "spread_offers"]

GIB = 1 << 30

FitSize = tuple[int, ...]
"""How much of a worker a placement takes, compared as a tuple (smaller is a better fit): a device
placement's ``(memory in whole GiB, compute capability major, minor)``; ``()`` for a placement of no
device (CPU slots only), which makes every CPU placement the same size."""


def fit_size(memory_bytes: int, capability: tuple[int, int] | None) -> FitSize:
    """The :data:`FitSize` of a placement whose devices total ``memory_bytes`` (0 where unknown) and
    whose newest device has compute ``capability`` (None: unknown, counted as 0.0).

    Memory is rounded to whole GiB, so two cards of one model that drivers report a few MiB
    apart count as the same size (and equal-size jobs spread over them by load).
    """
    major, minor = capability or (0, 0)
    return (round(max(0, memory_bytes) / GIB), major, minor)


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """How busy a worker is, as the owner knows it.

    Attributes:
        in_use: work it runs now (busy CPU slots, from its last snapshot) plus the jobs
            this owner has offered it in this round.
        capacity: how much it runs at once (its CPU slots, else its CPU count); at least 1.
    """

    in_use: int = 0
    capacity: int = 1

    def plus_one(self) -> WorkerLoad:
        """This load with one more job offered."""
        return replace(self, in_use=self.in_use + 1)


@dataclass(frozen=True, slots=True)
class Fit:
    """One worker that fits a job now, as the owner's judgement placed it there.

    Attributes:
        worker: node id.
        size: the placement's :data:`FitSize` (``()`` for CPU slots only).
        pool: ids of the worker's free devices interchangeable with the chosen ones (the chosen
            ones first): a round may promise up to this many to jobs of this size there.
        need: how many devices the job takes (0 for a CPU job).
    """

    worker: str
    size: FitSize = ()
    pool: tuple[str, ...] = ()
    need: int = 0


def choose_target(fitting: Sequence[str], loads: Mapping[str, WorkerLoad], previous: str | None = None,
                  sizes: Mapping[str, FitSize] | None = None) -> str | None:
    """The worker to offer a job to, among the node ids in ``fitting`` (all fit it now).

    The smallest placement (``sizes``: node id -> :data:`FitSize`; a worker missing there counts
    as ``()``) wins; among equal sizes the least loaded (``in_use / capacity``; an unknown worker
    counts as idle with capacity 1), then the lowest node id (as
    :func:`gpulayerd.core.matching.evaluate.explain` places). ``previous``, the worker the job was
    offered to before, keeps it while it still fits and its size is the smallest (an offer is not
    moved pass after pass for load alone; one to a bigger card than needed is). The caller counts
    each choice into the winner's load (:class:`OfferRound` does), so in a burst the tie moves on
    to the next idle worker at every job. Returns None when ``fitting`` is empty.
    """
    if not fitting:
        return None
    size = sizes or {}
    best = min(size.get(w, ()) for w in fitting)
    if previous is not None and previous in fitting and size.get(previous, ()) == best:
        return previous

    def key(worker: str) -> tuple[FitSize, float, str]:
        load = loads.get(worker, WorkerLoad())
        return size.get(worker, ()), load.in_use / max(load.capacity, 1), worker

    return min(fitting, key=key)


class OfferRound:
    """One pass's offers: each choice (:func:`choose_target` among the fits whose devices the round
    has not promised yet) is counted into its worker's load, and its devices are promised.

    Args:
        loads: each worker's load before the round (copied).
    """

    def __init__(self, loads: Mapping[str, WorkerLoad]) -> None:
        self.loads = dict(loads)
        self._promised: set[tuple[str, str]] = set()

    def _room(self, fit: Fit) -> list[str]:
        """The devices of ``fit``'s pool not promised yet (in pool order)."""
        return [d for d in fit.pool if (fit.worker, d) not in self._promised]

    def choose(self, fits: Sequence[Fit], previous: str | None = None) -> Fit | None:
        """The fit to offer a job to (one per worker in ``fits``), or None when ``fits`` is empty."""
        if not fits:
            return None
        free = [f for f in fits if len(self._room(f)) >= f.need] or list(fits)
        by_worker = {f.worker: f for f in free}
        target = choose_target(sorted(by_worker), self.loads, previous, {w: f.size for w, f in by_worker.items()})
        assert target is not None
        fit = by_worker[target]
        self.loads[target] = self.loads.get(target, WorkerLoad()).plus_one()
        self._promised.update((target, d) for d in (self._room(fit) or list(fit.pool))[:fit.need])
        return fit


    def smaller_than(self, here: Fit, fits: Sequence[Fit]) -> Fit | None:
        """Where a job that fits ``here`` (the owner's own machine) goes instead: the choice (as
        :meth:`choose`, counted and promised) among ``fits`` (peers) strictly smaller than ``here``
        whose devices the round has not promised yet; None when ``here`` is a best fit (an equal
        size stays here: no network hop for nothing)."""
        better = [f for f in fits if f.size < here.size and len(self._room(f)) >= f.need]
        return self.choose(better) if better else None


def spread_offers(jobs: Sequence[tuple[str, Sequence[str | Fit]]], loads: Mapping[str, WorkerLoad],
                  previous: Mapping[str, str] | None = None) -> dict[str, str]:
    """Choose a worker for each of ``jobs`` ((job id, the workers that fit it now: node ids, or
    :class:`Fit` values with their sizes), in queue order) in one :class:`OfferRound`.

    Returns:
        job id -> node id, for every job that fits somewhere; each job appears once.
    """
    offers = OfferRound(loads)
    before = previous or {}
    out: dict[str, str] = {}
    for job_id, fitting in jobs:
        if job_id in out:
            continue
        fit = offers.choose([f if isinstance(f, Fit) else Fit(f) for f in fitting], before.get(job_id))
        if fit is not None:
            out[job_id] = fit.worker
    return out
