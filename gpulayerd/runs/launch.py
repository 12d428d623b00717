"""The command line, environment and account of a job attempt on this worker.

:func:`build_argv` (one host, optionally under torchrun), :func:`build_gang_argv` (one
member of a multi-host job), :func:`build_env` and :func:`resolve_job_user` give what
:meth:`gpulayerd.runs.runner.Runner.start` runs.


(Same name as :mod:`gpulayerd.core.launch`: the same idea, a job's launch, decided there (pure) and
carried out here.)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Literal

from gpulayerd.core.launch import launch_env
from gpulayerd.core.verdict import Placement
from gpulayerd.models import JobSpec
from gpulayerd.runs.account import JobUser, lookup_user, this_user
from gpulayerd.runs.runner import RunnerError

__all__ = ["DEFAULT_PATH", "build_argv", "build_env", "build_gang_argv", "resolve_job_user"]

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A job's PATH when it runs as its user and the submitter's PATH is not known."""

_FALLBACK_LANG = "C.UTF-8"

_PYTHON_NAME = re.compile(r"python(3|\d+\.\d+)?")


def build_argv(
    spec: JobSpec,
    interpreter: str,
    nproc_per_node: int | None,
    *,
    rdzv_timeout_s: float,
    log_dir: str | None = None,
) -> list[str]:
    """The command line of a job on this worker.

    A leading bare ``python``, ``python3`` or ``pythonX.Y`` becomes ``interpreter`` (the
    matched environment); an explicit path such as ``/usr/bin/python3`` is kept. With
    ``nproc_per_node`` the job runs under torchrun on this host alone::

        interpreter -m torch.distributed.run --standalone --local-addr 127.0.0.1 --nnodes 1
            --nproc-per-node N --max-restarts 0 --monitor-interval 1 --rdzv-conf join_timeout=T
            SCRIPT ARGS...

    ``--standalone`` gives every job its own c10d rendezvous on a free port with a random
    run id, so two jobs on one machine never join one rendezvous. ``--local-addr
    127.0.0.1`` keeps torchrun from publishing this host's name as the store address: on
    a host whose own name does not resolve (containers, nodes without a DNS entry) the
    workers would never reach the store and the job would hang (recorded case bug-36). ``python -m mod`` passes
    through as torchrun's ``-m mod``; a command that is not python runs with
    ``--no-python``. With ``log_dir``, torchrun keeps each rank's output there and
    copies it to the job's log line by line with a ``[default<rank>]:`` prefix
    (``--log-dir DIR --tee 3``), so the ranks' lines never interleave mid-line.

    Args:
        spec: the job.
        interpreter: absolute path of the environment's python.
        nproc_per_node: processes for torchrun; None runs the command as it is.
        rdzv_timeout_s: torchrun's rendezvous join timeout (rounded up to whole seconds).
        log_dir: directory for torchrun's per-rank logs; None leaves them on the job's output.

    Raises:
        RunnerError: a multi-host job (those are started by the gang protocol), or a
            python command torchrun cannot run (no script, or an interpreter option).
    """
    command = list(spec.command)
    is_python = _PYTHON_NAME.fullmatch(command[0]) is not None
    if nproc_per_node is None:
        return [interpreter, *command[1:]] if is_python else command
    nnodes = spec.distributed.nnodes if spec.distributed is not None else 1
    if nnodes != 1:
        raise RunnerError(f"a job over {nnodes} hosts is started by the gang protocol, not on one host")
    if nproc_per_node < 1:
        raise RunnerError(f"nproc_per_node must be at least 1, not {nproc_per_node}")
    torchrun = [
        interpreter, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1",
        "--nnodes", "1", "--nproc-per-node", str(nproc_per_node), "--max-restarts", "0", "--monitor-interval", "1",
        "--rdzv-conf", f"join_timeout={max(1, math.ceil(rdzv_timeout_s))}",
    ]
    if log_dir is not None:
        torchrun += ["--log-dir", log_dir, "--tee", "3"]
    if not is_python:
        return [*torchrun, "--no-python", *command]
    return [*torchrun, *_script_and_args(command[1:])]


def build_gang_argv(
    spec: JobSpec,
    interpreter: str,
    *,
    nnodes: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
    log_dir: str | None = None,
) -> list[str]:
    """The command line of one member (host) of a multi-host torch.distributed job::

        interpreter -m torch.distributed.run --nnodes N --node-rank R --master-addr IP
            --master-port P --nproc-per-node K --max-restarts 0 --monitor-interval 1 SCRIPT ARGS...

    A static rendezvous at ``master_addr:master_port`` (an IP literal and a port that
    rank 0's daemon reserved). Ranks of the job's processes are ``R * K + local rank``.

    Raises:
        RunnerError: a python command torchrun cannot run.
    """
    command = list(spec.command)
    nproc = spec.distributed.nproc_per_node if spec.distributed is not None else 1
    torchrun = [
        interpreter, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
        "--master-addr", master_addr, "--master-port", str(master_port), "--nproc-per-node", str(nproc),
        "--max-restarts", "0", "--monitor-interval", "1",
    ]
    if log_dir is not None:
        torchrun += ["--log-dir", log_dir, "--tee", "3"]
    if _PYTHON_NAME.fullmatch(command[0]) is None:
        return [*torchrun, "--no-python", *command]
    return [*torchrun, *_script_and_args(command[1:])]


def build_env(
    base_env: Mapping[str, str],
    spec: JobSpec,
    placement: Placement,
    job_id: str,
    attempt: int,
    dist_timeout_s: float,
    user: JobUser | None = None,
    activation: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The full environment of a job.

    Without ``user`` (a job from before users, or a test), layers, later wins:
    ``base_env`` without ``GPULAYER_*`` (and the service plumbing ``NOTIFY_SOCKET``,
    ``JOURNAL_STREAM``); ``PATH`` = ``spec.path`` when the CLI captured it;
    ``PYTHONUNBUFFERED=1``; the spec's ``env``; gpulayer's variables.

    With ``user`` (the job runs as that account) the environment is clean: nothing of
    ``base_env`` but the locale (``LANG``, ``LANGUAGE``, ``LC_*``; ``LANG=C.UTF-8`` when it
    has none); ``HOME``, ``SHELL``, ``USER`` and ``LOGNAME`` of the account; ``PATH`` =
    ``spec.path`` (the submitter's PATH, captured by the CLI at submit) or
    :data:`DEFAULT_PATH`; ``PYTHONUNBUFFERED=1``; the spec's ``env`` (which may override any
    of these but ``USER`` and ``LOGNAME``, which always name the account); gpulayer's
    variables.

    ``activation`` (:attr:`EnvironmentSnapshot.activation`: a conda environment's, a resolved shim's)
    comes after the base layers and before the spec's ``env``: its variables, and its ``PATH`` (a
    directory) first on PATH.

    The spec's ``GPULAYER_*`` variables are always dropped. gpulayer's variables, last:
    :func:`gpulayerd.core.launch.launch_env` (``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER``, ``GPULAYER_JOB_ID``, ``GPULAYER_ATTEMPT``) and
    ``GPULAYER_DIST_TIMEOUT_S``, the collective timeout in seconds that distributed
    workloads pass to ``init_process_group(timeout=...)`` instead of torch's 30-minute
    default; a task of an array ``GPULAYER_ARRAY_ID``, ``GPULAYER_ARRAY_TASK_ID`` (its index)
    and ``GPULAYER_ARRAY_TASK_COUNT``. (A gang member adds ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``.)
    """
    if user is None:
        # The daemon's own service plumbing (systemd's notify socket and journal stream) is not the job's.
        env = {k: v for k, v in base_env.items()
               if not k.startswith("GPULAYER_") and k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
        if spec.path:
            env["PATH"] = spec.path
    else:
        env = {k: v for k, v in base_env.items() if k in ("LANG", "LANGUAGE") or k.startswith("LC_")}
        if not env:
            env["LANG"] = _FALLBACK_LANG
        env.update(HOME=user.home, SHELL=user.shell, USER=user.name, LOGNAME=user.name,
                   PATH=spec.path or DEFAULT_PATH)
    env["PYTHONUNBUFFERED"] = "1"
    if activation:
        env.update({k: v for k, v in activation.items() if k != "PATH"})
        if activation.get("PATH"):  # a directory to put first: the environment's bin
            env["PATH"] = activation["PATH"] + (f":{env['PATH']}" if env.get("PATH") else "")
    env.update({k: v for k, v in spec.env.items() if not k.startswith("GPULAYER_")})
    if user is not None:
        env.update(USER=user.name, LOGNAME=user.name)
    env.update(launch_env(placement.accelerator, placement.device_indices, job_id, attempt,
                          placement.device_uuids))
    env["GPULAYER_DIST_TIMEOUT_S"] = repr(float(dist_timeout_s))
    if spec.array_task is not None:  # a task of an array: which one
        task = spec.array_task
        env.update(GPULAYER_ARRAY_ID=task.array_id, GPULAYER_ARRAY_TASK_ID=str(task.index),
                   GPULAYER_ARRAY_TASK_COUNT=str(task.count))
    return env


def resolve_job_user(
    spec_user: str | None,
    mode: Literal["personal", "system"],
    allow_root_jobs: bool,
) -> JobUser | None:
    """The account a job runs as on this machine; None runs it as the daemon's account, as before users.

    The rule (blocking: reads the user database):

    - no ``spec_user`` (a job from before users, a test): None.
    - the daemon runs as root, system mode: the job runs as ``spec_user``; a job of root
      only when ``allow_root_jobs``.
    - the daemon runs as root, personal mode: it runs only its own user's jobs, so
      ``spec_user`` must be ``root``.
    - the daemon does not run as root: it cannot switch accounts, so ``spec_user`` must be
      the daemon's own user; the job then runs as it, with the clean environment of
      :func:`build_env`.

    Raises:
        RunnerError: ``spec_user`` has no account here, is root where root jobs are not
            allowed, or is not the daemon's user where the daemon can run only its own.
    """
    if not spec_user:
        return None
    if os.geteuid() == 0 and mode == "system":
        if spec_user == "root" and not allow_root_jobs:
            raise RunnerError("jobs of root do not run on this worker (allow_root_jobs = false)")
        try:
            return lookup_user(spec_user)
        except LookupError as e:
            raise RunnerError(str(e)) from None
    try:
        me = this_user()
    except LookupError as e:
        raise RunnerError(f"cannot run a job of {spec_user!r}: {e}") from None
    if spec_user != me.name:
        raise RunnerError(f"this {mode}-mode daemon runs as {me.name!r} and runs only that user's jobs, "
                          f"not {spec_user!r}'s")
    return me


def _script_and_args(args: Sequence[str]) -> list[str]:
    """What follows ``python`` in a command, as torchrun's training_script arguments."""
    rest = list(args)
    while rest and rest[0] == "-u":  # unbuffered already: PYTHONUNBUFFERED=1
        rest.pop(0)
    if not rest:
        raise RunnerError("a distributed python command needs a script or -m module")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise RunnerError("python -m needs a module name")
        return rest
    if rest[0].startswith("-m"):
        return ["-m", rest[0][2:], *rest[1:]]
    if rest[0].startswith("-"):
        raise RunnerError(f"torchrun cannot pass the python option {rest[0]} through; "
                          "run a script or -m module")
    return rest
