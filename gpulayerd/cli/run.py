"""``gpulayer run``: submit a job, stream its output, exit with its exit code (like Slurm's ``srun``).

``gpulayer run [-f JOB.toml | FLAGS -- CMD ...]`` takes ``submit``'s spec flags, submits, says on
stderr why the job waits and where it runs, streams its stdout to stdout and its stderr to
stderr while it runs (every rank of a multi-host job, prefixed), and exits with the job's exit
code: 128+N when a signal N killed it, 124 when it reached its time limit, 1 when it was rejected
(the reasons printed), lost, or cancelled without an exit status (by someone else, or a dependency
never satisfied).

Ctrl-C (SIGINT) cancels the job after one second, keeps streaming until it has stopped, and
exits 130; a second Ctrl-C within that second detaches instead and leaves the job running (it
says so, with the commands to follow or cancel it). A Ctrl-C after the cancel was sent detaches
without waiting for the job to stop. SIGTERM or SIGHUP (a kill, a closed terminal) cancel the
job at once, as srun does, and exit 128+N once it has stopped (a second one: at once).

Submits with :func:`gpulayerd.cli.jobs.submit_job`, then calls the daemon through
:func:`gpulayerd.cli.http.call_daemon` (one connection for the run): job and log reads every
:data:`gpulayerd.cli.logs.POLL_S` seconds, cancel on Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, UsageError
from gpulayerd.cli.http import call_daemon
from gpulayerd.core.job_facts import TERMINAL_STATES

if TYPE_CHECKING:
    from gpulayerd.cli.http import SyncClient

__all__ = ["CANCEL_DELAY_S", "add_parser", "exit_code_of"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result

CANCEL_DELAY_S = 1.0
"""Seconds between the first Ctrl-C and the cancel request: a second Ctrl-C in them detaches."""

_TERMINAL = TERMINAL_STATES


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``run`` to the ``gpulayer`` subcommands."""
    from gpulayerd.cli.jobs import add_spec_flags

    r = sub.add_parser(
        "run", help="submit a job and wait: stream its output, exit with its exit code",
        description="Submit a job (the same spec flags as submit), say where it runs (stderr), stream its "
        "stdout and stderr, and exit with its exit code: 128+N when signal N killed it, 124 when it reached "
        "its time limit, 1 when it was rejected (reasons printed) or cancelled before it ran (a dependency "
        "never satisfied). Ctrl-C cancels it (after 1 s) and exits 130; Ctrl-C twice detaches "
        "and leaves it running.")
    add_spec_flags(r)
    r.add_argument("--key", metavar="KEY",  # named by the message of a submit that timed out or was interrupted
                   help="the submission key (default: a new uuid4): a rerun with the key of a run whose submit "
                   "timed out follows the job stored then, never a second one")
    r.set_defaults(func=_cmd_run)


def exit_code_of(job: Any) -> int:
    """The exit code ``gpulayer run`` ends with for a finished ``job`` (a job view):
    0 succeeded; 124 when it reached its time limit (``timeout``, as coreutils' timeout exits); its
    exit status when it exited; 128+N when signal N killed it (the view's exit code is -N); 1
    otherwise (rejected, lost, cancelled before it ran)."""
    if job.status == "succeeded":
        return EXIT_OK
    if job.status == "timeout":
        return EXIT_TIMEOUT
    code: int | None = job.exit_code
    if code is None:
        return EXIT_FAILURE
    if code < 0:
        return 128 + min(-code, 127)
    return code if 0 < code < 256 else EXIT_FAILURE


class _Interrupts:
    """SIGINTs received (the handler only counts; the poll loop acts). Not a dataclass: ``dataclasses``
    costs 5 ms of every CLI start."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ended: list[int] = []  # SIGTERM/SIGHUP received (a closed terminal, a kill)

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.times.append(time.monotonic())

    def end_handler(self, signum: int, frame: FrameType | None) -> None:
        if self.ended:  # a second one: stop waiting now (the cancel was sent)
            raise SystemExit(128 + signum)
        self.ended.append(signum)


def _cmd_run(args: argparse.Namespace) -> int:
    from gpulayerd.cli.jobs import spec_body, submit_job

    body = spec_body(args)
    if body.get("array") is not None:
        raise UsageError("run: array: an array's tasks are jobs of their own; use gpulayer submit --array")
    job = submit_job(args, body)
    return call_daemon(args, lambda c: _run(c, job))


def _run(c: SyncClient, job: Any) -> int:
    label = job.id + (f" ({fmt.escape(job.name)})" if job.name else "")
    if job.status == "rejected":
        _say(f"job {label} rejected: nothing will run it")
        _reasons(job)
        return EXIT_FAILURE
    _say(f"job {label} submitted")
    ints = _Interrupts()
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, ints.handler)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, ints.end_handler)
    try:
        return _follow(c, job, ints)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow(c: SyncClient, job: Any, ints: _Interrupts) -> int:
    """Stream the job's logs until it ends (or a second Ctrl-C); the exit code."""
    from gpulayerd.cli.jobs_table import where_of
    from gpulayerd.cli.logs import POLL_S, _drain, _ranks, _tails

    outs, errs = _tails(_ranks(job, None, None), None), _tails(_ranks(job, None, None), None)
    waited, where, cancel_sent = "", "", False
    while True:
        complete = True
        for t in outs:
            complete = _drain(c, job.id, t, "stdout", None, sys.stdout) and complete
        for t in errs:
            complete = _drain(c, job.id, t, "stderr", None, sys.stderr) and complete
        if job.status in _TERMINAL:
            break  # the logs were read once more after it ended
        if ints.ended and not cancel_sent:  # like srun: the job does not outlive a killed `run`
            name = signal.Signals(ints.ended[0]).name
            c.cancel(job.id)
            _say(f"{name}: job {job.id} cancelled; waiting for it to stop ({name} again to stop waiting)")
            cancel_sent = True
        elif ints.times:
            detached = _on_interrupt(c, job, ints, cancel_sent)
            if detached:
                return EXIT_INTERRUPTED
            cancel_sent = True
        time.sleep(POLL_S)
        job = c.job(job.id)
        if job.status == "queued" and job.reason and job.reason != waited:
            waited = job.reason
            _say(f"job {job.id} waits: {fmt.escape(fmt.one_line(job.reason, 300))}")
        now = fmt.escape(where_of(job) or "") if job.status != "queued" else ""
        if now and now != where:
            where = now
            _say(f"job {job.id} {'runs' if job.status in ('claimed', 'running') else 'ran'} on {now}")
        ranks = _ranks(job, None, None)
        if ranks != [t.rank for t in outs]:
            for t in outs:
                t.flush(sys.stdout)
            for t in errs:
                t.flush(sys.stderr)
            outs, errs = _tails(ranks, None), _tails(ranks, None)  # it started on several hosts
    for t in outs:
        t.flush(sys.stdout)
    for t in errs:
        t.flush(sys.stderr)
    from gpulayerd.cli.logs import outcome

    _say(outcome(job))
    if job.status == "rejected":
        _reasons(job)
    if ints.ended:
        return 128 + ints.ended[0]
    return EXIT_INTERRUPTED if cancel_sent else exit_code_of(job)


def _on_interrupt(c: SyncClient, job: Any, ints: _Interrupts, cancel_sent: bool) -> bool:
    """Act on Ctrl-C: True to detach now. The first one cancels after :data:`CANCEL_DELAY_S`
    unless a second one comes in that time (detach, the job left running)."""
    if cancel_sent:
        if len(ints.times) > 1:
            _say(f"detached: job {job.id} was asked to stop and may still be stopping "
                 f"(gpulayer show {job.id})")
            return True
        return False
    _say(f"Ctrl-C: cancelling job {job.id} in {CANCEL_DELAY_S:g} s; Ctrl-C again to detach and leave it running")
    end = ints.times[0] + CANCEL_DELAY_S
    while len(ints.times) < 2 and time.monotonic() < end:
        time.sleep(0.05)
    if len(ints.times) >= 2:
        _say(f"detached: job {job.id} keeps running (not cancelled). Follow it: gpulayer logs -f {job.id}; "
             f"stop it: gpulayer cancel {job.id}")
        return True
    c.cancel(job.id)
    _say(f"job {job.id}: cancel requested (SIGTERM, then SIGKILL after the grace period); "
         "Ctrl-C again to stop waiting")
    del ints.times[1:]
    return False


def _reasons(job: Any) -> None:
    """Why a job was rejected, one line per reason (the explanation's, else the job's reason)."""
    e = getattr(job, "explanation", None)
    rejections = list(getattr(e, "rejections", None) or []) if e is not None else []
    if rejections:
        for r in rejections:
            _say(f"  ✗ {fmt.escape(str(r.requirement))}: {fmt.escape(str(r.message))}")
    elif job.reason:
        _say(f"  {fmt.escape(fmt.one_line(job.reason, 2000))}")


def _say(line: str) -> None:
    print(f"gpulayer run: {line}", file=sys.stderr, flush=True)
