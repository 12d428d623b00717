"""Workload environments: what a Python interpreter has installed and what torch can use there.

The daemon never imports a framework itself. :class:`EnvironmentProber` runs
:mod:`gpulayerd.gpu.probe` as a script *in a subprocess of the workload interpreter*,
under a hard timeout in its own process group, and turns the JSON it prints into an
:class:`~gpulayerd.core.types.EnvironmentSnapshot`. A failure of any kind (missing
interpreter, crash, hang, garbage output) becomes a snapshot with ``ok=False`` and a
note saying why; :meth:`EnvironmentProber.probe` does not raise.

Environment of the probe subprocess: by default the daemon's own environment minus
the variables that describe *the daemon's* interpreter rather than the workload's
(``PYTHONHOME``, ``PYTHONPATH``, ``PYTHONEXECUTABLE``, ``__PYVENV_LAUNCHER__``,
``PYTHONSTARTUP``, ``PYTHONINSPECT``): inherited, they would point another Python at
the daemon's standard library or packages. The user site directory is left alone,
since it is part of the user's environment. Pass ``env`` to give the probe exactly
the environment the jobs will get (a ``PYTHONPATH`` there is kept). ``LC_ALL=C`` and
``PYTHONIOENCODING=utf-8`` are always set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from packaging.version import InvalidVersion, Version

from gpulayerd.core.types import EnvironmentSnapshot, FrameworkVersion
from gpulayerd.gpu.probe import CHECKPOINT_PREFIX, PROBE_VERSION
from gpulayerd.models import EnvironmentModel

__all__ = ["EnvironmentProber", "default_interpreter", "snapshot_from_report"]

logger = logging.getLogger(__name__)

_PROBE_SCRIPT = Path(__file__).with_name("probe.py")
_CACHE_FORMAT = 1
_DAEMON_ONLY_VARS = (
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONEXECUTABLE",
    "__PYVENV_LAUNCHER__",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
)
# Variables that change what the probe finds without touching any file it stats.
_FINGERPRINT_VARS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "HOME",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
)
_TORCH_BACKENDS = ("gloo", "nccl", "mpi")
# A distribution that a canonical-named meta-package pins to its own version (tensorrt
# -> tensorrt-cu12, tensorflow on Windows -> tensorflow-intel): installed together by
# design, so not a conflict.
_COMPANIONS = {
    "tensorrt": re.compile(r"^tensorrt-cu[0-9]+$"),
    "tensorflow": re.compile(r"^tensorflow-(intel|macos)$"),
}
_STDERR_TAIL_BYTES = 8192
_WARNED_MAX = 256


def default_interpreter() -> str:
    """Return the interpreter probed when none is configured: the daemon's own."""
    return sys.executable


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
    return EnvironmentSnapshot(
        interpreter=interpreter,
        python_version=python_version,
        frameworks=frameworks,
        torch_cuda=torch_cuda,
        torch_mps=torch_mps,
        distributed_backends=backends,
        ok=report.get("failed") is not True,
        notes=tuple(notes),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _CacheEntry:
    """A snapshot plus the file states it was taken from; stale once any of them differ."""

    interpreter_stat: tuple[int, ...]
    probe_stat: tuple[int, ...]
    env_fingerprint: str
    dir_mtimes_ns: Mapping[str, int | None]
    snapshot: EnvironmentSnapshot


@dataclasses.dataclass(frozen=True, slots=True)
class _RunOutcome:
    """What one probe subprocess did."""

    returncode: int | None
    stdout: bytes
    stderr_head: bytes
    stderr_tail: bytes
    timed_out: bool
    overflowed: bool


class EnvironmentProber:
    """Probes workload interpreters in subprocesses, with a cache keyed on their files.

    Cache: one entry per (interpreter path, torch_check, environment fingerprint). The
    path is the interpreter as given, made absolute but not resolved: a venv's
    ``bin/python`` is a symlink to the base interpreter, and resolving it would merge
    every venv into one entry. An entry is valid while the interpreter file, the probe
    script, and the modification times (ns) of the directories package metadata was
    read from (site-packages and the rest of ``sys.path``, as the probe reported them)
    are unchanged; ``pip install`` / ``uninstall`` changes a site-packages mtime.
    Checking this costs only ``stat`` calls. Entries live in memory and, when
    ``cache_dir`` is given, as JSON files there, so a new process gets a cached answer
    without running Python. Probes that failed or whose torch stage did not finish
    are not cached. A driver change is not seen by the key: pass ``use_cache=False``.
    """

    def __init__(
        self,
        timeout_s: float,
        cache_dir: Path | None,
        *,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        """Create a prober.

        Args:
            timeout_s: wall-clock limit of one probe subprocess, in seconds; on expiry
                its whole process group is killed.
            cache_dir: directory for the persistent cache; None keeps it in memory only.
            env: environment of the probe subprocess, used as given; None means the
                daemon's environment without its interpreter-specific variables.
            max_output_bytes: stdout beyond this many bytes kills the probe.

        Raises:
            ValueError: ``timeout_s`` or ``max_output_bytes`` is not positive.
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        if max_output_bytes <= 0:
            raise ValueError(f"max_output_bytes must be positive, not {max_output_bytes!r}")
        self._timeout_s = timeout_s
        self._cache_dir = cache_dir
        self._max_output_bytes = max_output_bytes
        base = dict(os.environ) if env is None else dict(env)
        if env is None:
            for name in _DAEMON_ONLY_VARS:
                base.pop(name, None)
        base["LC_ALL"] = "C"
        base["PYTHONIOENCODING"] = "utf-8"
        self._env = base
        self._env_fingerprint = hashlib.sha256(
            json.dumps([[name, base.get(name)] for name in _FINGERPRINT_VARS]).encode()
        ).hexdigest()[:16]
        self._memory: dict[tuple[str, bool], _CacheEntry] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def probe(
        self, interpreter: str, *, use_cache: bool = True, torch_check: bool = True
    ) -> EnvironmentSnapshot:
        """Return what ``interpreter`` has installed and, optionally, what torch can use there.

        Blocks for up to ``timeout_s`` on a cache miss; use :meth:`async_probe` in the
        event loop.

        Args:
            interpreter: path of a Python executable, or a name looked up on PATH.
            use_cache: False ignores any cached answer (a cold probe); the fresh
                answer still replaces the cached one.
            torch_check: also import torch in the interpreter and report
                ``torch.cuda`` / ``torch.mps`` availability and distributed backends.
                Importing torch takes a second or more, and can hang on a broken
                driver; False reads package metadata only (tens of ms) and leaves the
                torch fields None with a note. Both kinds are cached separately.

        Returns:
            The snapshot; on any failure ``ok`` is False and ``notes`` says why.
        """
        path, problem = _resolve_interpreter(interpreter)
        if problem is not None:
            self._warn_once(f"{path}:{problem}", "environment probe of %s: %s", path, problem)
            return EnvironmentSnapshot(interpreter=path, ok=False, notes=(problem,))
        key = (path, torch_check)
        if use_cache:
            cached = self._cached(key)
            if cached is not None:
                return cached
        interpreter_stat = _stat_key(path)
        probe_stat = _stat_key(str(_PROBE_SCRIPT))
        snapshot, dir_mtimes_ns = self._run_probe(path, torch_check)
        if dir_mtimes_ns is not None and interpreter_stat is not None and probe_stat is not None:
            entry = _CacheEntry(
                interpreter_stat=interpreter_stat,
                probe_stat=probe_stat,
                env_fingerprint=self._env_fingerprint,
                dir_mtimes_ns=dir_mtimes_ns,
                snapshot=snapshot,
            )
            with self._lock:
                self._memory[key] = entry
            self._save(key, entry)
        return snapshot

    async def async_probe(
        self, interpreter: str, *, use_cache: bool = True, torch_check: bool = True
    ) -> EnvironmentSnapshot:
        """Like :meth:`probe`, run in a worker thread so the event loop never blocks.

        Cancelling the caller does not stop the subprocess early; it still ends by
        ``timeout_s``.
        """
        return await asyncio.to_thread(self.probe, interpreter, use_cache=use_cache, torch_check=torch_check)

    # ------------------------------------------------------------------ running

    def _run_probe(
        self, path: str, torch_check: bool
    ) -> tuple[EnvironmentSnapshot, dict[str, int | None] | None]:
        """Run the probe once; return the snapshot and, if it may be cached, its directory mtimes."""
        argv = [path, str(_PROBE_SCRIPT)]
        if not torch_check:
            argv.append("--no-torch")
        try:
            outcome = _run_bounded(argv, self._env, self._timeout_s, self._max_output_bytes)
        except OSError as e:
            return self._failed(path, f"cannot run interpreter {path}: {e.strerror or e}"), None
        status = _describe_exit(outcome, self._timeout_s)
        report = _last_report(outcome.stdout.decode("utf-8", "replace").splitlines())
        if report is not None:
            snapshot = snapshot_from_report(path, report)
            if outcome.returncode != 0:
                snapshot = dataclasses.replace(
                    snapshot, notes=(*snapshot.notes, f"probe {status} after its report")
                )
                return snapshot, None
            return snapshot, _dir_mtimes(report.get("path_mtimes_ns"))
        checkpoint = _checkpoint(outcome.stderr_head.decode("utf-8", "replace").splitlines())
        if checkpoint is not None:
            reason = f"the torch check {status}"
            if outcome.timed_out:
                reason += " (importing torch can hang on a broken GPU driver)"
            self._warn_once(f"{path}:torch", "environment probe of %s: %s", path, reason)
            return snapshot_from_report(path, checkpoint, torch_unfinished=reason), None
        detail = _stderr_last_line(outcome.stderr_tail.decode("utf-8", "replace").splitlines())
        if outcome.timed_out or outcome.overflowed:
            message = f"probe of {path} {status}"
        elif outcome.stdout.strip():
            message = (
                f"probe of {path} {status} without a JSON report; stdout began {_excerpt(outcome.stdout)}"
            )
        else:
            message = f"probe of {path} {status} without any output"
        if detail and not outcome.timed_out:
            message += f"; stderr: {detail}"
        return self._failed(path, message), None

    def _failed(self, path: str, message: str) -> EnvironmentSnapshot:
        self._warn_once(
            f"{path}:{message.split(';', maxsplit=1)[0]}", "environment probe failed: %s", message
        )
        return EnvironmentSnapshot(interpreter=path, ok=False, notes=(message,))

    # -------------------------------------------------------------------- cache

    def _cached(self, key: tuple[str, bool]) -> EnvironmentSnapshot | None:
        with self._lock:
            entry = self._memory.get(key)
        if entry is None:
            entry = self._load(key)
            if entry is None:
                return None
        if not self._still_valid(key[0], entry):
            with self._lock:
                self._memory.pop(key, None)
            return None
        with self._lock:
            self._memory[key] = entry
        return entry.snapshot

    def _still_valid(self, path: str, entry: _CacheEntry) -> bool:
        if entry.env_fingerprint != self._env_fingerprint:
            return False
        if _stat_key(path) != entry.interpreter_stat or _stat_key(str(_PROBE_SCRIPT)) != entry.probe_stat:
            return False
        return all(_mtime_ns(d) == mtime for d, mtime in entry.dir_mtimes_ns.items())

    def _cache_file(self, key: tuple[str, bool]) -> Path | None:
        if self._cache_dir is None:
            return None
        ident = json.dumps([key[0], key[1], self._env_fingerprint, _CACHE_FORMAT])
        return self._cache_dir / f"env-{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"

    def _load(self, key: tuple[str, bool]) -> _CacheEntry | None:
        file = self._cache_file(key)
        if file is None:
            return None
        try:
            data = json.loads(file.read_bytes())
            if not (
                isinstance(data, dict)
                and data.get("format") == _CACHE_FORMAT
                and data.get("interpreter") == key[0]
                and data.get("torch_check") is key[1]
            ):
                return None
            dirs = _dir_mtimes(data.get("dir_mtimes_ns"))
            if dirs is None:
                return None
            return _CacheEntry(
                interpreter_stat=tuple(int(x) for x in data["interpreter_stat"]),
                probe_stat=tuple(int(x) for x in data["probe_stat"]),
                env_fingerprint=str(data["env_fingerprint"]),
                dir_mtimes_ns=dirs,
                snapshot=EnvironmentModel.model_validate(data["snapshot"]).to_core(),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as e:
            logger.debug("ignoring unreadable environment cache file %s: %s", file, e)
            return None

    def _save(self, key: tuple[str, bool], entry: _CacheEntry) -> None:
        file = self._cache_file(key)
        if file is None:
            return
        data = {
            "format": _CACHE_FORMAT,
            "interpreter": key[0],
            "torch_check": key[1],
            "interpreter_stat": list(entry.interpreter_stat),
            "probe_stat": list(entry.probe_stat),
            "env_fingerprint": entry.env_fingerprint,
            "dir_mtimes_ns": dict(entry.dir_mtimes_ns),
            "snapshot": EnvironmentModel.from_core(entry.snapshot).model_dump(mode="json"),
        }
        tmp = file.with_name(f"{file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, sort_keys=True), encoding="utf-8")
            os.replace(tmp, file)
        except OSError as e:
            self._warn_once(f"cache:{file.parent}", "cannot write environment cache %s: %s", file, e)
            tmp.unlink(missing_ok=True)

    def _warn_once(self, what: str, msg: str, *args: object) -> None:
        """Log at WARNING the first time ``what`` happens, at DEBUG after that."""
        with self._lock:
            first = what not in self._warned
            if first:
                if len(self._warned) >= _WARNED_MAX:
                    self._warned.clear()
                self._warned.add(what)
        logger.log(logging.WARNING if first else logging.DEBUG, msg, *args)


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
    """Pick the distribution reported for ``key``: the one named like it, else the first by name."""
    found: list[FrameworkVersion] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        dist, version = entry.get("distribution"), entry.get("version")
        if not isinstance(dist, str) or not isinstance(version, str):
            notes.append(f"{key}: malformed entry in the probe report: {entry!r}")
            continue
        valid = _is_pep440(version)
        if not valid:
            notes.append(f"{key}: installed version {version!r} is not PEP 440 (distribution {dist})")
        found.append(FrameworkVersion(name=key, version=version, distribution=dist, valid=valid))
    if not found:
        return None
    found.sort(key=lambda f: f.distribution)
    chosen = next((f for f in found if f.distribution == key), found[0])
    companion = _COMPANIONS.get(key)
    rivals = [
        f
        for f in found
        if f is not chosen
        and not (
            chosen.distribution == key
            and companion is not None
            and companion.match(f.distribution)
            and f.version == chosen.version
        )
    ]
    if rivals:
        listed = ", ".join(f"{f.distribution} {f.version}" for f in found)
        notes.append(
            f"{key}: conflicting distributions installed ({listed}); reporting {chosen.distribution}"
        )
    return chosen


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


def _last_report(lines: list[str]) -> dict[str, object] | None:
    """The report is the last JSON line; anything before it (say, a noisy sitecustomize) is ignored."""
    for line in reversed(lines):
        if line.startswith("{"):
            report = _decode_report(line)
            if report is not None:
                return report
    return None


def _checkpoint(stderr_lines: list[str]) -> dict[str, object] | None:
    for line in reversed(stderr_lines):
        if line.startswith(CHECKPOINT_PREFIX):
            return _decode_report(line[len(CHECKPOINT_PREFIX) :].strip())
    return None


def _stderr_last_line(lines: list[str]) -> str:
    for line in reversed(lines):
        if line.strip() and not line.startswith(CHECKPOINT_PREFIX):
            return line.strip()[:300]
    return ""


def _excerpt(data: bytes) -> str:
    return repr(data.strip()[:80].decode("utf-8", "replace"))


def _dir_mtimes(value: object) -> dict[str, int | None] | None:
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


# ------------------------------------------------------------------- files and processes


def _resolve_interpreter(interpreter: str) -> tuple[str, str | None]:
    """Return (absolute path, None) or (what was given, why it cannot be run)."""
    if not interpreter:
        return interpreter, "no interpreter given"
    if os.sep not in interpreter and not (os.altsep and os.altsep in interpreter):
        found = shutil.which(interpreter)
        if found is None:
            return interpreter, f"interpreter {interpreter!r} not found on PATH"
        interpreter = found
    path = os.path.abspath(interpreter)
    if not os.path.exists(path):
        return path, f"interpreter {path} does not exist"
    if os.path.isdir(path):
        return path, f"interpreter {path} is a directory"
    if not os.access(path, os.X_OK):
        return path, f"interpreter {path} is not executable"
    return path, None


def _stat_key(path: str) -> tuple[int, ...] | None:
    """Identity and version of a file, following symlinks; None if it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _mtime_ns(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns


def _describe_exit(outcome: _RunOutcome, timeout_s: float) -> str:
    if outcome.timed_out:
        return f"timed out after {timeout_s:g} s; its process group was killed"
    if outcome.overflowed:
        return "wrote too much output and was killed"
    rc = outcome.returncode
    if rc is not None and rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if sys.platform != "win32":
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _run_bounded(
    argv: list[str], env: Mapping[str, str], timeout_s: float, max_output_bytes: int
) -> _RunOutcome:
    """Run ``argv`` in its own process group; kill the group on timeout or too much stdout.

    Keeps all of stdout, the first ``max_output_bytes`` of stderr and its last few KiB.

    Raises:
        OSError: the program could not be started at all.
    """
    deadline = time.monotonic() + timeout_s
    stdout, stderr_head, stderr_tail = bytearray(), bytearray(), bytearray()
    timed_out = overflowed = False
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
    ) as proc:
        if proc.stdout is None or proc.stderr is None:  # pragma: no cover - PIPE always sets them
            raise OSError("no pipes to the probe subprocess")
        if sys.platform == "win32":  # pragma: no cover - no selectable pipes there
            try:
                out, err = proc.communicate(timeout=timeout_s)
                stdout += out
                stderr_head += err[:max_output_bytes]
                stderr_tail += err[-_STDERR_TAIL_BYTES:]
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.kill()
                proc.communicate()
        else:
            stdout_fd = proc.stdout.fileno()
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                selector.register(proc.stderr, selectors.EVENT_READ)
                while selector.get_map() and not overflowed:
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        timed_out = True
                        break
                    for key, _ in selector.select(remaining_s):
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            selector.unregister(key.fileobj)
                            continue
                        if key.fd == stdout_fd:
                            stdout += chunk
                            overflowed = len(stdout) > max_output_bytes
                            continue
                        # stderr: the head holds the checkpoint, the tail the last words
                        stderr_head += chunk[: max(max_output_bytes - len(stderr_head), 0)]
                        stderr_tail += chunk
                        if len(stderr_tail) > 2 * _STDERR_TAIL_BYTES:
                            del stderr_tail[:-_STDERR_TAIL_BYTES]
            if not (timed_out or overflowed):
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    timed_out = True
            if timed_out or overflowed:
                _kill_group(proc)
                proc.wait()
    return _RunOutcome(
        returncode=proc.returncode,
        stdout=bytes(stdout),
        stderr_head=bytes(stderr_head),
        stderr_tail=bytes(stderr_tail[-_STDERR_TAIL_BYTES:]),
        timed_out=timed_out,
        overflowed=overflowed,
    )
