"""CappedLog: a job's stream copied from its pipe, cut at the cap with one marker line."""

from __future__ import annotations

import os
from pathlib import Path

from gpulayerd.runs.logcopy import CappedLog


def test_everything_under_the_cap_is_kept(tmp_path: Path) -> None:
    r, w = os.pipe()
    log = CappedLog(r, tmp_path / "out.log", 100)
    os.write(w, b"hello\n")
    log.pump()
    os.write(w, b"world\n")
    os.close(w)
    log.close()
    assert (tmp_path / "out.log").read_bytes() == b"hello\nworld\n"
    assert not log.capped


def test_past_the_cap_the_rest_is_dropped_and_one_line_says_so(tmp_path: Path) -> None:
    r, w = os.pipe()
    log = CappedLog(r, tmp_path / "out.log", 10)
    os.write(w, b"12345678")
    log.pump()
    os.write(w, b"abcdef")
    log.pump()
    os.write(w, b"more and more\n")
    os.close(w)
    log.close()
    assert (tmp_path / "out.log").read_bytes() == b"12345678ab\n[gpulayer: log capped at 10 bytes]\n"
    assert log.capped and not log.open


def test_a_cut_on_a_line_end_adds_no_blank_line_and_no_cap_keeps_all(tmp_path: Path) -> None:
    r, w = os.pipe()
    log = CappedLog(r, tmp_path / "a.log", 4)
    os.write(w, b"abc\nd")
    os.close(w)
    log.close()
    assert (tmp_path / "a.log").read_bytes() == b"abc\n[gpulayer: log capped at 4 bytes]\n"
    r, w = os.pipe()
    log = CappedLog(r, tmp_path / "b.log", None)
    os.write(w, b"x" * 50_000)
    os.close(w)
    log.close()
    assert (tmp_path / "b.log").read_bytes() == b"x" * 50_000


def test_a_log_that_cannot_be_written_drops_the_output_and_keeps_reading(tmp_path: Path) -> None:
    r, w = os.pipe()
    log = CappedLog(r, Path("/dev/full"), None)  # every write: ENOSPC
    os.write(w, b"x" * 60_000)
    log.pump()  # no exception: the job's output is read and dropped
    os.write(w, b"tail\n")
    os.close(w)
    log.close()
    assert (log.dropped, log.open) == (60_005, False)


def test_a_stream_with_no_output_makes_no_file(tmp_path: Path) -> None:
    r, w = os.pipe()
    log = CappedLog(r, tmp_path / "out.log", 100)
    log.pump()
    os.close(w)
    log.close()
    assert not (tmp_path / "out.log").exists() and not log.open


def test_a_log_that_cannot_be_created_yet_is_created_later_with_the_gap_marked(tmp_path: Path) -> None:
    r, w = os.pipe()
    path = tmp_path / "later" / "out.log"  # its directory is missing: the first output cannot be kept
    log = CappedLog(r, path, None)
    os.write(w, b"lost\n")
    log.pump()
    assert not path.exists() and log.dropped == 5
    path.parent.mkdir()
    os.write(w, b"kept\n")
    os.close(w)
    log.close()
    assert path.read_bytes().decode() == "[gpulayer: 5 bytes of output dropped: No such file or directory]\nkept\n"
