"""Text shared by the CLI and the TUI: the only place that turns None into "—".

How unknown values print (:data:`DASH`), memory in decimal GB (10^9 bytes) with its kind,
so unified memory is never presented as VRAM, short ages and clock times, plain tables,
escaping of control characters (:func:`escape`) and display width in terminal cells
(:func:`width`, through ``wcwidth``); the words for devices that ``gpulayer devices`` and the
TUI's Devices view share (:func:`device_name`, :func:`device_kind`, :func:`fault`,
:func:`holder`, :func:`cpu_slots`, :func:`hardware`); and fitting columns to a terminal's width
(:func:`fit_widths`, :func:`padded_width`, :func:`wrap`). Imports nothing of gpulayerd:
``gpulayer_tui`` may import it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = [
    "ANOTHER_DAEMON",
    "DASH",
    "age",
    "ago",
    "clock",
    "cpu_slots",
    "cut",
    "device_kind",
    "device_name",
    "device_state",
    "escape",
    "fault",
    "fit_widths",
    "gb",
    "hardware",
    "holder",
    "http_error",
    "job_label",
    "json_out",
    "ljust",
    "mark",
    "memory",
    "mig_name",
    "one_line",
    "padded_width",
    "peers_down",
    "size",
    "table",
    "terminal_columns",
    "text",
    "where",
    "width",
    "wrap",
]

DASH = "—"
GB = 10**9

ANOTHER_DAEMON = "(another gpulayerd on this machine)"
"""``granted_to`` of a device whose lock another gpulayerd holds (the same text as
:data:`gpulayerd.core.types.OUTSIDE_HOLDER`, which this module may not import; a unit test checks)."""

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def text(value: object) -> str:
    """``str(value)``, or "—" for None."""
    return DASH if value is None else str(value)


_JSON_UNSAFE = re.compile("[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_out(document: str) -> str:
    """A JSON ``document`` safe to print to a terminal: DEL, the C1 controls (U+0080-U+009F, which
    terminals may obey as CSI, OSC, ...), line and paragraph separators and bidirectional overrides
    written as ``\\uXXXX`` escapes. The same JSON value: such characters occur only inside strings,
    where an escape means the character itself (C0 controls are escaped by every JSON encoder)."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", document)


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


def cut(value: str, cells: int, words: bool = False) -> str:
    """``value`` cut to at most ``cells`` terminal cells, ending in "…" when cut (wide characters
    are never split in half); unchanged when it fits. ``words``: end at a space instead when one
    falls in the second half of what is kept ("19.3/25.8 GB…", not "19.3/25.8 G…")."""
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
    kept = "".join(out)
    if words and " " in kept and kept.rindex(" ") >= len(kept) // 2:
        kept = kept[: kept.rindex(" ")].rstrip(" ")
    return kept + "…"


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


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "",
          limit: int | None = None) -> str:
    """A plain left-aligned text table, columns measured in terminal cells; None cells print as "—".

    Every cell goes through :func:`escape` (cells may hold users' or peers' text). Without
    ``limit`` (a pipe) cells are never cut and a column is padded for most of its cells, not for
    a few far wider ones (:func:`padded_width`: those overflow, and their row's later cells move
    right). With ``limit`` (terminal cells) every column is as wide as its widest cell and the
    last column's cells wrap onto continuation lines under it when a line would be wider.
    """
    cells = [[escape(text(c)) for c in r] for r in rows]
    count = len(headers)
    columns = [[width(r[i]) for r in cells if i < len(r)] for i in range(count)]
    if limit is None:
        widths = [padded_width(c, width(h)) for c, h in zip(columns, headers, strict=True)]
    else:
        widths = [max([width(h), *c]) for c, h in zip(columns, headers, strict=True)]
    last = None if limit is None else max(12, limit - width(indent) - sum(w + 2 for w in widths[:-1]))

    def lines(parts: Sequence[str]) -> list[str]:
        pieces = wrap(parts[-1], last) if last is not None and len(parts) == count else [parts[-1]]
        out = []
        for n, piece in enumerate(pieces):
            lead = parts[:-1] if n == 0 else [""] * (len(parts) - 1)
            out.append((indent + "  ".join(ljust(p, w) for p, w in zip([*lead, piece], widths, strict=False)))
                       .rstrip())
        return out

    return "\n".join([*lines(list(headers)), *(line for r in cells for line in lines(r))])


def padded_width(widths: Sequence[int], header: int = 0) -> int:
    """The cells to pad a column to, given its cells' widths: the widest cell, unless a few cells
    are far wider than the rest (one long job name among short ones): then the widest of the
    rest, and those few overflow.

    "Far wider": more than twice, and more than 16 cells wider than, the widest cell left when
    the widest tenth of the cells (at least one) is set aside. Never less than ``header``.
    """
    if len(widths) < 2:
        return max([header, *widths])
    ordered = sorted(widths)
    keep = ordered[len(ordered) - 1 - max(1, len(ordered) // 10)]
    cap = max(2 * keep, keep + 16)
    return max(header, *(w for w in ordered if w <= cap))


def fit_widths(widths: Sequence[int], limit: int, shrink: Sequence[tuple[int, int]], gap: int = 2) -> list[int]:
    """Column widths (cells) shrunk until a line fits ``limit`` cells.

    Args:
        widths: each column's width as its content needs it.
        limit: the most cells a line may take, gaps included.
        shrink: (column index, floor) in the order columns give way: each step takes cells from
            that column down to its floor while the line is too wide; a floor of 0 hides the
            column (width 0, and its gap goes too).
        gap: cells each shown column takes besides its width (between columns, or a table's padding).

    Returns:
        The widths, 0 for a hidden column; the line may still be too wide when the floors are.
    """
    out = list(widths)
    excess = sum(w + gap for w in out if w) - limit
    for i, floor in shrink:
        if excess <= 0:
            break
        if i >= len(out) or out[i] == 0:
            continue
        if floor == 0:
            excess -= out[i] + gap
            out[i] = 0
            continue
        give = min(excess, max(0, out[i] - floor))
        out[i] -= give
        excess -= give
    return out


def wrap(value: str, cells: int) -> list[str]:
    """``value`` in lines of at most ``cells`` terminal cells, broken at spaces (a longer word is
    split); [value] when it fits. Wide characters are never split in half."""
    if width(value) <= cells or cells <= 0:
        return [value]
    out: list[str] = []
    line = ""
    for word in value.split(" "):
        candidate = f"{line} {word}" if line else word
        if width(candidate) <= cells:
            line = candidate
            continue
        if line:
            out.append(line)
        line = word
        while width(line) > cells:
            head, used = [], 0
            for ch in line:
                if used + width(ch) > cells:
                    break
                head.append(ch)
                used += width(ch)
            out.append("".join(head))
            line = line[len(head):]
    if line:
        out.append(line)
    return out


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


def job_label(job_id: str, name: str | None, user: str | None) -> str:
    """How a job is shown where it holds a device: "name (user)", "name", "id (user)" or the id; escaped."""
    head = escape(name) if name else escape(job_id)
    return f"{head} ({escape(user)})" if user else head


def holder(granted_to: str, label: Callable[[str], str | None] | None = None) -> str:
    """Who holds a device, from its ``granted_to``: "another gpulayerd", else ``label(job id)`` (e.g.
    :func:`job_label`'s "name (user)") or the job id; a hold keeps its " (held)". Escaped."""
    if granted_to == ANOTHER_DAEMON:
        return "another gpulayerd"
    job_id = granted_to.removesuffix(" (held)")
    named = (label(job_id) if label is not None else None) or escape(job_id)
    return f"{named} (held)" if granted_to.endswith(" (held)") else named


def device_state(granted_to: str | None, foreign_pids: Sequence[int],
                 label: Callable[[str], str | None] | None = None) -> str:
    """"granted to NAME (user)" (:func:`holder`), "busy (pid 1, 2)" for processes outside gpulayer,
    else "free"."""
    if granted_to:
        return f"granted to {holder(granted_to, label)}"
    if foreign_pids:
        return "busy (pid " + ", ".join(str(p) for p in foreign_pids) + ")"
    return "free"


def fault(state: str, reason: str) -> str | None:
    """A device the daemon never grants, in the tool's words: "lost: Unable to determine the device
    handle …", "unusable: …", "excluded (config)"; None for a device in state "ok". Not escaped."""
    if state in ("lost", "unusable"):
        return f"{state}: {reason}" if reason else state
    if state == "excluded":
        return f"excluded ({reason or 'config'})"
    return None


def mig_name(profile: str | None, parent_index: int | None) -> str:
    """A MIG instance by its profile and its GPU: "MIG 3g.40gb on GPU 3" ("MIG ?" when unknown)."""
    return f"MIG {profile or '?'}" + ("" if parent_index is None else f" on GPU {parent_index}")


def device_name(name: str | None, *, mig: bool = False, mig_profile: str | None = None,
                parent_index: int | None = None, lost: bool = False, pci_bus_id: str | None = None,
                uuid: str | None = None, wide: bool = False) -> str | None:
    """NAME of a device: a MIG instance's :func:`mig_name` (``wide``: the GPU's name, the profile and
    the instance's ``MIG-…`` uuid), a lost GPU's name and bus id ("GPU at 0000:41:00.0"), else
    ``name``. Not escaped."""
    if mig:
        if wide:
            return f"{name or '?'} MIG {mig_profile or '?'} {uuid or ''}".rstrip()
        return mig_name(mig_profile, parent_index)
    if lost and pci_bus_id:
        return f"{name or 'GPU'} at {pci_bus_id}"
    return name


def device_kind(accelerator: str, mig: bool) -> str:
    """KIND of a device: its accelerator ("cuda"), "cuda/mig" for a MIG instance."""
    return f"{accelerator}/mig" if mig else accelerator


def cpu_slots(total: int | None, free: int | None) -> str | None:
    """A machine's CPU slots for jobs: "8 slots (4 free)"; None when the daemon did not say."""
    if total is None:
        return None
    return f"{total} slot{'s' if total != 1 else ''} ({text(free)} free)"


def hardware(devices: Iterable[tuple[str | None, bool]]) -> str:
    """A machine's devices counted by name, from (name, is a MIG instance) pairs: "1x NVIDIA A100
    80GB PCIe, 2x NVIDIA RTX A6000". A GPU split into MIG instances counts once (its instances
    are parts of it); "" when there is none."""
    counts: dict[str, int] = {}
    for name, mig in devices:
        if name and not mig:
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n}x {name}" for name, n in sorted(counts.items()))


def where(host: str | None, devices: Sequence[int] = (), hosts: Sequence[str] = (),
          names: Mapping[int, str] | None = None) -> str | None:
    """A job's WHERE: "ws-2 GPU 0,1", "ws-2" (CPU), "h2+h3" (a multi-host job's hosts by rank), or None.

    ``names``: device index -> a name to show instead of the index, e.g. a MIG instance's
    :func:`mig_name` ("vm MIG 3g.40gb on GPU 3").
    """
    if hosts:
        return "+".join(hosts)
    if host is None:
        return None
    if not devices:
        return host
    named = [names[i] for i in devices if names and i in names]
    plain = [str(i) for i in devices if not names or i not in names]
    return " ".join([host, *([f"GPU {','.join(plain)}"] if plain else []), *named])


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
