"""Gang members checked against each other (pure): the frameworks a multi-host job runs and the Python
minor version must be the same on every member, or the ranks load different code (a 2-host gang
across torch 2.13.0 and 2.12.0 fails in the first collective, or worse, computes differently).

:func:`consistent_members` picks ``nnodes`` workers that fit and agree (the first such set in node-id
order); when no set agrees it names the skew: ``GangSkew: torch 2.13.0 on h2, 2.12.0 on h1``.
A framework whose spec pins one version exactly (``==2.13.0``) is compared without its local part
(``+cu124``), since the pin already makes the versions equal.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulayerd.core.types import EnvironmentSnapshot, JobRequest, WorkerSnapshot
from gpulayerd.core.verdict import Placement

__all__ = ["GANG_SKEW", "consistent_members", "gang_key"]

GANG_SKEW = "GangSkew"
"""The code a waiting multi-host job's reason starts with when no set of fitting workers agrees."""


def _environment(worker: WorkerSnapshot, placement: Placement) -> EnvironmentSnapshot | None:
    return next((e for e in worker.environments if e.interpreter == placement.environment), None)


def _compared(job: JobRequest) -> list[str]:
    """The frameworks compared: those the job names, and torch (torchrun runs every multi-host job)."""
    return sorted({*job.frameworks, "torch"})


def _pinned(spec: str | None) -> bool:
    return spec is not None and spec.strip().startswith("==") and "*" not in spec and "," not in spec


def gang_key(job: JobRequest, worker: WorkerSnapshot, placement: Placement) -> tuple[tuple[str, str], ...]:
    """What must be equal across members: (name, version) of each compared framework and
    ``("python", "3.11")``; a version the worker does not know is ``"?"``, and a key holding one
    also holds the worker's node id: an unknown version never agrees with another host's."""
    env = _environment(worker, placement)
    out: list[tuple[str, str]] = []
    for name in _compared(job):
        fw = env.frameworks.get(name) if env is not None else None
        version = fw.version if fw is not None and fw.version else ("absent" if env is not None and fw is None else "?")
        if _pinned(job.frameworks.get(name)):
            version = version.split("+", 1)[0]
        out.append((name, version))
    python = env.python_version if env is not None and env.python_version else "?"
    minor = ".".join(python.split(".")[:2])
    out.append(("python", minor))
    if any(v == "?" for _, v in out):
        out.append(("node", worker.node_id))
    return tuple(out)


def consistent_members(job: JobRequest, fits: Sequence[tuple[WorkerSnapshot, Placement]],
                       nnodes: int) -> tuple[list[str], str | None]:
    """The node ids of ``nnodes`` fitting workers that agree (:func:`gang_key`), first in node-id order;
    or ``([], reason)`` when no ``nnodes`` of them agree, the reason naming each difference:
    ``"GangSkew: torch 2.13.0 on h2, 2.12.0 on h1"`` (versions newest first, then by worker).

    Args:
        job: the multi-host job.
        fits: each worker that fits now with its placement (any order).
        nnodes: how many hosts the job needs.
    """
    ordered = sorted(fits, key=lambda f: f[0].node_id)
    keys = [(gang_key(job, w, p), w.node_id) for w, p in ordered]
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for key, node in keys:
        groups.setdefault(key, []).append(node)
    agreeing = [ids for ids in groups.values() if len(ids) >= nnodes]
    if agreeing:
        best = min(agreeing, key=lambda ids: ids[:nnodes])
        return best[:nnodes], None
    names = {w.node_id: w.name or w.node_id for w, _ in ordered}
    parts = []
    compared = [*_compared(job), "python"]
    for i, name in enumerate(compared):
        seen: dict[str, list[str]] = {}
        for key, node in keys:
            seen.setdefault(key[i][1], []).append(names[node])
        if len(seen) > 1:
            ranked = sorted(seen.items(), key=lambda kv: _version_order(kv[0]), reverse=True)
            parts.append(f"{name} " + ", ".join(f"{v} on {_hosts(hosts)}" for v, hosts in ranked[:_MAX_LISTED])
                         + (f", and {len(ranked) - _MAX_LISTED} more version(s)" if len(ranked) > _MAX_LISTED else ""))
    for i, name in enumerate(compared):
        unknown = [names[n] for k, n in keys if k[i][1] == "?"]
        if unknown:
            parts.append(f"{name} version unknown on {_hosts(unknown)}")
    return [], f"{GANG_SKEW}: " + "; ".join(parts) + (
        f" (a {nnodes}-host job needs its hosts to agree; pin the versions or align the environments)")


_MAX_LISTED = 4


def _hosts(hosts: Sequence[str]) -> str:
    """``h1+h2``, at most :data:`_MAX_LISTED` names, then ``+N more``; each name cut to 64 characters."""
    shown = "+".join(h[:64] for h in sorted(hosts)[:_MAX_LISTED])
    return shown + (f"+{len(hosts) - _MAX_LISTED} more" if len(hosts) > _MAX_LISTED else "")


def _version_order(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+", 1)[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else -1)
    return tuple(out)
