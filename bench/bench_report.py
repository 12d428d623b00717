"""What every benchmark prints: a figure beside its target (imported by the scripts in bench/)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def line(label: str, value: float, unit: str, target: float | None = None, *, at_most: bool = True,
         fmt: str = ".1f") -> None:
    """Print ``label: value unit (target <= T unit: ok|MISSED, Rx of target)``, or ``(no target)``.

    ``at_most``: the target is a ceiling (else a floor: ``>=``).
    """
    text = f"{label}: {value:{fmt}}{f' {unit}' if unit else ''}"
    if target is None:
        print(f"{text} (no target)", flush=True)
        return
    ok = value <= target if at_most else value >= target
    sign = "<=" if at_most else ">="
    ratio = f", {value / target:.2f}x of target" if target else ""
    print(f"{text} (target {sign} {target:g}{f' {unit}' if unit else ''}: {'ok' if ok else 'MISSED'}{ratio})",
          flush=True)
