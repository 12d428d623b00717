"""Fair share between users (HTCondor user priority, Slurm fair-share): decayed usage and job order.

Pure: no I/O, no clock (``now`` comes in as an argument, in seconds of the caller's
monotonic clock), no randomness.

Usage is what each user's runs held, integrated over time and decayed exponentially:
a GPU held for one second adds 1 GPU-second, which is worth half as much one
half-life later. Every node reports what IT holds now (user -> GPUs and CPU slots
of the attempts running on that machine); the book keeps each node's last report and
integrates it until the next one, so a run is counted once, by the node that holds it,
whoever owns the job. A node that stops reporting stops counting after ``stale_after_s``.

The score that orders users (lower goes first) is
``gpu_seconds + CPU_SLOT_WEIGHT * cpu_slot_seconds``: one CPU slot held for a second
counts :data:`CPU_SLOT_WEIGHT` (1/10) of a GPU-second.

Accounting (``gpulayer report``) sums the same holdings without decay over a period: :func:`tally`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpulayerd.core.types import Accelerator, JobRequest, WorkerSnapshot
from gpulayerd.core.users import PERSONAL, SYSTEM
from gpulayerd.core.verdict import Rejection, RejectionCode

__all__ = [
    "CPU_SLOT_WEIGHT",
    "MAX_REPORTED_USERS",
    "MAX_WAITS",
    "AttemptSpan",
    "Candidate",
    "Holding",
    "JobOutcome",
    "Tally",
    "Usage",
    "UsageBook",
    "accrue",
    "credible_holdings",
    "fair_share_reason",
    "gpu_cap_rejection",
    "gpus_of",
    "merge_tallies",
    "order",
    "passed_over_by",
    "restored",
    "score",
    "tally",
    "usage_at",
]

CPU_SLOT_WEIGHT = 0.1
"""Score units of one CPU-slot-second (one GPU-second is 1 unit)."""

MAX_REPORTED_USERS = 256
"""The most users one node's report may name (a longer report is cut to the biggest holders)."""


@dataclass(frozen=True, slots=True)
class Holding:
    """What one user's runs hold on one node now: GPUs and CPU slots (both >= 0)."""

    gpus: int = 0
    cpu_slots: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """One user's decayed usage: GPU-seconds and CPU-slot-seconds."""

    gpu_s: float = 0.0
    cpu_slot_s: float = 0.0

    @property
    def score(self) -> float:
        """``gpu_s + CPU_SLOT_WEIGHT * cpu_slot_s`` (lower is served first)."""
        return self.gpu_s + CPU_SLOT_WEIGHT * self.cpu_slot_s

    @property
    def gpu_hours(self) -> float:
        """Decayed GPU-seconds / 3600."""
        return self.gpu_s / 3600.0

    @property
    def cpu_slot_hours(self) -> float:
        """Decayed CPU-slot-seconds / 3600."""
        return self.cpu_slot_s / 3600.0


@dataclass(frozen=True, slots=True)
class UsageBook:
    """Decayed usage per user, and each reporting node's last report.

    Attributes:
        half_life_s: usage halves every this many seconds (> 0).
        stale_after_s: a node's report counts at most this long after it arrived (except
            ``own_node``'s: this node's own report is always current).
        own_node: the node keeping the book, if any.
        at: the time ``usage`` is decayed to (None before the first :func:`accrue`).
        usage: user -> decayed usage as of ``at``.
        held: node id -> (user -> holding), the node's last report.
        seen_at: node id -> when its last report arrived.
    """

    half_life_s: float
    stale_after_s: float = 60.0
    own_node: str | None = None
    at: float | None = None
    usage: Mapping[str, Usage] = field(default_factory=dict)
    held: Mapping[str, Mapping[str, Holding]] = field(default_factory=dict)
    seen_at: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0 seconds, not {self.half_life_s!r}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0 seconds, not {self.stale_after_s!r}")


def _decay(half_life_s: float, dt: float) -> float:
    return math.pow(2.0, -dt / half_life_s)


def _advance(book: UsageBook, now: float) -> UsageBook:
    """``book`` with time moved to ``now``: usage decayed, every node's holdings integrated."""
    if book.at is None:
        return replace(book, at=now)
    if now <= book.at:
        return book
    factor = _decay(book.half_life_s, now - book.at)
    totals = {u: [x.gpu_s * factor, x.cpu_slot_s * factor] for u, x in book.usage.items()}
    for node, holdings in book.held.items():
        end = now if node == book.own_node else min(now, book.seen_at.get(node, book.at) + book.stale_after_s)
        if end <= book.at:
            continue
        # ∫ from at to end of 2^(-(now - t)/hl) dt: one unit held over [at, end], decayed to now.
        k = math.log(2) / book.half_life_s
        weight = math.exp(-k * (now - end)) * -math.expm1(-k * (end - book.at)) / k
        for user, h in holdings.items():
            t = totals.setdefault(user, [0.0, 0.0])
            t[0] += h.gpus * weight
            t[1] += h.cpu_slots * weight
    usage = {u: Usage(g, c) for u, (g, c) in totals.items() if g > 1e-9 or c > 1e-9}
    alive = {n for n, t in book.seen_at.items() if n == book.own_node or now < t + book.stale_after_s}
    return replace(book, at=now, usage=usage, held={n: h for n, h in book.held.items() if n in alive},
                   seen_at={n: t for n, t in book.seen_at.items() if n in alive})


def accrue(book: UsageBook, holdings: Mapping[str, Mapping[str, Holding]], now: float) -> UsageBook:
    """Move ``book`` to ``now``, then take the nodes' reports.

    Until ``now``, every node counts what it last reported (for at most ``stale_after_s``
    after that report); from ``now`` on, each node in ``holdings`` counts what it reports
    now. A report replaces that node's previous one (a node reports only itself, so a run
    is never counted twice). A time before ``book.at`` integrates nothing.

    Args:
        holdings: node id -> (user -> what that user's runs hold on that node now). Users
            past :data:`MAX_REPORTED_USERS` (the smallest holders) are dropped.

    Returns:
        A new book (``book`` is not changed).
    """
    reports = {node: _kept(report) for node, report in holdings.items()}
    if reports and all(_unchanged(book, node, kept, now) for node, kept in reports.items()):
        # Every node reports what it held, without a gap: integrating later gives the same sums,
        # so only the reports' arrival is noted (heartbeats from N peers would otherwise walk the
        # whole book N times a round).
        return UsageBook(book.half_life_s, book.stale_after_s, book.own_node, book.at, book.usage, book.held,
                         {**book.seen_at, **dict.fromkeys(reports, now)})  # replace()'s generic walk costs more
    book = _advance(book, now)
    if not reports:
        return book
    when = book.at if book.at is not None else now
    return replace(book, held={**book.held, **reports}, seen_at={**book.seen_at, **dict.fromkeys(reports, when)})


def _kept(report: Mapping[str, Holding]) -> dict[str, Holding]:
    """A report without empty holdings, cut to the :data:`MAX_REPORTED_USERS` biggest holders."""
    kept = {u: h for u, h in report.items() if h.gpus > 0 or h.cpu_slots > 0}
    if len(kept) > MAX_REPORTED_USERS:
        biggest = sorted(kept, key=lambda u: (-kept[u].gpus, -kept[u].cpu_slots, u))[:MAX_REPORTED_USERS]
        kept = {u: kept[u] for u in biggest}
    return kept


def _unchanged(book: UsageBook, node: str, kept: Mapping[str, Holding], now: float) -> bool:
    """Whether ``node``'s report ``kept`` at ``now`` repeats its last one, which still counts at
    ``now`` (not stale; the book's own node never is), so nothing needs integrating yet."""
    if book.at is None or now < book.at or node not in book.held or book.held[node] != kept:
        return False
    return node == book.own_node or now < book.seen_at.get(node, book.at) + book.stale_after_s


def credible_holdings(holdings: Mapping[str, tuple[int, int]], *, sender_mode: str, sender_user: str,
                      gpus_advertised: int,
                      slots_advertised: int | None) -> tuple[dict[str, tuple[int, int]], str | None]:
    """The part of a peer's holdings report (user -> (GPUs, CPU slots)) that can be true.

    A node speaks only for the users it may run jobs for: a system-mode node (its certificate
    says so) for any user, as it vouches for users; a personal-mode node for its bound user
    only; any other node for nobody. And it cannot hold more than it has: when the report's GPUs
    add up to more than the ``gpus_advertised`` devices of its capabilities, or its CPU slots to
    more than ``slots_advertised`` (None: the node sets no limit), nothing of it is taken.

    Returns:
        (what to count, why something was not counted or None).
    """
    if sender_mode == SYSTEM:
        kept = dict(holdings)
    elif sender_mode == PERSONAL and sender_user:
        kept = {u: h for u, h in holdings.items() if u == sender_user}
    else:
        kept = {}
    why = None
    if len(kept) < len(holdings):
        others = sorted(u for u in holdings if u not in kept)
        why = (f"it may not speak for {', '.join(repr(u) for u in others[:3])}"
               f"{f' and {len(others) - 3} more' if len(others) > 3 else ''}"
               f" ({'personal-mode node of ' + repr(sender_user) if sender_mode == PERSONAL else 'no mode'})")
    gpus = sum(max(0, g) for g, _ in kept.values())
    slots = sum(max(0, c) for _, c in kept.values())
    if gpus > max(0, gpus_advertised) or (slots_advertised is not None and slots > max(0, slots_advertised)):
        return {}, (f"it reports {gpus} GPUs and {slots} CPU slots held, more than the {gpus_advertised} GPUs"
                    f" and {'unlimited' if slots_advertised is None else slots_advertised} CPU slots it advertises")
    return kept, why


def restored(book: UsageBook, saved: Mapping[str, Usage], age_s: float, now: float) -> UsageBook:
    """``book`` with ``saved`` usage (as saved ``age_s`` seconds ago; a negative or unknown age counts
    as 0) decayed over that age and added to what it holds, as of ``now``. A value that is not a
    finite number counts as 0 (an infinite one would never decay: its user served last forever).

    Returns:
        A new book (``book`` is not changed).
    """
    book = _advance(book, now)
    factor = _decay(book.half_life_s, age_s if age_s > 0 else 0.0)
    totals = {u: [x.gpu_s, x.cpu_slot_s] for u, x in book.usage.items()}
    for user, u in saved.items():
        t = totals.setdefault(user, [0.0, 0.0])
        t[0] += _usable(u.gpu_s) * factor
        t[1] += _usable(u.cpu_slot_s) * factor
    usage = {u: Usage(g, c) for u, (g, c) in totals.items() if g > 1e-9 or c > 1e-9}
    return replace(book, usage=usage)


def _usable(value: float) -> float:
    """A saved usage figure as it may count: finite and not negative, else 0."""
    return value if math.isfinite(value) and value > 0 else 0.0


def usage_at(book: UsageBook, now: float) -> dict[str, Usage]:
    """Every user's decayed usage as of ``now`` (what they held until then counted)."""
    return dict(_advance(book, now).usage)


def score(usage: Mapping[str, Usage], user: str) -> float:
    """``user``'s score (0 for a user with no usage)."""
    u = usage.get(user)
    return u.score if u is not None else 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A job that may be taken next: its id, its user and its place in submission order."""

    job_id: str
    user: str
    seq: float


def order(candidates: Iterable[Candidate], usage: Mapping[str, Usage]) -> list[Candidate]:
    """Candidates in the order to take them: lowest user score first, then submission order, then job id.

    A user with less usage never waits behind a user with more; within one user,
    submission order holds. Deterministic (equal candidates keep their input order).
    """
    return sorted(candidates, key=lambda c: (score(usage, c.user), c.seq, c.job_id, c.user))


def gpus_of(job: JobRequest) -> int:
    """GPUs ``job`` takes on one host (0 for a CPU job)."""
    return 0 if job.accelerator is Accelerator.CPU else max(0, job.gpu_count)


def gpu_cap_rejection(job_user: str, job_gpus: int, worker: WorkerSnapshot) -> Rejection | None:
    """``USER_GPU_CAP`` when ``job_user`` would hold more than ``worker.max_gpus_per_user`` GPUs there.

    None when the worker has no cap, the job wants no GPU, or the job fits under the cap.
    """
    cap = worker.max_gpus_per_user
    if cap is None or job_gpus <= 0:
        return None
    held = worker.gpus_held_by_user.get(job_user, 0)
    if held + job_gpus <= cap:
        return None
    where = worker.name or worker.node_id
    who = job_user or "(unknown user)"
    if job_gpus > cap:
        message = f"fair share: a job of {job_gpus} GPUs is over the max of {cap} GPUs per user on {where}"
    else:
        message = f"fair share: {who} holds {held} of max {cap} GPUs on {where}"
    return Rejection(RejectionCode.USER_GPU_CAP, "max_gpus_per_user", str(held + job_gpus), f"max {cap}",
                     worker.node_id, message)


def fair_share_reason(waiting_user: str, ahead_user: str, usage: Mapping[str, Usage], *, gpus: bool = True) -> str:
    """The wait reason: ``fair share: bob's jobs go first (less recent GPU use than alice)``.

    Who goes first and why, never the decaying figures: the words (and so the stored reason) change only
    when the order of the users changes, not at every fair-share tick. The figures are in ``gpulayer
    users`` and ``show``. ``usage`` is accepted for the callers' convenience and not read.
    """
    del usage
    me, other = waiting_user or "(unknown user)", ahead_user or "(unknown user)"
    kind = "GPU" if gpus else "GPU and CPU-slot"
    return f"fair share: {other}'s jobs go first (less recent {kind} use than {me})"


def passed_over_by(job_user: str, others: Sequence[str], usage: Mapping[str, Usage]) -> str | None:
    """The user among ``others`` (not ``job_user``) with the lowest score below ``job_user``'s, or None.

    ``others``: users whose jobs hold devices here or wait ahead of the job.
    """
    mine = score(usage, job_user)
    below = sorted((score(usage, u), u) for u in set(others) if u != job_user and score(usage, u) < mine)
    return below[0][1] if below else None


# ---------------------------------------------------------------------------- accounting (gpulayer report)


@dataclass(frozen=True, slots=True)
class AttemptSpan:
    """An attempt that held ``gpus`` GPUs and ``cpu_slots`` CPU slots from ``start`` to ``end`` (wall s;
    None: it still runs), counted under ``key`` (a user, a host or a GPU model)."""

    key: str
    start: float
    end: float | None
    gpus: int
    cpu_slots: int


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job that ended in the period, counted under ``key``: whether it failed (failed, timeout or lost)
    and how long it waited from its submission to its first start (s; None: it never started)."""

    key: str
    failed: bool
    wait_s: float | None


@dataclass
class Tally:
    """One row of a report: jobs that ended, failures, GPU- and CPU-slot-seconds, and the waits (s).

    ``waits`` keeps at most :data:`MAX_WAITS` samples (every ``k``-th beyond: the median stays honest)."""

    key: str
    jobs: int = 0
    failures: int = 0
    gpu_s: float = 0.0
    cpu_slot_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    @property
    def median_wait_s(self) -> float | None:
        """The median of :attr:`waits`; None without any."""
        if not self.waits:
            return None
        ordered = sorted(self.waits)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


MAX_WAITS = 10_000
"""Wait samples one report row keeps (and sends to a peer that merges lab-wide rows)."""


def tally(spans: Iterable[AttemptSpan], outcomes: Iterable[JobOutcome], since: float, until: float) -> list[Tally]:
    """The report rows for the period [``since``, ``until``] (wall s): each span's time within it times
    its GPUs and CPU slots, each outcome's job, failure and wait; rows by most GPU-seconds, then key."""
    rows: dict[str, Tally] = {}
    for s in spans:
        held = max(0.0, min(until, s.end if s.end is not None else until) - max(since, s.start))
        row = rows.setdefault(s.key, Tally(s.key))
        row.gpu_s += held * s.gpus
        row.cpu_slot_s += held * s.cpu_slots
    for o in outcomes:
        row = rows.setdefault(o.key, Tally(o.key))
        row.jobs += 1
        row.failures += o.failed
        if o.wait_s is not None:
            row.waits.append(max(0.0, o.wait_s))
    return merge_tallies([list(rows.values())])


def merge_tallies(parts: Iterable[Sequence[Tally]]) -> list[Tally]:
    """Rows of several reports (one per owner) summed by key; waits thinned to :data:`MAX_WAITS`."""
    rows: dict[str, Tally] = {}
    for part in parts:
        for t in part:
            row = rows.setdefault(t.key, Tally(t.key))
            row.jobs += t.jobs
            row.failures += t.failures
            row.gpu_s += t.gpu_s
            row.cpu_slot_s += t.cpu_slot_s
            row.waits.extend(t.waits)
    for row in rows.values():
        if len(row.waits) > MAX_WAITS:
            step = math.ceil(len(row.waits) / MAX_WAITS)
            row.waits = sorted(row.waits)[::step]
    return sorted(rows.values(), key=lambda r: (-r.gpu_s, -r.cpu_slot_s, r.key))
