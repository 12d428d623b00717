"""Slurm's answers read (pure: text in, values out), and Slurm's job states and reasons in gpulayer's words.

- nodes: ``sinfo --json`` (Slurm >= 21.08 built with the OpenAPI plugins) or, where that is missing,
  ``sinfo -N -h -o NODE_FORMAT`` (one ``|``-separated line per node and partition);
- jobs: ``squeue -h -o JOB_FORMAT`` and ``scontrol -o show job ID`` (``key=value`` on one line);
- ended jobs where Slurm accounting runs: ``sacct -n -P -X -o SACCT_FORMAT -j ID``;
- GRES strings: ``gpu:a100:4``, ``gpu:2``, ``gpu:a100:4(S:0-1)``, comma-separated lists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["END_STATES", "JOB_FORMAT", "NODE_FORMAT", "SACCT_FORMAT", "Gres", "SlurmEnd", "SlurmJob", "SlurmNode",
           "end_of", "parse_gres", "parse_nodes_json", "parse_nodes_lines", "parse_sacct", "parse_scontrol_job",
           "parse_squeue", "pending_reason", "queue_positions"]

NODE_FORMAT = "%N|%P|%c|%m|%G|%T|%f"
"""``sinfo -N -h -o`` format: node, partition (``*`` marks the default), CPUs, memory MB, GRES, state, features."""

JOB_FORMAT = "%i|%T|%r|%N|%P|%Q|%U|%k"
"""``squeue -h -o`` format: job id, state, reason, nodes, partition, priority, user id, comment (last: any user
may put ``|`` in a comment of theirs)."""

SACCT_FORMAT = "JobID,State,ExitCode,NodeList,Partition,Start,End"
"""``sacct -n -P -X -o`` fields: the job's allocation line (no steps), ``|``-separated."""


@dataclass(frozen=True, slots=True)
class Gres:
    """One GRES entry of a node: ``gpu:a100:4`` is ``Gres("gpu", "a100", 4)``."""

    name: str
    type: str | None
    count: int


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as ``sinfo`` shows it (merged over its partitions)."""

    name: str
    partitions: tuple[str, ...]
    cpus: int | None
    memory_mb: int | None
    gres: tuple[Gres, ...]
    state: str
    features: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether Slurm may start jobs there (not down, drained, failing or unknown)."""
        bad = ("down", "drain", "fail", "unk", "inval", "maint", "reserved", "not_responding", "power")
        return not any(b in self.state.lower() for b in bad)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One Slurm job as ``squeue`` or ``scontrol show job`` says.

    Attributes:
        job_id: Slurm's id.
        state: ``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``TIMEOUT``, ... (base state, no flags).
        reason: Slurm's reason (``Priority``, ``Resources``, ``None``).
        nodes: the node list ("" while pending).
        partition: its partition.
        comment: ``--comment`` (``gpulayer:<job>:<attempt>``).
        exit_code: the batch script's exit status; None while unknown.
        signal: the signal that killed it (``ExitCode=0:9``), 0 if none.
        priority: Slurm's priority (``squeue %Q``); None when not read.
        uid: the user id the job runs as (``squeue %U``); None when not read.
        start, end: Slurm's start and end times as it prints them (``2026-12-01T10:00:00``; "" when not read,
            ``Unknown`` while not known).
        source: which command said so (``squeue``, ``scontrol``, ``sacct``).
    """

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    partition: str = ""
    comment: str = ""
    exit_code: int | None = None
    signal: int = 0
    priority: int | None = None
    uid: int | None = None
    start: str = ""
    end: str = ""
    source: str = ""

    @property
    def ended(self) -> bool:
        """Whether Slurm says the job is over."""
        return self.state in END_STATES or self.state in ("BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED")


def parse_gres(text: str) -> tuple[Gres, ...]:
    """GRES entries of ``text`` (``gpu:a100:4(S:0-1),shard:8``); ``(null)``, ``N/A`` and "" are none."""
    out: list[Gres] = []
    for raw in re.split(r",(?![^(]*\))", text.strip()):
        part = re.sub(r"\(.*\)$", "", raw.strip())
        if not part or part in ("(null)", "N/A"):
            continue
        fields = part.split(":")
        name, count = fields[0], 1
        gtype: str | None = None
        if len(fields) >= 2 and fields[-1].isdigit():
            count = int(fields[-1])
            gtype = ":".join(fields[1:-1]) or None
        elif len(fields) >= 2:
            gtype = ":".join(fields[1:])
        out.append(Gres(name, gtype, count))
    return tuple(out)


def _int(text: object) -> int | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, dict):  # Slurm >= 23.02: {"set": true, "number": 4}
        return _int(text.get("number")) if text.get("set", True) else None
    if isinstance(text, str):
        m = re.match(r"^\s*(\d+)", text)
        return int(m.group(1)) if m else None
    return None


def _features(text: str) -> tuple[str, ...]:
    return tuple(f for f in text.split(",") if f and f != "(null)")


def _merge(nodes: list[SlurmNode]) -> list[SlurmNode]:
    by_name: dict[str, SlurmNode] = {}
    for n in nodes:
        seen = by_name.get(n.name)
        if seen is None:
            by_name[n.name] = n
        else:
            parts = seen.partitions + tuple(p for p in n.partitions if p not in seen.partitions)
            by_name[n.name] = SlurmNode(seen.name, parts, seen.cpus, seen.memory_mb, seen.gres, seen.state,
                                        seen.features)
    return list(by_name.values())


def parse_nodes_lines(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo -N -h -o NODE_FORMAT`` (a node in several partitions is one node).

    Raises:
        ValueError: a line without the format's 7 fields.
    """
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) != 7:
            raise ValueError(f"sinfo: expected 7 fields separated by '|', got {line!r}")
        nodes.append(SlurmNode(f[0], (f[1].rstrip("*"),), _int(f[2]), _int(f[3]), parse_gres(f[4]),
                               f[5].strip(), _features(f[6])))
    return _merge(nodes)


def parse_nodes_json(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (or ``scontrol show node --json``): ``{"nodes": [...]}``.

    Raises:
        ValueError: not JSON, or no ``nodes`` list.
    """
    data = json.loads(text)
    errors = data.get("errors") if isinstance(data, dict) else None
    if isinstance(errors, list) and errors:  # (exit 0 all the same: slurmctld unreachable, say)
        raise ValueError("; ".join(str(e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors))
    raw = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ValueError("sinfo --json: no \"nodes\" list")
    nodes = []
    for n in raw:
        if not isinstance(n, dict) or not isinstance(n.get("name"), str):
            continue
        state = n.get("state")
        if isinstance(state, list):  # Slurm >= 23.02: ["IDLE", "DRAIN"]
            state = "+".join(str(s) for s in state)
        flags = n.get("state_flags")
        if isinstance(flags, list) and flags:
            state = f"{state}+{'+'.join(str(s) for s in flags)}"
        features = n.get("active_features") or n.get("features") or ""
        if isinstance(features, list):
            features = ",".join(str(x) for x in features)
        partitions = n.get("partitions") or []
        nodes.append(SlurmNode(n["name"], tuple(str(p) for p in partitions if isinstance(p, str)),
                               _int(n.get("cpus")), _int(n.get("real_memory")), parse_gres(str(n.get("gres") or "")),
                               str(state or "").lower(), _features(str(features))))
    return _merge(nodes)


def parse_squeue(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue -h -o JOB_FORMAT`` (lines that do not have its 8 fields are skipped)."""
    jobs = []
    for line in text.splitlines():
        f = line.split("|", 7)
        if len(f) != 8 or not f[0].strip():
            continue
        jobs.append(SlurmJob(f[0].strip(), f[1].strip(), f[2].strip(), f[3].strip(), f[4].strip(), f[7].strip(),
                             priority=_int(f[5]), uid=_int(f[6])))
    return jobs


def queue_positions(jobs: list[SlurmJob]) -> dict[str, int]:
    """Each pending job's place in its partition's queue (1: next), by priority, then job id."""
    out: dict[str, int] = {}
    pending = [j for j in jobs if j.state == "PENDING"]
    for part in {j.partition for j in pending}:
        ranked = sorted((j for j in pending if j.partition == part),
                        key=lambda j: (-(j.priority or 0), int(j.job_id) if j.job_id.isdigit() else 0))
        out.update({j.job_id: i for i, j in enumerate(ranked, 1)})
    return out


_KV = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|\s*$)")


def parse_scontrol_job(text: str) -> SlurmJob | None:
    """The job of ``scontrol -o show job ID`` (one line of ``Key=Value``); None when there is none."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    kv = {m.group(1): m.group(2) for m in _KV.finditer(line)}
    code, signal = None, 0
    exit_text = kv.get("ExitCode", "")
    m = re.fullmatch(r"(\d+):(\d+)", exit_text)
    if m:
        code, signal = int(m.group(1)), int(m.group(2))
    state = kv.get("JobState", "").split()[0] if kv.get("JobState") else ""
    nodes = kv.get("NodeList", "")
    return SlurmJob(kv.get("JobId", ""), state, kv.get("Reason", ""), "" if nodes == "(null)" else nodes,
                    kv.get("Partition", ""), kv.get("Comment", ""), code, signal, start=kv.get("StartTime", ""),
                    end=kv.get("EndTime", ""), source="scontrol")


def parse_sacct(text: str, job_id: str) -> SlurmJob | None:
    """Job ``job_id``'s allocation line of ``sacct -n -P -X -o SACCT_FORMAT -j ID``; None when sacct has none
    (the state's first word: ``CANCELLED by 1001`` is ``CANCELLED``; ``ExitCode`` is ``code:signal``)."""
    for line in text.splitlines():
        f = line.split("|")
        if len(f) != 7 or f[0].strip() != job_id:
            continue
        m = re.fullmatch(r"(\d+):(\d+)", f[2].strip())
        code, signal = (int(m.group(1)), int(m.group(2))) if m else (None, 0)
        nodes = f[3].strip()
        return SlurmJob(job_id, (f[1].split() or [""])[0], "", "" if nodes in ("None assigned", "(null)") else nodes,
                        f[4].strip(), "", code, signal, start=f[5].strip(), end=f[6].strip(), source="sacct")
    return None


@dataclass(frozen=True, slots=True)
class SlurmEnd:
    """A Slurm job's end in gpulayer's words: the exit code the attempt ends with, and why.

    ``exit_code`` follows gpulayer's rule (negative N: killed by signal N); ``reason`` is ``""``
    for a plain exit, else ``Slurm: STATE`` words.
    """

    exit_code: int
    reason: str
    timed_out: bool = False
    lost: bool = False


END_STATES: dict[str, str] = {
    "COMPLETED": "exited",
    "FAILED": "exited",
    "TIMEOUT": "timeout",
    "OUT_OF_MEMORY": "exited",
    "NODE_FAIL": "lost",
    "CANCELLED": "cancelled",
}
"""Slurm's end states -> what the attempt is in gpulayer: exited (its code judges it), timeout, lost, cancelled."""


def end_of(job: SlurmJob) -> SlurmEnd:
    """How ``job`` (ended) ends its gpulayer attempt (see :data:`END_STATES`)."""
    code = job.exit_code if job.exit_code is not None else 1
    if job.signal:
        code = -job.signal
    kind = END_STATES.get(job.state, "exited")
    if job.state == "COMPLETED":
        return SlurmEnd(code, "")
    if kind == "timeout":
        return SlurmEnd(code or -15, f"Slurm: TIMEOUT (its time limit) on {job.nodes or '?'}", timed_out=True)
    if kind == "lost":
        return SlurmEnd(code, f"Slurm: NODE_FAIL on {job.nodes or '?'}", lost=True)
    if kind == "cancelled":
        return SlurmEnd(code or -15, "Slurm: CANCELLED")
    if job.state == "OUT_OF_MEMORY":  # (sacct's ExitCode says 0:125: not a signal)
        return SlurmEnd(137, f"Slurm: OUT_OF_MEMORY on {job.nodes or '?'}")
    return SlurmEnd(code or 1, f"Slurm: {job.state or 'FAILED'} (exit {code}) on {job.nodes or '?'}")


def pending_reason(job: SlurmJob, position: int | None = None) -> str:
    """``SlurmPending: Priority (partition gpu, position 12)`` for a pending job."""
    where = [f"partition {job.partition}"] if job.partition else []
    if position is not None:
        where.append(f"position {position}")
    return f"SlurmPending: {job.reason or 'None'}" + (f" ({', '.join(where)})" if where else "")
