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


def test_device_words_the_cli_and_the_tui_share() -> None:
    from gpulayerd.core.types import OUTSIDE_HOLDER

    assert text.ANOTHER_DAEMON == OUTSIDE_HOLDER
    a100 = "NVIDIA A100 80GB PCIe"
    assert text.device_name(a100, mig=True, mig_profile="3g.40gb", parent_index=4) == "MIG 3g.40gb on GPU 4"
    assert text.device_name(a100, mig=True, mig_profile="3g.40gb", uuid="MIG-1", wide=True) == f"{a100} MIG 3g.40gb MIG-1"
    assert text.device_name(None, lost=True, pci_bus_id="0000:41:00.0") == "GPU at 0000:41:00.0"
    assert (text.device_kind("cuda", True), text.device_kind("rocm", False)) == ("cuda/mig", "rocm")
    label = {"m8rs7eysv02m": "resnet50 (alice)"}.get
    assert text.device_state("m8rs7eysv02m", [], label) == "granted to resnet50 (alice)"  # never a bare id
    assert text.device_state("m8other (held)", [], label) == "granted to m8other (held)"
    assert text.device_state(OUTSIDE_HOLDER, []) == "granted to another gpulayerd"
    assert text.device_state("m8\x1b[2J", []) == "granted to m8\\x1b[2J"
    assert text.fault("lost", "Unknown Error") == "lost: Unknown Error" and text.fault("ok", "") is None
    assert text.fault("excluded", "") == "excluded (config)"
    assert [text.cpu_slots(8, 4), text.cpu_slots(1, 0), text.cpu_slots(None, None)] == [
        "8 slots (4 free)", "1 slot (0 free)", None]
    # a GPU split into 3 MIG instances is one GPU
    devices = [(a100, False), (a100, True), (a100, True), (a100, True), ("NVIDIA RTX A6000", False),
               ("NVIDIA RTX A6000", False), (None, False)]
    assert text.hardware(devices) == f"1x {a100}, 2x NVIDIA RTX A6000"
    assert text.hardware([]) == ""
    mig = {5000: "MIG 3g.40gb on GPU 4"}
    assert text.where("vm", [5000], names=mig) == "vm MIG 3g.40gb on GPU 4"
    assert text.where("vm", [0, 5000], names=mig) == "vm GPU 0 MIG 3g.40gb on GPU 4"


def test_columns_fit_a_width_and_a_pipe_is_not_padded_for_one_long_cell() -> None:
    # 10+40+30 cells and 3 gaps of 2 in 60: the second column down to 20, then the third hidden
    assert text.fit_widths([10, 40, 30], 60, [(1, 20), (2, 0), (1, 8)]) == [10, 20, 0]
    assert text.fit_widths([10, 40, 30], 100, [(1, 20)]) == [10, 40, 30]  # it fits: unchanged
    assert text.padded_width([20] * 41 + [102], 4) == 20  # one name of 102 cells among 42
    assert text.padded_width([20, 23, 9], 4) == 23 and text.padded_width([], 4) == 4
    assert text.wrap("granted to resnet50-imagenet (alice)", 20) == ["granted to", "resnet50-imagenet", "(alice)"]
    assert text.wrap("日本語の名前", 5) == ["日本", "語の", "名前"]  # wide characters never split
    assert text.cut("19.3/25.8 GB dedicated", 14, words=True) == "19.3/25.8 GB…"
    assert text.cut("19.3/25.8 GB dedicated", 14) == "19.3/25.8 GB …"
    message = "4 GPU(s) ok, 1 not: Unable to determine the device handle for GPU 0000:41:00.0"
    lines = text.table(["SOURCE", "MESSAGE"], [["nvidia-smi", message]], limit=40).splitlines()
    assert max(text.width(line) for line in lines) <= 40
    assert " ".join(line[12:] for line in lines[1:]) == message  # wrapped under its column
    piped = text.table(["NAME", "STATE"], [[f"job-{i}", "queued"] for i in range(20)] + [["n" * 80, "queued"]])
    assert max(text.width(line) for line in piped.splitlines()[:-1]) < 20
