"""Reading the environment probe's output: its JSON report, its checkpoint, its last words.

:mod:`gpulayerd.gpu.probe` prints one JSON report as the last line of its stdout, and a
checkpoint (the report so far) on stderr before it imports torch. The functions here turn
those into an :class:`~gpulayerd.core.types.EnvironmentSnapshot` and the pieces
:class:`~gpulayerd.gpu.environments.EnvironmentProber` needs for its messages and cache.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from packaging.version import InvalidVersion, Version

from gpulayerd.core.types import EnvironmentSnapshot, FrameworkVersion
from gpulayerd.gpu.probe import CHECKPOINT_PREFIX, PROBE_VERSION

__all__ = [
    "dir_mtimes",
    "excerpt",
    "last_report",
    "read_checkpoint",
    "snapshot_from_report",
    "stderr_last_line",
]

_TORCH_BACKENDS = ("gloo", "nccl", "mpi")
# A distribution that a canonical-named meta-package pins to its own version (tensorrt
# -> tensorrt-cu12, tensorflow on Windows -> tensorflow-intel): installed together by
# design, so not a conflict.
_COMPANIONS = {
    "tensorrt": re.compile(r"^tensorrt-cu[0-9]+$"),
    "tensorflow": re.compile(r"^tensorflow-(intel|macos)$"),
}


def snapshot_from_report(
    interpreter: str, report: Mapping[str, object], torch_unfinished: str | None = None
) -> EnvironmentSnapshot:
    """Convert one probe report (the JSON object ``probe.py`` prints) into a snapshot.

    Tolerant of a malformed report: a field of the wrong type becomes None and a note.
    Frameworks are checked one by one, so one non-PEP 440 version never hides the others.

    Args:
        interpreter: absolute path of the interpreter the report came from.
        report: the decoded JSON object.
        torch_unfinished: why the torch stage did not finish (``"timed out after
            10 s"``), when ``report`` is the checkpoint written before it.

    Returns:
        The snapshot; ``ok`` is False only when the probe reported its own failure.
    """
    notes: list[str] = [n for n in _list(report.get("notes")) if isinstance(n, str)]
    python_version = report.get("python_version")
    if not isinstance(python_version, str):
        python_version = None
        notes.append("python version unknown")
    frameworks: dict[str, FrameworkVersion] = {}
    raw_frameworks = report.get("frameworks")
    if isinstance(raw_frameworks, Mapping):
        for key, entries in sorted(raw_frameworks.items()):
            chosen = _choose_distribution(str(key), _list(entries), notes)
            if chosen is not None:
                frameworks[chosen.name] = chosen
    else:
        notes.append("framework versions unknown: the probe reported none")
    torch_cuda, torch_mps, backends = _torch_fields(report, "torch" in frameworks, torch_unfinished, notes)
    machine, translated = _platform_fields(report)
    if translated:
        notes.append(f"this interpreter is {machine or 'x86_64'} code run by Rosetta on Apple silicon: "
                     "it never gets the Apple GPU (mps)")
    torch = report.get("torch")
    mps_bytes = torch.get("mps_recommended_max_memory") if isinstance(torch, Mapping) else None
    error = torch.get("error") if isinstance(torch, Mapping) and report.get("torch_stage") == "ran" else None
    return EnvironmentSnapshot(
        interpreter=interpreter,
        python_version=python_version,
        frameworks=frameworks,
        torch_cuda=torch_cuda,
        torch_mps=torch_mps,
        distributed_backends=backends,
        ok=report.get("failed") is not True,
        notes=tuple(notes),
        machine=machine,
        translated=translated,
        mps_recommended_max_bytes=(
            mps_bytes if isinstance(mps_bytes, int) and not isinstance(mps_bytes, bool) and mps_bytes > 0 else None
        ),
        import_errors={"torch": error[:300]} if isinstance(error, str) and error and torch_unfinished is None else {},
    )


def _platform_fields(report: Mapping[str, object]) -> tuple[str | None, bool | None]:
    """(``platform.machine()``, ``sysctl.proc_translated``) of the probed interpreter."""
    plat = report.get("platform")
    if not isinstance(plat, Mapping):
        return None, None
    machine, translated = plat.get("machine"), plat.get("translated")
    return (machine if isinstance(machine, str) and machine else None,
            translated if isinstance(translated, bool) else None)



# ------------------------------------------------------------------ report parsing


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _is_pep440(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def _choose_distribution(key: str, entries: list[object], notes: list[str]) -> FrameworkVersion | None:
    """Pick the distribution reported for ``key``.

    The one whose RECORD hashes match the files on disk (``files_match``, set by
    :func:`gpulayerd.gpu.dist_files.mark_files_on_disk`) when the hashes told; else the
    one named like the framework; else the first by name. The others are listed in
    ``others`` and a note when they conflict (a meta-package's companion of the same
    version, such as ``tensorrt-cu12`` next to ``tensorrt``, is no conflict).
    """
    found: list[tuple[FrameworkVersion, object]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        dist, version, note = entry.get("distribution"), entry.get("version"), entry.get("note")
        if not isinstance(dist, str) or "version" not in entry or not (version is None or isinstance(version, str)):
            notes.append(f"{key}: malformed entry in the probe report: {entry!r}")
            continue
        if version in ("None", ""):  # an older probe wrote str(None)
            version = None
        valid = version is None or _is_pep440(version)
        if not valid:
            notes.append(f"{key}: installed version {version!r} is not PEP 440 (distribution {dist})")
        if version is None:
            why = note if isinstance(note, str) and note else "version unknown"
            notes.append(f"{key}: version unknown ({why}), distribution {dist}")
        fw = FrameworkVersion(name=key, version=version, distribution=dist, valid=valid,
                              note=note if isinstance(note, str) and version is None else "")
        found.append((fw, entry.get("files_match")))
    if not found:
        return None
    found.sort(key=lambda f: f[0].distribution)
    by_files = [f for f, match in found if match is True]
    named = next((f for f, _ in found if f.distribution == key), found[0][0])
    chosen = by_files[0] if len(by_files) == 1 else named
    companion = _COMPANIONS.get(key)
    rivals = [
        f
        for f, _ in found
        if f is not chosen
        and not (
            chosen.distribution == key
            and companion is not None
            and companion.match(f.distribution)
            and f.version == chosen.version
        )
    ]
    if not rivals:
        return chosen
    listed = ", ".join(f"{f.distribution} {f.version or 'version unknown'}" for f, _ in found)
    how = (
        f"the files on disk are {chosen.distribution}'s (RECORD hashes match)"
        if by_files
        else f"reporting {chosen.distribution} (the files on disk could not tell which)"
    )
    notes.append(f"{key}: conflicting distributions installed ({listed}); {how}")
    others = tuple(f"{f.distribution} {f.version or 'version unknown'}" for f in rivals)
    note = "RECORD hashes match the files on disk" if by_files else chosen.note
    return FrameworkVersion(name=key, version=chosen.version, distribution=chosen.distribution,
                            valid=chosen.valid, others=others, note=note)


def _torch_fields(
    report: Mapping[str, object], torch_installed: bool, torch_unfinished: str | None, notes: list[str]
) -> tuple[bool | None, bool | None, tuple[str, ...] | None]:
    """Return (torch_cuda, torch_mps, distributed_backends) from the report's torch stage."""
    stage = report.get("torch_stage")
    if torch_unfinished is not None or stage == "started":
        notes.append(f"torch: availability unknown: {torch_unfinished or 'the torch check did not finish'}")
        return None, None, None
    if stage == "skipped":
        if torch_installed:
            notes.append("torch: availability not checked (metadata-only probe)")
        return None, None, None
    if stage != "ran":
        return None, None, None
    torch = report.get("torch")
    if not isinstance(torch, Mapping) or torch.get("error") is not None:
        if not isinstance(torch, Mapping):
            notes.append("torch: the probe reported no torch results")
        return None, None, None
    cuda, mps = _bool(torch.get("cuda_available")), _bool(torch.get("mps_available"))
    cuda_built = torch.get("cuda_built")
    if isinstance(cuda_built, str) and cuda is False:
        notes.append(f"torch: built with CUDA {cuda_built} but torch.cuda.is_available() is False")
    if _bool(torch.get("mps_built")) is True and mps is False:
        platform = report.get("platform")
        mac_ver = platform.get("mac_ver") if isinstance(platform, Mapping) else None
        where = f" (macOS {mac_ver})" if isinstance(mac_ver, str) else ""
        notes.append(f"torch reports MPS unavailable{where}: built with MPS but is_available() is False")
    backends: tuple[str, ...] | None = None
    distributed = _bool(torch.get("distributed_available"))
    raw = torch.get("backends")
    if distributed is False:
        backends = ()
    elif distributed is True and isinstance(raw, Mapping):
        states = {name: _bool(raw.get(name)) for name in _TORCH_BACKENDS}
        if all(state is not None for state in states.values()):
            backends = tuple(name for name, state in states.items() if state)
        else:
            notes.append("torch: distributed backends unknown: a backend check failed")
    return cuda, mps, backends


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _decode_report(line: str) -> dict[str, object] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("probe_version") == PROBE_VERSION:
        return data
    return None


def last_report(lines: list[str]) -> dict[str, object] | None:
    """The report is the last JSON line; anything before it (say, a noisy sitecustomize) is ignored."""
    for line in reversed(lines):
        if line.startswith("{"):
            report = _decode_report(line)
            if report is not None:
                return report
    return None


def read_checkpoint(stderr_lines: list[str]) -> dict[str, object] | None:
    """The checkpoint report the probe wrote to stderr before its torch stage; None if absent."""
    for line in reversed(stderr_lines):
        if line.startswith(CHECKPOINT_PREFIX):
            return _decode_report(line[len(CHECKPOINT_PREFIX) :].strip())
    return None


def stderr_last_line(lines: list[str]) -> str:
    """The last non-empty stderr line that is not a checkpoint, cut to 300 characters; "" if none."""
    for line in reversed(lines):
        if line.strip() and not line.startswith(CHECKPOINT_PREFIX):
            return line.strip()[:300]
    return ""


def excerpt(data: bytes) -> str:
    """The first 80 bytes of ``data`` (stripped, decoded), quoted, for a message."""
    return repr(data.strip()[:80].decode("utf-8", "replace"))


def dir_mtimes(value: object) -> dict[str, int | None] | None:
    """Validate a {directory: mtime_ns or None} mapping; None if malformed or empty."""
    if not isinstance(value, Mapping) or not value:
        return None
    out: dict[str, int | None] = {}
    for d, mtime in value.items():
        if not isinstance(d, str) or isinstance(mtime, bool):
            return None
        if mtime is not None and not isinstance(mtime, int):
            return None
        out[d] = mtime
    return out
