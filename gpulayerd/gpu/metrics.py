"""Live GPU metrics from nvidia-smi: parse the sample lines, run one long-lived sampler, list compute apps.

One ``nvidia-smi --query-gpu=METRICS_FIELDS --format=csv,noheader,nounits -lms N`` process
prints one line per GPU every N ms; :class:`NvidiaSampler` runs it (asyncio subprocess, its
own process group) and yields each line parsed as a :class:`GpuSample`. Compute processes
come from one ``--query-compute-apps`` call (:func:`async_compute_apps`), parsed with
:func:`gpulayerd.gpu.nvidia.parse.parse_nvidia_csv`.

Units: memory in bytes (nvidia-smi's MiB * 2^20), power in watts, temperature in degrees
Celsius, utilisation in percent. A placeholder (``[N/A]``, ``[Not Supported]``) is None.


(Same name as :mod:`gpulayerd.app.worker.metrics` (the service) and :mod:`gpulayerd.models.metrics`
(the wire shape): one idea at three layers; this reads the samples.)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpulayerd.gpu.nvidia.parse import COMPUTE_APPS_FIELDS, MIB, parse_nvidia_csv
from gpulayerd.host import sysinfo

__all__ = [
    "METRICS_FIELDS",
    "ComputeApp",
    "GpuSample",
    "NvidiaSampler",
    "async_compute_apps",
    "metrics_argv",
    "parse_compute_app_rows",
    "parse_sample_line",
    "pid_user",
]

METRICS_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "memory.used",
    "memory.total",
)
"""The ``--query-gpu`` fields of the metrics sampler, in this order."""

_FORMAT = "--format=csv,noheader,nounits"


def metrics_argv(path: str, interval_ms: int) -> list[str]:
    """The sampler's command line: one line per GPU every ``interval_ms`` milliseconds, until killed."""
    return [path, f"--query-gpu={','.join(METRICS_FIELDS)}", _FORMAT, "-lms", str(int(interval_ms))]


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's reading at one moment. None: a placeholder or an unreadable number.

    Attributes:
        index: nvidia-smi's GPU index; uuid: ``GPU-...`` (None if not printed).
        utilization_pct: percent of time a kernel ran (0-100).
        temperature_c: degrees Celsius.
        power_draw_w / power_limit_w: watts.
        memory_used_bytes / memory_total_bytes: bytes.
    """

    index: int
    uuid: str | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _mib(value: str | None) -> int | None:
    number = _number(value)
    return None if number is None or number < 0 else int(number * MIB)


def parse_sample_line(line: str) -> GpuSample | None:
    """One line of the sampler's output as a sample; None for anything that is not a GPU row.

    A row without an integer index, a message (e.g. "No devices were found") or a line with
    another number of fields is not a sample.
    """
    parsed = parse_nvidia_csv(line, METRICS_FIELDS)
    if not parsed.rows:
        return None
    row = parsed.rows[0]
    index_text = row.get("index")
    if index_text is None or not index_text.isdigit():
        return None
    return GpuSample(
        index=int(index_text),
        uuid=row.get("uuid"),
        utilization_pct=_number(row.get("utilization.gpu")),
        temperature_c=_number(row.get("temperature.gpu")),
        power_draw_w=_number(row.get("power.draw")),
        power_limit_w=_number(row.get("power.limit")),
        memory_used_bytes=_mib(row.get("memory.used")),
        memory_total_bytes=_mib(row.get("memory.total")),
    )


@dataclass(frozen=True, slots=True)
class ComputeApp:
    """One ``--query-compute-apps`` row: a process on a GPU (``used_memory_bytes`` None if not reported)."""

    gpu_uuid: str
    pid: int
    used_memory_bytes: int | None = None


def parse_compute_app_rows(stdout: str) -> tuple[ComputeApp, ...]:
    """``--query-compute-apps=gpu_uuid,pid,used_memory`` CSV as rows, in output order.

    "No running processes found", blank output and rows without a uuid or an integer pid give nothing.
    """
    apps: list[ComputeApp] = []
    for row in parse_nvidia_csv(stdout, COMPUTE_APPS_FIELDS).rows:
        uuid, pid_text = row.get("gpu_uuid"), row.get("pid")
        if uuid is None or pid_text is None or not pid_text.isdigit():
            continue
        apps.append(ComputeApp(uuid, int(pid_text), _mib(row.get("used_memory"))))
    return tuple(apps)


async def async_compute_apps(path: str, timeout_s: float) -> tuple[ComputeApp, ...] | None:
    """Ask nvidia-smi which compute processes run on which GPU; None if the call failed. Never raises.

    The call runs in its own process group, killed whole at ``timeout_s`` seconds.
    """
    argv = [path, f"--query-compute-apps={','.join(COMPUTE_APPS_FIELDS)}", _FORMAT]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, env=_c_locale())
    except OSError:
        return None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        return None
    finally:
        if proc.returncode is None:
            _kill_group(proc)
            await proc.wait()
    if proc.returncode != 0:
        return None
    return parse_compute_app_rows(out.decode("utf-8", errors="replace"))


def pid_user(pid: int) -> str | None:
    """The account name running ``pid`` (its real uid's name, or the uid when it has no name).

    None when the process is gone or cannot be read. Reads /proc: call it in a thread.
    """
    try:
        return sysinfo.Process(pid).username()
    except KeyError:  # a uid without a name
        with contextlib.suppress(sysinfo.Error):
            return str(sysinfo.Process(pid).uids().real)
        return None
    except sysinfo.Error:
        return None


class NvidiaSampler:
    """One long-lived ``nvidia-smi ... -lms N`` process, read line by line.

    Use :meth:`samples` (an async iterator, ending when the process ends) and :meth:`stop`
    (kills the process group; safe to call twice).
    """

    def __init__(self, path: str, interval_ms: int = 1000) -> None:
        """A sampler of the nvidia-smi at ``path``, one line per GPU every ``interval_ms`` ms."""
        self.path = path
        self.interval_ms = interval_ms
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        """The nvidia-smi process's pid while it runs."""
        return None if self._proc is None or self._proc.returncode is not None else self._proc.pid

    async def samples(self) -> AsyncIterator[GpuSample]:
        """Start nvidia-smi and yield each GPU row it prints; ends when it exits.

        Raises:
            OSError: nvidia-smi could not be started.
        """
        self._proc = proc = await asyncio.create_subprocess_exec(
            *metrics_argv(self.path, self.interval_ms), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            env=_c_locale())
        assert proc.stdout is not None
        try:
            while True:
                raw = await proc.stdout.readline()
                if not raw:
                    break
                sample = parse_sample_line(raw.decode("utf-8", errors="replace"))
                if sample is not None:
                    yield sample
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Kill the process group and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            _kill_group(proc)
        await proc.wait()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _c_locale() -> dict[str, str]:
    """The environment with a C locale: numbers with a dot, messages in English."""
    return {**os.environ, "LC_ALL": "C", "LANG": "C"}
