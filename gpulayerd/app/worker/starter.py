"""The one routine that starts an attempt on this machine: account, command line, environment, watchdog.

Every start (a local job, a peer's job, one member of a gang) comes through
:meth:`Starter.start`, so that what a job sees (its account, its argv, its environment,
its run directory ``runs/<job>/<attempt>/``, its lease deadline) never differs by path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import cpu_slots_of
from gpulayerd.app.worker.ship_client import ShipClient, TransferFailed
from gpulayerd.config import DaemonConfig
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec
from gpulayerd.runs import layout
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.launch import build_argv, build_env, build_gang_argv, resolve_job_user
from gpulayerd.runs.preflight import PreflightCheck
from gpulayerd.runs.runner import RunHandle, Runner
from gpulayerd.slurm.submit import proxy_argv

__all__ = ["GangRank", "NotRecorded", "Starter", "device_grants", "preflight_check"]


class NotRecorded(Exception):
    """The attempt's record (:meth:`Starter.start` ``recorded``) answered False: nothing was started."""


@dataclass(frozen=True)
class _Plan:
    """What an attempt's watchdog is started with (:meth:`Starter._plan`)."""

    user: JobUser | None
    argv: list[str]
    env: dict[str, str]
    limit: tuple[float, str, float] | None
    check: PreflightCheck | None


def device_grants(placement: Placement) -> list[tuple[str, int, str]]:
    """(device uuid, index, accelerator kind) of each device ``placement`` uses (the store's grant rows)."""
    return [(u, i, placement.accelerator.value)
            for u, i in zip(placement.device_uuids, placement.device_indices, strict=True) if u]


@dataclass(frozen=True)
class GangRank:
    """This machine's part of a multi-host job: ``node_rank`` of ``nnodes``, the rendezvous, the LAN interface."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    interface: str


class Starter:
    """Starts attempts under their per-job watchdogs, each as the account of its user.

    Which account a job runs as (:func:`gpulayerd.runs.launch.resolve_job_user`):

    - ``spec.user`` unset (a job from before users, a test): as the daemon's account, with
      the daemon's environment as the base (as before users).
    - the daemon runs as root in system mode: as ``spec.user`` (supplementary groups, gid
      and uid set by the watchdog before ``exec``); a job of root only with
      ``allow_root_jobs``.
    - otherwise (personal mode, or a daemon that is not root): the daemon runs only its own
      user's jobs; ``spec.user`` must be that user (in personal mode as root: ``root``).

    A job with a user gets a clean environment: the spec's ``env``, the account's HOME,
    USER, LOGNAME and SHELL, the locale, the submitter's PATH (``spec.path``, captured by
    the CLI at submit) and gpulayer's variables; never the daemon's own environment
    (:func:`gpulayerd.runs.launch.build_env`).
    """

    def __init__(self, config: DaemonConfig, runner: Runner, clock: Clock,
                 activation_of: Callable[[str], Mapping[str, str]] | None = None) -> None:
        self._config = config
        self._runner = runner
        self._clock = clock
        # interpreter -> its conda activation (Machine.activation_of); set once the machine exists.
        self.activation_of = activation_of
        # Whether an import-only pre-flight check passed lately for that user (Machine.preflight_recent).
        self.preflight_recent: Callable[[PreflightCheck, str], bool] | None = None
        # (job, attempt) -> (the import-only check it runs, its user): what its end tells Machine.preflight_passed.
        self.import_checks: dict[tuple[str, int], tuple[PreflightCheck, str]] = {}
        self.shipping: ShipClient | None = None
        """Fetches and unpacks shipped jobs (set by the composition root; None: shipped jobs fail to start)."""

    def run_dir(self, job_id: str, attempt: int) -> Path:
        """Where an attempt's logs and watchdog state live: ``<state>/runs/<job>/<attempt>``.

        Raises:
            ValueError: ``job_id`` is not a plain name (see :func:`gpulayerd.runs.layout.run_dir`).
        """
        return layout.run_dir(self._config.runs_dir, job_id, attempt)

    def log_path(self, job_id: str, attempt: int, stream: str) -> Path:
        """An attempt's ``stdout`` or ``stderr`` log (see :func:`gpulayerd.runs.layout.log_path`)."""
        return layout.log_path(self._config.runs_dir, job_id, attempt, stream)

    async def start(self, job_id: str, attempt: int, spec: JobSpec, placement: Placement, lease_s: float,
                    lock_fds: list[int], gang: GangRank | None = None, owner: str = "",
                    renew: Callable[[], Awaitable[bool]] | None = None,
                    recorded: Awaitable[bool] | None = None) -> RunHandle:
        """Start the attempt; return once its processes run (the watchdog start runs in a thread).

        ``recorded``: the attempt's record (the worker's run row), written meanwhile: the watchdog's plan
        (account, argv, environment) is made while it commits, and nothing is started unless it answers True.

        A shipped job (``spec.ship``) is first fetched from ``owner`` and unpacked into its per-attempt
        tree (:class:`~gpulayerd.app.worker.ship_client.ShipClient`), which is then its workdir.

        Args:
            lease_s: the watchdog stops the job this many seconds from now unless a renewal
                moves its deadline.
            lock_fds: descriptors holding this machine's device locks (the watchdog inherits them).
            gang: this machine's rank of a multi-host job, or None.
            renew: renews the lease at the owner while a shipped job's transfer lasts (False: stale).

        Raises:
            NotRecorded: ``recorded`` answered False (what it raised is raised as it is).
            TransferFailed: a shipped job's snapshot could not be fetched or unpacked (``Transfer: ...``;
                nothing started, no tree left).
            RunnerError: the job's user cannot run here (no account; root where root jobs are
                not allowed; another user than the daemon's where it runs only its own), or
                the watchdog or the job could not be started.
        """
        if recorded is not None and spec.ship is None:
            return await self._start_while_recorded(job_id, attempt, spec, placement, lease_s, lock_fds, gang,
                                                    recorded)
        if recorded is not None and not await recorded:
            raise NotRecorded(f"job {job_id} attempt {attempt}")
        if spec.ship is not None:
            if self.shipping is None or gang is not None or not owner:
                raise TransferFailed("Transfer: this worker does not fetch shipped jobs of this kind")
            tree = await self.shipping.prepare(owner, job_id, attempt, spec, renew, lease_s)
            spec = spec.model_copy(update={"workdir": tree})
        deadline = self._clock.monotonic() + lease_s
        try:
            return await asyncio.to_thread(self._start, job_id, attempt, spec, placement, deadline, lock_fds, gang,
                                           lease_s)
        except BaseException:
            if spec.ship is not None and self.shipping is not None:  # its tree goes with the failed start
                await self.shipping.send_outputs(owner, job_id, attempt, spec.model_copy(
                    update={"ship": spec.ship.model_copy(update={"outputs": []})}))
            raise

    async def _start_while_recorded(self, job_id: str, attempt: int, spec: JobSpec, placement: Placement,
                                    lease_s: float, lock_fds: list[int], gang: GangRank | None,
                                    recorded: Awaitable[bool]) -> RunHandle:
        """:meth:`start`, its plan (account, argv, environment: :meth:`_plan`) made in a thread while
        ``recorded`` commits; the watchdog is started only once it answered True."""
        planning = asyncio.ensure_future(asyncio.to_thread(self._plan, job_id, attempt, spec, placement, gang))
        ok = False
        try:
            ok = await recorded
        finally:
            if not ok:  # (the plan is not wanted: its thread is waited for, what it raised dropped)
                with contextlib.suppress(Exception):
                    await planning
        if not ok:
            raise NotRecorded(f"job {job_id} attempt {attempt}")
        plan = await planning
        deadline = self._clock.monotonic() + lease_s
        return await asyncio.to_thread(self._launch, job_id, attempt, spec, deadline, lock_fds, lease_s, plan)

    def _start(self, job_id: str, attempt: int, spec: JobSpec, placement: Placement, deadline: float,
               lock_fds: list[int], gang: GangRank | None, lease_s: float | None = None) -> RunHandle:
        """:meth:`start` in a worker thread (the user database and the watchdog's start block)."""
        return self._launch(job_id, attempt, spec, deadline, lock_fds, lease_s,
                            self._plan(job_id, attempt, spec, placement, gang))

    def _plan(self, job_id: str, attempt: int, spec: JobSpec, placement: Placement,
              gang: GangRank | None) -> _Plan:
        """What the attempt's watchdog is started with (in a worker thread: the user database blocks).

        Raises:
            RunnerError: the job's user cannot run here (:func:`resolve_job_user`).
        """
        user = resolve_job_user(spec.user, self._config.mode, self._config.allow_root_jobs)
        run_dir = self.run_dir(job_id, attempt)
        # torchrun's per-rank logs go under the run directory, which only the daemon's account
        # can enter: a job of another account keeps its ranks' output on its own streams.
        log_dir = str(run_dir / "torchrun") if _same_account(user) else None
        if gang is None:
            nproc = spec.distributed.nproc_per_node if spec.distributed is not None else None
            argv = build_argv(spec, placement.environment, nproc, rdzv_timeout_s=self._config.rdzv_timeout_s,
                              log_dir=log_dir)
        else:
            argv = build_gang_argv(spec, placement.environment, nnodes=gang.nnodes, node_rank=gang.node_rank,
                                   master_addr=gang.master_addr, master_port=gang.master_port,
                                   log_dir=log_dir)
        activation = self.activation_of(placement.environment) if self.activation_of is not None else None
        env = build_env(os.environ, spec, placement, job_id, attempt, self._config.dist_timeout_s, user, activation)
        if gang is not None:
            env["GLOO_SOCKET_IFNAME"] = gang.interface
            env["NCCL_SOCKET_IFNAME"] = gang.interface
        warning = spec.policy.warning()  # the time limit, held by the watchdog itself
        limit = None if warning is None or spec.policy.time_limit is None else (spec.policy.time_limit, *warning)
        slurm = self._config.slurm
        if slurm is not None:  # a Slurm worker: the watchdog runs the proxy that submits and follows the job
            argv = proxy_argv(slurm, sys.executable, job_id, attempt, argv, env, spec.workdir or "",
                              [u for u in placement.device_uuids if u], cpu_slots_of(spec), spec.policy.time_limit,
                              warning)
            limit = None  # Slurm holds the limit and its warning (--time, --signal); the watchdog holds the lease
        check = None if gang is not None or slurm is not None else preflight_check(
            spec, placement, self._config.preflight_timeout_s)
        name = user.name if user is not None else ""
        if check is not None and self.preflight_recent is not None and self.preflight_recent(check, name):
            check = None  # the same import-only check passed lately, nothing changed since
        return _Plan(user, argv, env, limit, check)

    def _launch(self, job_id: str, attempt: int, spec: JobSpec, deadline: float, lock_fds: list[int],
                lease_s: float | None, plan: _Plan) -> RunHandle:
        """Start the watchdog as ``plan`` says (in a worker thread: it blocks until the job runs)."""
        name = plan.user.name if plan.user is not None else ""
        if plan.check is not None and plan.check.device == "none":
            self.import_checks[(job_id, attempt)] = (plan.check, name)
        try:
            return self._runner.start(job_id, attempt, plan.argv, plan.env, spec.workdir or "/", deadline, lock_fds,
                                      plan.user, renew_s=lease_s, time_limit=plan.limit, preflight=plan.check)
        except BaseException:
            self.import_checks.pop((job_id, attempt), None)  # (no end will come through WorkerService.finished)
            raise

    def transfer_note(self, key: tuple[str, int]) -> str:
        """What the transfer of shipped attempt ``key`` moved (``Transfer: ...``), "" for another attempt."""
        return self.shipping.notes.get(key, "") if self.shipping is not None else ""

    async def after_run(self, key: tuple[str, int]) -> None:
        """When attempt ``key`` has ended: a shipped one's outputs go back to its owner, its tree is kept
        ``ship_keep_s`` (``gpulayer fetch``)."""
        shipped = self.shipping.shipped.get(key) if self.shipping is not None else None
        if shipped is not None and self.shipping is not None:
            await self.shipping.send_outputs(shipped[0], key[0], key[1], shipped[1], keep=True)


def preflight_check(spec: JobSpec, placement: Placement, timeout_s: float) -> PreflightCheck | None:
    """The pre-flight check of ``spec``'s attempt on ``placement`` (its interpreter, the frameworks the job
    names, the granted device's kind), or None: the job names no framework, or ``--no-preflight``."""
    names = tuple(sorted(spec.requirements.frameworks))
    if not names or not spec.policy.preflight or not placement.environment.startswith("/"):
        return None
    device = placement.accelerator.value if placement.accelerator.value in ("cuda", "mps") else "none"
    return PreflightCheck(placement.environment, names, device, timeout_s, tuple(sorted(spec.env)))


def _same_account(user: JobUser | None) -> bool:
    """True if a job of ``user`` runs as the daemon's own account."""
    return user is None or user.uid == os.geteuid()
