"""``gpulayer``: the command-line interface.

Exit codes: 0 ok, 1 failure, 2 usage error (bad flags, bad job spec, bad input file).
Every command that prints a table takes ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import TypeAdapter, ValidationError

from gpulayerd import __version__
from gpulayerd.api.client import ApiRequestError, DaemonClient, DaemonUnreachable
from gpulayerd.cluster_cli import add_cluster_parser
from gpulayerd.core.matching import explain
from gpulayerd.models import (
    Capabilities,
    ExplanationModel,
    JobView,
    SpecError,
    format_validation_error,
    job_spec_from_mapping,
    load_job_spec,
)
from gpulayerd.service import add_service_parser
from tui import format as fmt

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: printed as one message, exit code 2."""


class CommandFailed(Exception):
    """The command could not do its work: printed as one message, exit code 1."""


# ---------------------------------------------------------------------------- parser


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpulayer",
        description="GPU compute sharing for a lab's workstations: what this machine has, "
        "and whether a job fits.",
    )
    p.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    p.add_argument("--state-dir", type=Path, metavar="DIR", default=_env_path("GPULAYER_STATE_DIR"),
                   help="talk to the gpulayerd using this state dir (env GPULAYER_STATE_DIR)")
    p.add_argument("--socket", type=Path, metavar="PATH", default=_env_path("GPULAYER_SOCKET"),
                   help="the daemon's unix socket (env GPULAYER_SOCKET); default: from --state-dir, "
                   "else the user runtime dir")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser(
        "devices", help="devices, Python environments and probe health: the whole cluster, or this machine",
        description="With a gpulayerd answering: every known machine's devices (with grant state). Without "
        "one, or with --local: this machine, probed directly. --json prints capability JSON (a list for the "
        "cluster, one object for --local), the format 'gpulayer explain --workers DIR' reads.")
    _add_probe_args(d)
    d.add_argument("--local", action="store_true", help="probe this machine directly, without the daemon")
    d.add_argument("--json", action="store_true", help="print capability JSON (for --workers DIR)")
    d.set_defaults(func=_cmd_devices)

    pe = sub.add_parser("peers", help="the gpulayerd peers this daemon knows: trusted or foreign, last heartbeat")
    pe.add_argument("--json", action="store_true")
    pe.set_defaults(func=_cmd_peers)

    e = sub.add_parser(
        "explain",
        help="why a job fits or not: the worker x requirement table and the verdict",
        description="Explain a submitted job (by id, asking the daemon), or a job spec file (TOML) "
        "against this machine or against the capability JSON files (written by "
        "'gpulayer devices --json') in --workers DIR, without a daemon.",
    )
    e.add_argument("job", metavar="ID|JOB.toml", help="a job id (or unique prefix), or a job spec file")
    e.add_argument("--workers", metavar="DIR", help="directory of capability JSON files, one per worker")
    _add_probe_args(e)
    e.add_argument("--json", action="store_true", help="print the explanation as JSON")
    e.set_defaults(func=_cmd_explain)

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

    j = sub.add_parser("jobs", help="the job queue: id, name, state, where, age, reason")
    j.add_argument("--all", action="store_true", help="also every finished job (default: the 20 latest)")
    j.add_argument("--here", action="store_true",
                   help="only the jobs submitted to this daemon (default: every trusted peer's too)")
    j.add_argument("--state", action="append", metavar="STATE", help="only jobs in STATE (repeatable)")
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=_cmd_jobs)

    sh = sub.add_parser("show", help="one job: spec, state, attempts, history, why it waits")
    sh.add_argument("job", metavar="ID")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_cmd_show)

    lg = sub.add_parser("logs", help="a job's output")
    lg.add_argument("job", metavar="ID")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--stderr", action="store_true", help="the standard error log instead of stdout")
    lg.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt (default: the latest)")
    lg.set_defaults(func=_cmd_logs)

    c = sub.add_parser("cancel", help="cancel a job (running: SIGTERM, grace, SIGKILL to its process group)")
    c.add_argument("job", metavar="ID")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_cmd_cancel)

    t = sub.add_parser("tui", help="the terminal UI: devices, jobs, job detail, peers, live")
    t.set_defaults(func=_cmd_tui)

    add_cluster_parser(sub)
    add_service_parser(sub)
    return p


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _add_probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--python", action="append", metavar="PATH", default=None,
        help="workload interpreter to probe (repeatable; default: this gpulayer's own)",
    )
    p.add_argument("--nvidia-smi-timeout-s", type=float, default=20.0, metavar="S",
                   help="hard timeout for each nvidia-smi call, seconds (default 20)")


# -------------------------------------------------------------------------- commands


def _local_capabilities(args: argparse.Namespace) -> Capabilities:
    from platformdirs import user_cache_dir

    from gpulayerd.capabilities import collect_capabilities
    from gpulayerd.gpu.discovery import DiscoveryConfig
    from gpulayerd.gpu.environments import EnvironmentProber
    from gpulayerd.gpu.support import SUPPORT_MATRIX

    interpreters = args.python or [sys.executable]
    prober = EnvironmentProber(timeout_s=60.0, cache_dir=Path(user_cache_dir("gpulayer")) / "environments")
    return collect_capabilities(
        interpreters, SUPPORT_MATRIX, prober,
        discovery=DiscoveryConfig(nvidia_smi_timeout_s=args.nvidia_smi_timeout_s),
    )


def _cmd_devices(args: argparse.Namespace) -> int:
    peers = None if args.local or args.python else _try_daemon(args, lambda c: c.peers())
    if peers is None:
        caps = _local_capabilities(args)
        if args.json:
            print(caps.model_dump_json(indent=2))
            return EXIT_OK
        print(render_capabilities(caps))
        return EXIT_OK
    known = [p.capabilities for p in peers if p.capabilities is not None and p.state != "foreign"]
    if args.json:
        print("[" + ",".join(c.model_dump_json(indent=2) for c in known) + "]")
        return EXIT_OK
    blocks = []
    for p in peers:
        if p.state == "foreign":
            continue
        head = f"== {p.name} ({p.node_id[:12]}) {p.state}"
        body = render_capabilities(p.capabilities) if p.capabilities else "  capabilities not fetched yet"
        blocks.append(head + "\n" + body)
    print("\n\n".join(blocks))
    return EXIT_OK


def _cmd_peers(args: argparse.Namespace) -> int:
    peers = _daemon(args, lambda c: c.peers())
    if args.json:
        print("[" + ",".join(p.model_dump_json(exclude={"capabilities"}) for p in peers) + "]")
        return EXIT_OK
    now = time.time()
    rows = []
    for p in peers:
        caps = p.capabilities
        gpus = "—" if caps is None else (", ".join(sorted({f"{sum(1 for d in caps.devices if d.name == n)}x {n}"
                                                          for n in {d.name for d in caps.devices if d.name}}))
                                         or "cpu only")
        seen = "—" if p.last_heartbeat_at is None else _age(now - p.last_heartbeat_at) + " ago"
        trust = "self" if p.state == "self" else ("trusted" if p.trusted else "foreign" if p.state == "foreign"
                                                   else "untrusted")
        rows.append([p.node_id[:12], p.name, ", ".join(p.addresses) + (f":{p.port}" if p.port else ""),
                     p.version, trust, p.state, seen, gpus])
    print(fmt.table(["NODE", "NAME", "ADDRESSES", "VERSION", "TRUST", "STATE", "HEARTBEAT", "DEVICES"], rows))
    return EXIT_OK


def _try_daemon(args: argparse.Namespace, call: Callable[[DaemonClient], Awaitable[_T]]) -> _T | None:
    """Like _daemon, but None when no daemon answers."""
    try:
        return _daemon(args, call)
    except CommandFailed:
        return None


def render_capabilities(caps: Capabilities) -> str:
    """The human-readable ``gpulayer devices`` report."""
    out = [
        f"{caps.hostname}  node {caps.node_id[:12]}  {fmt.text(caps.platform)}/{fmt.text(caps.machine)}",
        f"CPU: {fmt.text(caps.cpu_count)} logical cores   RAM: {fmt.gb(caps.memory_total_bytes)}",
        "",
        "Devices:",
    ]
    if caps.devices:
        rows = [
            [d.index, d.accelerator.value, d.name, fmt.memory(d.memory_total_bytes, d.memory_used_bytes,
                                                             None if d.memory_kind is None else d.memory_kind.value),
             d.compute_capability, d.driver_version, "yes" if d.execution_supported else "no (detection only)",
             _device_state(d.granted_to, d.foreign_pids)]
            for d in caps.devices
        ]
        out.append(fmt.table(["IDX", "KIND", "NAME", "MEMORY", "CC", "DRIVER", "SCHEDULED", "STATE"], rows, "  "))
    else:
        out.append("  none (CPU only)")
    out += ["", "Probe health:"]
    out.append(fmt.table(["SOURCE", "STATUS", "MESSAGE"],
                         [[h.source, h.status.value, h.message or None] for h in caps.health], "  "))
    out += ["", "Python environments:"]
    for e in caps.environments:
        out.append(f"  {e.interpreter}")
        if not e.ok:
            out.append(f"    broken: {'; '.join(e.notes)}")
            continue
        out.append(f"    python {fmt.text(e.python_version)}")
        for name, f in sorted(e.frameworks.items()):
            extra = "" if f.distribution == name else f" (from {f.distribution})"
            bad = "" if f.valid else "  [not a PEP 440 version]"
            out.append(f"    {name} {f.version}{extra}{bad}")
        if "torch" in e.frameworks:
            out.append(f"    torch.cuda: {_avail(e.torch_cuda)}   torch.mps: {_avail(e.torch_mps)}   "
                       f"distributed: {_backends(e.distributed_backends)}")
    if caps.notes:
        out += ["", "Notes:", *(f"  - {n}" for n in caps.notes)]
    return "\n".join(out)


def _device_state(granted_to: str | None, foreign_pids: Sequence[int]) -> str:
    if granted_to:
        return f"granted to {granted_to}"
    if foreign_pids:
        return "busy (pid " + ", ".join(str(p) for p in foreign_pids) + ")"
    return "free"


def _avail(v: bool | None) -> str:
    return "unknown" if v is None else ("available" if v else "not available")


def _backends(v: Sequence[str] | None) -> str:
    if v is None:
        return "unknown"
    return ", ".join(f"{b} available" for b in v) if v else "no backends"


def _load_workers(directory: str) -> list[Capabilities]:
    d = Path(directory)
    if not d.is_dir():
        raise UsageError(f"--workers: {d} is not a directory")
    files = sorted(d.glob("*.json"))
    if not files:
        raise UsageError(f"--workers: no *.json capability files in {d}")
    workers = []
    for f in files:
        try:
            raw = f.read_bytes()
            if raw.lstrip().startswith(b"["):
                workers.extend(_CAPS_LIST.validate_json(raw))
            else:
                workers.append(Capabilities.model_validate_json(raw))
        except ValidationError as e:
            raise UsageError(f"--workers: {f} is not capability JSON\n{format_validation_error(e)}") from e
    return workers


def _cmd_explain(args: argparse.Namespace) -> int:
    from gpulayerd.gpu.support import SUPPORT_MATRIX

    spec_path = Path(args.job)
    if not spec_path.is_file():
        if args.workers:
            raise UsageError(f"--workers needs a job spec file; {args.job} is not a file")
        explanation = _daemon(args, lambda c: c.explain(args.job))
        if args.json:
            print(explanation.model_dump_json(indent=2))
        else:
            print(render_explanation(explanation, title=f"job {explanation.job_id}"))
        return EXIT_OK
    try:
        spec = load_job_spec(spec_path, base_dir=spec_path.resolve().parent)
    except SpecError as e:
        raise UsageError(str(e)) from e
    job = spec.to_core(job_id=spec.name or spec_path.stem)
    if args.workers:
        workers = [c.to_core() for c in _load_workers(args.workers)]
    else:
        caps = _local_capabilities(args)
        wd = job.workdir
        exists = frozenset({wd}) if wd is not None and Path(wd).is_dir() else frozenset()
        workers = [caps.to_core(existing_paths=exists)]
    model = ExplanationModel.from_core(explain(job, workers, SUPPORT_MATRIX))
    if args.json:
        print(model.model_dump_json(indent=2))
    else:
        print(render_explanation(model, title=f"job {job.job_id} ({spec_path})"))
    return EXIT_OK


def render_explanation(e: ExplanationModel, title: str) -> str:
    """The human-readable explanation: per worker, each requirement observed vs wanted, then the verdict."""
    out = [title, ""]
    if e.rejections:
        out.append("Rejected before matching (no worker can ever run it):")
        out += [f"  ✗ {r.requirement}: {r.message}" for r in e.rejections]
    for w in e.workers:
        label = w.name if w.name == w.worker else f"{w.name} ({w.worker[:12]})"
        out.append(f"worker {label}: {w.state.replace('_', ' ')}")
        rows = [[fmt.mark(c.ok), c.requirement, c.wanted, c.found] for c in w.checks]
        out.append(fmt.table(["", "REQUIREMENT", "WANTED", "FOUND"], rows, "  "))
        for r in w.rejections:
            out.append(f"  why: {r.message}")
        if w.placement is not None:
            devs = ", ".join(str(i) for i in w.placement.device_indices) or "none (CPU)"
            out.append(f"  would run with {w.placement.environment} on devices: {devs}")
        out.append("")
    verdict = f"verdict: {e.verdict}"
    if e.placement is not None:
        devs = ",".join(str(i) for i in e.placement.device_indices)
        name = next((w.name for w in e.workers if w.worker == e.placement.worker), e.placement.worker)
        verdict += f" -> {name}" + (f" GPU {devs}" if devs else "")
    out.append(verdict)
    return "\n".join(out)


# -------------------------------------------------------------------- daemon commands

_T = TypeVar("_T")
_CAPS_LIST: TypeAdapter[list[Capabilities]] = TypeAdapter(list[Capabilities])


def _socket(args: argparse.Namespace) -> Path:
    from gpulayerd.config import socket_path_for

    if args.socket is not None:
        return Path(args.socket)
    return socket_path_for(args.state_dir)


def _daemon(args: argparse.Namespace, call: Callable[[DaemonClient], Awaitable[_T]]) -> _T:
    """Run one client call against the local daemon; errors become UsageError/CommandFailed."""
    sock = _socket(args)

    async def go() -> _T:
        async with DaemonClient(sock) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except DaemonUnreachable as e:
        hint = f"gpulayerd --state-dir {args.state_dir} &" if args.state_dir else "gpulayerd &"
        raise CommandFailed(f"gpulayerd is not running ({e}). Start it with: {hint}") from e
    except ApiRequestError as e:
        if e.status in (400, 404, 422):
            raise UsageError(e.body.message) from e
        raise CommandFailed(e.body.message) from e


def _spec_from_flags(args: argparse.Namespace) -> dict[str, object]:
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
    if not Path(wd).is_dir():
        raise UsageError(f"workdir: {wd} does not exist or is not a directory")
    body = spec.model_dump(mode="json", exclude_none=True)
    job = _daemon(args, lambda c: c.submit(body, submitted_by=getpass.getuser()))
    if args.json:
        print(job.model_dump_json(indent=2))
    else:
        label = f"{job.id}" + (f" ({job.name})" if job.name else "")
        print(f"submitted job {label}: {job.status}")
        if job.status == "rejected":
            print(f"  rejected: {job.reason}")
    return EXIT_FAILURE if job.status == "rejected" else EXIT_OK


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _cmd_jobs(args: argparse.Namespace) -> int:
    scope = "local" if args.here else "cluster"
    jobs = _daemon(args, lambda c: c.jobs(statuses=args.state, scope=scope))
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
        rows = [[j.id, j.name, j.owner_name, j.status, _where(j), _age(now - j.submitted_at), _one_line(j)]
                for j in jobs]
        print(fmt.table(["ID", "NAME", "OWNER", "STATE", "WHERE", "AGE", "REASON"], rows))
        return EXIT_OK
    rows = [[j.id, j.name, j.status, _where(j), _age(now - j.submitted_at), _one_line(j)] for j in jobs]
    print(fmt.table(["ID", "NAME", "STATE", "WHERE", "AGE", "REASON"], rows))
    return EXIT_OK


_TERMINAL = {"succeeded", "failed", "cancelled", "lost", "rejected"}
_SPEC_FLAGS = ("name", "workdir", "accelerator", "gpus", "gpu_memory_gb", "gpu_memory_kind", "min_cc", "framework",
               "requires_python", "nproc", "nnodes", "backend", "env", "retries", "lease_s")


def _where(j: JobView) -> str | None:
    return j.holder_name or (j.holder[:12] if j.holder else None)


def _one_line(j: JobView) -> str:
    text = j.reason.splitlines()[0] if j.reason else ""
    return text if len(text) <= 90 else text[:89] + "…"


def _cmd_show(args: argparse.Namespace) -> int:
    job = _daemon(args, lambda c: c.job(args.job))
    if args.json:
        print(job.model_dump_json(indent=2))
        return EXIT_OK
    print(render_job(job))
    return EXIT_OK


def render_job(job: JobView) -> str:
    """``gpulayer show``: state, spec, attempts, history and (waiting) the explanation."""
    r = job.spec.requirements
    out = [
        f"job {job.id}" + (f" ({job.name})" if job.name else ""),
        f"  state:     {job.status}" + (" (cancel requested)" if job.cancel_requested else ""),
        f"  reason:    {job.reason or fmt.DASH}",
        f"  command:   {shlex.join(job.spec.command)}",
        f"  workdir:   {fmt.text(job.spec.workdir)}",
        f"  wants:     {r.accelerator.value}"
        + (f" x{r.effective_gpu_count}" if r.effective_gpu_count else "")
        + (f", >= {r.gpu_memory_gb:g} GB" if r.gpu_memory_gb else "")
        + (f", cc >= {r.min_cuda_compute_capability}" if r.min_cuda_compute_capability else "")
        + "".join(f", {k}{v}" for k, v in sorted(r.frameworks.items()))
        + (f", python{r.python}" if r.python else ""),
        f"  submitted: {_clock(job.submitted_at)} by {job.submitted_by or fmt.DASH}",
        f"  exit code: {fmt.text(job.exit_code)}",
    ]
    if job.spec.distributed is not None:
        d = job.spec.distributed
        out.append(f"  torch.distributed: nnodes {d.nnodes}, nproc_per_node {d.nproc_per_node}, "
                   f"backend {d.backend or 'default'}")
    if job.attempts:
        out.append("attempts:")
        for a in job.attempts:
            devs = ",".join(str(i) for i in a.placement.device_indices) if a.placement else ""
            where = a.worker_name or a.worker[:12]
            if a.gang:
                where = "hosts " + ", ".join(m[:12] for m in a.gang) + " (node ranks in this order)"
            out.append(f"  #{a.attempt} on {where} {a.state}" + (f" GPU {devs}" if devs else "")
                       + f", exit {fmt.text(a.exit_code)}" + (f" ({a.reason})" if a.reason else ""))
            if a.run_dir:
                out.append(f"     logs: {a.run_dir}")
    if job.events:
        out.append("history:")
        for e in job.events:
            move = f"{e.from_status or ''} -> {e.to_status}" if e.to_status != e.from_status else e.kind
            out.append(f"  {_clock(e.at)}  {move:<22} {e.reason}")
    if job.explanation is not None and job.status in ("queued", "rejected"):
        out += ["", render_explanation(job.explanation, title="why it waits:")]
    return "\n".join(out)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _cmd_logs(args: argparse.Namespace) -> int:
    stream = "stderr" if args.stderr else "stdout"

    async def go(c: DaemonClient) -> int:
        offset = 0
        while True:
            chunk = await c.logs(args.job, stream=stream, offset=offset, attempt=args.attempt)
            if chunk.data:
                sys.stdout.write(chunk.data)
                sys.stdout.flush()
            offset = chunk.next_offset
            if chunk.data:
                continue  # more may be waiting: read on without pausing
            if not args.follow or chunk.complete:
                return EXIT_OK
            await asyncio.sleep(0.3)

    return _daemon(args, go)


def _cmd_cancel(args: argparse.Namespace) -> int:
    job = _daemon(args, lambda c: c.cancel(args.job))
    if args.json:
        print(job.model_dump_json(indent=2))
    elif job.status in _TERMINAL and not job.cancel_requested and job.status != "cancelled":
        print(f"job {job.id} had already ended: {job.status}")
    elif job.cancel_requested and job.status not in _TERMINAL:
        print(f"job {job.id}: {job.status} (stopping: SIGTERM, then SIGKILL after the grace period)")
    else:
        print(f"job {job.id}: {job.status}")
    return EXIT_OK


def _cmd_tui(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("tui: needs a terminal (stdin and stdout must be a TTY)")
    from tui.app import make_app

    make_app(DaemonClient(_socket(args))).run()
    return EXIT_OK


# ------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpulayer``; returns the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    if isinstance(getattr(args, "job", None), str) and not args.job.strip():
        print("gpulayer: the job id must not be empty", file=sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except UsageError as e:
        print(f"gpulayer: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as e:
        print(f"gpulayer: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return code


if __name__ == "__main__":
    raise SystemExit(main())
