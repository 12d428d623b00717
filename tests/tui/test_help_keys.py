"""``gpulayer tui --help`` lists every key the TUI binds (no app started: the classes' bindings)."""

from __future__ import annotations

import subprocess

from textual.binding import Binding

from gpulayer_tui.app import GpulayerApp
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.log_view import LogView
from gpulayerd.cli.tui import KEYS
from tests.tui.daemon import clean_env, tool

SHOWN_AS = {"question_mark": "?", "slash": "/", "escape": "esc", "pageup": "PgUp", "pagedown": "PgDn",
            "home": "Home", "end": "End", "f1": "F1", "f9": "F9", "f10": "F10"}
NOT_LISTED = {"left", "right"}  # sideways scrolling of a wide table, as in every terminal app


def test_tui_help_lists_every_key_the_tui_binds() -> None:
    listed = " ".join(k for k, _ in KEYS)
    listed_words = set(listed.replace(",", " ").replace("/", " / ").replace("(", " ").replace(")", " ").split())
    listed_words |= {w for _, what in KEYS for w in what.replace(",", " ").replace("/", " ").replace("(", " ").replace(":", " ").split()}
    for owner in (GpulayerApp, MainScreen, JobsTable, JobDetailScreen, LogView):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding)
            for key in binding.key.split(","):
                if key in NOT_LISTED:
                    continue
                assert SHOWN_AS.get(key, key) in listed_words, (owner.__name__, key, listed)
    r = subprocess.run([tool("gpulayer"), "tui", "--help"], capture_output=True, text=True, env=clean_env(),
                       timeout=30, check=False)
    assert r.returncode == 0 and "keys:" in r.stdout and "ctrl+c" in r.stdout and "acc:cuda" in r.stdout, r
