"""The account a job runs as: looked up in the user database, written to ``launch.json``.

:func:`lookup_user` gives a :class:`JobUser` (name, uid, gid, supplementary groups, home,
shell) from ``pwd`` and ``os.getgrouplist``; the per-job watchdog switches to it right
before ``exec`` (``subprocess.Popen(user=, group=, extra_groups=)``: setgroups, setgid,
setuid in the child) after :func:`check_still_maps` confirmed that the uid still names the
same account. These calls read ``/etc/passwd`` (or NSS: LDAP, sssd) and may block: never on
the event loop.

Standard library only: the watchdog imports this module.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["JobUser", "check_still_maps", "lookup_user", "this_user"]


@dataclass(frozen=True, slots=True)
class JobUser:
    """A local account a job runs as.

    Attributes:
        name: the user name (``pw_name``).
        uid: its user id.
        gid: its primary group id.
        groups: every group id it belongs to, primary first (``os.getgrouplist``).
        home: its home directory (``pw_dir``).
        shell: its login shell (``pw_shell``; ``/bin/sh`` when the database has none).
    """

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    def to_json(self) -> dict[str, object]:
        """The ``user`` object of ``launch.json``."""
        return {"name": self.name, "uid": self.uid, "gid": self.gid, "groups": list(self.groups),
                "home": self.home, "shell": self.shell}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> JobUser:
        """Read the ``user`` object of ``launch.json``.

        Raises:
            ValueError: a field is missing or of the wrong type (the message names it).
        """
        name, home, shell = data.get("name"), data.get("home"), data.get("shell")
        uid, gid, groups = data.get("uid"), data.get("gid"), data.get("groups")
        for key, value in (("name", name), ("home", home), ("shell", shell)):
            if not isinstance(value, str):
                raise ValueError(f"user.{key} must be a string, not {value!r}")
        for key, value in (("uid", uid), ("gid", gid)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"user.{key} must be a non-negative integer, not {value!r}")
        if not isinstance(groups, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in groups):
            raise ValueError(f"user.groups must be a list of integers, not {groups!r}")
        assert isinstance(name, str) and isinstance(home, str) and isinstance(shell, str)
        assert isinstance(uid, int) and isinstance(gid, int)
        return cls(name=name, uid=uid, gid=gid, groups=tuple(groups), home=home, shell=shell)


def lookup_user(name: str) -> JobUser:
    """The account ``name`` from the user database (blocking: NSS may ask a server).

    Raises:
        LookupError: there is no account of that name on this machine.
    """
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise LookupError(f"no account {name!r} on this machine") from None
    return _from_pw(pw)


def this_user() -> JobUser:
    """The account this process runs as (its effective uid).

    Raises:
        LookupError: the uid has no entry in the user database (a container's bare uid).
    """
    uid = os.geteuid()
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise LookupError(f"uid {uid} has no account in the user database") from None
    return _from_pw(pw)


def check_still_maps(user: JobUser) -> str | None:
    """Right before a start: None if ``user.uid`` is still the account ``user.name``, else why not.

    An account removed, or its uid given to another name, between the daemon's lookup and the
    start must not run the job under whoever holds the uid now.
    """
    try:
        pw = pwd.getpwuid(user.uid)
    except KeyError:
        return f"account {user.name!r} (uid {user.uid}) no longer exists on this machine"
    if pw.pw_name != user.name:
        return f"uid {user.uid} is now account {pw.pw_name!r}, not {user.name!r}: not starting the job"
    return None


def _from_pw(pw: pwd.struct_passwd) -> JobUser:
    groups = dict.fromkeys([pw.pw_gid, *os.getgrouplist(pw.pw_name, pw.pw_gid)])
    return JobUser(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, groups=tuple(groups), home=pw.pw_dir,
                   shell=pw.pw_shell or "/bin/sh")
