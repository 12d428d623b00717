"""gpulayer logs: how a finished job's outcome is said, and rank prefixes on whole lines only."""

from __future__ import annotations

import io

from gpulayerd.cli.logs import _Tail, outcome
from gpulayerd.models import JobSpec, JobView


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
