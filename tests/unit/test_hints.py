"""Nearest-miss hints (gpulayerd.core.matching.hints): each kind of change, its exact text and the workers it unlocks."""

from __future__ import annotations

import pytest

from gpulayerd.core.matching.evaluate import evaluate, explain
from gpulayerd.core.matching.hints import nearest_misses
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from tests.fakes.daemons import Lab

NGC = "2.4.0a0+3bcc3cddb5.nv24.07"  # /work/shared/cases/bug-28.json


def gpu(index: int, mem_gb: float, cc: tuple[int, int] = (8, 6), *, driver: str = "550.54.15",
        float64: bool = True, granted_to: str | None = None) -> DeviceSnapshot:
    return DeviceSnapshot(
        accelerator=Accelerator.CUDA, index=index, uuid=f"GPU-{index:04d}-{mem_gb:g}", name="NVIDIA Test",
        memory_total_bytes=int(mem_gb * GB), memory_kind=MemoryKind.DEDICATED, compute_capability=cc,
        driver_version=driver, execution_supported=True, float64=float64, granted_to=granted_to,
    )


def mac_gpu(mem_gb: float = 11.4) -> DeviceSnapshot:
    return DeviceSnapshot(
        accelerator=Accelerator.MPS, index=0, uuid="mps-0", name="Apple M1", memory_total_bytes=int(mem_gb * GB),
        memory_kind=MemoryKind.UNIFIED, execution_supported=True, float64=False,
    )


def env(frameworks: dict[str, str] | None = None, *, python: str = "3.11.7", cuda: bool | None = True,
        mps: bool | None = None, interpreter: str = "/usr/bin/python3") -> EnvironmentSnapshot:
    fws = {n: FrameworkVersion(name=n, version=v, distribution=n) for n, v in (frameworks or {}).items()}
    return EnvironmentSnapshot(interpreter=interpreter, python_version=python, frameworks=fws,
                               torch_cuda=cuda, torch_mps=mps, distributed_backends=("gloo",))


def worker(name: str, *devices: DeviceSnapshot, envs: tuple[EnvironmentSnapshot, ...] | None = None,
           online: bool = True, os: str = "linux") -> WorkerSnapshot:
    return WorkerSnapshot(node_id=f"id-{name}", name=name, online=online, devices=devices,
                          environments=envs if envs is not None else (env(),), os=os)


def cuda_job(**kw: object) -> JobRequest:
    return JobRequest(job_id="j1", accelerator=Accelerator.CUDA, gpu_count=1, **kw)  # type: ignore[arg-type]


def texts(job: JobRequest, workers: list[WorkerSnapshot], **kw: object) -> list[tuple[str, tuple[str, ...]]]:
    return [(h.text, h.fits) for h in nearest_misses(job, workers, SUPPORT_MATRIX, **kw)]  # type: ignore[arg-type]


def test_numeric_memory_lowered_to_the_card_that_is_closest() -> None:
    workers = [worker("ws-1", gpu(0, 24)), worker("ws-2", gpu(0, 24), gpu(1, 48))]
    job = cuda_job(gpu_memory_bytes=50 * GB)
    assert explain(job, workers, SUPPORT_MATRIX).verdict is Verdict.FITS_NOWHERE
    assert texts(job, workers) == [
        ("lower gpu_memory_gb to 48 → fits ws-2 GPU 1", ("id-ws-2",)),
        ("lower gpu_memory_gb to 24 → fits ws-1 GPU 0; ws-2 GPU 0", ("id-ws-1", "id-ws-2")),
    ]


def test_prerelease_of_the_wanted_release_says_so() -> None:
    workers = [worker("ws-3", gpu(0, 80), envs=(env({"torch": NGC}),)),
               worker("ws-4", gpu(0, 80), envs=(env({"torch": "2.3.1"}),))]
    job = cuda_job(frameworks={"torch": ">=2.4"})
    hints = nearest_misses(job, workers, SUPPORT_MATRIX)
    assert [(h.change, h.fits) for h in hints] == [
        (f"{NGC} is a pre-release of 2.4: write torch>=2.4.0a0", ("id-ws-3",)),
        ("write torch>=2.3.1", ("id-ws-3", "id-ws-4")),
    ]
    assert hints[0].text == f"{NGC} is a pre-release of 2.4: write torch>=2.4.0a0 → fits ws-3 GPU 0"
    assert hints[0].requirements == ("frameworks.torch",)


def test_other_accelerator_fits_the_mac() -> None:
    workers = [worker("mac-1", mac_gpu(11.4), envs=(env({"torch": "2.5.1"}, cuda=False, mps=True),), os="darwin"),
               worker("ws-1", gpu(0, 8), envs=(env({"torch": "2.5.1"}),))]
    job = cuda_job(gpu_memory_bytes=10 * GB, frameworks={"torch": ">=2.1"})
    assert texts(job, workers) == [
        ("lower gpu_memory_gb to 8 → fits ws-1 GPU 0", ("id-ws-1",)),
        ("as mps it fits mac-1, unified 11.4 GB", ("id-mac-1",)),
    ]


def test_flag_dropped_fits_the_mac() -> None:
    workers = [worker("mac-1", mac_gpu(32), envs=(env(cuda=False, mps=True),), os="darwin")]
    job = JobRequest(job_id="j", accelerator=Accelerator.MPS, gpu_count=1, requires_float64=True)
    assert texts(job, workers) == [("without requires_float64 → fits mac-1, unified 32.0 GB", ("id-mac-1",))]


def test_profile_items_name_their_profile() -> None:
    workers = [worker("ws-3", gpu(0, 24, driver="535.104.05"))]
    job = cuda_job(min_driver_version="550.54.14")
    origins = {"min_driver_version": "from profile torch-2.4-cu124"}
    assert texts(job, workers, origins=origins) == [
        ("lower min_driver_version to 535.104.05 (from profile torch-2.4-cu124) → fits ws-3 GPU 0", ("id-ws-3",))]
    e = EnvironmentSnapshot(interpreter="/venv/bin/python", python_version="3.11.7",
                            frameworks={"torch": FrameworkVersion("torch", "2.3.1+cu121", "torch")},
                            torch_cuda=True, cuda_builds={"torch": "12.1"})
    workers = [worker("ws-5", gpu(0, 24), envs=(e,), os="darwin")]
    job = cuda_job(cuda_runtime=">=12.4", os="linux")
    origins = {"cuda_runtime": "from profile torch-2.4-cu124", "os": "from profile torch-2.4-cu124"}
    assert texts(job, workers, origins=origins) == [
        ("write cuda_runtime>=12.1 (from profile torch-2.4-cu124), without os (from profile torch-2.4-cu124)"
         " → fits ws-5 GPU 0", ("id-ws-5",))]


def test_compute_capability_and_offline_and_unfixable_workers() -> None:
    workers = [worker("ws-1", gpu(0, 24, cc=(7, 5))), worker("ws-2", gpu(0, 24, cc=(7, 0)), online=False),
               worker("ws-9", gpu(0, 80, cc=(9, 0)), envs=(env({"jax": "0.4.30"}),))]  # no torch at all
    job = cuda_job(min_cuda_compute_capability=(8, 0), frameworks={"torch": ">=2.1"},
                   )
    workers = [replace_env(w, {"torch": "2.5.1"}) if w.name != "ws-9" else w for w in workers]
    assert texts(job, workers) == [
        ("lower min_cuda_compute_capability to 7.5 → fits ws-1 GPU 0", ("id-ws-1",)),
        ("lower min_cuda_compute_capability to 7.0 → fits ws-1 GPU 0; ws-2 (offline)", ("id-ws-1", "id-ws-2")),
    ]


def replace_env(w: WorkerSnapshot, frameworks: dict[str, str]) -> WorkerSnapshot:
    from dataclasses import replace

    return replace(w, environments=(env(frameworks),))


def test_busy_job_gets_a_change_that_fits_now_and_none_when_it_fits() -> None:
    w = worker("ws-2", gpu(0, 48, granted_to="other"), gpu(1, 24))
    job = cuda_job(gpu_memory_bytes=40 * GB)
    assert explain(job, [w], SUPPORT_MATRIX).verdict is Verdict.FITS_BUT_BUSY
    assert texts(job, [w]) == [("lower gpu_memory_gb to 24 → fits ws-2 GPU 1", ("id-ws-2",))]
    assert nearest_misses(cuda_job(gpu_memory_bytes=20 * GB), [w], SUPPORT_MATRIX) == ()


def test_every_hint_is_exactly_the_real_judgement() -> None:
    """``fits`` equals the workers the changed job fits, re-judged from scratch (no skipped worker lies)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from match import _far_shapes, make_shapes, make_workers  # type: ignore[import-not-found]

    workers = make_workers(24)
    checked = 0
    for job in [*make_shapes(30), *_far_shapes()]:
        e = explain(job, workers, SUPPORT_MATRIX)
        for h in nearest_misses(job, workers, SUPPORT_MATRIX, e):
            checked += 1
            assert h.fits
            assert e.verdict is not Verdict.FITS_NOW
            rank = {Verdict.FITS_BUT_BUSY: 1, Verdict.FITS_ONLY_OFFLINE: 2, Verdict.FITS_NOWHERE: 3}[e.verdict]
            better = {FitState.FITS_NOW: 0, FitState.FITS_BUT_BUSY: 1, FitState.FITS_OFFLINE: 2, FitState.NO_FIT: 3}
            moved = _rebuild(job, h.change)
            real = tuple(sorted(w.node_id for w in workers
                                if better[evaluate(moved, w, SUPPORT_MATRIX).state] < rank))
            assert h.fits == real, h.text
    assert checked >= 20


def _rebuild(job: JobRequest, change: str) -> JobRequest:
    """The changed job from a hint's words (only the kinds the bench's shapes produce)."""
    from dataclasses import replace

    kw: dict[str, object] = {}
    for part in change.split(", "):
        if part.startswith("lower gpu_memory_gb to "):
            kw["gpu_memory_bytes"] = round(float(part.rsplit(" ", 1)[1]) * GB)
        elif part.startswith("lower min_cuda_compute_capability to "):
            major, minor = part.rsplit(" ", 1)[1].split(".")
            kw["min_cuda_compute_capability"] = (int(major), int(minor))
        elif part.startswith("lower gpu_count to "):
            kw["gpu_count"] = int(part.rsplit(" ", 1)[1])
        elif part == "without requires_float64":
            kw["requires_float64"] = False
        elif part == "without gpu_memory_gb":
            kw["gpu_memory_bytes"] = None
        elif part == "without gpu_memory_kind":
            kw["gpu_memory_kind"] = None
        elif part == "without min_cuda_compute_capability":
            kw["min_cuda_compute_capability"] = None
        elif part == "without os":
            kw["os"] = None
        elif part == "without min_driver_version":
            kw["min_driver_version"] = None
        elif part.startswith("lower min_driver_version to "):
            kw["min_driver_version"] = part.rsplit(" ", 1)[1]
        elif part == "without cuda_runtime":
            kw["cuda_runtime"] = None
        elif part.startswith("write cuda_runtime"):
            kw["cuda_runtime"] = part.removeprefix("write cuda_runtime")
        elif part.startswith("as "):
            kw["accelerator"] = Accelerator(part[3:].split(" ")[0])
        elif part.startswith("write ") or ": write " in part:
            body = part.split(": write ")[-1].removeprefix("write ")
            name = next(n for n in ("python", "torch", "jax", "tensorflow", "numpy") if body.startswith(n))
            if name == "python":
                kw["python"] = body[len(name):]
            else:
                kw["frameworks"] = {**job.frameworks, name: body[len(name):]}
        else:
            raise AssertionError(f"unexpected change {part!r}")
    return replace(job, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ shown in explain, show, the TUI, --json


def test_hints_render_escaped_in_explain_show_and_the_why_tab() -> None:
    from gpulayer_tui.widgets.explanation import hint_lines
    from gpulayerd.app.owner.explainer import explain_with_hints
    from gpulayerd.cli.render import render_explanation

    evil = "ws-3\x1b[2J"  # a worker's name comes from a peer: data, never a terminal command
    workers = [worker(evil, gpu(0, 80), envs=(env({"torch": NGC}),))]
    job = cuda_job(frameworks={"torch": ">=2.4"})
    model = explain_with_hints(job, workers, SUPPORT_MATRIX)
    assert [(h.fits, h.requirements) for h in model.hints] == [([f"id-{evil}"], ["frameworks.torch"])]
    assert model.model_dump(mode="json")["hints"][0]["change"] == f"{NGC} is a pre-release of 2.4: write torch>=2.4.0a0"
    line = f"{NGC} is a pre-release of 2.4: write torch>=2.4.0a0 → fits ws-3\\x1b[2J GPU 0"
    text = render_explanation(model, title="job j1")
    assert f"smallest changes that make it fit (each re-judged against the workers):\n  - {line}" in text
    assert "\x1b" not in text
    assert hint_lines(model) == ["smallest changes that make it fit:", f"→ {line}"]
    fitting = explain_with_hints(cuda_job(), workers, SUPPORT_MATRIX)
    assert fitting.hints == [] and hint_lines(fitting) == [] and "smallest changes" not in render_explanation(
        fitting, title="job j1")


@pytest.mark.asyncio
async def test_owner_explain_and_show_carry_hints(lab: Lab) -> None:
    """A queued job that fits nowhere (torch>=2.5, every machine has 2.4.0): ``explain`` and ``show``
    (``get_job``) carry the change that makes it fit, with the workers it then fits."""
    from gpulayerd.models import SubmitRequest
    from tests.fakes.daemons import d

    owner = d(lab, "owner")
    spec = {"command": ["python", "x.py"], "workdir": str(lab.workdir),
            "requirements": {"frameworks": {"torch": ">=2.5"}}}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
    await lab.settle()
    e = await owner.services.owner.explain(job)
    assert e.verdict == "fits nowhere we know"
    everyone = sorted(w.worker for w in e.workers)
    assert len(everyone) == 3
    assert [(h.change, h.fits) for h in e.hints] == [("write torch>=2.4.0", everyone)]
    # What a scheduling pass stores (its fit-only judgement has no hints); show adds them, judged now.
    stored = e.model_copy(update={"hints": []})
    await owner.store.jobs.set_explanation(job, "NoFit: torch", stored.model_dump_json())
    shown = await owner.services.owner.get_job(job)
    assert shown.explanation is not None
    assert [(h.change, h.fits) for h in shown.explanation.hints] == [("write torch>=2.4.0", everyone)]


def test_widen_changes_only_the_failing_clauses_in_order() -> None:
    from gpulayerd.core.matching.hint_versions import widen

    assert widen(">=2.4", NGC) == (">=2.4.0a0", f"{NGC} is a pre-release of 2.4")
    assert widen("~=2.4", "2.4.0rc1") == (">=2.4.0rc1,==2.*", "2.4.0rc1 is a pre-release of 2.4")
    assert widen(">=2.1,<2.4", "2.5.1+cu124") == (">=2.1,<=2.5.1", "")
    assert widen("==2.3.*", "2.4.1") == ("==2.4.*", "")
    assert widen(">=2.1,!=2.4.1", "2.4.1") == (">=2.1", "")
    assert widen(">=12.4", "12.1") == (">=12.1", "")
    assert widen(">=2.4", "not a version") is None
