"""The watchdog's command line for one attempt on a Slurm worker: ``python -m gpulayerd.slurm.proxy JSON``.

Built by the worker's :class:`~gpulayerd.app.worker.starter.Starter` in place of the job's own argv: the
JSON carries the job's argv and environment (the batch script exports them), its workdir, the GPUs of its
placement (their GRES type), its CPUs, time limit and warning signal, the output directory and the Slurm
client settings (:mod:`gpulayerd.slurm.proxy` reads it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from gpulayerd.slurm.capacity import uuid_parts
from gpulayerd.slurm.settings import SlurmConfig

__all__ = ["proxy_argv"]


def proxy_argv(cfg: SlurmConfig, python: str, job_id: str, attempt: int, argv: Sequence[str],
               env: Mapping[str, str], workdir: str, device_uuids: Sequence[str], cpus: int,
               time_limit_s: float | None, warning: tuple[str, float] | None) -> list[str]:
    """``[python, -m, gpulayerd.slurm.proxy, JSON]`` for this attempt.

    Args:
        device_uuids: the placement's devices (``slurm:<node>:<type>:<i>``): their count is ``--gres``'s,
            their type (when every one has the same) its type.
        warning: (signal name, seconds after the start) of the warning before the time limit.
    """
    types = {p[1] for p in (uuid_parts(u) for u in device_uuids) if p is not None}
    signal = None
    if warning is not None and time_limit_s is not None and time_limit_s - warning[1] > 0:
        signal = [warning[0], time_limit_s - warning[1]]
    data = {
        "job_id": job_id, "attempt": attempt, "argv": list(argv), "env": dict(env), "workdir": workdir,
        "out_dir": cfg.output_dir, "partition": cfg.partitions[0] if cfg.partitions else "",
        "gpus": len(device_uuids), "gpu_type": next(iter(types)) if len(types) == 1 else None,
        "cpus": max(1, cpus), "time_limit_s": time_limit_s, "signal": signal,
        "command_timeout_s": cfg.command_timeout_s, "poll_interval_s": cfg.poll_interval_s, "slurm_env": cfg.env,
    }
    return [python, "-m", "gpulayerd.slurm.proxy", json.dumps(data, separators=(",", ":"))]
