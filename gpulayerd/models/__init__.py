"""pydantic v2 models for everything that crosses a boundary.

Job spec files (TOML), capability JSON (``gpulayer devices --json``), API bodies and
explanations are parsed here with ``model_validate`` and converted to the frozen
dataclasses of :mod:`gpulayerd.core.types` with ``to_core()``. Readers tolerate
unknown fields in capability JSON (it is versioned with ``v``); job specs reject
unknown fields, naming them.

Modules: :mod:`~gpulayerd.models.spec` (job specs), :mod:`~gpulayerd.models.capabilities`
(what a worker reports), :mod:`~gpulayerd.models.policy` (a job spec's [policy]: time limit, retries),
:mod:`~gpulayerd.models.explanation` (why a job can or cannot run),
:mod:`~gpulayerd.models.views` (API bodies), :mod:`~gpulayerd.models.metrics` (live device
metrics), :mod:`~gpulayerd.models.stored` (the JSON of the store's columns) and
:mod:`~gpulayerd.models.jobs_query` (``GET /v1/jobs``'s filters), :mod:`~gpulayerd.models.snapshots` (shipped
workdirs: manifests, the routes' bodies). Import from this package.

Units: ``*_bytes`` are bytes; ``gpu_memory_gb`` is decimal GB (10^9 bytes).
"""

from __future__ import annotations

from gpulayerd.core.job_facts import FINISHED_SHOWN, JOB_STATES, TERMINAL_STATES, job_user
from gpulayerd.models.capabilities import (
    CAPABILITIES_VERSION,
    Capabilities,
    DeviceModel,
    EnvironmentModel,
    FrameworkModel,
    ProbeHealthModel,
)
from gpulayerd.models.explanation import (
    CheckModel,
    ExplanationModel,
    HintModel,
    HolderView,
    JobStateModel,
    PlacementModel,
    RejectionModel,
    WorkerExplanationModel,
)
from gpulayerd.models.spec import (
    KNOWN_FRAMEWORKS,
    ArrayTask,
    DistributedModel,
    JobSpec,
    PolicyModel,
    Requirements,
    SpecError,
    capped,
    format_validation_error,
    job_spec_from_mapping,
    load_job_spec,
    parse_compute_capability,
)
from gpulayerd.models.views import (
    LOG_CHUNK_BYTES,
    ApiErrorBody,
    ArraySummary,
    AttemptView,
    EventView,
    HealthView,
    JobList,
    JobView,
    LogChunk,
    PeerView,
    ReportRowView,
    ReportView,
    RequesterView,
    SubmitRequest,
    UserHoldingView,
    UserUsageView,
)

__all__ = [
    "CAPABILITIES_VERSION",
    "FINISHED_SHOWN",
    "JOB_STATES",
    "KNOWN_FRAMEWORKS",
    "LOG_CHUNK_BYTES",
    "TERMINAL_STATES",
    "ApiErrorBody",
    "ArraySummary",
    "ArrayTask",
    "AttemptView",
    "Capabilities",
    "CheckModel",
    "DeviceModel",
    "DistributedModel",
    "EnvironmentModel",
    "EventView",
    "ExplanationModel",
    "FrameworkModel",
    "HealthView",
    "HintModel",
    "HolderView",
    "JobList",
    "JobSpec",
    "JobStateModel",
    "JobView",
    "LogChunk",
    "PeerView",
    "PlacementModel",
    "PolicyModel",
    "ProbeHealthModel",
    "RejectionModel",
    "ReportRowView",
    "ReportView",
    "RequesterView",
    "Requirements",
    "SpecError",
    "SubmitRequest",
    "UserHoldingView",
    "UserUsageView",
    "WorkerExplanationModel",
    "capped",
    "format_validation_error",
    "job_spec_from_mapping",
    "job_user",
    "load_job_spec",
    "parse_compute_capability",
]
