"""app/common/logread.py: a window of a log by byte offset and limit, cut on whole UTF-8 characters."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayerd.app.common.logread import LOG_CHUNK_BYTES, read_log


@pytest.mark.asyncio
async def test_a_window_is_limit_bytes_from_offset_and_says_the_size(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(1, 1001)))
    size = log.stat().st_size
    last = await read_log(log, "j1", 1, "stdout", size - 10, finished=True, limit=8)
    assert (last.data, last.offset, last.next_offset, last.size, last.complete) == ("line 100", size - 10,
                                                                                    size - 2, size, False)
    window = await read_log(log, "j1", 1, "stdout", size - 10, finished=True, limit=10)
    assert (window.data, window.next_offset, window.size, window.complete) == ("line 1000\n", size, size, True)
    start = await read_log(log, "j1", 1, "stdout", 0, finished=False, limit=14)
    assert (start.data, start.next_offset, start.complete) == ("line 1\nline 2\n", 14, False)
    whole = await read_log(log, "j1", 1, "stdout", 0, finished=False)
    assert whole.next_offset == size and len(whole.data) == size  # no limit: up to LOG_CHUNK_BYTES
    big = await read_log(log, "j1", 1, "stdout", 0, finished=False, limit=LOG_CHUNK_BYTES * 4)
    assert big.next_offset == size


@pytest.mark.asyncio
async def test_a_limit_never_cuts_a_character(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes("日本\n".encode())  # 3 + 3 + 1 bytes
    cut = await read_log(log, "j1", 1, "stdout", 0, finished=False, limit=4)
    assert (cut.data, cut.next_offset) == ("日", 3)
    short = await read_log(log, "j1", 1, "stdout", 3, finished=False, limit=1)  # shorter than the character
    assert (short.data, short.next_offset) == ("本", 6)


@pytest.mark.asyncio
async def test_an_offset_past_the_end_reads_nothing(tmp_path: Path) -> None:
    """An offset the file system cannot seek to (ext4: past 16 TiB; the API takes up to 2**62) was an OSError
    (EINVAL) and a 500 with a traceback in the daemon's log: it is an empty chunk at the end."""
    log = tmp_path / "stdout.log"
    log.write_bytes(b"line\n")
    for offset in (2**62, 10**14, 6):
        chunk = await read_log(log, "j1", 1, "stdout", offset, finished=True, limit=10)
        assert (chunk.data, chunk.next_offset, chunk.size, chunk.complete) == ("", offset, 5, True), offset
