"""The offers a worker keeps: their specs, the order to claim them in, and a cheap first look.

A worker keeps every offer that fits it or waits for its busy devices (standing offers) and,
at every pass, walks them in fair-share order (:meth:`UsageService.order_offers`). Judging an
offer in full costs a fresh process list of the GPUs (``nvidia-smi --query-compute-apps``) and a
check of the job's workdir as its user; :func:`may_fit` first judges it against the machine as
it is known without either, so offers that wait for devices gpulayer itself granted cost neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayerd.app.common.usage import UsageService
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.types import SupportMatrix, WorkerSnapshot
from gpulayerd.models import JobSpec, SpecError, job_spec_from_mapping
from gpulayerd.net.wire import Offer

__all__ = ["claim_order", "may_fit", "offered_spec"]


def offered_spec(offer: Offer) -> JobSpec:
    """The spec of a kept (vetted) offer.

    Raises:
        SpecError: it does not parse.
    """
    # The owner resolved the workdir: base_dir only spares a Path.cwd() on the event loop.
    return job_spec_from_mapping(offer.spec, source=f"offer of {offer.job_id}", base_dir="/")


def claim_order(kept: Sequence[Offer | None], usage: UsageService | None, below: float | None) -> list[int]:
    """The indices of ``kept`` (None: gone meanwhile, last) in the order to claim them: fair share
    (:meth:`UsageService.order_offers`: lowest user score, then the owner's ``submitted_at``); with
    ``below``, only offers of users whose score is under it. Without a usage book, as given."""
    if usage is None:
        return list(range(len(kept)))
    users = [str(o.spec.get("user") or "") if o is not None else "" for o in kept]
    when = [o.submitted_at if o is not None else None for o in kept]
    return usage.order_offers(users, when, below)


def may_fit(offer: Offer, worker: WorkerSnapshot, support: SupportMatrix) -> bool:
    """Whether the job of ``offer`` fits ``worker`` (this machine without a fresh process list or
    workdir answers: a device granted by gpulayer shows as held, a stranger's process may not yet).
    False only when it cannot fit now; a spec that does not parse is True (the full judgement drops it)."""
    try:
        req = offered_spec(offer).to_core(offer.job_id)
    except SpecError:
        return True
    return evaluate(req, worker, support).placement is not None
