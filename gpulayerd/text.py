"""Text shared by the CLI and the TUI: the only place that turns None into "—".

How unknown values print (:data:`DASH`), memory in decimal GB (10^9 bytes) with its kind,
so unified memory is never presented as VRAM, short ages and clock times, plain tables,
escaping of control characters (:func:`escape`) and display width in terminal cells
(:func:`width`, through ``wcwidth``). Imports nothing of gpulayerd: ``gpulayer_tui`` may
import it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

__all__ = [
    "DASH",
    "age",
    "ago",
    "clock",
    "cut",
    "device_state",
    "escape",
    "gb",
    "http_error",
    "ljust",
    "mark",
    "memory",
    "one_line",
    "peers_down",
    "size",
    "table",
    "terminal_columns",
    "text",
    "where",
    "width",
]

DASH = "—"
GB = 10**9

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def text(value: object) -> str:
    """``str(value)``, or "—" for None."""
    return DASH if value is None else str(value)


def escape(value: str) -> str:
    """``value`` with every control character made visible, so a terminal shows it instead of obeying it.

    Newline, carriage return and tab become ``\\n``, ``\\r``, ``\\t``; other C0/C1 controls and DEL
    become ``\\xNN`` (escape is ``\\x1b``), other non-printable code points (format characters,
    separators such as U+2028) ``\\uNNNN``. Printable text (any script) is unchanged; a backslash
    stays one backslash.
    """
    if value.isprintable():
        return value
    out = []
    for ch in value:
        if ch.isprintable():
            out.append(ch)
        elif ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return "".join(out)


_NARROW = frozenset(chr(c) for first, last in (
    (0xA1, 0xAC), (0xAE, 0xFF), (0x100, 0x24F),  # Latin-1 (no NBSP, no soft hyphen), Latin Extended-A/B
    (0x391, 0x3A1), (0x3A3, 0x3A9), (0x3B1, 0x3C9), (0x400, 0x45F),  # Greek and Cyrillic letters
    (0x2010, 0x2027), (0x2030, 0x205E), (0x20AC, 0x20AC),  # dashes, quotes, bullets, "…", "‰", "€"
    (0x2190, 0x21FF), (0x2200, 0x22FF),  # arrows, mathematical operators ("≈", "≤")
    (0x2500, 0x259F), (0x25A0, 0x25FC), (0x2713, 0x2718),  # box drawing, blocks, shapes, "✓", "✗"
) for c in range(first, last + 1))
"""Characters outside ASCII that take one terminal cell (what ``wcwidth`` says of each: a unit test
checks): :func:`width` counts text made of them and printable ASCII without importing ``wcwidth``."""


def terminal_columns(fallback: int = 80) -> int:
    """Columns of the terminal: ``COLUMNS`` when it is a positive integer, else the width of the
    terminal on stdout, else ``fallback`` (what ``shutil.get_terminal_size().columns`` answers,
    without importing ``shutil``: ~2 ms of every CLI start)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    stdout = sys.__stdout__
    try:
        columns = 0 if stdout is None else os.get_terminal_size(stdout.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns or fallback


def width(value: str) -> int:
    """Terminal cells ``value`` takes: 2 for each wide (e.g. CJK) character, 0 for combining marks.

    Control characters count as 0 (escape them first with :func:`escape` to show them).
    """
    if value.isascii():
        if value.isprintable():
            return len(value)
    elif all(ch in _NARROW or " " <= ch <= "~" for ch in value):  # e.g. "—", "…", "✓", "é": no wcwidth
        return len(value)
    from wcwidth import wcswidth, wcwidth  # imported on first use (~12 ms): start-up time of the CLI

    n = wcswidth(value)
    if n >= 0:
        return n
    return sum(max(0, wcwidth(ch)) for ch in value)


def ljust(value: str, cells: int) -> str:
    """``value`` padded with spaces on the right to ``cells`` terminal cells (never cut)."""
    return value + " " * max(0, cells - width(value))


def cut(value: str, cells: int) -> str:
    """``value`` cut to at most ``cells`` terminal cells, ending in "…" when cut (wide characters
    are never split in half); unchanged when it fits."""
    if width(value) <= cells:
        return value
    if cells <= 0:
        return ""
    out, used = [], 0
    for ch in value:
        w = width(ch)
        if used + w > cells - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


_HTTP_WORDS = {
    400: "the daemon refused the request as malformed",
    401: "the daemon did not accept who is asking",
    403: "the daemon does not allow this",
    404: "the daemon does not know what was asked for",
    405: "the daemon does not offer this (an older or newer gpulayerd?)",
    413: "the request is too large for the daemon (a job spec with a huge command or environment?)",
    500: "the daemon failed with an internal error (its log says more)",
    503: "the daemon is not ready (starting or stopping)",
}


def http_error(status: int, body: bytes | str) -> str:
    """A sentence for an HTTP error whose body is not the API's JSON error, e.g. aiohttp's
    ``b'Maximum request body size 4194304 exceeded, actual body size 5000000'`` for HTTP 413:
    "the request is too large for the daemon (...) (HTTP 413: Maximum request body size ...)".

    The body's first line is decoded (UTF-8, bad bytes replaced), cut to 200 characters and
    escaped: it is shown on a terminal.
    """
    raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    detail = escape(one_line(raw.strip(), 200))
    words = _HTTP_WORDS.get(status) or (
        "the daemon refused the request" if 400 <= status < 500 else "the daemon failed to answer")
    return f"{words} (HTTP {status}" + (f": {detail})" if detail else ")")


def gb(n_bytes: int | None, digits: int = 1) -> str:
    """Bytes as decimal GB ("24.0 GB"), or "—" when unknown."""
    return DASH if n_bytes is None else f"{n_bytes / GB:.{digits}f} GB"


def memory(total_bytes: int | None, used_bytes: int | None, kind: str | None) -> str:
    """Device memory as "used / total GB kind", e.g. "1.2 / 24.0 GB dedicated".

    Unified memory (system RAM shared with the CPU) says "unified (system RAM)"; an unknown
    total is just "—".
    """
    if total_bytes is None:
        return DASH  # not "— GB dedicated": nothing is known
    head = gb(total_bytes) if used_bytes is None else f"{used_bytes / GB:.1f} / {total_bytes / GB:.1f} GB"
    if kind == "unified":
        return f"{head} unified (system RAM)"
    return f"{head} {kind}" if kind else head


def mark(ok: bool | None) -> str:
    """✓ for True, ✗ for False, ? for not checked."""
    return "?" if ok is None else ("✓" if ok else "✗")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """A plain left-aligned text table, columns measured in terminal cells; None cells print as "—".

    Every cell goes through :func:`escape` (cells may hold users' or peers' text).
    """
    cells = [[escape(text(c)) for c in r] for r in rows]
    widths = [width(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], width(c))

    def line(parts: Sequence[str]) -> str:
        return (indent + "  ".join(ljust(p, w) for p, w in zip(parts, widths, strict=False))).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def age(seconds: float) -> str:
    """A duration as one short unit: "42s", "17m", "5h", "3d" (negative counts as 0)."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def ago(at: float | None, now: float) -> str:
    """How long ago wall time ``at`` was: "12s ago", or "—" when unknown."""
    return DASH if at is None else f"{age(now - at)} ago"


def clock(at: float | None, with_date: bool = True) -> str:
    """Wall time (seconds since the epoch) in local time: "2025-01-31 14:05:09", or "—"."""
    if at is None:
        return DASH
    return time.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(at))


def one_line(value: str | None, width: int = 90) -> str:
    """The first line of ``value``, cut to ``width`` characters with "…"; "" for None."""
    first = value.splitlines()[0] if value else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def device_state(granted_to: str | None, foreign_pids: Sequence[int]) -> str:
    """"granted to JOB", "busy (pid 1, 2)" for processes outside gpulayer, else "free"."""
    if granted_to:
        return f"granted to {granted_to}"
    if foreign_pids:
        return "busy (pid " + ", ".join(str(p) for p in foreign_pids) + ")"
    return "free"


def where(host: str | None, devices: Sequence[int] = (), hosts: Sequence[str] = ()) -> str | None:
    """A job's WHERE: "ws-2 GPU 0,1", "ws-2" (CPU), "h2+h3" (a multi-host job's hosts by rank), or None."""
    if hosts:
        return "+".join(hosts)
    if host is None:
        return None
    return f"{host} GPU {','.join(str(i) for i in devices)}" if devices else host


def peers_down(count: int) -> str:
    """The notice under a job list when ``count`` trusted peers are unreachable ("" for none)."""
    if count <= 0:
        return ""
    return f"{count} peer{'s' if count != 1 else ''} down: their jobs are not listed"


def size(n: int) -> str:
    """A byte count in decimal units: "512 B", "1.2 kB", "3.4 MB", "5.6 GB"."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 10**3), ("MB", 10**6)):
        if n < scale * 1000:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 10**9:.1f} GB"
