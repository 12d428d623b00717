"""Slurm's answers read (recorded from Debian's 22.05.8, tests/data/slurm), the end states mapped, and the
batch script and sbatch command line of an attempt (gpulayerd.slurm)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpulayerd.gpu.command import CommandResult
from gpulayerd.slurm.batch import Submission, batch_script, refusal, sbatch_argv, slurm_time
from gpulayerd.slurm.capacity import devices_of, uuid_parts
from gpulayerd.slurm.outputs import (
    Gres,
    SlurmJob,
    end_of,
    parse_gres,
    parse_nodes_json,
    parse_nodes_lines,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
    pending_reason,
    queue_positions,
)
from gpulayerd.slurm.proxy import exit_status, submission_of
from gpulayerd.slurm.settings import SlurmConfig
from gpulayerd.slurm.slurmcmd import SlurmCommands, SlurmError
from gpulayerd.slurm.submit import proxy_argv

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_gres_strings() -> None:
    assert parse_gres("gpu:a100:4") == (Gres("gpu", "a100", 4),)
    assert parse_gres("gpu:2") == (Gres("gpu", None, 2),)
    assert parse_gres("gpu:a100:4(S:0-1),shard:8") == (Gres("gpu", "a100", 4), Gres("shard", None, 8))
    assert parse_gres("(null)") == () and parse_gres("") == ()


def test_nodes_from_sinfo_json_and_lines_agree() -> None:
    from_json = parse_nodes_json(read("sinfo.json"))
    from_lines = parse_nodes_lines(read("sinfo-N.txt"))
    assert [(n.name, n.partitions, n.cpus, n.gres, n.state) for n in from_json] == [
        ("vm", ("gpu",), 2, (Gres("gpu", "a100", 2),), "idle")]
    assert [(n.name, n.partitions, n.cpus, n.gres, n.state) for n in from_lines] == [
        ("vm", ("gpu",), 2, (Gres("gpu", "a100", 2),), "idle")]
    assert from_lines[0].usable


def test_a_node_in_two_partitions_is_one_node() -> None:
    nodes = parse_nodes_lines("n1|gpu*|64|512000|gpu:a100:4|mixed|a100,ib\nn1|long|64|512000|gpu:a100:4|mixed|a100,ib\n"
                              "n2|gpu*|64|512000|gpu:h100:8|drained|(null)\n")
    assert [(n.name, n.partitions, n.usable) for n in nodes] == [("n1", ("gpu", "long"), True),
                                                                 ("n2", ("gpu",), False)]
    assert nodes[0].features == ("a100", "ib")
    with pytest.raises(ValueError, match="7 fields"):
        parse_nodes_lines("n1|gpu|64\n")


def test_devices_from_gres_with_the_admins_mapping() -> None:
    cfg = SlurmConfig(partitions=["gpu"], gres={"a100": {"memory_gb": 80, "cc": "8.0"}})  # type: ignore[dict-item]
    nodes = parse_nodes_lines("n1|gpu|64|1000|gpu:a100:2|idle|(null)\nn2|gpu|64|1000|gpu:v100:1|down|(null)\n"
                              "n3|other|64|1000|gpu:a100:4|idle|(null)\n")
    devs = devices_of(nodes, cfg)
    assert [(d.uuid, d.name, d.memory_total_bytes, d.compute_capability, d.state.value) for d in devs] == [
        ("slurm:n1:a100:0", "a100 on n1", 80 * 2**30, (8, 0), "ok"),
        ("slurm:n1:a100:1", "a100 on n1", 80 * 2**30, (8, 0), "ok"),
        ("slurm:n2:v100:0", "v100 on n2", None, None, "unusable"),  # (no mapping: unknown)
    ]
    assert uuid_parts("slurm:n1:a100:0") == ("n1", "a100") and uuid_parts("GPU-1234") is None


def test_squeue_and_scontrol_jobs() -> None:
    jobs = parse_squeue(read("squeue.txt"))
    assert [(j.job_id, j.state, j.reason, j.partition, j.comment) for j in jobs] == [
        ("1", "PENDING", "None", "gpu", "gpulayer:j1:1"), ("2", "PENDING", "Priority", "gpu", "gpulayer:j2:1")]
    pending = parse_scontrol_job(read("scontrol-pending.txt"))
    assert pending is not None
    assert (pending.state, pending.reason, pending.nodes, pending.comment, pending.ended) == (
        "PENDING", "Priority", "", "gpulayer:j2:1", False)
    assert pending_reason(pending, 12) == "SlurmPending: Priority (partition gpu, position 12)"
    failed = parse_scontrol_job(read("scontrol-failed.txt"))
    assert failed is not None
    assert (failed.state, failed.exit_code, failed.signal, failed.nodes, failed.ended) == ("FAILED", 3, 0, "vm", True)
    assert parse_scontrol_job("") is None


def test_sinfo_json_with_errors_is_an_error_not_an_empty_cluster() -> None:
    with pytest.raises(ValueError, match="Unspecified error"):
        parse_nodes_json('{"meta": {}, "errors": [{"error": "Unspecified error", "errno": -1}], "nodes": []}')


def test_queue_positions_by_priority_then_id_per_partition() -> None:
    jobs = parse_squeue("7|PENDING|Priority|||100|1|a\n3|PENDING|Resources|||200|1|b\n9|PENDING|Priority|||100|1|c\n"
                        "4|RUNNING|None|n1||500|1|d\n5|PENDING|Priority||cpu|1|1|e\n")
    jobs = [SlurmJob(j.job_id, j.state, j.reason, j.nodes, j.partition or "gpu", j.comment, priority=j.priority)
            for j in jobs]
    assert queue_positions(jobs) == {"3": 1, "7": 2, "9": 3, "5": 1}


@pytest.mark.parametrize(("state", "code", "sig", "status", "words"), [
    ("COMPLETED", 0, 0, 0, ""),
    ("FAILED", 3, 0, 3, "Slurm: FAILED (exit 3) on n1"),
    ("TIMEOUT", 0, 0, 124, "Slurm: TIMEOUT (its time limit) on n1"),
    ("OUT_OF_MEMORY", 0, 0, 137, "Slurm: OUT_OF_MEMORY on n1"),
    ("NODE_FAIL", 0, 0, 125, "Slurm: NODE_FAIL on n1"),
    ("CANCELLED", 0, 15, 143, "Slurm: CANCELLED"),
    ("FAILED", 0, 9, 137, "Slurm: FAILED (exit -9) on n1"),
])
def test_end_states_mapped(state: str, code: int, sig: int, status: int, words: str) -> None:
    job = SlurmJob("7", state, nodes="n1", exit_code=code, signal=sig)
    assert end_of(job).reason == words
    assert exit_status(job) == status


def _sub(**kw: object) -> Submission:
    base: dict[str, object] = dict(job_id="j1", attempt=2, argv=["python", "train.py", "--name", "it's $HOME"],
                                   env={"A": "x y", "B": "$(rm -rf /)", "CUDA_VISIBLE_DEVICES": "slurm:n1:a100:0",
                                        "bad-name": "z"},
                                   workdir="/shared/my dir", out_dir="/home/u/.gpulayer/slurm", partition="gpu",
                                   gpus=2, gpu_type="a100", cpus=4, time_limit_s=3601, signal=("USR1", 60))
    base.update(kw)
    return Submission(**base)  # type: ignore[arg-type]


def test_batch_script_quotes_every_value() -> None:
    script = batch_script(_sub())
    assert script.splitlines() == [
        "#!/bin/bash", "# gpulayer job j1 attempt 2",
        "export A='x y'", "export B='$(rm -rf /)'",
        "cd -- '/shared/my dir' || exit 1",
        "exec python train.py --name 'it'\"'\"'s $HOME'",
    ]
    assert shlex.split(script.splitlines()[-1])[1:] == ["python", "train.py", "--name", "it's $HOME"]


def test_sbatch_argv() -> None:
    assert sbatch_argv(_sub()) == [
        "sbatch", "--parsable", "--job-name=gpulayer-j1", "--nodes=1", "--ntasks=1", "--cpus-per-task=4",
        "--output=/home/u/.gpulayer/slurm/j1-2.out", "--error=/home/u/.gpulayer/slurm/j1-2.err",
        "--chdir=/shared/my dir", "--export=NONE", "--comment=gpulayer:j1:2", "--partition=gpu",
        "--gres=gpu:a100:2", "--time=61", "--signal=B:USR1@60", "/home/u/.gpulayer/slurm/j1-2.sh"]
    plain = sbatch_argv(_sub(partition="", gpus=0, time_limit_s=None, signal=None))
    assert not [a for a in plain if a.startswith(("--partition", "--gres", "--time", "--signal"))]
    assert slurm_time(30) == "1" and slurm_time(2 * 86400 + 90) == "2-00:02:00"


def test_multi_node_jobs_and_arrays_are_refused() -> None:
    assert refusal(1, False) is None
    assert refusal(2, False) == "NotOnSlurm: a job over 2 nodes does not run on a Slurm worker yet (it runs elsewhere)"
    assert refusal(1, True) == "NotOnSlurm: array tasks do not run on a Slurm worker yet (they run elsewhere)"


def test_proxy_argv_round_trips_to_a_submission() -> None:
    cfg = SlurmConfig(partitions=["gpu"], env={"SLURM_CONF": "/etc/s.conf"}, output_dir="{home}/out/{user}")
    argv = proxy_argv(cfg, "/usr/bin/python3", "j1", 1, ["sh", "-c", "echo hi"], {"A": "1"}, "/w",
                      ["slurm:n1:a100:0"], 3, 600.0, ("USR1", 540.0))
    assert argv[:3] == ["/usr/bin/python3", "-m", "gpulayerd.slurm.proxy"]
    data = json.loads(argv[3])
    assert data["slurm_env"] == {"SLURM_CONF": "/etc/s.conf"}
    sub = submission_of(data, "/home/u", "u")
    assert (sub.out_dir, sub.gpus, sub.gpu_type, sub.cpus, sub.partition, sub.signal, sub.time_limit_s) == (
        "/home/u/out/u", 1, "a100", 3, "gpu", ("USR1", 60.0), 600.0)


def test_slurm_config_rejects_bad_values() -> None:
    with pytest.raises(ValidationError, match="colour"):
        SlurmConfig(colour="blue")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"cc must be MAJOR\.MINOR"):
        SlurmConfig(gres={"a100": {"cc": "eight"}})  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match="prefer"):
        SlurmConfig(prefer="first")
    assert SlurmConfig(prefer="overflow-after = 10m").prefer == "overflow-after = 10m"


def test_commands_fall_back_to_formats_and_carry_slurms_words() -> None:
    calls: list[list[str]] = []

    def runner(argv: object, timeout_s: float, env: object = None) -> CommandResult:
        calls.append(list(argv))  # type: ignore[call-overload]
        if list(argv) == ["sinfo", "--json"]:  # type: ignore[call-overload]
            return CommandResult(stderr="sinfo: unrecognized option '--json'", returncode=1)
        if "sbatch" in list(argv):  # type: ignore[call-overload]
            return CommandResult(stderr="sbatch: error: Batch job submission failed: Invalid account", returncode=1)
        return CommandResult(stdout=read("sinfo-N.txt"), returncode=0)

    cmds = SlurmCommands(5.0, {}, runner)
    assert [n.name for n in cmds.nodes()] == ["vm"]
    assert [n.name for n in cmds.nodes()] == ["vm"]
    assert calls.count(["sinfo", "--json"]) == 1  # asked once, then the -o form
    with pytest.raises(SlurmError, match="sbatch: error: Batch job submission failed: Invalid account"):
        cmds.submit(["sbatch", "--parsable", "x.sh"])


def test_a_bad_slurm_key_names_itself(tmp_path: Path) -> None:
    from gpulayerd.config import ConfigError, DaemonConfig

    bad = tmp_path / "gpulayerd.toml"
    bad.write_text('[slurm]\npartitons = ["gpu"]\n')
    with pytest.raises(ConfigError, match=r"slurm\.partitons: unknown field"):
        DaemonConfig.load(bad, {})
    good = tmp_path / "good.toml"
    good.write_text('[slurm]\npartitions = ["gpu"]\ninterpreters = ["/opt/py/bin/python3"]\n'
                    '[slurm.gres]\na100 = { memory_gb = 80, cc = "8.0" }\n')
    cfg = DaemonConfig.load(good, {})
    assert cfg.slurm is not None and cfg.slurm.gres["a100"].compute_capability == (8, 0)
    assert cfg.interpreters == ["/opt/py/bin/python3"]
    assert not cfg.slurm.probe_on_login and cfg.slurm.probe_every_s == 86400  # probed with srun, daily
    bad.write_text('[slurm]\nprobe_on_login = "yes"\n')
    with pytest.raises(ConfigError, match=r"slurm\.probe_on_login: "):
        DaemonConfig.load(bad, {})


@pytest.mark.parametrize(("job_id", "state", "status", "words"), [
    ("101", "COMPLETED", 0, ""),
    ("102", "FAILED", 3, "Slurm: FAILED (exit 3) on vm"),
    ("103", "TIMEOUT", 124, "Slurm: TIMEOUT (its time limit) on vm"),
    ("104", "OUT_OF_MEMORY", 137, "Slurm: OUT_OF_MEMORY on vm"),
    ("105", "NODE_FAIL", 125, "Slurm: NODE_FAIL on vm"),
    ("106", "CANCELLED", 143, "Slurm: CANCELLED"),
])
def test_sacct_records_mapped(job_id: str, state: str, status: int, words: str) -> None:
    job = parse_sacct(read("sacct-ended.txt"), job_id)
    assert job is not None and job.state == state and job.ended and job.source == "sacct", job
    assert (exit_status(job), end_of(job).reason) == (status, words)
    assert job.start.startswith("2026-12-01T10:0") and job.end.startswith("2026-12-01T10:0")


def test_sacct_of_a_job_not_ended_or_unknown() -> None:
    running = parse_sacct(read("sacct-ended.txt"), "107")
    assert running is not None and not running.ended and running.end == "Unknown"
    pending = parse_sacct(read("sacct-ended.txt"), "108")
    assert pending is not None and pending.nodes == "" and pending.state == "PENDING"
    assert parse_sacct(read("sacct-ended.txt"), "999") is None and parse_sacct("", "101") is None


def test_the_end_comes_from_sacct_where_accounting_runs_else_from_scontrol() -> None:
    calls: list[list[str]] = []
    answers: dict[str, CommandResult] = {}

    def runner(argv: object, timeout_s: float, env: object = None) -> CommandResult:
        calls.append(list(argv))  # type: ignore[call-overload]
        return answers[calls[-1][0]]

    seen = parse_scontrol_job(read("scontrol-failed.txt"))
    assert seen is not None and seen.source == "scontrol"
    # Accounting runs: sacct's record decides (FAILED 3 on vm, from sacct).
    answers["sacct"] = CommandResult(stdout=read("sacct-ended.txt").replace("102|", f"{seen.job_id}|", 1), returncode=0)
    with_acct = SlurmCommands(5.0, {}, runner)
    final = with_acct.final(seen.job_id, seen)
    assert final is not None and (final.source, final.state, final.exit_code) == ("sacct", "FAILED", 3)
    assert calls[-1][:6] == ["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,NodeList,Partition,Start,End"]
    # A job sacct does not have ended yet (its record lags): scontrol's.
    answers["sacct"] = CommandResult(stdout=f"{seen.job_id}|RUNNING|0:0|vm|gpu|x|Unknown\n", returncode=0)
    assert with_acct.final(seen.job_id, seen) is seen
    # sacct failing otherwise (slurmdbd down): scontrol's, and sacct is asked again next time.
    answers["sacct"] = CommandResult(stderr="sacct: error: Problem talking to the database: Connection refused",
                                     returncode=1)
    assert with_acct.final(seen.job_id, seen) is seen and not with_acct.accounting_off
    # No accounting (this test cluster's sacct, recorded): scontrol's, and sacct is not asked again.
    answers["sacct"] = CommandResult(stderr="Slurm accounting storage is disabled\n", returncode=1)
    without = SlurmCommands(5.0, {}, runner)
    assert without.final(seen.job_id, seen) is seen and without.accounting_off
    n = len(calls)
    assert without.final(seen.job_id, seen) is seen and without.final(seen.job_id, None) is None and len(calls) == n


def test_death_by_the_time_limits_warning_is_a_timeout_not_a_failure(tmp_path: Path) -> None:
    """Slurm holds a Slurm attempt's limit (the watchdog has none): the warning it sends up to 60 s early
    (--signal=B:TERM@30) that kills the job ends the attempt as the limit would, as on a workstation."""
    from gpulayerd.app.worker.slurm_worker import timed_out
    from gpulayerd.runs.layout import STDERR_LOG
    from gpulayerd.runs.status import RunState, RunStatus
    from gpulayerd.slurm.proxy import TIMED_OUT, after_warning

    limited = _sub(time_limit_s=600.0, signal=("TERM", 30.0))
    killed = SlurmJob("7", "FAILED", nodes="n1", exit_code=0, signal=15)
    assert after_warning(killed, limited, ran_s=520.0)  # 600 - 30 - 60 = 510 s: Slurm may have sent it
    assert not after_warning(killed, limited, ran_s=100.0)  # too early: another TERM (an admin's)
    assert not after_warning(SlurmJob("7", "FAILED", exit_code=3), limited, ran_s=590.0)  # its own failure
    assert not after_warning(killed, _sub(time_limit_s=600.0, signal=None), ran_s=590.0)  # no warning asked for
    assert after_warning(SlurmJob("7", "FAILED", exit_code=143), limited, ran_s=560.0)  # a shell's 128 + 15
    assert exit_status(killed, warned=True) == 124 and exit_status(killed) == 143
    # The worker reads the proxy's last line: exit 124 with it is a timeout; a job's own exit 124 is not.
    (tmp_path / STDERR_LOG).write_text(f"job output\ngpulayer: {TIMED_OUT}Slurm job 7 ended at its time limit\n")
    exited = RunStatus(RunState.EXITED, exit_code=124, reason="exited")
    got = timed_out(exited, tmp_path)
    assert got is not None and got.timed_out and got.detail == "Slurm job 7 ended at its time limit"
    (tmp_path / STDERR_LOG).write_text("timeout: the job's own `timeout 5 ...` said so\n")
    assert timed_out(exited, tmp_path) is None
    assert timed_out(RunStatus(RunState.EXITED, exit_code=3, reason="exited"), tmp_path) is None
