"""``gpulayer devices``, ``peers`` and ``explain``: what the machines have, and whether a job fits.

``devices`` and ``explain`` work without a daemon too: they then probe this machine directly
(or read capability JSON files written by ``gpulayer devices --json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError
from gpulayerd.cli.http import call_daemon, try_daemon
from gpulayerd.core.job_facts import job_user

if TYPE_CHECKING:
    from gpulayerd.cli.http import SyncClient
    from gpulayerd.models import Capabilities, PeerView

__all__ = ["add_parsers"]

_Sub = argparse._SubParsersAction  # the type argparse gives to add_subparsers()'s result


def add_parsers(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``devices``, ``peers`` and ``explain`` to the ``gpulayer`` subcommands."""
    d = sub.add_parser(
        "devices", help="devices, Python environments and probe health: the whole cluster, or this machine",
        description="With a gpulayerd answering: every known machine's devices (with grant state: the job "
        "holding a device by name and user). Without one, or with --local: this machine, probed directly. Lines "
        "fit COLUMNS (else the terminal; piped: whole), a device on two lines when the table is wider. --json "
        "prints capability JSON (a list for the cluster, one object for --local), the format 'gpulayer explain "
        "--workers DIR' reads.")
    _add_probe_args(d)
    d.add_argument("--local", action="store_true", help="probe this machine directly, without the daemon")
    d.add_argument("--json", action="store_true", help="print capability JSON (for --workers DIR)")
    d.add_argument("--wide", action="store_true",
                   help="long device names: a MIG instance's GPU name and MIG uuid (default: profile and GPU index); "
                   "lines are never fitted to the terminal")
    d.set_defaults(func=_cmd_devices)

    pe = sub.add_parser("peers", help="the gpulayerd peers this daemon knows: trusted or foreign, last heartbeat")
    pe.add_argument("--json", action="store_true", help="print the peers as JSON (without capabilities)")
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


def _add_probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--python", action="append", metavar="PATH", default=None,
        help="workload interpreter to probe (repeatable; default: this gpulayer's own)",
    )
    p.add_argument("--nvidia-smi-timeout-s", type=float, default=20.0, metavar="S",
                   help="hard timeout for each nvidia-smi call, seconds (default 20)")


def _local_capabilities(args: argparse.Namespace) -> Capabilities:
    from platformdirs import user_cache_dir

    from gpulayerd.gpu.compose import collect_capabilities
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
    from gpulayerd.cli.jobs_table import line_width
    from gpulayerd.cli.render import render_capabilities

    limit = line_width(args.wide)
    raw = None if args.local or args.python else try_daemon(args, lambda c: _peers_and_holders(c, args.json))
    peers = None if raw is None else _peer_views(raw[0])
    if peers is None:
        if not (args.local or args.python):  # say so: this is the CLI's own view, not the daemon's
            print("gpulayer: no gpulayerd answered: probing this machine directly (this process's PATH and "
                  "Python; --local says this on purpose)", file=sys.stderr)
        caps = _local_capabilities(args)
        if args.json:
            print(fmt.json_out(caps.model_dump_json(indent=2)))
            return EXIT_OK
        print(render_capabilities(caps, wide=args.wide, limit=limit))
        return EXIT_OK
    known = [p.capabilities for p in peers if p.capabilities is not None and p.state != "foreign"]
    if args.json:
        print(fmt.json_out("[" + ",".join(c.model_dump_json(indent=2) for c in known) + "]"))
        return EXIT_OK
    holders = raw[1] if raw is not None else {}
    blocks = []
    for p in peers:
        if p.state == "foreign":
            continue
        head = f"== {fmt.escape(p.name)} ({p.node_id[:12]}) {p.state}"
        body = (render_capabilities(p.capabilities, wide=args.wide, limit=limit, label=holders.get)
                if p.capabilities else "  capabilities not fetched yet")
        blocks.append(head + "\n" + body)
    print("\n\n".join(blocks))
    return EXIT_OK


def _peers_and_holders(c: SyncClient, json_only: bool) -> tuple[object, dict[str, str]]:
    """The daemon's ``/v1/peers`` answer, and "name (user)" (:func:`gpulayerd.text.job_label`) of each
    job holding a device there, by job id: one more call, for the claimed and running jobs of the
    cluster, only when a device is granted (when that call fails the holders show as ids)."""
    from gpulayerd.cli.http import ApiRequestError, DaemonTimeout

    peers = c.peers()
    held = {str(d.get("granted_to") or "").removesuffix(" (held)")
            for p in peers if p.get("capabilities") for d in p["capabilities"].get("devices") or ()}
    held.discard("")
    if json_only or not held:
        return peers, {}
    try:
        jobs = c.jobs(states=("claimed", "running"), scope="cluster", fields=("name", "submitted_by", "spec.user"))
    except (ApiRequestError, DaemonTimeout):
        return peers, {}
    return peers, {j.id: fmt.job_label(j.id, j.name, job_user(j.spec.user, j.submitted_by) or None)
                   for j in jobs if j.id in held}


def _peer_views(raw: object) -> list[PeerView]:
    """The daemon's ``/v1/peers`` answer as models (render_capabilities reads their properties)."""
    from pydantic import TypeAdapter

    from gpulayerd.models import PeerView

    return TypeAdapter(list[PeerView]).validate_python(raw)


def _cmd_peers(args: argparse.Namespace) -> int:
    peers = call_daemon(args, lambda c: c.peers())  # decoded JSON (cli.http.Record): no models needed
    if args.json:
        import json

        print(fmt.json_out("[" + ",".join(json.dumps({k: v for k, v in p.items() if k != "capabilities"},
                                                     ensure_ascii=False, separators=(",", ":")) for p in peers) + "]"))
        return EXIT_OK
    now = time.time()
    rows = []
    for p in peers:
        caps = p.capabilities
        gpus = fmt.DASH if caps is None else (
            fmt.hardware((d.get("name"), d.get("kind") == "mig") for d in caps.devices) or "cpu only")
        if caps is not None and caps.get("kind") == "slurm":  # a Slurm cluster as worker; degraded: Slurm is down
            down = any(h.get("source") == "slurm" and h.get("status") == "error" for h in caps.get("health") or ())
            gpus = f"slurm{' DEGRADED' if down else ''}: {gpus}"
        seen = fmt.ago(p.last_heartbeat_at, now)
        trust = "self" if p.state == "self" else "removed" if p.state == "removed" else (
            "trusted" if p.trusted else "foreign" if p.state == "foreign" else "untrusted")
        rows.append([p.node_id[:12], p.name, ", ".join(p.addresses) + (f":{p.port}" if p.port else ""),
                     p.version, trust, p.state, seen, gpus])
    print(fmt.table(["NODE", "NAME", "ADDRESSES", "VERSION", "TRUST", "STATE", "HEARTBEAT", "DEVICES"], rows))
    return EXIT_OK


def _load_workers(directory: str) -> list[Capabilities]:
    from pydantic import TypeAdapter, ValidationError

    from gpulayerd.models import Capabilities, format_validation_error

    d = Path(directory)
    if not d.is_dir():
        raise UsageError(f"--workers: {d} is not a directory")
    files = sorted(d.glob("*.json"))
    if not files:
        raise UsageError(f"--workers: no *.json capability files in {d}")
    caps_list = TypeAdapter(list[Capabilities])
    workers = []
    for f in files:
        try:
            raw = f.read_bytes()
            if raw.lstrip().startswith(b"["):
                workers.extend(caps_list.validate_json(raw))
            else:
                workers.append(Capabilities.model_validate_json(raw))
        except ValidationError as e:
            raise UsageError(f"--workers: {f} is not capability JSON\n{format_validation_error(e)}") from e
    return workers


def _print_origins(args: argparse.Namespace) -> None:
    """After ``explain JOB``: where the job's requirements come from, when it names a profile."""
    from gpulayerd.cli.profiles import origin_lines

    try:
        spec = call_daemon(args, lambda c: c.job(args.job)).get("spec") or {}
    except (UsageError, CommandFailed):
        return
    lines = origin_lines(spec.get("requirement_origins") or {}, spec.get("profile"))
    if lines:
        print("requirements:\n" + "\n".join(lines))


def _cmd_explain(args: argparse.Namespace) -> int:
    from gpulayerd.cli.jobs_table import line_width
    from gpulayerd.cli.render import render_explanation
    from gpulayerd.core.matching.evaluate import explain
    from gpulayerd.core.matching.hints import nearest_misses
    from gpulayerd.gpu.support import SUPPORT_MATRIX
    from gpulayerd.models import ExplanationModel, HintModel, SpecError, load_job_spec

    spec_path = Path(args.job)
    if not spec_path.is_file():
        if args.workers:
            raise UsageError(f"--workers needs a job spec file; {args.job} is not a file")
        explanation = ExplanationModel.model_validate(call_daemon(args, lambda c: c.explain(args.job)))
        if args.json:
            print(fmt.json_out(explanation.model_dump_json(indent=2)))
        else:
            print(render_explanation(explanation, title=f"job {explanation.job_id}", limit=line_width(False)))
            _print_origins(args)
        return EXIT_OK
    try:
        spec = load_job_spec(spec_path, base_dir=spec_path.resolve().parent)
    except SpecError as e:
        raise UsageError(str(e)) from e
    if spec.profile and not spec.requirement_origins:  # as submit would: the profile's items
        from gpulayerd.cli.profiles import expand_spec
        from gpulayerd.models import job_spec_from_mapping

        try:
            spec = job_spec_from_mapping(expand_spec(spec.model_dump(mode="json", exclude_none=True)),
                                         source=str(spec_path), base_dir=spec_path.resolve().parent)
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
    model = ExplanationModel.from_core(core := explain(job, workers, SUPPORT_MATRIX))
    model.hints = [HintModel.from_core(h) for h in nearest_misses(job, workers, SUPPORT_MATRIX, core,
                                                                  origins=spec.requirement_origins)]
    if args.json:
        print(fmt.json_out(model.model_dump_json(indent=2)))
    else:
        print(render_explanation(model, title=f"job {job.job_id} ({spec_path})", limit=line_width(False)))
        if spec.profile:
            from gpulayerd.cli.profiles import origin_lines

            print("requirements:\n" + "\n".join(origin_lines(spec.requirement_origins, spec.profile)))
    return EXIT_OK
