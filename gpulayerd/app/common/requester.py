"""Who is asking the local API, and what they may do to a job.

Every request on the local unix socket is made by a process the kernel can name:
:func:`peer_credentials` reads its pid, uid and gid from the socket (``SO_PEERCRED`` on
Linux, ``LOCAL_PEERCRED``/``LOCAL_PEERPID`` on macOS and FreeBSD), never from the request
body. :class:`Requesters` turns those into a :class:`Requester` (user name, groups, admin or
not) with the user database, in a thread and cached, and refuses other accounts than its
own in personal mode.

The rules (pure): everyone sees every job's id, name, user, state, place and reason; the
job's command, environment, workdir and PATH, its logs and cancelling it are for the job's
user and admins only (:meth:`Requester.may_manage`, :func:`conceal`, :func:`forbid`).
Admins are root, members of the configured admin group (system mode), and in personal
mode the daemon's own user.

This module sits beside :mod:`gpulayerd.api` and :mod:`gpulayerd.app` (both import it).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import pwd
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from pydantic import BaseModel

from gpulayerd.core.job_facts import job_user as user_of
from gpulayerd.core.users import may_manage
from gpulayerd.errors import Forbidden
from gpulayerd.models import JobView

__all__ = [
    "DEFAULT_JOB_PATH",
    "HIDDEN",
    "PeerCredentials",
    "Requester",
    "Requesters",
    "conceal",
    "hide_path",
    "job_user",
    "peer_credentials",
]

DEFAULT_JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A job's ``PATH`` when the submitter sent none (a raw API client rather than ``gpulayer``)."""

HIDDEN = "<hidden>"
"""What a concealed job's ``spec.command`` holds (see :func:`conceal`)."""

_CACHE_TTL_S = 30.0


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The connecting process as the kernel names it.

    Attributes:
        uid: its effective user id.
        gid: its effective group id (None where the platform does not say).
        pid: its process id (None where the platform does not say).
    """

    uid: int
    gid: int | None = None
    pid: int | None = None


def peer_credentials(sock: object) -> PeerCredentials | None:
    """The credentials of the process at the other end of the unix socket ``sock``.

    ``sock`` is a :class:`socket.socket` or asyncio's ``TransportSocket`` (anything with
    ``family`` and ``getsockopt``). Non-blocking (one ``getsockopt``).

    Returns:
        None when ``sock`` is not a unix socket, or the platform gives no peer credentials.
    """
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    getsockopt = getattr(sock, "getsockopt", None)
    if getsockopt is None:
        return None
    try:
        if sys.platform.startswith("linux"):
            fmt = "3i"  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
            pid, uid, gid = struct.unpack(fmt, getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize(fmt)))
            return PeerCredentials(uid=uid, gid=gid, pid=pid or None)
        if sys.platform == "darwin" or sys.platform.startswith("freebsd"):
            return _local_peercred(getsockopt)
    except OSError:
        return None
    return None


def _local_peercred(getsockopt: Callable[..., bytes]) -> PeerCredentials:
    """macOS / FreeBSD: ``struct xucred`` of ``LOCAL_PEERCRED`` (and ``LOCAL_PEERPID`` on macOS)."""
    sol_local = 0  # SOL_LOCAL
    local_peercred = int(getattr(socket, "LOCAL_PEERCRED", 0x001))
    fmt = "IIh16I"  # {u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16];}
    raw = getsockopt(sol_local, local_peercred, struct.calcsize(fmt))
    fields = struct.unpack(fmt, raw[:struct.calcsize(fmt)])
    uid, ngroups, groups = fields[1], fields[2], fields[3:]
    pid: int | None = None
    if sys.platform == "darwin":
        try:
            pid = struct.unpack("i", getsockopt(sol_local, 0x002, struct.calcsize("i")))[0]  # LOCAL_PEERPID
        except OSError:
            pid = None
    return PeerCredentials(uid=uid, gid=groups[0] if ngroups > 0 else None, pid=pid)


@dataclass(frozen=True, slots=True)
class Requester:
    """Who made a request of the local API.

    Attributes:
        uid: the kernel's user id of the asking process.
        user: its user name (``"uid N"`` when the user database has no name for it).
        gids: every group id of the account (primary first, ``os.getgrouplist``).
        admin: may cancel any job and read any job's logs and spec (root; a member of the
            admin group in system mode; the daemon's own user in personal mode).
        pid: the asking process, when the kernel says.
    """

    uid: int
    user: str
    gids: tuple[int, ...] = ()
    admin: bool = False
    pid: int | None = None

    def may_manage(self, owner_user: str) -> bool:
        """True if this requester may cancel, read the logs and see the full spec of a job of ``owner_user``."""
        return may_manage(self.user, self.admin, owner_user)


def job_user(job: JobView) -> str:
    """The user a job belongs to (:func:`gpulayerd.core.job_facts.job_user` of its view)."""
    return user_of(job.spec.user, job.submitted_by)


def conceal(job: JobView, requester: Requester | None) -> JobView:
    """``job`` as ``requester`` may see it (see :class:`~gpulayerd.models.JobView`'s ``spec_hidden``).

    The job's user and admins (and None, the daemon itself) get it unchanged. Anyone else
    gets it with ``spec_hidden=True`` and a spec that keeps ``name``, ``requirements``,
    ``distributed``, ``policy`` and ``user``; ``command`` is ``[HIDDEN]``, ``env`` is empty,
    ``workdir`` and ``path`` are None.
    """
    if requester is None or job.spec_hidden or requester.may_manage(job_user(job)):
        return job
    spec = job.spec.model_copy(update={"command": [HIDDEN], "env": {}, "workdir": None, "path": None})
    hidden = job.model_copy(update={"spec": spec, "spec_hidden": True})
    # The workdir also shows in the reason, the stored explanation and event reasons: hide it there too.
    return hide_path(hidden, job.spec.workdir)


_M = TypeVar("_M", bound=BaseModel)


def hide_path(model: _M, path: str | None) -> _M:
    """``model`` with every occurrence of ``path`` (a job's workdir, which only its user and admins
    see) in its text written ``<hidden>``; ``model`` itself when the path is not in it (or is "/")."""
    if not path or path == "/":
        return model
    dumped, escaped = model.model_dump_json(), json.dumps(path)[1:-1]
    return type(model).model_validate_json(dumped.replace(escaped, HIDDEN)) if escaped in dumped else model


class Requesters:
    """Turns peer credentials into :class:`Requester` values: user database lookups in a thread, cached.

    Args:
        mode: ``personal`` (only the daemon's own account is served) or ``system``.
        admin_group: name of the group whose members are admins (system mode).
        daemon_uid: the daemon's own uid (default: ``os.getuid()``).
        ttl_s: how long a lookup is reused, seconds (group changes show after at most this long).
        monotonic: the clock of the cache (seconds).
    """

    def __init__(self, *, mode: Literal["personal", "system"], admin_group: str, daemon_uid: int | None = None,
                 ttl_s: float = _CACHE_TTL_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        if mode not in ("personal", "system"):
            raise ValueError(f"mode must be one of: personal, system (got {mode!r})")
        self.mode = mode
        self.admin_group = admin_group
        self.daemon_uid = os.getuid() if daemon_uid is None else daemon_uid
        self._ttl_s = ttl_s
        self._monotonic = monotonic
        self._cache: dict[int, tuple[float, Requester]] = {}
        self._admins: dict[str, tuple[float, bool]] = {}  # user name -> (until, admin here)

    async def resolve(self, creds: PeerCredentials) -> Requester:
        """The requester behind ``creds``.

        Raises:
            Forbidden: personal mode and ``creds.uid`` is not the daemon's own uid
                (``this gpulayerd serves only <user>``), root included unless the daemon runs as root.
        """
        if self.mode == "personal" and creds.uid != self.daemon_uid:
            me = await self._lookup(self.daemon_uid)
            raise Forbidden(f"this gpulayerd serves only {me.user} (a personal daemon); uid {creds.uid} "
                            "is another account: use that account's own gpulayerd, or a system-mode one")
        found = await self._lookup(creds.uid)
        return Requester(uid=found.uid, user=found.user, gids=found.gids, admin=found.admin, pid=creds.pid)

    async def _lookup(self, uid: int) -> Requester:
        now = self._monotonic()
        hit = self._cache.get(uid)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await asyncio.to_thread(self.lookup, uid)
        self._cache[uid] = (now + self._ttl_s, found)
        return found

    def lookup(self, uid: int) -> Requester:
        """The account of ``uid`` from the user database (blocking: NSS may ask a server)."""
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return Requester(uid=uid, user=f"uid {uid}", admin=uid == 0 or self._own(uid))
        try:
            gids = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            gids = (pw.pw_gid,)
        return Requester(uid=uid, user=pw.pw_name, gids=gids, admin=uid == 0 or self._own(uid) or self._in_admin(gids))

    async def admin_by_name(self, name: str) -> bool:
        """Whether the account ``name`` is an admin HERE (a request relayed by a peer names its user by
        name): root, or a member of ``admin_group`` in system mode; never in personal mode (there the
        admin is the daemon's own user, who asks locally). Looked up in a thread, cached."""
        if self.mode != "system" or not name:
            return False
        now = self._monotonic()
        hit = self._admins.get(name)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await asyncio.to_thread(self._admin_by_name, name)
        if len(self._admins) > 1024:
            self._admins.clear()
        self._admins[name] = (now + self._ttl_s, found)
        return found

    def _admin_by_name(self, name: str) -> bool:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            return False
        if pw.pw_uid == 0:
            return True
        try:
            gids = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            gids = (pw.pw_gid,)
        return self._in_admin(gids)

    def admin_uids(self) -> frozenset[int]:
        """The uids that are admins here besides root: the daemon's own in personal mode; the members of
        ``admin_group`` (listed in it, or with it as their primary group) in system mode. Blocking
        (the user and group databases): call it in a thread."""
        if self.mode == "personal":
            return frozenset({self.daemon_uid})
        if not self.admin_group:
            return frozenset()
        try:
            group = grp.getgrnam(self.admin_group)
        except KeyError:
            return frozenset()
        uids = set()
        for name in group.gr_mem:
            with contextlib.suppress(KeyError):
                uids.add(pwd.getpwnam(name).pw_uid)
        with contextlib.suppress(OSError):
            uids.update(pw.pw_uid for pw in pwd.getpwall() if pw.pw_gid == group.gr_gid)
        return frozenset(uids)

    def _own(self, uid: int) -> bool:
        return self.mode == "personal" and uid == self.daemon_uid

    def _in_admin(self, gids: tuple[int, ...]) -> bool:
        if self.mode != "system" or not self.admin_group:
            return False
        try:
            return grp.getgrnam(self.admin_group).gr_gid in gids
        except KeyError:
            return False
