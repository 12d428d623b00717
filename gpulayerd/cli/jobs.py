"""``gpulayer submit``, ``jobs``, ``show``, ``logs`` and ``cancel``: the job queue of the local gpulayerd."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayerd import text as fmt
from gpulayerd.cli.client import call_daemon
from gpulayerd.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError

if TYPE_CHECKING:
    from gpulayerd.api.client import DaemonClient
    from gpulayerd.models import JobView

__all__ = ["add_parsers"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result

_TERMINAL = {"succeeded", "failed", "cancelled", "lost", "rejected"}
_SPEC_FLAGS = ("name", "workdir", "accelerator", "gpus", "gpu_memory_gb", "gpu_memory_kind", "min_cc", "framework",
               "requires_python", "nproc", "nnodes", "backend", "env", "retries", "lease_s")


def add_parsers(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``submit``, ``jobs``, ``show``, ``logs`` and ``cancel`` to the ``gpulayer`` subcommands."""
    sb = sub.add_parser(
        "submit",
        help="submit a job: -f JOB.toml, or flags -- CMD...",
        description="Submit a job to the local gpulayerd. A leading 'python' in the command runs with "
        "the matched environment's interpreter. Exit 0 when queued, 1 when rejected (reasons printed), "
        "2 for a bad spec (nothing stored).",
    )
    sb.add_argument("-f", "--file", type=Path, metavar="JOB.toml", help="job spec file")
    sb.add_argument("--name")
    sb.add_argument("--workdir", help="directory the job runs in (default: the current directory)")
    sb.add_argument("--accelerator", choices=["cpu", "cuda", "mps", "rocm"])
    sb.add_argument("--gpus", type=int, metavar="N", help="devices per host (default 1 for GPU accelerators)")
    sb.add_argument("--gpu-memory-gb", type=float, metavar="X", help="per device, decimal GB (10^9 bytes)")
    sb.add_argument("--gpu-memory-kind", choices=["dedicated", "unified"])
    sb.add_argument("--min-cc", metavar="X.Y", help="minimum CUDA compute capability, e.g. 8.0")
    sb.add_argument("--framework", action="append", metavar="SPEC", default=[],
                    help="framework requirement, e.g. 'torch>=2.4' (repeatable)")
    sb.add_argument("--requires-python", metavar="SPEC", help="interpreter version, e.g. '>=3.10'")
    sb.add_argument("--nproc", type=int, metavar="N", help="torch.distributed processes per host")
    sb.add_argument("--nnodes", type=int, metavar="N", help="hosts for a torch.distributed job")
    sb.add_argument("--backend", choices=["gloo", "nccl"], help="torch.distributed backend")
    sb.add_argument("--env", action="append", metavar="K=V", default=[], help="environment variable (repeatable)")
    sb.add_argument("--retries", type=int, metavar="N", help="re-queue a lost attempt up to N times (default 0)")
    sb.add_argument("--lease-s", type=float, metavar="S", help="lease length in seconds (default 30)")
    sb.add_argument("--json", action="store_true", help="print the stored job as JSON")
    sb.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    sb.set_defaults(func=_cmd_submit)

    j = sub.add_parser("jobs", help="the job queue of every user: id, name, user, state, where, age, reason")
    j.add_argument("--all", action="store_true", help="also every finished job (default: the 20 latest)")
    j.add_argument("--here", action="store_true",
                   help="only the jobs submitted to this daemon (default: every trusted peer's too)")
    j.add_argument("--state", action="append", metavar="STATE", help="only jobs in STATE (repeatable)")
    who = j.add_mutually_exclusive_group()
    who.add_argument("--user", metavar="USER", help="only USER's jobs")
    who.add_argument("--mine", action="store_true", help="only my own jobs")
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=_cmd_jobs)

    sh = sub.add_parser("show", help="one job: spec, state, attempts, history, why it waits")
    sh.add_argument("job", metavar="ID")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_cmd_show)

    lg = sub.add_parser(
        "logs", help="a job's output",
        description="A job's stdout, then its stderr when stdout is empty (else how much stderr holds). "
        "A multi-host job: every rank's lines prefixed with [rank N], or --rank N. With -f: until the "
        "job ends, saying why it waits; the last line (on stderr) says how it ended, and the exit "
        "status is 0 when it succeeded, 1 otherwise.")
    lg.add_argument("job", metavar="ID")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--stderr", action="store_true", help="the standard error log instead of stdout")
    lg.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt (default: the latest)")
    lg.add_argument("--rank", type=int, metavar="R", help="node rank R of a multi-host job (0: the first host)")
    lg.set_defaults(func=_cmd_logs)

    c = sub.add_parser("cancel", help="cancel a job (running: SIGTERM, grace, SIGKILL to its process group)")
    c.add_argument("job", metavar="ID")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_cancel)


def _spec_from_flags(args: argparse.Namespace) -> dict[str, object]:
    from packaging.requirements import InvalidRequirement, Requirement

    if not args.cmd:
        raise UsageError("submit: give -f JOB.toml or a command after --")
    cmd = args.cmd[1:] if args.cmd[0] == "--" else args.cmd
    if not cmd:
        raise UsageError("submit: the command after -- is empty")
    req: dict[str, object] = {}
    for key, value in (("accelerator", args.accelerator), ("gpu_count", args.gpus),
                       ("gpu_memory_gb", args.gpu_memory_gb), ("gpu_memory_kind", args.gpu_memory_kind),
                       ("min_cuda_compute_capability", args.min_cc), ("python", args.requires_python)):
        if value is not None:
            req[key] = value
    frameworks: dict[str, str] = {}
    for text in args.framework:
        try:
            r = Requirement(text)
        except InvalidRequirement as e:
            raise UsageError(f"--framework: {text!r} is not like 'torch>=2.4' ({e})") from e
        frameworks[r.name] = str(r.specifier)
    if frameworks:
        req["frameworks"] = frameworks
    spec: dict[str, object] = {"command": cmd, "requirements": req}
    if args.name:
        spec["name"] = args.name
    dist = {k: v for k, v in (("nproc_per_node", args.nproc), ("nnodes", args.nnodes),
                              ("backend", args.backend)) if v is not None}
    if dist:
        spec["distributed"] = dist
    policy = {k: v for k, v in (("retries", args.retries), ("lease_s", args.lease_s)) if v is not None}
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
    return spec


def _cmd_submit(args: argparse.Namespace) -> int:
    from gpulayerd.models import SpecError, job_spec_from_mapping, load_job_spec

    try:
        if args.file is not None:
            if args.cmd and [c for c in args.cmd if c != "--"]:
                raise UsageError("submit: give either -f JOB.toml or a command, not both")
            flags = [f"--{k.replace('_', '-')}" for k in _SPEC_FLAGS if getattr(args, k) not in (None, [])]
            if flags:
                raise UsageError(f"submit: {', '.join(flags)} cannot be combined with -f; put them in the spec file")
            spec = load_job_spec(args.file, base_dir=args.file.resolve().parent)
        else:
            spec = job_spec_from_mapping(_spec_from_flags(args), source="submit flags", base_dir=Path.cwd())
    except SpecError as e:
        raise UsageError(str(e)) from e
    wd = spec.workdir or ""
    try:
        is_dir = Path(wd).is_dir()
    except OSError as e:  # e.g. a directory under another account's 0700 home
        raise UsageError(f"workdir: {wd}: {e.strerror or e}") from e
    if not is_dir:
        raise UsageError(f"workdir: {wd} does not exist or is not a directory")
    body = spec.model_dump(mode="json", exclude_none=True)
    # The daemon takes the user from the kernel; the job runs with this shell's PATH.
    path = os.environ.get("PATH") or ""
    job = call_daemon(args, lambda c: c.submit(body, path=path))
    if args.json:
        print(job.model_dump_json(indent=2))
    else:
        label = f"{job.id}" + (f" ({job.name})" if job.name else "")
        print(f"submitted job {label}: {job.status}")
        if job.status == "rejected":
            print(f"  rejected: {job.reason}")
    return EXIT_FAILURE if job.status == "rejected" else EXIT_OK


def _cmd_jobs(args: argparse.Namespace) -> int:
    from gpulayerd.cli.render import reason_cell

    scope = "local" if args.here else "cluster"

    async def listed(c: DaemonClient) -> tuple[list[JobView], int]:
        jobs = await c.jobs(statuses=args.state, scope=scope)
        if scope != "cluster":
            return jobs, 0
        # Trusted peers that miss heartbeats were not asked (or did not answer): say so.
        return jobs, sum(1 for p in await c.peers() if p.trusted and p.state in ("suspect", "down"))

    jobs, down = call_daemon(args, listed)
    if down:
        print(fmt.peers_down(down), file=sys.stderr)
    user = _my_name() if args.mine else args.user
    if user is not None:
        jobs = [j for j in jobs if _user_of(j) == user]
    if not args.all and not args.state:
        done = [j for j in jobs if j.status in _TERMINAL]
        keep = {j.id for j in done[-20:]}
        jobs = [j for j in jobs if j.status not in _TERMINAL or j.id in keep]
    if args.json:
        print("[" + ",".join(j.model_dump_json() for j in jobs) + "]")
        return EXIT_OK
    now = time.time()
    owners = {j.owner for j in jobs}
    if len(owners) > 1:
        rows = [[j.id, j.name, _user_of(j) or None, j.owner_name, j.status, _where(j),
                 fmt.age(now - j.submitted_at), reason_cell(j)] for j in jobs]
        print(fmt.table(["ID", "NAME", "USER", "OWNER", "STATE", "WHERE", "AGE", "REASON"], rows))
        return EXIT_OK
    rows = [[j.id, j.name, _user_of(j) or None, j.status, _where(j), fmt.age(now - j.submitted_at),
             reason_cell(j)] for j in jobs]
    print(fmt.table(["ID", "NAME", "USER", "STATE", "WHERE", "AGE", "REASON"], rows))
    return EXIT_OK


def _user_of(j: JobView) -> str:
    """The user a job belongs to (its spec's ``user``; jobs from before users: ``submitted_by``)."""
    return j.spec.user or j.submitted_by


def _my_name() -> str:
    """This process's user name, from the user database (``$USER`` is not asked)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"  # what the daemon calls an account without a name


def _where(j: JobView) -> str | None:
    """WHERE: the latest attempt's host and GPUs (kept after the job ends), else its holder."""
    if j.where_node is not None or j.where_hosts:
        return fmt.where(j.where_name or (j.where_node or "")[:12], j.where_devices, j.where_hosts)
    return j.holder_name or (j.holder[:12] if j.holder else None)


def _cmd_show(args: argparse.Namespace) -> int:
    from gpulayerd.cli.render import render_job

    job = call_daemon(args, lambda c: c.job(args.job))
    if args.json:
        print(job.model_dump_json(indent=2))
        return EXIT_OK
    print(render_job(job))
    return EXIT_OK


def _cmd_logs(args: argparse.Namespace) -> int:
    from gpulayerd.cli.logs import follow_logs

    if args.rank is not None and args.rank < 0:
        raise UsageError("logs: --rank must be 0 or more")
    return call_daemon(args, lambda c: follow_logs(c, args))


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = call_daemon(args, lambda c: c.cancel(args.job))
    if args.json:
        print(job.model_dump_json(indent=2))
    elif job.status in _TERMINAL and not job.cancel_requested and job.status != "cancelled":
        print(f"job {job.id} had already ended: {job.status}")
    elif job.cancel_requested and job.status not in _TERMINAL:
        print(f"job {job.id}: {job.status} (stopping: SIGTERM, then SIGKILL after the grace period)")
    else:
        print(f"job {job.id}: {job.status}")
    return EXIT_OK
