"""gpulayerd.termsafe: every escape class is dropped, SGR kept on request, ``\\r`` overwrites, pieces cut anywhere."""

from __future__ import annotations

import pytest

from gpulayerd.termsafe import TerminalText, sanitize

# (what a job printed, what a terminal may be shown with SGR kept)
CASES = [
    ("plain text, ünïcödé, 日本\n", "plain text, ünïcödé, 日本\n"),
    ("\x1b[2J\x1b[Hcleared", "cleared"),  # CSI erase, cursor home
    ("\x1b[5A\x1b[41mOVERWRITE\x1b[0m", "\x1b[0;41mOVERWRITE\x1b[0m"),  # cursor up dropped, colour kept
    ("a\x1b[10;20rb\x1b[?1049hc\x1b[?25ld\x1b[>4;2me", "abcde"),  # scroll region, alt screen, modes
    ("\x1b]2;PWNED-TITLE\x1b\\after", "after"),  # OSC title ended by ST
    ("\x1b]0;title\x07after", "after"),  # OSC ended by BEL
    ("\x1b]52;c;cm0gLXJmIH4=\x07x", "x"),  # OSC 52: the clipboard
    ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),  # hyperlink: the text only
    ("\x1bPq#0;2;0;0;0\x1b\\d", "d"),  # DCS (sixel)
    ("\x1b_Gf=100;AAAA\x1b\\a\x1b^pm\x1b\\b\x1bXsos\x1b\\c", "abc"),  # APC (kitty graphics), PM, SOS
    ("\x9b2J\x9b31mred\x9d0;t\x9cok\x90q\x9c!", "\x1b[0;31mredok!\x1b[0m"),  # 8-bit CSI, OSC, DCS, ST
    ("\x85\x8d\x9a\x1b7\x1b8\x1bc\x1b(B\x1bMx", "x"),  # other C1 controls and ESC sequences
    ("a\x00b\x07c\x0ed\x7fe\x1b\x01f\x1bg\x1b", "abcdef"),  # C0, DEL, bare ESCs (ESC g is a sequence)
    ("tab\there\n", "tab\there\n"),
    ("evil\u202etxt.exe\u2028", "evil\\u202etxt.exe\\u2028"),  # bidi override and separators shown
    ("10%\r50%\r100%\n", "100%\n"),  # a progress bar: its last state
    ("long line\rshort\n", "shortline\n"),  # what is longer stays, as on a terminal
    ("\x1b[31mred\x1b[0m normal\rX\n", "X\x1b[0;31med\x1b[0m normal\n"),  # each cell keeps its style
    ("x_\b\bab", "ab"),
    ("\x1b[1;31mbold red\nnext\x1b[m line\n", "\x1b[0;1;31mbold red\x1b[0m\n\x1b[0;1;31mnext\x1b[0m line\n"),
    ("\x1b]2;unterminated\nshown\n", "\nshown\n"),  # a string ends at a newline
]


@pytest.mark.parametrize(("raw", "shown"), CASES)
def test_every_escape_class_is_dropped_and_sgr_kept(raw: str, shown: str) -> None:
    assert sanitize(raw) == shown


@pytest.mark.parametrize(("raw", "shown"), CASES)
def test_pieces_cut_anywhere_give_the_same_text(raw: str, shown: str) -> None:
    for cut in range(1, len(raw)):
        t = TerminalText()
        lines = t.feed(raw[:cut]) + t.feed(raw[cut:])
        last = t.end()
        assert ("\n".join([*lines, last]) if lines else last) == shown, (cut, raw)
    one_by_one = TerminalText()
    lines = [line for ch in raw for line in one_by_one.feed(ch)]
    last = one_by_one.end()
    assert ("\n".join([*lines, last]) if lines else last) == shown


def test_without_sgr_only_text_is_left() -> None:
    assert sanitize("\x1b[1;31mred\x1b[0m \x9b32mgreen\n", keep_sgr=False) == "red green\n"
    assert sanitize("\x1b[38;5;208mo\x1b[38:2::1:2:3mk", keep_sgr=False) == "ok"


def test_no_control_character_survives_any_input() -> None:
    every = "".join(chr(c) for c in range(0xA0)) + "\x1b[" + "".join(chr(c) for c in range(0x20, 0x80))
    for keep in (True, False):
        out = sanitize(every * 3, keep_sgr=keep)
        allowed = "\n\t\x1b" if keep else "\n\t"
        assert not [c for c in out if (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) and c not in allowed]
        if keep:  # an ESC only ever starts an SGR
            assert all(part[:1] == "[" and "m" in part for part in out.split("\x1b")[1:])


def test_the_partial_line_is_shown_as_it_is_now_and_overwritten_across_pieces() -> None:
    t = TerminalText()
    assert t.feed("epoch 1:  10%|#") == []
    assert t.partial == "epoch 1:  10%|#"
    assert t.feed("     |\repoch 1:  5") == []
    assert t.feed("0%|###   |\r") == []
    assert t.partial == "epoch 1:  50%|###   |"
    assert t.feed("epoch 1: 100%|######|\n") == ["epoch 1: 100%|######|"]
    assert t.partial == ""


def test_huge_csi_parameters_and_strings_keep_no_state() -> None:
    t = TerminalText()
    assert t.feed("\x1b[" + "1;" * 100_000) == []
    assert t.feed("mok\n") == ["ok"]  # too long to be a real SGR: dropped
    assert t.feed("\x1b]2;" + "x" * 100_000) == []
    assert t.feed("\x07done\n") == ["done"]


def test_wrap_ends_a_long_line_keeping_an_open_sequence_and_the_style() -> None:
    t = TerminalText()
    assert t.feed("ab\x1b]2;ti") == [] and t.width == 2
    assert t.wrap() == "ab" and t.width == 0
    assert t.feed("tle\x07\x1b[31mcd") == [] and t.wrap() == "\x1b[0;31mcd\x1b[0m"  # the title never shows
    assert t.feed("e\n") == ["\x1b[0;31me\x1b[0m"]
