"""The wheel installs the packages ``gpulayerd`` and ``gpulayer_tui`` (with its stylesheet), nothing else.

The TUI lives in ``tui/gpulayer_tui`` (a src/-like root): a top-level ``tui`` package would collide
in the environments users install gpulayer into. The wheel is built with setuptools' own build
backend (PEP 517 ``build_wheel``) from a copy of the sources, so the checkout gets no build/ dir.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("gpulayerd", "tui"):
        shutil.copytree(REPO_ROOT / name, src / name, ignore=ignore)
    out = tmp_path / "dist"
    out.mkdir()
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=240,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return out / r.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_gpulayerd_and_gpulayer_tui_only(tmp_path: Path) -> None:
    with zipfile.ZipFile(_build_wheel(tmp_path)) as wheel:
        names = wheel.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"gpulayerd", "gpulayer_tui"}
    assert "gpulayer_tui/app.tcss" in names
    assert "gpulayer_tui/__main__.py" in names
    assert "gpulayerd/py.typed" in names
    assert "gpulayerd/cli/__init__.py" in names
