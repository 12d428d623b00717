"""Whose jobs a node may send and a worker may run: the pure rules of DESIGN §9 "Across machines".

A cluster assumes one set of user names (HTCondor's UID domain): a job of user ``alice``
runs on a worker only as that worker's local account ``alice``. Two rules:

- :func:`vouches`: a job's user name is believed only when the node that sends it may
  speak for that user: a system-mode node (root's daemon, which takes every request's
  user from the kernel) for any name, a personal-mode node only for the one user its
  certificate is bound to.
- :func:`account_rejection`: whether a worker can run a job as its user: it must have the
  account, a personal-mode worker runs only its own user's jobs, and a system-mode
  worker runs root's jobs only when it allows them.

And one rule of the local API: :func:`may_manage`, who may cancel a job and read its logs and
spec (the daemon checks it; the TUI offers cancel by it).

No I/O: whether an account exists comes in as the worker's ``missing_accounts``.


(Same name as :mod:`gpulayerd.cli.users`: the same idea (users), the pure rules here and the command
there.)
"""

from __future__ import annotations

from gpulayerd.core.types import WorkerSnapshot
from gpulayerd.core.verdict import Rejection, RejectionCode

__all__ = ["PERSONAL", "SYSTEM", "account_rejection", "may_manage", "vouch_refusal", "vouches"]

PERSONAL = "personal"
SYSTEM = "system"


def may_manage(user: str, admin: bool, owner_user: str) -> bool:
    """Whether the account ``user`` (an admin here or not) may cancel, read the logs and see the full
    spec of a job of ``owner_user``: an admin may for every job, anyone else for their own ("" owns none)."""
    return admin or (bool(owner_user) and owner_user == user)


def vouches(owner_mode: str, owner_user: str, job_user: str) -> bool:
    """Whether a node in ``owner_mode`` bound to ``owner_user`` may name ``job_user`` as a job's user.

    Args:
        owner_mode: the sending node's mode, from its certificate (``personal``/``system``;
            anything else vouches for nobody).
        owner_user: the user a personal node's certificate is bound to ("" = none: it
            vouches for nobody).
        job_user: the job's user name ("" never: a job must name its user to be vouched for).
    """
    if not job_user:
        return False
    if owner_mode == SYSTEM:
        return True
    return owner_mode == PERSONAL and owner_user != "" and owner_user == job_user


def vouch_refusal(owner_mode: str, owner_user: str, job_user: str, owner_name: str) -> str | None:
    """Why a worker refuses ``job_user``'s job from a node (None when :func:`vouches` says yes).

    The text names the sender (``owner_name``, a host name or node id) and what it may vouch for.
    """
    if vouches(owner_mode, owner_user, job_user):
        return None
    if not job_user:
        return f"the job from {owner_name} names no user"
    if owner_mode == PERSONAL and owner_user:
        return (f"{owner_name} is {owner_user}'s personal-mode node: it cannot send jobs of {job_user!r} "
                "(only a system-mode node vouches for other users)")
    return (f"{owner_name}'s certificate is bound to no user: it cannot send jobs of {job_user!r} "
            "(re-join it to the cluster)")


def account_rejection(job_user: str, worker: WorkerSnapshot) -> Rejection | None:
    """Whether ``worker`` can run a job as ``job_user``; None if it can (or the job names no user).

    Returns:
        ``NO_ACCOUNT`` ("no account 'alice' on ws-3") when the name is among the worker's
        ``missing_accounts``; ``OTHER_USERS_WORKER`` for a personal-mode worker of another
        user; ``ROOT_JOBS_NOT_ALLOWED`` for root's job on a system-mode worker that does
        not allow them. A personal worker that reports no user (from before users) is not
        refused here: it checks offers itself.
    """
    if not job_user:
        return None
    name = worker.name or worker.node_id
    if job_user in worker.missing_accounts:
        return Rejection(RejectionCode.NO_ACCOUNT, "user", job_user, "no such account", worker.node_id,
                         f"no account {job_user!r} on {name}")
    if worker.mode == SYSTEM:
        if job_user == "root" and not worker.allow_root_jobs:
            return Rejection(RejectionCode.ROOT_JOBS_NOT_ALLOWED, "user", job_user, "root jobs not allowed",
                             worker.node_id, f"{name} does not run root's jobs (allow_root_jobs is off)")
        return None
    if worker.user and worker.user != job_user:
        return Rejection(RejectionCode.OTHER_USERS_WORKER, "user", job_user, f"{worker.user}'s personal worker",
                         worker.node_id, f"gpulayerd on {name} runs only {worker.user}'s jobs")
    return None
