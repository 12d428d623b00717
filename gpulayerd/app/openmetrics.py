"""``GET /metrics``: this daemon in the Prometheus text format, for admins' scrapers (prometheus-client).

Every series holds only what every user of the lab may see (``gpulayer jobs`` and ``users`` show
the same): job counts by state, by waiting reason code and by user; GPUs granted on this machine;
each user's decayed fair-share usage; the probes' health; counters of claim conflicts and lease
losses. No job id, name, command or path. A scrape reads the store once and never starts the
live GPU sampler (``GET /v1/metrics``'s ``nvidia-smi`` process).

On the local socket for every local user; optionally on TCP (``metrics_listen``, off by default,
127.0.0.1 when on) for a request with ``Authorization: Bearer <token>``, the token read from
``metrics_token_file``, which must be a regular file readable by no one but its owner and group
(0640: root and the admin group) — :func:`gpulayerd.config.read_token` refuses any other; the
listener is :func:`gpulayerd.api.server.metrics_loops`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily

from gpulayerd.app.common.signals import Signals
from gpulayerd.app.common.usage import UsageService
from gpulayerd.app.worker.machine import Machine
from gpulayerd.core.reasons import code_for
from gpulayerd.store import Store

__all__ = ["OpenMetrics"]

MAX_USERS = 1000
"""Users with series of their own; the rest are summed as ``(others)`` (bounded cardinality)."""


class OpenMetrics:
    """Renders the daemon's series (see the module).

    Args:
        stats: the daemon's protocol counters (:attr:`Signals.stats`).
        usage: the fair-share book (None: no usage series).
    """

    def __init__(self, *, store: Store, machine: Machine, signals: Signals, usage: UsageService | None) -> None:
        self._store = store
        self._machine = machine
        self._stats: Mapping[str, int] = signals.stats
        self._usage = usage

    async def render(self) -> bytes:
        """The whole exposition, in the Prometheus text format."""
        reg = CollectorRegistry()
        jobs = Gauge("gpulayer_jobs", "Jobs owned here that have not ended, by state and user",
                     ["state", "user"], registry=reg)
        waiting = Gauge("gpulayer_jobs_waiting", "Queued jobs owned here by the code of their reason",
                        ["reason", "user"], registry=reg)
        rows = await self._store.history.active_jobs()
        by_user = Counter(u for _, u, _ in rows)
        known = {u for u, _ in by_user.most_common(MAX_USERS)}

        def who(user: str) -> str:
            return user if user in known else "(others)"

        for (state, user), n in Counter((s, who(u)) for s, u, _ in rows).items():
            jobs.labels(state, user).set(n)
        for (code, user), n in Counter((code_for(s, r), who(u)) for s, u, r in rows if s == "queued").items():
            waiting.labels(code, user).set(n)
        caps = await self._machine.capabilities()
        granted = Gauge("gpulayer_devices", "This machine's devices by accelerator and whether one is granted",
                        ["accelerator", "granted"], registry=reg)
        devices = Counter((d.accelerator.value, "yes" if d.granted_to else "no") for d in caps.devices)
        for (acc, g), n in devices.items():
            granted.labels(acc, g).set(n)
        health = Gauge("gpulayer_probe_ok", "1 when a probe source answered fine or is absent (no such tool "
                       "or device here: not_found, no_devices), 0 when it failed",
                       ["source", "status"], registry=reg)
        for h in caps.health:
            health.labels(h.source, h.status.value).set(1 if h.status.value in ("ok", "not_found", "no_devices") else 0)
        if self._usage is not None:
            gpu = Gauge("gpulayer_fairshare_gpu_hours", "Each user's decayed GPU-hours (fair share)", ["user"],
                        registry=reg)
            slot = Gauge("gpulayer_fairshare_cpu_slot_hours", "Each user's decayed CPU-slot-hours (fair share)",
                         ["user"], registry=reg)
            for user, u in sorted(self._usage.usage().items())[:MAX_USERS]:
                gpu.labels(user or "(unknown)").set(u.gpu_s / 3600)
                slot.labels(user or "(unknown)").set(u.cpu_slot_s / 3600)
        slots = Gauge("gpulayer_cpu_slots", "This machine's CPU slots for jobs, free and in all", ["state"],
                      registry=reg)
        slots.labels("total").set(caps.cpu_slots_total or 0)
        slots.labels("free").set(caps.cpu_slots_free or 0)
        reg.register(_Counters(self._stats))
        return generate_latest(reg)


class _Counters:
    """The protocol counters as Prometheus counters (their values since the daemon started)."""

    SERIES = (("gpulayer_claim_conflicts", "claim_requests_denied",
               "Claims this owner denied (another worker's claim won, or the job had changed)"),
              ("gpulayer_claims_granted", "claim_requests_granted", "Claims this owner granted"),
              ("gpulayer_lease_losses", "lease_losses", "Attempts this owner declared lost (lease expired)"),
              ("gpulayer_peer_refusals", "peer_messages_refused", "Peer messages refused for a missing role"))

    def __init__(self, stats: Mapping[str, int]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, key, text in self.SERIES:
            yield CounterMetricFamily(name, text, value=self._stats.get(key, 0))
