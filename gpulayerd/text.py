"""Text shared by the CLI and the TUI: the only place that turns None into "—".

How unknown values print (:data:`DASH`), memory in decimal GB (10^9 bytes) with its kind,
so unified memory is never presented as VRAM, short ages and clock times, plain tables,
escaping of control characters (:func:`escape`) and display width in terminal cells
(:func:`width`, through ``wcwidth``). Imports nothing of gpulayerd: ``gpulayer_tui`` may
import it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = [
    "DASH",
    "age",
    "ago",
    "clock",
    "device_state",
    "escape",
    "gb",
    "ljust",
    "mark",
    "memory",
    "one_line",
    "peers_down",
    "size",
    "table",
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


def width(value: str) -> int:
    """Terminal cells ``value`` takes: 2 for each wide (e.g. CJK) character, 0 for combining marks.

    Control characters count as 0 (escape them first with :func:`escape` to show them).
    """
    if value.isascii() and value.isprintable():
        return len(value)
    from wcwidth import wcswidth, wcwidth  # imported on first use: start-up time of the CLI

    n = wcswidth(value)
    if n >= 0:
        return n
    return sum(max(0, wcwidth(ch)) for ch in value)


def ljust(value: str, cells: int) -> str:
    """``value`` padded with spaces on the right to ``cells`` terminal cells (never cut)."""
    return value + " " * max(0, cells - width(value))


def gb(n_bytes: int | None, digits: int = 1) -> str:
    """Bytes as decimal GB ("24.0 GB"), or "—" when unknown."""
    return DASH if n_bytes is None else f"{n_bytes / GB:.{digits}f} GB"


def memory(total_bytes: int | None, used_bytes: int | None, kind: str | None) -> str:
    """Device memory as "used / total GB kind", e.g. "1.2 / 24.0 GB dedicated".

    Unified memory (system RAM shared with the CPU) says "unified (system RAM)".
    """
    if total_bytes is None:
        head = f"{DASH} GB"
    elif used_bytes is None:
        head = gb(total_bytes)
    else:
        head = f"{used_bytes / GB:.1f} / {total_bytes / GB:.1f} GB"
    if kind == "unified":
        return f"{head} unified (system RAM)"
    return f"{head} {kind}" if kind else head


def mark(ok: bool | None) -> str:
    """✓ for True, ✗ for False, ? for not checked."""
    return "?" if ok is None else ("✓" if ok else "✗")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """A plain left-aligned text table, columns measured in terminal cells; None cells print as "—"."""
    cells = [[text(c) for c in r] for r in rows]
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
