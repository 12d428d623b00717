"""Environment probe, run by the workload interpreter itself: ``python probe.py [--no-torch]``.

This file is executed as a script by whatever interpreter a job will run with, so it
imports only the standard library, never ``gpulayerd``, and keeps to Python 3.8
syntax. It never imports a framework to learn its version: versions come from
package metadata (``importlib.metadata``), matched by PEP 503-normalised
distribution name against the known name variants (``tensorflow-macos``,
``onnxruntime-gpu``, ``cupy-cuda12x``, ...).

Output: exactly one JSON object on stdout, on the last line::

    probe_version    1
    failed           true only when the probe itself broke (then most keys are missing)
    executable       sys.executable
    python_version   platform.python_version()
    implementation   platform.python_implementation()
    platform         {system, machine, mac_ver, translated}; mac_ver is null off macOS;
                     translated is ``sysctl.proc_translated`` (true: this interpreter is an
                     x86_64 program run by Rosetta on Apple silicon), null off macOS
    site_packages    site-packages directories (user site included when enabled)
    path_mtimes_ns   {directory: st_mtime_ns or null} for every directory that package
                     metadata is read from, taken *before* reading it (a cache key)
    frameworks       {key: [{distribution, version, note}, ...]}; the key is the
                     canonical framework name (``tensorflow``) or, for auxiliary distributions
                     (``jaxlib``, ``mlx-metal``, ``jax-cuda12-plugin``,
                     ``tensorflow-metal``), the distribution's own normalised name.
                     More than one entry means several distributions supply it (the
                     daemon then compares their RECORD hashes with the files on disk,
                     :mod:`gpulayerd.gpu.dist_files`). A ``*.dist-info`` without METADATA is ignored with a
                     note, as pip does; when it is the only one for a key its entry has
                     ``version`` null and ``note`` "metadata file missing".
    dist_info_paths  {key: {distribution: its ``*.dist-info`` directory}}
    torch_stage      "skipped" (--no-torch), "absent" (torch is not installed) or "ran"
    torch            null, or {version, cuda_built (torch.version.cuda: the CUDA version
                     string, null for a build without CUDA), hip_built (torch.version.hip),
                     cuda_available, cuda_device_count,
                     mps_built, mps_available, mps_recommended_max_memory (bytes,
                     ``torch.mps.recommended_max_memory()``: Metal's recommendedMaxWorkingSetSize),
                     distributed_available,
                     backends: {gloo, nccl, mpi}, error}; a field torch could not answer
                     is null and explained in ``notes``; ``error`` is set when
                     ``import torch`` itself failed
    notes            list of human-readable strings

Before importing torch (which is slow and can hang or crash on a broken driver), the
probe writes the metadata report so far to stderr on one line prefixed with
``gpulayer-probe-checkpoint:``, so that the caller can still use the metadata when the
torch stage never finishes. Everything else written during the probe, including
output of C extensions to file descriptor 1, goes to stderr.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import warnings
from typing import Any

PROBE_VERSION = 1
CHECKPOINT_PREFIX = "gpulayer-probe-checkpoint:"

# canonical framework -> exact normalised distribution names that supply it
_CANDIDATES = {
    "torch": ("torch", "torch-nightly"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "tensorflow": (
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-gpu",
        "tensorflow-macos",
        "tensorflow-intel",
        "intel-tensorflow",
        "tensorflow-rocm",
        "tensorflow-aarch64",
        "tensorflow-cpu-aws",
        "tf-nightly",
        "tf-nightly-cpu",
        "tf-nightly-gpu",
        "tf-nightly-macos",
    ),
    "mlx": ("mlx",),
    "cupy": ("cupy",),
    "onnxruntime": (
        "onnxruntime",
        "onnxruntime-gpu",
        "onnxruntime-directml",
        "onnxruntime-openvino",
        "onnxruntime-training",
        "onnxruntime-qnn",
        "onnxruntime-rocm",
        "onnxruntime-silicon",
        "ort-nightly",
        "ort-nightly-gpu",
    ),
    "tensorrt": ("tensorrt",),
    "triton": ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu", "triton-windows"),
    "vllm": ("vllm",),
    "transformers": ("transformers",),
    "numpy": ("numpy",),
}

# canonical framework -> name patterns of further distributions that supply it
_CANDIDATE_PATTERNS = {
    "cupy": re.compile(r"^cupy-(cuda|rocm)[a-z0-9-]*$"),
    "tensorrt": re.compile(r"^tensorrt-cu[0-9]+$"),
}

# auxiliary distributions, reported under their own normalised name
_AUXILIARY = re.compile(
    r"^(mlx-metal|mlx-cuda|jax-metal|tensorflow-metal|jax-(cuda|rocm)[0-9]+-(plugin|pjrt))$"
)

# canonical framework -> the top-level module it is imported as
_IMPORT_NAMES = {name: name for name in _CANDIDATES}

_NORMALISE = re.compile(r"[-_.]+")


def normalise(name: str) -> str:
    """PEP 503 normalisation: lowercase, runs of ``-``, ``_`` and ``.`` become ``-``."""
    return _NORMALISE.sub("-", name).lower()


def classify(normalised_name: str) -> str | None:
    """Return the report key a distribution belongs under, or None if it is not one we report."""
    for canonical, names in _CANDIDATES.items():
        if normalised_name in names:
            return canonical
    for canonical, pattern in _CANDIDATE_PATTERNS.items():
        if pattern.match(normalised_name):
            return canonical
    if _AUXILIARY.match(normalised_name):
        return normalised_name
    return None


def _metadata_module() -> Any:
    try:
        import importlib.metadata as md
    except ImportError:
        try:
            import importlib_metadata as md  # type: ignore[import-not-found,no-redef,unused-ignore]
        except ImportError:
            return None
    return md


def _site_packages(notes: list[str]) -> list[str]:
    dirs: list[str] = []
    try:
        import site

        getsitepackages = getattr(site, "getsitepackages", None)
        if getsitepackages is not None:
            dirs.extend(getsitepackages())
        if site.ENABLE_USER_SITE:
            dirs.append(site.getusersitepackages())
    except Exception as e:
        notes.append(f"could not list site-packages directories: {_describe(e)}")
    seen = set()
    out = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _metadata_dirs(site_dirs: list[str]) -> dict[str, int | None]:
    """Stat every directory package metadata may be read from; None where it does not exist."""
    mtimes: dict[str, int | None] = {}
    for d in list(sys.path) + site_dirs:
        if not d or d in mtimes:
            continue
        try:
            st = os.stat(d)
        except OSError:
            mtimes[d] = None
            continue
        if os.path.isdir(d):
            mtimes[d] = st.st_mtime_ns
    return mtimes


def _dist_name(dist: Any) -> str | None:
    # Reading the name from the .dist-info directory's stem avoids parsing METADATA
    # for every installed distribution; fall back to METADATA when there is none.
    stem_name = getattr(dist, "_normalized_name", None)
    if isinstance(stem_name, str) and stem_name:
        return normalise(stem_name)
    name = dist.metadata["Name"]
    return normalise(name) if name else None


def _metadata_text(dist: Any) -> str | None:
    """The METADATA (or PKG-INFO) text of a distribution; None when it has neither file."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            text = dist.read_text(name)
        except Exception:
            text = None
        if text is not None:
            return str(text)
    return None


def _name_version(dist: Any, text: str | None = None) -> tuple[str | None, str | None]:
    """Name and Version from a distribution's metadata headers.

    Reads only the header block instead of parsing the whole file as e-mail (a
    wheel's METADATA carries its long description, which is most of its size).
    """
    if text is None:
        text = _metadata_text(dist)
    found: dict[str, str] = {}
    if text:
        for line in text.splitlines():
            if not line.strip():
                break
            field, sep, value = line.partition(":")
            field = field.strip().lower()
            if sep and field in ("name", "version") and field not in found:
                found[field] = value.strip()
    if "name" not in found or "version" not in found:
        meta = dist.metadata
        found.setdefault("name", meta["Name"])
        found.setdefault("version", meta["Version"])
    return found.get("name") or None, found.get("version") or None


def _dist_location(dist: Any) -> str:
    path = getattr(dist, "_path", None)
    return str(path) if path is not None else "?"


def read_frameworks(
    notes: list[str], paths: list[str] | None = None, locations: dict[str, dict[str, str]] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Find the known frameworks in package metadata, without importing any of them.

    Args:
        notes: where to say what was skipped, shadowed or in conflict.
        paths: directories to search; None means ``sys.path`` (tests pass a crafted one).
        locations: when given, filled with {key: {distribution: its ``*.dist-info`` path}}.
    """
    frameworks: dict[str, list[dict[str, Any]]] = {}
    md = _metadata_module()
    if md is None:
        notes.append("importlib.metadata is not available (Python < 3.8); framework versions unknown")
        return frameworks
    first_seen: dict[str, tuple[str, str]] = {}
    without_metadata: dict[str, list[str]] = {}
    found = md.distributions() if paths is None else md.distributions(path=paths)
    for dist in found:
        try:
            name = _dist_name(dist)
            if name is None:
                continue
            key = classify(name)
            if key is None:
                continue
            text = _metadata_text(dist)
            if text is None:
                # A leftover directory (say, only REQUESTED or RECORD): pip skips it, and
                # importlib.metadata would report its version as None.
                notes.append(f"{key}: {_dist_location(dist)} has no METADATA file; ignored, as pip does")
                without_metadata.setdefault(key, []).append(name)
                continue
            meta_name, version = _name_version(dist, text)
            if name in first_seen:
                shadow_version, shadow_path = first_seen[name]
                notes.append(
                    f"{key}: {name} {version} at {_dist_location(dist)}"
                    f" is shadowed by {shadow_version} at {shadow_path}"
                )
                continue
            # The metadata's Name is authoritative; the directory stem only pre-filters.
            if meta_name:
                name = normalise(meta_name)
                key = classify(name) or key
            first_seen[name] = (str(version), _dist_location(dist))
            entry: dict[str, Any] = {"distribution": name, "version": version}
            if locations is not None:
                locations.setdefault(key, {})[name] = _dist_location(dist)
            if version is None:
                entry["note"] = "no Version in its metadata"
            frameworks.setdefault(key, []).append(entry)
        except Exception as e:
            notes.append(f"unreadable package metadata at {_dist_location(dist)}: {_describe(e)}")
    for key, names in without_metadata.items():
        if key not in frameworks:
            frameworks[key] = [
                {"distribution": names[0], "version": None, "note": "metadata file missing"}
            ]
    if paths is None:
        _fallback_by_import_name(md, frameworks, notes)
    for entries in frameworks.values():
        entries.sort(key=lambda entry: entry["distribution"])
    return frameworks


def _fallback_by_import_name(md: Any, frameworks: dict[str, list[dict[str, Any]]], notes: list[str]) -> None:
    """Attribute an importable but unrecognised framework to whichever distribution ships it.

    ``find_spec`` on a top-level name locates the module without executing it, so this
    stays cheap and import-free; ``packages_distributions`` is read only when needed.
    """
    try:
        import importlib.util
    except ImportError:
        return
    owners = None
    for canonical, module in _IMPORT_NAMES.items():
        if canonical in frameworks:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except Exception:
            spec = None
        if spec is None:
            continue
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "?"
        if owners is None:
            try:
                owners = md.packages_distributions()
            except Exception:
                owners = {}
        found = False
        for dist_name in owners.get(module, []):
            try:
                version = md.version(dist_name)
            except Exception:
                continue
            name = normalise(dist_name)
            frameworks.setdefault(canonical, []).append(
                {"distribution": name, "version": None if version is None else str(version)}
            )
            notes.append(f"{canonical}: supplied by distribution {name!r}, which is not a known name for it")
            found = True
        if not found:
            notes.append(
                f"{canonical}: importable from {where} but no package metadata names it; version unknown"
            )


def _describe(e: BaseException) -> str:
    """``Type: line`` with the decisive line of the message (the first that says error/failed/unable,
    else the first; the same rule as ``gpulayerd.gpu.command.decisive_line``, which this standalone
    script cannot import)."""
    text = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not text:
        return type(e).__name__
    line = next((ln for ln in text if re.search(r"\b(error|errors|failed|failure|fail|unable)\b", ln, re.I)), text[0])
    return f"{type(e).__name__}: {line}"


def _call(notes: list[str], what: str, fn: Any) -> Any:
    """Call ``fn()``; on failure note it and return None (one field degrades, not the report)."""
    try:
        return fn()
    except Exception as e:
        notes.append(f"torch: {what} failed: {_describe(e)}")
        return None


def torch_report(notes: list[str]) -> dict[str, object]:
    """Import torch and ask what it can use; a broken torch becomes ``error``, never a crash."""
    report: dict[str, object] = {
        "version": None,
        "cuda_built": None,
        "hip_built": None,
        "cuda_available": None,
        "cuda_device_count": None,
        "mps_built": None,
        "mps_available": None,
        "mps_recommended_max_memory": None,
        "distributed_available": None,
        "backends": {"gloo": None, "nccl": None, "mpi": None},
        "error": None,
    }
    try:
        import importlib

        torch: Any = importlib.import_module("torch")
    except (Exception, SystemExit) as e:
        report["error"] = _describe(e)
        notes.append(f"torch: import failed: {_describe(e)}")
        return report
    report["version"] = _call(notes, "torch.__version__", lambda: str(torch.__version__))
    report["cuda_built"] = _call(notes, "torch.version.cuda", lambda: torch.version.cuda)
    report["hip_built"] = _call(notes, "torch.version.hip", lambda: getattr(torch.version, "hip", None))
    report["cuda_available"] = _call(
        notes, "torch.cuda.is_available()", lambda: bool(torch.cuda.is_available())
    )
    if report["cuda_available"]:
        report["cuda_device_count"] = _call(
            notes, "torch.cuda.device_count()", lambda: int(torch.cuda.device_count())
        )
    elif report["cuda_available"] is False:
        report["cuda_device_count"] = 0
    report["mps_built"] = _call(
        notes, "torch.backends.mps.is_built()", lambda: bool(torch.backends.mps.is_built())
    )
    report["mps_available"] = _call(
        notes, "torch.backends.mps.is_available()", lambda: bool(torch.backends.mps.is_available())
    )
    if report["mps_available"] and hasattr(getattr(torch, "mps", None), "recommended_max_memory"):
        report["mps_recommended_max_memory"] = _call(
            notes, "torch.mps.recommended_max_memory()", lambda: int(torch.mps.recommended_max_memory())
        )
    report["distributed_available"] = _call(
        notes, "torch.distributed.is_available()", lambda: bool(torch.distributed.is_available())
    )
    if report["distributed_available"]:
        dist = torch.distributed
        report["backends"] = {
            "gloo": _call(notes, "is_gloo_available()", lambda: bool(dist.is_gloo_available())),
            "nccl": _call(notes, "is_nccl_available()", lambda: bool(dist.is_nccl_available())),
            "mpi": _call(notes, "is_mpi_available()", lambda: bool(dist.is_mpi_available())),
        }
    elif report["distributed_available"] is False:
        report["backends"] = {"gloo": False, "nccl": False, "mpi": False}
    return report


def proc_translated() -> bool | None:
    """``sysctl.proc_translated`` of this process on macOS: True under Rosetta; None off macOS.

    The sysctl does not exist on Intel Macs (ENOENT): that is a native process, False.
    """
    if sys.platform != "darwin":
        return None
    try:
        import ctypes

        libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
        value = ctypes.c_int(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if libc.sysctlbyname(b"sysctl.proc_translated", ctypes.byref(value), ctypes.byref(size), None, 0):
            return False
        return value.value == 1
    except Exception:
        return None


def _torch_installed(frameworks: dict[str, list[dict[str, Any]]]) -> bool:
    if "torch" in frameworks:
        return True
    try:
        import importlib.util

        return importlib.util.find_spec("torch") is not None
    except Exception:
        return False


def build_report(check_torch: bool) -> dict[str, object]:
    """Collect the whole report; each part that fails leaves a note instead."""
    notes: list[str] = []
    report: dict[str, object] = {
        "probe_version": PROBE_VERSION,
        "failed": False,
        "executable": sys.executable,
        "python_version": None,
        "implementation": None,
        "platform": {"system": None, "machine": None, "mac_ver": None},
        "site_packages": [],
        "path_mtimes_ns": {},
        "frameworks": {},
        "torch_stage": "skipped",
        "torch": None,
        "notes": notes,
    }
    try:
        report["python_version"] = platform.python_version()
        report["implementation"] = platform.python_implementation()
        report["platform"] = {
            "system": platform.system() or None,
            "machine": platform.machine() or None,
            "mac_ver": platform.mac_ver()[0] or None,
            "translated": proc_translated(),
        }
    except Exception as e:
        notes.append(f"platform: {_describe(e)}")
    try:
        site_dirs = _site_packages(notes)
        report["site_packages"] = site_dirs
        report["path_mtimes_ns"] = _metadata_dirs(site_dirs)
    except Exception as e:
        notes.append(f"site-packages: {_describe(e)}")
    try:
        locations: dict[str, dict[str, str]] = {}
        frameworks = read_frameworks(notes, locations=locations)
        report["dist_info_paths"] = locations
    except Exception as e:
        frameworks = {}
        notes.append(f"package metadata: {_describe(e)}")
    report["frameworks"] = frameworks
    if not check_torch:
        return report
    if not _torch_installed(frameworks):
        report["torch_stage"] = "absent"
        return report
    report["torch_stage"] = "ran"
    _write_checkpoint(report)
    report["torch"] = torch_report(notes)
    return report


def _write_checkpoint(report: dict[str, object]) -> None:
    try:
        line = json.dumps(dict(report, torch_stage="started"), ensure_ascii=True, default=str)
        sys.__stderr__.write(f"\n{CHECKPOINT_PREFIX} {line}\n")  # type: ignore[union-attr]
        sys.__stderr__.flush()  # type: ignore[union-attr]
    except Exception:
        pass


def main(argv: list[str]) -> int:
    """Run the probe and write its one JSON object to the original stdout."""
    check_torch = "--no-torch" not in argv
    # Whatever the probed code prints (Python or C level) must not reach stdout: point
    # file descriptor 1 at stderr and keep a private copy of the real stdout.
    out_fd = None
    try:
        sys.stdout.flush()
        out_fd = os.dup(1)
        os.dup2(2, 1)
    except Exception:
        out_fd = None
    sys.stdout = sys.stderr
    # Do not let this script's own directory (or, run with -c, the working directory) shadow
    # installed modules.
    here = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None
    if sys.path and (sys.path[0] == "" or (here is not None and os.path.abspath(sys.path[0]) == here)):
        del sys.path[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = build_report(check_torch)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            report = {
                "probe_version": PROBE_VERSION,
                "failed": True,
                "executable": sys.executable,
                "notes": [f"probe failed: {_describe(e)}"],
            }
    data = ("\n" + json.dumps(report, ensure_ascii=True, default=str) + "\n").encode("ascii")
    if out_fd is None:
        sys.__stdout__.write(data.decode("ascii"))  # type: ignore[union-attr]
        sys.__stdout__.flush()  # type: ignore[union-attr]
    else:
        while data:
            data = data[os.write(out_fd, data) :]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
