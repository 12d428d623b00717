"""The scheduler's reasons: after every pass, each waiting job's stored reason is what a fresh full
evaluation says (core ``explain`` + :func:`gpulayerd.core.reasons.reason_text`), identical jobs included.

Over a real daemon's services (loopback lab, fake clock, fake runner, made-up GPUs): random CPU
slots and GPUs, random jobs that hold some of them, random queued jobs (CPU slots, GPU counts,
frameworks; drawn from a few shapes, so identical jobs are common), one scheduling pass, then a
run ends and another pass.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.reasons import reason_text
from gpulayerd.core.verdict import Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, DeviceModel, EnvironmentModel, FrameworkModel, SubmitRequest
from tests.fakes.daemons import OWNER, FakeDaemon, Lab

LONG_LEASE_S = 3600.0

# (gpus, cpu processes, frameworks): the shapes jobs are drawn from.
SHAPES: list[tuple[int, int, dict[str, str]]] = [
    (0, 1, {}), (0, 2, {}), (0, 3, {}), (0, 1, {"torch": ">=2.0"}), (0, 1, {"torch": ">=3"}),
    (0, 1, {"jax": ">=0.4"}), (1, 1, {}), (2, 1, {"torch": ">=2.0"}), (1, 1, {"torch": ">=9"}), (3, 1, {}),
]

_examples = itertools.count()


def _caps(d: FakeDaemon, gpus: int, lab: Lab) -> Capabilities:
    env = EnvironmentModel(interpreter=sys.executable, python_version="3.11.9",
                           frameworks={"torch": FrameworkModel(version="2.4.0", distribution="torch")},
                           torch_cuda=True, torch_mps=False, distributed_backends=["gloo", "nccl"])
    devices = [DeviceModel(accelerator="cuda", index=i, uuid=f"GPU-{i}", name="RTX 4090", memory_total_bytes=24 * 10**9,
                           compute_capability="8.9", execution_supported=True) for i in range(gpus)]
    return Capabilities(node_id=d.node_id, hostname=d.name, platform="linux", machine="x86_64", cpu_count=8,
                        memory_total_bytes=16 * 2**30, environments=[env], devices=devices, taken_at=lab.clock.wall())


async def _submit(lab: Lab, d: FakeDaemon, shape: tuple[int, int, dict[str, str]], name: str) -> str:
    gpus, procs, frameworks = shape
    spec: dict[str, Any] = {"command": ["python", "train.py"], "workdir": str(lab.workdir), "name": name,
                            "policy": {"lease_s": LONG_LEASE_S}, "requirements": {"frameworks": frameworks}}
    if gpus:
        spec["requirements"] |= {"accelerator": "cuda", "gpu_count": gpus}
    if procs > 1:
        spec["distributed"] = {"nnodes": 1, "nproc_per_node": procs}
    view = await d.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))
    return str(view.id)


async def _check_reasons(d: FakeDaemon) -> int:
    """Every queued job's stored reason equals a fresh evaluation's; returns how many were checked."""
    rows = await d.store.jobs.list_jobs([JobStatus.QUEUED], None)
    specs = [(row, d.services.jobs.spec(row)) for row in rows]
    snap = await d.services.machine.snapshot(refresh_apps=True, workdirs=[(s.user, s.workdir) for _, s in specs])
    for row, spec in specs:
        e = explain(spec.to_core(row.id), [snap], SUPPORT_MATRIX)
        assert e.verdict is not Verdict.FITS_NOW, (row.id, spec.name, "fits now but was left queued")
        assert row.reason == reason_text(e), (row.id, spec.name)
    return len(rows)


shape = st.sampled_from(SHAPES)


@pytest.mark.asyncio
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cpu_slots=st.integers(1, 4), gpus=st.integers(0, 3), holders=st.lists(shape, max_size=3),
       queued=st.lists(shape, min_size=1, max_size=8), ends=st.lists(st.integers(0, 2), min_size=1, max_size=3),
       late=st.lists(shape, max_size=2))
# A CPU run ends while a GPU job waits: only the free CPU slots change, and the 3-process job's
# line ("1 free of 4" -> "2 free of 4") with them.
@example(cpu_slots=4, gpus=1, holders=[(0, 1, {}), (0, 1, {}), (0, 1, {}), (1, 1, {})],
         queued=[(0, 3, {}), (1, 1, {})], ends=[0], late=[])
@pytest.mark.slow
async def test_every_waiting_jobs_reason_is_a_fresh_evaluations(
        tmp_path: Path, cpu_slots: int, gpus: int, holders: list[tuple[int, int, dict[str, str]]],
        queued: list[tuple[int, int, dict[str, str]]], ends: list[int],
        late: list[tuple[int, int, dict[str, str]]]) -> None:
    lab = Lab(tmp_path / f"ex{next(_examples)}")
    try:
        d = await lab.add("owner", OWNER, cpu_slots=cpu_slots)
        d.services.machine.use_capabilities(_caps(d, gpus, lab))
        for i, s in enumerate(holders):  # the busy state: whichever of these fit start and keep running
            await _submit(lab, d, s, f"holder-{i}")
        await lab.settle()
        await lab.schedule()
        for i, s in enumerate(queued):
            await _submit(lab, d, s, f"job-{i}")
        await lab.settle()
        await lab.schedule()
        await _check_reasons(d)

        for n, end in enumerate(ends):  # runs end one by one (CPU or GPU jobs), a job comes late
            running = await d.store.jobs.list_jobs([JobStatus.RUNNING], None)
            if running:  # a run ends: the reasons that depended on it change at the next pass
                done = running[end % len(running)]
                d.runner.exit(done.id, done.attempt, 0)
            if n < len(late):
                await _submit(lab, d, late[n], f"late-{n}")
            await lab.settle()
            await lab.schedule()
            await _check_reasons(d)
    finally:
        await lab.close()
    assert lab.net.errors == []
