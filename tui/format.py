"""Text formatting shared by the CLI and the TUI: the only place that turns None into "—".

Memory is shown in decimal GB (10^9 bytes) with its kind, so unified memory is never
presented as VRAM.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DASH", "gb", "mark", "memory", "table", "text"]

DASH = "—"
GB = 10**9


def text(value: object) -> str:
    """``str(value)``, or "—" for None."""
    return DASH if value is None else str(value)


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
    """A plain left-aligned text table; None cells print as "—"."""
    cells = [[text(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    def line(parts: Sequence[str]) -> str:
        return (indent + "  ".join(p.ljust(w) for p, w in zip(parts, widths, strict=False))).rstrip()
    return "\n".join([line(list(headers)), *(line(r) for r in cells)])
