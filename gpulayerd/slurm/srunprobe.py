"""Environments of a Slurm worker probed where its jobs run: each ``[slurm] interpreters`` entry runs
gpulayerd's environment probe (:mod:`gpulayerd.gpu.probe`, its source on the command line) in a short
``srun`` job on the cluster, as the daemon's own account, bounded by ``command_timeout_s``::

    srun --partition gpu --nodes 1 --ntasks 1 --time 1 --quiet --job-name gpulayer-probe \
        /shared/envs/torch/bin/python -c <probe source> --probe

An answer is kept ``probe_every_s`` (a day by default), in memory and in a cache file of the daemon's
state, keyed on the interpreter, the partition, ``[slurm] env`` and the probe's source (a changed setting
probes again at once). Until an interpreter's first answer lands it is reported not ready (``ok`` False,
"being probed with srun"); a probe that fails (srun refused, timed out, no report) reports that
environment broken with srun's words, kept a shorter while (:data:`RETRY_S`), and never raises.
With ``probe_on_login = true`` none of this runs: the login node's interpreters are probed as on any worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path

from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.probe_report import last_report, snapshot_from_report
from gpulayerd.host.atomic import write_atomic
from gpulayerd.models import EnvironmentModel
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands, SlurmError

__all__ = ["PENDING_NOTE", "RETRY_S", "SrunProbe"]

log = logging.getLogger(__name__)

_PROBE_SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "probe.py"
RETRY_S = 300.0
"""How long a failed ``srun`` probe's answer is kept before the interpreter is probed again (seconds)."""
PENDING_NOTE = "being probed with srun on the cluster (no answer yet)"
"""The note of an interpreter whose first ``srun`` probe has not landed."""


class SrunProbe:
    """The environments of a Slurm worker, each probed in a short ``srun`` job, cached.

    Args:
        cfg: the ``[slurm]`` section (partition, interpreters' probe interval, timeout, env).
        commands: Slurm's command runner (its timeout bounds each probe).
        cache_file: where answers are kept across restarts (None: in memory only).
        spawn: runs a background coroutine (the daemon's, cancelled when it stops).
        apply: awaited with each landed snapshot (the machine's capabilities are rebuilt with it).
        clock: wall-clock seconds (answers' ages).
    """

    def __init__(self, cfg: SlurmConfig, commands: SlurmCommands, cache_file: Path | None,
                 spawn: Callable[[Coroutine[object, object, None], str], object],
                 apply: Callable[[EnvironmentSnapshot], Awaitable[None]],
                 clock: Callable[[], float] = time.time) -> None:
        self._cfg, self._commands, self._file = cfg, commands, cache_file
        self._spawn, self._apply, self._clock = spawn, apply, clock
        self._running: set[str] = set()
        self._source = _PROBE_SCRIPT.read_text(encoding="utf-8")
        self._cache: dict[str, dict[str, object]] = self._load()

    def argv(self, interpreter: str) -> list[str]:
        """The ``srun`` command line that probes ``interpreter`` (on the first configured partition, or
        Slurm's default partition when none is configured)."""
        part = ["--partition", self._cfg.partitions[0]] if self._cfg.partitions else []
        return ["srun", *part, "--nodes", "1", "--ntasks", "1", "--time", "1", "--quiet",
                "--job-name", "gpulayer-probe", interpreter, "-c", self._source, "--probe"]

    def probe(self, interpreter: str) -> EnvironmentSnapshot:
        """Probe ``interpreter`` in an ``srun`` job now (blocking, up to ``command_timeout_s``); never raises.

        Returns:
            Its snapshot; ``ok`` False with srun's words (or the probe's) in ``notes`` when it failed.
        """
        try:
            out = self._commands.run(self.argv(interpreter))
        except SlurmError as e:
            return EnvironmentSnapshot(interpreter=interpreter, ok=False, notes=(f"srun probe failed: {e}",))
        report = last_report(out.splitlines())
        if report is None:
            said = out.strip().splitlines()[-1][:300] if out.strip() else "no output"
            return EnvironmentSnapshot(interpreter=interpreter, ok=False,
                                       notes=(f"srun probe printed no report ({said})",))
        return snapshot_from_report(interpreter, report)

    async def answers(self, interpreters: Sequence[str]) -> list[EnvironmentSnapshot]:
        """One snapshot per interpreter: its kept answer while fresh, else the last one (or a not-ready one)
        while a background ``srun`` probe runs; the probe's answer lands through ``apply``."""
        out: list[EnvironmentSnapshot] = []
        now = self._clock()
        for interp in interpreters:
            entry = self._cache.get(self._key(interp))
            snap = _snapshot(entry)
            keep = self._cfg.probe_every_s if snap is not None and snap.ok else min(RETRY_S, self._cfg.probe_every_s)
            at = entry.get("at") if entry is not None else None
            if snap is None or not isinstance(at, (int, float)) or now - at >= keep:
                self._start(interp)
            out.append(snap or EnvironmentSnapshot(interpreter=interp, ok=False, notes=(PENDING_NOTE,)))
        return out

    def _start(self, interp: str) -> None:
        if interp not in self._running:
            self._running.add(interp)
            self._spawn(self._check(interp), f"srun probe {interp}")

    async def _check(self, interp: str) -> None:
        try:
            snap = await asyncio.to_thread(self.probe, interp)
        finally:
            self._running.discard(interp)
        if not snap.ok:
            log.warning("environment %s on the Slurm cluster: %s", interp, "; ".join(snap.notes))
        self._cache[self._key(interp)] = {"at": self._clock(), "interpreter": interp,
                                          "snapshot": EnvironmentModel.from_core(snap).model_dump(mode="json")}
        await asyncio.to_thread(self._save)
        await self._apply(snap)

    def _key(self, interp: str) -> str:
        """What an answer depends on: the interpreter, the partition, Slurm's env and the probe's source."""
        parts = [interp, self._cfg.partitions[:1], sorted(self._cfg.env.items()),
                 hashlib.sha256(self._source.encode()).hexdigest()]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]

    def _load(self) -> dict[str, dict[str, object]]:
        if self._file is None:
            return {}
        try:
            data = json.loads(self._file.read_bytes())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}

    def _save(self) -> None:
        if self._file is None:
            return
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._file, json.dumps(self._cache, sort_keys=True))
        except OSError as e:
            log.warning("cannot write the srun probe cache %s: %s", self._file, e)


def _snapshot(entry: dict[str, object] | None) -> EnvironmentSnapshot | None:
    """The snapshot a cache entry holds (None: no entry, or one that does not read)."""
    if entry is None:
        return None
    try:
        return EnvironmentModel.model_validate(entry.get("snapshot")).to_core()
    except ValueError:
        return None
