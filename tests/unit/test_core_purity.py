"""gpulayerd.core imports only pure modules: an allow-list, beside the lint-imports deny-list.

lint-imports (pyproject.toml) forbids the I/O, clock and randomness modules by name; this
test closes the list: any import of core outside the modules below fails, so a new
dependency of the pure core is a deliberate decision.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "gpulayerd" / "core"
ALLOWED = {
    "__future__", "abc", "bisect", "collections", "dataclasses", "enum", "functools", "heapq", "itertools", "math",
    "operator", "re", "typing", "packaging", "gpulayerd",
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_core_imports_only_pure_modules() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 8, files  # the core is there to check
    bad = {f"{p.name}: {m}" for p in files for m in _imports(p)
           if m.split(".")[0] not in ALLOWED or (m.startswith("gpulayerd") and not m.startswith("gpulayerd.core"))}
    assert not bad, sorted(bad)
