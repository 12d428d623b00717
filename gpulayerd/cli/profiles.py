"""``gpulayer profiles``: every runtime profile x every worker environment, and ``profiles capture``.

``gpulayer profiles`` prints a matrix a lab admin reads to see which machines run the lab's
stack: one row per profile, one column per worker environment, ✓ or ✗ with the items that fail
(``--json``: one object per cell). Workers come from the daemon (its own capabilities and its
peers'), or from saved capability files (``--capabilities FILE...``, ``gpulayer devices --json``).

``gpulayer profiles capture NAME --python PATH`` probes a working environment, prints a profile
of it (TOML) and writes it to the user's profile file (``--stdout``: print only): python and
frameworks pinned ``==X.Y.*``, torch's CUDA build as ``cuda_runtime``, and this machine's ``os``.
Files: :mod:`gpulayerd.host.profile_files`.

Also here: the CLI's side of ``profile = "NAME"`` at submit (:func:`expand_spec`) and the origin
lines of ``show`` / ``explain`` (:func:`origin_lines`).


(Same name as :mod:`gpulayerd.core.matching.profiles`: the same idea (runtime profiles), the command
here and the pure rules there.)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayerd import text as fmt
from gpulayerd.cli.exits import EXIT_OK, CommandFailed, UsageError

if TYPE_CHECKING:
    from gpulayerd.core.matching.profiles import CellResult, Profile
    from gpulayerd.models import Capabilities

__all__ = ["add_parser", "expand_spec", "origin_lines"]

_Sub = argparse._SubParsersAction


def add_parser(sub: _Sub[argparse.ArgumentParser]) -> None:
    """Add ``profiles`` (and ``profiles capture``) to the ``gpulayer`` subcommands."""
    p = sub.add_parser(
        "profiles", help="runtime profiles x worker environments: which machines run which stack",
        description="Every runtime profile (shipped, /etc/gpulayer/profiles.toml, your own profiles.toml) "
        "against every worker environment of the cluster: ✓ or ✗ with the failing items.",
    )
    p.add_argument("--capabilities", nargs="+", type=Path, metavar="FILE",
                   help="saved capability JSON (gpulayer devices --json) instead of asking the daemon")
    p.add_argument("--json", action="store_true", help="one JSON object per profile x environment")
    p.set_defaults(func=_cmd_profiles)
    sp = p.add_subparsers(dest="profiles_command", metavar="capture")
    c = sp.add_parser("capture", help="print a profile of a working environment and write it to your profile file",
                      description="Probe the environment of --python and print a profile of it (TOML: python and "
                      "frameworks pinned ==X.Y.*, torch's CUDA build, this machine's os); it is added to your "
                      "profiles.toml (or --file), unless --stdout.")
    c.add_argument("name", metavar="NAME", help="the new profile's name (e.g. torch24-cu121)")
    c.add_argument("--python", required=True, metavar="PATH", help="the environment's interpreter")
    c.add_argument("--description", default="", help="one line for people")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--file", type=Path, metavar="PATH", help="write here instead of your profiles.toml")
    where.add_argument("--stdout", action="store_true",
                       help="only print the profile (TOML) on stdout; write no file")
    c.set_defaults(func=_cmd_capture)


def _load(include_user: bool = True) -> dict[str, Profile]:
    from gpulayerd.host.profile_files import ProfileFileError, load_profiles, profile_paths

    try:
        return load_profiles(profile_paths(include_user))
    except ProfileFileError as e:
        raise UsageError(str(e)) from e


def expand_spec(data: Mapping[str, Any]) -> dict[str, Any]:
    """Expand ``data["profile"]`` with every profile file (the user's included).

    Raises:
        UsageError: an unknown profile (listing the known ones) or a bad profile file.
    """
    from gpulayerd.core.matching.profiles import UnknownProfile, expand_profile

    if not data.get("profile"):
        return dict(data)
    try:
        return expand_profile(data, _load())[0]
    except UnknownProfile as e:
        raise UsageError(f"profile: {e}") from e


def origin_lines(origins: Mapping[str, str], profile: str | None) -> list[str]:
    """``show`` / ``explain`` lines saying where each requirement comes from (empty without a profile)."""
    if not profile and not origins:
        return []
    out = [f"  profile:   {fmt.escape(profile or fmt.DASH)}"]
    out += [f"    {fmt.escape(k)}: {fmt.escape(v)}" for k, v in sorted(origins.items())]
    return out


# ------------------------------------------------------------------------ the matrix


def _workers(args: argparse.Namespace) -> list[Capabilities]:
    from pydantic import TypeAdapter, ValidationError

    from gpulayerd.models import Capabilities, format_validation_error

    if args.capabilities:
        out: list[Capabilities] = []
        for f in args.capabilities:
            try:
                raw = f.read_bytes()
            except OSError as e:
                raise UsageError(f"--capabilities: {f}: {e.strerror or e}") from e
            try:
                if raw.lstrip().startswith(b"["):
                    out.extend(TypeAdapter(list[Capabilities]).validate_json(raw))
                else:
                    out.append(Capabilities.model_validate_json(raw))
            except ValidationError as e:
                raise UsageError(f"--capabilities: {f} is not capability JSON\n{format_validation_error(e)}") from e
        return out
    from gpulayerd.cli.http import call_daemon
    from gpulayerd.models import PeerView

    raw_peers = call_daemon(args, lambda c: c.peers())
    peers = TypeAdapter(list[PeerView]).validate_python(raw_peers)
    return [p.capabilities for p in peers if p.capabilities is not None and p.state != "foreign"]


def matrix(profiles: Mapping[str, Profile], workers: Sequence[Capabilities]) -> list[CellResult]:
    """Every profile (by name) x every environment of every worker (by host name, then order)."""
    from gpulayerd.core.matching.profiles import check_profile

    snaps = sorted((c.to_core() for c in workers), key=lambda w: (w.name, w.node_id))
    return [check_profile(p, w, e) for _, p in sorted(profiles.items()) for w in snaps for e in w.environments]


def _cell_json(c: CellResult) -> dict[str, Any]:
    return {
        "profile": c.profile, "worker": c.worker, "name": c.name, "environment": c.environment, "ok": c.ok,
        "failures": [{"requirement": r.requirement, "wanted": r.wanted, "found": r.found, "message": r.message}
                     for r in c.failures],
        "notes": [{"requirement": n.requirement, "wanted": n.wanted, "found": n.found} for n in c.notes],
    }


def _failure(c: CellResult) -> str:
    """``frameworks.torch ==2.4.* (has 2.13.0)``; ``... (not installed)`` when nothing is there."""
    return "; ".join(f"{r.requirement} {r.wanted} ({r.found if r.found == 'not installed' else f'has {r.found}'})"
                     for r in c.failures)


def _cmd_profiles(args: argparse.Namespace) -> int:
    profiles = _load()
    cells = matrix(profiles, _workers(args))
    if args.json:
        print(fmt.json_out(json.dumps([_cell_json(c) for c in cells], indent=2, ensure_ascii=False)))
        return EXIT_OK
    columns: list[tuple[str, str]] = []
    for c in cells:
        if (c.name, c.environment) not in columns:
            columns.append((c.name, c.environment))
    if not columns:
        print("no worker environment known")
        return EXIT_OK
    per_worker = {n: sum(1 for m, _ in columns if m == n) for n, _ in columns}
    # A worker's name alone, or name:ENV (the environment's directory) when it has several.
    head = ["PROFILE", *(n if per_worker[n] == 1 else f"{n}:{Path(e).parent.parent.name or e}" for n, e in columns)]
    rows = []
    for name in sorted(profiles):
        by_col = {(c.name, c.environment): c for c in cells if c.profile == name}
        rows.append([name, *(("✓" if by_col[col].ok else "✗") for col in columns)])
    print(fmt.table(head, rows, ""))
    failing = [c for c in cells if not c.ok]
    if failing:
        print("\nfailing items:")
        for c in failing:
            print(fmt.escape(f"  {c.profile} on {c.name} ({c.environment}): {_failure(c)}"))
    notes = [c for c in cells if c.ok and c.notes]
    if notes:
        print("\nnot checked (unknown):")
        for c in notes:
            print(fmt.escape(f"  {c.profile} on {c.name} ({c.environment}): "
                             + "; ".join(f"{n.requirement}: {n.found}" for n in c.notes)))
    print("\nprofiles: " + ", ".join(f"{n} ({p.source})" for n, p in sorted(profiles.items())))
    return EXIT_OK


# ------------------------------------------------------------------------ capture


def _cmd_capture(args: argparse.Namespace) -> int:
    import platform

    from platformdirs import user_cache_dir

    from gpulayerd.gpu.environments import EnvironmentProber
    from gpulayerd.host.profile_files import ProfileFileError, capture_profile, render_profile, write_user_profile

    prober = EnvironmentProber(timeout_s=60.0, cache_dir=Path(user_cache_dir("gpulayer")) / "environments")
    env = prober.probe(args.python, torch_check=False)
    try:
        profile = capture_profile(args.name, env, platform.system().lower(), args.description)
        path = None if args.stdout else write_user_profile(profile, args.file)
    except ProfileFileError as e:
        raise CommandFailed(str(e)) from e
    # TOML on stdout, line by line (each escaped: names and versions come from the environment).
    print("\n".join(fmt.escape(line) for line in render_profile(profile).splitlines()))
    if path is not None:
        print(fmt.escape(f"wrote profile {profile.name} to {path}"), file=sys.stderr)
    return EXIT_OK
