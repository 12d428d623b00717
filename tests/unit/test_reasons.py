"""The reason codes of waiting jobs (gpulayerd.core.reasons): one case per code, over real explanations."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpulayerd.cli.render import reason_cell
from gpulayerd.core import fairshare
from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.reasons import (
    MEANINGS,
    ReasonCode,
    code_for,
    code_of,
    reason_of,
    reason_text,
    removed_reason,
    split,
)
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceSnapshot,
    DistributedRequest,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    MemoryKind,
    ProbeHealth,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState, Rejection, RejectionCode, Verdict
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import JobView

PY = "/opt/envs/train/bin/python"


def gpu(index: int, mem_gb: float = 24.0, cc: tuple[int, int] = (8, 6), **kw: object) -> DeviceSnapshot:
    fields: dict[str, object] = {
        "accelerator": Accelerator.CUDA, "index": index, "uuid": f"GPU-{index}", "name": "RTX",
        "memory_total_bytes": int(mem_gb * GB), "memory_kind": MemoryKind.DEDICATED, "compute_capability": cc,
        "execution_supported": True, "float64": True,
    }
    fields.update(kw)
    return DeviceSnapshot(**fields)  # type: ignore[arg-type]


def env(python: str = "3.11.7", torch: str | None = "2.4.0", interpreter: str = PY, **kw: object) -> EnvironmentSnapshot:
    fws = {} if torch is None else {"torch": FrameworkVersion("torch", torch, "torch", True)}
    fields: dict[str, object] = {"interpreter": interpreter, "python_version": python, "frameworks": fws,
                                 "torch_cuda": True, "distributed_backends": ("gloo",), "ok": True}
    fields.update(kw)
    return EnvironmentSnapshot(**fields)  # type: ignore[arg-type]


def ws(node: str = "n1", *, devices: tuple[DeviceSnapshot, ...] = (), envs: tuple[EnvironmentSnapshot, ...] = (),
       **kw: object) -> WorkerSnapshot:
    return WorkerSnapshot(node_id=node, name=f"ws-{node[-1]}", devices=devices, environments=envs or (env(),),
                          **kw)  # type: ignore[arg-type]


def job(**kw: object) -> JobRequest:
    return JobRequest(job_id="j1", **kw)  # type: ignore[arg-type]


def why(j: JobRequest, *workers: WorkerSnapshot) -> tuple[str, str]:
    r = reason_of(explain(j, workers, SUPPORT_MATRIX))
    return r.code.value, r.words


CUDA = {"accelerator": Accelerator.CUDA, "gpu_count": 1}

CASES: list[tuple[str, JobRequest, list[WorkerSnapshot], tuple[str, str]]] = [
    ("cpu slots held by other jobs", job(distributed=DistributedRequest(1, 2, "gloo")),
     [ws(cpu_slots_total=2, cpu_slots_free=1)], ("Resources", "cpu slots 1 free of 2 on ws-1 (needs 2)")),
    ("a GPU granted to another job", job(**CUDA), [ws(devices=(gpu(0, granted_to="m8other"),))],
     ("Resources", "GPU 0 is granted to job m8other (on ws-1)")),
    ("a GPU used outside gpulayer", job(**CUDA), [ws(devices=(gpu(0, foreign_pids=(41, 42)),))],
     ("Resources", "GPU 0 is busy with processes gpulayer did not start (pid 41, 42) (on ws-1)")),
    ("too few slots in all", job(distributed=DistributedRequest(1, 4, "gloo")), [ws(cpu_slots_total=2, cpu_slots_free=2)],
     ("DeviceCount", "needs 4 CPU slots, worker ws-1 has 2 in all")),
    ("too few GPUs in all", job(**{**CUDA, "gpu_count": 2}), [ws(devices=(gpu(0),))],
     ("DeviceCount", "needs 2 whole cuda device(s) at once, worker ws-1 has 1 in all")),
    ("no CUDA device", job(**CUDA), [ws()], ("Accelerator", "worker ws-1 has no cuda device (it is CPU-only)")),
    ("too little memory", job(**CUDA, gpu_memory_bytes=40 * GB), [ws(devices=(gpu(0, 24.0),))],
     ("Memory", "GPU 0 has 24.0 GB < 40 GB required (on ws-1)")),
    ("compute capability", job(**CUDA, min_cuda_compute_capability=(9, 0)), [ws(devices=(gpu(0, cc=(8, 6)),))],
     ("ComputeCapability", "GPU 0 has compute capability 8.6 < 9.0 required (on ws-1)")),
    ("no float64", job(**CUDA, requires_float64=True), [ws(devices=(gpu(0, float64=False),))],
     ("Float64", "GPU 0 (cuda) has no 64-bit floats (on ws-1)")),
    ("unknown compute capability", job(**CUDA, min_cuda_compute_capability=(8, 0)),
     [ws(devices=(gpu(0, compute_capability=None),))],
     ("Unknown", "GPU 0 compute capability is unknown, so >= 8.0 cannot be confirmed (on ws-1)")),
    ("probe failed", job(**CUDA), [ws(health=(ProbeHealth("nvidia-smi", ProbeStatus.TIMEOUT, "no answer in 5 s"),))],
     ("Probe", "cuda devices unknown: nvidia-smi failed (timeout): no answer in 5 s")),
    ("python version: path last", job(python=">=3.12"), [ws()],
     ("Python", f"Python 3.11.7 does not satisfy >=3.12 on ws-1 in {PY}")),
    ("framework missing: path last", job(frameworks={"jax": ">=0.4"}), [ws()],
     ("Framework", f"jax is not installed on ws-1 in {PY}")),
    ("framework version: path last", job(frameworks={"torch": ">=2.5"}), [ws()],
     ("Framework", f"torch 2.4.0 does not satisfy >=2.5 on ws-1 in {PY}")),
    ("the environment that has the framework decides, not the first one reported",
     job(frameworks={"torch": ">=2"}),
     [ws(envs=(env(torch=None, interpreter="/usr/bin/python3"),
               env(import_errors={"torch": "pre-flight check failed: ImportError: libcudnn.so.9"})))],
     ("Environment", f"torch: import fails: pre-flight check failed: ImportError: libcudnn.so.9 on ws-1 in {PY}")),
    ("broken environment: path last", job(), [ws(envs=(env(ok=False, notes=("exec format error",)),))],
     ("Environment", f"environment could not be probed: exec format error on ws-1 in {PY}")),
    ("workdir missing: path last", job(workdir="/data/alice/proj"), [ws(existing_paths=frozenset())],
     ("Workdir", "workdir does not exist on ws-1: /data/alice/proj")),
    ("workdir denied: path last", job(workdir="/data/alice/proj", user="alice"),
     [ws(existing_paths=frozenset({"/data/alice/proj"}), denied_paths=frozenset({("alice", "/data/alice/proj")}),
         mode="system")],
     ("Workdir", "alice cannot enter the workdir on ws-1: /data/alice/proj")),
    ("workdir unanswered: path last", job(workdir="/nfs/proj"),
     [ws(existing_paths=frozenset(), unanswered_paths=frozenset({"/nfs/proj"}), path_timeout_s=2.0)],
     ("Workdir", "workdir did not answer within 2 s on ws-1: /nfs/proj")),
    ("no account", job(user="carol"), [ws(mode="system", missing_accounts=frozenset({"carol"}))],
     ("NoAccount", "no account 'carol' on ws-1")),
    ("another user's personal worker", job(user="carol"), [ws(mode="personal", user="dave")],
     ("NotAllowed", "gpulayerd on ws-1 runs only dave's jobs")),
    ("per-user GPU cap: the fair-share text", job(**CUDA, user="alice"),
     [ws(devices=(gpu(0, granted_to="m8a"), gpu(1)), mode="system", max_gpus_per_user=1,
         gpus_held_by_user={"alice": 1})],
     ("UserCap", "fair share: alice holds 1 of max 1 GPUs on ws-1")),
    ("offline", job(), [ws(online=False)], ("Offline", "worker ws-1 fits but is offline")),
    ("no worker", job(), [], ("NoWorker", "no worker known")),
    ("rejected at submit", job(accelerator=Accelerator.CUDA, gpu_count=0), [ws()],
     ("Rejected", "a cuda job needs gpu_count >= 1")),
    ("fits now", job(**CUDA), [ws(devices=(gpu(0, granted_to="m8x"), gpu(1)))], ("Ready", "fits now on ws-1 GPU 1")),
    ("multi-host: too few hosts", job(distributed=DistributedRequest(2, 1, "gloo")), [ws()],
     ("Hosts", "needs 2 hosts at once, 1 fit now")),
    ("multi-host: one host busy", job(distributed=DistributedRequest(2, 2, "gloo")),
     [ws("n1"), ws("n2", cpu_slots_total=2, cpu_slots_free=0)],
     ("Resources", "needs 2 hosts at once, 1 fit now; cpu slots 0 free of 2 on ws-2 (needs 2)")),
    ("driver too old for the CUDA build: path last", job(**CUDA),
     [ws(devices=(gpu(0, driver_version="470.82.01"),), envs=(env(cuda_builds={"torch": "12.4"}),))],
     ("Driver", f"torch 2.4.0+cu124 needs driver ≥ 525.60.13 (CUDA 12.x); ws-1 has 470.82.01 (CUDA 11.4) on ws-1 in {PY}")),
    ("operating system", job(os="darwin"), [ws(os="linux")], ("OS", "ws-1 runs linux, darwin required")),
    ("--worker names another worker", job(worker="login1"), [ws()], ("Target", "ws-1 is not the --worker named (login1)")),
    ("--no-slurm and only a Slurm worker", job(slurm=False), [ws(kind="slurm")],
     ("Target", "ws-1 is a Slurm worker (--no-slurm)")),
    ("--worker: the named worker's own reason decides", job(**{**CUDA, "gpu_count": 2}, worker="ws-2"),
     [ws("n1"), ws("n2", devices=(gpu(0),))], ("DeviceCount", "needs 2 whole cuda device(s) at once, worker ws-2 has 1 in all")),
]


@pytest.mark.parametrize(("case", "j", "workers", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_code_names_the_deciding_words(case: str, j: JobRequest, workers: list[WorkerSnapshot],
                                            expected: tuple[str, str]) -> None:
    assert why(j, *workers) == expected


def test_the_cases_cover_every_code_a_rejection_or_verdict_can_give() -> None:
    covered = {c[3][0] for c in CASES}
    # FairShare is added by the scheduler (below), GangSkew by the gang coordinator (test_gangskew),
    # Removed by a removed machine's job view (below, and tests/lan/test_revocation_lan.py); Dependency,
    # DependencyNeverSatisfied and Array by the dependency gate and the array book (tests/integration/test_arrays.py).
    assert covered | {"Pending", "FairShare", "GangSkew", "Removed", "Dependency", "DependencyNeverSatisfied",
                      "Array"} == {c.value for c in ReasonCode}


def test_held_devices_and_a_user_with_less_usage_ahead_read_fair_share_with_the_holders_named() -> None:
    usage = {"alice": fairshare.Usage(gpu_s=6.1 * 3600), "bob": fairshare.Usage(gpu_s=0.2 * 3600)}
    text = fairshare.fair_share_reason("alice", "bob", usage)
    fair = Rejection(RejectionCode.FAIR_SHARE, "fair_share", "alice", "bob", "n1", text)
    held = ws(devices=(gpu(0, granted_to="m8bob"),), mode="system")
    e = explain(job(**CUDA, user="alice"), [held], SUPPORT_MATRIX)
    row = e.workers[0]
    e = replace(e, workers=(replace(row, rejections=(*row.rejections, fair)),))
    assert reason_text(e) == ("FairShare: fair share: bob's jobs go first (less recent GPU use than alice); "
                              "GPU 0 is granted to job m8bob (on ws-1)")
    assert reason_text(explain(job(**CUDA, user="alice"), [held], SUPPORT_MATRIX)) == \
        "Resources: GPU 0 is granted to job m8bob (on ws-1)"  # nobody with less usage goes first: the holder decides
    # On a second worker only the fair-share order holds the job back: that row is closer to running.
    free = ws("n2", devices=(gpu(0),), mode="system")
    e2 = explain(job(**CUDA, user="alice"), [held, free], SUPPORT_MATRIX)
    rows = tuple(replace(r, state=FitState.FITS_BUT_BUSY, rejections=(*r.rejections, fair)) if r.worker == "n2"
                 else replace(r, rejections=(*r.rejections, fair)) for r in e2.workers)
    e2 = replace(e2, verdict=Verdict.FITS_BUT_BUSY, placement=None, workers=rows)
    assert reason_text(e2) == "FairShare: fair share: bob's jobs go first (less recent GPU use than alice)"


def test_the_busy_row_decides_over_rows_that_never_fit() -> None:
    j = job(**CUDA)
    e = explain(j, [ws("n1"), ws("n2", devices=(gpu(0, granted_to="m8b"),))], SUPPORT_MATRIX)
    assert reason_text(e) == "Resources: GPU 0 is granted to job m8b (on ws-2)"


def test_a_row_without_a_name_is_named_by_its_node_id() -> None:
    e = explain(job(distributed=DistributedRequest(1, 2, "gloo")),
                [WorkerSnapshot("n9", environments=(env(),), cpu_slots_total=1, cpu_slots_free=1)], SUPPORT_MATRIX)
    assert reason_text(e) == "DeviceCount: needs 2 CPU slots, worker n9 has 1 in all"


@pytest.mark.parametrize(("text", "expected"), [
    ("Resources: cpu slots 1 free of 2 on ws-1 (needs 2)", ("Resources", "cpu slots 1 free of 2 on ws-1 (needs 2)")),
    ("FairShare: fair share: b's jobs go first", ("FairShare", "fair share: b's jobs go first")),
    ("waiting for the scheduler", ("", "waiting for the scheduler")),
    ("Note: not a code", ("", "Note: not a code")),
    ("exited 3", ("", "exited 3")),
    ("", ("", "")),
])
def test_split_knows_only_the_documented_codes(text: str, expected: tuple[str, str]) -> None:
    assert split(text) == expected
    assert code_of(text) == expected[0]


@pytest.mark.parametrize(("status", "reason", "code"), [
    ("queued", "Resources: cpu slots 0 free of 1 on ws-1 (needs 1)", "Resources"),
    ("queued", "waiting for the scheduler", "Pending"),
    ("queued", "attempt 1 lost: no lease renewal", "Pending"),
    ("rejected", "needs 80 GB; the largest GPU has 24 GB", "Rejected"),
    ("running", "claimed by ws-1 (attempt 1)", ""),
    ("failed", "exited 3", ""),
])
def test_code_for_a_status(status: str, reason: str, code: str) -> None:
    assert code_for(status, reason) == code


def test_every_code_has_a_meaning_and_is_documented() -> None:
    assert set(MEANINGS) == set(ReasonCode)
    for name in ("architecture.md", "reasons.md"):
        docs = (Path(__file__).parents[2] / "docs" / name).read_text()
        for code in ReasonCode:
            assert f"| `{code.value}` |" in docs, (name, code)



@pytest.mark.parametrize(("status", "reason", "cell"), [
    ("queued", "Resources: cpu slots 0 free of 1 on ws-1 (needs 1)", "Resources: cpu slots 0 free of 1 on ws-1 (needs 1)"),
    ("queued", "waiting for the scheduler", "Pending: waiting for the scheduler"),
    ("rejected", "a cuda job needs gpu_count >= 1", "Rejected: a cuda job needs gpu_count >= 1"),
    ("running", "claimed by ws-1 (attempt 1)", "claimed by ws-1 (attempt 1)"),
    ("queued", "Workdir: did not answer\nsecond line", "Workdir: did not answer"),
])
def test_the_jobs_tables_reason_cell_starts_with_the_code(status: str, reason: str, cell: str) -> None:
    view = JobView.model_validate({"id": "m8a", "status": status, "reason": reason, "submitted_at": 0.0,
                                   "updated_at": 0.0, "spec": {"command": ["true"], "workdir": "/tmp"}})
    assert reason_cell(view) == cell
    assert json.loads(view.model_dump_json())["reason_code"] == code_for(status, reason)


def test_a_removed_machines_waiting_job_says_so_first_and_keeps_the_local_reason() -> None:
    shown = removed_reason("Memory: GPU 0 has 17.2 GB < 40 GB required on h3")
    assert shown.startswith("Removed: this machine was removed from the cluster")
    assert shown.endswith(" · Memory: GPU 0 has 17.2 GB < 40 GB required on h3")
    assert code_for("queued", shown) == "Removed"
    assert removed_reason("") == ""
    assert removed_reason("waiting for the scheduler") == "waiting for the scheduler"  # not judged yet
