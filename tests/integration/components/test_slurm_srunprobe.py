"""The environments of a Slurm worker probed with srun (:mod:`gpulayerd.slurm.srunprobe`): kept a day (or
``probe_every_s``), kept over a restart in the cache file, probed again when ``[slurm]`` changes, a refused
srun a broken environment with srun's words. The "srun" here runs the real probe in this interpreter (the
real cluster's case is tests/integration/test_slurm.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path

from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.command import CommandResult, run_command
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands
from gpulayerd.slurm.srunprobe import PENDING_NOTE, RETRY_S, SrunProbe


class Cluster:
    """srun: runs the command after its options here (the probe, for real), or refuses as Slurm would."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.refuse = ""

    def run(self, argv: Sequence[str], timeout_s: float, env: object = None) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        if self.refuse:
            return CommandResult(stderr=self.refuse, returncode=1)
        return run_command(argv[argv.index("gpulayer-probe") + 1:], timeout_s)


def probe_with(cluster: Cluster, cfg: SlurmConfig, cache: Path, now: list[float],
               landed: list[EnvironmentSnapshot]) -> tuple[SrunProbe, list[Coroutine[object, object, None]]]:
    tasks: list[Coroutine[object, object, None]] = []

    async def apply(snap: EnvironmentSnapshot) -> None:
        landed.append(snap)

    return SrunProbe(cfg, SlurmCommands(30.0, cfg.env, cluster.run), cache,
                     lambda coro, _: tasks.append(coro), apply, lambda: now[0]), tasks


def answer(probe: SrunProbe, tasks: list[Coroutine[object, object, None]]) -> list[EnvironmentSnapshot]:
    """answers() once, then every probe it started run to its end (as the daemon's background tasks)."""
    async def go() -> list[EnvironmentSnapshot]:
        got = await probe.answers([sys.executable])
        while tasks:
            await tasks.pop()
        return got
    return asyncio.run(go())


def test_srun_answers_are_kept_a_day_over_restarts_and_probed_again_when_slurm_settings_change(
        tmp_path: Path) -> None:
    cluster, now, landed = Cluster(), [1000.0], []
    cache, cfg = tmp_path / "slurm-environments.json", SlurmConfig(partitions=["gpu"])
    probe, tasks = probe_with(cluster, cfg, cache, now, landed)
    (first,) = answer(probe, tasks)
    assert not first.ok and first.notes == (PENDING_NOTE,)  # not ready until the srun job answers
    assert [c[:4] for c in cluster.calls] == [["srun", "--partition", "gpu", "--nodes"]]
    assert landed[0].ok and landed[0].interpreter == sys.executable and landed[0].python_version
    now[0] += 86399  # within the day, and over a restart: the kept answer, no srun
    probe, tasks = probe_with(cluster, cfg, cache, now, landed)
    assert answer(probe, tasks)[0].ok and len(cluster.calls) == 1
    now[0] += 2  # a day old: answered from the cache while probed again
    assert answer(probe, tasks)[0].ok and len(cluster.calls) == 2
    other = SlurmConfig(partitions=["a100"])  # another partition: probed again at once
    probe, tasks = probe_with(cluster, other, cache, now, landed)
    assert not answer(probe, tasks)[0].ok and cluster.calls[-1][2] == "a100" and len(cluster.calls) == 3


def test_a_refused_srun_is_a_broken_environment_with_sruns_words_probed_again_later(tmp_path: Path) -> None:
    cluster, now, landed = Cluster(), [1000.0], []
    cluster.refuse = "srun: error: Unable to allocate resources: Invalid account or account/partition combination"
    probe, tasks = probe_with(cluster, SlurmConfig(), tmp_path / "c.json", now, landed)
    answer(probe, tasks)
    assert "--partition" not in cluster.calls[0]  # none configured: Slurm's default partition
    assert not landed[0].ok and landed[0].notes == (f"srun probe failed: {cluster.refuse}",)
    (kept,) = answer(probe, tasks)
    assert kept.notes == landed[0].notes and len(cluster.calls) == 1  # kept a while, not probed on every pass
    now[0] += RETRY_S
    cluster.refuse = ""
    answer(probe, tasks)
    assert len(cluster.calls) == 2 and landed[-1].ok
