"""Daemon settings: embedded defaults, an optional TOML file, then command-line flags.

Every duration and size carries its unit in its name. Paths:

- state dir (SQLite file, run logs): platformdirs' user state dir, or ``--state-dir``;
- runtime dir (the local API's unix socket, directory mode 0700): platformdirs' user
  runtime dir, or ``<state dir>/run`` when ``--state-dir`` is given, so that two
  daemons with different state dirs never share a socket;
- device lock dir: machine-wide (shared by every daemon of the machine, whatever its mode),
  ``/tmp/gpulayer-locks``; it also holds ``gpulayerd.lock``, one daemon per machine;
- system mode (``--system`` or ``mode = "system"``): state in ``/var/lib/gpulayer`` and the
  socket in ``/run/gpulayer`` (0755, socket 0666), unless ``--state-dir`` / ``--runtime-dir``
  say otherwise (a state dir given alone keeps the socket in ``<state dir>/run``, which only
  root can reach: give ``--runtime-dir`` too).

The daemon makes its state, runs and socket dirs 0700 (and its database files 0600) whatever
they were, and refuses, unchanged, one owned by another account or writable by anyone
(:mod:`gpulayerd.host.privdirs`): ``--runtime-dir /tmp`` is an error, not a chmod of /tmp.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpulayerd.core.arrays import DEFAULT_MAX_ARRAY_SIZE, MAX_INDEX
from gpulayerd.core.job_policy import parse_duration
from gpulayerd.core.visible import exclusion_problem
from gpulayerd.gpu.cpus import default_cpu_slots
from gpulayerd.host.sockets import (  # the socket rule, shared with the CLI (which must not import this module)
    SYSTEM_RUNTIME_DIR,
    SYSTEM_SOCKET_PATH,
    default_runtime_dir,
    socket_path_for,
)
from gpulayerd.models import format_validation_error
from gpulayerd.slurm.settings import SlurmConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["SYSTEM_RUNTIME_DIR", "SYSTEM_SOCKET_PATH", "SYSTEM_STATE_DIR", "ConfigError", "DaemonConfig",
           "default_runtime_dir", "default_state_dir", "socket_path_for"]

SYSTEM_STATE_DIR = Path("/var/lib/gpulayer")
"""System mode's state dir (0700, root's)."""


class ConfigError(ValueError):
    """Invalid settings; the message names the setting."""


def default_state_dir() -> Path:
    """platformdirs' user state dir for gpulayer (e.g. ``~/.local/state/gpulayer``)."""
    from platformdirs import user_state_dir

    return Path(user_state_dir("gpulayer"))


def read_token(path: Path) -> str:
    """The bearer token in ``path`` (``metrics_token_file``), stripped.

    Raises:
        ValueError: missing, a symbolic link or not a regular file, owned by another account than
            root or the daemon's, readable or writable by others than its owner and group (mode at
            most 0640), or shorter than 16 characters. The file is opened without following a link
            and checked on the open descriptor (what is checked is what is read).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        why = "is a symbolic link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise ValueError(f"metrics_token_file: {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ValueError(f"metrics_token_file: {path} is not a regular file")
        with os.fdopen(fd, "rb") as f:
            if st.st_uid not in (0, os.geteuid()):
                raise ValueError(f"metrics_token_file: {path} is owned by uid {st.st_uid}; it must be owned by "
                                 f"root or by the daemon's account (uid {os.geteuid()})")
            if st.st_mode & 0o137:
                raise ValueError(f"metrics_token_file: {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be "
                                 "0640 or stricter (root and the admin group only)")
            token = f.read(4096).decode("utf-8", errors="replace").strip()
    except OSError as e:
        raise ValueError(f"metrics_token_file: {path}: {e.strerror or e}") from None
    if len(token) < 16:
        raise ValueError(f"metrics_token_file: {path} holds no token of at least 16 characters")
    return token


def _host_port(value: str, what: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` too).

    Raises:
        ValueError: naming ``what`` and the expected form.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} {value!r} is not HOST:PORT with a port from 0 to 65535 (e.g. 0.0.0.0:7171)")
    return host.strip("[]"), int(port)


class DaemonConfig(BaseModel):
    """All settings of gpulayerd.

    Attributes:
        state_dir: SQLite store and run directories (logs) live here.
        runtime_dir: the unix socket's directory (made 0700; refused if another account's or
            world-writable).
        interpreters: workload interpreters (``--python``), in preference order.
        device_lock_dir: machine-wide per-device lock files and ``gpulayerd.lock`` (one daemon per
            machine); the same for every daemon of the machine, whatever its mode.
        cpu_slots: how many CPU processes run at once (a distributed CPU job takes
            ``nproc_per_node``); default: the CPUs this process may use (its affinity mask and
            its cgroup's CPU quota, rounded down; not the host's count).
        probe_interval_s: how often hardware is probed again.
        nvidia_smi_timeout_s: hard limit for one nvidia-smi call.
        env_probe_timeout_s: hard limit for probing one interpreter.
        preflight_timeout_s: how long a job's pre-flight check may take (seconds; then it failed).
        history_keep_days: finished jobs are kept this many days (``gpulayer history``, ``report``), then removed.
        metrics_listen: HOST:PORT of the Prometheus listener (``GET /metrics`` with a bearer token); None: off
            (the local socket's ``/metrics`` is always there).
        metrics_token_file: the bearer token of ``metrics_listen`` (mode 0640 or stricter: root and the admins).
        cancel_grace_s: SIGTERM to SIGKILL delay when stopping a job (cancel, time limit).
        max_time_limit: the longest time limit a job submitted here may ask for, seconds (a duration
            such as ``"7d"`` in TOML); a job that names none gets it; None = no cap.
        lease_grace_s: extra time after a lease before an attempt is declared lost.
        watchdog_poll_interval_s: how often a job's watchdog re-reads its deadline.
        dist_timeout_s: collective timeout handed to distributed jobs
            (``GPULAYER_DIST_TIMEOUT_S``), instead of torch's 30-minute default.
        rdzv_timeout_s: torchrun rendezvous join timeout.
        workdir_timeout_s: limit for checking that a job's workdir exists (a hung network
            mount answers "did not answer within N s" instead of freezing the daemon).
        schedule_interval_s: the scheduler also wakes this often without events.
        listen: HOST:PORT of the peer API (mutual TLS; only in a cluster).
        peers: static peers HOST:PORT, for networks that block multicast.
        mdns: advertise and browse over mDNS.
        interface: the LAN interface to advertise (default: every LAN interface).
        heartbeat_interval_s: how often each peer is heartbeated.
        suspect_after_s: a peer silent this long is suspect.
        down_after_s: a peer silent this long is down.
        peer_timeout_s: limit for one call to a peer.
        peer_handshake_timeout_s: a connection to the peer port is closed if its TLS handshake
            is not done this long after it was accepted (seconds).
        peer_max_connections: open connections to the peer port, in total (lowered to half the
            open-files limit if that is smaller); more are reset as they are accepted.
        peer_max_connections_per_address: open connections to the peer port from one remote
            address; more are reset as they are accepted.
        peer_max_unauthenticated: of ``peer_max_connections``, how many may be open before their
            TLS handshake ends (strangers); when they are all taken, a new connection takes the slot
            of the oldest one from the address (then the /24) holding the most, so a flood from a
            few addresses cannot keep a member out; connections that completed mutual TLS keep theirs.
        local_max_connections: open connections to the local API's socket, in total (lowered to a
            quarter of the open-files limit if that is smaller); more are refused with one line.
        local_max_connections_per_user: open connections to the local socket from one account
            (root, admins and the daemon's own account are bounded by the total only).
        local_reserved_connections: of ``local_max_connections``, how many only root, the daemon's
            own account and members of ``admin_group`` may use (their ``gpulayer`` always answers).
        local_request_timeout_s: a request's head and body must arrive within this many seconds of
            its first byte (and a new connection's first request within this of the connection);
            else the connection is closed (a slow or stalled client keeps no slot).
        local_idle_timeout_s: a connection with no request in progress is closed after this long.
        isolated: run beside another gpulayerd of this machine (``scripts/quickstart`` beside a lab's
            daemon): no GPU is used (CPU slots only: no GPU is ever granted twice), no machine-wide
            lock is taken or checked (only the one in ``device_lock_dir``, which must then be a
            directory of its own, not the shared default), and no cluster is joined.
        offer_interval_s: a queued job is offered to the same worker again after this long.
        hold_ttl_s: how long a gang hold lasts without a commit.
        mode: ``personal`` (the daemon serves and runs the jobs of its own account only; socket
            0600 in a 0700 directory) or ``system`` (runs as root for every local account;
            socket 0666 in a 0755 directory; each request's user from the kernel).
        admin_group: members of this group (and root) may cancel any job and read any job's
            logs and environment (system mode).
        allow_root_jobs: in system mode, whether jobs of root run here at all.
        fairshare_half_life_s: half-life of a user's decayed usage (GPU-seconds and
            CPU-slot-seconds) for fair share, seconds (default one day).
        max_gpus_per_user: at most this many GPUs of this worker held by one user's jobs at
            once; None = no cap.
        exclude_gpus: GPUs this daemon never schedules, by nvidia-smi index or uuid (``GPU-...``,
            ``MIG-...``); shown ``excluded (config)`` (the daemon's own ``CUDA_VISIBLE_DEVICES``
            restricts them too: :mod:`gpulayerd.core.visible`).
        log_cap_bytes: the most of one stream (stdout or stderr) of one attempt kept on disk,
            bytes; the rest is dropped with a note (the state disk is shared).
        max_array_size: the most tasks one job array may have (``--array``; default 10,000).
        ship: a lab default: ``gpulayer submit`` ships the workdir (``--ship``) of every job submitted
            here that does not say otherwise (``--no-ship``, ``ship = false`` in its file).
        ship_max_snapshot_mb: the most one shipped snapshot's distinct contents may hold (``--ship``;
            MB = 10^6 bytes); over it, the submit is refused naming the largest files.
        ship_user_quota_mb: the most the snapshots of one user stored here may hold, MB.
        ship_total_mb: the most all snapshots stored here may hold, MB.
        ship_keep_days: a snapshot no queued or running job names is removed this many days after its
            last submit (and sooner, least recently used first, when its user's quota is needed).
        ship_reserve_mb: the free space the snapshots leave on the state disk (the database's), MB.
        ship_cache_mb: the most a worker's cache of shipped contents keeps, MB (least recently used dropped).
        ship_transfer_timeout_s: the longest a worker's fetch and unpack of a shipped job may take, seconds
            (its lease is renewed meanwhile); past it the job is re-queued with ``Transfer: ...``.
        ship_fetch_mb_per_s: the most a worker's fetches of shipped contents move per second, MB
            (0: no limit), so a cold transfer does not take the whole LAN.
        ship_outputs_mb: the most bytes of outputs (``--output``) one attempt brings back, MB (and
            the most one ``gpulayer fetch`` gets).
        ship_keep_s: how long a worker keeps an ended shipped attempt's tree (for ``gpulayer fetch``),
            seconds (default a day); then it is removed.
        ship_tree_dir: where workers make per-attempt trees of shipped jobs (default
            ``<state dir>/trees``; system mode ``/var/tmp/gpulayer-trees``: jobs' users must enter it).
        allow_virtual_mps: schedule the Apple GPU of a macOS virtual machine (``kern.hv_vmm_present``
            = 1) as ``mps``; off by default, since Metal in a VM is paravirtual and partial.
        slurm: the ``[slurm]`` section: this daemon is a worker backed by a Slurm cluster
            (:class:`~gpulayerd.slurm.settings.SlurmConfig`); None: a workstation.
    """

    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Field(default_factory=default_state_dir)
    runtime_dir: Path | None = None
    interpreters: list[str] = Field(default_factory=lambda: [sys.executable])
    device_lock_dir: Path = Path("/tmp/gpulayer-locks")
    cpu_slots: int | None = Field(default=None, ge=1)
    probe_interval_s: float = Field(default=30.0, gt=0)
    nvidia_smi_timeout_s: float = Field(default=20.0, gt=0)
    env_probe_timeout_s: float = Field(default=60.0, gt=0)
    preflight_timeout_s: float = Field(default=60.0, gt=0)
    history_keep_days: float = Field(default=90.0, gt=0)
    metrics_listen: str | None = None
    metrics_token_file: Path | None = None
    cancel_grace_s: float = Field(default=10.0, ge=0)
    max_time_limit: float | None = None
    lease_grace_s: float = Field(default=5.0, ge=0)
    watchdog_poll_interval_s: float = Field(default=0.5, gt=0)
    dist_timeout_s: float = Field(default=300.0, gt=0)
    rdzv_timeout_s: float = Field(default=120.0, gt=0)
    workdir_timeout_s: float = Field(default=5.0, gt=0)
    schedule_interval_s: float = Field(default=5.0, gt=0)
    listen: str = "0.0.0.0:7171"
    peers: list[str] = Field(default_factory=list)
    mdns: bool = True
    interface: str | None = None
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    suspect_after_s: float = Field(default=3.0, gt=0)
    down_after_s: float = Field(default=10.0, gt=0)
    peer_timeout_s: float = Field(default=3.0, gt=0)
    peer_handshake_timeout_s: float = Field(default=5.0, gt=0, le=60)
    peer_max_connections: int = Field(default=512, ge=1)
    peer_max_connections_per_address: int = Field(default=64, ge=1)
    peer_max_unauthenticated: int = Field(default=256, ge=1)
    local_max_connections: int = Field(default=1024, ge=2)
    local_max_connections_per_user: int = Field(default=64, ge=1)
    local_reserved_connections: int = Field(default=64, ge=1)
    local_request_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    local_idle_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    isolated: bool = False
    offer_interval_s: float = Field(default=2.0, gt=0)
    hold_ttl_s: float = Field(default=10.0, gt=0)
    mode: Literal["personal", "system"] = "personal"
    admin_group: str = "gpulayer-admin"
    allow_root_jobs: bool = False
    fairshare_half_life_s: float = Field(default=86400.0, gt=0)
    max_gpus_per_user: int | None = Field(default=None, ge=0)
    exclude_gpus: list[int | str] = Field(default_factory=list)
    log_cap_bytes: int = Field(default=1_000_000_000, ge=4096)
    max_array_size: int = Field(default=DEFAULT_MAX_ARRAY_SIZE, ge=1, le=MAX_INDEX + 1)
    allow_virtual_mps: bool = False
    ship: bool = False
    ship_max_snapshot_mb: float = Field(default=200.0, gt=0)
    ship_user_quota_mb: float = Field(default=2000.0, gt=0)
    ship_total_mb: float = Field(default=20000.0, gt=0)
    ship_reserve_mb: float = Field(default=500.0, ge=0)
    ship_keep_days: float = Field(default=7.0, ge=0)
    ship_cache_mb: float = Field(default=2000.0, gt=0)
    ship_transfer_timeout_s: float = Field(default=300.0, gt=0)
    ship_fetch_mb_per_s: float = Field(default=0.0, ge=0)
    ship_outputs_mb: float = Field(default=100.0, gt=0)
    ship_keep_s: float = Field(default=86400.0, ge=0)
    ship_tree_dir: Path | None = None
    slurm: SlurmConfig | None = None

    @field_validator("exclude_gpus", mode="before")
    @classmethod
    def _exclude_gpus(cls, v: object) -> object:
        # Before the type check: [-1, 1.5] is answered with the key and what is allowed, not pydantic's words.
        if isinstance(v, (list, tuple)):
            problem = exclusion_problem(v)
            if problem is not None:
                raise ValueError(problem)
        return v

    @field_validator("max_time_limit", mode="before")
    @classmethod
    def _max_time_limit(cls, v: object) -> object:
        return None if v is None else parse_duration(v)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        _host_port(v, "listen")
        return v

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: list[str]) -> list[str]:
        for entry in v:
            _host_port(entry, "peer")
        return v

    @model_validator(mode="after")
    def _shares_fit_their_totals(self) -> DaemonConfig:
        if self.local_reserved_connections >= self.local_max_connections:
            raise ValueError(f"local_reserved_connections ({self.local_reserved_connections}) must be below "
                             f"local_max_connections ({self.local_max_connections}): the reserve for root and admins "
                             "is part of the total (lower it, or raise the total)")
        if self.peer_max_unauthenticated > self.peer_max_connections:
            raise ValueError(f"peer_max_unauthenticated ({self.peer_max_unauthenticated}) must be at most "
                             f"peer_max_connections ({self.peer_max_connections}): strangers' connections are part "
                             "of the total")
        return self

    @model_validator(mode="after")
    def _metrics_listener(self) -> DaemonConfig:
        if self.metrics_listen is not None:
            _host_port(self.metrics_listen, "metrics_listen")
            if self.metrics_token_file is None:
                raise ValueError("metrics_listen: needs metrics_token_file (a bearer token, mode 0640)")
            read_token(self.metrics_token_file)
        return self

    @model_validator(mode="after")
    def _isolated_needs_its_own_locks(self) -> DaemonConfig:
        if self.isolated and self.device_lock_dir == Path("/tmp/gpulayer-locks"):
            raise ValueError("isolated: give device_lock_dir (--device-lock-dir) a directory of its own: the shared "
                             "/tmp/gpulayer-locks is the other daemon's")
        return self

    @model_validator(mode="after")
    def _slurm_interpreters(self) -> DaemonConfig:
        if self.slurm is not None and self.slurm.interpreters and "interpreters" not in self.model_fields_set:
            object.__setattr__(self, "interpreters", list(self.slurm.interpreters))
        return self

    @model_validator(mode="after")
    def _system_defaults(self) -> DaemonConfig:
        # Set past pydantic's __setattr__: these are defaults, not settings given (model_fields_set).
        if self.mode == "system":
            if "state_dir" not in self.model_fields_set:
                object.__setattr__(self, "state_dir", SYSTEM_STATE_DIR)
            if self.runtime_dir is None and "state_dir" not in self.model_fields_set:
                object.__setattr__(self, "runtime_dir", SYSTEM_RUNTIME_DIR)
        return self

    @property
    def socket_path(self) -> Path:
        """The local API's unix socket."""
        explicit_state_dir = self.state_dir if "state_dir" in self.model_fields_set else None
        return socket_path_for(explicit_state_dir, self.runtime_dir)

    @property
    def db_path(self) -> Path:
        """The SQLite file."""
        return self.state_dir / "gpulayer.sqlite3"

    @property
    def runs_dir(self) -> Path:
        """Per-job run directories: ``runs/<job>/<attempt>/{stdout,stderr}.log``."""
        return self.state_dir / "runs"

    @property
    def snapshots_dir(self) -> Path:
        """The owner's content store of shipped snapshots (a directory of its own, not the database's)."""
        return self.state_dir / "snapshots"

    @property
    def trees_dir(self) -> Path:
        """Where per-attempt trees of shipped jobs are made (``ship_tree_dir``, else see there)."""
        if self.ship_tree_dir is not None:
            return self.ship_tree_dir
        return Path("/var/tmp/gpulayer-trees") if self.mode == "system" else self.state_dir / "trees"

    @property
    def pid_path(self) -> Path:
        """The running daemon's pid file."""
        return self.state_dir / "gpulayerd.pid"

    @property
    def effective_cpu_slots(self) -> int:
        """``cpu_slots``, else the CPUs this process may use (affinity and cgroup CPU quota).

        See :func:`gpulayerd.gpu.cpus.usable_cpus`; read once per process and cached (the
        daemon reads it from a thread at start-up).
        """
        return self.cpu_slots or default_cpu_slots()

    @classmethod
    def load(cls, path: Path | None, overrides: dict[str, object]) -> DaemonConfig:
        """Embedded defaults, then the TOML file at ``path`` (if any), then ``overrides``.

        Raises:
            ConfigError: unreadable file or invalid setting, naming it.
        """
        data: dict[str, object] = {}
        if path is not None:
            try:
                data.update(tomllib.loads(path.read_text(encoding="utf-8")))
            except OSError as e:
                raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path}: malformed TOML: {e}") from e
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            where = f"{path}: " if path else ""
            raise ConfigError(f"{where}invalid settings\n{format_validation_error(e, whole='settings')}") from e
