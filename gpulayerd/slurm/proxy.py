"""``python -m gpulayerd.slurm.proxy SUBMISSION_JSON``: one attempt's Slurm job, run by its watchdog.

The watchdog starts this as the job's user (so ``sbatch`` and ``scancel`` run as that user, with the
job's clean environment), holds its lease deadline and time limit as for any job, and records its exit.
This process:

1. makes the user's output directory (0700) and writes the batch script (0700) there
   (:mod:`gpulayerd.slurm.batch`);
2. submits it with ``sbatch --parsable`` and writes Slurm's job id beside it (``<job>-<attempt>.slurm``)
   and to its stderr (``gpulayer: Slurm job N``);
3. follows the job (``scontrol -o show job``), copying the job's ``.out``/``.err`` files to its own
   stdout/stderr as they grow (gpulayer's logs of the attempt, ``gpulayer logs -f``);
4. on SIGTERM or SIGINT (a cancel, the lease lost, the time limit) runs ``scancel`` and waits for the end;
   (sbatch's refusal, ``sbatch: error: Invalid account``: ``gpulayer: NotAllowed: <Slurm's words>`` and
   exit 126: the worker ends the attempt "never started" and keeps that user's jobs off for a while);
5. exits with the job's code (:func:`exit_status`): its exit status, 128+N when killed by signal N,
   124 on Slurm's TIMEOUT, and its last stderr line names Slurm's end state. The end is ``sacct``'s record
   where Slurm accounting runs (also for a job ``scontrol`` no longer knows), else ``scontrol``'s
   (:meth:`~gpulayerd.slurm.slurmcmd.SlurmCommands.final`).
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from gpulayerd.slurm.batch import Submission, batch_script, sbatch_argv
from gpulayerd.slurm.outputs import SlurmJob, end_of
from gpulayerd.slurm.slurmcmd import SlurmCommands, SlurmError

__all__ = ["REFUSED", "exit_status", "main", "submission_of"]

REFUSED = "NotAllowed: "
"""How the last stderr line (after ``gpulayer: ``) of an attempt sbatch refused starts, Slurm's words after it
(:func:`gpulayerd.app.worker.slurm_worker.refusal_words` reads it; the proxy then exits 126)."""

GONE_AFTER_S = 30.0
"""A job Slurm stops answering about for this long is taken as gone (exit 125)."""


def submission_of(data: dict[str, object], home: str, user: str) -> Submission:
    """The :class:`Submission` of the proxy's JSON argument; ``{home}`` and ``{user}`` of ``out_dir`` filled."""
    sig = data.get("signal")
    limit = data.get("time_limit_s")
    return Submission(
        job_id=str(data["job_id"]), attempt=int(str(data["attempt"])), argv=[str(a) for a in data["argv"]],  # type: ignore[attr-defined]
        env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},  # type: ignore[call-overload]
        workdir=str(data.get("workdir") or home or "/"),
        out_dir=str(data["out_dir"]).replace("{home}", home).replace("{user}", user),
        partition=str(data.get("partition") or ""), gpus=int(str(data.get("gpus") or 0)),
        gpu_type=str(data["gpu_type"]) if data.get("gpu_type") else None, cpus=int(str(data.get("cpus") or 1)),
        time_limit_s=float(str(limit)) if limit is not None else None,
        signal=(str(sig[0]), float(sig[1])) if isinstance(sig, list) and len(sig) == 2 else None)


WARNING_EARLY_S = 60.0
"""Slurm sends ``--signal``'s warning up to this many seconds before the time it was asked for (sbatch(1))."""

TIMED_OUT = "timed out: "
"""How the proxy's last stderr line (after ``gpulayer: ``) starts when the job's time limit ended it (exit 124:
the worker records the attempt ``timeout``, :func:`gpulayerd.app.worker.slurm_worker.timed_out`)."""


def after_warning(job: SlurmJob, sub: Submission, ran_s: float | None) -> bool:
    """Whether ``job`` (ended) died of the warning signal Slurm sent before its time limit: killed by that
    signal (or exit 128 + it) after at least the limit less the warning less :data:`WARNING_EARLY_S`.
    As on a workstation, a job that ends after its time limit's warning was ended by the limit."""
    if sub.signal is None or sub.time_limit_s is None or ran_s is None or job.state == "COMPLETED":
        return False
    number = getattr(signal.Signals, f"SIG{sub.signal[0]}", None)
    if number is None:
        return False
    died_of = job.signal == int(number) or job.exit_code == 128 + int(number)
    return died_of and ran_s >= sub.time_limit_s - sub.signal[1] - WARNING_EARLY_S


def exit_status(job: SlurmJob, warned: bool = False) -> int:
    """The exit status this process ends with for ``job`` (ended); ``warned``: it died of its time limit's
    warning (:func:`after_warning`)."""
    end = end_of(job)
    if end.timed_out or warned:
        return 124
    if end.lost:
        return 125
    code = end.exit_code
    return 128 + (-code) if code < 0 else min(code, 255)


class _Follow:
    """Copies a growing file to one of our streams from where it left off."""

    def __init__(self, path: str, fd: int) -> None:
        self.path, self.fd, self.offset = path, fd, 0

    def copy(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while chunk := f.read(1 << 16):
                    self.offset += len(chunk)
                    os.write(self.fd, chunk)
        except FileNotFoundError:
            pass


def _say(text: str) -> None:
    os.write(2, f"gpulayer: {text}\n".encode())


def main(argv: list[str] | None = None) -> int:
    """Submit, follow and end one attempt's Slurm job (see the module docstring); its exit status."""
    args = sys.argv[1:] if argv is None else argv
    data = json.loads(args[0])
    account = pwd.getpwuid(os.getuid())
    sub = submission_of(data, account.pw_dir, account.pw_name)
    cmds = SlurmCommands(float(data.get("command_timeout_s") or 10.0), dict(data.get("slurm_env") or {}))
    poll_s = float(data.get("poll_interval_s") or 1.0)
    os.makedirs(sub.out_dir, mode=0o700, exist_ok=True)
    os.chmod(sub.out_dir, 0o700)
    fd = os.open(sub.script_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(batch_script(sub))
    stop = {"asked": False, "done": False}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        job_id = cmds.submit(sbatch_argv(sub))
    except SlurmError as e:  # sbatch refused it: nothing ran (the worker ends the attempt "never started")
        _say(f"{REFUSED}{e}" if e.refusal else str(e))
        return 126
    Path(f"{sub.out_dir}/{sub.stem}.slurm").write_text(job_id + "\n")
    _say(f"Slurm job {job_id}")
    outs = [_Follow(sub.output_path("out"), 1), _Follow(sub.output_path("err"), 2)]
    last_seen = time.monotonic()
    state, down = "", ""
    running_since: float | None = None
    while True:
        if stop["asked"] and not stop["done"]:
            stop["done"] = True
            try:
                cmds.cancel(job_id)
            except SlurmError as e:
                _say(f"scancel {job_id}: {e}")
        try:
            job = cmds.job(job_id)
        except SlurmError as e:  # slurmctld unreachable says nothing of the job: the daemon's lease rule decides
            job, last_seen = None, time.monotonic()
            if not down:
                down = str(e)
                _say(f"Slurm does not answer ({down}); following job {job_id} again when it does")
        else:
            if down:
                down = ""
                _say("Slurm answers again")
            if job is not None:
                last_seen = time.monotonic()
            elif state:  # scontrol forgot it (MinJobAge passed): sacct may still have its end
                job = cmds.final(job_id, None)
        for o in outs:
            o.copy()
        if job is not None and job.state != state:
            state = job.state
            if job.state == "RUNNING":
                running_since = running_since or time.monotonic()
                _say(f"Slurm job {job_id} running on {job.nodes}")
        if job is not None and job.ended:
            time.sleep(0.2)  # the last bytes Slurm's step writes
            for o in outs:
                o.copy()
            job = cmds.final(job_id, job) or job
            end = end_of(job)
            _say(f"Slurm job {job_id} ended {job.state}" + (f" ({end.reason})" if end.reason else "")
                 + f" (from {job.source}" + (f", at {job.end}" if job.end and job.end != "Unknown" else "") + ")")
            warned = not stop["asked"] and after_warning(
                job, sub, None if running_since is None else time.monotonic() - running_since)
            if end.timed_out or warned:
                _say(f"{TIMED_OUT}Slurm job {job_id} " + ("ended at its time limit" if end.timed_out else
                     f"ended by its time limit's warning (SIG{sub.signal[0] if sub.signal else '?'})"))
            return exit_status(job, warned)
        if time.monotonic() - last_seen > GONE_AFTER_S:
            _say(f"Slurm job {job_id}: Slurm has not known it for {GONE_AFTER_S:g} s")
            return 125
        time.sleep(poll_s)


if __name__ == "__main__":
    raise SystemExit(main())
