"""A real one-node Slurm from Debian's packages (munged, slurmctld, slurmd), in a temporary directory.

Nothing under /etc is touched: its own ``slurm.conf``, ``gres.conf``, munge key and socket, state
dirs and ports (free ones, chosen at start), no slurmdbd (accounting ``none``). The node declares
GRES ``gpu:<type>:<n>`` with no GPU behind it, so GPU jobs can be scheduled on a machine without GPUs:
Slurm 22.05 drops a GPU declared without ``File`` ("Removing file-less GPU"), so each one's ``File`` is a
character device of the cluster's directory with /dev/null's numbers (no cgroup confines devices here).
Clients find it through ``SLURM_CONF`` (:attr:`SlurmCluster.env`); the munge socket is reachable by
every account (its directory 0755), so jobs of throwaway users authenticate too.

Used by the integration tests (:func:`running_slurm` under a fixture) and by ``bench/slurm.py``.
The packages come from ``scripts/_system.sh`` (``slurmctld slurmd slurm-client munge``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
"""What a running cluster needs on PATH (Debian: munge, slurmctld, slurmd, slurm-client)."""


def missing_binaries() -> list[str]:
    """The binaries of :data:`BINARIES` not found on PATH."""
    return [b for b in BINARIES if shutil.which(b) is None]


@dataclass
class SlurmCluster:
    """A running one-node Slurm: its directory, node name, partition, and the clients' environment."""

    root: Path
    node: str
    partition: str
    gpus: int
    gpu_type: str
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *argv: str, timeout_s: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster (no check)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s,
                              check=False)

    def slurmctld(self) -> subprocess.Popen[bytes]:
        """The slurmctld process."""
        return self.procs[1]

    def stop_slurmctld(self) -> None:
        """Stop slurmctld (SIGTERM, then wait): clients get "Unable to contact slurm controller"."""
        p = self.slurmctld()
        p.terminate()
        p.wait(timeout=15)

    def start_slurmctld(self) -> None:
        """Start slurmctld again on its saved state (after :meth:`stop_slurmctld`)."""
        self.procs[1] = _spawn(self.root, ["slurmctld", "-D", "-f", str(self.root / "slurm.conf")], self.env)


NOROOT = "noroot"
"""A second partition over the same node whose sbatch refuses root's jobs (``DisableRootJobs``): a real
refusal of one user by Slurm, for a cluster without slurmdbd (no accounts or associations to lack)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_conf(d: Path, host: str, cpus: int, gpus: int, gpu_type: str, partition: str,
               ports: tuple[int, int]) -> str:
    """The ``slurm.conf`` of a one-node cluster in ``d`` (see the module docstring)."""
    gres = f" Gres=gpu:{gpu_type}:{gpus}" if gpus else ""
    return f"""ClusterName=gltest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/slurmd
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
NodeName={host} CPUs={cpus}{gres} State=UNKNOWN
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName={NOROOT} Nodes=ALL MaxTime=INFINITE State=UP DisableRootJobs=YES
"""


def _spawn(d: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(d / f"{argv[0]}.out", "ab")  # noqa: SIM115 (closed with the process)
    p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return p


@contextlib.contextmanager
def running_slurm(cpus: int = 2, gpus: int = 2, gpu_type: str = "a100", partition: str = "gpu",
                  timeout_s: float = 30.0) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd on a temporary config; yields the running :class:`SlurmCluster`,
    stops every process it started (always) and removes its directory.

    Raises:
        RuntimeError: a binary is missing, a daemon did not start, or the node did not come up
            within ``timeout_s``.
    """
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"Slurm is not installed ({', '.join(missing)} not found): "
                           "apt-get install slurmctld slurmd slurm-client munge (scripts/_system.sh does)")
    d = Path(tempfile.mkdtemp(prefix="gl-slurm-"))
    os.chmod(d, 0o755)  # jobs of other accounts reach the munge socket and read the config
    host = socket.gethostname().split(".")[0]
    cluster = SlurmCluster(d, host, partition, gpus, gpu_type, {})
    try:
        for sub in ("ctld", "slurmd", "munge"):
            (d / sub).mkdir()
        os.chmod(d / "munge", 0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        (d / "slurm.conf").write_text(slurm_conf(d, host, cpus, gpus, gpu_type, partition,
                                                 (_free_port(), _free_port())))
        (d / "gres.conf").write_text(f"NodeName={host} Name=gpu Type={gpu_type} File={d}/gpu[0-{gpus - 1}]\n"
                                     if gpus else "")
        for i in range(gpus):  # stand-ins: Slurm 22.05 drops a file-less GPU (/dev/null's numbers)
            os.mknod(d / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        for f in ("slurm.conf", "gres.conf"):
            os.chmod(d / f, 0o644)
        env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        cluster.env = env
        munged = ["munged", "-F", "--force", f"--key-file={key}", f"--socket={d}/munge/munge.socket",
                  f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"]
        for argv in (munged, ["slurmctld", "-D", "-i", "-f", str(d / "slurm.conf")],
                     ["slurmd", "-D", "-f", str(d / "slurm.conf")]):
            cluster.procs.append(_spawn(d, argv, env))
            time.sleep(0.3)
            if cluster.procs[-1].poll() is not None:
                raise RuntimeError(f"{argv[0]} exited {cluster.procs[-1].returncode}: "
                                   f"{_tail(d / f'{argv[0]}.out')} {_tail(d / f'{argv[0]}.log')}")
        end = time.monotonic() + timeout_s
        while True:
            r = cluster.run("sinfo", "-h", "-o", "%T")
            if r.returncode == 0 and r.stdout.strip().rstrip("*") == "idle":
                break
            if time.monotonic() > end:
                said = r.stdout.strip() or r.stderr.strip()
                raise RuntimeError(f"the node did not come up within {timeout_s:g} s (sinfo: {said}); "
                                   f"slurmctld: {_tail(d / 'slurmctld.log')}; slurmd: {_tail(d / 'slurmd.log')}")
            time.sleep(0.2)
        yield cluster
    finally:
        stop(cluster)
        if not os.environ.get("GL_SLURM_KEEP"):
            shutil.rmtree(d, ignore_errors=True)


def stop(cluster: SlurmCluster) -> None:
    """Stop every process of ``cluster`` (SIGTERM to its session, then SIGKILL), slurmd first, then the
    job steps slurmd left (``slurmstepd`` runs in a session of its own: found by our ``SLURM_CONF``)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if cluster.env and cluster.slurmctld().poll() is None:
            cluster.run("scancel", "--full", "--partition", cluster.partition, timeout_s=5)
    for p in reversed(cluster.procs):
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
    for p in reversed(cluster.procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait()
    for pid in _steps_of(cluster):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def _steps_of(cluster: SlurmCluster) -> list[int]:
    """Processes whose environment names this cluster's ``slurm.conf`` (its job steps, their jobs)."""
    conf = f"SLURM_CONF={cluster.root / 'slurm.conf'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if conf in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


def _tail(path: Path, n: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return ""
