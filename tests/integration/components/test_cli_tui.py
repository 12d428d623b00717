"""``gpulayer tui`` finds the TUI package at run time; gpulayerd works without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulayerd import cli

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_tui_without_the_package_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "gpulayer_tui", None)  # importing it raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "gpulayer_tui.launch", raising=False)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert cli.main(["--socket", "/nonexistent/gpulayerd.sock", "tui"]) == cli.EXIT_FAILURE
    assert "the TUI package gpulayer_tui is not installed" in capsys.readouterr().err


def test_tui_needs_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--socket", "/nonexistent/gpulayerd.sock", "tui"]) == cli.EXIT_USAGE
    assert "needs a terminal" in capsys.readouterr().err


def test_the_cli_imports_no_tui_client_or_model_module_at_start() -> None:
    code = ("import json, sys, gpulayerd.cli; cli = sys.modules['gpulayerd.cli']; cli.build_parser(); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('gpulayer_tui', 'textual', 'aiohttp', 'pydantic') or m in ('gpulayerd.models', 'gpulayerd.api.client'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_python_m_gpulayer_tui_asks_for_the_socket() -> None:
    r = subprocess.run([sys.executable, "-m", "gpulayer_tui"], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=60, check=False, env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "give --socket PATH" in r.stderr
