"""gpulayer_tui may import only gpulayerd.models, gpulayerd.api.client, gpulayerd.text and gpulayerd.termsafe
(and what they import); gpulayerd never imports gpulayer_tui."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("gpulayerd.models", "gpulayerd.api.client", "gpulayerd.text", "gpulayerd.termsafe")
TUI_PACKAGE = REPO_ROOT / "tui" / "gpulayer_tui"


def _imported_modules(path: Path) -> list[str]:
    """The modules a source file imports: ``from a import b`` counts as ``a.b`` when ``a`` is gpulayerd."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "gpulayerd":
                names += [f"gpulayerd.{a.name}" for a in node.names]
            else:
                names.append(node.module)
    return names


def _allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def test_importing_the_tui_loads_no_store_gpu_or_net_module() -> None:
    code = ("import json, sys, gpulayer_tui.app, gpulayer_tui.launch; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpulayerd'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    assert "gpulayerd.models" in loaded and "gpulayerd.text" in loaded
    forbidden = [m for m in loaded if m.split(".")[:2] in (["gpulayerd", "store"], ["gpulayerd", "gpu"],
                                                           ["gpulayerd", "net"])]
    assert forbidden == [], f"tui loaded {forbidden}"


def test_tui_sources_name_no_other_gpulayerd_module() -> None:
    bad = []
    for path in sorted(TUI_PACKAGE.rglob("*.py")):
        bad += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in _imported_modules(path)
                if n.split(".")[0] == "gpulayerd" and not _allowed(n)]
    assert bad == []


def test_gpulayerd_never_imports_the_tui() -> None:
    bad = []
    for path in sorted((REPO_ROOT / "gpulayerd").rglob("*.py")):
        bad += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in _imported_modules(path)
                if n.split(".")[0] in ("gpulayer_tui", "tui")]
    assert bad == []
