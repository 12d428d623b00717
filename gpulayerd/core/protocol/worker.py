"""The worker's bookkeeping for one machine: events in, actions out.

Pure: no I/O, no clock (``now`` comes in with every call, in seconds of the worker's
monotonic clock), no randomness. The services (:mod:`gpulayerd.app.worker.worker`,
:mod:`gpulayerd.app.worker.member`) feed what happened and carry out what comes back (send
a claim, start a watchdog, renew a lease, report an end, kill a run, drop a hold).

What it keeps (:class:`WorkerState`, never changed in place: :func:`handle` returns a new one):

- offers: owners' offers of a job, with their received time; dropped after
  :data:`OFFER_KEPT_S`, when claimed (granted, denied or failed), or when bad. One
  claim in flight per offer; an offer of a job already running here is acknowledged,
  never claimed twice.
- holds: gang holds (devices reserved until commit, release or expiry).
- runs: attempts starting or running here, each for its owner (a peer, or this daemon
  itself: a job owned here is offered, claimed, renewed and reported through the same
  messages, sent to itself), with their lease and the deadline their watchdog holds. Only an
  answered renewal moves a deadline, and only forward.
- rounds: the owners with a renewal round in flight (one per owner, so an owner
  that does not answer delays only its own runs).
- owed: end reports not yet acknowledged by their owner: sent at once, then again in
  each of that owner's rounds until an answer comes; never sent after it.

A device is never in two of: a claim in flight, a hold, a run. An attempt ends once.
The events and actions are in :mod:`gpulayerd.core.protocol.worker_msgs` (and importable from here).


(Same name as :mod:`gpulayerd.app.worker.worker`: the same idea, decided here (pure) and carried out
there.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpulayerd.core.protocol.worker_msgs import (
    Action,
    ClaimAnswered,
    ConsiderOffer,
    DropHold,
    DropOffer,
    EndKind,
    Event,
    ExtendDeadline,
    HoldCommitted,
    HoldPlaced,
    HoldReleased,
    HoldsChecked,
    KeepHold,
    KillAsked,
    KillRun,
    OfferFits,
    OfferReceived,
    OfferRejected,
    OffersReviewed,
    OwedReport,
    RecordEnd,
    RefuseCommit,
    RefuseHold,
    RefuseKill,
    RenewalAnswered,
    ReportAnswered,
    ReportOwed,
    RoundEnded,
    RunEnded,
    RunKey,
    RunStarted,
    SendClaim,
    SendRenewals,
    SendReport,
    StartRun,
    Tick,
)

__all__ = [
    "MAX_OFFERS_PER_OWNER", "OFFER_KEPT_S", "TOO_MANY_OFFERS", "Action", "ClaimAnswered", "ConsiderOffer",
    "DropHold", "DropOffer", "EndKind", "Event",
    "ExtendDeadline", "HoldCommitted", "HoldPlaced", "HoldRecord", "HoldReleased", "HoldsChecked", "KeepHold",
    "KeptOffer", "KillAsked", "KillRun", "OfferFits", "OfferReceived", "OfferRejected",
    "OffersReviewed", "OwedReport", "RecordEnd", "RefuseCommit", "RefuseHold", "RefuseKill",
    "RenewalAnswered", "ReportAnswered", "ReportOwed", "RoundEnded", "RunEnded", "RunKey", "RunRecord", "RunStarted",
    "SendClaim", "SendRenewals", "SendReport", "StartRun", "Tick", "WorkerState", "handle",
]

OFFER_KEPT_S = 60.0
"""An offer not claimed within this long is dropped (the owner offers again while it waits)."""

MAX_OFFERS_PER_OWNER = 512
"""Offers kept from one owner at most: a new one past it is refused (an owner sends the heads of each
user's line, a few per user; a member that floods offers fills only its own share)."""

TOO_MANY_OFFERS = "too many offers kept from this owner"

OfferKey = tuple[str, str]
"""(owner node id, job id)."""


# ---------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class KeptOffer:
    """An owner's offer kept here. ``claiming``: the devices of the claim in flight, None if none."""

    received_at: float
    claiming: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class HoldRecord:
    """A gang hold: ``devices`` reserved for ``owner``'s ``job_id`` until ``expires_at`` (monotonic s)."""

    owner: str
    job_id: str
    devices: frozenset[str]
    expires_at: float


@dataclass(frozen=True, slots=True)
class RunRecord:
    """An attempt starting (``running`` False) or running here.

    Attributes:
        owner: the owner's node id (this daemon's own for a job owned here).
        lease_s: the lease its owner granted, seconds.
        deadline: when its watchdog kills it unless a renewal moves it (monotonic s).
        devices: device uuids it has.
    """

    owner: str
    lease_s: float
    deadline: float
    devices: frozenset[str] = frozenset()
    running: bool = False


@dataclass(frozen=True, slots=True)
class WorkerState:
    """Everything the worker keeps (see the module docstring). Mappings are never changed in place."""

    offers: Mapping[OfferKey, KeptOffer] = field(default_factory=dict)
    holds: Mapping[str, HoldRecord] = field(default_factory=dict)
    runs: Mapping[RunKey, RunRecord] = field(default_factory=dict)
    owed: Mapping[RunKey, OwedReport] = field(default_factory=dict)
    rounds: frozenset[str] = frozenset()
    ended: frozenset[RunKey] = frozenset()

    def devices_in_use(self) -> frozenset[str]:
        """Devices of claims in flight, holds and runs."""
        out: set[str] = set()
        for o in self.offers.values():
            out |= o.claiming or frozenset()
        for h in self.holds.values():
            out |= h.devices
        for r in self.runs.values():
            out |= r.devices
        return frozenset(out)

    def runs_for(self, owner: str, job_id: str) -> bool:
        """True if an attempt of ``owner``'s job ``job_id`` starts or runs here."""
        return any(r.owner == owner and k[0] == job_id for k, r in self.runs.items())

    def owners_of(self, job_id: str, *, runs_only: bool = False) -> frozenset[str]:
        """Every owner this worker keeps something of job ``job_id`` for (an offer, a hold, a run,
        an owed report; with ``runs_only``, a run or an owed report: what binds a job id to its
        owner here, as offers and holds, which any member may send, do not)."""
        out: set[str] = set()
        if not runs_only:
            out.update(owner for owner, job in self.offers if job == job_id)
            out.update(h.owner for h in self.holds.values() if h.job_id == job_id)
        out.update(r.owner for k, r in self.runs.items() if k[0] == job_id)
        out.update(o.owner for k, o in self.owed.items() if k[0] == job_id)
        return frozenset(out)


# ---------------------------------------------------------------------------- handle


def handle(state: WorkerState, event: Event, now: float) -> tuple[WorkerState, list[Action]]:
    """Decide what ``event`` does at worker-monotonic time ``now``.

    Returns:
        The new state and the actions to carry out, in order. ``state`` is not changed.
    """
    if isinstance(event, (OfferReceived, OfferRejected, OffersReviewed, OfferFits, ClaimAnswered)):
        return _offers(state, event, now)
    if isinstance(event, (RunStarted, RunEnded, KillAsked)):
        return _runs(state, event, now)
    if isinstance(event, (ReportOwed, ReportAnswered, Tick, RenewalAnswered, RoundEnded)):
        return _leases(state, event, now)
    return _holds(state, event, now)


def _offers(state: WorkerState, ev: OfferReceived | OfferRejected | OffersReviewed | OfferFits | ClaimAnswered,
            now: float) -> tuple[WorkerState, list[Action]]:
    offers = dict(state.offers)
    if isinstance(ev, OffersReviewed):
        actions: list[Action] = []
        for key, o in sorted(state.offers.items(), key=lambda kv: kv[1].received_at):
            if o.claiming is not None:
                continue
            if now - o.received_at > OFFER_KEPT_S:
                del offers[key]
                actions.append(DropOffer(*key, "not claimed in time"))
            else:
                actions.append(ConsiderOffer(*key))
        return replace(state, offers=offers), actions
    key = (ev.owner, ev.job_id)
    kept = state.offers.get(key)
    if isinstance(ev, OfferReceived):
        if state.runs_for(*key):
            return state, [DropOffer(*key, "already running it")]  # a late duplicate offer
        if kept is None and sum(1 for owner, _ in state.offers if owner == ev.owner) >= MAX_OFFERS_PER_OWNER:
            return state, [DropOffer(*key, TOO_MANY_OFFERS)]
        offers[key] = KeptOffer(now, kept.claiming if kept is not None else None)
        return replace(state, offers=offers), []
    if isinstance(ev, OfferRejected):
        if kept is None or kept.claiming is not None:
            return state, []
        del offers[key]
        return replace(state, offers=offers), [DropOffer(*key, "bad offer")]
    if isinstance(ev, OfferFits):
        if kept is None or kept.claiming is not None:
            return state, []  # gone meanwhile, or its claim is in flight
        if state.runs_for(*key):
            del offers[key]
            return replace(state, offers=offers), [DropOffer(*key, "already running it")]
        if ev.devices & state.devices_in_use():
            return state, []  # keep it: claim it when the devices are free here
        offers[key] = replace(kept, claiming=ev.devices)
        return replace(state, offers=offers), [SendClaim(*key, ev.devices)]
    # ClaimAnswered
    if kept is None or kept.claiming is None:
        return state, []  # no claim in flight for it: a stray answer
    del offers[key]
    state = replace(state, offers=offers)
    drop = DropOffer(*key, f"claim {ev.outcome}")
    run_key = (ev.job_id, ev.attempt)
    if ev.outcome != "granted" or run_key in state.runs or run_key in state.ended:
        return state, [drop]  # denied, unanswered, or a duplicate grant of an attempt we run (or ran)
    run = RunRecord(ev.owner, ev.lease_s, now + ev.lease_s, kept.claiming)
    return replace(state, runs={**state.runs, run_key: run}), [drop, StartRun(run_key, ev.owner, ev.lease_s)]


def _runs(state: WorkerState, ev: RunStarted | RunEnded | KillAsked,
          now: float) -> tuple[WorkerState, list[Action]]:
    key = ev.key
    run = state.runs.get(key)
    if isinstance(ev, KillAsked):
        if run is None or not run.running or run.owner != ev.owner:
            return state, [RefuseKill(key, "no such attempt here")]
        return state, [KillRun(key, ev.reason or "asked by its owner")]
    if isinstance(ev, RunStarted):
        if key in state.ended or (run is not None and run.running):
            return state, []  # a duplicate
        devices = run.devices if run is not None else ev.devices
        new = RunRecord(ev.owner, ev.lease_s, now + ev.lease_s, devices, running=True)
        return replace(state, runs={**state.runs, key: new}), []
    # RunEnded
    if key in state.ended:
        return state, []  # an attempt ends once
    runs = {k: v for k, v in state.runs.items() if k != key}
    state = replace(state, runs=runs, ended=state.ended | {key})
    owner = run.owner if run is not None else ev.owner
    if not ev.report:
        return state, [RecordEnd(key, owner)]
    owed = OwedReport(owner, ev.kind, ev.exit_code, ev.reason, ev.never_started, sending=True, timed_out=ev.timed_out,
                        preflight=ev.preflight)
    return replace(state, owed={**state.owed, key: owed}), [RecordEnd(key, owner), SendReport(key, owed)]


def _leases(state: WorkerState, ev: ReportOwed | ReportAnswered | Tick | RenewalAnswered | RoundEnded,
            now: float) -> tuple[WorkerState, list[Action]]:
    if isinstance(ev, ReportOwed):
        if ev.key in state.ended or ev.key in state.runs:
            return state, []  # known here: owed already, or acknowledged already
        owed = replace(ev.report, sending=False)
        return replace(state, owed={**state.owed, ev.key: owed}, ended=state.ended | {ev.key}), []
    if isinstance(ev, ReportAnswered):
        o = state.owed.get(ev.key)
        if o is None:
            return state, []
        if ev.acknowledged:
            return replace(state, owed={k: v for k, v in state.owed.items() if k != ev.key}), []
        return replace(state, owed={**state.owed, ev.key: replace(o, sending=False)}), []
    if isinstance(ev, RenewalAnswered):
        run = state.runs.get(ev.key)
        if run is None or not run.running:
            return state, []
        if ev.answer == "stale":
            return state, [KillRun(ev.key, "stale at its owner")]
        deadline = ev.sent_at + run.lease_s
        if ev.answer == "none" or deadline <= run.deadline:
            return state, []  # unanswered: the deadline stays (the watchdog acts on it)
        return (replace(state, runs={**state.runs, ev.key: replace(run, deadline=deadline)}),
                [ExtendDeadline(ev.key, deadline)])
    if isinstance(ev, RoundEnded):
        cleared = {k: (replace(v, sending=False) if v.owner == ev.owner else v) for k, v in state.owed.items()}
        return replace(state, rounds=state.rounds - {ev.owner}, owed=cleared), []
    return _tick(state)


def _tick(state: WorkerState) -> tuple[WorkerState, list[Action]]:
    actions: list[Action] = []
    renew: dict[str, list[RunKey]] = {}
    for key, run in sorted(state.runs.items()):
        if run.running:
            renew.setdefault(run.owner, []).append(key)
    report: dict[str, list[RunKey]] = {}
    for key, o in sorted(state.owed.items()):
        if not o.sending:
            report.setdefault(o.owner, []).append(key)
    owed = dict(state.owed)
    rounds = set(state.rounds)
    for owner in sorted(set(renew) | set(report)):
        if owner in rounds:
            continue  # its last round is still waiting for it
        rounds.add(owner)
        for key in report.get(owner, []):
            owed[key] = replace(owed[key], sending=True)
        actions.append(SendRenewals(owner, tuple(renew.get(owner, [])), tuple(report.get(owner, []))))
    return replace(state, owed=owed, rounds=frozenset(rounds)), actions


def _holds(state: WorkerState, ev: HoldPlaced | HoldReleased | HoldCommitted | HoldsChecked,
           now: float) -> tuple[WorkerState, list[Action]]:
    if isinstance(ev, HoldsChecked):
        expired = sorted(k for k, h in state.holds.items() if now > h.expires_at)
        kept = {k: h for k, h in state.holds.items() if k not in expired}
        return replace(state, holds=kept), [DropHold(k, "expired") for k in expired]
    hold = state.holds.get(ev.hold_id)
    if isinstance(ev, HoldPlaced):
        if hold is not None:
            return state, [KeepHold(ev.hold_id, hold.expires_at)] if hold.owner == ev.owner else [
                RefuseHold(ev.hold_id, "hold id in use")]
        if ev.devices & state.devices_in_use():
            return state, [RefuseHold(ev.hold_id, "a device is in use here")]
        new = HoldRecord(ev.owner, ev.job_id, ev.devices, now + ev.ttl_s)
        return replace(state, holds={**state.holds, ev.hold_id: new}), [KeepHold(ev.hold_id, new.expires_at)]
    if hold is None or hold.owner != ev.owner:
        if isinstance(ev, HoldReleased):
            return state, []
        return state, [RefuseCommit(ev.hold_id, "no such hold (expired?)")]
    holds = {k: v for k, v in state.holds.items() if k != ev.hold_id}
    if isinstance(ev, HoldReleased):
        return replace(state, holds=holds), [DropHold(ev.hold_id, "released")]
    if ev.key in state.runs or ev.key in state.ended:
        return replace(state, holds=holds), [DropHold(ev.hold_id, "attempt already here"),
                                             RefuseCommit(ev.hold_id, "attempt already here")]
    run = RunRecord(ev.owner, ev.lease_s, now + ev.lease_s, hold.devices)
    return (replace(state, holds=holds, runs={**state.runs, ev.key: run}),
            [StartRun(ev.key, ev.owner, ev.lease_s, ev.hold_id)])
