"""Crafted input: Rich markup in peer text, deeply nested TOML, arguments that are not UTF-8, the
run key, Ctrl-C before the answer (defects a review found by attacking issues 14, 16 and 17).

Each test failed before its fix: a Rich-markup host/GPU/framework text crashed the TUI's tables,
a deeply nested TOML file (profiles, job spec) and a non-UTF-8 argument printed tracebacks,
``gpulayer run`` advised a ``--key`` it did not accept, and Ctrl-C before the submit answer
exited silently although the job may have been stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from textual.app import App, ComposeResult

import gpulayerd.cli.jobs as cli_jobs
from gpulayer_tui.widgets.keyed_table import KeyedTable
from gpulayerd.cli import EXIT_USAGE, build_parser, main
from gpulayerd.cli.exits import EXIT_INTERRUPTED
from gpulayerd.host.profile_files import ProfileFileError, load_profiles
from tests.tui.helpers import screen_text

NESTED = "[" * 3000 + "]" * 3000


class _Table(KeyedTable):
    COLUMNS: ClassVar = (("host", "HOST"), ("name", "NAME"))


class _TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield _Table()


@pytest.mark.asyncio
async def test_keyed_table_shows_peer_text_with_rich_markup_as_typed() -> None:
    # a peer named "[/]" made DataTable raise MarkupError (the TUI died); "[link=...]" hid a hyperlink
    app = _TableApp()
    async with app.run_test(size=(100, 10)) as pilot:
        table = app.query_one(_Table)
        table.sync_rows({"a": ("[/]", "[link=https://evil.example]GPU[/link]")})
        await pilot.pause()
        table.sync_rows({"a": ("[/]", "[bold]changed")})  # the update-in-place path too
        await pilot.pause()
        shown = screen_text(app)
        assert "[/]" in shown and "[bold]changed" in shown


def test_deeply_nested_profile_file_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text(f"[profile.x]\nframeworks = {NESTED}\n", encoding="utf-8")
    with pytest.raises(ProfileFileError, match="nested too deeply"):
        load_profiles([path])


def test_deeply_nested_job_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.toml"
    path.write_text(f'command = ["true"]\nenv = {NESTED}\n', encoding="utf-8")
    assert main(["--socket", str(tmp_path / "none.sock"), "submit", "-f", str(path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"gpulayer: {path}: malformed TOML: arrays or tables nested too deeply\n"


@pytest.mark.parametrize("argv", [["show", "\udcff"], ["jobs", "--user", "\udcff"],
                                  ["submit", "--name", "a\udc9bb", "--", "true"]])
def test_an_argument_that_is_not_utf8_is_a_usage_error(argv: list[str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # $'\xff' in argv arrives as the surrogate \udcff: it was a UnicodeEncodeError traceback
    assert main(["--socket", str(tmp_path / "none.sock"), *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("gpulayer: an argument is not valid UTF-8 text (byte 0x") and "Traceback" not in err


def test_run_accepts_the_key_its_timeout_message_names() -> None:
    args = build_parser().parse_args(["run", "--key", "k-1", "--", "true"])
    assert args.key == "k-1"


def test_ctrl_c_before_the_submit_answer_names_the_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_jobs, "call_daemon", interrupted)
    monkeypatch.chdir(tmp_path)
    assert main(["--socket", str(tmp_path / "none.sock"), "submit", "--key", "k-2", "--", "true"]) == EXIT_INTERRUPTED
    assert "the job may be queued: gpulayer jobs (rerun with --key k-2" in capsys.readouterr().err
