"""Crash safety: gpulayerd killed with SIGKILL at random moments, then restarted on its state dir.

DESIGN.md §5 step 6 and §7: a ``kill -9`` at any moment loses no acknowledged job; on
restart, running jobs are re-adopted (their per-job watchdog outlived the daemon) or
marked lost with a reason, and a job never runs twice unless its retries allow it.

Each test starts real ``gpulayerd`` processes (``--cpu-slots``, private state and lock
dirs under a short temporary root) with a small helper of its own, and talks to them
through :class:`DaemonClient` on the unix socket. Whatever a test leaves behind (the
daemon, watchdogs, job process groups) is killed by the ``crash_daemon`` fixture, also
when the test fails.

The storm test is random: its seed is printed (shown on failure) and can be replayed
with ``GPULAYER_CRASH_SEED=<seed>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import pytest

from gpulayerd.api.client import ApiRequestError, DaemonClient, DaemonUnreachable
from gpulayerd.models import JobView

pytestmark = pytest.mark.slow

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost", "rejected"})
ACTIVE = frozenset({"claimed", "running"})
MARKER = "ok"
START_TIMEOUT_S = 20.0
CREATE_TIME_TOLERANCE_S = 1.0


# ------------------------------------------------------------------------ the daemon


def _daemon_command() -> list[str]:
    script = Path(sys.executable).with_name("gpulayerd")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpulayerd"]


class CrashDaemon:
    """One gpulayerd on a fixed state dir, started, SIGKILLed and restarted by the test."""

    def __init__(self, root: Path, cpu_slots: int = 4) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.lock_dir = root / "locks"
        self.log_path = root / "gpulayerd.log"
        self.workdir = root / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cpu_slots = cpu_slots
        self.env: dict[str, str] = dict(os.environ)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []

    @property
    def socket_path(self) -> Path:
        return self.state_dir / "run" / "gpulayerd.sock"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "gpulayer.sqlite3"

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "gpulayerd is not running"
        return self.proc.pid

    def client(self, timeout_s: float = 10.0) -> DaemonClient:
        return DaemonClient(self.socket_path, timeout_s=timeout_s)

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start gpulayerd and return once *this* process answers on the socket.

        The socket file of a daemon killed with -9 stays behind, so "the socket exists"
        means nothing: wait until /v1/health names the new pid. The daemon serves its
        socket only after it recovered the previous life's runs.
        """
        assert self.proc is None, "gpulayerd is already running"
        argv = [*_daemon_command(), "--state-dir", str(self.state_dir), "--device-lock-dir", str(self.lock_dir),
                "--cpu-slots", str(self.cpu_slots)]
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {len(self.pids) + 1} at {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        self.pids.append(self.proc.pid)
        end = time.monotonic() + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                raise AssertionError(f"gpulayerd exited with {code} while starting:\n{self.log_tail()}")
            with contextlib.suppress(DaemonUnreachable, ApiRequestError, aiohttp.ClientError, asyncio.TimeoutError):
                async with self.client(timeout_s=2.0) as c:
                    if (await c.health()).pid == self.proc.pid:
                        return
            if time.monotonic() > end:
                raise AssertionError(f"gpulayerd did not answer within {timeout_s:g} s:\n{self.log_tail()}")
            await asyncio.sleep(0.02)

    def kill9(self) -> None:
        """SIGKILL the daemon (nothing else: its watchdogs and jobs live on) and reap it."""
        assert self.proc is not None, "gpulayerd is not running"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); the exit code."""
        assert self.proc is not None, "gpulayerd is not running"
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"gpulayerd did not stop on SIGTERM within {timeout_s:g} s") from None

    def log_tail(self, n_bytes: int = 6000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no daemon log)"

    def spec(self, script: str, name: str | None = None) -> dict[str, object]:
        spec: dict[str, object] = {"command": ["sh", "-c", script], "workdir": str(self.workdir)}
        if name is not None:
            spec["name"] = name
        return spec

    # ------------------------------------------------------------- on-disk views

    def read_db(self) -> tuple[dict[str, str], list[tuple[str, int, str]]]:
        """With the daemon dead: {job id: status} and the active attempts, read-only."""
        con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        try:
            jobs = {str(i): str(s) for i, s in con.execute("SELECT id, status FROM jobs")}
            active = [(str(j), int(a), str(s)) for j, a, s in con.execute(
                "SELECT job_id, attempt, state FROM attempts WHERE state IN ('claimed', 'running')")]
        finally:
            con.close()
        return jobs, active

    def integrity_check(self) -> str:
        con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        try:
            return "\n".join(str(r[0]) for r in con.execute("PRAGMA integrity_check"))
        finally:
            con.close()

    def run_dir(self, job_id: str, attempt: int) -> Path:
        return self.runs_dir / job_id / str(attempt)

    def running_on_disk(self) -> list[Path]:
        """Run dirs whose job process was started and whose watchdog has not recorded an end."""
        return [d for d in self.runs_dir.glob("*/*")
                if (d / "job.json").exists() and not (d / "exit.json").exists()]

    def watchdog_alive(self, run_dir: Path) -> bool:
        data = _read_json(run_dir / "watchdog.json")
        return data is not None and _same_process(data.get("pid"), data.get("create_time"))

    def markers(self, run_dir: Path) -> int:
        try:
            text = (run_dir / "stdout.log").read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return 0
        return sum(1 for line in text.splitlines() if line.strip() == MARKER)


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _same_process(pid: object, create_time: object) -> bool:
    if not isinstance(pid, int) or not isinstance(create_time, int | float):
        return False
    try:
        proc = psutil.Process(pid)
        return (proc.status() != psutil.STATUS_ZOMBIE
                and abs(proc.create_time() - float(create_time)) < CREATE_TIME_TOLERANCE_S)
    except psutil.Error:
        return False


def kill_everything(root: Path) -> list[int]:
    """SIGKILL every process of ``root``: daemons, launchers, watchdogs, job process groups.

    Processes are found by their command line (the daemon, launchers and watchdogs name a
    path under ``root``), by ``watchdog.json`` and by ``job.json`` (a job's process group,
    unless its leader's pid now belongs to another process). Repeated until nothing is left.
    """
    killed: list[int] = []
    me = os.getpid()
    for _ in range(5):
        found = False
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = proc.info.get("cmdline") or []
            if proc.pid != me and any(str(root) in arg for arg in cmdline):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
                    killed.append(proc.pid)
                    found = True
        for path in root.glob("state/runs/*/*/watchdog.json"):
            data = _read_json(path) or {}
            pid = data.get("pid")
            if isinstance(pid, int) and _same_process(pid, data.get("create_time")):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    found = True
        for path in root.glob("state/runs/*/*/job.json"):
            data = _read_json(path) or {}
            pgid = data.get("pgid")
            if not isinstance(pgid, int) or pgid <= 1:
                continue
            try:
                leader = psutil.Process(pgid)
                ours = abs(leader.create_time() - float(data.get("create_time") or 0)) < CREATE_TIME_TOLERANCE_S
            except psutil.Error:
                ours = True  # leader gone: while members live the kernel does not reuse the group id
            if ours:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
                    found = True
        if not found:
            break
        time.sleep(0.1)
    return killed


@pytest.fixture
def crash_daemon() -> Iterator[CrashDaemon]:
    # A short root: the socket path must stay under the 107-byte sun_path limit.
    root = Path(tempfile.mkdtemp(prefix="glcrash-"))
    daemon = CrashDaemon(root)
    try:
        yield daemon
    finally:
        if daemon.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                daemon.proc.kill()
            daemon.proc.wait()
            daemon.proc = None
        kill_everything(root)
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------------------ helpers


async def _wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str,
                    interval_s: float = 0.05) -> None:
    end = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def _all_jobs(d: CrashDaemon) -> dict[str, JobView]:
    async with d.client() as c:
        return {j.id: j for j in await c.jobs()}


async def _job(d: CrashDaemon, job_id: str) -> JobView:
    async with d.client() as c:
        return await c.job(job_id)


def _adopted(view: JobView, attempt: int, since_wall: float) -> bool:
    return any(e.kind == "adopted" and e.attempt == attempt and e.at >= since_wall for e in view.events)


def _history(view: JobView) -> str:
    events = "\n".join(f"    {e.seq} {e.kind} {e.from_status}->{e.to_status} attempt={e.attempt} {e.reason}"
                       for e in view.events)
    attempts = "\n".join(f"    #{a.attempt} {a.state} exit={a.exit_code} {a.reason}" for a in view.attempts)
    return f"job {view.id} {view.status} ({view.reason})\n  attempts:\n{attempts}\n  events:\n{events}"


# --------------------------------------------------------------------- the storm


@dataclass
class Storm:
    """What the submitters saw: every job whose submit was acknowledged, and how it was made."""

    acked: dict[str, str] = field(default_factory=dict)  # job id -> script
    unanswered: int = 0  # submits cut off by a kill (they may or may not be stored)


async def _submitter(d: CrashDaemon, storm: Storm, scripts: list[str], progress: asyncio.Event) -> None:
    """Submit ``scripts`` one after the other; stop at the first submit the dying daemon cuts off."""
    async with d.client(timeout_s=5.0) as c:
        for script in scripts:
            try:
                view = await c.submit(d.spec(script))
            except (DaemonUnreachable, aiohttp.ClientError, asyncio.TimeoutError):
                storm.unanswered += 1
                return
            storm.acked[view.id] = script  # acknowledged: the daemon answered
            progress.set()


def _random_script(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return f"sleep 3; echo {MARKER}"
    return f"sleep 0.{rng.randint(1, 5)}; echo {MARKER}"


async def _storm_and_kill(d: CrashDaemon, storm: Storm, rng: random.Random, mode: str) -> str:
    """One cycle: a submit storm, then SIGKILL at a random moment; says when it struck."""
    n_clients = 4
    batches = [[_random_script(rng) for _ in range(rng.randint(3, 6))] for _ in range(n_clients)]
    total = sum(len(b) for b in batches)
    before = len(storm.acked)
    progress = asyncio.Event()
    tasks = [asyncio.create_task(_submitter(d, storm, b, progress)) for b in batches]
    if mode == "storm":
        # Kill while submits are in flight: after a random number of acknowledgements.
        after = rng.randint(1, total - 1)
        while True:
            progress.clear()
            if len(storm.acked) - before >= after or all(t.done() for t in tasks):
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(progress.wait(), 5.0)
        await asyncio.sleep(rng.uniform(0.0, 0.002))
        when = f"during the submit storm after {len(storm.acked) - before}/{total} acks"
    else:
        await asyncio.gather(*tasks)

        async def some_running() -> bool:
            return bool(d.running_on_disk())

        await _wait_for(some_running, 15.0, "a running job")
        await asyncio.sleep(rng.uniform(0.0, 1.2))
        when = f"during runs ({len(d.running_on_disk())} running)"
    d.kill9()
    await asyncio.gather(*tasks)
    return when


async def _check_recovered(d: CrashDaemon, storm: Storm, restart_wall: float,
                           active_before: list[tuple[str, int, str]], label: str) -> None:
    """After a restart: acknowledged jobs there; no active attempt without a live, adopted watchdog."""
    jobs = await _all_jobs(d)
    missing = sorted(set(storm.acked) - set(jobs))
    assert not missing, f"{label}: acknowledged jobs missing after restart: {missing}"

    problems: list[str] = []

    async def settled() -> bool:
        problems.clear()
        views: dict[str, JobView] = {}
        listed = await _all_jobs(d)
        want = {j for j, _a, _s in active_before} | {j for j, v in listed.items() if v.status in ACTIVE}
        for job_id in sorted(want):
            views[job_id] = await _job(d, job_id)
        # Every attempt that was active when the daemon died: ended with a reason, or re-adopted.
        for job_id, attempt, _state in active_before:
            view = views[job_id]
            att = next((a for a in view.attempts if a.attempt == attempt), None)
            if att is None:
                problems.append(f"attempt {attempt} vanished\n{_history(view)}")
            elif att.state in ACTIVE:
                if not _adopted(view, attempt, restart_wall):
                    problems.append(f"attempt {attempt} still {att.state} but not re-adopted\n{_history(view)}")
                elif not d.watchdog_alive(d.run_dir(job_id, attempt)):
                    problems.append(f"attempt {attempt} adopted but its watchdog is gone\n{_history(view)}")
            elif att.state == "lost" and not att.reason:
                problems.append(f"attempt {attempt} lost without a reason\n{_history(view)}")
        # Every active job: its current attempt is active and its watchdog lives (or is just starting).
        for job_id, view in views.items():
            if view.status not in ACTIVE:
                if view.status == "lost" and not view.reason:
                    problems.append(f"lost without a reason\n{_history(view)}")
                continue
            att = next((a for a in view.attempts if a.attempt == view.attempt), None)
            if att is None or att.state not in ACTIVE:
                problems.append(f"job is {view.status} but its attempt {view.attempt} is "
                                f"{'missing' if att is None else att.state}\n{_history(view)}")
                continue
            run_dir = d.run_dir(job_id, view.attempt)
            fresh = any(e.to_status == "claimed" and e.attempt == view.attempt and e.at >= restart_wall
                        for e in view.events)
            if not fresh and not d.watchdog_alive(run_dir):
                problems.append(f"job is {view.status} without a live watchdog\n{_history(view)}")
        return not problems

    with contextlib.suppress(AssertionError):
        await _wait_for(settled, 5.0, "recovery to settle", interval_s=0.2)
    assert not problems, f"{label}: after restart:\n" + "\n".join(problems)


async def _final_checks(d: CrashDaemon, storm: Storm, label: str) -> None:
    async def all_done() -> bool:
        return all(v.status in TERMINAL for v in (await _all_jobs(d)).values())

    try:
        await _wait_for(all_done, 60.0, "every job to end", interval_s=0.25)
    except AssertionError:
        pending = [v for v in (await _all_jobs(d)).values() if v.status not in TERMINAL]
        details = "\n".join(_history(await _job(d, v.id)) for v in pending[:5])
        raise AssertionError(f"{label}: {len(pending)} jobs never ended:\n{details}") from None

    # The CLI agrees with the client about what is stored.
    cli = Path(sys.executable).with_name("gpulayer")
    argv = [str(cli)] if cli.exists() else [sys.executable, "-m", "gpulayerd.cli"]
    out = subprocess.run([*argv, "--state-dir", str(d.state_dir), "jobs", "--all", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    cli_ids = {j["id"] for j in json.loads(out)}
    assert set(storm.acked) <= cli_ids, f"{label}: `gpulayer jobs --all` lacks {set(storm.acked) - cli_ids}"

    views = [await _job(d, job_id) for job_id in sorted(cli_ids)]
    assert d.stop() == 0, f"{label}: gpulayerd did not stop cleanly:\n{d.log_tail()}"

    problems: list[str] = []
    for view in views:
        where = _history(view)
        if view.status not in ("succeeded", "lost"):
            problems.append(f"ended {view.status}, expected succeeded (or lost with a reason)\n{where}")
        if view.status == "lost" and not view.reason:
            problems.append(f"lost without a reason\n{where}")
        attempts = {a.attempt: a for a in view.attempts}
        on_disk = {int(p.name) for p in (d.runs_dir / view.id).glob("*") if p.name.isdigit()}
        if on_disk - set(attempts):
            problems.append(f"run dirs without an attempt row: {sorted(on_disk - set(attempts))}\n{where}")
        total = 0
        for a in view.attempts:
            run_dir = d.run_dir(view.id, a.attempt)
            n = d.markers(run_dir)
            total += n
            if a.state in ACTIVE:
                problems.append(f"attempt {a.attempt} still {a.state} after the job ended\n{where}")
            if a.state == "lost" and not a.reason:
                problems.append(f"attempt {a.attempt} lost without a reason\n{where}")
            if a.state == "exited" and a.exit_code == 0 and n != 1:
                problems.append(f"attempt {a.attempt} exited 0 but printed its marker {n} times\n{where}")
            if (run_dir / "job.json").exists() and not (run_dir / "exit.json").exists():
                problems.append(f"attempt {a.attempt}: its watchdog never recorded an end\n{where}")
        # retries = 0: at most one copy of the job may ever run, whatever the kills did.
        if total > 1:
            problems.append(f"the job ran {total} times (retries 0: never two copies)\n{where}")
        if view.status == "succeeded" and (total != 1 or view.exit_code != 0):
            problems.append(f"succeeded with exit {view.exit_code} and {total} markers\n{where}")
    assert not problems, f"{label}:\n" + "\n\n".join(problems[:10])

    assert not kill_everything(d.root), f"{label}: processes were left running after every job ended"
    assert d.integrity_check() == "ok", f"{label}: PRAGMA integrity_check: {d.integrity_check()}"


def test_sigkill_during_submit_storm_and_runs(crash_daemon: CrashDaemon) -> None:
    """SIGKILL at random moments of a submit storm and of runs; after each restart nothing is lost."""
    seed = int(os.environ.get("GPULAYER_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"crash storm seed: {seed} (replay with GPULAYER_CRASH_SEED={seed})")
    rng = random.Random(seed)
    d = crash_daemon
    storm = Storm()

    async def scenario() -> None:
        await d.start()
        started = time.monotonic()
        first = rng.choice(["storm", "runs"])
        cycles = 0
        while cycles < 6 and (cycles < 4 or time.monotonic() - started < 30.0):
            mode = first if cycles % 2 == 0 else ("runs" if first == "storm" else "storm")
            when = await _storm_and_kill(d, storm, rng, mode)
            cycles += 1
            label = f"seed {seed}, kill {cycles} {when}"
            print(label)
            jobs_at_kill, active_at_kill = d.read_db()
            missing = sorted(set(storm.acked) - set(jobs_at_kill))
            assert not missing, f"{label}: acknowledged jobs not in the store after SIGKILL: {missing}"
            assert d.integrity_check() == "ok", f"{label}: store damaged by SIGKILL"
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            restart_wall = time.time()
            await d.start()
            await _check_recovered(d, storm, restart_wall, active_at_kill, label)
        print(f"{cycles} kills, {len(storm.acked)} acknowledged submits, {storm.unanswered} cut off")
        await _final_checks(d, storm, f"seed {seed}, after {cycles} kills")

    asyncio.run(scenario())


# ----------------------------------------------------------------- focused cases


def test_running_job_is_readopted_after_sigkill(crash_daemon: CrashDaemon) -> None:
    """A running job (it waits for a gate file): SIGKILL, restart -> same attempt re-adopted; the gate
    opens, and the new daemon records it succeeded."""
    d = crash_daemon
    gate = d.workdir / f"gate-{os.getpid()}"

    async def scenario() -> None:
        await d.start()
        async with d.client() as c:
            job_id = (await c.submit(d.spec(f"while [ ! -e {gate} ]; do sleep 0.1; done; echo {MARKER}"))).id
        run_dir = d.run_dir(job_id, 1)

        async def running() -> bool:
            return (run_dir / "job.json").exists() and (await _job(d, job_id)).status == "running"

        await _wait_for(running, 15.0, "the job to run")
        watchdog = _read_json(run_dir / "watchdog.json")
        assert watchdog is not None

        d.kill9()
        restart_wall = time.time()
        await d.start()

        view = await _job(d, job_id)
        assert view.status == "running", _history(view)
        assert view.attempt == 1, _history(view)
        assert _adopted(view, 1, restart_wall), _history(view)
        assert [a.state for a in view.attempts] == ["running"], _history(view)
        assert d.watchdog_alive(run_dir), "the watchdog died with the daemon"
        assert _read_json(run_dir / "watchdog.json") == watchdog, "a second watchdog was started"
        assert not (run_dir / "exit.json").exists()
        gate.touch()

        async def ended() -> bool:
            return (await _job(d, job_id)).status in TERMINAL

        await _wait_for(ended, 15.0, "the job to end")
        view = await _job(d, job_id)
        assert view.status == "succeeded", _history(view)
        assert view.exit_code == 0, _history(view)
        assert len(view.attempts) == 1, _history(view)
        (att,) = view.attempts
        assert (att.state, att.exit_code) == ("exited", 0), _history(view)
        adopted = next(e for e in view.events if e.kind == "adopted")
        done = next(e for e in view.events if e.to_status == "succeeded")
        assert done.seq > adopted.seq and done.at >= restart_wall, "the exit was not recorded by the new daemon"
        assert d.markers(run_dir) == 1
        assert d.stop() == 0
        assert d.integrity_check() == "ok"

    asyncio.run(scenario())


@pytest.mark.parametrize("retries", [0, 1])
def test_watchdog_killed_while_daemon_down_is_lost_with_a_reason(crash_daemon: CrashDaemon, retries: int) -> None:
    """Daemon and the job's watchdog (and job) die with -9; after the restart the attempt is lost with a
    reason, and the job is ``lost`` (retries 0) or re-queued and run again (retries 1)."""
    d = crash_daemon

    async def scenario() -> None:
        await d.start()
        spec = d.spec(f"sleep 30; echo {MARKER}" if retries == 0 else f"sleep 2; echo {MARKER}")
        spec["policy"] = {"retries": retries}
        async with d.client() as c:
            job_id = (await c.submit(spec)).id
        run_dir = d.run_dir(job_id, 1)

        async def running() -> bool:
            return (run_dir / "job.json").exists() and (await _job(d, job_id)).status == "running"

        await _wait_for(running, 15.0, "the job to run")
        d.kill9()
        assert kill_everything(d.root), "found no watchdog or job to kill"
        await d.start()

        view = await _job(d, job_id)
        first = next(a for a in view.attempts if a.attempt == 1)
        assert first.state == "lost" and first.reason, _history(view)
        assert not _adopted(view, 1, 0.0), _history(view)
        if retries == 0:
            assert view.status == "lost" and view.reason, _history(view)
        else:
            assert view.status in ("queued", "claimed", "running"), _history(view)

            async def ended() -> bool:
                return (await _job(d, job_id)).status in TERMINAL

            await _wait_for(ended, 20.0, "the second attempt to end")
            view = await _job(d, job_id)
            assert (view.status, view.attempt, view.exit_code) == ("succeeded", 2, 0), _history(view)
            assert d.markers(d.run_dir(job_id, 2)) == 1
        assert d.markers(run_dir) == 0
        assert d.stop() == 0
        assert d.integrity_check() == "ok"

    asyncio.run(scenario())


def test_readopted_jobs_count_against_cpu_slots(crash_daemon: CrashDaemon) -> None:
    """After a restart the re-adopted jobs hold their CPU slots: no more than --cpu-slots jobs run at once."""
    d = crash_daemon
    d.cpu_slots = 2

    async def scenario() -> None:
        await d.start()
        async with d.client() as c:
            long_ids = [(await c.submit(d.spec(f"sleep 6; echo {MARKER}"))).id for _ in range(2)]
            for _ in range(3):
                await c.submit(d.spec(f"sleep 0.2; echo {MARKER}"))

        async def both_running() -> bool:
            return len(d.running_on_disk()) == 2

        await _wait_for(both_running, 15.0, "two jobs to run")
        d.kill9()
        await d.start()
        # Only health was asked of the new daemon; watch the run dirs while the long jobs last.
        most = 0
        end = time.monotonic() + 15.0
        while time.monotonic() < end and not all((d.run_dir(j, 1) / "exit.json").exists() for j in long_ids):
            most = max(most, len(d.running_on_disk()))
            await asyncio.sleep(0.02)
        assert most <= 2, f"{most} jobs ran at once after the restart with --cpu-slots 2"

    asyncio.run(scenario())


def _simulate_kill_after_exit_recorded(d: CrashDaemon, job_id: str) -> None:
    """The state a SIGKILL leaves between ``store.jobs.end_attempt`` and the job's own update.

    ``JobManager._finish`` commits the attempt's end (attempt ``exited``, grants released,
    the job's exit code) in one transaction and moves the job to ``succeeded`` in the
    next; this is the first transaction, exactly as ``end_attempt`` writes it.
    """
    con = sqlite3.connect(d.db_path, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("UPDATE attempts SET state = 'exited', ended_at = ?, exit_code = 0, "
                    "reason = 'the job exited with code 0' WHERE job_id = ? AND attempt = 1", (time.time(), job_id))
        con.execute("DELETE FROM grants WHERE job_id = ? AND attempt = 1", (job_id,))
        con.execute("UPDATE jobs SET exit_code = 0 WHERE id = ? AND attempt = 1 AND exit_code IS NULL", (job_id,))
        con.execute("COMMIT")
    finally:
        con.close()


def _simulate_kill_before_mark_running(d: CrashDaemon, job_id: str) -> None:
    """The state a SIGKILL leaves after the watchdog started the job but before the daemon recorded it.

    ``JobManager._claim_and_start`` commits the claim (job and attempt ``claimed``), then
    starts the watchdog (which starts the job), and only then commits ``mark_running``
    and the job's move to ``running``.
    """
    con = sqlite3.connect(d.db_path, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("UPDATE attempts SET state = 'claimed', watchdog_pid = NULL, watchdog_create_time = NULL, "
                    "job_pgid = NULL, started_at = NULL WHERE job_id = ? AND attempt = 1", (job_id,))
        con.execute("UPDATE jobs SET status = 'claimed' WHERE id = ? AND attempt = 1", (job_id,))
        con.execute("DELETE FROM events WHERE job_id = ? AND to_status = 'running'", (job_id,))
        con.execute("COMMIT")
    finally:
        con.close()


@pytest.mark.parametrize("crash_point", ["after_exit_recorded", "before_mark_running"])
def test_sigkill_between_two_commits(crash_daemon: CrashDaemon, crash_point: str) -> None:
    """A kill between two commits of one step leaves a state recovery must finish.

    The job runs under its watchdog; the daemon is SIGKILLed; the store is put in the state
    the kill would have left had it struck between the two commits (a real SIGKILL cannot
    be aimed at a window of a few milliseconds); the daemon restarts. Correct: the job does
    not hang in an active state, it shows ``running`` while its process runs, and it ends
    ``succeeded`` exactly once.
    """
    d = crash_daemon

    async def scenario() -> None:
        await d.start()
        go = d.root / f"go-{crash_point}"  # the re-adopted job ends once the test saw it run (not on a timer)
        script = (f"while [ ! -e {go} ]; do sleep 0.1; done; echo {MARKER}" if crash_point == "before_mark_running"
                  else f"sleep 1; echo {MARKER}")
        async with d.client() as c:
            job_id = (await c.submit(d.spec(script))).id
        run_dir = d.run_dir(job_id, 1)

        async def running() -> bool:
            return (run_dir / "job.json").exists() and (await _job(d, job_id)).status == "running"

        await _wait_for(running, 15.0, "the job to run")
        d.kill9()
        if crash_point == "after_exit_recorded":

            async def exited() -> bool:
                return (run_dir / "exit.json").exists()

            await _wait_for(exited, 10.0, "the job to exit while the daemon is down")
            _simulate_kill_after_exit_recorded(d, job_id)
        else:
            _simulate_kill_before_mark_running(d, job_id)
        restart_wall = time.time()
        await d.start()

        if crash_point == "before_mark_running":
            view = await _job(d, job_id)
            assert _adopted(view, 1, restart_wall), _history(view)
            assert not (run_dir / "exit.json").exists(), "the job ended too early for this test"
            assert view.status == "running", f"re-adopted while its process runs, yet:\n{_history(view)}"
            go.touch()

        async def ended() -> bool:
            return (await _job(d, job_id)).status in TERMINAL

        try:
            await _wait_for(ended, 10.0, "the job to end")
        except AssertionError:
            raise AssertionError(f"the job hangs after the restart:\n{_history(await _job(d, job_id))}") from None
        view = await _job(d, job_id)
        assert (view.status, view.exit_code) == ("succeeded", 0), _history(view)
        assert d.markers(run_dir) == 1
        assert d.stop() == 0
        assert d.integrity_check() == "ok"

    asyncio.run(scenario())


SLOW_WATCHDOG_SITECUSTOMIZE = '''\
"""Test fault injection: while FLAG exists, a gpulayerd watchdog's interpreter starts slowly."""
import os, time
try:
    with open("/proc/self/cmdline", "rb") as f:
        _argv = f.read().split(b"\\0")
except OSError:
    _argv = []
if b"gpulayerd.runs.watchdog" in _argv and os.path.exists({flag!r}):
    time.sleep({delay_s!r})
if b"gpulayerd.runs.zygote" in _argv:
    # A zygote hands each start to a watchdog it forked (ahead of the start, or then), whose first
    # step is to enter the run directory: that watchdog starts slowly.
    _chdir = os.chdir

    def _slow_chdir(path):
        if os.path.exists({flag!r}):
            time.sleep({delay_s!r})
        _chdir(path)

    os.chdir = _slow_chdir
'''


def test_restart_while_a_watchdog_is_starting_never_runs_the_job_twice(crash_daemon: CrashDaemon) -> None:
    """SIGKILL after the claim and the watchdog's launch, before the watchdog wrote ``watchdog.json``.

    On a loaded machine a watchdog's interpreter can take longer to start than the daemon
    takes to restart. Recovery then finds a claimed attempt with no ``watchdog.json``; the
    watchdog is alive and will start the job. Correct: the job runs once (the attempt is
    re-adopted, or its watchdog stopped before it starts the job), never twice.
    """
    d = crash_daemon
    inject = d.root / "inject"
    inject.mkdir()
    flag = d.root / "slow-watchdog"
    (inject / "sitecustomize.py").write_text(SLOW_WATCHDOG_SITECUSTOMIZE.format(flag=str(flag), delay_s=4.0))
    d.env["PYTHONPATH"] = str(inject) + (os.pathsep + d.env["PYTHONPATH"] if d.env.get("PYTHONPATH") else "")

    async def scenario() -> None:
        await d.start()
        flag.touch()
        async with d.client() as c:
            job_id = (await c.submit(d.spec(f"echo {MARKER}; sleep 0.5"))).id
        run_dir = d.run_dir(job_id, 1)

        async def launched() -> bool:
            return (run_dir / "launch.json").exists()

        await _wait_for(launched, 15.0, "the watchdog's launch")
        await asyncio.sleep(0.2)
        assert not (run_dir / "watchdog.json").exists(), "the watchdog started too fast for this test"
        d.kill9()
        flag.unlink()  # watchdogs started from now on start at once
        await d.start()

        async def ended() -> bool:
            view = await _job(d, job_id)
            return view.status in TERMINAL and not d.running_on_disk()

        await _wait_for(ended, 20.0, "the job to end")
        # Let attempt 1's slow watchdog finish starting, whatever recovery decided about it.
        await asyncio.sleep(4.5)

        async def quiet() -> bool:
            return not d.running_on_disk()

        await _wait_for(quiet, 10.0, "every started job to end")
        view = await _job(d, job_id)
        runs = {a: d.markers(d.run_dir(job_id, a)) for a in range(1, view.attempt + 1)}
        assert sum(runs.values()) == 1, f"the job ran {sum(runs.values())} times {runs}:\n{_history(view)}"
        assert view.status == "succeeded", _history(view)

    asyncio.run(scenario())
