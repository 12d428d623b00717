"""What a new user walking the README found (issues 14, 16, 17): capture's output, the cpu-only
profile, reused submission keys, a client that went away, CPU slots and MIG in ``devices``, a
CPU-only torch in ``explain``, a bad ``GPULAYER_TIMEOUT``, ``jobs --state/--limit`` and completion,
and REASON at 80 columns."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gpulayerd import text
from gpulayerd.api import server
from gpulayerd.api.server import make_local_app
from gpulayerd.app.common.requester import Requesters
from gpulayerd.app.local import LocalApi
from gpulayerd.app.roles import LocalRoles
from gpulayerd.cli import build_parser, main
from gpulayerd.cli.jobs import JOB_STATES, SHIPPED_PROFILE_NAMES
from gpulayerd.cli.jobs_table import default_columns, render_jobs
from gpulayerd.core.matching.evaluate import explain
from gpulayerd.core.matching.profiles import check_profile
from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.core.types import Accelerator, EnvironmentSnapshot, FrameworkVersion, JobRequest, WorkerSnapshot
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.host.profile_files import SHIPPED_PROFILES, load_profiles
from gpulayerd.models import JobSpec, JobView
from tests.fakes.daemons import OWNER, Lab, d

QUICKSTART = EnvironmentSnapshot(  # the README's quick-start venv: torch 2.13 CPU, no numpy
    interpreter="/home/u/gpulayer/.venv/bin/python", python_version="3.11.9",
    frameworks={"torch": FrameworkVersion("torch", "2.13.0+cpu", "torch")}, torch_cuda=False, torch_mps=False,
    distributed_backends=("gloo",), cuda_builds={"torch": ""},
)
HOST = WorkerSnapshot(node_id="me", name="me", environments=(QUICKSTART,), os="linux")


# ------------------------------------------------------------------ 1, 2: profiles


def test_capture_prints_toml_lines_and_stdout_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(EnvironmentProber, "probe", lambda self, python, torch_check=True: QUICKSTART)
    file = tmp_path / "p.toml"
    assert main(["profiles", "capture", "here", "--python", "/x/python", "--file", str(file)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == '[profile."here"]' and 'frameworks = { "torch" = "==2.13.*" }' in lines
    assert "\\n" not in out
    assert err == f"wrote profile here to {file}\n"
    assert file.is_file()
    other = tmp_path / "q.toml"
    monkeypatch.setenv("GPULAYER_USER_PROFILES", str(other))
    assert main(["profiles", "capture", "here", "--python", "/x/python", "--stdout"]) == 0
    out, err = capsys.readouterr()
    assert out == "\n".join(lines) + "\n" and err == ""
    assert not other.exists()


def test_cpu_only_fits_the_quickstart_venv_and_failures_read_naturally(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    shipped = load_profiles([SHIPPED_PROFILES])
    assert sorted(shipped) == list(SHIPPED_PROFILE_NAMES)  # what --profile completion offers
    cell = check_profile(shipped["cpu-only"], HOST, QUICKSTART)
    assert cell.ok, cell.failures
    caps = tmp_path / "caps.json"
    from gpulayerd.models import Capabilities

    caps.write_text(Capabilities.model_validate_json(_caps_json()).model_dump_json(), encoding="utf-8")
    monkeypatch.setenv("GPULAYER_USER_PROFILES", str(tmp_path / "u.toml"))
    monkeypatch.setenv("GPULAYER_SYSTEM_PROFILES", str(tmp_path / "s.toml"))
    (tmp_path / "u.toml").write_text('[profile."np"]\nframeworks = { numpy = ">=1.22" }\n', encoding="utf-8")
    assert main(["profiles", "--capabilities", str(caps)]) == 0
    out = capsys.readouterr().out
    assert "np on me (/home/u/gpulayer/.venv/bin/python): frameworks.numpy >=1.22 (not installed)" in out
    assert "has not installed" not in out
    cpu_row = next(line.split() for line in out.splitlines() if line.startswith("cpu-only "))
    assert cpu_row[1] == "✓"


def _caps_json() -> str:
    import json

    return json.dumps({"node_id": "me", "hostname": "me", "os": "linux", "environments": [{
        "interpreter": QUICKSTART.interpreter, "python_version": "3.11.9", "torch_cuda": False,
        "frameworks": {"torch": {"name": "torch", "version": "2.13.0+cpu", "distribution": "torch"}},
        "cuda_builds": {"torch": ""}}]})


# ------------------------------------------------------------------ 3: reused submission keys


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="glrw-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def sock(lab: Lab, short_dir: Path) -> AsyncIterator[Path]:
    o = d(lab, "owner")
    api = LocalApi(node_id=OWNER, hostname="owner", version="test", state_dir=str(o.config.state_dir),
                   owner=o.services.owner, machine=o.services.machine, directory=None,
                   signals=o.services.signals, clock=lab.clock, requesters=Requesters(mode="system", admin_group=""),
                   roles=LocalRoles(store=o.store, jobs=o.services.jobs))
    runner = web.AppRunner(make_local_app(api), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(short_dir / "d.sock")).start()
        yield short_dir / "d.sock"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_a_reused_key_with_another_spec_is_refused_and_the_same_spec_says_already(
        lab: Lab, sock: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(lab.workdir)

    def cli(*argv: str) -> int:
        return main(["--socket", str(sock), *argv])

    assert await asyncio.to_thread(cli, "submit", "--key", "K1", "--name", "a", "--", "true") == 0
    first = capsys.readouterr().out
    assert first.startswith("submitted job ")
    job_id = first.split()[2]
    assert await asyncio.to_thread(cli, "submit", "--key", "K1", "--name", "a", "--", "true") == 0
    assert capsys.readouterr().out.startswith(f"already submitted: job {job_id} (a, ")
    assert await asyncio.to_thread(cli, "submit", "--key", "K1", "--name", "a", "--", "false") == 2
    assert capsys.readouterr().err == \
        f"gpulayer: key K1 was already used for job {job_id} with a different spec\n"
    jobs = await d(lab, "owner").services.owner.list_jobs(None, None)
    assert [j.id for j in jobs] == [job_id]  # nothing stored by the retry or the refusal


# ------------------------------------------------------------------ 4: a client that went away


class _Closed:
    def is_closing(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@pytest.mark.asyncio
async def test_a_client_that_went_away_is_an_info_line_not_an_internal_error(
        caplog: pytest.LogCaptureFixture) -> None:
    async def reads_body(_: web.Request) -> web.StreamResponse:
        raise ConnectionResetError("Connection lost")

    request = make_mocked_request("POST", "/v1/jobs", transport=_Closed())
    with caplog.at_level(logging.INFO, logger=server.__name__):
        resp = await server._errors(request, reads_body)
    assert resp.status == 400
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "POST /v1/jobs: the client went away before the answer (Connection lost)")]


# ------------------------------------------------------------------ 5, 6: devices


def test_devices_shows_cpu_slots() -> None:
    from gpulayerd.cli.render import render_capabilities
    from gpulayerd.models import Capabilities

    caps = Capabilities.model_validate_json(_caps_json())
    caps.cpu_count, caps.cpu_slots_total, caps.cpu_slots_free = 16, 4, 3
    assert "CPU: 16 logical cores, 4 slots (3 free)   RAM: " in render_capabilities(caps)


def test_devices_says_mig_parents_and_lost_gpus_are_not_scheduled_and_mig_names_are_short(
        tmp_path: Path) -> None:
    from gpulayerd.cli.render import render_capabilities
    from tests.fakes.nvidia_recorded import LOST_AMONG_ROWS, MIG_BOX, MIG_UUIDS
    from tests.integration.components.test_hardware_truth import probe, worker_of

    caps, _ = worker_of(probe(tmp_path / "a", MIG_BOX)[0])
    out = render_capabilities(caps)
    rows = {line.split()[0]: line for line in out.splitlines()[4:] if line.startswith("  ") and line.split()}
    assert "no (MIG instances only)  MIG mode" in rows["0"]
    assert "  MIG 1g.10gb on GPU 0  " in rows["1002"] and "yes" in rows["1002"]
    assert max(text.width(line) for line in out.splitlines()[:10]) <= 125
    assert MIG_UUIDS["1g.10gb"] not in out and MIG_UUIDS["1g.10gb"] in render_capabilities(caps, wide=True)
    lost, _ = worker_of(probe(tmp_path / "b", LOST_AMONG_ROWS)[0])
    row = next(line for line in render_capabilities(lost).splitlines() if "GPU at 0000:41:00.0" in line)
    assert "  no (lost)  lost: Unable to determine" in row


# ------------------------------------------------------------------ 7: explain, CPU-only torch


def test_a_cpu_only_torch_is_a_known_build_not_unknown() -> None:
    job = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1)
    e = explain(job, [HOST], SUPPORT_MATRIX)
    row = next(c for c in e.workers[0].checks if c.requirement == "cuda_compat")
    assert (row.found, row.ok) == ("torch 2.13.0+cpu is a CPU-only build: no CUDA build to check", True)
    cpu = explain(JobRequest(job_id="c"), [HOST], SUPPORT_MATRIX)
    assert all(c.requirement != "cuda_compat" for c in cpu.workers[0].checks)


# ------------------------------------------------------------------ 9, 10: jobs


def test_jobs_state_choices_limit_and_completion(capsys: pytest.CaptureFixture[str]) -> None:
    assert tuple(s.value for s in JobStatus) == JOB_STATES
    assert main(["jobs", "--state", "bogus"]) == 2
    assert "argument --state: invalid choice: 'bogus' (choose from 'queued'" in capsys.readouterr().err
    args = build_parser().parse_args(["jobs", "--limit", "5", "--state", "queued"])
    assert (args.limit, args.state) == (5, ["queued"])
    assert build_parser().parse_args(["submit", "--profile", "mine", "--", "true"]).profile == "mine"
    from gpulayerd.cli.completion import script

    src = script("bash")
    assert "_state_choices=(queued claimed running succeeded failed timeout cancelled lost rejected)" in src
    assert "submit___profile_choices=(cpu-only torch-2.4-cu124 torch-2.5-cu121 torch-mps)" in src
    assert "run___profile_choices=(cpu-only" in src


def _job(job_id: str, name: str, reason: str) -> JobView:
    spec = JobSpec.model_validate({"command": ["true"], "workdir": "/tmp", "name": name, "user": "alice"})
    return JobView(id=job_id, name=name, status="queued", reason=reason, submitted_at=0.0, updated_at=0.0, spec=spec)


def test_jobs_at_80_columns_keep_the_reason_and_drop_a_lone_user() -> None:
    jobs = [_job("m8qgmtbntdp5", "hyperparameter-sweep-lr-3e-4", "Resources: cpu slots 0 free of 2 on ws-1 (needs 1)"),
            _job("m8qgmtbntdp6", "eval", "Resources: GPU 0 held by bob's job m8qg (train)")]
    columns = default_columns(jobs, "alice")  # alice's own jobs: no USER to tell apart
    assert columns == ["id", "name", "state", "where", "age", "reason"]
    assert "user" in default_columns(jobs, "bob")  # bob reading alice's jobs sees whose they are
    lines = render_jobs(jobs, columns, 80, now=10.0).splitlines()
    assert all(text.width(line) <= 80 for line in lines)
    assert lines[1].endswith("  hyperpa…  queued  —      10s  Resources: cpu slots 0 free of 2 on"), lines[1]
    assert lines[2] == " " * 44 + "ws-1 (needs 1)", lines  # the rest of the reason, in its column
    wider = render_jobs(jobs, columns, 94, now=10.0).splitlines()  # below 100: REASON before NAME
    assert wider[1].endswith("  hyperpa…  queued  —      10s  Resources: cpu slots 0 free of 2 on ws-1 (needs 1)")
    bobs = _job("m8qgmtbntdp7", "x", "Pending")
    bobs = bobs.model_copy(update={"spec": bobs.spec.model_copy(update={"user": "bob"})})
    assert "user" in default_columns([*jobs, bobs], "alice")
