"""``metrics_token_file``: what is checked is what is read (no link followed), and only a file its owner keeps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulayerd.config import read_token

TOKEN = "s3cret-token-of-32-characters-xx"


def _token(tmp_path: Path, mode: int = 0o640) -> Path:
    path = tmp_path / "metrics.token"
    path.write_text(TOKEN + "\n")
    os.chmod(path, mode)
    return path


def test_a_kept_token_is_read_stripped(tmp_path: Path) -> None:
    assert read_token(_token(tmp_path)) == TOKEN


def test_a_link_to_a_good_token_is_refused_not_followed(tmp_path: Path) -> None:
    link = tmp_path / "link.token"
    link.symlink_to(_token(tmp_path))
    with pytest.raises(ValueError, match=r"metrics_token_file: .*link\.token: is a symbolic link"):
        read_token(link)


@pytest.mark.parametrize(("mode", "match"), [(0o644, "has mode 0644"), (0o660, "has mode 0660")])
def test_others_may_read_or_the_group_may_write_refused(tmp_path: Path, mode: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        read_token(_token(tmp_path, mode))


def test_a_token_owned_by_another_account_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (CI does): it gives the file to another uid")
    path = _token(tmp_path)
    os.chown(path, 4242, 0)
    with pytest.raises(ValueError, match="owned by uid 4242; it must be owned by root"):
        read_token(path)


def test_a_short_token_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc")
    os.chmod(short, 0o600)
    with pytest.raises(ValueError, match="no token of at least 16 characters"):
        read_token(short)
    with pytest.raises(ValueError, match="is not a regular file"):
        read_token(tmp_path)
    with pytest.raises(ValueError, match=r"metrics_token_file: .*missing"):
        read_token(tmp_path / "missing")
