"""The offers a worker keeps: their specs, the order to claim them in, and a cheap first look.

A worker keeps every offer that fits it or waits for its busy devices (standing offers) and,
at every pass, walks them in fair-share order (:meth:`UsageService.order_offers`). Judging an
offer in full costs a fresh process list of the GPUs (``nvidia-smi --query-compute-apps``) and a
check of the job's workdir as its user; :func:`may_fit` first judges it against the machine as
it is known without either, so offers that wait for devices gpulayer itself granted cost neither;
:class:`KeptOffers` parses each offer's spec once, not at every pass (a member may keep
:data:`~gpulayerd.core.protocol.worker.MAX_OFFERS_PER_OWNER` offers here, and parsing a spec costs
twice what judging it does).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping, Sequence

from gpulayerd.app.common.usage import UsageService
from gpulayerd.core.matching.evaluate import evaluate
from gpulayerd.core.matching.shapes import shape_key
from gpulayerd.core.types import JobRequest, SupportMatrix, WorkerSnapshot
from gpulayerd.errors import PeerCallError, PeerRefused
from gpulayerd.models import JobSpec, SpecError, job_spec_from_mapping
from gpulayerd.net.transport import CLAIM, REPORT, PeerTransport
from gpulayerd.net.wire import Claim, Offer, RunReport, new_msg_id

__all__ = ["KeptOffers", "LostAnswers", "claim_order", "granted_spec", "may_fit", "offered_spec"]

log = logging.getLogger(__name__)

OfferKey = tuple[str, str]
"""(owner node id, job id)."""


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
    return _fits(_request(offer), worker, support)


def _request(offer: Offer) -> JobRequest | None:
    """The core request of ``offer``'s job; None when its spec does not parse."""
    try:
        return offered_spec(offer).to_core(offer.job_id)
    except SpecError:
        return None


def _fits(req: JobRequest | None, worker: WorkerSnapshot, support: SupportMatrix) -> bool:
    return req is None or evaluate(req, worker, support).placement is not None


class KeptOffers(Mapping[OfferKey, Offer]):
    """(owner, job id) -> the offer kept (as the core keeps it), with its job's request parsed once."""

    def __init__(self) -> None:
        self._offers: dict[OfferKey, Offer] = {}
        # parsed so far: (its request, None when it does not parse; the request's shape)
        self._requests: dict[OfferKey, tuple[JobRequest | None, Hashable]] = {}
        # the machine snapshot last judged against, and each shape's answer there: a walk over many
        # offers of one shape (a burst's) judges it once per snapshot, not once per offer
        self._judged_on: WorkerSnapshot | None = None
        self._judged: dict[Hashable, bool] = {}

    def __getitem__(self, key: OfferKey) -> Offer:
        return self._offers[key]

    def __iter__(self) -> Iterator[OfferKey]:
        return iter(self._offers)

    def __len__(self) -> int:
        return len(self._offers)

    def __setitem__(self, key: OfferKey, offer: Offer) -> None:
        """Keep ``offer`` (a repeated offer replaces the one kept, and its request)."""
        self._requests.pop(key, None)
        self._offers[key] = offer

    def pop(self, key: OfferKey, default: None = None) -> Offer | None:
        """Forget the offer ``key``; the offer, if kept."""
        self._requests.pop(key, None)
        return self._offers.pop(key, default)

    def fits_now(self, key: OfferKey, worker: WorkerSnapshot, support: SupportMatrix) -> bool:
        """:meth:`may_fit`, but False for a spec that does not parse (the offer route's question: does this
        offer call for a pass at once? One that cannot fit, or that the pass will drop, does not)."""
        return self.may_fit(key, worker, support, unparsed=False)

    def may_fit(self, key: OfferKey, worker: WorkerSnapshot, support: SupportMatrix, unparsed: bool = True) -> bool:
        """:func:`may_fit` of the offer kept as ``key`` (False when none is), its spec parsed once, and
        judged once per shape (every field of its request but the job id) and snapshot ``worker``;
        ``unparsed`` for a spec that does not parse (a pass's full judgement drops it)."""
        offer = self._offers.get(key)
        if offer is None:
            return False
        if key not in self._requests:
            req = _request(offer)
            self._requests[key] = (req, shape_key(req) if req is not None else None)
        req, shape = self._requests[key]
        if req is None:
            return unparsed
        if self._judged_on is not worker:  # snapshots are never changed in place: a new one, new answers
            self._judged_on, self._judged = worker, {}
        fit = self._judged.get(shape)
        if fit is None:
            fit = self._judged[shape] = _fits(req, worker, support)
        return fit


def granted_spec(granted: dict[str, object] | None, offer: Offer, offered: JobSpec | None,
                 own: JobSpec | None = None) -> JobSpec:
    """The spec to run: the one the grant carries (the only message that must hold the job's
    environment values), else the offer's (``offered``, parsed already, or parsed now); as the
    offer's user either way (the one vetted). ``own``: of a job owned by this node, the spec its owner
    keeps parsed, which the grant carries (used as it is when it names the vetted user: no parse).

    Raises:
        SpecError: neither the grant's spec nor the offer's parses.
    """
    user = offer.spec.get("user")
    vetted = user if isinstance(user, str) else ""
    if granted and own is not None and own.user == vetted:
        return own
    if granted:
        try:
            spec = job_spec_from_mapping(granted, source=f"grant of {offer.job_id}", base_dir="/")
        except SpecError as e:
            log.warning("job_id=%s: the grant's spec does not parse (%s); running the offered one", offer.job_id, e)
        else:
            if spec.user != vetted:
                if spec.user:  # (a grant that names no user is an older owner's: its offer's user was vetted)
                    log.warning("job_id=%s: the grant names user %r, the offer %r: running it as %r", offer.job_id,
                                spec.user, vetted, vetted)
                spec = spec.model_copy(update={"user": vetted})
            return spec
    return offered if offered is not None else offered_spec(offer)


class LostAnswers:
    """Claims whose answer never came (the call timed out or its connection broke): the owner may
    have granted one, and would then wait out its lease (minutes) before queueing the job again.

    The worker released the devices when the answer did not come, so it cannot run such a grant:
    :meth:`give_back` asks the owner again with the same claim (a holder asking again gets the same
    grant; a claim the owner never saw is decided now) and gives a grant found that way back at
    once as never started (re-queued without using a retry). While one is given back, the worker
    claims nothing else of that job (:meth:`__contains__`), so the attempt it gives back is never
    one it starts.

    Args:
        transport: calls the owner (CLAIM, REPORT).
        sleep: the service clock's sleep (seconds).
        tries: claims sent again at most (``delay_s`` × the try number apart); after that the lease decides.
    """

    def __init__(self, transport: PeerTransport, sleep: Callable[[float], Awaitable[None]], *,
                 tries: int = 4, delay_s: float = 1.0) -> None:
        self._transport = transport
        self._sleep = sleep
        self._tries = tries
        self._delay_s = delay_s
        self._open: set[OfferKey] = set()
        self.outcomes: collections.Counter[str] = collections.Counter()

    def __contains__(self, key: OfferKey) -> bool:
        return key in self._open

    def __len__(self) -> int:
        return len(self._open)

    async def give_back(self, owner: str, claim: Claim) -> None:
        """Settle the claim ``claim`` sent to ``owner``; its outcome is counted in :attr:`outcomes`:
        ``given back`` (a grant found and reported lost, never started), ``denied`` (nothing was
        granted), ``refused`` (403) or ``unanswered`` (every try failed: its lease decides). Never
        raises a peer error."""
        key = (owner, claim.job_id)
        if key in self._open:
            return
        self._open.add(key)
        try:
            self.outcomes[await self._settle(owner, claim)] += 1
        finally:
            self._open.discard(key)

    async def _settle(self, owner: str, claim: Claim) -> str:
        for n in range(1, self._tries + 1):
            await self._sleep(self._delay_s * n)
            try:
                reply = await self._transport.call(owner, CLAIM, claim)
                if not reply.granted:
                    return "denied"
                await self._transport.call(owner, REPORT, RunReport(
                    msg_id=new_msg_id(), worker=claim.worker, job_id=claim.job_id, attempt=reply.attempt,
                    kind="lost", never_started=True,
                    reason="the answer to its claim was lost; the worker had released the devices"))
                log.info("job_id=%s: gave back attempt %d granted by %s (its answer was lost)", claim.job_id,
                         reply.attempt, owner[:12])
                return "given back"
            except PeerRefused as e:
                log.debug("job_id=%s: settling a lost claim answer: %s", claim.job_id, e)
                return "refused"
            except PeerCallError as e:
                log.debug("job_id=%s: settling a lost claim answer (try %d): %s", claim.job_id, n, e)
        return "unanswered"
