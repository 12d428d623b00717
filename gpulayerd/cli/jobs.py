"""``gpulayer submit``, ``jobs``, ``show``, ``logs`` and ``cancel``: the job queue of the local gpulayerd.

(Same name as :mod:`gpulayerd.store.jobs`: the same idea (the job queue) at the CLI and at the store.)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_FAILURE, EXIT_OK, UsageError
from gpulayerd.cli.http import call_daemon
from gpulayerd.cli.jobs_table import columns_help, task_count, tasks_by_index
from gpulayerd.core.job_facts import FINISHED_SHOWN, JOB_STATES, TERMINAL_STATES, job_user

TYPE_CHECKING = False  # `typing` costs ~2 ms of every CLI start; mypy reads this name as true
if TYPE_CHECKING:
    from typing import Any

    from gpulayerd.cli.http import SyncClient
    from gpulayerd.models import JobView

__all__ = ["JOB_STATES", "SHIPPED_PROFILE_NAMES", "add_parsers", "add_spec_flags", "spec_body", "submit_job",
           "submit_or_replay"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result

_TERMINAL = TERMINAL_STATES
# JOB_STATES (gpulayerd.core.job_facts) are ``--state``'s choices, so a typo is a usage error naming
# the flag and shell completion offers them.

SHIPPED_PROFILE_NAMES = ("cpu-only", "torch-2.4-cu124", "torch-2.5-cu121", "torch-mps")
"""The profiles of ``gpulayerd/profiles/shipped.toml`` (kept equal by a test): what shell completion
offers after ``--profile`` (any other name is still accepted: admins and users add theirs)."""


class _Suggestions(tuple[str, ...]):
    """``choices`` that only suggest: shell completion (shtab) offers its items, while argparse
    accepts any value (``in`` is always true). Help shows the option's metavar, not the items."""

    def __contains__(self, _: object) -> bool:
        return True
_SPEC_FLAGS = ("name", "workdir", "accelerator", "gpus", "gpu_memory_gb", "gpu_memory_kind", "min_cc", "framework",
               "requires_python", "nproc", "nnodes", "backend", "env", "retries", "lease_s", "profile",
               "min_driver_version", "cuda_runtime", "os", "time", "signal", "retry_on", "retry_exit_codes",
               "retry_backoff", "retry_elsewhere", "no_preflight", "notify", "notify_tasks", "array", "after", "ship",
               "output", "output_dir", "worker", "no_slurm")


def add_parsers(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``submit``, ``jobs``, ``show``, ``logs`` and ``cancel`` to the ``gpulayer`` subcommands."""
    sb = sub.add_parser(
        "submit",
        help="submit a job: -f JOB.toml, or flags -- CMD...",
        description="Submit a job to the local gpulayerd. A leading 'python' in the command runs with "
        "the matched environment's interpreter. Exit 0 when queued, 1 when rejected (reasons printed), "
        "2 for a bad spec (nothing stored).",
    )
    add_spec_flags(sb)
    sb.add_argument("--json", action="store_true", help="print the stored job as JSON")
    sb.add_argument("--key", metavar="KEY",
                    help="the submission key (default: a new uuid4): a rerun with the key of a submission that "
                    "timed out gets the job stored then, never a second one")
    sb.set_defaults(func=_cmd_submit)

    j = sub.add_parser(
        "jobs", help="the job queue of every user: id, name, user, state, where, age, reason",
        description="The job queue of every user, on every trusted peer too. Lines fit the terminal (COLUMNS, "
        "else its width; not cut when piped): NAME and REASON are cut first (below 100 columns NAME first), "
        "REASON keeps its code and deciding words; USER is left out when every job has the same user. "
        "Finished jobs beyond the 20 latest are hidden unless --all; --limit N shows the N latest.")
    j.add_argument("--all", action="store_true", help="also every finished job (default: the 20 latest)")
    j.add_argument("--here", action="store_true",
                   help="only the jobs submitted to this daemon (default: every trusted peer's too)")
    j.add_argument("--state", action="append", metavar="STATE", choices=JOB_STATES,
                   help=f"only jobs in STATE (repeatable): {', '.join(JOB_STATES)}")
    j.add_argument("--limit", type=_positive, metavar="N",
                   help="at most the N latest jobs (after the other filters; the daemon selects them)")
    who = j.add_mutually_exclusive_group()
    who.add_argument("--user", metavar="USER", help="only USER's jobs")
    who.add_argument("--mine", action="store_true", help="only my own jobs")
    j.add_argument("--wide", action="store_true", help="never cut a cell (lines as long as they need)")
    j.add_argument("-o", "--format", metavar="COLS",
                   help="the columns, a comma list like squeue's -o, e.g. id,state,name,reason. " + columns_help())
    j.add_argument("--json", action="store_true", help="print the jobs as a JSON list (every field)")
    j.add_argument("--tasks", action="store_true", help="each task of an array on a line of its own (default: "
                   "an array is one line, its tasks counted by state; finished tasks with --all or --state)")
    j.set_defaults(func=_cmd_jobs)

    sh = sub.add_parser("show", help="one job: spec, state, attempts, history, why it waits",
                        description="One job: its user, state and reason, where it runs or ran, what it asks for, "
                        "its attempts and history; a waiting job also its position, who holds what it waits for and "
                        "when it may start; a running one how long its command usually takes.")
    sh.add_argument("job", metavar="ID", help="the job's id (gpulayer jobs lists them), a task's (ID_7) or an "
                    "array's; a unique prefix will do")
    sh.add_argument("--json", action="store_true", help="print the job as JSON (every field)")
    sh.set_defaults(func=_cmd_show)

    lg = sub.add_parser(
        "logs", help="a job's output",
        description="A job's stdout, then its stderr when stdout is empty (else how much stderr holds). "
        "A multi-host job: every rank's lines prefixed with [rank N], or --rank N. With -f: until the "
        "job ends, saying why it waits; the last line (on stderr) says how it ended, and the exit "
        "status is 0 when it succeeded, 1 otherwise. To a terminal, another user's job output is shown "
        "safe: colours kept, every other escape sequence and control character dropped, a carriage "
        "return overwriting its line (a progress bar shows its last state); piped output and your own "
        "jobs' output are the bytes as written (--raw: always).")
    lg.add_argument("job", metavar="ID", help="the job's id, or a task's (ID_7: an array's output is in its "
                    "tasks' logs)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--stderr", action="store_true", help="the standard error log instead of stdout")
    lg.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt (default: the latest)")
    lg.add_argument("--rank", type=int, metavar="R", help="node rank R of a multi-host job (0: the first host)")
    lg.add_argument("--raw", action="store_true",
                    help="print the output as written, escape sequences included, also to a terminal")
    lg.set_defaults(func=_cmd_logs)

    c = sub.add_parser("cancel", help="cancel a job (running: SIGTERM or --signal NAME, grace, SIGKILL to its "
                       "process group)")
    c.add_argument("job", metavar="ID", help="the job's id; a task's (ID_7: that task alone, also before it "
                   "was written), or an array's (every task not yet ended)")
    c.add_argument("--signal", metavar="NAME", default="",
                   help="send this signal first instead of SIGTERM (e.g. USR1), then SIGKILL after the grace period")
    c.add_argument("--json", action="store_true", help="print the job as JSON after the request")
    c.set_defaults(func=_cmd_cancel)


def add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The job spec flags of ``submit`` and ``run``: ``-f JOB.toml``, or the requirement flags and ``-- CMD``."""
    p.add_argument("-f", "--file", type=Path, metavar="JOB.toml", help="job spec file")
    p.add_argument("--name", metavar="NAME",
                   help="a name shown in listings (printable text: control characters are refused)")
    p.add_argument("--workdir", help="directory the job runs in (default: the current directory)")
    p.add_argument("--accelerator", choices=["cpu", "cuda", "mps", "rocm"],
                   help="the device kind the job needs (default: cpu)")
    p.add_argument("--gpus", type=int, metavar="N", help="devices per host (default 1 for GPU accelerators)")
    p.add_argument("--gpu-memory-gb", type=float, metavar="X", help="per device, decimal GB (10^9 bytes)")
    p.add_argument("--gpu-memory-kind", choices=["dedicated", "unified"],
                   help="dedicated VRAM, or unified memory shared with the CPU (e.g. Apple silicon)")
    p.add_argument("--min-cc", metavar="X.Y", help="minimum CUDA compute capability, e.g. 8.0")
    p.add_argument("--framework", action="append", metavar="SPEC", default=[],
                   help="framework requirement, e.g. 'torch>=2.4' (repeatable)")
    p.add_argument("--requires-python", metavar="SPEC", help="interpreter version, e.g. '>=3.10'")
    p.add_argument("--profile", metavar="NAME", choices=_Suggestions(SHIPPED_PROFILE_NAMES),
                   help="a runtime profile (gpulayer profiles lists them); the requirements given here win "
                   "over its items")
    p.add_argument("--min-driver-version", metavar="X.Y.Z", help="oldest NVIDIA driver, e.g. 525.60.13")
    p.add_argument("--cuda-runtime", metavar="SPEC", help="torch's CUDA build, e.g. '>=12.1' or '12.4'")
    p.add_argument("--os", choices=["linux", "darwin"], help="the worker's operating system")
    p.add_argument("--worker", metavar="NAME", help="run only on the worker of this name (as gpulayer peers shows it)")
    p.add_argument("--no-slurm", action="store_true", default=None,
                   help="never on a Slurm worker (a cluster's gateway)")
    p.add_argument("--nproc", type=int, metavar="N", help="torch.distributed processes per host")
    p.add_argument("--nnodes", type=int, metavar="N", help="hosts for a torch.distributed job")
    p.add_argument("--backend", choices=["gloo", "nccl"], help="torch.distributed backend")
    p.add_argument("--env", action="append", metavar="K=V", default=[], help="environment variable (repeatable)")
    p.add_argument("--retries", type=int, metavar="N",
                   help="run the job again up to N times after an attempt that ends as --retry-on says (default 0)")
    p.add_argument("--lease-s", type=float, metavar="S", help="lease length in seconds (default 30)")
    # Time limits and retries on failure (issue 33): [policy] time_limit, signal, retry_*.
    p.add_argument("--time", metavar="DURATION", help="time limit, e.g. 90s, 10m, 2h30m, 1d: at it SIGTERM, grace, "
                   "SIGKILL, the job ends timeout")
    p.add_argument("--signal", metavar="NAME[@S]", help="warning signal NAME S seconds before the time limit "
                   "(default TERM@60, half the limit when it is under 2 min), e.g. USR1@300")
    p.add_argument("--retry-on", metavar="ENDS", help="which ends --retries re-runs: lost, failed, timeout, "
                   "comma-separated (default lost)")
    p.add_argument("--retry-exit-codes", metavar="CODES", help="retry failed/timed-out attempts only with these exit "
                   "codes (0-255; killed by signal N: 128+N), e.g. 137,143")
    p.add_argument("--retry-backoff", metavar="DURATION", help="wait before the first retry of a failed or timed-out "
                   "attempt, doubled for each next one (default 10s; 0: none)")
    p.add_argument("--retry-elsewhere", action="store_true", default=None,
                   help="prefer another worker than the last attempt's for the next attempt (the same one "
                        "still runs it when no other fits)")
    p.add_argument("--no-preflight", action="store_true", default=None,
                   help="skip the pre-flight check (before the command, on the chosen worker, the frameworks the job "
                        "names are imported and a CUDA/MPS device initialized: a broken environment moves the job "
                        "to another worker instead of failing it; it costs about a second per named framework)")
    p.add_argument("--notify", metavar="EVENTS",
                   help="run your notify command (`notify` in ~/.config/gpulayer/config.toml) as you when the job "
                        "ends, fails or starts: end, fail, start, comma-separated (an array: once, when all its "
                        "tasks ended)")
    p.add_argument("--notify-tasks", action="store_true", default=None,
                   help="with --array: notify for each task too")
    p.add_argument("--array", metavar="0-99[:STEP][%MAX]",
                   help="a job array: one task per index (a range, a range with a step, or a list 1,5,9; %%MAX: at "
                        "most MAX tasks at once, lab-wide); {task} in the command is the index; task ids are ID_7 "
                        "(submit only: run refuses an array)")
    p.add_argument("--after", action="append", metavar="ID[:ok|any|notok]", default=[],
                   help="wait for job, task or array ID to end: ok (default) when it succeeded, any however it "
                        "ended, notok when it did not succeed; never satisfiable: cancelled (repeatable)")
    p.add_argument("--ship", action="store_true", default=None,
                   help="ship the workdir with the job: a snapshot (in git: tracked and untracked files not ignored; "
                   "elsewhere: all but .gpulayerignore's patterns; links as links) is uploaded now, and the job runs "
                   "on any worker in a fresh copy of it (default: the workdir must exist on the worker)")
    p.add_argument("--no-ship", action="store_true", default=None,
                   help="do not ship the workdir, even where the daemon's config ships jobs by default (ship = true)")
    p.add_argument("--output", action="append", metavar="GLOB", default=[],
                   help="with --ship: files matching GLOB (relative to the workdir, e.g. 'results/*.json') come "
                   "back when the attempt ends, also after a failure, into WORKDIR/gpulayer-out/ID/ (repeatable)")
    p.add_argument("--output-dir", metavar="DIR", help="with --output: bring the files back into DIR instead")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command to run, after -- (a leading 'python' uses the matched environment)")


def _positive(text: str) -> int:
    """``--limit``'s value: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return n


def _spec_from_flags(args: argparse.Namespace) -> dict[str, object]:
    if not args.cmd:
        raise UsageError("submit: give -f JOB.toml or a command after --")
    cmd = args.cmd[1:] if args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise UsageError("submit: the command after -- is empty")
    req: dict[str, object] = {}
    for key, value in (("accelerator", args.accelerator), ("gpu_count", args.gpus),
                       ("gpu_memory_gb", args.gpu_memory_gb), ("gpu_memory_kind", args.gpu_memory_kind),
                       ("min_cuda_compute_capability", args.min_cc), ("python", args.requires_python),
                       ("min_driver_version", args.min_driver_version), ("cuda_runtime", args.cuda_runtime),
                       ("os", args.os)):
        if value is not None:
            req[key] = value
    frameworks: dict[str, str] = {}
    for text in args.framework:
        from packaging.requirements import InvalidRequirement, Requirement  # 13 ms: only when asked

        try:
            r = Requirement(text)
        except InvalidRequirement as e:
            raise UsageError(f"--framework: {text!r} is not like 'torch>=2.4' ({e})") from e
        if r.extras:  # refused as in a TOML spec
            from gpulayerd.models.spec import extras_refusal

            raise UsageError(f"--framework: {extras_refusal(r.name, r.extras, str(r.specifier))}")
        frameworks[r.name] = str(r.specifier)
    if frameworks:
        req["frameworks"] = frameworks
    spec: dict[str, object] = {"command": cmd, "requirements": req}
    if args.profile:
        spec["profile"] = args.profile
    if args.name:
        spec["name"] = args.name
    dist = {k: v for k, v in (("nproc_per_node", args.nproc), ("nnodes", args.nnodes),
                              ("backend", args.backend)) if v is not None}
    if dist:
        spec["distributed"] = dist
    policy = {k: v for k, v in (("retries", args.retries), ("lease_s", args.lease_s), ("time_limit", args.time),
                                ("signal", args.signal), ("retry_on", args.retry_on),
                                ("retry_exit_codes", args.retry_exit_codes), ("retry_backoff_s", args.retry_backoff),
                                ("retry_elsewhere", args.retry_elsewhere),
                                ("preflight", False if args.no_preflight else None),
                                ("notify", args.notify), ("notify_tasks", args.notify_tasks)) if v is not None}
    if policy:
        spec["policy"] = policy
    env: dict[str, str] = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env: {item!r} is not K=V")
        env[key] = value
    if env:
        spec["env"] = env
    if args.workdir:
        spec["workdir"] = args.workdir
    if args.array is not None:
        spec["array"] = args.array
    if args.after:
        spec["after"] = args.after
    if args.worker:
        spec["worker"] = args.worker
    if args.no_slurm:
        spec["slurm"] = False
    return spec


def spec_body(args: argparse.Namespace) -> dict[str, object]:
    """The spec to submit, from ``-f JOB.toml`` or the flags (:func:`add_spec_flags`), as JSON data,
    its workdir resolved and checked to be a directory here.

    Raises:
        UsageError: a bad spec or flag, both -f and a command, or no such workdir.
    """
    # No pydantic here (a fast start): the daemon validates the spec and names each bad field.
    if args.file is not None:
        if args.cmd and [c for c in args.cmd if c != "--"]:
            raise UsageError("submit: give either -f JOB.toml or a command, not both")
        flags = [f"--{k.replace('_', '-')}" for k in _SPEC_FLAGS if getattr(args, k) not in (None, [])]
        if flags:
            raise UsageError(f"submit: {', '.join(flags)} cannot be combined with -f; put them in the spec file")
        spec, base = _read_toml(args.file), args.file.resolve().parent
    else:
        spec, base = _spec_from_flags(args), Path.cwd()
    policy = spec.get("policy")
    if isinstance(policy, dict) and policy.get("notify"):  # the user's command, read here, as the user
        from gpulayerd.host.user_config import notify_policy

        try:
            notify_policy(policy)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if spec.get("profile"):  # expanded here, where the user's own profile file is readable
        from gpulayerd.cli.profiles import expand_spec

        spec = expand_spec(spec)
    raw = spec.get("workdir")
    if raw is not None and not isinstance(raw, str):
        return spec  # the daemon names the bad field
    wd = _resolve_workdir(raw, base)
    spec["workdir"] = wd
    try:
        is_dir = Path(wd).is_dir()
    except OSError as e:  # e.g. a directory under another account's 0700 home
        raise UsageError(f"workdir: {wd}: {e.strerror or e}") from e
    if not is_dir:
        raise UsageError(f"workdir: {wd} does not exist or is not a directory")
    asked = (getattr(args, "ship", None) or "ship" in spec or getattr(args, "output", None)
             or getattr(args, "output_dir", None))
    if not asked and (getattr(args, "no_ship", None) or not _lab_default(args)):
        return spec  # not shipped (nor the lab's default): none of the hashing and upload is imported
    from gpulayerd.ship.upload import ShipUsageError, ship_spec  # (--ship: the hashing, still no pydantic)

    try:
        return ship_spec(args, spec, lambda upload: call_daemon(args, upload), lambda: _lab_default(args))
    except ShipUsageError as e:
        raise UsageError(str(e)) from None


def _read_toml(path: Path) -> dict[str, object]:
    """The spec file as a mapping (tomllib: no validation here).

    Raises:
        UsageError: it cannot be read, is not UTF-8, or is not TOML (naming the file).
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        return dict(tomllib.loads(path.read_text(encoding="utf-8")))
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: malformed TOML: {e}") from e
    except RecursionError:  # tomllib recurses per nesting level: "[[[[...]]]]" would be a traceback
        raise UsageError(f"{path}: malformed TOML: arrays or tables nested too deeply") from None


def _resolve_workdir(raw: str | None, base: Path) -> str:
    """The absolute workdir: ``raw`` with ``~`` expanded, relative to ``base``; ``base`` when None or empty
    (the rule of :func:`gpulayerd.models.job_spec_from_mapping`).

    Raises:
        UsageError: ``~user`` names no user.
    """
    if not raw:
        return os.path.normpath(base)
    workdir = Path(raw)
    if raw.startswith("~"):
        expanded = os.path.expanduser(raw)
        if expanded.startswith("~"):
            raise UsageError(f"invalid job spec\nworkdir: cannot expand {raw!r} (no such user)")
        workdir = Path(expanded)
    if not workdir.is_absolute():
        workdir = base / workdir
    return os.path.normpath(workdir)


def _uuid4() -> str:
    """A new random uuid4 in its usual text form (what ``str(uuid.uuid4())`` gives, without the ~5 ms
    import of ``uuid``)."""
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40  # version 4
    b[8] = b[8] & 0x3F | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def submit_job(args: argparse.Namespace, body: dict[str, object]) -> Any:
    """Submit ``body`` (:func:`spec_body`) with the submitter's ``PATH`` and a submission key
    (``args.key``, else a new uuid4); the stored job (:class:`gpulayerd.cli.http.Record`).
    :func:`submit_or_replay` also says whether the key's job was stored before."""
    return submit_or_replay(args, body)[0]


def submit_or_replay(args: argparse.Namespace, body: dict[str, object]) -> tuple[Any, bool]:
    """:func:`submit_job`: ``(job, replayed)``, ``replayed`` True when the daemon answered the job
    stored before with this key (header :data:`gpulayerd.app.owner.idempotency.REPLAYED_HEADER`).

    When the daemon does not answer in time the one-line message names the key: rerunning with
    ``--key`` gets that job if it was stored, never a second one (no automatic retry: a daemon
    that is stopped would make the user wait twice).

    Raises:
        UsageError: the daemon refused the spec (the message names each bad field), or the key was
            used before for a job with a different spec (HTTP 409).
        CommandFailed: no daemon, no answer in time, or another failure.
    """
    from gpulayerd.app.owner.idempotency import REPLAYED_HEADER

    key = getattr(args, "key", None) or _uuid4()
    # The daemon takes the user from the kernel; the job runs with this shell's PATH.
    path = os.environ.get("PATH") or ""
    source = str(args.file) if getattr(args, "file", None) is not None else "submit flags"
    try:
        return call_daemon(args, lambda c: (c.submit(body, path=path, key=key), c.header(REPLAYED_HEADER) == "true"),
                           on_timeout=f"the job may be queued: gpulayer jobs (rerun with --key {key} to get it, "
                           "never a second one)")
    except KeyboardInterrupt:  # Ctrl-C before the answer: the daemon may have stored the job all the same
        print(f"gpulayer: interrupted before gpulayerd answered; the job may be queued: gpulayer jobs (rerun with "
              f"--key {key} to get it, never a second one)", file=sys.stderr)
        raise
    except UsageError as e:
        msg = str(e)
        if msg.startswith("job spec: "):
            msg = f"{source}: {msg.removeprefix('job spec: ')}"
        raise UsageError(msg) from None


def _cmd_submit(args: argparse.Namespace) -> int:
    job, replayed = submit_or_replay(args, spec_body(args))
    if args.json:
        print(_dumps(job, indent=2))
    elif replayed:  # the same key and spec as before: that job, nothing stored now
        named = f"{fmt.escape(job.name)}, " if job.name else ""
        print(f"already submitted: job {job.id} ({named}{job.status}; key {fmt.escape(args.key or '')})")
        if job.status == "rejected":
            print(f"  rejected: {fmt.escape(job.reason)}")
    else:
        label = f"{job.id}" + (f" ({fmt.escape(job.name)})" if job.name else "")
        array = getattr(job.spec, "array", None)  # (the light view has no field left out as None)
        if array and job.status != "rejected":  # (task ids: ID_7; gpulayer jobs --tasks lists them)
            print(f"submitted array {label}: {fmt.escape(array)}, {task_count(array)}; {job.status}")
        else:
            print(f"submitted job {label}: {job.status}")
        if job.status == "rejected":
            print(f"  rejected: {fmt.escape(job.reason)}")
    return EXIT_FAILURE if job.status == "rejected" else EXIT_OK


def _cmd_jobs(args: argparse.Namespace) -> int:
    if args.format:
        from gpulayerd.cli.jobs_table import parse_columns

        parse_columns(args.format)  # a bad -o is a usage error before any call

    scope = "local" if args.here else "cluster"
    user = _my_name() if args.mine else args.user
    finished = None if args.all or args.state else FINISHED_SHOWN
    # The daemon filters (state, user, the FINISHED_SHOWN latest finished) and sends only the fields printed.
    fields = None if args.json else _fields_for(args.format)

    def listed(c: SyncClient) -> tuple[list[Any], int, list[Any]]:
        jobs = c.jobs(states=args.state, limit=args.limit, scope=scope, user=user, finished=finished, fields=fields)
        hidden = int(c.header("X-Gpulayer-Left-Out") or 0)
        return jobs, hidden, (c.peers() if scope == "cluster" else [])

    jobs, hidden, peers = call_daemon(args, listed)
    # Trusted peers that miss heartbeats were not asked (or did not answer): say so.
    down = sum(1 for p in peers if p.trusted and p.state in ("suspect", "down"))
    if down:
        print(fmt.peers_down(down), file=sys.stderr)
    if peers and peers[0].state == "removed":  # this daemon itself (listed first)
        print("this node was removed from the cluster: the members refuse it, so only its own jobs are listed "
              "and they run only here (gpulayer cluster show says what to do)", file=sys.stderr)
    gone = [fmt.escape(p.name or p.node_id[:12]) for p in peers[1:] if p.state == "removed"]
    if gone:
        print(f"jobs owned by {', '.join(gone)} are not listed: removed from the cluster", file=sys.stderr)
    if args.json:
        print("[" + ",".join(_dumps(j) for j in jobs) + "]")
        return EXIT_OK
    if not args.tasks:  # an array is one line: its tasks counted in its REASON
        arrays = {j.id for j in jobs if getattr(j, "array", None) is not None}
        jobs = [j for j in jobs if getattr(j, "array_id", None) not in arrays]
    else:
        jobs = tasks_by_index(jobs)
    print(_table(jobs, args))
    if hidden:
        print(f"{hidden} older job{'s' if hidden != 1 else ''} hidden ({'--limit' if args.limit else '--all'})",
              file=sys.stderr)
    return EXIT_OK


def _table(jobs: list[JobView], args: argparse.Namespace) -> str:
    """The text table: ``-o`` columns, else the default ones (:func:`~gpulayerd.cli.jobs_table.default_columns`:
    USER only when the jobs have several users, OWNER when several daemons own jobs)."""
    from gpulayerd.cli.jobs_table import default_columns, line_width, parse_columns, render_jobs

    columns = parse_columns(args.format) if args.format else default_columns(jobs, _my_name())
    return render_jobs(jobs, columns, line_width(args.wide))


_COLUMN_FIELDS: dict[str, tuple[str, ...]] = {
    "id": (), "name": ("name",), "user": ("spec.user", "submitted_by"), "owner": ("owner", "owner_name"),
    "state": ("status",), "where": ("where_node", "where_name", "where_devices", "where_hosts", "holder",
                                    "holder_name"),
    "age": ("submitted_at",), "code": ("reason_code",), "reason": ("reason", "reason_code"),
    "exit": ("exit_code",), "attempt": ("attempt",), "submitted": ("submitted_at",),
}
"""The job fields (``GET /v1/jobs?fields=``) each column of ``gpulayer jobs`` reads."""


def _fields_for(columns: str | None) -> list[str] | None:
    """The fields to ask for the table's columns (``-o``, else the default ones and OWNER); None: all
    (a column this map does not know)."""
    from gpulayerd.cli.jobs_table import DEFAULT, parse_columns

    names = parse_columns(columns) if columns else [*DEFAULT, "owner"]
    if any(n not in _COLUMN_FIELDS for n in names):
        return None
    return sorted({"owner", "status", "array_id", "array", *(f for n in names for f in _COLUMN_FIELDS[n])})


def _dumps(data: object, indent: int | None = None) -> str:
    """JSON as the API's models print it (compact, or ``indent``; UTF-8 kept)."""
    import json

    return fmt.json_out(json.dumps(data, ensure_ascii=False, indent=indent, separators=None if indent else (",", ":")))


def _user_of(j: JobView) -> str:
    """The user a job belongs to (its spec's ``user``; jobs from before users: ``submitted_by``)."""
    return job_user(j.spec.user, j.submitted_by)


def _my_name() -> str:
    """This process's user name, from the user database (``$USER`` is not asked)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"  # what the daemon calls an account without a name


def _cmd_show(args: argparse.Namespace) -> int:
    from gpulayerd.cli.render import render_job
    from gpulayerd.models import JobView  # render_job reads the model's properties

    raw = call_daemon(args, lambda c: c.job(args.job))
    if args.json:
        print(_dumps(raw, indent=2))
        return EXIT_OK
    print(render_job(JobView.model_validate(raw)))
    return EXIT_OK


def _cmd_logs(args: argparse.Namespace) -> int:
    from gpulayerd.cli.logs import follow_logs

    if args.rank is not None and args.rank < 0:
        raise UsageError("logs: --rank must be 0 or more")
    return call_daemon(args, lambda c: follow_logs(c, args))


def _lab_default(args: argparse.Namespace) -> bool:
    """The daemon's ``ship`` setting (its health's ``ship_default``); False when it cannot be asked (the
    submit then says why)."""
    from gpulayerd.cli import http
    from gpulayerd.cli.exits import CommandFailed

    try:
        return bool(getattr(http.call_daemon(args, lambda c: c.health()), "ship_default", False))
    except CommandFailed:
        return False


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = call_daemon(args, lambda c: c.cancel(args.job, args.signal))
    if args.json:
        print(_dumps(job, indent=2))
    elif job.status in _TERMINAL and not job.cancel_requested and job.status != "cancelled":
        print(f"job {job.id} had already ended: {job.status}")
    elif job.cancel_requested and job.status not in _TERMINAL:
        print(f"job {job.id}: {job.status} (stopping: SIG{args.signal.upper().removeprefix('SIG') or 'TERM'}, then "
              "SIGKILL after the grace period)")
    else:
        print(f"job {job.id}: {job.status}")
    return EXIT_OK
