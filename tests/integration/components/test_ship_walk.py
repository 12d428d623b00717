"""What ``gpulayer submit --ship`` lists (issue 34), with a real ``git``: git's list in a work tree
(tracked and untracked files not ignored, relative to a workdir inside it), the directory elsewhere,
``gpulayer-out/`` never."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpulayerd.ship.walk import list_paths


def test_list_paths_asks_git_in_a_work_tree_and_walks_elsewhere(tmp_path: Path) -> None:
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    (repo / "src").mkdir(parents=True)
    plain.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("*.bin\n")
    (repo / "src" / "a.py").write_text("x")
    (repo / "big.bin").write_bytes(b"0")  # ignored
    (repo / "gpulayer-out").mkdir()
    (repo / "gpulayer-out" / "old.json").write_text("{}")  # never shipped
    assert list_paths(repo) == [".gitignore", "src/a.py"]
    assert list_paths(repo / "src") == ["a.py"]  # a workdir inside the work tree: relative to it
    (plain / "b.bin").write_bytes(b"1")
    assert list_paths(plain) == ["b.bin"]  # not in git: the directory (minus .gpulayerignore)
    assert list_paths(repo / ".git") is not None  # inside .git: not a work tree, walked
