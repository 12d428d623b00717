"""Machine-wide device locks, across real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpulayerd.runs.devicelock import DeviceLockError, DeviceLocks

REPO_ROOT = Path(__file__).resolve().parents[3]

OTHER_DAEMON = """
import json, sys
from pathlib import Path
from gpulayerd.runs.devicelock import DeviceLocks
locks = DeviceLocks(Path(sys.argv[1]))
out = {}
for uuid in sys.argv[2:]:
    fds = locks.try_acquire([uuid])
    out[uuid] = {"acquired": fds is not None, "locked_elsewhere": locks.is_locked_elsewhere(uuid)}
print(json.dumps(out))
"""


def other_process(lock_dir: Path, uuids: Sequence[str]) -> dict[str, dict[str, bool]]:
    """What another process (another user's daemon) sees for each uuid, each tried on its own."""
    result = subprocess.run(
        [sys.executable, "-c", OTHER_DAEMON, str(lock_dir), *uuids],
        capture_output=True, text=True, check=True, timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    data: dict[str, dict[str, bool]] = json.loads(result.stdout)
    return data


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture
def locks(tmp_path: Path) -> Iterator[DeviceLocks]:
    yield DeviceLocks(tmp_path / "locks")


def test_another_process_cannot_take_a_held_device_but_can_take_another(
    locks: DeviceLocks, tmp_path: Path
) -> None:
    fds = locks.try_acquire(["GPU-aaa"])
    assert fds is not None and len(fds) == 1
    try:
        seen = other_process(tmp_path / "locks", ["GPU-aaa", "GPU-bbb"])
        assert seen["GPU-aaa"] == {"acquired": False, "locked_elsewhere": True}
        # GPU-bbb was free; the other process held it only until it exited.
        assert seen["GPU-bbb"]["acquired"] is True
        assert not locks.is_locked_elsewhere("GPU-bbb")
    finally:
        locks.release(fds)
    assert other_process(tmp_path / "locks", ["GPU-aaa"])["GPU-aaa"]["acquired"] is True


def test_a_lock_passed_to_a_child_lives_until_the_child_exits(locks: DeviceLocks, tmp_path: Path) -> None:
    fds = locks.try_acquire(["GPU-aaa"])
    assert fds is not None
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                          stdin=subprocess.PIPE, pass_fds=fds) as child:
        locks.release(fds)  # the parent closes its copy: the child's copy still holds the lock
        try:
            assert other_process(tmp_path / "locks", ["GPU-aaa"])["GPU-aaa"]["acquired"] is False
            assert locks.is_locked_elsewhere("GPU-aaa")
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=10)
    assert child.returncode == 0
    assert not locks.is_locked_elsewhere("GPU-aaa")
    assert other_process(tmp_path / "locks", ["GPU-aaa"])["GPU-aaa"]["acquired"] is True


def test_all_or_nothing_releases_what_it_took(locks: DeviceLocks) -> None:
    held = locks.try_acquire(["GPU-bbb"])
    assert held is not None
    before = open_fds()
    assert locks.try_acquire(["GPU-aaa", "GPU-bbb", "GPU-ccc"]) is None
    assert open_fds() == before  # nothing leaked
    assert not locks.is_locked_elsewhere("GPU-aaa")
    assert not locks.is_locked_elsewhere("GPU-ccc")
    assert locks.is_locked_elsewhere("GPU-bbb")
    both = locks.try_acquire(["GPU-aaa", "GPU-ccc"])
    assert both is not None and len(both) == 2
    locks.release([*held, *both])
    assert not any(locks.is_locked_elsewhere(u) for u in ["GPU-aaa", "GPU-bbb", "GPU-ccc"])


def test_a_uuid_given_twice_is_locked_once(locks: DeviceLocks) -> None:
    fds = locks.try_acquire(["GPU-aaa", "GPU-aaa"])
    assert fds is not None and len(fds) == 1
    locks.release(fds)


def test_the_same_process_cannot_take_a_device_twice(locks: DeviceLocks) -> None:
    fds = locks.try_acquire(["GPU-aaa"])
    assert fds is not None
    assert locks.try_acquire(["GPU-aaa"]) is None  # one daemon, two jobs: still exclusive
    locks.release(fds)


def test_lock_dir_and_files_are_shared_whatever_the_umask(tmp_path: Path) -> None:
    lock_dir = tmp_path / "shared" / "locks"
    old_umask = os.umask(0o077)
    try:
        fds = DeviceLocks(lock_dir).try_acquire(["GPU-aaa"])
    finally:
        os.umask(old_umask)
    assert fds is not None
    DeviceLocks(lock_dir).release(fds)
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777
    assert stat.S_IMODE((lock_dir / "GPU-aaa.lock").stat().st_mode) == 0o666


def test_an_existing_lock_dir_is_left_as_it_is(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir(mode=0o755)
    lock_dir.chmod(0o755)
    assert not DeviceLocks(lock_dir).is_locked_elsewhere("GPU-aaa")
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o755


@pytest.mark.parametrize(
    ("uuid", "name"),
    [
        ("GPU-8f3a2c1e-0000-1111-2222-333344445555", "GPU-8f3a2c1e-0000-1111-2222-333344445555.lock"),
        ("MIG-GPU-abc/1/0", "MIG-GPU-abc_1_0.lock"),
        ("../../etc/passwd", ".._.._etc_passwd.lock"),
    ],
)
def test_lock_file_names_stay_inside_the_lock_dir(locks: DeviceLocks, tmp_path: Path, uuid: str, name: str) -> None:
    path = locks.path_for(uuid)
    assert path == tmp_path / "locks" / name


def test_unusual_uuids_get_distinct_safe_names(locks: DeviceLocks, tmp_path: Path) -> None:
    uuids = ["..", ".", "", "x" * 500, "x" * 501]
    paths = [locks.path_for(u) for u in uuids]
    assert len({p.name for p in paths}) == len(uuids)
    assert all(p.parent == tmp_path / "locks" and len(p.name) < 200 for p in paths)
    fds = locks.try_acquire([".."])
    assert fds is not None
    locks.release(fds)


def test_a_symlink_planted_as_lock_file_is_refused(locks: DeviceLocks, tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    target = tmp_path / "victim"
    target.write_text("keep")
    (lock_dir / "GPU-aaa.lock").symlink_to(target)
    with pytest.raises(DeviceLockError, match="cannot open lock file"):
        locks.try_acquire(["GPU-aaa"])
    assert target.read_text() == "keep"
