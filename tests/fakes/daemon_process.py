"""Real gpulayerd processes on temporary state dirs, with optional fake GPUs: THE daemon-process
harness of the tests (tests/integration, tests/tui; the LAN harness, tests/lan/harness.py, starts
its daemons inside network namespaces and keeps its own ``Host``).

A :class:`Daemon` is ``gpulayerd --state-dir ROOT/state --device-lock-dir LOCKS --cpu-slots N
--config ROOT/gpulayerd.toml`` started as a subprocess; tests drive it through the ``gpulayer`` CLI
(:meth:`Daemon.cli`) and, for polling, through :class:`gpulayerd.api.client.DaemonClient` (the same
JSON as ``gpulayer show --json``, without a 0.5 s interpreter start per look).

Fake GPUs (:class:`FakeGpus`) are the fake ``nvidia-smi`` of ``tests/fakes`` installed in a
directory that is prepended to the daemon's PATH; its scenario file is re-read on every call, so a
test can change ``--query-compute-apps`` while the daemon runs.

Every root directory is a short ``/tmp/glit-*`` (unix socket paths are limited to about 100
bytes). :meth:`Lab.close` stops every daemon (SIGTERM, then SIGKILL) and then kills whatever is
left of their jobs: watchdogs and job processes are found by their command line, working
directory or ``GPULAYER_JOB_ID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

from gpulayerd.api.client import DaemonClient
from gpulayerd.core.job_facts import TERMINAL_STATES
from gpulayerd.models import JobView
from tests.fakes import COMPUTE_APPS_ARGV, MIG_MODE_ARGV, gpu_query_argv, install_fake_tool, response, smi_header
from tests.fakes.envcache import keep_env_cache, seed_env_cache

REPO_ROOT = Path(__file__).resolve().parents[2]
TERMINAL = TERMINAL_STATES
START_TIMEOUT_S = 30.0  # the first environment probe imports torch (~2 s, more on a loaded machine)
SETTINGS: dict[str, float] = {
    "cancel_grace_s": 1.0,
    "watchdog_poll_interval_s": 0.1,
    "schedule_interval_s": 0.5,  # foreign processes leaving a GPU are only seen by the periodic pass
    "probe_interval_s": 300.0,
}

_T = TypeVar("_T")


def tool(name: str) -> str:
    """The venv's console script ``name`` (the interpreter running pytest, else the repo's .venv, else PATH)."""
    for d in (Path(sys.executable).parent, REPO_ROOT / ".venv" / "bin"):
        if (d / name).is_file():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e .)")
    return found


GPULAYERD = tool("gpulayerd")
GPULAYER = tool("gpulayer")


def clean_env(extra_path: Path | None = None) -> dict[str, str]:
    """This environment without GPULAYER_* (a developer's GPULAYER_STATE_DIR must not leak in) and
    without COLUMNS and LINES (pytest-xdist's workers set 80x24: the CLI would fit its tables to that)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_") and k not in ("COLUMNS", "LINES")}
    if extra_path is not None:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def is_dead(pid: int) -> bool:
    """No such process, or only its zombie (a container's pid 1 may never reap orphans)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def live_group_members(pgid: int) -> list[int]:
    """Pids of running (non-zombie) processes in process group ``pgid``."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
    return out


# ------------------------------------------------------------------------------ fake GPUs


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    memory_mib: int
    name: str = "NVIDIA Fake"
    compute_cap: str = "8.6"
    used_mib: int = 0
    compute_mode: str = "Default"
    pstate: str = "P8"

    def row(self) -> str:
        return (f"{self.index}, {self.uuid}, {self.name}, {self.memory_mib}, {self.used_mib}, {self.compute_cap}, "
                "550.54.15\n")

    def state_row(self) -> str:
        """Its row of the second query (``MIG_MODE_ARGV``): bus id, MIG mode, compute mode, pstate."""
        return f"{self.index}, {self.uuid}, 00000000:{self.index + 1:02X}:00.0, [N/A], {self.compute_mode}, {self.pstate}\n"


class FakeGpus:
    """A fake nvidia-smi reporting ``gpus``; ``set_apps`` changes its compute-process list live."""

    def __init__(self, bin_dir: Path, memories_mib: Sequence[int]) -> None:
        token = uuid.uuid4().hex[:8]
        self.gpus = [FakeGpu(i, f"GPU-{token}-0000-4000-8000-{i:012x}", m, f"NVIDIA Fake {m // 1024}GB")
                     for i, m in enumerate(memories_mib)]
        self.bin_dir = bin_dir
        self.tool = install_fake_tool(bin_dir, "nvidia-smi", [])
        self.set_apps([])

    def uuid_of(self, index: int) -> str:
        return self.gpus[index].uuid

    def set_used(self, index: int, used_mib: int) -> None:
        """GPU ``index``'s ``memory.used`` (MiB) from now on, the process list as it was."""
        self.gpus[index] = dataclasses.replace(self.gpus[index], used_mib=used_mib)
        self.set_apps(self._apps)

    def set_state(self, index: int, *, pstate: str | None = None, compute_mode: str | None = None) -> None:
        """GPU ``index``'s live field ``pstate`` (``[GPU requires reset]`` after an Xid) and compute mode
        from now on."""
        gpu = self.gpus[index]
        self.gpus[index] = dataclasses.replace(gpu, pstate=gpu.pstate if pstate is None else pstate,
                                               compute_mode=gpu.compute_mode if compute_mode is None else compute_mode)
        self.set_apps(self._apps)

    def set_driver_unavailable(self) -> None:
        """Every call answers as nvidia-smi does before the driver is loaded (exit 9), until
        :meth:`set_apps` (or another setter) writes the GPUs' answers again."""
        message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
                   "the latest NVIDIA driver is installed and running.\n")
        self._write({"responses": [], "default": response([], message, exit_code=9)})

    def set_apps(self, apps: Sequence[tuple[int, int]]) -> None:
        """Compute processes as (GPU index, pid) pairs; empty: "No running processes found"."""
        self._apps = list(apps)
        rows = "".join(f"{self.uuid_of(i)}, {pid}, 100\n" for i, pid in apps) or "No running processes found\n"
        scenario = {"responses": [
            response(gpu_query_argv(), "".join(g.row() for g in self.gpus)),
            response(MIG_MODE_ARGV, "".join(g.state_row() for g in self.gpus)),
            response(COMPUTE_APPS_ARGV, rows),
            smi_header(),  # plain nvidia-smi: the banner with the driver's CUDA Version
        ]}
        self._write(scenario)

    def _write(self, scenario: dict[str, Any]) -> None:
        path = self.tool.path.with_name("nvidia-smi.json")
        tmp = path.with_name(".nvidia-smi.json.tmp")
        tmp.write_text(json.dumps(scenario), encoding="utf-8")
        os.replace(tmp, path)  # the fake reads it on every call: never a half-written file


# --------------------------------------------------------------------------------- daemon


class Daemon:
    """One gpulayerd subprocess on its own state dir."""

    def __init__(self, root: Path, *, lock_dir: Path, cpu_slots: int | None, fake: FakeGpus | None,
                 settings: dict[str, float], env: dict[str, str] | None = None,
                 wrap: Sequence[str] = (), toml: str = "") -> None:
        self.root = root
        self.toml = toml  # sections after the settings (e.g. ``[slurm]``)
        self.wrap = list(wrap)  # argv prefix (taskset -c 0, unshare ...) the daemon runs under
        self.extra_env = env or {}
        self.state_dir = root / "state"
        self.work = root / "work"
        self.lock_dir = lock_dir
        self.cpu_slots = cpu_slots
        self.fake = fake
        self.settings = settings
        self.log_path = root / "gpulayerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ---- lifecycle

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "run" / "gpulayerd.sock"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Daemon:
        self.work.mkdir(parents=True, exist_ok=True)
        seed_env_cache(self.state_dir)
        config = self.root / "gpulayerd.toml"
        config.write_text("".join(f"{k} = {v!r}\n" for k, v in self.settings.items()) + self.toml, encoding="utf-8")
        slots = [] if self.cpu_slots is None else ["--cpu-slots", str(self.cpu_slots)]
        argv = [*self.wrap, GPULAYERD, "--state-dir", str(self.state_dir), "--device-lock-dir", str(self.lock_dir),
                *slots, "--config", str(config), "--log-level", "DEBUG"]
        env = {**clean_env(self.fake.bin_dir if self.fake is not None else None), **self.extra_env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=self.root, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"gpulayerd exited with {self.proc.returncode}\n{self.log_tail()}")
            if self.socket_path.exists():
                try:
                    # devices() answers once the first probe (hardware + environments) is done.
                    self.call(lambda c: c.devices(), timeout_s=max(1.0, end - time.monotonic()))
                    keep_env_cache(self.state_dir)
                    return self
                except Exception:
                    if time.monotonic() > end:
                        raise
            if time.monotonic() > end:
                raise AssertionError(f"gpulayerd did not answer within {timeout_s} s\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL. Returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        keep_env_cache(self.state_dir)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would (the socket file stays behind)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n_bytes: int = 6000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no daemon log)"

    def job_ids_on_disk(self) -> set[str]:
        runs = self.state_dir / "runs"
        return {p.name for p in runs.iterdir()} if runs.is_dir() else set()

    # ---- CLI

    def cli(self, *args: str, cwd: Path | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``gpulayer --state-dir STATE ARGS...`` (run in the daemon's work dir by default)."""
        return subprocess.run([GPULAYER, "--state-dir", str(self.state_dir), *args], cwd=cwd or self.work,
                              env=clean_env(), capture_output=True, text=True, timeout=timeout_s, check=False)

    def cli_ok(self, *args: str, cwd: Path | None = None) -> str:
        r = self.cli(*args, cwd=cwd)
        assert r.returncode == 0, f"gpulayer {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli_ok(*args))

    def submit(self, *args: str, cwd: Path | None = None) -> str:
        """``gpulayer submit --json ARGS``; asserts exit 0 and returns the job id."""
        job = json.loads(self.cli_ok("submit", "--json", *args, cwd=cwd))
        assert job["status"] == "queued", job
        return str(job["id"])

    def show(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = self.cli_json("show", "--json", job_id)
        return data

    def all_jobs(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self.cli_json("jobs", "--json", "--all")
        return data

    # ---- API (polling)

    def call(self, fn: Callable[[DaemonClient], Awaitable[_T]], timeout_s: float = 30.0) -> _T:
        async def go() -> _T:
            async with DaemonClient(self.socket_path, timeout_s=timeout_s) as c:
                return await fn(c)

        return asyncio.run(go())

    def job(self, job_id: str) -> JobView:
        return self.call(lambda c: c.job(job_id))

    def wait_status(self, job_id: str, statuses: Collection[str], timeout_s: float = 20.0) -> JobView:
        """Poll the job (GET /v1/jobs/ID, what ``gpulayer show --json`` prints) until its status is in ``statuses``."""
        end = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job.status in statuses:
                return job
            if job.status in TERMINAL or time.monotonic() > end:
                raise AssertionError(f"job {job_id} is {job.status} ({job.reason!r}), wanted one of "
                                     f"{sorted(statuses)}\n{self.log_tail()}")
            time.sleep(0.05)

    def wait_reason(self, job_id: str, predicate: Callable[[JobView], bool], timeout_s: float = 10.0) -> JobView:
        end = time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if predicate(job):
                return job
            if time.monotonic() > end:
                raise AssertionError(f"job {job_id}: {job.status} {job.reason!r}\n{self.log_tail()}")
            time.sleep(0.05)


def kill_leftovers(root: Path, job_ids: Collection[str]) -> list[int]:
    """SIGKILL every process of ours tied to ``root``: its command line or cwd names it, or it
    carries one of ``job_ids`` as GPULAYER_JOB_ID. Returns the pids killed."""
    me = os.getpid()
    spare = {me, *(p.pid for p in psutil.Process(me).parents())}
    uid = os.getuid()
    marker = str(root)
    victims: list[psutil.Process] = []
    for p in psutil.process_iter():
        if p.pid in spare:
            continue
        with contextlib.suppress(psutil.Error):
            if p.uids().real != uid or p.status() == psutil.STATUS_ZOMBIE:
                continue
            hit = any(marker in a for a in p.cmdline())
            if not hit:
                with contextlib.suppress(psutil.Error):
                    cwd = p.cwd()
                    hit = cwd == marker or cwd.startswith(marker + os.sep)
            if not hit and job_ids:
                with contextlib.suppress(psutil.Error):
                    hit = p.environ().get("GPULAYER_JOB_ID") in job_ids
            if hit:
                victims.append(p)
    for p in victims:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(victims, timeout=5)
    return [p.pid for p in victims]


class Lab:
    """Daemons, fake GPU sets and helper processes under one short temporary root."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="glit-", dir="/tmp"))
        self.lock_dir = self.root / "locks"  # shared by every daemon of this lab unless told otherwise
        self.daemons: list[Daemon] = []
        self.helpers: list[subprocess.Popen[bytes]] = []
        self._n = 0

    def fake_gpus(self, memories_mib: Sequence[int]) -> FakeGpus:
        self._n += 1
        return FakeGpus(self.root / f"fake{self._n}", memories_mib)

    def daemon(self, *, fake: FakeGpus | None = None, cpu_slots: int | None = 2, lock_dir: Path | None = None,
               env: dict[str, str] | None = None, start: bool = True, wrap: Sequence[str] = (), toml: str = "",
               **settings: float) -> Daemon:
        self._n += 1
        d = Daemon(self.root / f"d{self._n}", lock_dir=lock_dir or self.lock_dir, cpu_slots=cpu_slots,
                   fake=fake, settings={**SETTINGS, **settings}, env=env, wrap=wrap, toml=toml)
        self.daemons.append(d)
        return d.start() if start else d

    def spawn(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """A helper process (e.g. a "foreign" GPU user) killed at teardown."""
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             start_new_session=True)
        self.helpers.append(p)
        return p

    def close(self, dump_logs: bool = False) -> None:
        try:
            for d in self.daemons:
                d.stop()
                if dump_logs:
                    print(f"===== {d.log_path}\n{d.log_tail()}")
            job_ids = set().union(*(d.job_ids_on_disk() for d in self.daemons)) if self.daemons else set()
            kill_leftovers(self.root, job_ids)
            for p in self.helpers:
                if p.poll() is None:
                    p.kill()
                p.wait()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
