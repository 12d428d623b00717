"""Explanations on the wire: why a job can or cannot run, worker by worker (``gpulayer explain --json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpulayerd import text as fmt
from gpulayerd.core.matching.hints import Hint
from gpulayerd.core.types import Accelerator
from gpulayerd.core.verdict import Explanation, Placement, Rejection

__all__ = [
    "CheckModel",
    "ExplanationModel",
    "HintModel",
    "HolderView",
    "JobStateModel",
    "PlacementModel",
    "RejectionModel",
    "WorkerExplanationModel",
]


class RejectionModel(BaseModel):
    """A :class:`gpulayerd.core.verdict.Rejection` on the wire."""

    model_config = ConfigDict(extra="ignore")

    code: str
    requirement: str
    wanted: str
    found: str
    worker: str
    message: str
    device: int | None = None
    environment: str | None = None

    @classmethod
    def from_core(cls, r: Rejection) -> RejectionModel:
        """Build from a core rejection."""
        return cls(
            code=r.code.value, requirement=r.requirement, wanted=r.wanted, found=r.found,
            worker=r.worker, message=r.message, device=r.device, environment=r.environment,
        )


class PlacementModel(BaseModel):
    """A :class:`gpulayerd.core.verdict.Placement` on the wire."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    environment: str
    accelerator: Accelerator
    device_indices: list[int]
    device_uuids: list[str | None]

    @classmethod
    def from_core(cls, p: Placement) -> PlacementModel:
        """Build from a core placement."""
        return cls(
            worker=p.worker, environment=p.environment, accelerator=p.accelerator,
            device_indices=list(p.device_indices), device_uuids=list(p.device_uuids),
        )


class CheckModel(BaseModel):
    """One row of the worker x requirement table (``ok`` None = not checked here)."""

    model_config = ConfigDict(extra="ignore")

    requirement: str
    wanted: str
    found: str
    ok: bool | None


class WorkerExplanationModel(BaseModel):
    """One worker's part of an explanation (a Slurm worker: ``kind`` ``slurm``, its partitions, and Slurm's
    reasons for the gpulayer jobs it holds pending there: ``slurm_pending``)."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    name: str
    online: bool
    state: str
    checks: list[CheckModel]
    rejections: list[RejectionModel]
    placement: PlacementModel | None = None
    kind: str = "host"
    slurm_partitions: list[str] = Field(default_factory=list)
    slurm_pending: list[str] = Field(default_factory=list)

    def label(self) -> str:
        """``vm (uastpavzh5h2)``; a Slurm worker's with its partitions: ``login1 (uastpavzh5h2), slurm/gpu``."""
        label = self.name if self.name == self.worker else f"{self.name} ({self.worker[:12]})"
        if self.kind == "slurm":
            label += ", slurm/" + (",".join(self.slurm_partitions) or "any partition")
        return label

    def state_text(self) -> str:
        """``fits but busy``; a busy Slurm worker's with what Slurm holds its jobs for: ``fits but busy
        (in Slurm: Priority, Resources)``."""
        text = self.state.replace("_", " ")
        if self.kind == "slurm" and self.state == "fits_but_busy" and self.slurm_pending:
            text += f" (in Slurm: {', '.join(self.slurm_pending)})"
        return text


class JobStateModel(BaseModel):
    """Where a job that is not waiting stands (``explain``'s ``state``; absent for a queued job).

    Times are wall-clock seconds since the epoch; ``duration_s`` is seconds. Every field but
    ``status`` is optional: what the state has (claimed/running: where, since, attempt,
    lease; finished: outcome, exit code or signal, where it ran, duration, stderr tail for a
    failure; cancelled/lost/rejected: why and by whom).

    Attributes:
        status: the job's state (``claimed``, ``running``, ``succeeded``, ...).
        attempt: the current (or last) attempt, 0 if it never ran.
        node, node_name: the worker holding (or that ran) the attempt: id and host name.
        gang: a multi-host attempt's members, in node-rank order (empty otherwise).
        gpus: the device indices the attempt holds (or held); empty on CPU.
        environment: the Python interpreter the attempt runs with.
        since: when the job entered ``status``.
        started_at, ended_at: when the attempt's processes started and ended.
        duration_s: ``ended_at - started_at`` (finished jobs).
        lease_expires_at: when the attempt's lease runs out unless renewed.
        cancel_requested: a cancel was asked for and the attempt is being stopped.
        outcome: how it ended (``exited 0``, ``exited 3``, ``killed by signal 9``, ...).
        exit_code: the exit status (None: unknown, or killed by a signal).
        signal: the signal that killed it, if one did.
        reason: why it is in this state (the daemon's words).
        by: who or what brought it there (a user for a cancel, a node for a loss).
        stderr_tail: the last lines of a failed attempt's stderr (at most 20 lines / 4 KiB);
            None when not read (see ``stderr_note``).
        stderr_note: why there is no tail, or how much of stderr it is.
    """

    model_config = ConfigDict(extra="ignore")

    status: str
    attempt: int = 0
    node: str | None = None
    node_name: str | None = None
    gang: list[str] = Field(default_factory=list)
    gpus: list[int] = Field(default_factory=list)
    environment: str | None = None
    since: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    lease_expires_at: float | None = None
    cancel_requested: bool = False
    outcome: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    by: str | None = None
    stderr_tail: list[str] | None = None
    stderr_note: str | None = None

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines for people (``gpulayer explain``, the TUI's Why tab), without the stderr tail.

        Only what the state has; times in local clock time, unknown values "—", text from
        jobs and peers with control characters made visible.
        """
        where = fmt.where(self.node_name or (self.node[:12] if self.node else None), self.gpus,
                          [m[:12] for m in self.gang] if len(self.gang) > 1 else ())
        out: list[tuple[str, str]] = [("state", self.status + (" (cancel requested)" if self.cancel_requested
                                                                else ""))]
        if self.outcome and self.outcome != self.status:
            out.append(("outcome", fmt.escape(self.outcome)))
        if self.signal is not None:
            out.append(("signal", str(self.signal)))
        elif self.exit_code is not None:
            out.append(("exit code", str(self.exit_code)))
        if self.attempt:
            out.append(("attempt", str(self.attempt)))
        if where:
            out.append(("on" if self.status in ("claimed", "running") else "ran on", fmt.escape(where)))
        if self.node and self.node_name:
            out.append(("node", self.node[:12]))
        if self.environment:
            out.append(("environment", fmt.escape(self.environment)))
        if self.since is not None and self.since not in (self.started_at, self.ended_at):
            out.append(("since", fmt.clock(self.since)))
        if self.started_at is not None:
            out.append(("started", fmt.clock(self.started_at)))
        if self.ended_at is not None:
            out.append(("ended", fmt.clock(self.ended_at)))
        if self.duration_s is not None:
            out.append(("duration", f"{self.duration_s:.1f} s"))
        if self.lease_expires_at is not None:
            out.append(("lease until", fmt.clock(self.lease_expires_at)))
        if self.reason and self.reason != self.outcome:
            out.append(("why", fmt.escape(self.reason)))
        if self.by:
            out.append(("by", fmt.escape(self.by)))
        return out

    def stderr_lines(self) -> list[str]:
        """The stderr tail for people: its note, then the lines (control characters made visible); [] for none."""
        out = [f"({fmt.escape(self.stderr_note)})"] if self.stderr_note else []
        return out + [fmt.escape(line) for line in self.stderr_tail or []]


class HintModel(BaseModel):
    """A nearest-miss hint on the wire (:class:`gpulayerd.core.matching.hints.Hint`): a change to the job
    and the workers (node ids) the changed job fits, re-judged; ``text`` is the whole line."""

    model_config = ConfigDict(extra="ignore")

    change: str
    fits: list[str]
    text: str = ""
    requirements: list[str] = Field(default_factory=list)

    @classmethod
    def from_core(cls, h: Hint) -> HintModel:
        """Build from a core hint."""
        return cls(change=h.change, fits=list(h.fits), text=h.text, requirements=list(h.requirements))

    def line(self) -> str:
        """The hint for a terminal (escaped: versions and names come from workers)."""
        return fmt.escape(self.text or f"{self.change} → fits {', '.join(self.fits)}")


class HolderView(BaseModel):
    """A job holding devices a waiting job wants (``JobView.holders``).

    Attributes:
        elapsed_s: seconds its current attempt has run; None: unknown.
        usual_s: the median duration of its user's earlier runs of the same command (its owner's figure);
            None: no earlier run.
    """

    model_config = ConfigDict(extra="ignore")

    id: str = Field(max_length=200)
    user: str = Field(default="", max_length=256)
    elapsed_s: float | None = None
    usual_s: float | None = None
    runs: int = 0


class ExplanationModel(BaseModel):
    """``gpulayer explain --json``: verdict, placement and the worker x requirement table.

    A queued job has the table; any other job has ``state`` (where it runs or ran, how it
    ended) and a verdict naming its state (``running``, ``failed: exited 3``, ...).
    """

    model_config = ConfigDict(extra="ignore")

    job_id: str
    verdict: str
    summary: str
    hosts_needed: int = 1
    placement: PlacementModel | None = None
    rejections: list[RejectionModel] = Field(default_factory=list)
    workers: list[WorkerExplanationModel] = Field(default_factory=list)
    state: JobStateModel | None = None
    hints: list[HintModel] = Field(default_factory=list)
    position: int | None = None
    """A waiting job: its place among the jobs queued at its owner for the same devices (see ``JobView``)."""
    holders: list[HolderView] = Field(default_factory=list, max_length=64)
    """A waiting job: the jobs holding the devices it waits for."""
    estimate: str | None = None
    """A waiting job: when it may start, in words, with the basis (``unknown`` without one)."""
    """Nearest-miss hints of a queued job that fits nowhere, or only a busy or offline worker."""

    @classmethod
    def from_core(cls, e: Explanation) -> ExplanationModel:
        """Build from a core explanation."""
        return cls(
            job_id=e.job_id,
            verdict=e.verdict.value,
            summary=e.summary,
            hosts_needed=e.hosts_needed,
            placement=None if e.placement is None else PlacementModel.from_core(e.placement),
            rejections=[RejectionModel.from_core(r) for r in e.rejections],
            workers=[
                WorkerExplanationModel(
                    worker=w.worker, name=w.name, online=w.online, state=w.state.value,
                    checks=[CheckModel(requirement=c.requirement, wanted=c.wanted, found=c.found, ok=c.ok)
                            for c in w.checks],
                    rejections=[RejectionModel.from_core(r) for r in w.rejections],
                    placement=None if w.placement is None else PlacementModel.from_core(w.placement),
                    kind="slurm" if w.slurm else "host", slurm_partitions=list(w.partitions),
                    slurm_pending=list(w.pending),
                )
                for w in e.workers
            ],
        )
