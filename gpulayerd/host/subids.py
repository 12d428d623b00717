"""Subordinate user ids (``/etc/subuid``): the uid ranges an account may map in a user namespace
(``newuidmap``). A process in such a namespace connects with one of those uids: the local socket
charges its connections to the account that owns the range, so one account cannot take every
connection slot by appearing as many uids.
"""

from __future__ import annotations

import bisect
import pwd
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUBUID_FILE", "SubordinateIds"]

SUBUID_FILE = Path("/etc/subuid")


@dataclass(frozen=True)
class SubordinateIds:
    """Sorted, non-overlapping ranges ``(first uid, count, owner uid)``."""

    ranges: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def load(cls, path: Path = SUBUID_FILE) -> SubordinateIds:
        """Read ``path`` (``NAME_OR_UID:FIRST:COUNT`` per line). Blocking (the user database may be
        LDAP): call in a thread. A missing or unreadable file, a line that does not parse or an owner
        that does not resolve is skipped."""
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return cls()
        ranges: list[tuple[int, int, int]] = []
        for line in text.splitlines():
            owner, _, rest = line.strip().partition(":")
            first, _, count = rest.partition(":")
            try:
                start, n = int(first), int(count)
                uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
            except (ValueError, KeyError):
                continue
            if n > 0 and start >= 0:
                ranges.append((start, n, uid))
        ranges.sort()
        kept: list[tuple[int, int, int]] = []
        for r in ranges:  # an overlapping range (a broken file) is dropped, not merged
            if not kept or r[0] >= kept[-1][0] + kept[-1][1]:
                kept.append(r)
        return cls(tuple(kept))

    def owner_of(self, uid: int) -> int:
        """The account ``uid`` counts as: the owner of the subordinate range it is in, else itself."""
        i = bisect.bisect_right(self.ranges, (uid, float("inf"), 0)) - 1
        if i >= 0:
            start, n, owner = self.ranges[i]
            if start <= uid < start + n:
                return owner
        return uid
