"""tui/ may import only gpulayerd.models and gpulayerd.api.client (and what they import)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"gpulayerd.models", "gpulayerd.api.client"}


def test_importing_the_tui_loads_no_store_gpu_or_net_module() -> None:
    code = ("import json, sys, tui.app; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gpulayerd'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    assert "gpulayerd.models" in loaded and "gpulayerd.api.client" in loaded
    forbidden = [m for m in loaded if m.split(".")[:2] in (["gpulayerd", "store"], ["gpulayerd", "gpu"],
                                                           ["gpulayerd", "net"])]
    assert forbidden == [], f"tui loaded {forbidden}"


def test_tui_sources_name_no_other_gpulayerd_module() -> None:
    bad = []
    for path in sorted((REPO_ROOT / "tui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in names
                    if n.split(".")[0] == "gpulayerd" and n not in ALLOWED]
    assert bad == []
