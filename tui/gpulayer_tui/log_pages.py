"""A window of a job's log around the lines shown, read by byte offset from the daemon's log API.

:class:`LogPages` holds only the lines near the view: it reads :data:`READ_BYTES` at a time
(the last ones first: a log opens at its end whatever its size), reads more as the view
nears an edge of what it holds, and forgets the far side beyond :data:`KEEP_BYTES`. Lines
read backwards start on a newline; the last line of the log may be unfinished and grows as
it is followed. Every line goes through :class:`gpulayerd.termsafe.TerminalText` (SGR colour
kept, every other escape dropped, ``\\r`` overwriting the line). Searching reads on through
the API in chunks, at most :data:`SEARCH_BYTES` a time.

Byte positions are computed from the text, so after an invalid UTF-8 byte (which the daemon
sends as U+FFFD) positions within that chunk may be off by a few bytes.
"""

from __future__ import annotations

import asyncio
import bisect
import re
from collections.abc import Awaitable, Callable

from gpulayerd.models import LogChunk
from gpulayerd.termsafe import LONG_LINE, TerminalText

__all__ = ["KEEP_BYTES", "READ_BYTES", "SEARCH_BYTES", "AttemptChanged", "LogPages", "Read"]

READ_BYTES = 64 * 1024
"""Bytes asked for in one read while paging."""
KEEP_BYTES = 512 * 1024
"""Bytes of the log held around the view; the far side beyond them is forgotten."""
SEARCH_BYTES = 16 * 1024 * 1024
"""The most one search reads before it says where it stopped."""
SEARCH_READ_BYTES = 1024 * 1024
"""Bytes asked for in one read while searching."""

Read = Callable[[int, int], Awaitable[LogChunk]]
"""``read(offset, limit)``: a chunk of the log from byte ``offset``, at most ``limit`` bytes."""

_SGR = re.compile("\x1b\\[[0-9;:]*m")


class AttemptChanged(Exception):
    """The log read belongs to another attempt than the lines held: open it again."""


class LogPages:
    """The lines of one log held around the view, and the view: :attr:`top` and :attr:`height`.

    Attributes:
        lines: the lines held, sanitized (SGR sequences kept), without newlines.
        top: index in :attr:`lines` of the first line shown.
        height: lines shown at once.
        begin, end: the bytes ``[begin, end)`` of the log the lines hold.
        size: the log's size in bytes when last read (None: not read yet).
        following: the view stays at the end while the log grows.
        complete: the attempt ended and everything up to its end was read.
        attempt: the attempt whose log this is (0: the job has not started; None: not read yet).
        bytes_read: bytes received from the log API so far.
        match_at: the byte offset of the line the last search found (None: none yet).
    """

    def __init__(self, read: Read, *, read_bytes: int = READ_BYTES, keep_bytes: int = KEEP_BYTES,
                 search_bytes: int = SEARCH_BYTES) -> None:
        """An empty window; :meth:`open_end` fills it.

        Args:
            read: reads a chunk of the log (see :data:`Read`).
            read_bytes: bytes per read while paging.
            keep_bytes: bytes held around the view (at least 2 x ``read_bytes``).
            search_bytes: the most one search reads.
        """
        self._read = read
        self.read_bytes = read_bytes
        self.keep_bytes = max(keep_bytes, 2 * read_bytes)
        self.search_bytes = search_bytes
        self.lines: list[str] = []
        self._starts: list[int] = []
        self.top = 0
        self.height = 1
        self.begin = 0
        self.end = 0
        self.size: int | None = None
        self.following = True
        self.complete = False
        self.attempt: int | None = None
        self.bytes_read = 0
        self.match_at: int | None = None
        self._tail: TerminalText | None = None
        self._open_line = False
        self._paused_size = 0
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ the view

    @property
    def max_top(self) -> int:
        """The last :attr:`top` that still fills the view."""
        return max(0, len(self.lines) - self.height)

    @property
    def at_end(self) -> bool:
        """The view shows the last line of the log."""
        return self.top >= self.max_top and (self.size is None or self.end >= self.size)

    @property
    def shown(self) -> list[str]:
        """The lines in view."""
        return self.lines[self.top:self.top + self.height]

    @property
    def position(self) -> int:
        """The byte after the last line in view (as ``less`` shows it)."""
        below = self.top + self.height
        return self._starts[below] if below < len(self._starts) else self.end

    @property
    def new_bytes(self) -> int:
        """Bytes written to the log since following paused."""
        return max(0, (self.size or 0) - self._paused_size) if not self.following else 0

    @property
    def margin(self) -> int:
        """Lines held beyond each side of the view before more are read."""
        return max(2 * self.height, 50)

    def resize(self, height: int) -> None:
        """Show ``height`` lines at once (while following, still the last ones)."""
        self.height = max(1, height)
        self.top = self.max_top if self.following else min(self.top, self.max_top)

    def scroll(self, lines: int) -> None:
        """Move the view by ``lines`` (negative: up, which pauses following), within the lines held."""
        self.top = min(max(0, self.top + lines), self.max_top)
        if lines < 0 and self.following:
            self.pause()

    def pause(self) -> None:
        """Stop following; new output is counted (:attr:`new_bytes`)."""
        self.following = False
        self._paused_size = self.size or 0

    def plain(self, index: int) -> str:
        """Line ``index`` without its SGR sequences."""
        return _SGR.sub("", self.lines[index]) if "\x1b" in self.lines[index] else self.lines[index]

    # ------------------------------------------------------------------ reading

    async def open_end(self) -> None:
        """Hold the end of the log and show its last lines; follow it.

        Raises:
            AttemptChanged: the log's attempt changed while reading. What ``read`` raises.
        """
        async with self._lock:
            await self._open_end()

    async def open_start(self) -> None:
        """Show line 1 (byte 0); following pauses."""
        async with self._lock:
            self.pause()
            if self.begin == 0 and self.lines:
                self.top = 0
                return
            self._reset(await self._get(0, self.read_bytes), align=False)
            self.top = 0

    async def resume(self) -> None:
        """Show the end and follow again (``End``, ``F``): from the lines held when they reach the end."""
        async with self._lock:
            if self.size is not None and self.end >= self.size and self.lines:
                self.following = True
                self.top = self.max_top
                return
            await self._open_end()

    async def fill(self) -> bool:
        """Read what the view needs next (one read): lines above or below it; forget the far side.
        True when it held more (False: nothing more to read, or nothing came)."""
        async with self._lock:
            if self.top < self.margin and self.begin > 0:
                begin = self.begin
                before = await self._get(max(0, self.begin - self.read_bytes), min(self.begin, self.read_bytes))
                self._prepend(before)
                self._trim(above=False)
                return self.begin < begin
            below = len(self.lines) - self.top - self.height
            if below < self.margin and self.size is not None and self.end < self.size:
                end = self.end
                self._append(await self._get(self.end, self.read_bytes))
                self._trim(above=True)
                return self.end > end
            return False

    async def poll(self) -> bool:
        """Read what the log gained: following, or with the view near the end, the new lines (the view
        moves with them while following); else only its size (:attr:`new_bytes`). True when it grew."""
        async with self._lock:
            if self.following or len(self.lines) - self.top - self.height < self.margin:
                old = self.end
                chunk = await self._get(self.end, self.read_bytes)
                self._append(chunk)
                if self.following:
                    self.top = self.max_top
                self._trim(above=True)
                return self.end > old
            old_size = self.size
            await self._get(self.size or 0, 1)
            return self.size != old_size

    async def search(self, pattern: str, forward: bool = True) -> str | None:
        """Show the next line (``forward``) or the previous one holding ``pattern`` (ignoring case
        when it is all lower case) at the top of the view; None when found, else what happened
        ("not found", how far it read, or "found from the top" when a forward search reached the end
        and went on from byte 0). Following pauses."""
        if not pattern:
            return None
        async with self._lock:
            self.pause()
            fold = pattern == pattern.lower()
            needle = pattern.lower() if fold else pattern
            origin = self._match_index()
            held = range(origin + 1, len(self.lines)) if forward else range(origin - 1, -1, -1)
            for i in held:
                if needle in (self.plain(i).lower() if fold else self.plain(i)):
                    self.match_at = self._starts[i]
                    self.top = min(i, self.max_top)
                    return None
            found = await (self._search_after if forward else self._search_before)(needle, fold)
            wrapped = False
            if found == "not found" and forward:
                # It reached the end (a log opens there): go on from the top, as a pager's wrapping search.
                found, wrapped = await self._search_after(needle, fold, start=0), True
            if isinstance(found, str):
                return found
            await self._show_line_at(found)
            return "found from the top: the end was reached" if wrapped else None

    # ------------------------------------------------------------------ private

    async def _open_end(self) -> None:
        probe = await self._get(0, 1) if self.size is None else None
        size = self.size
        if size is None:  # a daemon from before ``size``: read on to the end, forgetting as it goes
            assert probe is not None
            self._reset(probe, align=False)
            while True:
                chunk = await self._get(self.end, self.read_bytes)
                if not chunk.data:
                    break
                self._append(chunk)
                self.top = self.max_top
                self._trim(above=True)
        else:
            start = max(0, size - self.read_bytes)
            self._reset(await self._get(start, self.read_bytes), align=start > 0)
            begin = None
            while len(self.lines) < self.height + self.margin and 0 < self.begin != begin \
                    and self.end - self.begin < self.keep_bytes:
                begin = self.begin
                self._prepend(await self._get(max(0, self.begin - self.read_bytes),
                                              min(self.begin, self.read_bytes)))
        self.following = True
        self.top = self.max_top

    async def _get(self, offset: int, limit: int) -> LogChunk:
        chunk = await self._read(offset, limit)
        if self.attempt is not None and chunk.attempt != self.attempt:
            self.attempt = chunk.attempt
            raise AttemptChanged(f"attempt {chunk.attempt}")
        self.attempt = chunk.attempt
        self.bytes_read += chunk.next_offset - chunk.offset
        self.size = chunk.size if chunk.size is not None else max(self.size or 0, chunk.next_offset)
        self.complete = self.complete or chunk.complete
        return chunk

    def _reset(self, chunk: LogChunk, *, align: bool) -> None:
        """Hold only ``chunk`` (from its first whole line when ``align``)."""
        data, start = _first_whole_line(chunk) if align else (chunk.data, chunk.offset)
        self.lines, self._starts = [], []
        self.begin = self.end = start
        self._tail, self._open_line = None, False
        self.top = 0
        self._append_text(data, chunk.next_offset)

    def _append(self, chunk: LogChunk) -> None:
        """Add ``chunk``, which starts at :attr:`end`, below the lines held."""
        if chunk.offset == self.end and chunk.next_offset > chunk.offset:
            self._append_text(chunk.data, chunk.next_offset)

    def _append_text(self, data: str, next_offset: int) -> None:
        if self._tail is None:
            self._tail = TerminalText()
        if self._open_line:
            self.lines.pop()
            start = self._starts.pop()
        else:
            start = self.end
        pieces = data.split("\n")
        done = self._tail.feed(data)
        starts, pos = [start], self.end
        for piece in pieces[:-1]:
            pos += len(piece.encode()) + 1
            starts.append(pos)
        if len(pieces) > 1:
            self._open_line = pieces[-1] != ""
        else:
            self._open_line = self._open_line or pieces[-1] != ""
        self.lines += done
        self._starts += starts[:len(done)]
        if self._open_line:
            long = self._tail.width >= LONG_LINE  # cut there (wrapped): the next read starts a line
            self.lines.append(self._tail.wrap() if long else self._tail.partial)
            self._starts.append(starts[len(done)])
            self._open_line = not long
        self.end = next_offset

    def _prepend(self, chunk: LogChunk) -> None:
        """Add ``chunk``, which ends at :attr:`begin`, above the lines held (from its first whole line)."""
        if chunk.next_offset <= chunk.offset:
            return
        data, start = _first_whole_line(chunk)
        t = TerminalText()
        lines = t.feed(data)
        last = t.end()
        pieces = data.split("\n")
        if pieces[-1]:
            lines.append(last)  # a line longer than a chunk, or a character cut: shown as it is
        starts, pos = [start], start
        for piece in pieces[:-1]:
            pos += len(piece.encode()) + 1
            starts.append(pos)
        self.lines[:0] = lines
        self._starts[:0] = starts[:len(lines)]
        self.top += len(lines)
        self.begin = start

    def _trim(self, *, above: bool) -> None:
        """Forget lines above the view (``above``; after reading below it) or below it (after reading
        above it) while more than :attr:`keep_bytes` are held, never within :attr:`margin` lines of
        the view (so what is forgotten is not what the view reads next)."""
        excess = (self.end - self.begin) - self.keep_bytes
        if excess <= 0 or not self.lines:
            return
        if above:
            k = min(bisect.bisect_left(self._starts, self.begin + excess), self.top - self.margin)
            if k > 0:
                del self.lines[:k]
                del self._starts[:k]
                self.top -= k
                self.begin = self._starts[0]
            return
        j = max(bisect.bisect_left(self._starts, self.end - excess), self.top + self.height + self.margin)
        if j < len(self.lines):
            self.end = self._starts[j]
            del self.lines[j:]
            del self._starts[j:]
            self._tail, self._open_line = None, False

    def _match_index(self) -> int:
        """Where a search starts: the line it found last when in view, else the first line in view."""
        if self.match_at is not None and self.lines:
            i = bisect.bisect_right(self._starts, self.match_at) - 1
            if self.top <= i < self.top + self.height and self._starts[i] == self.match_at:
                return i
        return self.top

    async def _show_line_at(self, offset: int) -> None:
        """Hold the lines around byte ``offset`` and show the line holding it at the top."""
        start = max(0, offset - self.read_bytes // 2)
        self._reset(await self._get(start, self.read_bytes), align=start > 0)
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        end = None
        while len(self.lines) - i < self.height + self.margin and end != self.end < (self.size or 0) \
                and self.end - self.begin < self.keep_bytes:
            end = self.end
            self._append(await self._get(self.end, self.read_bytes))
        self.match_at = self._starts[i] if self._starts else None
        self.top = min(i, self.max_top)

    async def _search_after(self, needle: str, fold: bool, start: int | None = None) -> int | str:
        """The byte offset of the first line after the lines held (or from byte ``start``) that holds
        ``needle``, or why not."""
        pos = start if start is not None else self._starts[-1] if self._open_line else self.end
        carry, carry_at, read = "", pos, 0
        while read < self.search_bytes:
            chunk = await self._get(pos, SEARCH_READ_BYTES)
            read += chunk.next_offset - chunk.offset
            text = carry + chunk.data
            last = chunk.next_offset >= (self.size or 0)
            upto = len(text) if last else text.rfind("\n") + 1
            hay = text[:upto].lower() if fold else text[:upto]
            at = hay.find(needle)
            if at >= 0:
                line_start = text.rfind("\n", 0, at) + 1
                return carry_at + len(text[:line_start].encode())
            if last or chunk.next_offset == chunk.offset:
                return "not found"
            carry_at += len(text[:upto].encode())
            carry = text[upto:]
            if len(carry) > self.read_bytes:  # a line longer than a chunk: searched in part
                carry_at += len(carry[:-self.read_bytes].encode())
                carry = carry[-self.read_bytes:]
            pos = chunk.next_offset
        return f"not found in the next {read // 1_000_000} MB (n searches on from there)"

    async def _search_before(self, needle: str, fold: bool) -> int | str:
        """The byte offset of the last line before the lines held that holds ``needle``, or why not."""
        pos, carry, read = self.begin, "", 0
        while read < self.search_bytes:
            if pos <= 0:
                return "not found"
            want = min(pos, SEARCH_READ_BYTES)
            chunk = await self._get(pos - want, want)
            read += chunk.next_offset - chunk.offset
            text = chunk.data + carry
            first = 0 if chunk.offset == 0 else text.find("\n") + 1
            hay = text[first:].lower() if fold else text[first:]
            at = hay.rfind(needle)
            if at >= 0:
                line_start = text.rfind("\n", 0, first + at) + 1
                return chunk.offset + len(text[:line_start].encode())
            carry = text[:first] if first else text[:self.read_bytes]
            pos = chunk.offset
        return f"not found in the {read // 1_000_000} MB before (N searches on from there)"


def _first_whole_line(chunk: LogChunk) -> tuple[str, int]:
    """``chunk``'s text from its first whole line, and that line's byte offset: after its first newline
    (unless it starts the log); a chunk with no line starting in it (a line longer than a chunk) whole."""
    data = chunk.data
    cut = data.find("\n") if chunk.offset > 0 else -1
    if cut < 0 or cut == len(data) - 1:
        return data, chunk.offset
    return data[cut + 1:], chunk.offset + len(data[:cut + 1].encode())
