"""Whether this worker may run a peer's job as its user, and which accounts it lacks.

A worker runs a job only as the local account of the job's user name (DESIGN §9). That the
sender vouches for the name (:func:`gpulayerd.core.users.vouches`: a system-mode node for
anyone, a personal-mode node only for the user its certificate is bound to) is the offer's and
the hold's role, checked before the handler (:mod:`gpulayerd.app.roles`). Then, before it
keeps an offer or places a gang hold, :meth:`Accounts.refusal` checks:

1. this worker may run that user's jobs (a personal worker runs only its own user's
   jobs; a system worker runs root's only with ``allow_root_jobs``);
2. the account exists here (``pwd.getpwnam`` in a thread, answers cached for
   ``lookup_ttl_s``).

A job that names no user (from an owner older than users) is the sender's bound user's
job when the sender is a personal node, and refused from any other sender.

Names found missing are remembered (at most :data:`MAX_MISSING`, each for
``missing_ttl_s`` after it was last asked for, so an account created later is seen) and
advertised as the worker's ``missing_accounts``: owners' matchers then show "no account
'alice' on ws-3" and stop offering her jobs here.
"""

from __future__ import annotations

import asyncio
import os
import pwd
from collections.abc import Callable, Mapping

from gpulayerd.app.common.clock import Clock
from gpulayerd.core.users import PERSONAL, SYSTEM

__all__ = ["MAX_MISSING", "Accounts", "own_account"]

MAX_MISSING = 256
"""At most this many missing account names are remembered (the oldest go first)."""

_NONE: frozenset[str] = frozenset()


def own_account() -> str:
    """The name of this process's effective user ("" if the uid has no entry). Blocking: call at start-up."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return ""


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


class Accounts:
    """This worker's account rules for peers' jobs (see the module docstring).

    Args:
        clock: monotonic time for the caches.
        mode: this worker's mode (``personal``/``system``).
        user: this worker's own account (a personal worker runs only its jobs).
        allow_root_jobs: a system worker runs root's jobs.
        lookup_ttl_s: how long an answer of the user database is reused, seconds.
        missing_ttl_s: how long a missing name stays advertised after it was last asked for, seconds.
        exists: the account lookup (blocking; run in a thread), for tests.
    """

    def __init__(self, clock: Clock, *, mode: str, user: str, allow_root_jobs: bool = False,
                 lookup_ttl_s: float = 60.0, missing_ttl_s: float = 600.0,
                 exists: Callable[[str], bool] = _exists) -> None:
        if mode not in (PERSONAL, SYSTEM):
            raise ValueError(f"mode {mode!r}: use personal or system")
        self._clock = clock
        self.mode = mode
        self.user = user
        self.allow_root_jobs = allow_root_jobs
        self._lookup_ttl_s = lookup_ttl_s
        self._missing_ttl_s = missing_ttl_s
        self._exists = exists
        self._answers: dict[str, tuple[bool, float]] = {}  # name -> (exists, when)
        # What else this worker refuses of a spec (a Slurm worker: multi-node jobs, array tasks), or None.
        self.refuse_spec: Callable[[Mapping[str, object]], str | None] | None = None
        self._missing: dict[str, float] = {}  # name -> when it stops being advertised

    async def exists(self, name: str) -> bool:
        """Whether the account ``name`` exists here (looked up in a thread, cached); a missing one is remembered."""
        now = self._clock.monotonic()
        cached = self._answers.get(name)
        if cached is not None and now - cached[1] < self._lookup_ttl_s:
            found = cached[0]
        else:
            found = await asyncio.to_thread(self._exists, name)
            now = self._clock.monotonic()
            self._answers[name] = (found, now)
            if len(self._answers) > 4 * MAX_MISSING:
                self._answers = {k: v for k, v in self._answers.items() if now - v[1] < self._lookup_ttl_s}
        if found:
            self._missing.pop(name, None)
        else:
            self._missing.pop(name, None)  # re-insert: the newest last
            self._missing[name] = now + self._missing_ttl_s
            while len(self._missing) > MAX_MISSING:
                del self._missing[next(iter(self._missing))]
        return found

    def missing(self) -> frozenset[str]:
        """The names asked for and found missing within ``missing_ttl_s`` (at most :data:`MAX_MISSING`)."""
        if not self._missing:  # the common case, asked at every heartbeat (the capabilities' digest)
            return _NONE
        now = self._clock.monotonic()
        for name in [n for n, until in self._missing.items() if until <= now]:
            del self._missing[name]
        return frozenset(self._missing)

    def effective_user(self, job_user: str, sender_mode: str, sender_user: str) -> str:
        """The user a job runs as: its own, or (none named) a personal sender's bound user."""
        if job_user:
            return job_user
        return sender_user if sender_mode == PERSONAL else ""

    async def refusal(self, job_user: str) -> str | None:
        """Why this worker refuses a job of ``job_user``; None if it may run it (``job_user`` as
        :meth:`effective_user` gives it; the sender's vouching was its role, checked before)."""
        if not job_user:
            return "the job names no user"
        if self.mode == PERSONAL and self.user != job_user:
            return f"this gpulayerd runs only {self.user or 'its own user'}'s jobs; the job is {job_user}'s"
        if self.mode == SYSTEM and job_user == "root" and not self.allow_root_jobs:
            return "this worker does not run root's jobs (allow_root_jobs is off)"
        if not await self.exists(job_user):
            return f"no account {job_user!r} here"
        return None

    async def vet(self, spec: Mapping[str, object], sender_mode: str,
                  sender_user: str) -> tuple[dict[str, object], str | None]:
        """Check a peer's job spec (an offer's or a hold's) before anything of it is kept.

        Returns:
            (the spec with ``user`` set to the user it runs as, None) when it may run here;
            (``spec`` unchanged, why not) otherwise.
        """
        raw = spec.get("user")
        if raw is not None and not isinstance(raw, str):
            return dict(spec), "the job's user is not a name"
        user = self.effective_user(raw or "", sender_mode, sender_user)
        why = await self.refusal(user) or (self.refuse_spec(spec) if self.refuse_spec is not None else None)
        if why is not None:
            return dict(spec), why
        return {**spec, "user": user}, None
