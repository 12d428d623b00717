"""Job output made safe for a terminal: THE sanitizer of everything a job printed before a terminal shows it.

A job's output may hold escape sequences that a terminal obeys: clear the screen, move the
cursor, set the window title, write the clipboard (OSC 52), define hyperlinks, or switch
modes. :class:`TerminalText` lets through only printable text, newlines, tabs and (when asked)
SGR colour and style sequences, as ``less -R`` does; everything else is dropped:

- CSI sequences other than SGR (``ESC [ ... m``): cursor movement, erase, scroll regions, modes;
- OSC, DCS, APC, PM and SOS strings, up to their terminator (BEL or ST), a newline, CAN or SUB;
- every other ``ESC`` sequence (``ESC 7``, ``ESC c``, ``ESC ( B`` ...) and a bare ``ESC``;
- C0 controls other than newline and tab, DEL, and the 8-bit C1 controls U+0080 to U+009F
  (``U+009B`` starts a CSI, ``U+009D`` an OSC, ``U+0090`` a DCS, as in a terminal);
- bidi overrides and isolates and the line and paragraph separators are shown as ``\\u202e`` etc.

A carriage return overwrites the line as a terminal would: the text after it replaces the
line's characters from its start, one character per character, and what is longer stays
(a tqdm progress bar shows one line, its last state); a backspace moves back one character.
Input may arrive in pieces cut anywhere, inside an escape sequence or between ``\\r`` and
``\\n``: the state carries over.

Each output line is whole in itself: with SGR kept, it starts with the style in force and
ends with a reset when styled, so a viewer may show any line alone. Imports nothing of
gpulayerd: ``gpulayer_tui`` may import it.
"""

from __future__ import annotations

import re
from itertools import groupby

__all__ = ["LONG_LINE", "TerminalText", "sanitize"]

# Characters that need the slow path: C0 controls but tab and newline, DEL, C1, and the
# bidi and separator characters shown escaped.
_SPECIAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_SPECIAL_OR_NEWLINE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CSI_BODY = re.compile("[\x30-\x3f]*[\x20-\x2f]*")
_SGR_PARAMS = re.compile("[0-9;:]*")
_STRING_END = re.compile("[\x07\x0a\x18\x1a\x1b\x9c]")
_SHOWN_ESCAPED = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_STRING_STARTS = frozenset("]PX^_")  # after ESC: OSC, DCS, SOS, PM, APC
_C1_STRING_STARTS = frozenset("\x90\x98\x9d\x9e\x9f")  # the same as 8-bit controls
_MAX_CSI_PARAMS = 64
"""A longer CSI is never kept (a real SGR is far shorter)."""
_MAX_STYLE_PARTS = 16
"""SGR sequences remembered since the last reset (the oldest go first)."""

LONG_LINE = 65_536
"""Characters a viewer holds of the line being written: a viewer cuts a longer one there (:meth:`TerminalText.wrap`,
as a terminal wraps it), so a job that prints no newline cannot make it hold all its output as one line (about
20 bytes a character) and render it again on every read."""

_GROUND, _ESC, _ESC_INTERMEDIATE, _CSI, _STRING, _STRING_ESC = range(6)


class TerminalText:
    """An incremental sanitizer of one stream of job output (see the module docstring).

    :meth:`feed` takes text in pieces and returns the lines it completed; :attr:`partial` is the
    line being written, as a terminal shows it now; :meth:`end` returns it and starts a new line.
    """

    def __init__(self, *, keep_sgr: bool = True) -> None:
        """A sanitizer at the start of a line, in the default style.

        Args:
            keep_sgr: keep SGR colour and style sequences (else drop them too: plain text).
        """
        self.keep_sgr = keep_sgr
        self._mode = _GROUND
        self._params = ""
        self._style: list[str] = []
        self._style_key = ""
        self._chars: list[str] = []
        self._styles: list[str] = []
        self._cursor = 0
        self._styled = False

    def feed(self, data: str) -> list[str]:
        """Take the next piece of output; returns the lines it completed, sanitized, without their newline."""
        if self._mode == _GROUND and not self._style_key and not _SPECIAL.search(data):
            return self._plain(data)  # the common case
        lines: list[str] = []
        pos, n = 0, len(data)
        while pos < n:
            mode = self._mode
            if mode == _GROUND:
                m = _SPECIAL_OR_NEWLINE.search(data, pos)
                end = m.start() if m is not None else n
                if end > pos:
                    self._write(data[pos:end])
                if m is None:
                    break
                pos = end + 1
                self._control(data[end], lines)
            elif mode == _CSI:
                body = _CSI_BODY.match(data, pos)
                assert body is not None  # the pattern matches the empty string
                self._params = (self._params + body.group())[:_MAX_CSI_PARAMS + 1]
                pos = body.end()
                if pos < n:
                    pos = self._csi_end(data, pos)
            elif mode in (_STRING, _STRING_ESC):
                pos = self._string(data, pos)
            else:
                pos = self._escape(data, pos)
        return lines

    @property
    def partial(self) -> str:
        """The line being written (no newline yet), as a terminal shows it now."""
        return self._render()

    @property
    def width(self) -> int:
        """Characters in the line being written."""
        return len(self._chars)

    def wrap(self) -> str:
        """The line being written, ended there as a terminal wraps a long line: the next text starts a new
        line, in the same state (unlike :meth:`end`, a sequence still open stays open, and the style in force)."""
        line = self._render()
        self._new_line()
        return line

    def end(self) -> str:
        """The line being written, as :attr:`partial`; the next text starts a new line (no sequence is open)."""
        line = self._render()
        self._new_line()
        self._mode = _GROUND
        return line

    # ------------------------------------------------------------------ private

    def _plain(self, data: str) -> list[str]:
        """``data`` without controls, in the default style."""
        head, newline, tail = data.partition("\n")
        self._write(head)
        if not newline:
            return []
        lines = [self._render()]
        self._new_line()
        *more, rest = tail.split("\n")
        if rest:
            self._write(rest)
        return lines + more

    def _control(self, ch: str, lines: list[str]) -> None:
        """A control character (or a character shown escaped) in ground state."""
        if ch == "\n":
            lines.append(self._render())
            self._new_line()
        elif ch == "\r":
            self._cursor = 0
        elif ch == "\b":
            self._cursor = max(0, self._cursor - 1)
        elif ch == "\x1b":
            self._mode = _ESC
        elif ch == "\x9b":
            self._mode, self._params = _CSI, ""
        elif ch in _C1_STRING_STARTS:
            self._mode = _STRING
        elif ch in _SHOWN_ESCAPED:
            self._write(f"\\u{ord(ch):04x}")
        # any other C0 or C1 control, and DEL: dropped

    def _escape(self, data: str, pos: int) -> int:
        """After ESC (or inside ``ESC`` + intermediates): the next character decides."""
        ch = data[pos]
        code = ord(ch)
        if self._mode == _ESC and ch == "[":
            self._mode, self._params = _CSI, ""
        elif self._mode == _ESC and ch in _STRING_STARTS:
            self._mode = _STRING
        elif 0x20 <= code <= 0x2F:
            self._mode = _ESC_INTERMEDIATE  # e.g. ESC ( B: wait for the final character
        elif 0x30 <= code <= 0x7E:
            self._mode = _GROUND  # a whole ESC sequence (ESC 7, ESC c, ESC M ...): dropped
        else:
            self._mode = _GROUND  # ESC followed by a control or text: the ESC alone is dropped
            return pos
        return pos + 1

    def _csi_end(self, data: str, pos: int) -> int:
        """The character after a CSI's parameters and intermediates: its final character or what cuts it."""
        ch = data[pos]
        code = ord(ch)
        if 0x40 <= code <= 0x7E:
            if ch == "m" and self.keep_sgr and len(self._params) <= _MAX_CSI_PARAMS \
                    and _SGR_PARAMS.fullmatch(self._params):
                self._sgr(self._params)
            self._mode = _GROUND
            return pos + 1
        self._mode = _GROUND  # a control or a character that cannot be in a CSI: the CSI is dropped
        return pos if code < 0x20 or 0x7F <= code <= 0x9F else pos + 1

    def _string(self, data: str, pos: int) -> int:
        """Inside an OSC/DCS/APC/PM/SOS string: skip to its end (BEL, ST, newline, CAN, SUB)."""
        if self._mode == _STRING_ESC:
            self._mode = _STRING
            if data[pos] == "\\":
                self._mode = _GROUND  # ESC \ (ST)
                return pos + 1
        m = _STRING_END.search(data, pos)
        if m is None:
            return len(data)
        ch = m.group()
        if ch == "\x1b":
            self._mode = _STRING_ESC
        elif ch == "\n":
            self._mode = _GROUND  # a string cut by a newline ends there: the text after it shows
            return m.start()
        else:
            self._mode = _GROUND
        return m.end()

    def _sgr(self, params: str) -> None:
        parts = params.split(";") if params else ["0"]
        if parts[0] in ("", "0"):
            self._style = []
            parts = parts[1:]
        rest = ";".join(p for p in parts if p)
        if rest:
            self._style = [*self._style, rest][-_MAX_STYLE_PARTS:]
        self._style_key = ";".join(self._style)

    def _write(self, text: str) -> None:
        chars = list(text)
        k, cur = len(chars), self._cursor
        styles = [self._style_key] * k
        if cur == len(self._chars):
            self._chars += chars
            self._styles += styles
        else:
            self._chars[cur:cur + k] = chars
            self._styles[cur:cur + k] = styles
        self._cursor = cur + k
        self._styled = self._styled or bool(self._style_key)

    def _new_line(self) -> None:
        self._chars, self._styles, self._cursor, self._styled = [], [], 0, False

    def _render(self) -> str:
        if not self._styled:
            return "".join(self._chars)
        out: list[str] = []
        shown, pos, chars = "", 0, self._chars
        for style, run in groupby(self._styles):
            k = len(list(run))
            if style != shown:
                out.append(f"\x1b[0;{style}m" if style else "\x1b[0m")
                shown = style
            out.append("".join(chars[pos:pos + k]))
            pos += k
        if shown:
            out.append("\x1b[0m")
        return "".join(out)


def sanitize(text: str, *, keep_sgr: bool = True) -> str:
    """``text`` as a terminal may show it (see the module docstring): whole lines joined by newlines,
    a last line without one kept without one."""
    t = TerminalText(keep_sgr=keep_sgr)
    lines = t.feed(text)
    last = t.end()
    return "\n".join([*lines, last]) if lines else last
