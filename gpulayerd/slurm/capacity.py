"""The cluster's partitions, nodes and GRES as this worker's inventory (what ``gpulayer devices`` lists).

Each GPU of a node of an allowed partition is one device: ``slurm:<node>:<type>:<i>`` (its uuid), named
``<type> on <node>``, with the memory and compute capability ``[slurm.gres]`` gives its type (else
unknown). When Slurm does not answer, the last devices seen are kept, marked unusable with Slurm's words,
and the ``slurm`` health says so (degraded: no new GPU claims until it answers).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpulayerd.core.types import Accelerator, DeviceSnapshot, DeviceState, MemoryKind, ProbeHealth, ProbeStatus
from gpulayerd.gpu.discovery import HostInventory
from gpulayerd.slurm.outputs import SlurmNode
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands, SlurmError

__all__ = ["SlurmCapacity", "devices_of", "uuid_parts"]


def uuid_parts(uuid: str) -> tuple[str, str | None] | None:
    """(node, GRES type or None) of a Slurm device's uuid; None for another uuid."""
    parts = uuid.split(":")
    if len(parts) != 4 or parts[0] != "slurm":
        return None
    return parts[1], (parts[2] or None)


def devices_of(nodes: list[SlurmNode], cfg: SlurmConfig) -> tuple[DeviceSnapshot, ...]:
    """The GPUs of ``nodes`` (those in ``cfg.partitions``, every one when empty) as devices."""
    out: list[DeviceSnapshot] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if cfg.partitions and not set(node.partitions) & set(cfg.partitions):
            continue
        for g in node.gres:
            if g.name != "gpu":
                continue
            model = cfg.gres.get(g.type or "")
            for i in range(g.count):
                out.append(DeviceSnapshot(
                    accelerator=Accelerator.CUDA, index=len(out), uuid=f"slurm:{node.name}:{g.type or ''}:{i}",
                    name=f"{g.type or 'gpu'} on {node.name}",
                    memory_total_bytes=int(model.memory_gb * 2**30) if model and model.memory_gb else None,
                    memory_used_bytes=0, memory_kind=MemoryKind.DEDICATED,
                    compute_capability=model.compute_capability if model else None,
                    execution_supported=True,
                    state=DeviceState.OK if node.usable else DeviceState.UNUSABLE,
                    state_reason="" if node.usable else f"Slurm node {node.name} is {node.state}"))
    return tuple(out)


@dataclass
class SlurmCapacity:
    """Reads the cluster into a :class:`HostInventory` (called in a thread by the machine's probe)."""

    cfg: SlurmConfig
    commands: SlurmCommands
    hostname: str
    last: HostInventory | None = None
    partitions: tuple[str, ...] = ()
    gres: tuple[str, ...] = ()
    error: str = ""
    """Slurm's words when the last ``sinfo`` failed ("" when it answered)."""

    def inventory(self) -> HostInventory:
        """The cluster now, or the last one seen marked unusable with Slurm's words (never raises)."""
        try:
            nodes = self.commands.nodes()
        except SlurmError as e:
            self.error = str(e)
            return self._degraded(str(e))
        self.error = ""
        mine = [n for n in nodes if not self.cfg.partitions or set(n.partitions) & set(self.cfg.partitions)]
        self.partitions = tuple(sorted({p for n in mine for p in n.partitions
                                        if not self.cfg.partitions or p in self.cfg.partitions}))
        self.gres = tuple(sorted({f"{n.name}: {g.name}:{g.type or ''}:{g.count}".replace("::", ":")
                                  for n in mine for g in n.gres}))
        inv = HostInventory(
            devices=devices_of(nodes, self.cfg),
            health=(ProbeHealth("slurm", ProbeStatus.OK, f"partitions {', '.join(self.partitions) or 'none'}"),),
            cpu_count=sum(n.cpus or 0 for n in mine) or None,
            memory_total_bytes=sum((n.memory_mb or 0) * 2**20 for n in mine) or None,
            hostname=self.hostname, platform="Linux", machine="", notes=())
        self.last = inv
        return inv

    def _degraded(self, words: str) -> HostInventory:
        last = self.last
        devices = tuple(replace(d, state=DeviceState.UNUSABLE, state_reason=f"Slurm did not answer: {words}")
                        for d in (last.devices if last is not None else ()))
        return HostInventory(devices=devices, health=(ProbeHealth("slurm", ProbeStatus.ERROR, words),),
                             cpu_count=last.cpu_count if last else None,
                             memory_total_bytes=last.memory_total_bytes if last else None,
                             hostname=self.hostname, platform="Linux", machine="", notes=(words,))
