"""The pre-flight check: before a job's command, its interpreter imports the frameworks the job names
and, for a CUDA or MPS job naming torch, initializes the granted device.

The watchdog (:mod:`.watchdog`) runs :data:`CHECK` with the job's interpreter, environment
(``CUDA_VISIBLE_DEVICES`` holds the granted devices; without the variables the job's own spec sets)
and account, in a neutral directory (``/``, never the workdir) and without the user's site-packages
(``python -s``): a user's own ``torch/`` folder, ``PYTHONPATH`` or ``~/.local/lib/python*/site-packages``
must not make the environment look broken for everyone. Bounded in time. A failure
ends the attempt ``preflight_failed`` with the error's line (the exception, e.g. ``ImportError: ...
undefined symbol: __nvJitLinkComplete_12_4``) and the framework it concerns; the daemon then marks
that environment broken for that framework and the owner queues the job again for another worker.

Stdlib only: the watchdog and the zygote import this.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulayerd.gpu.command import DEVNULL, Popen
from gpulayerd.runs.account import JobUser
from gpulayerd.runs.layout import JOB_FILE, write_json
from gpulayerd.runs.process import record_of

__all__ = ["CHECK", "PREFLIGHT_FAILED", "PREFLIGHT_LOG", "PREFLIGHT_STOPPED", "PreflightCheck", "begin", "failure",
           "start"]

PREFLIGHT_FAILED = "preflight_failed"
"""``exit.json``'s reason when the check itself said what failed (its error line): ``detail`` is
``FRAMEWORK: error``; the worker marks the environment broken for that framework."""

PREFLIGHT_STOPPED = "preflight_stopped"
"""``exit.json``'s reason when the check ended otherwise (a signal, its time bound): the job moves to another
worker all the same, but nothing is marked: the job's own user can stop or kill its check, and must not
make the environment look broken for everyone."""

PREFLIGHT_LOG = "preflight.log"
"""The check's standard error, in the run directory (the watchdog opens it; the check only writes)."""

_MAX_LINE = 300

CHECK = r"""
import importlib, json, sys, traceback
names = [n for n in sys.argv[1].split(",") if n]
device = sys.argv[2]
step = names[0] if names else ""
try:
    for step in names:
        importlib.import_module(step)
    if device in ("cuda", "mps") and "torch" in names:
        step = "torch"
        import torch
        if device == "cuda":
            torch.cuda.init()
        float((torch.zeros(1, device=device) + 1).sum())
except BaseException as e:
    line = traceback.format_exception_only(type(e), e)[-1].strip()
    traceback.print_exc()
    sys.stderr.write("\n" + json.dumps({"framework": step, "error": line}) + "\n")
    sys.exit(3)
"""
"""The check, run as ``python -s -c CHECK FRAMEWORKS DEVICE`` (frameworks comma-separated, device
``cuda``, ``mps`` or ``none``); on failure it prints the traceback, then, as the last line of standard
error, a JSON object ``{"framework": ..., "error": ...}``, and exits 3."""


@dataclass(frozen=True, slots=True)
class PreflightCheck:
    """What one attempt's pre-flight checks (``launch.json``'s ``preflight``).

    Attributes:
        python: the job's interpreter (absolute path).
        frameworks: the frameworks the job names (their import names), in order.
        device: ``cuda`` or ``mps`` (the granted device is initialized when torch is named), or ``none``.
        timeout_s: seconds the check may take (then it is stopped and counts as failed).
        drop_env: variables of the job's environment the check runs without: the ones the job's own spec
            sets (``PYTHONPATH``, ``LD_PRELOAD``, …): one user's variables must not mark the environment
            broken for everyone; the check sees the environment as the worker gives it to every job.
    """

    python: str
    frameworks: tuple[str, ...]
    device: str = "none"
    timeout_s: float = 60.0
    drop_env: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The ``launch.json`` form."""
        return {"python": self.python, "frameworks": list(self.frameworks), "device": self.device,
                "timeout_s": self.timeout_s, "drop_env": list(self.drop_env)}

    @classmethod
    def from_json(cls, data: object) -> PreflightCheck:
        """Read :meth:`to_json`'s form.

        Raises:
            ValueError: not an object, or a field of the wrong type (named).
        """
        if not isinstance(data, Mapping):
            raise ValueError("preflight must be an object or null")
        python, names, device, timeout = (data.get("python"), data.get("frameworks"), data.get("device", "none"),
                                          data.get("timeout_s", 60.0))
        if not isinstance(python, str) or not python.startswith("/"):
            raise ValueError("preflight.python must be an absolute path")
        if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError("preflight.frameworks must be a list of module names")
        if device not in ("cuda", "mps", "none"):
            raise ValueError(f"preflight.device must be cuda, mps or none, not {device!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"preflight.timeout_s must be a positive number, not {timeout!r}")
        drop = data.get("drop_env", [])
        if not isinstance(drop, list) or not all(isinstance(k, str) for k in drop):
            raise ValueError("preflight.drop_env must be a list of variable names")
        return cls(python, tuple(names), str(device), float(timeout), tuple(drop))


def start(check: PreflightCheck, env: Mapping[str, str], user: JobUser | None, stderr: int) -> Popen[bytes]:
    """Start the check as ``user`` (None: this process's account) in ``/``, in a session of its own.

    Raises:
        OSError: the interpreter cannot be started.
    """
    # -s: without the user's own site-packages (~/.local/...: HOME is the user's), whose modules and .pth
    # files would otherwise come before the environment's.
    argv = [check.python, "-s", "-c", CHECK, ",".join(check.frameworks), check.device]
    env = {k: v for k, v in env.items() if k not in check.drop_env}
    if user is None:
        return Popen(argv, env=env, cwd="/", stdin=DEVNULL, stdout=DEVNULL, stderr=stderr,
                     start_new_session=True, close_fds=True)
    return Popen(argv, env=env, cwd="/", stdin=DEVNULL, stdout=DEVNULL, stderr=stderr,
                 start_new_session=True, close_fds=True, user=user.uid, group=user.gid,
                 extra_groups=list(user.groups))


def begin(run_dir: Path, check: PreflightCheck, env: Mapping[str, str], user: JobUser | None) -> Popen[bytes]:
    """:func:`start` with its standard error in ``run_dir``'s :data:`PREFLIGHT_LOG`, then its process
    recorded in ``job.json`` (``"preflight": true``: until the command starts, the check is the
    attempt's process, for a cancel, the lease deadline and a daemon that adopts the run).

    Raises:
        OSError: the log cannot be opened or the interpreter cannot be started.
    """
    began = time.monotonic()
    fd = os.open(run_dir / PREFLIGHT_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        proc = start(check, env, user, fd)
    finally:
        os.close(fd)
    job = record_of(proc.pid)
    write_json(run_dir / JOB_FILE, {
        "pid": proc.pid, "pgid": proc.pid, "preflight": True, "started_at": time.time(),
        "create_time": None if job is None else job.create_time, "spawn_s": time.monotonic() - began,
        "start_ticks": None if job is None else job.start_ticks})
    return proc


def failure(log_path: Path, returncode: int | None, check: PreflightCheck) -> tuple[str, str, str]:
    """(reason, framework, one line) of a failed check: :data:`PREFLIGHT_FAILED` with the error it wrote
    (the JSON line, and it exited 3 by itself), else :data:`PREFLIGHT_STOPPED` with the last line of its
    output or how it ended (a crash: "killed by signal 11")."""
    framework = check.frameworks[0] if check.frameworks else ""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(f.tell() - 8192, 0))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    if lines:
        try:
            record = json.loads(lines[-1])
            if isinstance(record, dict) and isinstance(record.get("error"), str):
                named = record.get("framework")
                return (PREFLIGHT_FAILED if returncode == 3 else PREFLIGHT_STOPPED,
                        named if isinstance(named, str) and named in check.frameworks else framework,
                        record["error"][:_MAX_LINE])
        except ValueError:
            pass
        if returncode is None or returncode >= 0:
            return PREFLIGHT_STOPPED, framework, lines[-1][:_MAX_LINE]
    if returncode is not None and returncode < 0:
        return PREFLIGHT_STOPPED, framework, f"the check was killed by signal {-returncode}"
    return PREFLIGHT_STOPPED, framework, f"the check exited with code {returncode}"
