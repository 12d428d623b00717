"""Accounting (issue 37): ``gpulayer report`` sums what the attempts held, ``gpulayer history`` lists the
finished jobs, across a restart. A real daemon with fake GPUs; the expected figures are computed from
the attempts' own start and end times (``gpulayer show --json``)."""

from __future__ import annotations

import getpass

import pytest

from .conftest import TERMINAL, Lab


@pytest.mark.slow
def test_report_sums_the_attempts_gpu_and_slot_hours_and_history_survives_a_restart(lab: Lab) -> None:
    d = lab.daemon(fake=lab.fake_gpus([24576, 24576]), cpu_slots=2)
    me = getpass.getuser()
    cuda = ["--accelerator", "cuda"]
    jobs = {
        d.submit(*cuda, "--gpus", "1", "--", "sleep", "0.3"): (1, 0),
        d.submit(*cuda, "--gpus", "2", "--", "sleep", "0.2"): (2, 0),
        d.submit("--", "sleep", "0.25"): (0, 1),
        d.submit("--name", "broken", "--", "sh", "-c", "exit 4"): (0, 1),
    }
    ends = {j: d.wait_status(j, TERMINAL, timeout_s=30).status for j in jobs}
    assert sorted(ends.values()) == ["failed", "succeeded", "succeeded", "succeeded"], ends
    gpu_s = slot_s = 0.0
    waits = []
    for job_id, (gpus, slots) in jobs.items():
        shown = d.show(job_id)
        [attempt] = shown["attempts"]
        held = attempt["ended_at"] - attempt["started_at"]
        assert held > 0
        gpu_s += held * gpus
        slot_s += held * slots
        waits.append(attempt["started_at"] - shown["submitted_at"])

    report = d.cli_json("report", "--since", "1d", "--json")
    assert (report["scope"], report["by"]) == ("daemon", "user")
    [row] = report["rows"]
    assert (row["key"], row["jobs"], row["failures"]) == (me, 4, 1)
    assert row["gpu_hours"] == pytest.approx(gpu_s / 3600, rel=1e-9, abs=1e-12)
    assert row["cpu_slot_hours"] == pytest.approx(slot_s / 3600, rel=1e-9, abs=1e-12)
    waits.sort()
    assert row["median_wait_s"] == pytest.approx((waits[1] + waits[2]) / 2, abs=1e-6)
    by_model = d.cli_json("report", "--since", "1d", "--by", "gpu-model", "--json")["rows"]
    assert [(r["key"], r["jobs"], r["failures"]) for r in by_model] == [("NVIDIA Fake 24GB", 2, 0), ("cpu", 2, 1)]
    assert by_model[0]["gpu_hours"] == pytest.approx(gpu_s / 3600, rel=1e-9)
    assert by_model[1]["cpu_slot_hours"] == pytest.approx(slot_s / 3600, rel=1e-9)
    assert "GPU-HOURS" in d.cli_ok("report", "--since", "1d")
    assert d.cli("report", "--since", "yesterday").returncode == 2

    listed = [j["id"] for j in d.cli_json("history", "--since", "1h", "--json")]
    assert sorted(listed) == sorted(jobs)
    d.stop()
    d.start()
    assert sorted(j["id"] for j in d.cli_json("history", "--since", "1h", "--json")) == sorted(jobs)
    failed = d.cli_json("history", "--since", "1h", "--state", "failed", "--json")
    assert [(j["name"], j["exit_code"]) for j in failed] == [("broken", 4)]
    assert d.cli_json("report", "--since", "1d", "--json")["rows"][0]["jobs"] == 4  # the store's, after the restart
    assert d.cli("history", "--state", "running").returncode == 2


@pytest.mark.slow
def test_a_lab_report_sums_every_owners_jobs(lab: Lab) -> None:
    """``report --lab`` on one daemon covers the jobs owned by the other too (through the owners)."""
    from .loopback import loopback_cluster

    first, second = loopback_cluster(lab, [1, 1])
    me = getpass.getuser()
    ids = [(d, d.submit("--", "sleep", "0.2")) for d in (first, second, second)]
    for d, job_id in ids:
        assert d.wait_status(job_id, TERMINAL, timeout_s=30).status == "succeeded"
    mine = first.cli_json("report", "--since", "1h", "--json")
    assert (mine["scope"], [r["jobs"] for r in mine["rows"]]) == ("daemon", [1])
    lab_wide = first.cli_json("report", "--since", "1h", "--lab", "--json")
    assert (lab_wide["scope"], len(lab_wide["owners"]), lab_wide["missing"]) == ("lab", 2, [])
    [row] = lab_wide["rows"]
    assert (row["key"], row["jobs"], row["failures"]) == (me, 3, 0)
    slots = second.cli_json("report", "--since", "1h", "--json")["rows"][0]["cpu_slot_hours"]
    assert row["cpu_slot_hours"] == pytest.approx(mine["rows"][0]["cpu_slot_hours"] + slots, rel=1e-6)
    assert "the lab's jobs (owners: " in first.cli_ok("report", "--since", "1h", "--lab")
