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
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from gpulayerd.core.types import EnvironmentSnapshot
from gpulayerd.gpu.command import Popen, RunOutcome, run_bounded
from gpulayerd.gpu.cuda_build import with_cuda_builds
from gpulayerd.gpu.dist_files import mark_files_on_disk
from gpulayerd.gpu.interpreters import InterpreterResolver, ResolvedInterpreter, home_of_uid, run_identity
from gpulayerd.gpu.probe_report import (
    dir_mtimes,
    excerpt,
    last_report,
    read_checkpoint,
    snapshot_from_report,
    stderr_last_line,
)
from gpulayerd.host.atomic import write_atomic
from gpulayerd.models import EnvironmentModel

__all__ = ["TORCH_PENDING_NOTE", "EnvironmentProber", "default_interpreter", "with_activation"]

logger = logging.getLogger(__name__)

_PROBE_SCRIPT = Path(__file__).with_name("probe.py")
_CACHE_FORMAT = 3  # 2: snapshots carry cuda_builds; 3: and torch_pending (never true in the cache)
_METADATA_ONLY_NOTE = "torch: availability not checked (metadata-only probe)"
TORCH_PENDING_NOTE = "torch: availability pending: the import-based torch check is still running"
"""The note of a metadata-first snapshot whose torch check has not landed (``torch_pending``)."""
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
_WARNED_MAX = 256


def default_interpreter() -> str:
    """Return the interpreter probed when none is configured: the daemon's own."""
    return sys.executable


@dataclasses.dataclass(frozen=True, slots=True)
class _CacheEntry:
    """A snapshot plus the file states it was taken from; stale once any of them differ."""

    interpreter_stat: tuple[int, ...]
    probe_stat: tuple[int, ...]
    env_fingerprint: str
    dir_mtimes_ns: Mapping[str, int | None]
    snapshot: EnvironmentSnapshot
    driver_state: str = ""  # the GPU driver state a torch-checked answer was taken under


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
    are not cached. A torch-checked answer also depends on the GPU driver: it is valid only
    under the driver state it was taken in (:meth:`set_driver_state`, from
    :attr:`gpulayerd.gpu.discovery.HostInventory.driver_state`), so "CUDA unavailable" seen
    before the driver was ready is asked again once it is.
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
        self._driver_state = ""
        self._persist_torch = True
        self._lock = threading.Lock()
        self._torch_runs: set[int] = set()  # process groups of torch checks running now
        self._warned: set[str] = set()
        self._resolver = InterpreterResolver(base, timeout_s)

    def set_driver_state(self, state: str, *, persist: bool = True) -> None:
        """Take the GPU driver state that torch-checked answers depend on from now on
        (``HostInventory.driver_state``): an answer taken under another state is no longer used.

        Args:
            state: the driver state, any string; "" (the default) for a prober that never hears one.
            persist: False while the driver is not ready (nvidia-smi cannot reach it): answers taken
                then stay in memory only, so a restarted daemon checks again.
        """
        with self._lock:
            self._driver_state, self._persist_torch = state, persist

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
        return self._probe(interpreter, use_cache=use_cache, torch_check=torch_check)[0]

    def cached(self, interpreter: str, *, torch_check: bool = True) -> EnvironmentSnapshot | None:
        """The cached snapshot of ``interpreter`` while it is still valid, else None; runs no Python.

        Costs ``stat`` calls (and a cache file read on a fresh prober): call it off the event loop.
        """
        found, problem = self._locate(interpreter)
        if problem is not None:
            return None
        snap = self._cached((found.path, torch_check))
        return None if snap is None else _as_configured(snap, found)

    def metadata_first(self, interpreter: str) -> tuple[EnvironmentSnapshot, bool]:
        """The fast answer: the full (torch-checked) snapshot when cached, else package metadata only.

        The metadata-only probe reads distributions, versions, CUDA builds (as text), the Python
        version and platform without importing any framework (tens of ms; cached separately).
        When torch is installed its runtime facts are unknown then: the snapshot has
        ``torch_pending`` True and a note saying the torch check is still running, and the
        caller should run :meth:`probe_full` (in the background) and use its answer instead.
        Blocks on a cache miss: call it off the event loop.

        Returns:
            (snapshot, whether the import-based check is still needed).
        """
        full = self.cached(interpreter, torch_check=True)
        if full is not None:
            return full, False
        meta = self.probe(interpreter, torch_check=False)
        if not meta.ok or "torch" not in meta.frameworks:
            return meta, False  # no torch: the full probe would learn nothing more
        notes = tuple(n for n in meta.notes if n != _METADATA_ONLY_NOTE)
        return dataclasses.replace(meta, torch_pending=True, notes=(*notes, TORCH_PENDING_NOTE)), True

    def probe_full(self, interpreter: str) -> tuple[EnvironmentSnapshot, bool]:
        """Probe with the torch check (see :meth:`probe`); also say whether it completed.

        Returns:
            (snapshot, True when the probe finished and its answer was cached; False when it
            failed, timed out or its torch stage did not finish).
        """
        return self._probe(interpreter, use_cache=True, torch_check=True)

    def _probe(
        self, interpreter: str, *, use_cache: bool, torch_check: bool
    ) -> tuple[EnvironmentSnapshot, bool]:
        found, problem = self._locate(interpreter)
        if problem is not None:
            self._warn_once(f"{found.path}:{problem}", "environment probe of %s: %s", found.path, problem)
            return _as_configured(EnvironmentSnapshot(interpreter=found.path, ok=False, notes=(problem,)), found), False
        path = found.path
        key = (path, torch_check)
        if use_cache:
            cached = self._cached(key)
            if cached is not None:
                return _as_configured(cached, found), True
        interpreter_stat = _stat_key(path)
        probe_stat = _stat_key(str(_PROBE_SCRIPT))
        with self._lock:
            driver_state, persist = (self._driver_state, self._persist_torch) if torch_check else ("", True)
        snapshot, dir_mtimes_ns = self._run_probe(path, torch_check, found.activation)
        snapshot = with_cuda_builds(snapshot, dir_mtimes_ns)  # torch/version.py, cupy-cuda12x, ...
        if dir_mtimes_ns is not None and interpreter_stat is not None and probe_stat is not None:
            entry = _CacheEntry(
                interpreter_stat=interpreter_stat,
                probe_stat=probe_stat,
                env_fingerprint=self._env_fingerprint,
                dir_mtimes_ns=dir_mtimes_ns,
                snapshot=snapshot,
                driver_state=driver_state,
            )
            with self._lock:
                self._memory[key] = entry
            if persist:
                self._save(key, entry)
            return _as_configured(snapshot, found), True
        return _as_configured(snapshot, found), False

    def _locate(self, interpreter: str) -> tuple[ResolvedInterpreter, str | None]:
        """The interpreter behind ``interpreter`` (a shim resolved, conda activation read), or why none."""
        path, problem = _resolve_interpreter(interpreter)
        if problem is not None:
            return ResolvedInterpreter(path, path), problem
        found = self._resolver.resolve(path)
        return found, found.problem

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
        self, path: str, torch_check: bool, activation: Mapping[str, str] | None = None
    ) -> tuple[EnvironmentSnapshot, dict[str, int | None] | None]:
        """Run the probe once; return the snapshot and, if it may be cached, its directory mtimes.

        The probe's source goes on the command line (``-c``), so an account that cannot read this
        installation can run it; it runs from ``/``, and, when the daemon is root, as the owner of an
        interpreter that belongs to another account (:func:`gpulayerd.gpu.interpreters.run_identity`)."""
        argv = [path, "-c", _probe_source(), "--probe"]
        if not torch_check:
            argv.append("--no-torch")
        runs: list[int] = []

        def started(proc: Popen[bytes]) -> None:
            with self._lock:
                self._torch_runs.add(proc.pid)
            runs.append(proc.pid)

        # The daemon's own interpreter runs as the daemon: its files are already trusted as much.
        ids = None if os.path.abspath(path) == os.path.abspath(sys.executable) else run_identity(path)
        env = with_activation(self._env, activation or {})
        if ids is not None:
            env["HOME"] = home_of_uid(ids[0])
        try:
            outcome = run_bounded(argv, self._timeout_s, env=env, max_output_bytes=self._max_output_bytes,
                                  started=started if torch_check else None, cwd="/", as_ids=ids)
        except OSError as e:
            return self._failed(path, f"cannot run interpreter {path}: {e.strerror or e}"), None
        finally:
            with self._lock:
                self._torch_runs.difference_update(runs)  # reaped: its group id may be reused
        status = _describe_exit(outcome, self._timeout_s)
        report = last_report(outcome.stdout.decode("utf-8", "replace").splitlines())
        if report is not None:
            mark_files_on_disk(report)  # several distributions of one framework: whose files are there
            snapshot = snapshot_from_report(path, report)
            if outcome.returncode != 0:
                snapshot = dataclasses.replace(
                    snapshot, notes=(*snapshot.notes, f"probe {status} after its report")
                )
                return snapshot, None
            return snapshot, dir_mtimes(report.get("path_mtimes_ns"))
        checkpoint = read_checkpoint(outcome.stderr_head.decode("utf-8", "replace").splitlines())
        if checkpoint is not None:
            mark_files_on_disk(checkpoint)
            reason = f"the torch check {status}"
            if outcome.timed_out:
                reason += " (importing torch can hang on a broken GPU driver)"
            self._warn_once(f"{path}:torch", "environment probe of %s: %s", path, reason)
            return snapshot_from_report(path, checkpoint, torch_unfinished=reason), None
        detail = stderr_last_line(outcome.stderr_tail.decode("utf-8", "replace").splitlines())
        if outcome.timed_out or outcome.overflowed:
            message = f"probe of {path} {status}"
        elif outcome.stdout.strip():
            message = (
                f"probe of {path} {status} without a JSON report; stdout began {excerpt(outcome.stdout)}"
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

    def stop_torch_checks(self) -> int:
        """Kill the process group of every probe with the torch check running now (the daemon
        is stopping: a torch import can take seconds or hang). Their :meth:`probe` calls return
        soon after with a "killed" snapshot, which is not cached. Returns how many were signalled.
        """
        with self._lock:
            groups = list(self._torch_runs)
            self._torch_runs.clear()
        signalled = 0
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                signalled += 1
        return signalled

    # -------------------------------------------------------------------- cache

    def _cached(self, key: tuple[str, bool]) -> EnvironmentSnapshot | None:
        with self._lock:
            entry = self._memory.get(key)
        if entry is not None and not self._same_driver(key, entry):
            entry = None  # taken under another driver state: maybe one on disk was taken under this one
        if entry is None:
            entry = self._load(key)
            if entry is None or not self._same_driver(key, entry):
                return None
        if not self._still_valid(key[0], entry):
            with self._lock:
                self._memory.pop(key, None)
            return None
        with self._lock:
            self._memory[key] = entry
        return entry.snapshot

    def _same_driver(self, key: tuple[str, bool], entry: _CacheEntry) -> bool:
        with self._lock:
            return not key[1] or entry.driver_state == self._driver_state

    def _still_valid(self, path: str, entry: _CacheEntry) -> bool:
        if entry.env_fingerprint != self._env_fingerprint:
            return False
        if _stat_key(path) != entry.interpreter_stat or _stat_key(str(_PROBE_SCRIPT)) != entry.probe_stat:
            return False
        return all(_mtime_ns(d) == mtime for d, mtime in entry.dir_mtimes_ns.items())

    def _cache_file(self, key: tuple[str, bool], driver_state: str) -> Path | None:
        if self._cache_dir is None:
            return None
        ident = json.dumps([key[0], key[1], self._env_fingerprint, _CACHE_FORMAT]
                           + ([driver_state] if key[1] and driver_state else []))
        return self._cache_dir / f"env-{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"

    def _load(self, key: tuple[str, bool]) -> _CacheEntry | None:
        with self._lock:
            driver_state = self._driver_state if key[1] else ""
        file = self._cache_file(key, driver_state)
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
            dirs = dir_mtimes(data.get("dir_mtimes_ns"))
            if dirs is None:
                return None
            return _CacheEntry(
                interpreter_stat=tuple(int(x) for x in data["interpreter_stat"]),
                probe_stat=tuple(int(x) for x in data["probe_stat"]),
                env_fingerprint=str(data["env_fingerprint"]),
                dir_mtimes_ns=dirs,
                snapshot=EnvironmentModel.model_validate(data["snapshot"]).to_core(),
                driver_state=str(data.get("driver_state", "")),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as e:
            logger.debug("ignoring unreadable environment cache file %s: %s", file, e)
            return None

    def _save(self, key: tuple[str, bool], entry: _CacheEntry) -> None:
        file = self._cache_file(key, entry.driver_state)
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
            "driver_state": entry.driver_state,
            "snapshot": EnvironmentModel.from_core(entry.snapshot).model_dump(mode="json"),
        }
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(file, json.dumps(data, sort_keys=True))
        except OSError as e:
            self._warn_once(f"cache:{file.parent}", "cannot write environment cache %s: %s", file, e)

    def _warn_once(self, what: str, msg: str, *args: object) -> None:
        """Log at WARNING the first time ``what`` happens, at DEBUG after that."""
        with self._lock:
            first = what not in self._warned
            if first:
                if len(self._warned) >= _WARNED_MAX:
                    self._warned.clear()
                self._warned.add(what)
        logger.log(logging.WARNING if first else logging.DEBUG, msg, *args)


# ------------------------------------------------------------------- files and processes


@functools.cache
def _probe_source() -> str:
    return _PROBE_SCRIPT.read_text(encoding="utf-8")


def with_activation(env: Mapping[str, str], activation: Mapping[str, str]) -> dict[str, str]:
    """``env`` with an environment's activation applied (its variables over ``env``'s; its ``PATH``,
    a directory, first on PATH); ``env`` unchanged (a copy) without one."""
    out = dict(env)
    if not activation:
        return out
    out.update({k: v for k, v in activation.items() if k != "PATH"})
    first = activation.get("PATH")
    if first:
        out["PATH"] = first + (f":{env['PATH']}" if env.get("PATH") else "")
    return out


def _as_configured(snap: EnvironmentSnapshot, found: ResolvedInterpreter) -> EnvironmentSnapshot:
    """``snap`` saying how it was reached: the configured shim, the conda activation jobs get."""
    notes = snap.notes + ((found.activation_note,) if found.activation_note else ())
    return dataclasses.replace(snap, configured=found.configured if found.configured != snap.interpreter else None,
                               launcher=found.launcher, activation=dict(found.activation), notes=notes)


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


def _describe_exit(outcome: RunOutcome, timeout_s: float) -> str:
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
