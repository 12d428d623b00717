"""A Slurm job is an attempt's only when it carries the attempt's comment AND runs as the attempt's user:
any cluster user may set any ``--comment`` (``scontrol update JobId=N Comment=gpulayer:<job>:<attempt>``,
copied from ``squeue``), so a comment alone would let one user's job stand for another's attempt."""

from __future__ import annotations

import asyncio

from gpulayerd.gpu.command import CommandResult
from gpulayerd.slurm.outputs import JOB_FORMAT, parse_squeue
from gpulayerd.slurm.queue import SlurmQueue
from gpulayerd.slurm.slurmcmd import SlurmCommands


def test_squeue_reads_the_user_id_and_keeps_a_comment_with_pipes() -> None:
    assert "%U" in JOB_FORMAT and JOB_FORMAT.endswith("|%k")
    [job] = parse_squeue("7|PENDING|Priority||gpu|100|1001|gpulayer:j|x:1\n")
    assert (job.job_id, job.uid, job.comment) == ("7", 1001, "gpulayer:j|x:1")


def test_another_users_job_with_the_same_comment_is_not_the_attempts() -> None:
    # bob (1002) copied alice's (1001) comment onto a job of his that runs; alice's is still pending
    out = ("10|PENDING|Resources||gpu|100|1001|gpulayer:j1:1\n"
           "11|RUNNING|None|n9|gpu|100|1002|gpulayer:j1:1\n")

    def runner(argv: object, timeout_s: float, env: object) -> CommandResult:
        return CommandResult(stdout=out, returncode=0)

    queue = SlurmQueue(SlurmCommands(5.0, runner=runner), 1.0)  # type: ignore[arg-type]
    asyncio.run(queue.refresh())
    job = queue.find("j1", 1, 1001)
    assert job is not None and (job.job_id, job.state) == ("10", "PENDING")
    assert queue.find("j1", 1, 1003) is None


def test_the_worker_is_told_when_squeue_stops_and_starts_answering() -> None:
    # Jobs refused while Slurm did not answer are offered again only if the worker's capabilities are
    # shaped again when squeue answers (a CI run once left a job queued for good after slurmctld restarted).
    answers = ["", "down", "down", "", ""]
    now = [0.0]

    def runner(argv: object, timeout_s: float, env: object) -> CommandResult:
        if answers.pop(0) == "down":
            return CommandResult(stderr="slurm_load_jobs error: Unable to contact slurm controller", returncode=1)
        return CommandResult(stdout="", returncode=0)

    told: list[str] = []
    queue = SlurmQueue(SlurmCommands(5.0, runner=runner), 1.0, clock=lambda: now[0],  # type: ignore[arg-type]
                       on_pending=lambda: told.append(queue.error))
    for _ in range(5):
        asyncio.run(queue.refresh())
        now[0] += 1.0
    assert len(told) == 2 and "Unable to contact slurm controller" in told[0] and told[1] == "", told
    assert queue.error == "" and not answers
