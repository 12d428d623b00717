"""Explanations on the wire: why a job can or cannot run, worker by worker (``gpulayer explain --json``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpulayerd.core.types import Accelerator
from gpulayerd.core.verdict import Explanation, Placement, Rejection

__all__ = [
    "CheckModel",
    "ExplanationModel",
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
    """One worker's part of an explanation."""

    model_config = ConfigDict(extra="ignore")

    worker: str
    name: str
    online: bool
    state: str
    checks: list[CheckModel]
    rejections: list[RejectionModel]
    placement: PlacementModel | None = None


class ExplanationModel(BaseModel):
    """``gpulayer explain --json``: verdict, placement and the worker x requirement table."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    verdict: str
    summary: str
    hosts_needed: int = 1
    placement: PlacementModel | None = None
    rejections: list[RejectionModel] = Field(default_factory=list)
    workers: list[WorkerExplanationModel] = Field(default_factory=list)

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
                )
                for w in e.workers
            ],
        )
