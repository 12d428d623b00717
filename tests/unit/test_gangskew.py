"""Gang members checked against each other (gpulayerd.core.matching.gangskew): same framework versions
and Python minor version on every member, a set that agrees chosen in node-id order, the skew named."""

from __future__ import annotations

from gpulayerd.core.matching.gangskew import GANG_SKEW, consistent_members
from gpulayerd.core.reasons import ReasonCode
from gpulayerd.core.types import (
    Accelerator,
    DistributedRequest,
    EnvironmentSnapshot,
    FrameworkVersion,
    JobRequest,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import Placement

PY = "/usr/bin/python3"


def worker(node: str, torch: str | None, python: str = "3.11.9", numpy: str | None = "1.26.4") -> tuple[
        WorkerSnapshot, Placement]:
    fws = {k: FrameworkVersion(k, v, k) for k, v in (("torch", torch), ("numpy", numpy)) if v is not None}
    env = EnvironmentSnapshot(interpreter=PY, python_version=python, frameworks=fws)
    return WorkerSnapshot(node, name=f"host-{node}", environments=(env,)), Placement(node, PY, (), (), Accelerator.CPU)


def job(**frameworks: str) -> JobRequest:
    return JobRequest(job_id="j", accelerator=Accelerator.CPU, frameworks=frameworks,
                      distributed=DistributedRequest(nnodes=2, nproc_per_node=1))


def test_the_code_is_a_reason_code() -> None:
    assert ReasonCode.GANG_SKEW.value == GANG_SKEW


def test_agreeing_hosts_are_chosen_first_in_node_id_order() -> None:
    fits = [worker("n3", "2.13.0"), worker("n1", "2.13.0"), worker("n2", "2.12.0"), worker("n4", "2.12.0")]
    assert consistent_members(job(torch=">=2.12"), fits, 2) == (["n1", "n3"], None)


def test_torch_versions_that_differ_are_named_newest_first() -> None:
    members, reason = consistent_members(job(torch=">=2.12"), [worker("h1", "2.12.0"), worker("h2", "2.13.0")], 2)
    assert members == []
    assert reason is not None and reason.startswith("GangSkew: torch 2.13.0 on host-h2, 2.12.0 on host-h1")


def test_python_minor_and_named_frameworks_are_compared_micro_python_versions_are_not() -> None:
    _, reason = consistent_members(job(), [worker("h1", "2.13.0", "3.11.9"), worker("h2", "2.13.0", "3.12.1")], 2)
    assert reason is not None and "python 3.12 on host-h2, 3.11 on host-h1" in reason
    assert consistent_members(job(), [worker("h1", "2.13.0", "3.11.2"), worker("h2", "2.13.0", "3.11.9")], 2)[1] \
        is None
    # numpy differs, but the job does not name it: not compared; named, it is.
    fits = [worker("h1", "2.13.0", numpy="1.26.4"), worker("h2", "2.13.0", numpy="2.1.0")]
    assert consistent_members(job(), fits, 2)[1] is None
    assert "numpy 2.1.0 on host-h2, 1.26.4 on host-h1" in (consistent_members(job(numpy=">=1"), fits, 2)[1] or "")


def test_an_exact_pin_ignores_the_local_build_tag() -> None:
    fits = [worker("h1", "2.13.0+cu124"), worker("h2", "2.13.0+cu126")]
    assert consistent_members(job(torch="==2.13.0"), fits, 2) == (["h1", "h2"], None)
    assert consistent_members(job(torch=">=2.13"), fits, 2)[1] is not None


def test_unknown_versions_never_agree_and_long_lists_are_cut() -> None:
    members, reason = consistent_members(job(), [worker("h1", "2.13.0", "?"), worker("h2", "2.13.0", "?")], 2)
    assert members == [] and reason is not None and "python" in reason
    many = [worker(f"n{i:03d}", f"2.{i}.0") for i in range(200)]
    _, reason = consistent_members(job(), many, 2)
    assert reason is not None and len(reason) < 600 and "and 196 more version(s)" in reason
