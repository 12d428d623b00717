"""A LAN of gpulayerd hosts in network namespaces, for tests of the peer protocol.

Layout of a :class:`Lan` with prefix ``P`` (``gl`` + 6 hex digits, unique to the run)::

    netns P-br:  br0 (bridge, up, multicast snooping off)  <- ports h1 .. hN
    netns P-hI:  lo, eth0 = 10.77.K.I/24 (veth peer of port hI), route 224.0.0.0/4 dev eth0

Nothing is created in the root namespace: the veth pairs are made directly between the
bridge namespace and each host namespace, and the /24 ``10.77.K.0/24`` is one the root
namespace has no address or route in. IPv6 is off in every namespace unless
``Lan(ipv6=True)``.

Every command of a host (``Host.run``, ``Host.cli``, the daemon) runs as
``ip netns exec P-hI unshare --uts sh -c 'echo P-hI > /proc/sys/kernel/hostname; exec CMD'``:
in the host's network namespace and with its own host name (``socket.gethostname()``
is ``P-hI``), so daemons do not all announce the same name.

A host's files live in ``/tmp/P/hI/`` (short, for the unix socket): ``state/`` (the
daemon's state dir), ``locks/`` (its device lock dir), ``bin/`` (its fake tools, first
on its PATH), ``work/`` (the cwd of its commands) and ``gpulayerd.log``.

GPUs: unless ``Lan(real_gpus=True)``, every host has a fake ``nvidia-smi`` (tests/fakes)
on its PATH that reports no GPU, so a host without fake GPUs has none even on a machine
with real ones; :meth:`Host.set_fake_gpus` (or ``start_daemon(fake_gpus=...)``) gives it
some. Both the daemon and ``gpulayer devices`` (which probes locally) see them.

Teardown (:meth:`Lan.close`, run by the context manager, the pytest fixtures and an
atexit hook) SIGTERMs the daemons, SIGKILLs every process left in the namespaces, deletes
the namespaces (which destroys the veth pairs and the bridge) and removes ``/tmp/P``.
:func:`sweep_stale` removes what a killed test run left behind (namespaces whose owner
process, recorded in ``/tmp/P/owner``, is gone).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

from gpulayerd.api.client import DaemonClient
from gpulayerd.config import socket_path_for
from gpulayerd.models import JobView
from tests.fakes import COMPUTE_APPS_ARGV, FakeTool, gpu_query_argv, install_fake_tool, response, smi_header
from tests.fakes.envcache import keep_env_cache, seed_env_cache

__all__ = [
    "FAST_CLUSTER",
    "GPULAYER",
    "GPULAYERD",
    "TERMINAL_STATES",
    "DaemonSettings",
    "FakeGpus",
    "Host",
    "Lan",
    "LanError",
    "check_environment",
    "netns_list",
    "netns_pids",
    "sweep_stale",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
NETNS_DIR = Path("/run/netns")
NAME_RE = re.compile(r"^(gl[0-9a-f]{6})-(br|h\d+)$")
BRIDGE = "br0"
MCAST_TABLE = "gl_mcast"
START_TIMEOUT_S = 45.0  # the first environment probe imports torch (~2 s, more on a loaded machine)
_SET_HOSTNAME = 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"'

# Daemon settings written to each host's --config file (override per daemon with config=...).
DaemonSettings = dict[str, Any]
DEFAULT_SETTINGS: DaemonSettings = {
    "cancel_grace_s": 1.0,
    "watchdog_poll_interval_s": 0.1,
    "schedule_interval_s": 0.5,
    "probe_interval_s": 300.0,
}

# Short cluster timings for tests (heartbeats, failure detection, leases, offers).
FAST_CLUSTER: DaemonSettings = {
    "heartbeat_interval_s": 0.5,
    "suspect_after_s": 2.0,
    "down_after_s": 4.0,
    "lease_grace_s": 2.0,
    "schedule_interval_s": 1.0,
    "offer_interval_s": 1.0,
    "peer_timeout_s": 2.0,
}
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost", "rejected"})

_T = TypeVar("_T")


class LanError(RuntimeError):
    """Setting up or tearing down the namespaces failed."""


def _tool(name: str) -> str:
    """The venv's console script ``name`` (beside this interpreter, else the repo's .venv, else PATH)."""
    for d in (Path(sys.executable).parent, REPO_ROOT / ".venv" / "bin"):
        if (d / name).is_file():
            return str(d / name)
    found = shutil.which(name)
    if found is None:
        raise LanError(f"{name} is not installed (pip install -e .)")
    return found


GPULAYERD = _tool("gpulayerd")
GPULAYER = _tool("gpulayer")


def _sh(argv: Sequence[str], *, input_text: str | None = None, check: bool = True,
        timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), input=input_text, capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and r.returncode != 0:
        raise LanError(f"{' '.join(argv)} -> exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _sh(["ip", *args], check=check)


# ----------------------------------------------------------------------------- namespaces


def netns_list() -> list[str]:
    """Names of every named network namespace (``ip netns list``)."""
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _ns_id(ns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_DIR / ns)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pids_in(ns_id: tuple[int, int]) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/{entry.name}/ns/net")
            if (st.st_dev, st.st_ino) == ns_id:
                out.append(int(entry.name))
    return out


def netns_pids(ns: str) -> list[int]:
    """Live processes in network namespace ``ns`` (what ``ip netns pids`` lists; zombies have none)."""
    ns_id = _ns_id(ns)
    return [] if ns_id is None else _pids_in(ns_id)


def _kill_netns_processes(ns: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL every process in ``ns`` until none is left; returns the pids killed."""
    ns_id = _ns_id(ns)
    if ns_id is None:
        return []
    killed: list[int] = []
    end = time.monotonic() + timeout_s
    while True:
        pids = _pids_in(ns_id)
        if not pids:
            return killed
        if time.monotonic() > end:
            raise LanError(f"processes {pids} in netns {ns} survive SIGKILL")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.02)


def _delete_netns(ns: str) -> None:
    if not (NETNS_DIR / ns).exists():
        return
    _kill_netns_processes(ns)
    _ip("netns", "del", ns)


def _in_ns(ns: str, script: str) -> None:
    _sh(["ip", "netns", "exec", ns, "sh", "-c", script])


# ------------------------------------------------------------------------- owners, sweeping

_LIVE: dict[str, Lan] = {}  # prefix -> open Lan of this process


def _owner_tag(pid: int) -> str:
    return f"{pid} {psutil.Process(pid).create_time():.3f}"


def _owner_alive(root: Path) -> bool:
    try:
        pid_s, created = (root / "owner").read_text(encoding="ascii").split()
        return _owner_tag(int(pid_s)) == f"{pid_s} {created}"
    except (OSError, ValueError, psutil.Error):
        return False


def sweep_stale() -> list[str]:
    """Delete namespaces (and ``/tmp/P``) left by earlier runs whose owner process is gone.

    A namespace named like ours (``glXXXXXX-br``/``-hN``) is stale when ``/tmp/P/owner``
    is missing or names a dead process; live Lans of any process are left alone.
    Returns the namespaces removed.
    """
    removed = []
    for ns in netns_list():
        m = NAME_RE.match(ns)
        if m is None or m.group(1) in _LIVE:
            continue
        root = Path(tempfile.gettempdir()) / m.group(1)
        if _owner_alive(root):
            continue
        with contextlib.suppress(LanError, subprocess.SubprocessError):
            _delete_netns(ns)
            removed.append(ns)
        shutil.rmtree(root, ignore_errors=True)
    return removed


@atexit.register
def _close_all_at_exit() -> None:
    for lan in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            lan.close()


def check_environment() -> list[str]:
    """Why LAN tests cannot run here (empty when they can): root, ip netns, nft, ping, unshare."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"not root (euid {os.geteuid()}): network namespaces need root")
    missing = [t for t in ("ip", "nft", "ping", "unshare") if shutil.which(t) is None]
    if missing:
        problems.append(f"missing tools {missing} (Debian: apt-get install iproute2 nftables iputils-ping "
                        "util-linux)")
    if not problems:
        ns = f"glchk{secrets.token_hex(3)}"
        try:
            _ip("netns", "add", ns)
            _sh(["ip", "netns", "exec", ns, "unshare", "--uts", "true"])
            _ip("-n", ns, "link", "add", BRIDGE, "type", "bridge")
            _sh(["ip", "netns", "exec", ns, "nft", "add", "table", "bridge", MCAST_TABLE])
        except (LanError, OSError, subprocess.SubprocessError) as e:
            problems.append(f"cannot create a network namespace with a bridge and nft: {e}")
        finally:
            _ip("netns", "del", ns, check=False)
    return problems


# ------------------------------------------------------------------------------ fake GPUs


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    memory_mib: int
    name: str
    compute_cap: str = "8.6"

    def row(self) -> str:
        return f"{self.index}, {self.uuid}, {self.name}, {self.memory_mib}, 0, {self.compute_cap}, 550.54.15\n"


class FakeGpus:
    """The fake nvidia-smi in a host's bin dir; its scenario is re-read on every call."""

    def __init__(self, bin_dir: Path) -> None:
        self.token = secrets.token_hex(4)
        self.gpus: list[FakeGpu] = []
        self.tool: FakeTool = install_fake_tool(bin_dir, "nvidia-smi", [])
        self._apps: list[tuple[int, int]] = []

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    def set(self, gpus: Sequence[int | tuple[int, str]] | Mapping[str, Any]) -> None:
        """GPUs by memory in MiB (``[24576, 24576]``: two 24 GiB cards; ``[]``: none), each
        optionally with its compute capability (``[(16384, "7.5")]``; default 8.6), or a
        raw scenario mapping for the fake (``{"responses": [...], "default": ...}``)."""
        if isinstance(gpus, Mapping):
            self.gpus = []
            self._write(dict(gpus))
            return
        specs = [(g, "8.6") if isinstance(g, int) else (int(g[0]), str(g[1])) for g in gpus]
        self.gpus = [FakeGpu(i, f"GPU-{self.token}-0000-4000-8000-{i:012x}", m, f"NVIDIA Fake {m // 1024}GB", cc)
                     for i, (m, cc) in enumerate(specs)]
        self.set_apps(self._apps)

    def set_apps(self, apps: Sequence[tuple[int, int]]) -> None:
        """Compute processes as (GPU index, pid) pairs; empty: "No running processes found"."""
        self._apps = list(apps)
        rows = "".join(f"{self.gpus[i].uuid}, {pid}, 100\n" for i, pid in apps) or "No running processes found\n"
        self._write({"responses": [
            response(gpu_query_argv(), "".join(g.row() for g in self.gpus)),
            response(COMPUTE_APPS_ARGV, rows),
            smi_header(),  # plain nvidia-smi: the banner with the driver's CUDA Version
        ]})

    def _write(self, scenario: dict[str, Any]) -> None:
        path = self.tool.path.with_name("nvidia-smi.json")
        tmp = path.with_name(".nvidia-smi.json.tmp")
        tmp.write_text(json.dumps(scenario), encoding="utf-8")
        os.replace(tmp, path)  # never a half-written file


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


# ---------------------------------------------------------------------------------- hosts


class Host:
    """One machine of the LAN: a network namespace with eth0 on the bridge, and its daemon."""

    def __init__(self, lan: Lan, index: int, ip: str) -> None:
        self.lan = lan
        self.index = index
        self.name = f"h{index}"
        self.ns = f"{lan.prefix}-{self.name}"
        self.hostname = self.ns
        self.ip = ip
        self.port = self.name  # the bridge port (in lan.bridge_ns) this host's eth0 is wired to
        self.root = lan.root / self.name
        self.state_dir = self.root / "state"
        self.lock_dir = self.root / "locks"
        self.bin_dir = self.root / "bin"
        self.work = self.root / "work"
        self.log_path = self.root / "gpulayerd.log"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.daemon_state_dir = self.state_dir
        self.fake: FakeGpus | None = None
        self.procs: list[subprocess.Popen[Any]] = []
        for d in (self.state_dir.parent, self.lock_dir, self.bin_dir, self.work):
            d.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"Host({self.name}, ns={self.ns}, ip={self.ip})"

    # ---- commands in the namespace

    def argv(self, cmd: Sequence[str] | str) -> list[str]:
        """``cmd`` wrapped to run in this host's namespace under its host name (a str runs via sh -c)."""
        cmd = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", _SET_HOSTNAME, self.hostname, *cmd]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment without GPULAYER_*, with the host's bin dir first on PATH."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        if not self.lan.real_gpus or self.fake is not None:
            env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        env.update(extra or {})
        return env

    def run(self, cmd: Sequence[str] | str, *, check: bool = False, timeout_s: float = 60.0,
            env: Mapping[str, str] | None = None, input: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in this host and wait; stdout/stderr captured as text."""
        r = subprocess.run(self.argv(cmd), input=input, capture_output=True, text=True, timeout=timeout_s,
                           env=self.env(env), cwd=cwd or self.work, check=False)
        if check and r.returncode != 0:
            raise AssertionError(f"[{self.name}] {cmd} -> exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def popen(self, cmd: Sequence[str] | str, *, env: Mapping[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[Any]:
        """Start ``cmd`` in this host (Popen keywords pass through; stdin defaults to /dev/null);
        it is killed at teardown like everything else in the namespace."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("cwd", self.work)
        p: subprocess.Popen[Any] = subprocess.Popen(self.argv(cmd), env=self.env(env), **kw)
        self.procs.append(p)
        return p

    def ping(self, other: Host | str, *, count: int = 1, timeout_s: int = 1) -> bool:
        ip = other.ip if isinstance(other, Host) else other
        return self.run(["ping", "-n", "-q", "-c", str(count), "-W", str(timeout_s), ip]).returncode == 0

    # ---- fake GPUs

    def set_fake_gpus(self, gpus: Sequence[int | tuple[int, str]] | Mapping[str, Any]) -> FakeGpus:
        """Give this host fake NVIDIA GPUs (memory per GPU in MiB, optionally with its compute
        capability as ``(mib, "7.5")``, or a raw fake scenario).

        Changes are seen at the next nvidia-smi call (a running daemon re-probes every
        probe_interval_s)."""
        if self.fake is None:
            self.fake = FakeGpus(self.bin_dir)
        self.fake.set(gpus)
        return self.fake

    # ---- the daemon

    @property
    def socket_path(self) -> Path:
        return socket_path_for(self.daemon_state_dir)

    def start_daemon(self, state_dir: Path | None = None, extra_args: Sequence[str] = (),
                     fake_gpus: Sequence[int | tuple[int, str]] | Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None, *, config: Mapping[str, Any] | None = None,
                     cpu_slots: int = 2, wait: bool = True, timeout_s: float = START_TIMEOUT_S,
                     log_level: str = "DEBUG") -> subprocess.Popen[bytes]:
        """Start ``gpulayerd --state-dir S --device-lock-dir L --cpu-slots N --config C EXTRA...``
        in this host; output appends to :attr:`log_path`. ``config`` overrides
        :data:`DEFAULT_SETTINGS`. With ``wait`` it returns once the local API answers."""
        if self.daemon is not None and self.daemon.poll() is None:
            raise AssertionError(f"{self.name} already runs a daemon (pid {self.daemon.pid})")
        if fake_gpus is not None:
            self.set_fake_gpus(fake_gpus)
        state = Path(state_dir) if state_dir is not None else self.state_dir
        self.daemon_state_dir = state
        seed_env_cache(state)
        cfg = self.root / "gpulayerd.toml"
        cfg.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in {**DEFAULT_SETTINGS, **(config or {})}.items()),
                       encoding="utf-8")
        argv = [GPULAYERD, "--state-dir", str(state), "--device-lock-dir", str(self.lock_dir),
                "--cpu-slots", str(cpu_slots), "--config", str(cfg), "--log-level", log_level, *extra_args]
        with open(self.log_path, "ab") as log:
            log.write(f"===== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            self.daemon = subprocess.Popen(self.argv(argv), env=self.env(env), cwd=self.work,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_daemon(timeout_s)
        return self.daemon

    def wait_daemon(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the local API answers ``GET /v1/devices`` (the first probe is done)."""
        proc = self.daemon
        if proc is None:
            raise AssertionError(f"{self.name}: no daemon started")
        end = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"[{self.name}] gpulayerd exited with {proc.returncode}\n{self.log_tail()}")
            if self.socket_path.exists():
                try:
                    self.api(lambda c: c.devices(), timeout_s=max(1.0, end - time.monotonic()))
                    keep_env_cache(self.daemon_state_dir)
                    return
                except Exception:
                    if time.monotonic() > end:
                        raise
            if time.monotonic() > end:
                raise AssertionError(f"[{self.name}] gpulayerd did not answer within {timeout_s} s\n{self.log_tail()}")
            time.sleep(0.05)

    def kill_daemon(self, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int | None:
        """Send ``sig`` to the daemon; for SIGKILL/SIGTERM/SIGINT wait for it to exit and
        return its exit code (None for other signals, or when no daemon runs)."""
        proc = self.daemon
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(sig)
        if sig not in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            return None
        return proc.wait(timeout_s)

    def stop_daemon(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code."""
        proc = self.daemon
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        keep_env_cache(self.daemon_state_dir)
        return proc.returncode

    def daemon_running(self) -> bool:
        return self.daemon is not None and self.daemon.poll() is None

    def log_tail(self, n_bytes: int = 8000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", "replace")
        except OSError:
            return "(no daemon log)"

    def api(self, fn: Callable[[DaemonClient], Awaitable[_T]], timeout_s: float = 10.0) -> _T:
        """Call the daemon's local API (unix sockets work across network namespaces)."""
        async def go() -> _T:
            async with DaemonClient(self.socket_path, timeout_s=timeout_s) as c:
                return await fn(c)

        return asyncio.run(go())

    def submit(self, spec: Mapping[str, Any]) -> JobView:
        """Submit a job spec mapping through the local API (``workdir`` defaults to :attr:`work`)."""
        body = {"workdir": str(self.work), **spec}
        return self.api(lambda c: c.submit(body))

    def job(self, job_id: str) -> JobView:
        """``GET /v1/jobs/ID`` (attempts and events included)."""
        return self.api(lambda c: c.job(job_id))

    def wait_job(self, job_id: str, states: Iterable[str] = TERMINAL_STATES, timeout_s: float = 30.0,
                 interval_s: float = 0.1) -> JobView:
        """Poll the job until its status is one of ``states``; returns its view."""
        wanted = set(states)
        last: list[JobView] = []

        def reached() -> JobView | None:
            view = self.job(job_id)
            last[:] = [view]
            return view if view.status in wanted else None

        try:
            view = self.lan.wait(reached, timeout_s=timeout_s, interval_s=interval_s,
                                 what=f"[{self.name}] job {job_id} to be {'/'.join(sorted(wanted))}")
            assert view is not None  # wait() returns only a truthy result
            return view
        except AssertionError as e:
            seen = last[0] if last else None
            raise AssertionError(f"{e}; it is {seen.status if seen else '?'}: "
                                 f"{seen.reason if seen else ''}") from None

    def peer_states(self) -> dict[str, tuple[str, bool]]:
        """node id -> (state, trusted) of every peer this daemon lists (itself excluded)."""
        return {p.node_id: (p.state, p.trusted) for p in self.api(lambda c: c.peers()) if p.state != "self"}

    # ---- the CLI

    def cli(self, *args: str, state_dir: Path | None = None, check: bool = False, timeout_s: float = 60.0,
            env: Mapping[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``gpulayer --state-dir S ARGS...`` in this host (S: the daemon's state dir)."""
        state = state_dir if state_dir is not None else self.daemon_state_dir
        return self.run([GPULAYER, "--state-dir", str(state), *args], check=check, timeout_s=timeout_s, env=env,
                        cwd=cwd)

    def cli_ok(self, *args: str, **kw: Any) -> str:
        return self.cli(*args, check=True, **kw).stdout

    def cli_json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.cli_ok(*args, **kw))

    def cluster_init(self, *args: str) -> str:
        """``gpulayer cluster init ARGS``; returns the join token it printed."""
        out = self.cli_ok("cluster", "init", *args)
        tokens = [line.strip() for line in out.splitlines() if line.strip().startswith("gpl2.")]
        assert len(tokens) == 1, f"[{self.name}] gpulayer cluster init printed no token:\n{out}"
        return tokens[0]

    def cluster_join(self, token: str, *args: str, token_file: bool = False,
                     check: bool = True) -> subprocess.CompletedProcess[str]:
        """``gpulayer cluster join -`` with ``token`` on stdin (or ``--token-file`` with ``token_file``):
        an ONLINE enrollment, so the token's signer must run."""
        argv = [GPULAYER, "--state-dir", str(self.daemon_state_dir), "cluster", "join"]
        if token_file:
            path = self.root / "join-token"
            path.write_text(token + "\n")
            r = self.run([*argv, "--token-file", str(path), *args], timeout_s=60)
        else:
            r = self.run([*argv, "-", *args], input=token + "\n", timeout_s=60)
        if check and r.returncode != 0:
            raise AssertionError(f"[{self.name}] cluster join -> exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    @property
    def node_id(self) -> str:
        """This host's node id (from its state dir's identity; made on first use)."""
        from gpulayerd.net.identity import load_or_create_identity

        return load_or_create_identity(self.daemon_state_dir).node_id

    @property
    def identity_dir(self) -> Path:
        """``<state>/identity``: node.key, node.crt, ca.crt (and ca.key on the founding host)."""
        return self.daemon_state_dir / "identity"

    # ---- the wire

    def link_down(self) -> None:
        """Unplug this host: its bridge port goes down (eth0 loses carrier)."""
        _ip("-n", self.lan.bridge_ns, "link", "set", self.port, "down")

    def link_up(self) -> None:
        _ip("-n", self.lan.bridge_ns, "link", "set", self.port, "up")

    def endpoint(self, port: int) -> str:
        """``IP:PORT`` of this host, for --listen/--peer."""
        return f"{self.ip}:{port}"


# ------------------------------------------------------------------------------------ Lan


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for line in _ip(*args, check=False).stdout.splitlines():
            for tok in line.split():
                with contextlib.suppress(ValueError):
                    if "/" in tok or tok[:1].isdigit():
                        nets.append(ipaddress.IPv4Network(tok, strict=False))
    return nets


def _free_subnet() -> ipaddress.IPv4Network:
    used = [n for n in _used_networks() if n.prefixlen > 0]
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for k in candidates:
        net = ipaddress.IPv4Network(f"10.77.{k}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise LanError("no free 10.77.K.0/24 on this machine")


class Lan:
    """N hosts (``Lan.host(1..N)``) in network namespaces on one bridge; see the module doc.

    Use as a context manager (or call :meth:`up` / :meth:`close`); teardown always runs.
    """

    def __init__(self, n_hosts: int = 3, *, ipv6: bool = False, real_gpus: bool = False) -> None:
        if not 1 <= n_hosts <= 250:
            raise ValueError("n_hosts must be 1..250")
        self.n_hosts = n_hosts
        self.ipv6 = ipv6
        self.real_gpus = real_gpus
        self.prefix = "gl" + secrets.token_hex(3)
        self.bridge_ns = f"{self.prefix}-br"
        self.root = Path(tempfile.gettempdir()) / self.prefix
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: list[Host] = []
        self._mcast_blocked: set[str] | None = set()  # bridge ports; None: every port
        self._closed = False
        self._up = False

    # ---- lifecycle

    def __enter__(self) -> Lan:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close(dump_logs=exc[0] is not None)

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(f"{self.prefix}-h{i}" for i in range(1, self.n_hosts + 1))]

    def up(self) -> Lan:
        if self._up:
            return self
        self._up = True
        self.root.mkdir(mode=0o755)
        (self.root / "owner").write_text(_owner_tag(os.getpid()), encoding="ascii")  # before any namespace
        _LIVE[self.prefix] = self
        try:
            self.subnet = _free_subnet()
            self._add_ns(self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "add", BRIDGE, "type", "bridge", "mcast_snooping", "0", "stp_state", "0")
            _ip("-n", self.bridge_ns, "link", "set", BRIDGE, "up")
            for i in range(1, self.n_hosts + 1):
                host = Host(self, i, str(self.subnet.network_address + i))
                self.hosts.append(host)
                self._add_ns(host.ns)
                _ip("-n", self.bridge_ns, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                    "netns", host.ns)
                _ip("-n", self.bridge_ns, "link", "set", host.port, "master", BRIDGE, "up")
                _ip("-n", host.ns, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}", "dev", "eth0")
                _ip("-n", host.ns, "link", "set", "eth0", "multicast", "on", "up")
                _ip("-n", host.ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
                if not self.real_gpus:
                    host.set_fake_gpus([])
            snooping = Path(f"/sys/class/net/{BRIDGE}/bridge/multicast_snooping")
            r = _sh(["ip", "netns", "exec", self.bridge_ns, "cat", str(snooping)])
            if r.stdout.strip() != "0":
                raise LanError(f"multicast snooping is still on in {self.bridge_ns}")
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        if not self.ipv6:
            _in_ns(ns, "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
                       "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6")
        _ip("-n", ns, "link", "set", "lo", "up")

    def close(self, dump_logs: bool = False) -> None:
        """Stop the daemons, kill every process in the namespaces, delete them and /tmp/P.

        Idempotent. Every step runs even when an earlier one fails; the first error is
        raised at the end."""
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        # SIGTERM every daemon at once, then give them together a short grace.
        running = [h for h in self.hosts if h.daemon_running()]
        for h in running:
            with contextlib.suppress(ProcessLookupError):
                h.daemon.terminate()  # type: ignore[union-attr]
        end = time.monotonic() + 3.0
        for h in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.daemon.wait(max(0.01, end - time.monotonic()))  # type: ignore[union-attr]
        if dump_logs:
            for h in self.hosts:
                if h.log_path.exists():
                    print(f"===== {h.name} ({h.ns}, {h.ip}) {h.log_path}\n{h.log_tail()}")
        for ns in self.namespaces:
            try:
                _kill_netns_processes(ns)
            except BaseException as e:
                errors.append(e)
        for h in self.hosts:
            for p in [*h.procs, *([h.daemon] if h.daemon is not None else [])]:
                try:
                    if p.poll() is None:
                        p.kill()
                    p.wait(5)
                except BaseException as e:
                    errors.append(e)
                for stream in (p.stdout, p.stderr):
                    if stream is not None:
                        with contextlib.suppress(OSError):
                            stream.close()
        for ns in reversed(self.namespaces):
            try:
                _delete_netns(ns)
            except BaseException as e:
                errors.append(e)
        shutil.rmtree(self.root, ignore_errors=True)
        _LIVE.pop(self.prefix, None)
        if errors:
            raise LanError(f"teardown of {self.prefix}: {errors[0]!r}") from errors[0]

    # ---- access

    def host(self, i: int) -> Host:
        """Host ``i``, counting from 1."""
        if not 1 <= i <= len(self.hosts):
            raise IndexError(f"host {i}: this Lan has hosts 1..{len(self.hosts)}")
        return self.hosts[i - 1]

    def __iter__(self) -> Any:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def form_cluster(self, *hosts: Host) -> str:
        """Put ``hosts`` (default: all) in one new cluster without the CLI (the same library
        calls as ``gpulayer cluster init`` on the first and ``cluster join`` on the others,
        about 1.5 s cheaper per host), enrolling the others OFFLINE through the first one's files
        (no daemon needs to run). Returns the join token (used up)."""
        from gpulayerd.net.ca import cluster_init, cluster_join

        members = list(hosts) or self.hosts
        first = members[0]
        token = cluster_init(first.daemon_state_dir, None, uses=max(1, len(members) - 1),
                             addresses=[f"{first.ip}:7172"])
        for h in members[1:]:  # offline enrollment: the token is checked and consumed in the signer's files
            cluster_join(h.daemon_state_dir, token, signer=first.daemon_state_dir)
        return token

    def wait_cluster(self, *hosts: Host, timeout_s: float = 15.0, capabilities: bool = True,
                     interval_s: float = 0.05) -> float:
        """Until every daemon of ``hosts`` (default: all running) lists each other one as up
        and trusted (and, with ``capabilities``, knows its capabilities). Returns the time
        waited in seconds."""
        members = list(hosts) or [h for h in self.hosts if h.daemon_running()]
        ids = {h.name: h.node_id for h in members}
        t0 = time.monotonic()
        state: dict[str, object] = {}

        def formed() -> bool:
            for h in members:
                peers = {p.node_id: p for p in h.api(lambda c: c.peers())}
                state[h.name] = {o: (peers[ids[o]].state, peers[ids[o]].trusted) if ids[o] in peers else None
                                 for o in ids if o != h.name}
                for other, nid in ids.items():
                    if other == h.name:
                        continue
                    p = peers.get(nid)
                    if p is None or p.state != "up" or not p.trusted or (capabilities and p.capabilities is None):
                        return False
            return True

        try:
            self.wait(formed, timeout_s=timeout_s, interval_s=interval_s, what="the cluster to form")
        except AssertionError as e:
            raise AssertionError(f"{e}; peers seen: {state}") from None
        return time.monotonic() - t0

    # ---- multicast on the bridge

    def drop_multicast(self, *hosts: Host) -> None:
        """The bridge drops IPv4 multicast (and IPv6 multicast UDP, e.g. mDNS on ff02::fb)
        from and to ``hosts`` (all hosts when none given). Unicast, ARP and broadcast still
        pass. Cumulative; undo with :meth:`allow_multicast`."""
        if not hosts:
            self._mcast_blocked = None
        elif self._mcast_blocked is not None:
            self._mcast_blocked |= {h.port for h in hosts}
        self._apply_mcast_rules()

    def allow_multicast(self, *hosts: Host) -> None:
        """Undo :meth:`drop_multicast` for ``hosts`` (for every host when none given)."""
        if not hosts:
            self._mcast_blocked = set()
        elif self._mcast_blocked is None:
            self._mcast_blocked = {h.port for h in self.hosts} - {h.port for h in hosts}
        else:
            self._mcast_blocked -= {h.port for h in hosts}
        self._apply_mcast_rules()

    def _apply_mcast_rules(self) -> None:
        blocked = self._mcast_blocked
        rules: list[str] = []
        matches = [""] if blocked is None else [] if not blocked else [
            f"iifname {{ {', '.join(json.dumps(p) for p in sorted(blocked))} }} ",
            f"oifname {{ {', '.join(json.dumps(p) for p in sorted(blocked))} }} "]
        for m in matches:
            rules += [f"{m}ip daddr 224.0.0.0/4 drop", f"{m}ip6 daddr ff00::/8 meta l4proto udp drop"]
        script = f"add table bridge {MCAST_TABLE}\ndelete table bridge {MCAST_TABLE}\n"
        if rules:
            body = "\n".join(f"    {r}" for r in rules)
            script += (f"table bridge {MCAST_TABLE} {{\n  chain forward {{\n"
                       f"    type filter hook forward priority 0; policy accept;\n{body}\n  }}\n}}\n")
        _sh(["ip", "netns", "exec", self.bridge_ns, "nft", "-f", "-"], input_text=script)

    # ---- waiting

    def wait(self, predicate: Callable[[], _T], timeout_s: float = 10.0, what: str | None = None,
             interval_s: float = 0.1, ignore: Iterable[type[BaseException]] = ()) -> _T:
        """Poll ``predicate`` until it returns something truthy, and return that.

        Exceptions of the types in ``ignore`` count as "not yet" (the last one is chained
        to the timeout error)."""
        ignored = tuple(ignore)
        end = time.monotonic() + timeout_s
        last: BaseException | None = None
        while True:
            try:
                result = predicate()
                if result:
                    return result
            except ignored as e:
                last = e
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout_s} s waiting for "
                                     f"{what or getattr(predicate, '__name__', predicate)}") from last
            time.sleep(interval_s)
