"""Where a waiting job stands (issue 38): ``gpulayer show`` of a job waiting for a busy GPU names its
position, the job holding the GPU and a start estimate in words, from the holder's usual duration (its
user's earlier runs of the same command); "unknown" without such runs. A real daemon with one fake GPU."""

from __future__ import annotations

import re

import pytest

from .conftest import TERMINAL, Lab

GPU = ["--accelerator", "cuda", "--gpus", "1"]


@pytest.mark.slow
def test_show_names_the_position_the_holder_and_an_estimate_from_its_usual_duration(lab: Lab) -> None:
    d = lab.daemon(fake=lab.fake_gpus([24576]), cpu_slots=2)
    gate = lab.root / "open"
    hold = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]

    # A holder whose command never ran before: the waiting job's estimate is unknown.
    first = d.submit(*GPU, "--", *hold)
    d.wait_status(first, {"running"})
    waiting = d.submit(*GPU, "--", "true")
    d.wait_reason(waiting, lambda j: (j.reason or "").startswith(("Busy", "Resources")))
    shown = d.show(waiting)
    assert (shown["position"], [h["id"] for h in shown["holders"]]) == (1, [first]), shown
    assert shown["holders"][0]["usual_s"] is None and shown["estimate"].startswith("unknown: 1 of the 1 jobs"), shown
    gate.touch()
    assert d.wait_status(first, TERMINAL).status == "succeeded"
    assert d.wait_status(waiting, TERMINAL).status == "succeeded"

    # The same command has run (twice, once gated above and once here): the next holder has a usual duration.
    again = d.submit(*GPU, "--", *hold)
    assert d.wait_status(again, TERMINAL).status == "succeeded"
    gate.unlink()
    holder = d.submit(*GPU, "--", *hold)
    d.wait_status(holder, {"running"})
    behind = [d.submit(*GPU, "--", "true") for _ in range(2)]
    for job_id in behind:
        d.wait_reason(job_id, lambda j: (j.reason or "").startswith(("Busy", "Resources")))
    shown = d.show(behind[0])
    [h] = shown["holders"]
    assert (shown["position"], h["id"], h["runs"]) == (1, holder, 2), shown
    assert h["usual_s"] is not None and h["usual_s"] > 0 and h["elapsed_s"] is not None
    assert re.fullmatch(rf"after job {holder} ends, (likely within ~.+|soon, it has run longer than usual) "
                        r"\(basis: .+'s 2 earlier runs of the same command took .+ \(median\); it has run .+\)",
                        shown["estimate"]), shown["estimate"]
    assert d.show(behind[1])["position"] == 2
    text = d.cli_ok("show", behind[0])
    assert "position:  1 among the jobs queued here for the same devices" in text
    assert f"held by:   job {holder} of " in text and "usually " in text and "estimate:  after job" in text
    assert "usually:" in d.cli_ok("show", holder)  # the holder's own show: its usual duration
    explained = d.cli_json("explain", "--json", behind[1])
    assert (explained["position"], [h["id"] for h in explained["holders"]]) == (2, [holder]), explained
    assert explained["estimate"].startswith(f"after job {holder} ends, after the 1 job ahead of it") or \
        explained["estimate"].startswith("unknown: 1 jobs wait ahead"), explained["estimate"]
    assert "position:  2 among the jobs queued here for the same devices" in d.cli_ok("explain", behind[1])
    gate.touch()
    for job_id in (holder, *behind):
        assert d.wait_status(job_id, TERMINAL).status == "succeeded"


def test_a_cpu_job_names_the_runs_holding_the_cpu_slots_and_a_job_that_fits_nowhere_has_no_position(
        lab: Lab) -> None:
    d = lab.daemon(cpu_slots=1)
    gate = lab.root / "open-cpu"
    holder = d.submit("--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    d.wait_status(holder, {"running"})
    waiting = d.submit("--", "true")
    d.wait_reason(waiting, lambda j: (j.reason or "").startswith("Resources"))
    shown = d.show(waiting)
    assert (shown["position"], [h["id"] for h in shown["holders"]]) == (1, [holder]), shown
    nowhere = d.submit(*GPU, "--", "true")  # no GPU here: it waits for nothing a job holds
    d.wait_reason(nowhere, lambda j: bool(j.reason) and j.reason != "waiting for the scheduler")
    assert (d.show(nowhere)["position"], d.show(nowhere)["holders"]) == (None, [])
    d.cli_ok("cancel", nowhere)
    gate.touch()
    assert d.wait_status(waiting, TERMINAL).status == "succeeded"
