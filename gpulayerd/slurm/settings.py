"""The ``[slurm]`` section of the daemon's config: which partitions, what GRES types are, the interpreters.

A bad key or value stops the daemon's start (exit 2) naming it, as any other setting does::

    [slurm]
    partitions = ["gpu"]             # the partitions this worker may use (empty: every one it sees)
    interpreters = ["/usr/bin/python3"]
    probe_on_login = false           # true: probe them here; false: in a short srun job on the cluster
    probe_every_s = 86400            # an srun probe's answer is kept this long
    prefer = "last"                  # or "overflow-after = 10m"
    command_timeout_s = 10
    output_dir = "{home}/.gpulayer/slurm"   # on the shared filesystem; {home}, {user}
    env = { SLURM_CONF = "/etc/slurm/slurm.conf" }
    [slurm.gres]
    a100 = { memory_gb = 80, cc = "8.0" }
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from gpulayerd.core.job_policy import parse_duration

__all__ = ["GresModel", "SlurmConfig"]

_CC = re.compile(r"^\d{1,2}\.\d{1,2}$")


class GresModel(BaseModel):
    """What a GRES type is (``a100 = { memory_gb = 80, cc = "8.0" }``); a field left out stays unknown."""

    model_config = ConfigDict(extra="forbid")

    memory_gb: float | None = Field(default=None, gt=0)
    cc: str | None = None

    @field_validator("cc")
    @classmethod
    def _cc(cls, v: str | None) -> str | None:
        if v is not None and not _CC.match(v):
            raise ValueError(f"cc must be MAJOR.MINOR such as \"8.0\", not {v!r}")
        return v

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """``cc`` as (major, minor); None when unknown."""
        if self.cc is None:
            return None
        major, minor = self.cc.split(".")
        return int(major), int(minor)


class SlurmConfig(BaseModel):
    """Settings of a worker backed by a Slurm cluster.

    Attributes:
        partitions: the partitions this worker uses (empty: every partition ``sinfo`` shows).
        gres: GRES type (``a100``) -> its GPU's memory and compute capability.
        interpreters: the workload interpreters on the cluster's nodes (default: the daemon's).
        probe_on_login: probe the interpreters on this login node (as any worker does) rather than in a
            short ``srun`` job on the cluster (:mod:`gpulayerd.slurm.srunprobe`, the default).
        probe_every_s: how long an ``srun`` probe's answer is kept (seconds) before it is probed again
            (a changed ``[slurm]`` setting or interpreter list probes again at once).
        prefer: ``last`` (the cluster gets what fits no workstation now:
            :func:`gpulayerd.core.matching.targeting.prefer_workstations`) or ``overflow-after = DURATION``
            (it takes a job only once the job waited that long since its submit: :attr:`overflow_after_s`).
        command_timeout_s: hard limit of one Slurm command (sinfo, sbatch, squeue, scontrol, scancel).
        poll_interval_s: how often a submitted job's state is read.
        output_dir: where a job's batch script and output go, per user, on the shared filesystem
            (``{home}`` and ``{user}`` are the job user's); made 0700 as the user.
        env: variables Slurm's commands get (``SLURM_CONF``), on top of the job's or the daemon's.
    """

    model_config = ConfigDict(extra="forbid")

    partitions: list[str] = Field(default_factory=list)
    gres: dict[str, GresModel] = Field(default_factory=dict)
    interpreters: list[str] = Field(default_factory=list)
    probe_on_login: StrictBool = False
    probe_every_s: float = Field(default=86400.0, gt=0)
    prefer: str = "last"
    command_timeout_s: float = Field(default=10.0, gt=0, le=300)
    poll_interval_s: float = Field(default=1.0, gt=0, le=60)
    output_dir: str = "{home}/.gpulayer/slurm"
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("prefer")
    @classmethod
    def _prefer(cls, v: str) -> str:
        if v == "last":
            return v
        m = re.fullmatch(r"overflow-after\s*=\s*(\S+)", v.strip())
        if m is None:
            raise ValueError(f"prefer is \"last\" or \"overflow-after = DURATION\", not {v!r}")
        parse_duration(m.group(1))
        return v

    @property
    def overflow_after_s(self) -> float | None:
        """``prefer = "overflow-after = D"``'s D in seconds; None for ``last``."""
        m = re.fullmatch(r"overflow-after\s*=\s*(\S+)", self.prefer.strip())
        return parse_duration(m.group(1)) if m else None

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, v: list[str]) -> list[str]:
        for p in v:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", p):
                raise ValueError(f"not a partition name: {p!r}")
        return v
