"""This machine as a worker backed by a Slurm cluster (``[slurm]``): its inventory, kind and refusals.

:func:`attach_slurm` turns the :class:`~gpulayerd.app.worker.machine.Machine` of a login node's gpulayerd
into the cluster's worker: its devices are the GPUs of the allowed partitions (read by
:class:`~gpulayerd.slurm.capacity.SlurmCapacity` at every probe), its capabilities say ``kind = "slurm"``
with the partitions and GRES, and its offers refuse what this worker does not run yet (multi-node jobs,
array tasks). The attempts it claims run as :mod:`gpulayerd.slurm.proxy` under their watchdogs
(:class:`~gpulayerd.app.worker.starter.Starter`); :class:`SlurmGate` holds each one's ``started`` report
until Slurm runs it (WHERE: Slurm's node), the claimed job's reason following Slurm's meanwhile
(``SlurmPending: Priority (partition gpu, position 2)``), read from ``squeue`` (:class:`SlurmQueue`).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Mapping

from gpulayerd.app.common.ledger import Ledger, RunKey
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.models import Capabilities
from gpulayerd.runs.runner import RunHandle, Runner
from gpulayerd.slurm.batch import refusal
from gpulayerd.slurm.capacity import SlurmCapacity
from gpulayerd.slurm.queue import SlurmQueue
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands

__all__ = ["SlurmGate", "attach_slurm", "spec_refusal"]


def spec_refusal(spec: Mapping[str, object]) -> str | None:
    """Why an offered spec (JSON) does not run on a Slurm worker (multi-node, an array task), or None."""
    dist = spec.get("distributed")
    nnodes = dist.get("nnodes", 1) if isinstance(dist, Mapping) else 1
    return refusal(nnodes if isinstance(nnodes, int) else 1, spec.get("array_task") is not None)


class SlurmGate:
    """Holds a started attempt's ``started`` report until Slurm runs its job (or the attempt ended).

    Args:
        queue: the shared ``squeue`` reader.
        report: ``WorkerService.report`` (a ``renew`` carrying the pending reason).
        ended: whether the attempt's watchdog has ended (blocking: run in a thread).
        poll_s: how often Slurm is asked.
        lease_of: an attempt's lease (seconds), None when it is not running here.
    """

    def __init__(self, queue: SlurmQueue, report: Callable[..., Awaitable[object]],
                 ended: Callable[[RunHandle], bool], poll_s: float, lease_of: Callable[[RunKey], float | None]) -> None:
        self.queue = queue
        self._lease_of = lease_of
        self._report = report
        self._ended = ended
        self._poll_s = poll_s

    async def until_running(self, owner: str, key: RunKey, handle: RunHandle) -> str:
        """Wait until Slurm runs the attempt's job; its node list ("" when the attempt ended first). While
        it is pending, each new reason goes to the owner with a renewal (the claimed job's reason)."""
        said = ""
        while not await asyncio.to_thread(self._ended, handle):
            await self.queue.refresh()
            job = self.queue.find(*key)
            if job is not None and job.state != "PENDING":
                return job.nodes if job.nodes and job.state in ("RUNNING", "COMPLETING", "CONFIGURING") else ""
            reason = self.queue.reason(job) if job is not None else ""
            if reason and reason != said:
                said = reason
                await self._report(owner, key, "renew", None, reason)
            await asyncio.sleep(self._poll_s)
        return ""

    def renewable(self, key: RunKey) -> bool:
        """Whether the attempt's lease is renewed now: ``squeue`` answered within the lease (slurmctld
        unreachable longer: the lease runs out and the attempt is lost, as any worker's that stops renewing)."""
        self.queue.poke()
        lease_s = self._lease_of(key)
        return lease_s is None or self.queue.answered_within(lease_s)


def attach_slurm(machine: Machine, cfg: SlurmConfig | None, worker: WorkerService | None = None,
                 runner: Runner | None = None, ledger: Ledger | None = None) -> SlurmCapacity | None:
    """Make ``machine`` the worker of the Slurm cluster ``cfg`` names (``worker``'s started attempts wait
    for Slurm to run them); the capacity reader it uses (None: ``cfg`` is None, nothing changes)."""
    if cfg is None:
        return None
    commands = SlurmCommands(cfg.command_timeout_s, cfg.env)
    capacity = SlurmCapacity(cfg, commands, socket.gethostname())
    gate: SlurmGate | None = None
    if worker is not None and runner is not None and ledger is not None:
        def lease_of(key: RunKey) -> float | None:
            run = ledger.state.runs.get(key)
            return run.lease_s if run is not None else None

        gate = SlurmGate(SlurmQueue(commands, cfg.poll_interval_s), worker.report,
                         lambda h: not runner.poll(h).running, cfg.poll_interval_s, lease_of)
        worker.start_gate, worker.renewable = gate.until_running, gate.renewable

    def refuse(spec: Mapping[str, object]) -> str | None:
        """What the worker does not run (:func:`spec_refusal`), and nothing while Slurm does not answer."""
        if gate is not None:
            gate.queue.poke()
        down = capacity.error or (gate.queue.error if gate is not None else "")
        return spec_refusal(spec) or (f"SlurmDown: Slurm does not answer: {down}" if down else None)

    def shape(caps: Capabilities) -> Capabilities:
        return caps.model_copy(update={"kind": "slurm", "slurm_partitions": list(capacity.partitions),
                                       "slurm_gres": list(capacity.gres)})

    machine.inventory_source = capacity.inventory
    machine.shape_caps = shape
    machine.accounts.refuse_spec = refuse
    return capacity
