"""This machine as a worker backed by a Slurm cluster (``[slurm]``): its inventory, kind and refusals.

:func:`attach_slurm` turns the :class:`~gpulayerd.app.worker.machine.Machine` of a login node's gpulayerd
into the cluster's worker: its devices are the GPUs of the allowed partitions (read by
:class:`~gpulayerd.slurm.capacity.SlurmCapacity` at every probe), its capabilities say ``kind = "slurm"``
with the partitions and GRES, its environments are probed on the cluster (:class:`SrunProbe`, unless
``probe_on_login``), and its offers refuse what this worker does not run yet (multi-node jobs,
array tasks). The attempts it claims run as :mod:`gpulayerd.slurm.proxy` under their watchdogs
(:class:`~gpulayerd.app.worker.starter.Starter`); :class:`SlurmGate` holds each one's ``started`` report
until Slurm runs it (WHERE: Slurm's node), the claimed job's reason following Slurm's meanwhile
(``SlurmPending: Priority (partition gpu, position 2)``), read from ``squeue`` (:class:`SlurmQueue`).

An attempt ``sbatch`` refused (no account or association, a partition's AllowGroups: the proxy's exit 126
and ``gpulayer: NotAllowed: <Slurm's words>``) ends "never started" (lost, no retry used, Slurm's words its
reason) and :class:`SlurmRefusals` keeps that user's jobs off this worker for :data:`REFUSAL_KEEP_S`
(offers refused, and the capabilities say so: owners' matchers give ``NotAllowed: Slurm on login1
refused alice's job: sbatch: error: ...``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pwd
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from gpulayerd.app.common.ledger import Ledger, RunKey
from gpulayerd.app.worker.machine import Machine
from gpulayerd.app.worker.worker import WorkerService
from gpulayerd.core.job_facts import job_user
from gpulayerd.models import Capabilities
from gpulayerd.runs.launchfile import LaunchFile
from gpulayerd.runs.layout import LAUNCH_FILE, STDERR_LOG
from gpulayerd.runs.runner import RunHandle, Runner
from gpulayerd.runs.status import RunStatus
from gpulayerd.slurm.batch import refusal
from gpulayerd.slurm.capacity import SlurmCapacity
from gpulayerd.slurm.proxy import REFUSED, TIMED_OUT
from gpulayerd.slurm.queue import SlurmQueue
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands
from gpulayerd.slurm.srunprobe import SrunProbe

__all__ = ["REFUSAL_KEEP_S", "SlurmGate", "SlurmRefusals", "attach_slurm", "refusal_of", "spec_refusal"]

REFUSAL_KEEP_S = 600.0
"""How long a user whose job sbatch refused is kept off this worker (seconds)."""


def spec_refusal(spec: Mapping[str, object]) -> str | None:
    """Why an offered spec (JSON) does not run on a Slurm worker (multi-node, an array task), or None."""
    dist = spec.get("distributed")
    nnodes = dist.get("nnodes", 1) if isinstance(dist, Mapping) else 1
    return refusal(nnodes if isinstance(nnodes, int) else 1, spec.get("array_task") is not None)


def refusal_of(status: RunStatus, run_dir: Path) -> tuple[str, str] | None:
    """(the job's user, Slurm's words) when ``sbatch`` refused the attempt of ``run_dir`` (the proxy's exit 126
    and last stderr line), else None. The user comes from the attempt's ``launch.json`` (the daemon's own
    account in personal mode), never from the job's output (blocking: run in a thread)."""
    if status.reason != "exited" or status.exit_code != 126:
        return None
    line, said = _last_stderr_line(run_dir), f"gpulayer: {REFUSED}"
    if not line.startswith(said):
        return None
    try:
        launch = LaunchFile.load(run_dir / LAUNCH_FILE)
    except (OSError, ValueError):
        return None
    user = launch.user.name if launch.user is not None else pwd.getpwuid(os.getuid()).pw_name
    return user, line[len(said):].strip()[:500] or "sbatch refused the job"


def _uid_of(run_dir: Path) -> int | None:
    """The user id the attempt of ``run_dir`` runs as, from its ``launch.json`` (the daemon's own in personal
    mode); None when it cannot be read (blocking)."""
    try:
        launch = LaunchFile.load(run_dir / LAUNCH_FILE)
    except (OSError, ValueError):
        return None
    return launch.user.uid if launch.user is not None else os.getuid()


def _last_stderr_line(run_dir: Path) -> str:
    """The last non-empty line of the attempt's stderr log ("" when none; blocking)."""
    try:
        with open(run_dir / STDERR_LOG, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def timed_out(status: RunStatus, run_dir: Path) -> RunStatus | None:
    """``status`` as a ``timeout`` when the proxy said the job's time limit ended it (its exit 124 and last
    stderr line ``gpulayer: timed out: ...``: Slurm's TIMEOUT, or death by the limit's warning signal), else
    None (blocking: run in a thread). Slurm holds the limit: the watchdog has none to say so itself."""
    if status.reason != "exited" or status.exit_code != 124:
        return None
    line = _last_stderr_line(run_dir)
    said = f"gpulayer: {TIMED_OUT}"
    if not line.startswith(said):
        return None
    return dataclasses.replace(status, reason="timeout", detail=line[len(said):].strip()[:300])


class SlurmRefusals:
    """The users whose jobs ``sbatch`` refused lately, with Slurm's words, each kept ``keep_s``."""

    def __init__(self, keep_s: float = REFUSAL_KEEP_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep_s, self._clock = keep_s, clock
        self._until: dict[str, tuple[str, float]] = {}

    def remember(self, user: str, words: str) -> None:
        """Slurm refused a job of ``user`` now."""
        self._until[user] = (words, self._clock() + self._keep_s)
        while len(self._until) > 256:
            del self._until[next(iter(self._until))]

    def now(self) -> dict[str, str]:
        """user -> Slurm's words, for the refusals still kept."""
        t = self._clock()
        for user in [u for u, (_, until) in self._until.items() if until <= t]:
            del self._until[user]
        return {u: w for u, (w, _) in self._until.items()}


class SlurmGate:
    """Holds a started attempt's ``started`` report until Slurm runs its job (or the attempt ended).

    Args:
        queue: the shared ``squeue`` reader.
        report: ``WorkerService.report`` (a ``renew`` carrying the pending reason).
        poll: the attempt's watchdog's status (blocking: run in a thread).
        poll_s: how often Slurm is asked.
        lease_of: an attempt's lease (seconds), None when it is not running here.
    """

    def __init__(self, queue: SlurmQueue, report: Callable[..., Awaitable[object]],
                 poll: Callable[[RunHandle], RunStatus], poll_s: float,
                 lease_of: Callable[[RunKey], float | None]) -> None:
        self.queue = queue
        self._lease_of = lease_of
        self._report = report
        self._poll = poll
        self._poll_s = poll_s

    async def until_running(self, owner: str, key: RunKey, handle: RunHandle) -> str:
        """Wait until Slurm runs the attempt's job; its node list ("" when the attempt ended first). While
        it is pending, each new reason goes to the owner with a renewal (the claimed job's reason).

        Raises:
            asyncio.CancelledError: sbatch refused it: it never started (no ``started`` report; its end
                says so, :func:`attach_slurm`).
        """
        said, uid = "", await asyncio.to_thread(_uid_of, handle.run_dir)
        while (status := await asyncio.to_thread(self._poll, handle)).running:
            await self.queue.refresh()
            job = self.queue.find(*key, uid) if uid is not None else None
            if job is not None and job.state != "PENDING":
                return job.nodes if job.nodes and job.state in ("RUNNING", "COMPLETING", "CONFIGURING") else ""
            reason = self.queue.reason(job) if job is not None else ""
            if reason and reason != said:
                said = reason
                await self._report(owner, key, "renew", None, reason)
            await asyncio.sleep(self._poll_s)
        if await asyncio.to_thread(refusal_of, status, handle.run_dir) is not None:
            raise asyncio.CancelledError  # (the "started" report is not sent: the owner believes "never started")
        return ""

    def renewable(self, key: RunKey) -> bool:
        """Whether the attempt's lease is renewed now: ``squeue`` answered within the lease (slurmctld
        unreachable longer: the lease runs out and the attempt is lost, as any worker's that stops renewing)."""
        self.queue.poke()
        lease_s = self._lease_of(key)
        return lease_s is None or self.queue.answered_within(lease_s)


def attach_slurm(machine: Machine, cfg: SlurmConfig | None, worker: WorkerService | None = None,
                 runner: Runner | None = None, ledger: Ledger | None = None,
                 cache_dir: Path | None = None) -> SlurmCapacity | None:
    """Make ``machine`` the worker of the Slurm cluster ``cfg`` names (``worker``'s started attempts wait
    for Slurm to run them; its interpreters are probed with ``srun`` unless ``probe_on_login``, their answers
    kept in ``cache_dir``); the capacity reader it uses (None: ``cfg`` is None, nothing changes)."""
    if cfg is None:
        return None
    commands = SlurmCommands(cfg.command_timeout_s, cfg.env)
    capacity = SlurmCapacity(cfg, commands, socket.gethostname())
    if not cfg.probe_on_login:
        machine.env_answers = SrunProbe(cfg, commands, cache_dir / "slurm-environments.json" if cache_dir else None,
                                        machine._signals.spawn, machine._apply_environment).answers
    gate: SlurmGate | None = None
    refusals = SlurmRefusals()
    if worker is not None and runner is not None and ledger is not None:
        def lease_of(key: RunKey) -> float | None:
            run = ledger.state.runs.get(key)
            return run.lease_s if run is not None else None

        gate = SlurmGate(SlurmQueue(commands, cfg.poll_interval_s, on_pending=machine.reshape), worker.report,
                         runner.poll, cfg.poll_interval_s, lease_of)
        worker.start_gate, worker.renewable = gate.until_running, gate.renewable
        finished = worker.finished

        async def refused_or_finished(key: RunKey, status: RunStatus, owner: str = "") -> None:
            """An attempt sbatch refused ends never started (Slurm's words its reason); any other as usual."""
            entry = ledger.get(key)
            got = await asyncio.to_thread(refusal_of, status, entry.handle.run_dir) if entry is not None else None
            if entry is None or got is None:
                limited = await asyncio.to_thread(timed_out, status, entry.handle.run_dir) if entry else None
                return await finished(key, limited or status, owner)
            refusals.remember(*got)
            machine.reshape()  # its capabilities say so now: this node's queue and its peers judge again
            ledger.ended(key)
            await worker.never_started(key, entry.owner, f"{REFUSED}{got[1]}")
            worker._watchers.pop(key, None)  # (as finished does: this attempt is no longer watched)

        worker.finished = refused_or_finished  # type: ignore[method-assign]

    def refuse(spec: Mapping[str, object]) -> str | None:
        """What the worker does not run (:func:`spec_refusal`), and nothing while Slurm does not answer."""
        if gate is not None:
            gate.queue.poke()
        down = capacity.error or (gate.queue.error if gate is not None else "")
        user = job_user(spec.get("user") if isinstance(spec.get("user"), str) else None, None)  # type: ignore[arg-type]
        words = refusals.now().get(user) if user else None
        return (spec_refusal(spec) or (f"SlurmDown: Slurm does not answer: {down}" if down else None)
                or (f"{REFUSED}Slurm refused {user}'s job lately: {words}" if words else None))

    def shape(caps: Capabilities) -> Capabilities:
        return caps.model_copy(update={"kind": "slurm", "slurm_partitions": list(capacity.partitions),
                                       "slurm_gres": list(capacity.gres), "slurm_refused": refusals.now(),
                                       "slurm_pending": list(gate.queue.pending) if gate is not None else [],
                                       "slurm_overflow_after_s": cfg.overflow_after_s})

    machine.inventory_source = capacity.inventory
    machine.shape_caps = shape
    machine.accounts.refuse_spec = refuse
    return capacity
