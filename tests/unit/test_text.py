"""gpulayerd.text: unknown values, control characters made visible, widths in terminal cells."""

from __future__ import annotations

from gpulayerd import text


def test_none_prints_as_a_dash() -> None:
    assert text.text(None) == text.DASH
    assert text.gb(None) == text.DASH
    assert text.ago(None, 100.0) == text.DASH
    assert text.clock(None) == text.DASH
    assert text.table(["A", "B"], [["x", None]]).splitlines()[1] == f"x  {text.DASH}"


def test_escape_makes_control_characters_visible() -> None:
    assert text.escape("plain text, ünïcödé, 日本") == "plain text, ünïcödé, 日本"
    assert text.escape("\x1b]0;title\x07\x1b[2J") == "\\x1b]0;title\\x07\\x1b[2J"
    assert text.escape("a\nfake row\r\tx") == "a\\nfake row\\r\\tx"
    assert text.escape("\x7f\x9b\u2028\u202e") == "\\x7f\\x9b\\u2028\\u202e"
    assert text.escape("") == ""


def test_width_counts_terminal_cells() -> None:
    assert text.width("abc") == 3
    assert text.width("日本") == 4
    assert text.width("e\u0301") == 1  # a combining accent takes no cell
    assert text.ljust("日本", 6) == "日本  "


def test_table_aligns_wide_characters_by_cells() -> None:
    lines = text.table(["NAME", "STATE"], [["日本語", "queued"], ["ab", "running"]]).splitlines()
    assert [text.width(line.split("  ")[0]) for line in lines] == [4, 6, 2]
    assert [text.width(line[: line.index(s)]) for line, s in zip(lines, ["STATE", "queued", "running"],
                                                                  strict=True)] == [8, 8, 8]


def test_short_forms() -> None:
    assert [text.age(s) for s in (-5, 42, 600, 7200, 200000)] == ["0s", "42s", "10m", "2h", "2d"]
    assert text.one_line("first\nsecond") == "first"
    assert text.one_line("x" * 100, 10) == "x" * 9 + "…"
    assert text.memory(24 * 10**9, 12 * 10**8, "dedicated") == "1.2 / 24.0 GB dedicated"
    assert text.memory(16 * 10**9, None, "unified") == "16.0 GB unified (system RAM)"
    assert text.device_state(None, [1, 2]) == "busy (pid 1, 2)"
    assert text.mark(None) == "?"


def test_where_size_and_the_peers_down_notice() -> None:
    assert text.where("ws-2", [0, 1]) == "ws-2 GPU 0,1"
    assert text.where("ws-2") == "ws-2"
    assert text.where("h1", [0], ["h2", "h3"]) == "h2+h3"  # a multi-host job: its hosts by rank
    assert text.where(None) is None
    assert [text.size(n) for n in (0, 999, 1234, 5_600_000, 7 * 10**9)] == ["0 B", "999 B", "1.2 kB", "5.6 MB",
                                                                            "7.0 GB"]
    assert text.peers_down(0) == ""
    assert text.peers_down(1) == "1 peer down: their jobs are not listed"
    assert text.peers_down(2) == "2 peers down: their jobs are not listed"
