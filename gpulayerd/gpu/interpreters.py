"""What a configured interpreter really runs: version-manager shims resolved, conda activation read.

A pyenv shim (``~/.pyenv/shims/python``), an asdf or mise shim, or any launcher script picks its
Python per directory (``PYENV_VERSION``, the nearest ``.python-version``): probing the shim from the
daemon's directory and running it in a job's workdir can give two different interpreters. So each
configured interpreter that is such a shim (or the ``py`` launcher) is run once, from ``/`` and never
as root when its file belongs to another account, to ask which interpreter it starts
(``sys.executable``); that interpreter is probed and jobs run exactly it. A wrapper script of the
admin's (one that sets variables, then execs python) is run as it is.

A conda environment (its prefix has ``conda-meta/``) is used by jobs the way ``conda run`` would:
with ``CONDA_PREFIX``, ``CONDA_DEFAULT_ENV``, its ``bin`` first on PATH, the variables its
``conda-meta/state`` sets (``conda env config vars``) and those its ``etc/conda/activate.d/*.sh``
scripts export (``LD_LIBRARY_PATH``, ``XLA_FLAGS``, ...), read once by sourcing them in ``bash``.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpulayerd.gpu.command import RunOutcome, decisive_line, run_bounded

__all__ = [
    "ACTIVATION_IGNORED",
    "MAX_ACTIVATION_VALUE",
    "MAX_ACTIVATION_VARS",
    "InterpreterResolver",
    "ResolvedInterpreter",
    "home_of_uid",
    "launcher_kind",
    "run_identity",
]

log = logging.getLogger(__name__)

ACTIVATION_IGNORED = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PATH", "HOME", "LANG", "SHELL", "USER", "LOGNAME",
                                "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES"})
"""Variables never taken from a conda environment's activation (the account's, gpulayer's grants; PATH
gets the prefix's ``bin`` in front instead), nor any ``GPULAYER_*``."""

MAX_ACTIVATION_VARS = 128
"""At most this many variables are taken from one conda environment's activation (the rest: a note)."""
MAX_ACTIVATION_VALUE = 8192
"""A longer activation value is dropped with a note (characters)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NOBODY = "nobody"
_RESOLVE_CODE = "import sys; print(sys.executable)"
# The scripts' own output goes to stderr; only `env -0` reaches stdout (descriptor 3 is the real stdout).
_ACTIVATE = ('exec 3>&1 1>&2; for f in "$CONDA_PREFIX"/etc/conda/activate.d/*.sh; do [ -f "$f" ] && . "$f"; done; '
             'env -0 >&3')
_CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class ResolvedInterpreter:
    """One configured interpreter, as jobs will run it.

    Attributes:
        path: the interpreter the probe examines and jobs run (absolute).
        configured: the path as configured (absolute, not resolved).
        launcher: what ``configured`` is when it differs from ``path``: ``"pyenv shim"``,
            ``"asdf shim"``, ``"mise shim"``, ``"Python launcher"``; "" when they are the same.
        problem: why the shim named no interpreter (its own words: ``pyenv: version `3.10.4'
            is not installed``); None when resolved.
        activation: variable -> value jobs run with: a conda environment's activation (``CONDA_PREFIX``
            set means conda), and ``PATH``, which names the directory put first on the job's PATH
            (the conda prefix's ``bin``, or a resolved shim's interpreter's); empty for others.
        activation_note: what went wrong reading the activation scripts; "" when nothing did.
    """

    path: str
    configured: str
    launcher: str = ""
    problem: str | None = None
    activation: Mapping[str, str] = field(default_factory=dict)
    activation_note: str = ""


_SHIM_TEMPLATES = (
    ("pyenv", re.compile(rb'libexec/pyenv"?\s+exec\b|\bpyenv\s+exec\b')),
    ("asdf", re.compile(rb"\basdf\s+exec\b|asdf/lib/commands/command-exec")),
    ("mise", re.compile(rb"\b(?:mise|rtx)\s+(?:exec|x)\b")),
)


def launcher_kind(path: str) -> str | None:
    """``"pyenv shim"``, ``"asdf shim"`` or ``"mise shim"`` when ``path`` is a version manager's shim (a
    ``#!`` script that hands over with ``pyenv exec`` / ``asdf exec`` / ``mise exec``, or a link to the
    ``mise``/``rtx`` binary), ``"Python launcher"`` for ``py``: each picks the interpreter by directory.
    None otherwise: an interpreter, a venv's link to one, or a wrapper script of the admin's (it may set
    variables for the interpreter, so it is run as it is). Reads at most 4 KiB; never raises."""
    try:
        real = os.path.realpath(path)
        with open(real, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    name = os.path.basename(real)
    if name in ("mise", "rtx"):
        return "mise shim"
    if head.startswith(b"#!"):
        for tool, template in _SHIM_TEMPLATES:
            if template.search(head):
                return f"{tool} shim"
    if name == "py":
        return "Python launcher"
    return None


def run_identity(path: str) -> tuple[int, int] | None:
    """Whom to run ``path`` as, when this process is root (else None: as this process).

    Walks from the file (as given, then its real path) up to ``/``: the first entry that belongs to
    another account decides, the file is run as that account (a user's venv, pyenv, conda env); an
    entry of root's that others could replace (group/other-writable, not sticky) makes it ``nobody``;
    None (as root) only when root owns the whole chain and nobody else can change it. Never raises
    (nobody's ids, or (65534, 65534), when in doubt).
    """
    if os.geteuid() != 0:
        return None
    chains = [os.path.abspath(path)]
    try:
        chains.append(os.path.realpath(path))
    except OSError:
        return _nobody_ids()
    for start in chains:
        entry = start
        while True:
            try:
                st = os.lstat(entry)
            except OSError:
                return _nobody_ids()
            if st.st_uid != 0:
                return (st.st_uid, st.st_gid)
            writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode)
            if writable and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
                return _nobody_ids()
            parent = os.path.dirname(entry)
            if parent == entry:
                break
            entry = parent
    return None


def _nobody_ids() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(_NOBODY)
        return (pw.pw_uid, pw.pw_gid)
    except KeyError:
        return (65534, 65534)


class InterpreterResolver:
    """Resolves each configured interpreter once per process (per the file's identity); thread-safe.

    Args:
        env: the environment shims and activation scripts run with (the prober's).
        timeout_s: limit of one resolution or activation read, in seconds.
    """

    def __init__(self, env: Mapping[str, str], timeout_s: float) -> None:
        self._env = dict(env)
        self._timeout_s = timeout_s
        self._memo: dict[tuple[str, tuple[int, ...] | None], ResolvedInterpreter] = {}
        self._lock = threading.Lock()

    def resolve(self, path: str) -> ResolvedInterpreter:
        """The interpreter behind ``path`` (absolute, existing, executable) and its conda activation.

        Runs the shim (and ``bash`` for activation scripts) only the first time a file is seen;
        later calls cost one ``stat``.
        """
        key = (path, _identity(path))
        with self._lock:
            known = self._memo.get(key)
        if known is not None:
            return known
        found = self._resolve(path)
        with self._lock:
            if len(self._memo) > 256:
                self._memo.clear()
            self._memo[key] = found
        return found

    def _resolve(self, path: str) -> ResolvedInterpreter:
        kind = launcher_kind(path)
        real = path
        if kind is not None:
            outcome = self._run([path, "-c", _RESOLVE_CODE], path, self._env)
            printed = outcome.stdout.decode("utf-8", "replace").strip().splitlines() if outcome else []
            named = printed[-1].strip() if printed else ""
            if outcome is None or outcome.returncode != 0 or not os.path.isabs(named) or not os.path.exists(named):
                words = decisive_line(outcome.stderr_tail.decode("utf-8", "replace").splitlines()) if outcome else ""
                why = words or ("it could not be run" if outcome is None else
                                f"it exited with status {outcome.returncode} without naming an interpreter")
                return ResolvedInterpreter(path, path, kind, problem=f"{path} is a {kind} and named no interpreter: "
                                           f"{why}; name the interpreter itself (e.g. ~/.pyenv/versions/X/bin/python)")
            real = named
            log.info("%s is a %s: probing and running %s", path, kind, real)
        activation, note = self._activation(real)
        if kind is not None and real != path and "PATH" not in activation:
            # A script's nested `python` must find this interpreter too, not the shim (which would
            # pick another version by the workdir's .python-version).
            activation["PATH"] = os.path.dirname(real)
        return ResolvedInterpreter(real, path, (kind or "") if real != path else "", None, activation, note)

    def _activation(self, interpreter: str) -> tuple[dict[str, str], str]:
        prefix = os.path.dirname(os.path.dirname(interpreter))
        if not os.path.isdir(os.path.join(prefix, "conda-meta")):
            return {}, ""
        name = "base" if os.path.isdir(os.path.join(prefix, "pkgs")) else os.path.basename(prefix)
        base = {"CONDA_PREFIX": prefix, "CONDA_DEFAULT_ENV": name, "CONDA_SHLVL": "1",
                "PATH": f"{prefix}/bin:{_CLEAN_PATH}", "HOME": _home_of(prefix), "LANG": "C.UTF-8"}
        out = {k: v for k, v in base.items() if k.startswith("CONDA_")}
        out["PATH"] = f"{prefix}/bin"  # put first on the job's PATH (not a value to set)
        found: dict[str, str] = {}
        state_vars: dict[str, str] = {}
        try:
            with open(os.path.join(prefix, "conda-meta", "state"), encoding="utf-8") as f:
                state = json.load(f)
            extra = state.get("env_vars", {}) if isinstance(state, dict) else {}
            state_vars = {str(k): str(v) for k, v in extra.items()} if isinstance(extra, dict) else {}
        except (OSError, ValueError):
            pass
        note = ""
        scripts = os.path.join(prefix, "etc", "conda", "activate.d")
        if os.path.isdir(scripts):
            outcome = self._run(["bash", "--noprofile", "--norc", "-c", _ACTIVATE], prefix, base)
            if outcome is None or outcome.returncode != 0:
                words = decisive_line(outcome.stderr_tail.decode("utf-8", "replace").splitlines()) if outcome else ""
                note = f"conda activation scripts in {scripts} failed: {words or 'bash could not be run'}"
            else:
                for item in outcome.stdout.decode("utf-8", "replace").split("\0"):
                    k, sep, v = item.partition("=")
                    if sep and base.get(k) != v:
                        found[k] = v
        dropped = 0
        for k, v in [*found.items(), *((k, v) for k, v in state_vars.items() if k not in found)]:
            if not _NAME.fullmatch(k) or k in ACTIVATION_IGNORED or k.startswith("GPULAYER_") or k in out:
                continue
            if len(out) >= MAX_ACTIVATION_VARS or len(v) > MAX_ACTIVATION_VALUE:
                dropped += 1
                continue
            out[k] = v
        if dropped:
            note = "; ".join(x for x in (note, f"{dropped} conda activation variable(s) dropped (more than "
                                               f"{MAX_ACTIVATION_VARS}, or longer than {MAX_ACTIVATION_VALUE})") if x)
        return out, note

    def _run(self, argv: list[str], owned_by: str, env: Mapping[str, str]) -> RunOutcome | None:
        """Run from ``/``; as :func:`run_identity` of ``owned_by`` says (never as root for others' files)."""
        ids = run_identity(owned_by)
        if ids is not None:
            env = {**env, "HOME": home_of_uid(ids[0])}
        try:
            return run_bounded(argv, self._timeout_s, env=env, max_output_bytes=1 << 20, cwd="/", as_ids=ids)
        except OSError:
            return None


def _identity(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _home_of(path: str) -> str:
    """The home directory of the account owning ``path``; ``/`` when unknown."""
    try:
        return home_of_uid(os.stat(path).st_uid)
    except OSError:
        return "/"


def home_of_uid(uid: int) -> str:
    """The home directory of account ``uid`` (the user database); ``/`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"
