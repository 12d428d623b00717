"""Every waiting job carries its own reason, with a short code (real daemon, `gpulayer jobs`)."""

from __future__ import annotations

import re
import time
from typing import Any

from .conftest import Daemon, Lab

BUSY = re.compile(r"^Resources: cpu slots 1 free of 2 on \S+ \(needs 2\)$")


def _waiting(d: Daemon, ids: list[str], timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """One `gpulayer jobs --json` response in which every job of ``ids`` has a judged reason."""
    end = time.monotonic() + timeout_s
    while True:
        listed = {j["id"]: j for j in d.cli_json("jobs", "--json")}
        jobs = [listed.get(i) for i in ids]
        if all(j is not None and j["reason_code"] not in ("", "Pending") for j in jobs):
            return [j for j in jobs if j is not None]
        if time.monotonic() > end:
            raise AssertionError(f"no reasons within {timeout_s} s: {jobs}\n{d.log_tail()}")
        time.sleep(0.1)


def test_two_identical_jobs_behind_a_busy_cpu_slot_both_say_busy_with_the_numbers(lab: Lab) -> None:
    d = lab.daemon(cpu_slots=2)
    holder = d.submit("--", "sh", "-c", "while [ ! -e release ]; do sleep 0.05; done")
    d.wait_status(holder, {"running"})
    same = [d.submit("--nproc", "2", "--", "python", "train.py") for _ in range(2)]  # 2 slots each
    try:
        first, second = _waiting(d, same)
        assert (first["status"], second["status"]) == ("queued", "queued")
        assert (first["reason_code"], second["reason_code"]) == ("Resources", "Resources"), (first, second)
        assert BUSY.match(first["reason"]) and second["reason"] == first["reason"], (first, second)

        table = d.cli_ok("jobs")
        for job_id in same:
            line = next(x for x in table.splitlines() if x.startswith(job_id))
            assert "Resources: cpu slots 1 free of 2 on" in line, table
    finally:
        for job_id in same:
            d.cli("cancel", job_id)
        (d.work / "release").touch()
    assert d.wait_status(holder, {"succeeded"}).status == "succeeded"
