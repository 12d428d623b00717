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
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpulayerd.gpu.command import RunOutcome, decisive_line, run_bounded

__all__ = ["ACTIVATION_IGNORED", "InterpreterResolver", "ResolvedInterpreter", "launcher_kind"]

log = logging.getLogger(__name__)

ACTIVATION_IGNORED = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PATH", "HOME", "LANG"})
"""Variables never taken from a conda environment's activation scripts (PATH gets the prefix's
``bin`` in front instead)."""

_RESOLVE_CODE = "import sys; print(sys.executable)"
_ACTIVATE = ('for f in "$CONDA_PREFIX"/etc/conda/activate.d/*.sh; do [ -f "$f" ] && . "$f"; done; '
             'env -0')
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
        activation: a conda environment's activation, variable -> value (``CONDA_PREFIX`` set
            means conda); empty for any other interpreter.
        activation_note: what went wrong reading the activation scripts; "" when nothing did.
    """

    path: str
    configured: str
    launcher: str = ""
    problem: str | None = None
    activation: Mapping[str, str] = field(default_factory=dict)
    activation_note: str = ""


def launcher_kind(path: str) -> str | None:
    """``"pyenv shim"``, ``"asdf shim"`` or ``"mise shim"`` when ``path`` is a version manager's shim (a
    ``#!`` script naming the tool, or a link to its binary), ``"Python launcher"`` for ``py``: each picks
    the interpreter by directory. None otherwise: an interpreter, a venv's link to one, or a wrapper
    script of the admin's (it may set variables for the interpreter, so it is run as it is). Reads at
    most 4 KiB; never raises."""
    try:
        real = os.path.realpath(path)
        with open(real, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    text = head.decode("utf-8", "replace")
    name = os.path.basename(real)
    for tool in ("pyenv", "asdf", "mise", "rtx"):
        if (head.startswith(b"#!") and tool in text) or name == tool:
            return f"{'mise' if tool == 'rtx' else tool} shim"
    if name == "py":
        return "Python launcher"
    return None


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
        return ResolvedInterpreter(real, path, (kind or "") if real != path else "", None, activation, note)

    def _activation(self, interpreter: str) -> tuple[dict[str, str], str]:
        prefix = os.path.dirname(os.path.dirname(interpreter))
        if not os.path.isdir(os.path.join(prefix, "conda-meta")):
            return {}, ""
        name = "base" if os.path.isdir(os.path.join(prefix, "pkgs")) else os.path.basename(prefix)
        base = {"CONDA_PREFIX": prefix, "CONDA_DEFAULT_ENV": name, "CONDA_SHLVL": "1",
                "PATH": f"{prefix}/bin:{_CLEAN_PATH}", "HOME": _home_of(prefix), "LANG": "C.UTF-8"}
        out = {k: v for k, v in base.items() if k.startswith("CONDA_")}
        try:
            with open(os.path.join(prefix, "conda-meta", "state"), encoding="utf-8") as f:
                state = json.load(f)
            extra = state.get("env_vars", {}) if isinstance(state, dict) else {}
            out.update({str(k): str(v) for k, v in extra.items()} if isinstance(extra, dict) else {})
        except (OSError, ValueError):
            pass
        scripts = os.path.join(prefix, "etc", "conda", "activate.d")
        if not os.path.isdir(scripts):
            return out, ""
        outcome = self._run(["bash", "--noprofile", "--norc", "-c", _ACTIVATE], prefix, base)
        if outcome is None or outcome.returncode != 0:
            words = decisive_line(outcome.stderr_tail.decode("utf-8", "replace").splitlines()) if outcome else ""
            return out, f"conda activation scripts in {scripts} failed: {words or 'bash could not be run'}"
        for item in outcome.stdout.decode("utf-8", "replace").split("\0"):
            k, sep, v = item.partition("=")
            if sep and k and k not in ACTIVATION_IGNORED and base.get(k) != v:
                out[k] = v
        return out, ""

    def _run(self, argv: list[str], owned_by: str, env: Mapping[str, str]) -> RunOutcome | None:
        """Run from ``/``; as the owner of ``owned_by`` when this process is root and it is not."""
        ids: tuple[int, int] | None = None
        try:
            st = os.stat(owned_by)
            if os.geteuid() == 0 and st.st_uid != 0:
                ids = (st.st_uid, st.st_gid)
                env = {**env, "HOME": _home_of(owned_by)}
        except OSError:
            return None
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
        return pwd.getpwuid(os.stat(path).st_uid).pw_dir
    except (OSError, KeyError):
        return "/"
