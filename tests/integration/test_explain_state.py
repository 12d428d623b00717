"""``gpulayer explain`` of a job that is not waiting (issue 13), through a real daemon and the real CLI.

A running job's explanation names its node, GPUs and attempt; a failed one its exit code
and the end of its stderr; a succeeded one never says "fits" (it is not being placed).
"""

from __future__ import annotations

import os
import pwd

from gpulayerd.models import ExplanationModel

from .conftest import TERMINAL, Lab


def test_explain_says_where_a_job_runs_and_how_it_ended(lab: Lab) -> None:
    fake = lab.fake_gpus([24576, 24576])
    d = lab.daemon(fake=fake)
    health = d.call(lambda c: c.health())
    running = d.submit("--accelerator", "cuda", "--", "sh", "-c", "while [ ! -e release ]; do sleep 0.05; done")
    failed = d.submit("--", "sh", "-c", "echo boom >&2; exit 3")
    ok = d.submit("--", "sh", "-c", "echo fine")
    d.wait_status(running, {"running"})

    e = ExplanationModel.model_validate_json(d.cli_ok("explain", "--json", running))
    assert e.state is not None and e.verdict == "running", e
    gpus = d.job(running).attempts[-1].placement
    assert gpus is not None and len(gpus.device_indices) == 1
    assert (e.state.node, e.state.gpus, e.state.attempt) == (health.node_id, gpus.device_indices, 1)
    assert e.state.since is not None and e.state.lease_expires_at is not None
    assert e.workers == [] and "fits" not in e.model_dump_json()
    text = d.cli_ok("explain", running)
    assert "verdict: running" in text and f"GPU {gpus.device_indices[0]}" in text and "fits" not in text, text

    assert d.wait_status(failed, TERMINAL).status == "failed"
    e = ExplanationModel.model_validate_json(d.cli_ok("explain", "--json", failed))
    assert e.state is not None and e.verdict == "failed: exited 3", e
    assert (e.state.exit_code, e.state.node, e.state.stderr_tail) == (3, health.node_id, ["boom"])
    assert e.state.duration_s is not None and e.state.duration_s >= 0
    text = d.cli_ok("explain", failed)
    assert "exit code:" in text and "  boom" in text and "fits" not in text, text

    assert d.wait_status(ok, TERMINAL).status == "succeeded"
    r = d.cli("explain", "--json", ok)
    assert r.returncode == 0 and "fits" not in r.stdout, r.stdout
    assert ExplanationModel.model_validate_json(r.stdout).verdict == "succeeded"
    r = d.cli("explain", ok)
    assert r.returncode == 0 and "fits" not in r.stdout and "verdict: succeeded" in r.stdout, r.stdout
    for args in (("show", "--json", ok), ("show", "--json", failed), ("show", ok)):  # no stale match in the view
        assert "fits" not in d.cli_ok(*args), args

    # Cancelled: by whom (the account that ran gpulayer cancel).
    assert d.cli("cancel", running).returncode == 0
    assert d.wait_status(running, TERMINAL).status == "cancelled"
    e = ExplanationModel.model_validate_json(d.cli_ok("explain", "--json", running))
    assert e.state is not None and (e.verdict, e.state.by) == ("cancelled", pwd.getpwuid(os.getuid()).pw_name), e
    assert e.state.node == health.node_id and "fits" not in e.model_dump_json()
