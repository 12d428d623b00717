"""The one atomic-write helper: content, mode, no temporary files left, failures clean up."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpulayerd.host.atomic import create_exclusive, write_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_atomic_writes_bytes_and_text_with_mode(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    write_atomic(target, b"one")
    assert target.read_bytes() == b"one"
    assert _mode(target) == 0o600
    write_atomic(target, "twö\n", mode=0o644)
    assert target.read_text(encoding="utf-8") == "twö\n"
    assert _mode(target) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_write_atomic_mode_is_not_cut_by_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "f", "x", mode=0o644)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == 0o644


def test_write_atomic_failure_keeps_old_file_and_removes_temporary(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()  # os.replace of a file over a directory fails
    (target / "inside").write_text("keep")
    with pytest.raises(OSError):
        write_atomic(target, "new")
    assert (target / "inside").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_write_atomic_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "f", "x")


def test_create_exclusive_creates_once(tmp_path: Path) -> None:
    target = tmp_path / "token"
    assert create_exclusive(target, "first") is True
    assert create_exclusive(target, "second") is False
    assert target.read_text() == "first"
    assert _mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]
