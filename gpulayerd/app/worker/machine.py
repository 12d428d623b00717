"""This machine as a worker: probing, capabilities, and the snapshot the matcher sees.

The snapshot is the probed capabilities with what is handed out now: device grants
(from the store), gang holds and running attempts (from the :class:`Ledger`), devices
locked by another gpulayerd on this machine, and processes on a GPU that are not ours
(fresh from ``nvidia-smi --query-compute-apps``).

Paths (job workdirs) are checked off the event loop, in a small thread pool, with a
time limit: a hung network mount makes a workdir "did not answer within N s", never
a frozen daemon. A workdir is checked as the job's user (:class:`PathChecker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from gpulayerd.app.common.clock import Clock
from gpulayerd.app.common.ledger import Ledger, RunEntry, RunKey, process_trees
from gpulayerd.app.common.signals import Signals
from gpulayerd.app.worker.accounts import Accounts, own_account
from gpulayerd.app.worker.envchecks import TorchChecks
from gpulayerd.app.worker.preflight_marks import PreflightMarks
from gpulayerd.config import DaemonConfig
from gpulayerd.core.types import (
    OUTSIDE_HOLDER,
    UNKNOWN_PROCESSES_IDLE_MAX_BYTES,
    Accelerator,
    DeviceKind,
    DeviceSnapshot,
    DeviceState,
    EnvironmentSnapshot,
    ProbeHealth,
    ProbeStatus,
    SupportMatrix,
    WorkerSnapshot,
)
from gpulayerd.core.visible import Visibility, apply_visibility
from gpulayerd.gpu.command import DEVNULL, Popen, TimeoutExpired, run_command
from gpulayerd.gpu.compose import build_capabilities
from gpulayerd.gpu.discovery import DiscoveryConfig, HostInventory, discover_host, driver_unsettled, with_last_known
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.nvidia.query import ComputeApps, NvidiaSmi, query_compute_apps
from gpulayerd.models import Capabilities, DeviceModel
from gpulayerd.runs.account import lookup_user
from gpulayerd.runs.devicelock import DeviceLocks
from gpulayerd.runs.layout import LAUNCH_FILE, read_json
from gpulayerd.runs.preflight import PreflightCheck
from gpulayerd.store import Store

__all__ = ["ANOTHER_DAEMON", "REPROBE_AFTER_S", "Machine", "PathChecker"]

ANOTHER_DAEMON = OUTSIDE_HOLDER

REPROBE_AFTER_S = 5.0
"""Before a grant (``snapshot(refresh_apps=True)``), hardware is probed again (in a thread) when
the last probe is older than this many seconds or failed: a GPU that vanished is not granted."""

log = logging.getLogger(__name__)


class PathChecker:
    """Whether a job's workdir can be entered, with a time limit, off the event loop.

    A check is keyed by (user, path). With a user and a daemon running as root, the
    directory is entered as that user in a forked helper (``/bin/sh -c 'cd -- DIR'`` with
    the user's groups, gid and uid): root cannot check for the user on NFS with root
    squash, and a directory the user cannot enter must not pass because root can. Without
    a user (or as root, or when the daemon is not root: it runs only its own jobs) the
    daemon checks itself (``os.path.isdir``).

    Each distinct (user, path) is checked in a thread of its own, so a path on a hung mount
    never delays the check of another. A check that does not answer within ``timeout_s``
    is reported as unanswered; it keeps running, and a later check of the same key joins
    it instead of starting another. At most ``max_pending`` checks run at once: past that a
    new key is answered "unanswered" at once (the hung ones are what fills it up).

    An ``"ok"`` is taken again without a check for :data:`OK_FRESH_S` seconds from the start of the
    check that gave it (a scheduling pass per freed slot would otherwise start a thread each time);
    any other answer is checked afresh each time. A directory removed within that time fails the
    job's start instead (the watchdog's ``chdir``), which says so.
    """

    OK_FRESH_S = 0.5
    """Seconds an ``"ok"`` answer is reused (from the start of its check)."""

    def __init__(self, clock: Clock, timeout_s: float, max_pending: int = 64) -> None:
        self._clock = clock
        self.timeout_s = timeout_s
        self._max_pending = max_pending
        self._pending: dict[tuple[str | None, str], tuple[asyncio.Future[str], float]] = {}
        self._ok: dict[tuple[str | None, str], float] = {}  # key -> when the check that said "ok" began
        self._closed = False

    async def check(self, path: str, user: str | None = None) -> str | None:
        """``"ok"`` (a directory ``user`` can enter), ``"missing"``, ``"denied"`` (it exists but
        ``user`` cannot enter it), or None if the file system did not answer in time.

        Args:
            path: the directory.
            user: the account the job runs as; None or "" checks as the daemon.
        """
        key = (user or None, path)
        now = self._clock.monotonic()
        ok_at = self._ok.get(key)
        if ok_at is not None and 0.0 <= now - ok_at < self.OK_FRESH_S:
            return "ok"
        pending = self._pending.get(key)
        if pending is None:
            if self._closed or len(self._pending) >= self._max_pending:
                return None
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[str] = loop.create_future()
            self._pending[key] = (fut, now)
            fut.add_done_callback(functools.partial(self._forget, key))
            threading.Thread(target=_check_dir, args=(loop, fut, path, key[0], self.timeout_s),
                             name="path-check", daemon=True).start()
        else:
            fut, since = pending
            if now - since >= self.timeout_s:
                return None  # already known not to answer: do not wait again
        try:
            answer = await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
        except asyncio.TimeoutError:
            return None
        if answer == "ok" and pending is None:
            if len(self._ok) >= 4096:  # (bounded: the oldest answers go first)
                self._ok.clear()
            self._ok[key] = now
        else:
            self._ok.pop(key, None)
        return None if answer == "unanswered" else answer

    async def is_dir(self, path: str, user: str | None = None) -> bool | None:
        """True if :meth:`check` says ``"ok"``, False for missing or denied, None unanswered."""
        answer = await self.check(path, user)
        return None if answer is None else answer == "ok"

    def _forget(self, key: tuple[str | None, str], fut: asyncio.Future[str]) -> None:
        if self._pending.get(key, (None, 0.0))[0] is fut:
            del self._pending[key]

    async def with_paths(self, worker: WorkerSnapshot,
                         checks: Iterable[tuple[str | None, str | None]]) -> WorkerSnapshot:
        """``worker`` with ``existing_paths``, ``denied_paths`` and ``unanswered_paths`` for ``checks``.

        Args:
            worker: the snapshot to complete.
            checks: (user, workdir) of each job to check; a None workdir is skipped, a
                None or "" user checks as the daemon.

        Returns:
            ``existing_paths``: paths some check could enter; ``denied_paths``: (user, path)
            pairs that exist but that user cannot enter; ``unanswered_paths``: paths a
            check of which did not answer in time.
        """
        wanted = sorted({(u or "", p) for u, p in checks if p})
        if not wanted:
            return worker
        answers = await asyncio.gather(*(self.check(p, u) for u, p in wanted))
        pairs = list(zip(wanted, answers, strict=True))
        return replace(worker, existing_paths=frozenset(p for (_, p), a in pairs if a == "ok"),
                       denied_paths=frozenset(k for k, a in pairs if a == "denied"),
                       unanswered_paths=frozenset(p for (_, p), a in pairs if a is None),
                       path_timeout_s=self.timeout_s)

    def close(self) -> None:
        """Stop taking checks (threads stuck on a hung mount are left to end on their own)."""
        self._closed = True


# As the job's user: 0 entered; 3 a directory it can see but not enter; 2 nothing it can see.
_ENTER_SCRIPT = 'cd -- "$1" 2>/dev/null && exit 0; [ -d "$1" ] && exit 3; exit 2'


def _check_dir(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[str], path: str, user: str | None,
               timeout_s: float) -> None:
    """In a thread: check ``path`` (as ``user`` where that needs a helper), hand the answer to ``fut``."""
    result = _enter_as(path, user, timeout_s) if user and user != "root" and os.geteuid() == 0 else None
    if result is None:
        result = "ok" if os.path.isdir(path) else "missing"

    def deliver() -> None:
        if not fut.done():
            fut.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(deliver)


def _enter_as(path: str, user: str, timeout_s: float) -> str | None:
    """Blocking: ``ok``, ``denied``, ``missing`` or ``unanswered`` for ``user`` entering ``path``, in a forked helper.

    None when there is no such account (the matcher rejects the job for that) or the helper
    cannot be started: the caller then checks as the daemon. A helper that does not answer
    within ``timeout_s`` is killed; if it cannot even be killed (a hung mount), this waits
    for it, like ``os.path.isdir`` would, and :class:`PathChecker` reports it unanswered.
    """
    try:
        account = lookup_user(user)
    except LookupError:
        return None
    try:
        proc = Popen(["/bin/sh", "-c", _ENTER_SCRIPT, "sh", path], cwd="/",
                                env={"PATH": "/usr/bin:/bin", "LANG": "C"}, stdin=DEVNULL,
                                stdout=DEVNULL, stderr=DEVNULL, user=account.uid,
                                group=account.gid, extra_groups=list(account.groups), close_fds=True)
    except OSError:
        log.warning("cannot start the workdir check of %s as %s", path, user, exc_info=True)
        return None
    try:
        code = proc.wait(timeout=timeout_s)
    except TimeoutExpired:
        proc.kill()
        proc.wait()
        return "unanswered"
    if code == 0:
        return "ok"
    if code == 3:
        return "denied"
    # The user sees nothing there: a directory root can see is one the user cannot reach.
    return "denied" if os.path.isdir(path) else "missing"


class Machine:
    """Probes this machine and answers "what is free here now"."""

    def __init__(self, *, config: DaemonConfig, node_id: str, store: Store, ledger: Ledger, locks: DeviceLocks,
                 prober: EnvironmentProber, discovery: DiscoveryConfig, nvidia: NvidiaSmi, support: SupportMatrix,
                 signals: Signals, clock: Clock) -> None:
        self._config = config
        self.node_id = node_id
        self._store = store
        self._ledger = ledger
        self._locks = locks
        self._prober = prober
        self._discovery = discovery
        self._nvidia = nvidia
        self._support = support
        self._signals = signals
        self._clock = clock
        self._caps: Capabilities | None = None
        self._core: tuple[Capabilities, WorkerSnapshot] | None = None  # _caps and its to_core(), kept
        self._digest: tuple[Capabilities, tuple[object, ...], str] | None = None  # caps_digest's last (inputs, it)
        self._ready = asyncio.Event()
        self._hw_at: float | None = None  # monotonic time of the last hardware probe; None: never probed
        # Devices this daemon's runs, holds or claims had when the last hardware probe read memory.used:
        # that reading is (partly) theirs, so it says nothing of processes this daemon cannot see.
        self._ours_at_probe: frozenset[str] = frozenset()
        self._last_good: dict[str, DeviceSnapshot] = {}  # bus id or uuid -> its last good reading
        # The GPUs this daemon may schedule: its own CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and
        # the admin's exclude_gpus (nvidia-smi lists every GPU whatever the variables say).
        self._visibility = Visibility.of(os.environ, config.exclude_gpus)
        if self._visibility.restricts:
            kept_out = [f"those {k}={os.environ.get(k, '')!r} does not name" for k in self._visibility.visible]
            kept_out += [f"those in exclude_gpus={config.exclude_gpus}"] if config.exclude_gpus else []
            log.info("GPUs kept out of scheduling: %s", "; ".join(kept_out))
        self._unmatched_told: set[str] = set()  # entries of those that name no device, logged once each
        self.inventory_source: Callable[[], HostInventory] | None = None  # a Slurm worker's (gpulayerd.slurm)
        self.shape_caps: Callable[[Capabilities], Capabilities] = lambda caps: caps  # (its kind, partitions)
        self._hw_failed = False
        self._hw_lock = asyncio.Lock()
        self._inventory: HostInventory | None = None  # the last hardware probe's, for rebuilding caps
        self._env_lock = asyncio.Lock()  # orders a probe pass's environments with a torch check landing
        self.torch_checks = TorchChecks(prober, signals, self._apply_environment)
        # The environments' answers: a Slurm worker's come from srun (None: torch_checks', looked up at each probe).
        self.env_answers: Callable[[Sequence[str]], Awaitable[list[EnvironmentSnapshot]]] | None = None
        self._envs: list[EnvironmentSnapshot] = []  # as probed (before the pre-flight marks)
        self.preflight_marks = PreflightMarks()
        self.paths = PathChecker(clock, config.workdir_timeout_s)
        # Whose jobs run here (DESIGN §9): a personal worker runs its own account's only.
        self.accounts = Accounts(clock, mode=config.mode, user=own_account() if config.mode == "personal" else "",
                                 allow_root_jobs=config.allow_root_jobs)

    def _visible(self, inventory: HostInventory) -> HostInventory:
        """``inventory`` with the GPUs this daemon may not schedule marked excluded, and a note for
        each entry that names no device (:func:`gpulayerd.core.visible.apply_visibility`)."""
        if not self._visibility.restricts:
            return inventory
        devices, notes = apply_visibility(inventory.devices, self._visibility)
        for note in notes:
            if note not in self._unmatched_told and len(self._unmatched_told) < 64:
                self._unmatched_told.add(note)
                log.warning("%s", note)  # a typo there leaves the GPU meant schedulable
        health = tuple(replace(h, message="; ".join(x for x in (h.message, *notes) if x))
                       if notes and h.source == "nvidia-smi" else h for h in inventory.health)
        return replace(inventory, devices=devices, health=health, notes=(*inventory.notes, *notes))

    async def wait_ready(self) -> None:
        """Wait for the first probe."""
        await self._ready.wait()

    async def probe_loop(self) -> None:
        """Probe hardware and environments now and every ``probe_interval_s``."""
        while True:
            await self.probe_once()
            await self._clock.sleep(self._config.probe_interval_s)

    async def _discover(self) -> HostInventory:
        """This machine's devices as the daemon may use them (in a thread), a lost GPU with its last
        good reading's facts (:func:`with_last_known`). Called with ``_hw_lock`` held."""
        source = self.inventory_source or functools.partial(discover_host, self._discovery, self._support,
                                                            nvidia=self._nvidia)
        inventory = self._visible(await asyncio.to_thread(source))
        return replace(inventory, devices=with_last_known(inventory.devices, self._last_good))

    async def probe_once(self) -> None:
        """Probe devices (in a thread) and every configured interpreter; publish a change if any."""
        started = self._clock.monotonic()
        async with self._hw_lock:
            ours = self._ledger.state.devices_in_use()
            inventory = await self._discover()
            self._ours_at_probe = ours
        self._hw_at, self._hw_failed = started, _hardware_failed(inventory.health)
        _log_state_changes(self._inventory, inventory)
        self._inventory = inventory
        # A torch answer taken under another driver state (before the driver was ready, another
        # driver version) is asked again; one taken while the driver is not ready is never kept on disk.
        self._prober.set_driver_state(inventory.driver_state, persist=not driver_unsettled(inventory.health))
        async with self._env_lock:
            # Metadata first (or the cached full answer): torch's import-based check runs in the
            # background and lands through _apply_environment (TorchChecks).
            answers = self.env_answers or self.torch_checks.answers
            self._envs = envs = list(await answers(self._config.interpreters))  # (a Slurm worker's: srun)
            caps = self._build(inventory, envs)
            changed = self._caps is None or _hardware_key(self._caps) != _hardware_key(caps)
            self._caps = caps
        self._ready.set()
        if changed:
            self._signals.devices_changed()
            self._signals.wake()

    def _build(self, inventory: HostInventory, envs: list[EnvironmentSnapshot]) -> Capabilities:
        """This machine's capabilities from a probe's ``inventory`` and ``envs``, the pre-flight marks applied."""
        marked = self.preflight_marks.apply(envs, inventory.driver_state)
        return self.shape_caps(build_capabilities(inventory, marked, self.node_id, self._clock.wall()))

    async def _apply_environment(self, env: EnvironmentSnapshot) -> None:
        """Take the full (torch-checked) snapshot of one interpreter, landed from the background:
        capabilities are rebuilt with it, and the scheduler and peers are told when they changed
        (a job waiting for the torch check is judged again)."""
        async with self._env_lock:
            if self._caps is None or self._inventory is None:
                return
            self._envs = envs = [env if e.interpreter == env.interpreter else e for e in self._envs]
            caps = self._build(self._inventory, envs)
            changed = _hardware_key(self._caps) != _hardware_key(caps)
            self._caps = caps
        if changed:
            self._signals.devices_changed()
            self._signals.wake()

    async def preflight_failed(self, run_dir: Path, text: str) -> None:
        """The pre-flight check of the attempt in ``run_dir`` failed (``text``: ``FRAMEWORK: error``): that
        framework is broken in the interpreter it ran (its ``launch.json``) until a probe shows that
        environment changed (:mod:`.preflight_marks`); the scheduler and peers are told."""
        launch = await asyncio.to_thread(read_json, run_dir / LAUNCH_FILE)
        check = launch.get("preflight") if isinstance(launch, dict) else None
        interpreter = check.get("python") if isinstance(check, dict) else None
        framework, _, line = text.partition(": ")
        if not isinstance(interpreter, str):
            return
        async with self._env_lock:
            if self._caps is None or self._inventory is None:
                return
            if not self.preflight_marks.mark(self._envs, interpreter, framework, line, self._inventory.driver_state):
                return
            self._caps = self._build(self._inventory, self._envs)
        self._signals.devices_changed()
        self._signals.wake()

    def runs(self) -> list[tuple[RunKey, RunEntry]]:
        """The attempts running on this machine (the ledger's): what holds its devices and CPU slots."""
        return self._ledger.runs()

    def preflight_recent(self, check: PreflightCheck, user: str) -> bool:
        """Whether ``check`` (import-only: a CPU job's) passed for ``user`` lately, nothing changed since."""
        key = (check.python, check.frameworks, user, check.drop_env)
        driver = self._inventory.driver_state if self._inventory is not None else ""
        return check.device == "none" and self.preflight_marks.passed_recently(self._envs, key, driver,
                                                                                self._clock.monotonic())

    def preflight_passed(self, check: PreflightCheck, user: str) -> None:
        """An attempt whose import-only ``check`` ran (for ``user``) ran its command: the check passed."""
        if check.device == "none" and self._inventory is not None:
            self.preflight_marks.record_pass(self._envs, (check.python, check.frameworks, user, check.drop_env),
                                             self._inventory.driver_state, self._clock.monotonic())

    def activation_of(self, interpreter: str) -> dict[str, str]:
        """The conda activation jobs run ``interpreter`` with (from the last probe); {} for others."""
        caps = self._caps
        if caps is None:
            return {}
        return next((dict(e.activation) for e in caps.environments if e.interpreter == interpreter), {})

    def reshape(self) -> None:
        """Apply :attr:`shape_caps` to the capabilities again (what it adds changed: a Slurm worker's
        refusals); the scheduler judges the queue again and peers fetch the new capabilities."""
        if self._caps is not None:
            self._caps = self.shape_caps(self._caps)
            self._signals.devices_changed()
            self._signals.wake()

    def use_capabilities(self, caps: Capabilities) -> None:
        """Take ``caps`` as this machine's probed capabilities (for a machine that is not probed,
        e.g. one made up by a test); :meth:`probe_loop` would replace them."""
        self._caps = caps
        self._ready.set()
        self._signals.devices_changed()
        self._signals.wake()

    async def snapshot(self, refresh_apps: bool,
                       workdirs: Iterable[tuple[str | None, str | None]] = ()) -> WorkerSnapshot:
        """This machine as the matcher sees it now (after the first probe).

        Args:
            refresh_apps: ask nvidia-smi for the processes on each GPU now.
            workdirs: (user, workdir) of each job to check (see :meth:`PathChecker.with_paths`);
                in system mode each user's account is looked up too (a missing one is in
                ``missing_accounts``, so the matcher rejects its jobs here).
        """
        workdirs = list(workdirs)
        if self.accounts.mode == "system":
            for user in sorted({u for u, _ in workdirs if u}):
                await self.accounts.exists(user)
        await self._ready.wait()
        reprobed = await self._refresh_hardware() if refresh_apps else False
        assert self._caps is not None
        if self._core is None or self._core[0] is not self._caps:  # _caps is replaced, never changed in place
            self._core = (self._caps, self._caps.to_core())
        worker = self._core[1]
        # A machine without devices (or whose devices list no process) skips the store read
        # and the process scan: a CPU job's start takes neither.
        grants = {g.device_uuid: g.job_id for g in await self._store.runs.grants()} if worker.devices else {}
        held = self._ledger.held_devices()
        ours = (await asyncio.to_thread(process_trees, self._ledger.watchdog_pids())
                if any(d.foreign_pids for d in worker.devices) else set())
        apps = await self._compute_apps(worker) if refresh_apps and not reprobed else None
        unclaimed = [d.uuid for d in worker.devices
                     if d.uuid and d.execution_supported and d.uuid not in grants and d.uuid not in held]
        elsewhere = await self._locks.async_locked_elsewhere(unclaimed) if unclaimed else set()
        devices = []
        for dev in worker.devices:
            d = dev
            if apps is not None and d.accelerator is Accelerator.CUDA and d.kind is DeviceKind.GPU:
                d = with_apps(d, apps)
            granted_to = grants.get(d.uuid or "") or held.get(d.uuid or "")
            if granted_to is None and d.uuid in elsewhere:
                granted_to = ANOTHER_DAEMON
            if granted_to is None and d.uuid in self._ours_at_probe:
                d = replace(d, memory_used_bytes=None)  # our run's use, read before it ended: not a stranger's
            foreign = tuple(p for p in d.foreign_pids if p not in ours)
            devices.append(replace(d, granted_to=granted_to, foreign_pids=foreign))
        total = self._config.effective_cpu_slots
        free = max(0, total - self._ledger.cpu_slots_used())
        snap = replace(worker, devices=tuple(devices), cpu_slots_free=free, cpu_slots_total=total)
        # Fair share: what each user holds here now, against this worker's max_gpus_per_user.
        snap = replace(snap, max_gpus_per_user=self._config.max_gpus_per_user,
                       gpus_held_by_user={u: g for u, (g, _) in self._ledger.holdings().items() if g})
        # Whose jobs run here: the matcher's account rules (gpulayerd.core.users).
        snap = replace(snap, mode=self.accounts.mode, user=self.accounts.user,
                       allow_root_jobs=self.accounts.allow_root_jobs, missing_accounts=self.accounts.missing())
        return await self.paths.with_paths(snap, workdirs)

    async def capabilities(self) -> Capabilities:
        """This machine's capabilities with the current grant state of each device."""
        worker = await self.snapshot(refresh_apps=False)
        assert self._caps is not None
        caps = self._caps.model_copy()
        caps.devices = [DeviceModel.from_core(d) for d in worker.devices]
        caps.cpu_slots_total = worker.cpu_slots_total
        caps.cpu_slots_free = worker.cpu_slots_free
        caps.mode = "system" if worker.mode == "system" else "personal"
        caps.user = worker.user
        caps.allow_root_jobs = worker.allow_root_jobs
        caps.missing_accounts = sorted(worker.missing_accounts)
        caps.max_gpus_per_user = worker.max_gpus_per_user
        return caps

    async def _compute_apps(self, worker: WorkerSnapshot) -> ComputeApps | None:
        """Fresh ``--query-compute-apps`` (processes come and go faster than the probe interval)."""
        if not any(d.accelerator is Accelerator.CUDA for d in worker.devices):
            return None
        health = next((h for h in worker.health if h.source == "nvidia-smi"), None)
        if health is None or health.status not in (ProbeStatus.OK, ProbeStatus.DEGRADED) or health.path is None:
            return None
        return await asyncio.to_thread(query_compute_apps, health.path, run_command,
                                       self._config.nvidia_smi_timeout_s)

    async def _refresh_hardware(self) -> bool:
        """Probe hardware again (off the event loop) if the last probe is older than
        :data:`REPROBE_AFTER_S` or failed; True if it did. Environments are kept as they are."""
        if self._hw_at is None:  # capabilities given by use_capabilities(): nothing to probe
            return False
        async with self._hw_lock:
            started = self._clock.monotonic()
            if self._hw_at is not None and started - self._hw_at < REPROBE_AFTER_S and not self._hw_failed:
                return False
            ours = self._ledger.state.devices_in_use()
            inventory = await self._discover()
            self._hw_at, self._hw_failed = started, _hardware_failed(inventory.health)
            _log_state_changes(self._inventory, inventory)
            self._inventory, self._ours_at_probe = inventory, ours
        assert self._caps is not None
        fresh = build_capabilities(inventory, [], self.node_id, self._clock.wall())
        caps = self.shape_caps(self._caps.model_copy(update={"devices": fresh.devices, "health": fresh.health,
                                                             "taken_at": fresh.taken_at}))
        changed = _hardware_key(self._caps) != _hardware_key(caps)
        self._caps = caps
        if changed:
            self._signals.devices_changed()
        return True

    def gpu_counts(self) -> tuple[int | None, int | None]:
        """(schedulable GPUs, free ones) for the mDNS TXT record; (None, None) before the first probe.

        Free GPUs, not GPU jobs: every GPU that this daemon's starting or running attempts and gang holds
        take (a 4-GPU job takes 4) is not free. A hint for peers: the matcher decides on the full snapshot.
        """
        if self._caps is None:
            return None, None
        devs = [d for d in self._caps.devices if d.execution_supported and d.state is DeviceState.OK
                and not (d.kind is DeviceKind.GPU and d.mig_enabled)]  # a MIG parent: its instances count
        if not devs:
            return 0, 0
        ours = sum(g for g, _ in self._ledger.holdings().values())
        return len(devs), max(0, len(devs) - ours)

    def caps_digest(self) -> str:
        """Changes whenever what peers see of us (devices, grants, CPU slots, missing accounts) changes: at
        every ``devices_changed()`` too, which follows each grant's store write (a run's end writes it after
        the ledger let the run go: a peer that fetched in between kept the stale grant)."""
        if self._caps is None:
            return ""
        inputs = (self._ledger.keys(), self.accounts.mode, self.accounts.user, tuple(sorted(self.accounts.missing())),
                  self._signals.devices_epoch)
        kept = self._digest
        if kept is not None and kept[0] is self._caps and kept[1] == inputs:
            return kept[2]  # every heartbeat and reply asks: the same answer until one input changes
        digest = hashlib.sha256(repr((_hardware_key(self._caps), *inputs)).encode()).hexdigest()[:16]
        self._digest = (self._caps, inputs, digest)
        return digest

    def close(self) -> None:
        """Release the path-check threads."""
        self.paths.close()


def with_apps(d: DeviceSnapshot, apps: ComputeApps) -> DeviceSnapshot:
    """Whole GPU ``d`` with the processes of a fresh ``--query-compute-apps``: unknown (never free
    by default) when the query failed and printed no row for it."""
    if apps.pids_by_uuid is not None:
        return replace(d, foreign_pids=apps.pids_by_uuid.get(d.uuid or "", ()), processes_known=True)
    rows = apps.valid_rows.get(d.uuid or "")
    return replace(d, foreign_pids=rows, processes_known=True) if rows else replace(d, processes_known=False)


def _log_state_changes(before: HostInventory | None, after: HostInventory) -> None:
    """Log each device that turned lost or unusable (WARNING, with the tool's words) or came back (INFO),
    as an admin reads a node's drain and resume in Slurm's log."""
    was = {(d.uuid or str(d.index)): d for d in before.devices} if before is not None else {}
    for d in after.devices:
        old = was.get(d.uuid or str(d.index))
        bad = d.state in (DeviceState.LOST, DeviceState.UNUSABLE)
        if (old is None and not bad) or (old is not None and old.state is d.state):
            continue
        name = f"{d.accelerator.value} device {d.index} ({d.name or d.uuid or '?'})"
        if bad:
            log.warning("%s is %s: %s; it is not granted until it reads fine again", name, d.state.value,
                        d.state_reason or "no reason given")
        elif old is not None and old.state in (DeviceState.LOST, DeviceState.UNUSABLE):
            log.info("%s is %s again", name, d.state.value)


def _hardware_failed(health: Iterable[ProbeHealth]) -> bool:
    return any(h.status not in (ProbeStatus.OK, ProbeStatus.NOT_FOUND, ProbeStatus.NO_DEVICES) for h in health)


def _hardware_key(caps: Capabilities) -> tuple[object, ...]:
    return (
        tuple((d.uuid, d.index, d.memory_total_bytes, d.compute_capability, d.execution_supported,
               tuple(d.foreign_pids), d.state, d.mig_enabled, d.driver_version, d.compute_mode,
               (d.memory_used_bytes or 0) > UNKNOWN_PROCESSES_IDLE_MAX_BYTES) for d in caps.devices),
        tuple((h.source, h.status) for h in caps.health),
        # Every environment fact the matcher reads: a torch check landing or a `pip install` wakes it.
        tuple((e.interpreter, e.ok, e.python_version,
               tuple((k, f.version, f.valid) for k, f in sorted(e.frameworks.items())),
               tuple(sorted(e.cuda_builds.items())), e.torch_pending, e.torch_cuda, e.torch_mps,
               e.distributed_backends, e.translated, tuple(sorted(e.import_errors.items())))
              for e in caps.environments),
    )
