"""gpulayer logs: how a finished job's outcome is said, rank prefixes on whole lines only, and job output
sanitized on a terminal (a pty) unless it is the reader's own job or ``--raw``."""

from __future__ import annotations

import argparse
import io
import os
import pwd
import select
import sys

import pytest

from gpulayerd.cli.logs import _Tail, follow_logs, outcome, sanitizes
from gpulayerd.models import JobSpec, JobView, LogChunk
from gpulayerd.termsafe import LONG_LINE, TerminalText


def _job(status: str, exit_code: int | None = None, reason: str = "") -> JobView:
    spec = JobSpec.model_validate({"command": ["true"], "workdir": "/tmp"})
    return JobView(id="j1", status=status, exit_code=exit_code, reason=reason, submitted_at=0.0, updated_at=0.0,
                   spec=spec)


def test_outcome_says_how_the_job_ended() -> None:
    assert outcome(_job("succeeded", 0)) == "job j1 succeeded"
    assert outcome(_job("failed", 3, "exited 3")) == "job j1 failed: exited 3"
    assert outcome(_job("failed", -9, "killed by SIGKILL")) == "job j1 failed: killed by SIGKILL"
    assert outcome(_job("cancelled", None, "cancelled by alice")) == "job j1 cancelled: cancelled by alice"
    assert outcome(_job("lost", None, "lost on ws-2\nlease expired")) == "job j1 lost: lost on ws-2"  # its first line


def test_a_rank_prefix_goes_before_each_whole_line() -> None:
    out = io.StringIO()
    t = _Tail(rank=1, prefix="[rank 1] ")
    t.emit("a\nb", out)
    assert out.getvalue() == "[rank 1] a\n"  # "b" waits for the rest of its line
    t.emit("c\n\nd", out)
    t.flush(out)
    assert out.getvalue() == "[rank 1] a\n[rank 1] bc\n[rank 1] \n[rank 1] d\n"
    plain = _Tail(rank=None, prefix="")
    plain.emit("x\ny", out := io.StringIO())
    assert out.getvalue() == "x\ny"


HOSTILE = "\x1b[2J\x1b[Hstep 1\n\x1b[5A\x1b[41mOVERWRITE\x1b[0m\n\x1b]2;PWNED-TITLE\x1b\\10%\r100%\n"


class _OneLog:
    """The two calls ``gpulayer logs`` makes, answering one finished job's stdout (stderr empty)."""

    def __init__(self, job: JobView, data: str) -> None:
        self.job_view, self.data = job, data.encode()

    def job(self, job_ref: str) -> JobView:
        return self.job_view

    def logs(self, job_ref: str, stream: str = "stdout", offset: int = 0, attempt: int | None = None,
             rank: int | None = None) -> LogChunk:
        data = self.data if stream == "stdout" else b""
        part = data[offset:offset + 7]  # small chunks: sequences arrive cut
        return LogChunk(job_id=job_ref, attempt=1, stream=stream, offset=offset, next_offset=offset + len(part),
                        data=part.decode(), complete=offset + len(part) >= len(data), size=len(data))


def _logs_on_a_pty(job: JobView, raw: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """What ``gpulayer logs`` writes to a terminal (a pty) for ``job``, whose stdout is :data:`HOSTILE`."""
    leader, follower = os.openpty()
    tty = os.fdopen(follower, "w", encoding="utf-8", closefd=True)
    monkeypatch.setattr(sys, "stdout", tty)
    args = argparse.Namespace(job="j1", follow=False, stderr=False, attempt=None, rank=None, raw=raw)
    try:
        assert tty.isatty()
        assert follow_logs(_OneLog(job, HOSTILE), args) == 0  # type: ignore[arg-type]
        tty.flush()
        out = b""
        while select.select([leader], [], [], 0)[0]:
            out += os.read(leader, 65536)
    finally:
        tty.close()
        os.close(leader)
    return out.replace(b"\r\n", b"\n")  # the pty's own newline translation


def _me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def test_logs_to_a_terminal_drop_every_escape_but_colour_unless_own_or_raw(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _logs_on_a_pty(_job("succeeded", 0).model_copy(update={"submitted_by": "mallory"}), False, monkeypatch)
    assert shown == b"step 1\n\x1b[0;41mOVERWRITE\x1b[0m\n100%\n"
    raw = _logs_on_a_pty(_job("succeeded", 0).model_copy(update={"submitted_by": "mallory"}), True, monkeypatch)
    assert raw == HOSTILE.encode().replace(b"\r\n", b"\n")
    own = _logs_on_a_pty(_job("succeeded", 0).model_copy(update={"submitted_by": _me()}), False, monkeypatch)
    assert own == raw  # the job's own user reads the bytes as written


def test_piped_output_is_never_sanitized() -> None:
    job = _job("succeeded", 0).model_copy(update={"submitted_by": "mallory"})
    assert not sanitizes(io.StringIO(), job, raw=False)


def test_a_sanitized_rank_prefix_goes_before_whole_lines_only() -> None:
    out = io.StringIO()
    t = _Tail(rank=0, prefix="[rank 0] ", safe=TerminalText())
    t.emit("\x1b]0;t\x07a\x1b[2", out)
    t.emit("Jb\r\nc", out)
    t.flush(out)
    assert out.getvalue() == "[rank 0] ab\n[rank 0] c\n"


def test_an_endless_line_to_a_terminal_is_cut_not_held_whole() -> None:
    """A job printing no newline (10 MB here; a GB as easily) made gpulayer logs hold it all (~20 bytes a
    character) before it printed anything: the line is cut once it is LONG_LINE long, as the terminal wraps it."""
    out = io.StringIO()
    t = _Tail(rank=None, prefix="", safe=TerminalText())
    for _ in range(10):
        t.emit("y" * 2**20, out)
        assert t.safe is not None and t.safe.width < LONG_LINE
    t.emit("\x1b]2;t\x07end\n", out)
    t.flush(out)
    lines = out.getvalue().split("\n")
    assert lines[-2:] == ["end", ""] and "".join(lines) == "y" * 10 * 2**20 + "end"
