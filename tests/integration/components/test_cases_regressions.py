"""Recorded cases 39, 42, 46, 47 and 50 replayed as regressions, each at the level a user sees it.

- bug-39 (a LaunchAgent gets launchd's bare PATH): the plist ``gpulayer service install --os macos
  --dry-run`` prints sets ``EnvironmentVariables`` PATH (the installer's, or at least
  ``/opt/homebrew/bin`` and ``/usr/local/bin`` plus the system dirs), or the README's macOS section
  warns about it (:func:`test_bug39_launch_agent_plist_sets_path_or_readme_warns`); a job submitted
  with ``gpulayer submit --accelerator cpu -- mytool`` from a shell whose PATH has a Homebrew-like
  dir runs, through the real Starter, Runner and watchdog, while the daemon itself has only
  launchd's ``/usr/bin:/bin:/usr/sbin:/sbin`` (:func:`test_bug39_job_runs_with_the_submitters_path_under_launchds_bare_path`).
- bug-42 (``WARNING: infoROM is corrupted at gpu ...`` in the CSV, exit 14): through the fake
  nvidia-smi and :func:`discover_host`, with the warning after the row (recorded) and before it (the
  case's variant): one Quadro P4000, 8105 MiB, compute capability unknown, not lost, the warning
  kept verbatim in the notes, exit 14 a note and not a failed probe; ``gpulayer devices`` lists it
  with SCHEDULED yes and the matcher counts it as the one qualifying GPU of a CUDA job (busy at
  most: its recorded 701 MiB in use with no compute process listed is bug-44's hidden use)
  (:func:`test_bug42_inforom_warning_is_a_note_and_the_gpu_is_schedulable`). The same machine's
  nvidia-smi prints the warning and exits 14 on every call (the recorded plain table ends with
  it): the follow-up queries' warnings make no fault or lost GPU either
  (:func:`test_bug42_kind_every_call_warns_and_exits_14`).
- bug-46 (a CPU-only torch on a GPU host): the venv's real ``torch 2.13.0+cpu`` probed by the real
  EnvironmentProber, two GPUs from the fake nvidia-smi; the job (cuda, 1 GPU, 16 GB, torch>=2.4) is
  not placed although a GPU and the torch version qualify, and the reason says the interpreter's
  torch is a CPU-only build and a CUDA wheel is needed (:func:`test_bug46_cpu_only_torch_on_a_gpu_host_is_not_placed_and_says_why`).
- bug-47 (driver 470.223.02, CUDA 11.4, and a cu121 torch): a stand-in torch that answers and warns
  like the real one; ``gpulayer devices`` still lists the GTX 1050 Ti and marks torch.cuda not
  available; the job is not placed and the reason names the driver (470.223.02, CUDA 11.4) and
  what the build needs (CUDA 12.x: driver >= 525.60.13)
  (:func:`test_bug47_driver_too_old_for_the_cuda_build_names_both_sides`).
- bug-50 (``127.0.1.1 <hostname>`` in /etc/hosts, gloo on the loopback): the two namespaces' hosts
  advertise only their LAN address (:func:`test_bug50_each_host_advertises_its_lan_interface_not_loopback`),
  and each rank of the case's 2-host gloo job, started by the real gang services of three
  daemons (loopback fakes, fake runners), gets ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` =
  its host's advertised interface and ``--master-addr`` = rank 0's advertised IP literal
  (:func:`test_bug50_each_rank_is_pinned_to_its_advertised_interface_and_an_ip_literal`).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import plistlib
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayerd import cli
from gpulayerd.app.common.clock import Clock
from gpulayerd.app.worker.starter import Starter
from gpulayerd.cli.render import render_capabilities, render_explanation
from gpulayerd.config import DaemonConfig
from gpulayerd.core.matching.evaluate import evaluate, explain
from gpulayerd.core.types import (
    GB,
    Accelerator,
    DeviceState,
    EnvironmentSnapshot,
    JobRequest,
    ProbeStatus,
    WorkerSnapshot,
)
from gpulayerd.core.verdict import FitState, Placement
from gpulayerd.gpu.compose import build_capabilities
from gpulayerd.gpu.discovery import discover_host
from gpulayerd.gpu.environments import EnvironmentProber
from gpulayerd.gpu.support import SUPPORT_MATRIX
from gpulayerd.models import Capabilities, ExplanationModel, SubmitRequest, job_spec_from_mapping
from gpulayerd.net.interfaces import interface_for_address, lan_addresses
from gpulayerd.runs.account import this_user
from gpulayerd.runs.runner import Runner
from tests.fakes import COMPUTE_APPS_ARGV, MIG_MODE_ARGV, install_fake_tool, response, smi_header
from tests.fakes.daemons import Lab, d
from tests.fakes.envs import fake_torch, make_env
from tests.fakes.loopback import LoopbackNode
from tests.integration.components.test_cases_nvidia import (
    FULL,
    MIB,
    NO_APPS,
    NO_CC,
    config,
    cuda,
    load,
    nvidia_health,
    query_fields,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
PLAIN_ENV = (EnvironmentSnapshot(interpreter="/usr/bin/python3", python_version="3.11.7"),)


def _devices_report(inv: Any, envs: tuple[EnvironmentSnapshot, ...] | list[EnvironmentSnapshot]) -> Capabilities:
    """What ``gpulayer devices`` shows of this machine: the inventory and the probed environments."""
    return build_capabilities(inv, list(envs), "n" * 52, 0.0)


def _why(job: JobRequest, worker: WorkerSnapshot) -> str:
    """``gpulayer explain`` of ``job`` against ``worker``, as printed."""
    return render_explanation(ExplanationModel.from_core(explain(job, [worker], SUPPORT_MATRIX)), "job j")


# ------------------------------------------------------------------------------ bug-39


LAUNCHD_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


def _readme_macos_section() -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("**macOS (launchd agent).**")
    return text[start:text.index("**Check and remove.**", start)]


def test_bug39_launch_agent_plist_sets_path_or_readme_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    case = load("bug-39")
    assert "--os macos --dry-run" in case["input"]["plist"]
    assert "no EnvironmentVariables key" in case["input"]["plist"]  # what was recorded
    system_dirs = LAUNCHD_PATH.split(":")
    assert f"env -i PATH={LAUNCHD_PATH}" in case["input"]["note"]
    home = tmp_path / "home"
    home.mkdir()
    brew = tmp_path / "opt" / "homebrew" / "bin"  # the installer's shell has Homebrew on its PATH
    installer_path = f"{brew}:/usr/local/bin:{LAUNCHD_PATH}"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("GPULAYER_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.setenv("PATH", installer_path)

    code = cli.main(["service", "install", "--os", "macos", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plist = plistlib.loads(out.encode())
    assert plist["Label"] == "io.gpulayer.gpulayerd"
    env = plist.get("EnvironmentVariables")
    if env is not None:
        path = str(env.get("PATH", "")).split(":")
        assert set(system_dirs) <= set(path), path  # the system dirs stay
        homebrew = {"/opt/homebrew/bin", "/usr/local/bin"} <= set(path)
        installers = set(installer_path.split(":")) <= set(path)
        assert homebrew or installers, f"EnvironmentVariables PATH {env.get('PATH')!r} has no Homebrew dirs"
    else:
        section = _readme_macos_section()
        assert "PATH" in section and ("/opt/homebrew" in section or "Homebrew" in section), (
            "the LaunchAgent plist sets no EnvironmentVariables PATH (launchd gives the agent "
            f"{LAUNCHD_PATH}) and the README's macOS section does not warn about it:\n{section}")


class _CapturingClient:
    """Stands for the daemon's client in ``gpulayer submit``: keeps what the CLI sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, object], str]] = []

    def submit(self, body: dict[str, object], path: str = "", key: str = "") -> dict[str, object]:
        self.sent.append((body, path))
        return {"id": "j"}

    def header(self, name: str) -> str:
        return "false"


def test_bug39_job_runs_with_the_submitters_path_under_launchds_bare_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case = load("bug-39")
    argv = case["input"]["job"].split("(")[0].split()  # gpulayer submit --accelerator cpu -- mytool
    assert argv[:2] == ["gpulayer", "submit"] and argv[-1] == "mytool"
    assert case["expected"]["job"] == "runs"
    brew = tmp_path / "opt" / "homebrew" / "bin"
    brew.mkdir(parents=True)
    tool = brew / "mytool"
    tool.write_text("#!/bin/sh\necho \"mytool ran in $PWD\"\n")
    tool.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    submitter_path = f"{brew}:/usr/local/bin:{LAUNCHD_PATH}"

    # gpulayer submit, in the user's terminal: the spec and the shell's PATH go to the daemon.
    import gpulayerd.cli.jobs as jobs

    client = _CapturingClient()
    monkeypatch.setattr(jobs, "call_daemon", lambda args, call, on_timeout="": call(client))
    monkeypatch.setenv("PATH", submitter_path)
    args = cli.build_parser().parse_args([*argv[1:-2], "--workdir", str(work), "--", argv[-1]])
    assert isinstance(args, argparse.Namespace)
    jobs.submit_job(args, jobs.spec_body(args))
    ((body, path),) = client.sent
    assert path == submitter_path and body["command"] == ["mytool"]

    # The daemon (a LaunchAgent: launchd's PATH only) stores it as the owner does and starts it.
    monkeypatch.setenv("PATH", LAUNCHD_PATH)
    me = this_user().name
    spec = job_spec_from_mapping({**body, "user": me, "path": path}, source="job spec", base_dir="/")
    runner = Runner(tmp_path / "state" / "runs", grace_s=0.5, poll_interval_s=0.05)
    starter = Starter(DaemonConfig(state_dir=tmp_path / "state", mode="personal"), runner, Clock())
    placement = Placement("n1", sys.executable, (), (), Accelerator.CPU)
    handle = asyncio.run(starter.start("bug39", 1, spec, placement, 60.0, []))
    status = asyncio.run(asyncio.wait_for(runner.async_wait(handle), 20.0))
    out, err = (p.read_text() if p.exists() else "" for p in runner.log_paths("bug39", 1))
    assert status.exit_code == 0, (status, out, err)
    assert out == f"mytool ran in {work}\n"


# ------------------------------------------------------------------------------ bug-42


WARNING_42 = load("bug-42")["input"]["retry_stdout"].splitlines()[1]
UUID_42 = "GPU-00000000-0000-4000-8000-000000000001"


def _bug42_checks(inv: Any) -> None:
    exp = load("bug-42")["expected"]
    assert exp["gpus"] == "one Quadro P4000, 8105 MiB, schedulable, not lost, compute capability unknown"
    (gpu,) = cuda(inv)  # one GPU: the warning is neither a row nor a lost GPU
    assert (gpu.index, gpu.uuid, gpu.name) == (0, UUID_42, "Quadro P4000")
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (8105 * MIB, 701 * MIB)
    assert gpu.compute_capability is None
    assert gpu.driver_version == "384.130"
    assert gpu.state is DeviceState.OK and gpu.state_reason == ""
    health = nvidia_health(inv)
    assert health.status is ProbeStatus.OK, health  # exit 14 with rows printed: not a failed probe
    assert health.message == "1 GPU(s), driver 384.130"
    assert f"nvidia-smi: {WARNING_42}" in inv.notes  # verbatim
    assert "nvidia-smi exited with status 14 but listed 1 GPU(s)" in inv.notes
    assert any("compute capability unknown" in n for n in inv.notes)

    caps = _devices_report(inv, PLAIN_ENV)
    table = render_capabilities(caps, wide=True)
    (row,) = [line for line in table.splitlines() if re.match(r"\s+0\s+cuda\s", line)]
    # SCHEDULED yes: gpulayer grants it (its 701 MiB in use, with no compute process listed, make it
    # busy by bug-44's rule; that is a state, not a dropped GPU).
    assert re.search(r"0\s+cuda\s+Quadro P4000\s+0\.7 / 8\.5 GB dedicated\s+—\s+384\.130\s+yes\s", row), row
    assert "lost" not in row and "unusable" not in row
    assert f"  - nvidia-smi: {WARNING_42}" in table.splitlines()

    job = JobRequest(job_id="j", accelerator=Accelerator.CUDA, gpu_count=1)
    ev = evaluate(job, caps.to_core(), SUPPORT_MATRIX)
    assert ev.state in (FitState.FITS_NOW, FitState.FITS_BUT_BUSY), ev.rejections
    assert {c.requirement: c.found for c in ev.checks}["gpu_count"].startswith("1 qualify")
    assert all(r.requirement == "free devices" and r.device == 0 for r in ev.rejections), ev.rejections


@pytest.mark.parametrize("warning_at", ["after the row (recorded)", "before the row (variant)"])
def test_bug42_inforom_warning_is_a_note_and_the_gpu_is_schedulable(tmp_path: Path, warning_at: str) -> None:
    inp = load("bug-42")["input"]
    assert inp["recorded_table_tail"].endswith(WARNING_42) and WARNING_42.startswith("WARNING: infoROM")
    row, warning = inp["retry_stdout"].splitlines(keepends=True)
    assert len(row.split(", ")) == len(query_fields(NO_CC[0]))  # recorded in the daemon's retry shape
    retry = row + warning if warning_at.startswith("after") else warning + row
    assert "before" in inp["variant"]
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [
        response(FULL, inp["first_query_stdout"], exit_code=inp["first_query_exit"]),
        response(NO_CC, retry, exit_code=inp["retry_exit_code"]),
        NO_APPS,
        response([], inp["recorded_table_tail"] + "\n", exit_code=14),
    ])
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    _bug42_checks(inv)
    assert fake.argvs() == [FULL, NO_CC, MIG_MODE_ARGV, COMPUTE_APPS_ARGV, []]


def test_bug42_kind_every_call_warns_and_exits_14(tmp_path: Path) -> None:
    """The recorded plain ``nvidia-smi`` ends with the warning too: that tool prints it, and exits 14,
    on every call. The follow-up queries (the R384 driver rejects ``mig.mode.current``; then bus id,
    compute mode and pstate; then the process list, which has no process) must not turn the
    warning into a fault or a lost GPU: GPU 0 stays schedulable."""
    inp = load("bug-42")["input"]
    warning = WARNING_42 + "\n"
    no_mig = ["--query-gpu=index,uuid,pci.bus_id,compute_mode,pstate", MIG_MODE_ARGV[1]]
    fake = install_fake_tool(tmp_path / "bin", "nvidia-smi", [
        response(FULL, inp["first_query_stdout"], exit_code=inp["first_query_exit"]),
        response(NO_CC, inp["retry_stdout"], exit_code=14),
        response(MIG_MODE_ARGV, 'Field "mig.mode.current" is not a valid field to query.\n\n', exit_code=2),
        response(no_mig, f"0, {UUID_42}, 00000000:B3:00.0, Default, P8\n{warning}", exit_code=14),
        response(COMPUTE_APPS_ARGV, warning, exit_code=14),
        response([], inp["recorded_table_tail"] + "\n", exit_code=14),
    ])
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    assert fake.argvs() == [FULL, NO_CC, MIG_MODE_ARGV, no_mig, COMPUTE_APPS_ARGV, []]
    (gpu,) = cuda(inv)
    assert gpu.pci_bus_id == "0000:b3:00.0"  # the bus id the warning names: the same GPU, not a lost one
    assert gpu.compute_mode == "Default"  # the second query's row was read despite the warning and exit 14
    _bug42_checks(inv)


# ------------------------------------------------------------------------------ bug-46


@pytest.fixture(scope="module")
def venv_torch() -> EnvironmentSnapshot:
    """This venv's interpreter, probed for real (its torch is the CPU build the quickstart installs)."""
    return EnvironmentProber(60.0, None).probe(sys.executable, use_cache=False)


def test_bug46_cpu_only_torch_on_a_gpu_host_is_not_placed_and_says_why(
        tmp_path: Path, venv_torch: EnvironmentSnapshot) -> None:
    case = load("bug-46")
    inp = case["input"]
    assert query_fields(inp["command"]) == query_fields(FULL[0])  # the daemon's own query: replayed verbatim
    install_fake_tool(tmp_path / "bin", "nvidia-smi",
                      [response(FULL, inp["stdout"]), NO_APPS, smi_header("550.127.05", "12.4")])
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    assert [(g.name, g.memory_total_bytes) for g in cuda(inv)] == [
        ("NVIDIA GeForce GT 1030", 2048 * MIB), ("NVIDIA GeForce RTX 3090", 24576 * MIB)]

    env = venv_torch
    assert env.frameworks["torch"].version == inp["torch_version"] == "2.13.0+cpu"
    assert env.cuda_builds.get("torch") == ""  # torch/version.py: cuda = None
    assert env.torch_cuda is False

    caps = _devices_report(inv, [env])
    table = render_capabilities(caps)
    assert "torch 2.13.0+cpu" in table and "torch.cuda: not available" in table

    job = inp["job"]
    req = JobRequest(job_id="j", accelerator=Accelerator(job["accelerator"]), gpu_count=job["gpu_count"],
                     gpu_memory_bytes=int(job["gpu_memory_gb"] * GB), frameworks=job["frameworks"])
    worker = caps.to_core()
    ev = evaluate(req, worker, SUPPORT_MATRIX)
    assert ev.placement is None and ev.state is FitState.NO_FIT  # must_not: placed on the RTX 3090
    rows = {c.requirement: c for c in ev.checks}
    assert rows["frameworks.torch"].ok and rows["gpu_count"].ok  # >=2.4 and the 24 GB GPU do qualify
    messages = [r.message for r in ev.rejections]
    assert messages, ev
    said = [m for m in messages if env.interpreter in m and "CPU-only" in m
            and re.search(r"CUDA (wheel|build of torch)", m)]
    assert said, ("the reason should say torch in that interpreter is a CPU-only build "
                  f"(torch.version.cuda None) and that a CUDA wheel is needed; it says {messages}")
    assert f"why: {said[0]}" in _why(req, worker)


# ------------------------------------------------------------------------------ bug-47


def _stand_in_torch(root: Path, version: str, cuda: str, warning: str) -> Path:
    """A venv whose torch is a ``version`` wheel built for CUDA ``cuda`` whose
    ``torch.cuda.is_available()`` warns ``warning`` (a UserWarning, as the real one does) and
    returns False."""
    init = "import warnings\n" + fake_torch(cuda=False, nccl=True).replace(
        "is_available = staticmethod(lambda: False)\n    device_count",
        f"is_available = staticmethod(lambda: (warnings.warn({warning!r}, UserWarning), False)[1])\n"
        "    device_count", 1)
    assert "warnings.warn" in init
    python, _ = make_env(root, {"torch": version}, {
        "torch/__init__.py": init,
        "torch/version.py": f"__version__ = {version!r}\ncuda = {cuda!r}\n",
    })
    return python


def test_bug47_driver_too_old_for_the_cuda_build_names_both_sides(tmp_path: Path) -> None:
    case = load("bug-47")
    inp, exp = case["input"], case["expected"]
    torch = inp["torch"]
    install_fake_tool(tmp_path / "bin", "nvidia-smi", [
        response(FULL, inp["first_query_stdout"], exit_code=2),
        response(NO_CC, inp["retry_stdout"]),
        NO_APPS,
        response([], inp["plain_header"] + "\n"),
    ])
    inv = discover_host(config(tmp_path), SUPPORT_MATRIX)
    assert inv.driver_cuda == "11.4"
    warning = inp["recorded_warning"].splitlines()[0].removeprefix("UserWarning: ")
    python = _stand_in_torch(tmp_path / "env", torch["version"], torch["version.cuda"], warning)
    env = EnvironmentProber(60.0, None).probe(str(python), use_cache=False)
    assert env.frameworks["torch"].version == "2.1.1+cu121" and env.cuda_builds["torch"] == "12.1"
    assert env.torch_cuda is torch["cuda.is_available()"] is False

    # devices: the GPU is still listed (nvidia-smi works); the environment says torch.cuda is not available
    assert exp["devices"].startswith("the GPU still listed")
    caps = _devices_report(inv, [env])
    table = render_capabilities(caps)
    (gpu,) = cuda(inv)
    assert (gpu.name, gpu.driver_version, gpu.memory_total_bytes) == ("NVIDIA GeForce GTX 1050 Ti", "470.223.02",
                                                                       4040 * MIB)
    assert re.search(r"0\s+cuda\s+NVIDIA GeForce GTX 1050 Ti\s.*470\.223\.02\s+yes\s+free", table), table
    assert "torch 2.1.1+cu121" in table and "torch.cuda: not available" in table
    assert caps.driver_cuda == "11.4"

    req = JobRequest(job_id="j", accelerator=Accelerator(inp["job"]["accelerator"]),
                     gpu_count=inp["job"]["gpu_count"], frameworks=inp["job"]["frameworks"])
    worker = caps.to_core()
    ev = evaluate(req, worker, SUPPORT_MATRIX)
    assert ev.placement is None and ev.state is FitState.NO_FIT
    (compat,) = [r for r in ev.rejections if r.requirement == "cuda_compat"]
    assert (compat.wanted, compat.found) == ("driver >= 525.60.13", "470.223.02")
    assert "needs driver ≥ 525.60.13 (CUDA 12.x)" in compat.message, compat.message
    assert f"why: {compat.message}" in _why(req, worker)
    assert "470.223.02" in compat.message and "CUDA 11.4" in compat.message, (
        f"the reason should name the driver as {exp['job'].split('names the driver ')[1].split(')')[0]}): "
        f"{compat.message!r}")


# ------------------------------------------------------------------------------ bug-50


@dataclass(frozen=True)
class _Addr:
    family: int
    address: str
    ptp: str | None = None


@dataclass(frozen=True)
class _Stats:
    isup: bool = True
    flags: str = "up,broadcast,running,multicast"


def _host(ifname: str, ip: str) -> dict[str, list[_Addr]]:
    """One of the case's namespaces: loopback and its leg of the bridge."""
    return {"lo": [_Addr(socket.AF_INET, "127.0.0.1")], ifname: [_Addr(socket.AF_INET, ip)]}


def _advertised(ifname: str, ip: str) -> tuple[str, list[str]]:
    """(interface, addresses) as a cluster node takes them from :func:`lan_addresses`."""
    table = _host(ifname, ip)
    chosen = lan_addresses(None, net_if_addrs=table, net_if_stats={n: _Stats() for n in table})
    return chosen[0][0], [a for _, a in chosen]


def test_bug50_each_host_advertises_its_lan_interface_not_loopback() -> None:
    case = load("bug-50")
    assert "127.0.1.1\t<its hostname>" in case["input"]["etc_hosts_each_host"]
    for ifname, ip in (("eth0", "10.77.0.1"), ("eth0", "10.77.0.2")):
        assert _advertised(ifname, ip) == (ifname, [ip])
        assert interface_for_address(ip, net_if_addrs=_host(ifname, ip)) == ifname
    assert interface_for_address("127.0.1.1", net_if_addrs=_host("eth0", "10.77.0.1")) is None


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.asyncio
async def test_bug50_each_rank_is_pinned_to_its_advertised_interface_and_an_ip_literal(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    case = load("bug-50")
    assert case["input"]["job"]["distributed"] == {"nnodes": 2, "nproc_per_node": 1, "backend": "gloo"}
    # Each daemon's host: its own LAN leg (distinct names, so a rank pinned to another host's shows).
    lan = {dm.node_id: _advertised(f"lan{i}", f"10.77.0.{i + 1}") for i, dm in enumerate(lab.alive())}
    monkeypatch.setattr(LoopbackNode, "addresses", property(lambda n: lan[n.node_id][1]))
    monkeypatch.setattr(LoopbackNode, "interface", property(lambda n: lan[n.node_id][0]))
    import gpulayerd.app.worker.member as member

    monkeypatch.setattr(member, "_free_port", lambda address: 29511)  # 10.77.0.x is not on this machine

    owner = d(lab, "owner")
    spec = {**case["input"]["job"], "workdir": str(lab.workdir)}
    job = (await owner.services.owner.submit(SubmitRequest(spec=spec, submitted_by="test"))).id
    await lab.settle()

    async def ranks_running() -> bool:
        return sum(x.runner.get(job, 1) is not None for x in lab.alive()) == 2

    await lab.run_until("both ranks running", ranks_running, limit_s=10)
    ranks = {int(_arg(r.argv, "--node-rank")): (x, r) for x in lab.alive() if (r := x.runner.get(job, 1))}
    assert sorted(ranks) == [0, 1]
    master_node = ranks[0][0].node_id
    master_ip = lan[master_node][1][0]
    for rank, (host, run) in ranks.items():
        ifname = lan[host.node_id][0]
        assert run.env["GLOO_SOCKET_IFNAME"] == run.env["NCCL_SOCKET_IFNAME"] == ifname, (rank, run.env)
        addr = _arg(run.argv, "--master-addr")
        assert addr == master_ip and not ipaddress.ip_address(addr).is_loopback  # an IP literal, the LAN's
        assert _arg(run.argv, "--master-port") == "29511"
        assert _arg(run.argv, "--nnodes") == "2" and _arg(run.argv, "--nproc-per-node") == "1"
        assert run.argv[-1] == "ar.py"
        assert not any("127.0.1.1" in v for v in [*run.argv, *run.env.values()])
    assert ranks[0][0].node_id != ranks[1][0].node_id
