"""LogPages without a screen: reads by offset and limit, lines across reads, ``\\r`` and escapes cut between
reads while following, lines longer than a read, and the far side forgotten."""

from __future__ import annotations

import pytest

from gpulayer_tui.log_pages import READ_BYTES, LogPages
from gpulayerd.app.common.logread import whole_chars
from gpulayerd.models import LogChunk
from gpulayerd.termsafe import LONG_LINE


class Log:
    """A growing log answered like the daemon's log API, counting the bytes it serves."""

    def __init__(self, data: bytes = b"", *, ended: bool = False) -> None:
        self.data, self.ended, self.served = data, ended, 0

    async def read(self, offset: int, limit: int) -> LogChunk:
        part = whole_chars(self.data[offset:offset + limit])
        self.served += len(part)
        nxt = offset + len(part)
        return LogChunk(job_id="j", attempt=1, stream="stdout", offset=offset, next_offset=nxt,
                        data=part.decode(errors="replace"), complete=self.ended and nxt >= len(self.data),
                        size=len(self.data))


@pytest.mark.asyncio
async def test_progress_written_in_pieces_shows_one_line_in_its_last_state() -> None:
    log = Log(b"epoch 1\n")
    pages = LogPages(log.read, read_bytes=64)
    pages.resize(5)
    await pages.open_end()
    states = [f"{n * 10:>3}%|{'#' * (n // 3):<4}| \x1b[32m{n:>2}/10\x1b[0m" for n in range(1, 11)]
    written = ("\r" + "\r".join(states) + "\n\x1b]2;title\x07done\n").encode()
    for cut in range(0, len(written), 5):  # escapes and \r\n cut between reads
        log.data += written[cut:cut + 5]
        await pages.poll()
    assert [pages.plain(i) for i in range(len(pages.lines))] == ["epoch 1", "100%|### | 10/10", "done"]
    assert pages.lines[1] == "100%|### | \x1b[0;32m10/10\x1b[0m"  # the colour kept, as a style of its cells
    assert pages.following and pages.shown == pages.lines


@pytest.mark.asyncio
async def test_a_log_opens_at_its_end_with_lines_longer_than_a_read_and_forgets_the_far_side() -> None:
    lines = [f"line {i}" for i in range(1, 2001)]
    lines[1500] = "x" * 300  # longer than a read
    log = Log(("\n".join(lines) + "\n").encode(), ended=True)
    pages = LogPages(log.read, read_bytes=256, keep_bytes=1024)
    pages.resize(10)
    await pages.open_end()
    assert pages.shown[-1] == "line 2000" and pages.complete
    assert log.served < 2000 and pages.end - pages.begin <= 1024 + 256
    while pages.top > 0 or pages.begin > 0:  # page up to line 1, reading as the view nears the top
        pages.scroll(-10)
        while await pages.fill():
            pass
        assert pages.end - pages.begin <= 2 * 1024  # what is far below is forgotten (margins kept)
    assert pages.shown[0] == "line 1" and not pages.following
    found = await pages.search("x" * 10)
    assert found is None and set(pages.plain(pages.top)) == {"x"}
    await pages.resume()
    assert pages.shown[-1] == "line 2000" and pages.following
    # Searching forward from the end (where a log opens) goes on from the top, and says so.
    assert await pages.search("line 7") == "found from the top: the end was reached"
    assert pages.plain(pages.top) == "line 7" and not pages.following
    assert await pages.search("no such line") == "not found"


@pytest.mark.asyncio
async def test_following_a_line_without_end_holds_it_in_pieces() -> None:
    """A job printing no newline: following it held the whole line and rendered all of it again on every
    64 KiB read (the TUI at ~90 % CPU and growing without end): it is cut once LONG_LINE long, as a terminal wraps it."""
    log = Log(b"start\n")
    pages = LogPages(log.read)
    pages.resize(10)
    await pages.open_end()
    for _ in range(40):  # 2.5 MiB of one line, read as it grows
        log.data += b"y" * READ_BYTES
        while await pages.poll():
            pass
    assert max(len(line) for line in pages.lines) <= LONG_LINE + READ_BYTES
    assert len(pages.lines) > 20 and pages.shown[-1] == "y" * len(pages.shown[-1])
    log.data += b"\x1b]2;t\x07\nEND\n"
    await pages.poll()
    assert pages.shown[-2:] == ["", "END"] and pages.following
