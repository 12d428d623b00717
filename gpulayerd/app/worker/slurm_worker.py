"""This machine as a worker backed by a Slurm cluster (``[slurm]``): its inventory, kind and refusals.

:func:`attach_slurm` turns the :class:`~gpulayerd.app.worker.machine.Machine` of a login node's gpulayerd
into the cluster's worker: its devices are the GPUs of the allowed partitions (read by
:class:`~gpulayerd.slurm.capacity.SlurmCapacity` at every probe), its capabilities say ``kind = "slurm"``
with the partitions and GRES, and its offers refuse what this worker does not run yet (multi-node jobs,
array tasks). The attempts it claims run as :mod:`gpulayerd.slurm.proxy` under their watchdogs
(:class:`~gpulayerd.app.worker.starter.Starter`).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from gpulayerd.app.worker.machine import Machine
from gpulayerd.models import Capabilities
from gpulayerd.slurm.batch import refusal
from gpulayerd.slurm.capacity import SlurmCapacity
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands

__all__ = ["attach_slurm", "spec_refusal"]


def spec_refusal(spec: Mapping[str, object]) -> str | None:
    """Why an offered spec (JSON) does not run on a Slurm worker (multi-node, an array task), or None."""
    dist = spec.get("distributed")
    nnodes = dist.get("nnodes", 1) if isinstance(dist, Mapping) else 1
    return refusal(nnodes if isinstance(nnodes, int) else 1, spec.get("array_task") is not None)


def attach_slurm(machine: Machine, cfg: SlurmConfig | None) -> SlurmCapacity | None:
    """Make ``machine`` the worker of the Slurm cluster ``cfg`` names; the capacity reader it uses (None:
    ``cfg`` is None, the machine stays as it is)."""
    if cfg is None:
        return None
    capacity = SlurmCapacity(cfg, SlurmCommands(cfg.command_timeout_s, cfg.env), socket.gethostname())

    def shape(caps: Capabilities) -> Capabilities:
        return caps.model_copy(update={"kind": "slurm", "slurm_partitions": list(capacity.partitions),
                                       "slurm_gres": list(capacity.gres)})

    machine.inventory_source = capacity.inventory
    machine.shape_caps = shape
    machine.accounts.refuse_spec = spec_refusal
    return capacity
