"""Environments answered from metadata first; the import-based torch check lands in the background.

The crafted environment's ``torch`` import blocks until a gate file appears, so the test
decides when the check lands: nothing here sleeps or times anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from pathlib import Path

import pytest

from gpulayerd.app.common.signals import Signals
from gpulayerd.app.worker.envchecks import TorchChecks
from gpulayerd.cli.render import render_capabilities
from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.environments import TORCH_PENDING_NOTE, EnvironmentProber
from gpulayerd.models import SubmitRequest
from tests.fakes.daemons import W1, Lab
from tests.fakes.envs import fake_torch, make_env
from tests.integration.components.test_environments import counting_interpreter, starts

PROBE_TIMEOUT_S = 60.0
LAND_TIMEOUT_S = 60.0  # a limit on a condition wait, not a timing assert

# torch whose import waits for the gate file: CPU only, gloo there.
GATED_TORCH = fake_torch(cuda=False, nccl=False, prelude="""\
import os as _os, time as _time
while not _os.path.exists({gate!r}):
    _time.sleep(0.01)
""")


def gated_env(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(counting interpreter, its start counter, the gate file that lets ``import torch`` finish)."""
    gate = tmp_path / "gate"
    python, _ = make_env(tmp_path / "env", {"torch": "2.4.0"}, {
        "torch/version.py": "__version__ = '2.4.0'\ncuda = None\n",
        "torch/__init__.py": GATED_TORCH.format(gate=str(gate)),
    })
    wrapper, counter = counting_interpreter(tmp_path, python)
    return wrapper, counter, gate


@pytest.mark.asyncio
async def test_metadata_answer_first_then_the_torch_check_lands_and_a_waiting_job_starts(tmp_path: Path) -> None:
    python, counter, gate = await asyncio.to_thread(gated_env, tmp_path)
    cache_dir = tmp_path / "cache"
    lab = Lab(tmp_path / "lab")
    w1 = await lab.add("w1", W1, cpu_slots=2)
    try:
        machine, signals = w1.services.machine, w1.services.signals
        prober = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir)
        machine._config = machine._config.model_copy(update={"interpreters": [str(python)]})
        machine._prober = prober
        machine.torch_checks = TorchChecks(prober, signals, machine._apply_environment)

        await machine.probe_once()  # returns while `import torch` is still blocked on the gate
        assert machine.torch_checks.running()
        env = (await machine.capabilities()).environments[0]
        assert (env.torch_pending, env.torch_cuda, env.distributed_backends) == (True, None, None)
        assert env.frameworks["torch"].version == "2.4.0" and env.cuda_builds == {"torch": ""}
        assert any("still running" in n for n in env.notes)
        shown = render_capabilities(await machine.capabilities())
        assert "torch.cuda, torch.mps, distributed: pending (the torch check is still running)" in shown

        # A job that needs a runtime fact (the gloo backend) waits, saying why.
        spec = {"command": ["python", "train.py"], "workdir": str(lab.workdir),
                "distributed": {"nnodes": 1, "nproc_per_node": 1, "backend": "gloo"}}
        job = (await w1.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
        await w1.services.scheduler.run_once()
        waiting = await lab.job(w1, job)
        assert waiting.status == "queued"
        assert "the torch check of this environment is still running" in (waiting.reason or "")
        assert machine.torch_checks.running()  # all of the above happened before the check landed

        signals.clear_wake()
        gate.touch()
        checks = list(machine.torch_checks._running.values())
        await asyncio.wait_for(asyncio.gather(*checks), LAND_TIMEOUT_S)
        env = (await machine.capabilities()).environments[0]
        assert (env.torch_pending, env.torch_cuda, env.torch_mps, env.distributed_backends) == (
            False, False, False, ["gloo"])
        assert signals._wake.is_set()  # the scheduler is asked to judge again

        await lab.schedule()
        assert (await lab.job(w1, job)).status == "running"
        assert starts(counter) == 2  # the metadata probe, then the full one
        assert machine._inventory is not None
        driver_state = machine._inventory.driver_state
    finally:
        await lab.close()

    # The next start (same driver state) reads the full answer from the cache: no Python runs, nothing pending.
    fresh = EnvironmentProber(PROBE_TIMEOUT_S, cache_dir)
    fresh.set_driver_state(driver_state)
    snap, needs_check = await asyncio.to_thread(fresh.metadata_first, str(python))
    assert (needs_check, snap.torch_pending, snap.distributed_backends) == (False, False, ("gloo",))
    assert starts(counter) == 2
    # Under another driver state (the driver became ready, another version) the torch answer is asked again.
    fresh.set_driver_state(driver_state + ";nvidia-smi=ok 570.86.15")
    snap, needs_check = await asyncio.to_thread(fresh.metadata_first, str(python))
    assert (needs_check, snap.torch_pending) == (True, True)


def test_without_torch_the_metadata_answer_is_final(tmp_path: Path) -> None:
    python, _ = make_env(tmp_path / "env", {"numpy": "1.26.4"})
    snap, needs_check = EnvironmentProber(PROBE_TIMEOUT_S, None).metadata_first(str(python))
    assert (needs_check, snap.torch_pending, snap.frameworks["numpy"].version) == (False, False, "1.26.4")


def test_stopping_kills_a_running_torch_check(tmp_path: Path) -> None:
    python, _, _gate = gated_env(tmp_path)  # the gate never opens: the import would block for good
    prober = EnvironmentProber(PROBE_TIMEOUT_S, None)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        check = pool.submit(prober.probe_full, str(python))
        end = time.monotonic() + LAND_TIMEOUT_S
        while not prober._torch_runs:  # wait until its process group is known (a condition, not a delay)
            assert time.monotonic() < end and not check.done()
            with contextlib.suppress(concurrent.futures.TimeoutError):
                check.result(timeout=0.01)
        assert prober.stop_torch_checks() == 1
        snap, complete = check.result(timeout=LAND_TIMEOUT_S)
    assert not complete
    assert (snap.torch_cuda, snap.torch_pending) == (None, False)
    assert any("killed by SIGKILL" in n for n in snap.notes)
    assert prober.cached(str(python)) is None  # a killed check is not cached


@pytest.mark.asyncio
async def test_a_torch_check_that_does_not_finish_leaves_the_facts_unknown_not_pending(tmp_path: Path) -> None:
    python, _ = await asyncio.to_thread(make_env, tmp_path / "env", {"torch": "2.4.0"},
                                        {"torch/__init__.py": "import os\nos._exit(3)\n"})
    landed: list[EnvironmentSnapshot] = []

    async def apply(env: EnvironmentSnapshot) -> None:
        landed.append(env)

    signals = Signals()
    checks = TorchChecks(EnvironmentProber(PROBE_TIMEOUT_S, None), signals, apply)
    try:
        (first,) = await checks.answers([str(python)])
        assert first.torch_pending and TORCH_PENDING_NOTE in first.notes
        await asyncio.wait_for(asyncio.gather(*checks._running.values()), LAND_TIMEOUT_S)
        (done,) = landed
        assert (done.torch_pending, done.torch_cuda, done.frameworks["torch"].version) == (False, None, "2.4.0")
        assert "torch: availability unknown: the torch check exited with status 3" in done.notes
        # The next pass: metadata with the failure's note (unknown, not pending), and one more try.
        (again,) = await checks.answers([str(python)])
        assert not again.torch_pending and TORCH_PENDING_NOTE not in again.notes
        assert "torch: availability unknown: the torch check exited with status 3" in again.notes
        assert checks.running()
        await asyncio.wait_for(asyncio.gather(*checks._running.values()), LAND_TIMEOUT_S)
        assert len(landed) == 2
    finally:
        await signals.close()
