"""Live device metrics (``GET /v1/metrics``): what each GPU of this machine does now, like nvitop.

Sampled by :class:`gpulayerd.app.worker.metrics.MetricsService` only while someone asks (each
request renews a short watch lease). Units: ``*_bytes`` are bytes, ``*_w`` watts,
``temperature_c`` degrees Celsius, ``*_pct`` percent (0-100). None: nvidia-smi printed a
placeholder (``[N/A]``, ``[Not Supported]``) or the value is not known yet.


(Same name as :mod:`gpulayerd.gpu.metrics` (reading the samples) and
:mod:`gpulayerd.app.worker.metrics` (the service): one idea at three layers; this is the wire shape.)
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GpuMetricsView", "GpuProcessView", "MetricsView"]


class GpuProcessView(BaseModel):
    """One compute process on a GPU (``nvidia-smi --query-compute-apps``).

    Attributes:
        pid: its pid on this machine.
        used_memory_bytes: GPU memory it uses; None if not reported.
        user: the account running it (from /proc); None if it is gone or unreadable.
        job_id: the gpulayer job it belongs to; None for a foreign process.
        job_name: that job's name (None: no name, or not a job).
        job_user: that job's user.
    """

    model_config = ConfigDict(extra="ignore")

    pid: int
    used_memory_bytes: int | None = None
    user: str | None = None
    job_id: str | None = None
    job_name: str | None = None
    job_user: str | None = None


class GpuMetricsView(BaseModel):
    """One GPU's latest sample, its recent utilisation and its processes.

    Attributes:
        index: nvidia-smi's index; uuid: ``GPU-...``.
        utilization_pct: ``utilization.gpu``; temperature_c: ``temperature.gpu``.
        power_draw_w / power_limit_w: ``power.draw`` / ``power.limit``.
        memory_used_bytes / memory_total_bytes: ``memory.used`` / ``memory.total`` (MiB * 2^20).
        utilization_history: the last samples' ``utilization.gpu``, oldest first (None: unknown).
        processes: compute processes, by pid.
        granted_to / granted_name / granted_user: the gpulayer job holding this GPU, if any.
    """

    model_config = ConfigDict(extra="ignore")

    index: int
    uuid: str | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_history: list[float | None] = Field(default_factory=list)
    processes: list[GpuProcessView] = Field(default_factory=list)
    granted_to: str | None = None
    granted_name: str | None = None
    granted_user: str | None = None


class MetricsView(BaseModel):
    """``GET /v1/metrics``: this machine's GPUs now.

    Attributes:
        available: a sampler can run here (an nvidia-smi that works); False: no metrics, see ``message``.
        sampling: the sampler runs now (it starts on the first request and stops after the
            last watcher's lease ends).
        message: why there are no metrics, in words (empty when there are).
        taken_at: wall time of the newest sample (seconds since the epoch); None before the first.
        interval_s: seconds between samples.
        gpus: one per GPU, by index.
    """

    model_config = ConfigDict(extra="ignore")

    available: bool = False
    sampling: bool = False
    message: str = ""
    taken_at: float | None = None
    interval_s: float = 1.0
    gpus: list[GpuMetricsView] = Field(default_factory=list)
