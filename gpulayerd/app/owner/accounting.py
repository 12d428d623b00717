"""Accounting of the jobs owned here (``gpulayer report``) and the retention of finished jobs
(``gpulayer history``).

:meth:`Accounting.report` reads the attempts that ran in a period and the jobs that ended in it
(:meth:`gpulayerd.store.history.HistoryTable.usage_since`) and sums them with
:func:`gpulayerd.core.fairshare.tally`, by user, by host (the worker's name) or by GPU model (the
devices' names as their workers advertise them; ``cpu`` for attempts without devices). GPU-hours
are each attempt's time within the period times the GPUs its job takes (times its hosts for a
multi-host job); nothing is decayed here (the fair-share book is). :meth:`Accounting.retention_loop`
removes finished jobs older than ``history_keep_days``, hourly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from pydantic import ValidationError

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import cpu_slots_of
from gpulayerd.app.common.ports import Directory
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core import fairshare
from gpulayerd.core.types import Accelerator
from gpulayerd.models import JobSpec, ReportRowView, ReportView
from gpulayerd.models.stored import read_placement
from gpulayerd.net.transport import USAGE_REPORT, PeerTransport, Sender
from gpulayerd.net.wire import UsageReportRequest, new_msg_id
from gpulayerd.store import Store

__all__ = ["BY", "Accounting"]

log = logging.getLogger(__name__)

BY = ("user", "host", "gpu-model")
"""How a report's rows are keyed."""

FAILED = frozenset({"failed", "timeout", "lost"})

PURGE_EVERY_S = 3600.0


class Accounting:
    """Reports over the jobs owned here; the retention of finished ones.

    Args:
        node_id: this daemon's node id (its own name heads ``owners``).
        name_of: a node id's host name (None when unknown: its id's head is shown).
        machine: this machine (its devices' names: GPU models).
        keep_days: finished jobs older than this many days are removed.
        directory, transport: the peers (their devices' names; those up are asked for a lab-wide report)
            and the way to ask them; None: this daemon's jobs only.
    """

    def __init__(self, *, store: Store, clock: Clock, node_id: str, name_of: Callable[[str | None], str | None],
                 machine: Machine | None, keep_days: float,
                 directory: Directory | None = None, transport: PeerTransport | None = None) -> None:
        self._machine = machine
        self._directory = directory
        self._transport = transport
        self._store = store
        self._clock = clock
        self._node_id = node_id
        self._name_of = name_of
        self._keep_s = keep_days * 86400.0

    def _host(self, node_id: str) -> str:
        return self._name_of(node_id) or node_id[:12] or "(never ran)"

    async def report(self, since_s: float, by: str) -> ReportView:
        """This daemon's jobs over the last ``since_s`` seconds, by ``by`` (one of :data:`BY`).

        Raises:
            ValueError: ``by`` is not one of :data:`BY`, or ``since_s`` is not above 0.
        """
        if by not in BY:
            raise ValueError(f"by must be one of: {', '.join(BY)}")
        if not since_s > 0:
            raise ValueError("since must be a duration above 0 (e.g. 30d, 12h)")
        until = self._clock.wall()
        since = until - since_s
        attempts, ended = await self._store.history.usage_since(since, until)
        models = await self._models() if by == "gpu-model" else {}
        specs: dict[str, JobSpec | None] = {}

        def spec_of(job_id: str, text: str) -> JobSpec | None:
            if job_id not in specs:
                try:
                    specs[job_id] = JobSpec.model_validate_json(text)
                except ValidationError:
                    specs[job_id] = None
            return specs[job_id]

        def key(spec: JobSpec | None, worker: str, placement_json: str, user: str = "") -> str:
            if by == "user":
                return (spec.user if spec is not None else None) or user or "(unknown)"
            if by == "host":
                return self._host(worker)
            placement = read_placement(placement_json).placement
            if placement is None or placement.accelerator is Accelerator.CPU or not placement.device_uuids:
                return "cpu" if worker else "(never ran)"
            return " + ".join(sorted({models.get(u or "", "unknown") for u in placement.device_uuids}))

        spans = []
        for a in attempts:
            spec = spec_of(a.job_id, a.spec_json)
            hosts = spec.distributed.nnodes if spec is not None and spec.distributed is not None else 1
            gpus = 0 if spec is None or spec.requirements.accelerator is Accelerator.CPU else \
                spec.requirements.effective_gpu_count
            slots = cpu_slots_of(spec) if spec is not None else 0
            spans.append(fairshare.AttemptSpan(key(spec, a.worker, a.placement_json), a.started_at, a.ended_at,
                                               gpus * hosts, slots * hosts))
        outcomes = [fairshare.JobOutcome(
            key(spec_of(e.job_id, e.spec_json), e.worker, e.placement_json), e.status in FAILED,
            None if e.first_start is None else e.first_start - e.submitted_at) for e in ended]
        rows = fairshare.tally(spans, outcomes, since, until)
        return ReportView(scope="daemon", owners=[self._host(self._node_id)], since=since, until=until, by=by,
                          rows=[row_view(r) for r in rows])

    async def _models(self) -> dict[str, str]:
        """Device uuid -> its model's name, on this machine and every peer known."""
        devices = [(d.uuid, d.name) for w in (self._directory.worker_snapshots() if self._directory else [])
                   for d in w.devices]
        if self._machine is not None:
            devices += [(d.uuid, d.name) for d in (await self._machine.capabilities()).devices]
        return {u: n or "unknown" for u, n in devices if u}

    async def peer_report(self, sender: Sender, msg: UsageReportRequest) -> ReportView:
        """Peer route ``usage_report`` (role: any member): :meth:`report` for that period and key."""
        del sender
        return await self.report(msg.since_s, msg.by)

    async def lab_report(self, since_s: float, by: str) -> ReportView:
        """:meth:`report` of every owner of the lab that is up (asked at once; one that does not answer is
        named in ``missing``), merged: the period ends now, here, for everyone.

        Raises:
            ValueError: as :meth:`report`.
        """
        mine = await self.report(since_s, by)
        transport = self._transport
        peers = self._directory.up_ids() if self._directory is not None and transport is not None else []
        ask = UsageReportRequest(msg_id=new_msg_id(), since_s=since_s, by=by)
        answers: list[ReportView | BaseException] = [] if transport is None else list(await asyncio.gather(
            *(transport.call(p, USAGE_REPORT, ask) for p in peers), return_exceptions=True))
        parts = {self._node_id: mine}  # by node id: two machines may share a host name
        missing = []
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, BaseException):
                log.info("report: %s did not answer: %s", self._host(peer), answer)
                missing.append(self._label(peer))
            else:
                parts[peer] = answer
        return merged({self._label(n): v for n, v in parts.items()}, missing, mine.since, mine.until, by)

    def _label(self, node_id: str) -> str:
        """A node's host name and the head of its id (host names need not be unique)."""
        return f"{self._host(node_id)} ({node_id[:8]})"

    async def purge(self) -> int:
        """Remove the finished jobs older than the retention; how many went."""
        before = self._clock.wall() - self._keep_s
        gone = 0
        while True:
            n = await self._store.history.purge(before)
            gone += n
            if n < 500:
                break
        if gone:
            log.info("history: %d finished jobs older than %g days removed", gone, self._keep_s / 86400)
        return gone

    async def retention_loop(self) -> None:
        """:meth:`purge` now and every hour."""
        while True:
            await self.purge()
            await self._clock.sleep(PURGE_EVERY_S)


def row_view(t: fairshare.Tally) -> ReportRowView:
    """A tally as the API sends it (hours, the median wait, the wait samples)."""
    return ReportRowView(key=t.key[:300], jobs=t.jobs, failures=t.failures, gpu_hours=t.gpu_s / 3600,
                         cpu_slot_hours=t.cpu_slot_s / 3600, median_wait_s=t.median_wait_s, waits=list(t.waits))


def merged(parts: Mapping[str, ReportView], missing: list[str], since: float, until: float, by: str) -> ReportView:
    """Reports of several owners (name -> its report) as one lab-wide report."""
    tallies = [[fairshare.Tally(r.key, r.jobs, r.failures, r.gpu_hours * 3600, r.cpu_slot_hours * 3600, list(r.waits))
                for r in v.rows] for v in parts.values()]
    return ReportView(scope="lab", owners=sorted(parts), missing=sorted(missing), since=since, until=until, by=by,
                      rows=[row_view(t) for t in fairshare.merge_tallies(tallies)])
