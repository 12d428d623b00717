"""The CLI on a terminal: help on every option, jobs fitted to the width in display cells, names
without control characters, escaped text, completion, readable errors, run's exit codes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpulayerd import text
from gpulayerd.cli import build_parser, main
from gpulayerd.cli.completion import script
from gpulayerd.cli.exits import UsageError
from gpulayerd.cli.jobs_table import DEFAULT, line_width, parse_columns, render_jobs
from gpulayerd.cli.run import exit_code_of
from gpulayerd.models import JobSpec, JobView, SpecError, job_spec_from_mapping

LONG = "n" * 70
CJK = "訓練ジョブ長い名前の実験その一二三四五六七八九十"
WAITING = ("Accelerator: no worker has a cuda device gpulayer runs jobs on (ws-1 is CPU-only); "
           "checked /usr/bin/python3.11")


def _job(job_id: str, name: str | None, status: str = "queued", reason: str = "") -> JobView:
    spec = JobSpec.model_validate({"command": ["true"], "workdir": "/tmp", "name": name, "user": "alice"})
    return JobView(id=job_id, name=name, status=status, reason=reason, submitted_at=0.0, updated_at=0.0, spec=spec)


def _options(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                out += _options(sub, f"{path} {name}")
        elif not isinstance(a, argparse._HelpAction):
            out.append((path, a))
    return out


def test_every_option_and_argument_of_every_command_has_help() -> None:
    actions = _options(build_parser(), "gpulayer")
    assert len(actions) > 60  # the walk reached the subcommands
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in actions if not a.help]
    assert missing == []


def test_gpulayerd_has_a_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulayerd.__main__ import _parser

    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("gpulayerd ")


def test_jobs_lines_fit_80_cells_with_a_long_and_a_cjk_name() -> None:
    jobs = [_job("m8qgmtbntdp5", LONG, "running", "running on ws-1"), _job("m8qgmtf8q1vv", CJK, reason=WAITING),
            _job("m8qgmtf8q1vw", "plain", reason="Resources: cpu slots 0 free of 2 on ws-1 (needs 1)")]
    out = render_jobs(jobs, DEFAULT, 80, now=10.0)
    lines = out.splitlines()
    assert [text.width(line) for line in lines if text.width(line) > 80] == []
    assert lines[0].split() == ["ID", "NAME", "USER", "STATE", "WHERE", "AGE", "REASON"]
    # The reason keeps its code and deciding words (a long one goes on over more lines in its column);
    # the cut names end in "…" at the same column.
    assert "Accelerator: no worker has" in lines[2]
    assert " ".join(line.strip() for line in lines[2:6]).endswith("(ws-1 is CPU-only); checked /usr/bin/python3.11")
    assert "Resources: cpu slots 0 free" in lines[6] and lines[7].strip() == "of 2 on ws-1 (needs 1)"
    assert "…" in lines[1] and "…" in lines[2]
    rows = [line for line in lines[1:] if " alice " in line]
    assert len(rows) == 3
    starts = {text.width(line[: line.index(" alice ")]) for line in rows}
    assert len(starts) == 1, starts  # USER starts in the same cell on every row (CJK counted as 2)


def test_jobs_without_a_limit_cut_nothing() -> None:
    out = render_jobs([_job("j1", LONG, reason=WAITING)], DEFAULT, None, now=0.0)
    assert LONG in out and WAITING in out


def test_line_width_comes_from_columns_else_none_when_piped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert line_width(wide=False) == 80
    assert line_width(wide=True) is None
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys, "stdout", SimpleNamespace(isatty=lambda: False))
    assert line_width(wide=False) is None


def test_format_columns_like_squeue_and_unknown_ones_list_the_allowed() -> None:
    assert parse_columns("ID,state,Reason") == ["id", "state", "reason"]
    out = render_jobs([_job("j1", "x", reason=WAITING)], parse_columns("id,code"), None, now=0.0)
    assert out.splitlines() == ["ID  CODE", "j1  Accelerator"]
    with pytest.raises(UsageError, match=r"unknown column 'bogus'.*id,name,user,owner,state,where,age"):
        parse_columns("id,bogus")
    assert main(["jobs", "-o", "id,bogus"]) == 2  # before any call to a daemon


def test_names_from_peers_are_escaped_in_tables() -> None:
    out = render_jobs([_job("j1", "a\x1b[31mb\nfake row")], ["id", "name"], 80, now=0.0)
    assert "\x1b" not in out and "\n" not in out.split("\n", 1)[1]
    assert "a\\x1b[31mb\\nfake row" in out
    assert "\x1b" not in text.table(["NAME"], [["\x1b]0;title\x07"]])


@pytest.mark.parametrize("name", ["a\x1b[31mb", "a\nfake row", "tab\there", "del\x7f", "c1\x9b2J"])
def test_control_characters_in_a_name_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(SpecError, match=r"(?m)^name: must not contain control characters"):
        job_spec_from_mapping({"name": name, "command": ["true"]}, base_dir="/")
    assert job_spec_from_mapping({"name": "訓練 ok", "command": ["true"]}, base_dir="/").name == "訓練 ok"
    # A stored job or a peer's view with such a name still reads (it is escaped where shown).
    assert _job("j1", name).name == name


def test_unknown_memory_is_a_dash_and_http_errors_are_sentences() -> None:
    assert text.memory(None, None, "dedicated") == "—"
    msg = text.http_error(413, b"Maximum request body size 4194304 exceeded, actual body size 5000001")
    assert msg.startswith("the request is too large for the daemon")
    assert "HTTP 413: Maximum request body size 4194304 exceeded" in msg and "b'" not in msg


def test_bash_completion_offers_submit_for_su() -> None:
    src = script("bash")
    shell = ('eval "$GL_COMPLETION"; COMP_WORDS=(gpulayer su); COMP_CWORD=1; COMP_LINE="gpulayer su"; '
             'COMP_POINT=${#COMP_LINE}; _shtab_gpulayer gpulayer su gpulayer; printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", shell], env={"GL_COMPLETION": src, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    assert "submit" in r.stdout.split()
    assert script("zsh").startswith("#compdef gpulayer")
    assert "-a submit" in script("fish")


@pytest.mark.parametrize(("status", "exit_code", "want"), [
    ("succeeded", 0, 0), ("failed", 3, 3), ("failed", -9, 137), ("cancelled", -15, 143),
    ("rejected", None, 1), ("lost", None, 1), ("cancelled", None, 1),
])
def test_run_exits_with_the_jobs_exit_code(status: str, exit_code: int | None, want: int) -> None:
    assert exit_code_of(SimpleNamespace(status=status, exit_code=exit_code)) == want


def test_cut_counts_cells_and_never_splits_a_wide_character() -> None:
    assert text.cut("訓練ジョブ", 5) == "訓練…"
    assert text.cut("訓練ジョブ", 6) == "訓練…"  # a third wide character would need cells 5-6 and the "…"
    assert text.cut("abc", 3) == "abc"


def test_show_escapes_the_name_reason_and_history_of_a_job() -> None:
    from gpulayerd.cli.render import render_job

    out = render_job(_job("j1", "a\x1b]0;title\x07b", reason="Resources: on \x1b[2Jws-1"))
    assert "\x1b" not in out and "\x07" not in out
    assert "a\\x1b]0;title\\x07b" in out and "Resources: on \\x1b[2Jws-1" in out


def test_devices_without_a_daemon_says_it_probes_this_machine_itself(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, rocm-smi, sysctl: a quick CPU-only probe
    assert main(["--state-dir", str(tmp_path), "devices", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "no gpulayerd answered: probing this machine directly" in err
    assert '"devices": []' in out


GPU_BOX = Path(__file__).resolve().parents[2] / "data" / "gpu-box.json"
"""A lab box as the probe sees tests.fakes.nvidia_recorded.lab_box (MIG instance 5000 granted to a job)."""


def test_devices_fit_80_columns_and_name_the_holder(tmp_path: Path) -> None:
    from gpulayerd.cli.render import render_capabilities
    from gpulayerd.gpu.metrics import metrics_argv
    from gpulayerd.models import Capabilities
    from tests.fakes.nvidia_recorded import lab_box
    from tests.integration.components.test_hardware_truth import probe, worker_of

    saved = Capabilities.model_validate_json(GPU_BOX.read_bytes())
    probed, _ = worker_of(probe(tmp_path, lab_box(metrics_argv("nvidia-smi", 1000)[1:]))[0])
    # the saved box (the TUI tests show it) is what the probe finds in the recordings
    assert ([d.model_dump(exclude={"granted_to"}) for d in probed.devices]
            == [d.model_dump(exclude={"granted_to"}) for d in saved.devices])
    out = render_capabilities(saved, limit=80, label={"m8rs7eysv02m": "resnet50 (alice)"}.get)
    assert max(text.width(line) for line in out.splitlines()) <= 80, out
    lines = out.splitlines()
    mig = lines.index(next(line for line in lines if line.startswith("  5000 ")))
    assert "MIG 3g.40gb on GPU 4" in lines[mig]
    assert "granted to resnet50 (alice)" in lines[mig + 1]  # the rest on an indented second line
    assert "lost: Unable to determine the" in out and "8 slots (4 free)" in out
    wide = render_capabilities(saved).splitlines()  # no limit: one line per device, the holder's id
    assert any(line.startswith("  5000 ") and line.endswith("granted to m8rs7eysv02m") for line in wide)


def test_piped_jobs_are_not_padded_for_one_long_name() -> None:
    jobs = [_job(f"m8j{i:09d}", f"train-{i}", "succeeded", "exited 0") for i in range(41)]
    jobs.append(_job("m8jlong", "x" * 102, reason=WAITING))
    lines = render_jobs(jobs, DEFAULT, None, now=10.0).splitlines()
    assert "x" * 102 in lines[-1] and WAITING in lines[-1]  # whole, never cut
    assert max(text.width(line) for line in lines[:-1]) < 70  # the other rows keep their width


def test_explain_in_an_80_column_terminal_wraps_found_at_spaces_under_its_column() -> None:
    from gpulayerd.cli.render import render_explanation
    from gpulayerd.core.matching.evaluate import explain
    from gpulayerd.gpu.support import SUPPORT_MATRIX
    from gpulayerd.models import ExplanationModel
    from tests.unit.test_matching import CUDA1, GB, cuda, job, worker

    j = job(**CUDA1, gpu_memory_bytes=24 * GB, min_cuda_compute_capability=(8, 0))
    w = worker(devices=(cuda(0, 16.0, cc=(8, 9)), cuda(1, 48.0, cc=(7, 0)), cuda(2, 48.0, cc=(7, 0))))
    e = ExplanationModel.from_core(explain(j, [w], SUPPORT_MATRIX))
    out = render_explanation(e, "job j", limit=80)
    assert max(text.width(line) for line in out.splitlines()) <= 80, out
    words = " ".join(out.split())  # every word whole: joined again, the found text reads as it was
    assert "2 of 3 device(s) meet it, not on the same device as the rest: GPU 0: 16.0 GB dedicated" in words
    assert render_explanation(e, "job j") != out  # a pipe gets the lines whole
