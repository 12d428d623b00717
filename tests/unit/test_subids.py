"""Subordinate uids count for their owner at the local socket (issue 24 review: one account mapped
16 uids of its /etc/subuid range in a user namespace and took every unprivileged connection slot)."""

from __future__ import annotations

from pathlib import Path

from gpulayerd.api.unixsite import LocalLimits, LocalSocketSettings
from gpulayerd.host.subids import SubordinateIds


def test_ranges_are_read_and_each_uid_counts_for_its_owner(tmp_path: Path) -> None:
    f = tmp_path / "subuid"
    f.write_text("1001:100000:65536\nroot:300000:10\nnobody-such-user:400000:5\ngarbage\n1002:100010:5\n"
                 "1003:200000:65536\n")
    ids = SubordinateIds.load(f)
    assert ids.ranges == ((100000, 65536, 1001), (200000, 65536, 1003), (300000, 10, 0))  # overlap dropped
    assert [ids.owner_of(u) for u in (100000, 165535, 165536, 200001, 300009, 300010, 1001, 5)] == \
        [1001, 1001, 165536, 1003, 0, 300010, 1001, 5]
    assert SubordinateIds.load(tmp_path / "missing").owner_of(100000) == 100000


def test_one_account_appearing_as_many_subordinate_uids_gets_one_share(tmp_path: Path) -> None:
    f = tmp_path / "subuid"
    f.write_text("2001:100000:65536\n")
    ids = SubordinateIds.load(f)
    limits = LocalLimits(LocalSocketSettings(max_connections=100, max_per_user=4, reserved=4,
                                             privileged=lambda uid: uid == 0, account_of=ids.owner_of))
    taken = [limits.try_open(limits.settings.account_of(100000 + i)) for i in range(16)]
    assert taken.count(None) == 4 and limits.open_for(2001) == 4  # the 16 uids share the owner's 4
    assert limits.try_open(limits.settings.account_of(2002)) is None  # another account is served
