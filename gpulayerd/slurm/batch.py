"""The batch script and ``sbatch`` command line of one gpulayer attempt (pure; every value shell-quoted).

The script starts with ``#!/bin/bash``, carries no ``#SBATCH`` lines (the options are on the command line,
where nothing a job's text holds can become an option), exports the job's environment (``sbatch
--export=NONE``: nothing of the submitting process leaks in), enters the workdir and ``exec``s the job's
argv. Multi-node jobs and arrays are refused (:func:`refusal`).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["DROPPED_ENV", "Submission", "batch_script", "comment_of", "refusal", "sbatch_argv", "slurm_time"]

DROPPED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "SLURM_CONF")
"""Variables of the job's environment the script does not export: Slurm sets the GPUs it allocates itself
(the grant of gpulayer's stand-in devices names none of them); ``SLURM_CONF`` is the client's."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Submission:
    """What one attempt asks of Slurm.

    Attributes:
        job_id: gpulayer's job id; ``attempt``: its attempt.
        argv: the command (the interpreter first, as gpulayer builds it).
        env: the job's environment (exported by the script).
        workdir: ``--chdir``.
        out_dir: where the script and the ``.out``/``.err`` files go (the user's, on the shared filesystem).
        partition: ``--partition`` ("" for Slurm's default).
        gpus: GPUs on the one node; ``gpu_type``: the GRES type (``a100``) or None for any.
        cpus: ``--cpus-per-task``.
        time_limit_s: the job's time limit, seconds (``--time`` in whole minutes, rounded up); None: none.
        signal: (signal name, seconds before the limit) for ``--signal=B:NAME@SECONDS``; None: none.
    """

    job_id: str
    attempt: int
    argv: Sequence[str]
    env: Mapping[str, str]
    workdir: str
    out_dir: str
    partition: str = ""
    gpus: int = 0
    gpu_type: str | None = None
    cpus: int = 1
    time_limit_s: float | None = None
    signal: tuple[str, float] | None = None
    extra: Sequence[str] = field(default_factory=tuple)

    @property
    def stem(self) -> str:
        """``<job>-<attempt>``: the name of the script and output files in ``out_dir``."""
        return f"{self.job_id}-{self.attempt}"

    @property
    def script_path(self) -> str:
        """The batch script's path."""
        return f"{self.out_dir}/{self.stem}.sh"

    def output_path(self, stream: str) -> str:
        """The ``out`` or ``err`` file Slurm writes."""
        return f"{self.out_dir}/{self.stem}.{stream}"


def comment_of(job_id: str, attempt: int) -> str:
    """``gpulayer:<job>:<attempt>``: the ``--comment`` a gateway finds its Slurm jobs by."""
    return f"gpulayer:{job_id}:{attempt}"


def refusal(nnodes: int, array: bool) -> str | None:
    """Why a job does not run on a Slurm worker (multi-node, array task), or None."""
    if nnodes > 1:
        return f"NotOnSlurm: a job over {nnodes} nodes does not run on a Slurm worker yet (it runs elsewhere)"
    if array:
        return "NotOnSlurm: array tasks do not run on a Slurm worker yet (they run elsewhere)"
    return None


def slurm_time(seconds: float) -> str:
    """``--time`` of a limit: whole minutes (rounded up, at least 1), as ``D-HH:MM:00`` or ``MM``."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 1440)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00" if days else str(minutes)


def batch_script(sub: Submission) -> str:
    """The batch script of ``sub``: the environment exported, the workdir entered, the argv exec'd."""
    lines = ["#!/bin/bash", f"# gpulayer job {sub.job_id} attempt {sub.attempt}"]
    for k in sorted(sub.env):
        if k in DROPPED_ENV or not _NAME.match(k):
            continue
        lines.append(f"export {k}={shlex.quote(sub.env[k])}")
    lines.append(f"cd -- {shlex.quote(sub.workdir)} || exit 1")
    lines.append("exec " + " ".join(shlex.quote(a) for a in sub.argv))
    return "\n".join(lines) + "\n"


def sbatch_argv(sub: Submission) -> list[str]:
    """``sbatch --parsable ... SCRIPT`` for ``sub`` (one node, one task)."""
    argv = ["sbatch", "--parsable", f"--job-name=gpulayer-{sub.job_id}", "--nodes=1", "--ntasks=1",
            f"--cpus-per-task={max(1, sub.cpus)}", f"--output={sub.output_path('out')}",
            f"--error={sub.output_path('err')}", f"--chdir={sub.workdir}", "--export=NONE",
            f"--comment={comment_of(sub.job_id, sub.attempt)}"]
    if sub.partition:
        argv.append(f"--partition={sub.partition}")
    if sub.gpus:
        argv.append(f"--gres=gpu:{sub.gpu_type}:{sub.gpus}" if sub.gpu_type else f"--gres=gpu:{sub.gpus}")
    if sub.time_limit_s is not None:
        argv.append(f"--time={slurm_time(sub.time_limit_s)}")
    if sub.signal is not None:
        argv.append(f"--signal=B:{sub.signal[0]}@{max(1, round(sub.signal[1]))}")
    argv.extend(sub.extra)
    argv.append(sub.script_path)
    return argv
