"""Reading an attempt's log in chunks: whole UTF-8 characters, off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from gpulayerd.models import LOG_CHUNK_BYTES, LogChunk

__all__ = ["LOG_CHUNK_BYTES", "read_log", "whole_chars"]


def whole_chars(data: bytes) -> bytes:
    """``data`` without a UTF-8 character cut at its end (the next chunk starts with it)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data  # ASCII: nothing cut
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _first_char(data: bytes) -> bytes:
    """The first UTF-8 character of ``data`` (one byte when that is no lead byte)."""
    b = data[0]
    need = 1 if b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
    return data[:need]


def _read(path: Path, offset: int, finished: bool, limit: int) -> tuple[bytes, int]:
    data, size = b"", 0
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset > size:
            return data, size  # nothing there (and ext4 cannot seek past 16 TiB: EINVAL)
        f.seek(offset)
        raw = f.read(limit)
        # Cut a character only where more may follow: a finished log ends where it ends.
        data = whole_chars(raw) if not finished or offset + len(raw) < size else raw
        if raw and not data:  # a limit shorter than the character there: that one character
            data = _first_char(raw + f.read(3))
    return data, size


async def read_log(path: Path, job_id: str, attempt: int, stream: str, offset: int, finished: bool,
                   limit: int | None = None) -> LogChunk:
    """Up to ``limit`` bytes (at most and by default :data:`LOG_CHUNK_BYTES`) of the log at ``path``
    from byte ``offset``, cut before a UTF-8 character that does not fit (but one whole character
    when ``limit`` is shorter than the character there).

    Args:
        finished: the attempt has ended (nothing more will be written): the chunk is
            ``complete`` when it reaches the end of the file.
        limit: bytes wanted, 1 or more (None: :data:`LOG_CHUNK_BYTES`).
    """
    want = LOG_CHUNK_BYTES if limit is None else max(1, min(limit, LOG_CHUNK_BYTES))
    data, size = await asyncio.to_thread(_read, path, offset, finished, want)
    nxt = offset + len(data)
    return LogChunk(job_id=job_id, attempt=attempt, stream=stream, offset=offset, next_offset=nxt,
                    data=data.decode("utf-8", errors="replace"), complete=finished and nxt >= size,
                    size=size)
