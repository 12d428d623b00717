"""What this machine has handed out: attempts starting and running here, and gang holds.

One object shared by the worker, the gang member and the machine snapshot, so that the
matcher never sees a device or CPU slot as free while an attempt or a hold has it. It
keeps no store state: grants live in the store; this is what the processes are doing now.

The decisions about offers, claims, holds, runs, renewals and reports are made by the
pure :mod:`gpulayerd.core.protocol.worker`, whose state the ledger keeps (:meth:`Ledger.apply`);
beside it, the ledger keeps what the core does not: run handles, specs, lock fds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpulayerd.core.protocol import worker as core
from gpulayerd.core.types import Accelerator
from gpulayerd.core.verdict import Placement
from gpulayerd.host import sysinfo
from gpulayerd.models import JobSpec
from gpulayerd.runs.runner import RunHandle

__all__ = ["HeldResources", "Ledger", "RunEntry", "RunKey", "cpu_slots_of", "process_trees"]

RunKey = tuple[str, int]
"""(job id, attempt)."""


def cpu_slots_of(spec: JobSpec) -> int:
    """CPU slots an attempt of ``spec`` takes on one machine: its ranks for a CPU job, else 0."""
    if spec.requirements.accelerator is not Accelerator.CPU:
        return 0
    return spec.distributed.nproc_per_node if spec.distributed is not None else 1


def _holding_of(spec: JobSpec) -> tuple[str, int, int]:
    """(user, GPUs, CPU slots) an attempt of ``spec`` holds on one machine (fair share)."""
    gpus = 0 if spec.requirements.accelerator is Accelerator.CPU else spec.requirements.effective_gpu_count
    return spec.user or "", gpus, cpu_slots_of(spec)


def process_trees(pids: Iterable[int]) -> set[int]:
    """``pids`` that live and every process under them: our watchdogs' trees are not foreign
    to a GPU's process list. Reads /proc: call it in a thread."""
    out: set[int] = set()
    for pid in pids:
        with contextlib.suppress(sysinfo.Error):
            p = sysinfo.Process(pid)
            out.add(p.pid)
            out.update(c.pid for c in p.children(recursive=True))
    return out


@dataclass
class RunEntry:
    """One attempt running here.

    Attributes:
        handle: its watchdog and process group.
        owner: node id of the job's owner (this daemon's own for a job owned here).
        lease_s: the lease the owner granted, seconds (renewals move the deadline by it).
        cpu_slots: CPU slots it takes; gpu: True if it runs on accelerators.
    """

    handle: RunHandle
    owner: str
    lease_s: float
    cpu_slots: int
    gpu: bool


@dataclass
class HeldResources:
    """Worker side of a gang: what a hold reserves until commit, release or expiry (monotonic s)."""

    owner: str
    job_id: str
    spec: JobSpec
    placement: Placement
    fds: list[int]
    expires_at: float
    address: str
    interface: str
    port: int
    cpu_slots: int


class Ledger:
    """Attempts starting or running on this machine, and gang holds."""

    def __init__(self) -> None:
        self._state = core.WorkerState()
        self._runs: dict[RunKey, RunEntry] = {}
        self._starting: dict[RunKey, int] = {}  # claimed here, watchdog starting -> CPU slots
        self._holds: dict[str, HeldResources] = {}
        self._users: dict[RunKey, tuple[str, int, int]] = {}  # starting or running -> (user, GPUs, CPU slots)
        self._listeners: list[Callable[[], None]] = []

    def on_holdings_changed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of :meth:`holdings` (an attempt starting, started, ended,
        a hold kept or dropped): fair share accrues what was held until that moment."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    # --- the worker core

    @property
    def state(self) -> core.WorkerState:
        """The worker core's state now (read-only)."""
        return self._state

    def apply(self, event: core.Event, now: float) -> list[core.Action]:
        """Feed ``event`` to the worker core at ``now`` (monotonic s); the actions to carry out."""
        self._state, actions = core.handle(self._state, event, now)
        return actions

    # --- runs

    def starting(self, key: RunKey, spec: JobSpec) -> None:
        """An attempt was claimed here and its watchdog is starting."""
        self._starting[key] = cpu_slots_of(spec)
        self._users[key] = _holding_of(spec)
        self._changed()

    def started(self, key: RunKey, handle: RunHandle, spec: JobSpec, owner: str, lease_s: float) -> None:
        """An attempt runs here now (or was re-adopted after a restart)."""
        self._starting.pop(key, None)
        self._users[key] = _holding_of(spec)
        self._runs[key] = RunEntry(handle, owner, lease_s, cpu_slots_of(spec),
                                   spec.requirements.accelerator is not Accelerator.CPU)
        self._changed()

    def not_started(self, key: RunKey) -> None:
        """A start failed."""
        self._starting.pop(key, None)
        if self._users.pop(key, None) is not None:
            self._changed()

    def ended(self, key: RunKey) -> RunEntry | None:
        """Forget an attempt that ended; its entry, if it was running."""
        self._starting.pop(key, None)
        held = self._users.pop(key, None)
        entry = self._runs.pop(key, None)
        if held is not None:
            self._changed()
        return entry

    def get(self, key: RunKey) -> RunEntry | None:
        """The running attempt ``key``, if any."""
        return self._runs.get(key)

    def runs(self) -> list[tuple[RunKey, RunEntry]]:
        """Every running attempt (a copy: safe to change the ledger while iterating)."""
        return list(self._runs.items())

    def keys(self) -> list[RunKey]:
        """Keys of every running attempt, sorted."""
        return sorted(self._runs)

    def runs_for(self, owner: str, job_id: str) -> bool:
        """True if an attempt of ``owner``'s job ``job_id`` starts or runs here."""
        return self._state.runs_for(owner, job_id)

    def gpu_runs(self) -> int:
        """How many running attempts use accelerators."""
        return sum(1 for e in self._runs.values() if e.gpu)

    def cpu_slots_used(self) -> int:
        """CPU slots taken by running and starting attempts and by holds."""
        return (sum(e.cpu_slots for e in self._runs.values()) + sum(self._starting.values())
                + sum(h.cpu_slots for h in self._holds.values()))

    def watchdog_pids(self) -> list[int]:
        """Pids of the watchdogs of every running attempt (see :func:`process_trees`)."""
        return [e.handle.watchdog_pid for e in self._runs.values()]

    # --- holds

    def hold(self, hold_id: str, held: HeldResources) -> None:
        """Keep a gang hold."""
        self._holds[hold_id] = held
        self._changed()

    def held(self, hold_id: str) -> HeldResources | None:
        """The hold ``hold_id``, if kept."""
        return self._holds.get(hold_id)

    def release(self, hold_id: str) -> HeldResources | None:
        """Drop a hold; what it held."""
        held = self._holds.pop(hold_id, None)
        if held is not None:
            self._changed()
        return held

    def held_devices(self) -> dict[str, str]:
        """Device uuid -> the job that has it here before the store's grants say so: ``"<job>"`` for
        a claim in flight or a granted attempt not yet started, ``"<job> (held)"`` for a hold."""
        out = {u: job for (_, job), o in self._state.offers.items() for u in (o.claiming or ())}
        out.update((u, job) for (job, _), r in self._state.runs.items() for u in r.devices)
        out.update((u, f"{h.job_id} (held)") for h in self._holds.values() for u in h.placement.device_uuids if u)
        return out

    # --- fair share

    def holdings(self) -> dict[str, tuple[int, int]]:
        """User -> (GPUs, CPU slots) held on this machine now by attempts starting or running
        here and by gang holds (what this node reports for fair share)."""
        out: dict[str, tuple[int, int]] = {}
        held = [*self._users.values(), *(_holding_of(h.spec) for h in self._holds.values())]
        for user, gpus, slots in held:
            g, c = out.get(user, (0, 0))
            out[user] = (g + gpus, c + slots)
        return out
