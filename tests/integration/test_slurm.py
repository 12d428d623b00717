"""A Slurm cluster as a gpulayer worker (issue 36), against a real one-node Slurm (the ``slurm`` fixture):
a gpulayerd with ``[slurm]`` lists the cluster's partitions and GRES, submits the jobs it claims with
``sbatch`` as the job's user, follows them, and maps their end; ``gpulayer cancel`` reaches ``scancel``. The last tests submit on another daemon of
the cluster (a workstation that does not fit the job now) as a throwaway account, and the job runs in Slurm
as that account, its output in ``gpulayer logs`` on the submitting daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands
from gpulayerd.slurm.srunprobe import SrunProbe
from tests.fakes.accounts import Account, Accounts, SharedPython
from tests.fakes.daemon_process import TERMINAL, Daemon, Lab, wait_until
from tests.fakes.slurm_cluster import NOROOT, SlurmCluster

from .loopback import loopback_cluster, node_id
from .test_local_users import open_to_everyone


def slurm_toml(cluster: SlurmCluster, out_dir: str | None) -> str:
    """The ``[slurm]`` section of a daemon backed by ``cluster`` (``out_dir`` None: the default, in the
    job user's home)."""
    out = f'output_dir = "{out_dir}"\n' if out_dir is not None else ""
    return (f'\n[slurm]\npartitions = ["{cluster.partition}"]\npoll_interval_s = 0.2\n'
            f'{out}env = {{ SLURM_CONF = "{cluster.env["SLURM_CONF"]}" }}\n'
            f'[slurm.gres]\n{cluster.gpu_type} = {{ memory_gb = 80, cc = "8.0" }}\n')


@pytest.fixture(scope="module")
def gateway(slurm: SlurmCluster) -> Iterator[Daemon]:
    """One gpulayerd whose worker is the Slurm cluster (CPU slots 2, as the node's CPUs)."""
    lab = Lab()
    try:
        yield lab.daemon(toml=slurm_toml(slurm, str(lab.root / "slurm-out")), probe_interval_s=1.0)
    finally:
        lab.close()


def test_devices_list_the_partitions_and_gres(gateway: Daemon, slurm: SlurmCluster) -> None:
    text = gateway.cli_ok("devices")
    assert "Worker kind: slurm   partitions: gpu" in text, text
    assert f"GRES {slurm.node}: gpu:a100:2" in text, text
    assert f"a100 on {slurm.node}" in text, text
    caps = json.loads(gateway.cli_ok("devices", "--json"))[0]
    assert caps["kind"] == "slurm" and caps["slurm_partitions"] == ["gpu"]
    assert [d["uuid"] for d in caps["devices"]] == [f"slurm:{slurm.node}:a100:0", f"slurm:{slurm.node}:a100:1"]
    assert caps["devices"][0]["memory_total_bytes"] == 80 * 2**30
    assert caps["devices"][0]["compute_capability"] == "8.0"


def test_environments_are_probed_in_an_srun_job_and_a_refused_probe_is_broken_with_sruns_words(
        gateway: Daemon, slurm: SlurmCluster) -> None:
    def env() -> dict[str, Any]:
        return json.loads(gateway.cli_ok("devices", "--json"))[0]["environments"][0]

    # [slurm] without probe_on_login: the interpreter is probed in an srun job (its answer kept in the state)
    wait_until(lambda: env()["ok"], 20, "the srun probe's answer")
    assert env()["interpreter"] == sys.executable and env()["python_version"], env()
    assert "JobName=gpulayer-probe " in slurm.run("scontrol", "-o", "show", "job").stdout
    cache = json.loads((gateway.state_dir / "cache" / "slurm-environments.json").read_text())
    assert [e["interpreter"] for e in cache.values()] == [sys.executable], cache
    # srun refuses it (root's job on the DisableRootJobs partition): that environment is broken, srun's words why
    cfg = SlurmConfig(partitions=[NOROOT], env=slurm.env, command_timeout_s=8)

    async def nothing(_: object) -> None: ...

    probe = SrunProbe(cfg, SlurmCommands(cfg.command_timeout_s, cfg.env), None, lambda c, _: c.close(), nothing)
    snap = probe.probe(sys.executable)
    assert not snap.ok and snap.notes[0].startswith("srun probe failed: srun: error: "), snap


def test_cpu_job_runs_in_slurm_and_its_output_is_in_logs(gateway: Daemon, slurm: SlurmCluster) -> None:
    job = gateway.submit("--", "sh", "-c", "echo hello from $SLURM_JOB_ID on $SLURMD_NODENAME; echo oops >&2")
    view = gateway.wait_status(job, {"succeeded", "failed"}, timeout_s=30)
    assert view.status == "succeeded", gateway.show(job)
    out = gateway.cli_ok("logs", job)
    assert f"on {slurm.node}" in out and "hello from " in out, out
    err = gateway.cli_ok("logs", "--stderr", job)
    assert "oops" in err and "gpulayer: Slurm job" in err, err
    assert " ended COMPLETED (from scontrol, at " in err, err  # no slurmdbd here: sacct says accounting is off


def test_gpu_job_gets_a_gres_gpu(gateway: Daemon, slurm: SlurmCluster) -> None:
    job = gateway.submit("--accelerator", "cuda", "--gpus", "1", "--", "sh", "-c", "echo gpus=$SLURM_JOB_GPUS cvd=$CUDA_VISIBLE_DEVICES")
    view = gateway.wait_status(job, {"succeeded", "failed"}, timeout_s=30)
    assert view.status == "succeeded", gateway.show(job)
    out = gateway.cli_ok("logs", job)
    assert "gpus=0 cvd=0" in out or "gpus=1 cvd=0" in out, out


def test_failed_job_ends_failed_with_its_exit_code(gateway: Daemon) -> None:
    job = gateway.submit("--", "sh", "-c", "exit 3")
    view = gateway.wait_status(job, {"succeeded", "failed"}, timeout_s=30)
    assert view.status == "failed", gateway.show(job)
    assert gateway.show(job)["exit_code"] == 3


def test_cancel_reaches_scancel(gateway: Daemon, slurm: SlurmCluster) -> None:
    job = gateway.submit("--", "sleep", "300")
    wait_until(lambda: any(ln.endswith(f"gpulayer:{job}:1") and "|RUNNING|" in ln
                           for ln in slurm.run("squeue", "-h", "-o", "%i|%T|%k").stdout.splitlines()),
               20, "the Slurm job runs")
    gateway.cli_ok("cancel", job)
    view = gateway.wait_status(job, {"cancelled", "failed", "succeeded"}, timeout_s=20)
    assert view.status == "cancelled", gateway.show(job)
    wait_until(lambda: f"gpulayer:{job}:1" not in slurm.run("squeue", "-h", "-o", "%k").stdout, 10,
               "scancel ended the Slurm job")


def test_gateway_killed_mid_job_readopts_it_and_records_the_exit_once(gateway: Daemon, slurm: SlurmCluster) -> None:
    job = gateway.submit("--", "sh", "-c", "sleep 3; echo done-after-restart")
    wait_until(lambda: any(ln.endswith(f"gpulayer:{job}:1") and "|RUNNING|" in ln
                           for ln in slurm.run("squeue", "-h", "-o", "%i|%T|%k").stdout.splitlines()),
               20, "the Slurm job runs")
    gateway.kill()  # kill -9: the attempt's watchdog and its proxy live on
    gateway.start()
    view = gateway.wait_status(job, {"succeeded", "failed", "lost"}, timeout_s=30)
    assert view.status == "succeeded", gateway.show(job)
    assert "done-after-restart" in gateway.cli_ok("logs", job)
    shown = gateway.show(job)
    assert shown["attempt"] == 1, shown  # submitted once: no second attempt, no second sbatch
    assert [ln for ln in slurm.run("squeue", "-h", "-o", "%k").stdout.splitlines() if job in ln] == []


def _slurm_state(slurm: SlurmCluster, comment: str) -> str:
    """Slurm's state of the job with ``--comment`` ``comment`` ("" when squeue does not list it)."""
    rows = [ln.split("|") for ln in slurm.run("squeue", "-h", "-o", "%T|%k").stdout.splitlines()]
    return next((r[0] for r in rows if len(r) == 2 and r[1] == comment), "")


def test_pending_in_slurm_is_claimed_with_slurms_reason_then_running_on_its_node(
        gateway: Daemon, slurm: SlurmCluster, tmp_path: Path) -> None:
    blocker = slurm.run("sbatch", "--parsable", "--exclusive", "--output=/dev/null",
                        "--wrap", "sleep 300").stdout.strip()
    gate = tmp_path / f"gate-{uuid.uuid4().hex[:8]}"
    job = ""
    try:
        assert blocker.isdigit(), blocker
        wait_until(lambda: "RUNNING" in slurm.run("squeue", "-h", "-j", blocker, "-o", "%T").stdout, 20,
                   "the blocker runs (the node is full)")
        job = gateway.submit("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; echo released")
        wait_until(lambda: _slurm_state(slurm, f"gpulayer:{job}:1") == "PENDING", 20, "Slurm holds it pending")
        wait_until(lambda: "SlurmPending" in gateway.show(job)["reason"], 20, "the reason follows Slurm's")
        shown = gateway.show(job)
        assert shown["status"] == "claimed", shown
        assert shown["reason"] == "SlurmPending: Resources (partition gpu, position 1)", shown
        listing = gateway.cli_ok("jobs")
        line = next(ln for ln in listing.splitlines() if job[:8] in ln)
        assert "claimed" in line and "SlurmPending: Resources" in line, listing
        wait_until(lambda: json.loads(gateway.cli_ok("devices", "--json"))[0]["slurm_pending"] == ["Resources"], 10,
                   "the worker's capabilities say what Slurm holds its jobs for (explain's busy Slurm row)")
    finally:
        slurm.run("scancel", blocker)
    wait_until(lambda: _slurm_state(slurm, f"gpulayer:{job}:1") == "RUNNING", 30, "Slurm runs it")
    view = gateway.wait_status(job, {"running", "succeeded", "failed"}, timeout_s=20)
    assert view.status == "running", gateway.show(job)
    shown = gateway.show(job)
    assert shown["where_name"].endswith(f"/{slurm.node}"), shown
    assert shown["reason"].startswith("running on ") and shown["reason"].endswith(f"/{slurm.node}"), shown
    line = next(ln for ln in gateway.cli_ok("jobs").splitlines() if job[:8] in ln)
    assert "running" in line and f"/{slurm.node}" in line, line
    gate.touch()
    assert gateway.wait_status(job, {"succeeded", "failed"}, timeout_s=30).status == "succeeded", gateway.show(job)


def test_slurmctld_down_degrades_the_worker_and_no_job_is_lost_when_it_comes_back(
        gateway: Daemon, slurm: SlurmCluster, tmp_path: Path) -> None:
    gate = tmp_path / f"gate-{uuid.uuid4().hex[:8]}"
    job = gateway.submit("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; echo survived")
    gateway.wait_status(job, {"running"}, timeout_s=30)
    waiting = ""
    try:
        slurm.stop_slurmctld()
        wait_until(lambda: "DEGRADED" in gateway.cli_ok("devices"), 20, "devices say the worker is degraded")
        assert "Slurm did not answer" in gateway.cli_ok("devices")
        assert "slurm DEGRADED: " in gateway.cli_ok("peers"), gateway.cli_ok("peers")
        wait_until(lambda: "Slurm does not answer" in gateway.cli_ok("logs", "--stderr", job), 20,
                   "the proxy says Slurm does not answer")
        waiting = gateway.submit("--", "sh", "-c", "echo after")
        wait_until(lambda: gateway.show(waiting)["reason"] not in ("", "submitted"), 10, "the new job is judged")
        assert gateway.show(waiting)["status"] == "queued", gateway.show(waiting)  # no new claims
        assert gateway.show(job)["status"] == "running", gateway.show(job)  # its lease is kept
    finally:
        slurm.start_slurmctld()
    wait_until(lambda: "DEGRADED" not in gateway.cli_ok("devices"), 30, "the worker is back")
    gate.touch()
    view = gateway.wait_status(job, {"succeeded", "failed", "lost"}, timeout_s=30)
    assert view.status == "succeeded" and gateway.show(job)["attempt"] == 1, gateway.show(job)
    assert "survived" in gateway.cli_ok("logs", job)
    assert gateway.wait_status(waiting, {"succeeded", "failed"}, timeout_s=30).status == "succeeded"


def test_worker_and_no_slurm_target_or_avoid_the_slurm_worker(gateway: Daemon) -> None:
    r = gateway.cli("submit", "--worker", "no-such-worker", "--", "true")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    name = json.loads(gateway.cli_ok("devices", "--json"))[0]["hostname"]
    assert "no worker named 'no-such-worker'" in r.stderr and f"known workers: {name}" in r.stderr, r.stderr
    kept_off = gateway.submit("--no-slurm", "--", "true")
    try:
        wait_until(lambda: gateway.show(kept_off)["reason"].startswith("Target: "), 20, "the --no-slurm job is judged")
        shown = gateway.show(kept_off)
        assert shown["status"] == "queued", shown
        assert shown["reason"] == f"Target: {name} is a Slurm worker (--no-slurm)", shown
        explained = gateway.cli_ok("explain", kept_off)
        assert f"worker {name} (" in explained and ", slurm/gpu: no fit\n" in explained, explained
    finally:
        gateway.cli("cancel", kept_off)
    named = gateway.submit("--worker", name, "--", "sh", "-c", "echo on $SLURMD_NODENAME")
    assert gateway.wait_status(named, {"succeeded", "failed"}, timeout_s=30).status == "succeeded", gateway.show(named)


def test_a_user_slurm_refuses_is_kept_off_the_worker_with_slurms_words(slurm: SlurmCluster) -> None:
    lab = Lab()  # a gateway on the partition whose sbatch refuses root's jobs (DisableRootJobs; we run as root)
    try:
        toml = slurm_toml(slurm, str(lab.root / "slurm-out")).replace(f'["{slurm.partition}"]', f'["{NOROOT}"]')
        toml = toml.replace("[slurm]\n", "[slurm]\nprobe_on_login = true\n")  # (srun refuses root's probe there too)
        gateway = lab.daemon(toml=toml, probe_interval_s=1.0)
        job = gateway.submit("--retries", "0", "--", "true")
        try:
            wait_until(lambda: gateway.show(job)["reason"].startswith("NotAllowed: Slurm on "), 30,
                       "the job waits with Slurm's refusal")
        except AssertionError:
            raise AssertionError((gateway.cli("show", job).stdout, gateway.cli("logs", "--stderr", job).stdout,
                                  gateway.log_tail())) from None
        shown = gateway.show(job)
        assert shown["status"] == "queued", shown  # not failed: nothing ran, no retry used
        assert "refused root's job: sbatch: " in shown["reason"], shown
        text = gateway.cli_ok("show", job)
        assert "lost" in text and "NotAllowed: sbatch: " in text, text  # the refused attempt, Slurm's words
        assert [ln for ln in slurm.run("squeue", "-h", "-o", "%k").stdout.splitlines() if job in ln] == []
        assert "Slurm on " in (explained := gateway.cli_ok("explain", job)) and "refused root" in explained, explained
    finally:
        lab.close()


# ------------------------------------------------------------- a job of another daemon, as its user


@dataclass
class Site:
    """A workstation (one CPU slot, no GPU) and a Slurm gateway in one cluster, both in system mode, run
    by a lab install every account can use; ``user`` submits on the workstation's socket ``sock``."""

    workstation: Daemon
    gateway: Daemon
    user: Account
    sock: Path
    shared: SharedPython

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``gpulayer ARGS`` as :attr:`user` on the workstation's socket."""
        return self.shared.cli(self.user, "--socket", str(self.sock), *args)

    def ok(self, *args: str) -> str:
        r = self.cli(*args)
        assert r.returncode == 0, f"gpulayer {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def submit(self, *args: str) -> str:
        return str(json.loads(self.ok("submit", "--json", *args))["id"])

    def show(self, job: str) -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(self.ok("show", "--json", job))
        return shown

    def wait_end(self, job: str, timeout_s: float = 60.0) -> dict[str, Any]:
        try:
            wait_until(lambda: self.show(job)["status"] in TERMINAL, timeout_s, f"job {job} to end", interval_s=0.3)
        except AssertionError:
            raise AssertionError((self.ok("show", job), self.gateway.log_tail(3000))) from None
        return self.show(job)


@pytest.fixture(scope="module")
def site(slurm: SlurmCluster, shared_python: SharedPython) -> Iterator[Site]:
    """:class:`Site` on the module's Slurm; its throwaway account (present on both: one machine) removed after."""
    if os.geteuid() != 0:
        pytest.fail("needs root (CI runs as root): makes an account and runs daemons in system mode", pytrace=False)
    made, lab = Accounts(), Lab()
    try:
        user = made.user("slurm")
        python = shared_python.venv()  # the proxy runs as the user with the daemon's interpreter
        ws, gw = loopback_cluster(lab, [1, 2], system=True, each=[
            {"wrap": [python]}, {"wrap": [python], "toml": slurm_toml(slurm, None), "probe_interval_s": 1.0}])
        yield Site(ws, gw, user, open_to_everyone(ws), shared_python)
    finally:
        lab.close()
        made.remove_all()


def _slurm_user(site: Site, slurm: SlurmCluster, job: str) -> str:
    """The account Slurm ran ``job``'s Slurm job as (``scontrol show job``'s ``UserId``)."""
    said = [ln for ln in site.ok("logs", "--stderr", job).splitlines() if ln.startswith("gpulayer: Slurm job ")]
    slurm_id = said[0].split()[3]
    fields = dict(f.split("=", 1) for f in slurm.run("scontrol", "-o", "show", "job", slurm_id).stdout.split()
                  if "=" in f)
    return fields.get("UserId", "").split("(")[0]


def test_a_cpu_job_submitted_on_a_busy_workstation_runs_in_slurm_as_its_user(site: Site, slurm: SlurmCluster) -> None:
    blocker = site.submit("--no-slurm", "--", "sleep", "300")  # the workstation's one CPU slot
    try:
        wait_until(lambda: site.show(blocker)["status"] == "running", 30, "the blocker runs on the workstation")
        job = site.submit("--", "sh", "-c", "echo hello from $(id -un) on $SLURMD_NODENAME in $(pwd)")
        shown = site.wait_end(job)
    finally:
        site.cli("cancel", blocker)
    assert shown["status"] == "succeeded", shown
    assert shown["submitted_by"] == site.user.name and shown["where_node"] == node_id(site.gateway), shown
    out = site.ok("logs", job)  # on the submitting daemon, from the gateway
    assert f"hello from {site.user.name} on {slurm.node} in {site.user.home}" in out, out
    assert _slurm_user(site, slurm, job) == site.user.name


def test_a_gpu_job_no_workstation_fits_runs_in_slurm_as_its_user(site: Site, slurm: SlurmCluster) -> None:
    job = site.submit("--accelerator", "cuda", "--gpus", "1", "--", "sh", "-c",
                      "echo gpus=$SLURM_JOB_GPUS by $(id -un)")
    shown = site.wait_end(job)
    assert shown["status"] == "succeeded", shown
    assert shown["where_node"] == node_id(site.gateway), shown
    out = site.ok("logs", job)
    assert f"by {site.user.name}" in out and "gpus=" in out and "gpus=\n" not in out, out
    assert _slurm_user(site, slurm, job) == site.user.name
