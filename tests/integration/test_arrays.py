"""Job arrays and dependencies against one real CPU daemon (4 slots) shared by the module: ``%MAX``
holds, every task sees its index, ``cancel ID_7`` and ``cancel ID``, ``--after ARRAY``, a failed
dependency, and bad input (exit 2, nothing stored)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import GPULAYER, Daemon, Lab, clean_env, wait_until

TASK = ("mkdir -p run seen idx; touch run/{task}; ls run | wc -l > seen/{task}; "
        "echo $GPULAYER_ARRAY_ID $GPULAYER_ARRAY_TASK_ID $GPULAYER_ARRAY_TASK_COUNT > idx/{task}; "
        "sleep 0.4; rm run/{task}")


@pytest.fixture(scope="module")
def daemon(shared_lab: Lab) -> Daemon:
    return shared_lab.daemon(cpu_slots=4)


def _ended(d: Daemon, job_id: str, timeout_s: float = 60.0) -> dict[str, object]:
    wait_until(lambda: d.show(job_id)["status"] in ("succeeded", "failed", "cancelled"), timeout_s,
               f"job {job_id} to end")
    return d.show(job_id)


def test_an_array_with_max_3_never_runs_more_than_3_and_every_task_sees_its_index(daemon: Daemon,
                                                                                 tmp_path: Path) -> None:
    array = daemon.submit("--array", "0-11%3", "--workdir", str(tmp_path), "--name", "sweep", "--", "sh", "-c", TASK)
    most = 0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        view = daemon.show(array)
        counts = view["array"]["counts"]
        most = max(most, sum(counts.get(s, 0) for s in ("queued", "claimed", "running")))
        if view["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.05)
    assert view["status"] == "succeeded", view["reason"]
    assert view["reason"] == "all 12 tasks succeeded"
    assert most <= 3
    assert max(int((tmp_path / "seen" / str(i)).read_text()) for i in range(12)) <= 3
    for i in range(12):
        assert (tmp_path / "idx" / str(i)).read_text().split() == [array, str(i), "12"]
    tasks = daemon.cli_json("jobs", "--json", "--all")
    assert {t["id"] for t in tasks if t.get("array_id") == array} == {f"{array}_{i}" for i in range(12)}
    collapsed = daemon.cli_ok("jobs", "--all")
    assert f"{array}_" not in collapsed and array in collapsed
    assert f"{array}_7" in daemon.cli_ok("jobs", "--all", "--tasks")
    assert daemon.cli_ok("logs", f"{array}_7") == ""


def test_cancel_a_task_then_the_array(daemon: Daemon, tmp_path: Path) -> None:
    array = daemon.submit("--array", "5-8", "--workdir", str(tmp_path), "--", "sleep", "60")
    wait_until(lambda: daemon.show(array)["array"]["counts"].get("running", 0) == 4, 20, "every task running")
    daemon.cli_ok("cancel", f"{array}_7")
    assert _ended(daemon, f"{array}_7")["status"] == "cancelled"
    assert daemon.show(f"{array}_6")["status"] == "running"
    daemon.cli_ok("cancel", array)

    def states() -> dict[str, str]:
        return {j["id"]: j["status"] for j in daemon.all_jobs() if j.get("array_id") == array or j["id"] == array}

    wait_until(lambda: set(states().values()) == {"cancelled"}, 30, "every task cancelled")
    assert len(states()) == 5


def test_cancel_a_task_before_it_was_materialized(daemon: Daemon, tmp_path: Path) -> None:
    """``cancel ID_3`` of a task still pending (``%1``: only one task at a time is written) cancels that
    task alone: its row is written cancelled ahead; the array runs every other index once and ends
    failed (one task did not succeed); an index the array does not have is still "no job"."""
    array = daemon.submit("--array", "0-4%1", "--workdir", str(tmp_path), "--", "sh", "-c",
                          f"touch {tmp_path}/ran-{{task}}; sleep 0.2")
    out = daemon.cli_ok("cancel", f"{array}_3")
    assert "cancelled" in out, out
    assert daemon.show(f"{array}_3")["status"] == "cancelled"
    counts = daemon.show(array)["array"]["counts"]
    assert sum(counts.values()) == 5 and counts["cancelled"] == 1, counts  # index 3 counted once, not pending too
    missing = daemon.cli("cancel", f"{array}_9")
    assert missing.returncode != 0 and "no job" in missing.stderr, (missing.returncode, missing.stderr)
    done = _ended(daemon, array)
    assert done["status"] == "failed" and "1 cancelled" in str(done["reason"]), done
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-0", "ran-1", "ran-2", "ran-4"]
    assert daemon.show(f"{array}_3")["attempts"] == []
    # --tasks lists them by index (task 3, written ahead, is the second row stored), and show tells both ways
    listed = [w for line in daemon.cli_ok("jobs", "--all", "--tasks").splitlines() for w in line.split()[:1]]
    assert [t for t in listed if t.startswith(f"{array}_")] == [f"{array}_{i}" for i in range(5)], listed
    shown = daemon.cli_ok("show", array)
    assert "  array:     0-4%1: 5 tasks, at most 1 at once; 4 succeeded, 1 cancelled\n" in shown, shown
    assert "  task:      index 3 of array " + array + " (5 tasks)\n" in daemon.cli_ok("show", f"{array}_3")


def test_a_cancelled_array_counts_its_tasks_never_written_as_cancelled(daemon: Daemon, tmp_path: Path) -> None:
    out = daemon.cli_ok("submit", "--array", "0-5%1", "--workdir", str(tmp_path), "--name", "held", "--", "sleep", "60")
    array = out.split()[2]
    assert out == f"submitted array {array} (held): 0-5%1, 6 tasks (at most 1 at once); queued\n"
    wait_until(lambda: daemon.show(array)["array"]["counts"].get("running", 0) == 1, 20, "one task running")
    daemon.cli_ok("cancel", array)
    done = _ended(daemon, array)
    assert done["status"] == "cancelled" and done["array"]["counts"] == {"cancelled": 6}, done["array"]
    assert str(done["reason"]).endswith("(6 cancelled of 6)"), done["reason"]
    assert f"{array}  held" in daemon.cli_ok("jobs", "--all") and "(6 cancelled of 6)" in daemon.cli_ok("jobs", "--all")


def test_after_an_array_waits_for_every_task(daemon: Daemon, tmp_path: Path) -> None:
    array = daemon.submit("--array", "0-3", "--workdir", str(tmp_path), "--", "sleep", "1")
    after = daemon.submit("--after", f"{array}:ok", "--", "true")
    view = daemon.wait_reason(after, lambda j: j.reason.startswith("Dependency: after "))
    assert array in view.reason and view.status == "queued"
    done = _ended(daemon, after)
    assert done["status"] == "succeeded"
    started = done["attempts"][0]["started_at"]
    for i in range(4):
        assert daemon.show(f"{array}_{i}")["attempts"][0]["ended_at"] <= started


def test_after_a_task_not_written_yet_waits_for_it_and_for_its_array_if_it_never_comes(daemon: Daemon,
                                                                                        tmp_path: Path) -> None:
    """``--after ID_3`` of a task an array (``%1``) has not written yet is taken, waits (``pending``) and
    runs after that task; of a task its array, cancelled first, will never write: cancelled."""
    array = daemon.submit("--array", "0-4%1", "--workdir", str(tmp_path), "--", "sh", "-c",
                          f"touch {tmp_path}/t{{task}}; sleep 0.3")
    after = daemon.submit("--after", f"{array}_3", "--", "sh", "-c", f"test -e {tmp_path}/t3")
    assert daemon.show(after)["spec"]["after"] == [f"{array}_3:ok"]
    assert _ended(daemon, after)["status"] == "succeeded"
    held = daemon.submit("--array", "0-9%1", "--workdir", str(tmp_path), "--", "sleep", "30")
    never = daemon.submit("--after", f"{held}_8", "--", "true")
    view = daemon.wait_reason(never, lambda j: j.reason.startswith("Dependency: after "))
    assert view.reason == f"Dependency: after {held}_8 (pending)", view.reason
    said = daemon.cli_ok("explain", never)  # the dependency decides first, then the table
    assert f"verdict: waits: Dependency: after {held}_8 (pending); then fits" in said, said
    daemon.cli_ok("cancel", held)
    done = _ended(daemon, never)
    assert (done["status"], done["reason"]) == ("cancelled", f"DependencyNeverSatisfied: {held}_8 cancelled")
    r = daemon.cli("submit", "--after", f"{held}_10", "--", "true")  # an index the array does not have
    assert r.returncode == 2 and f"no job '{held}_10'" in r.stderr, r.stderr


def test_a_dependency_that_failed_cancels_the_job_and_run_exits_1(daemon: Daemon) -> None:
    failing = daemon.submit("--", "false")
    waiting = daemon.submit("--after", failing, "--", "true")
    done = _ended(daemon, waiting)
    assert (done["status"], done["reason"]) == ("cancelled", f"DependencyNeverSatisfied: {failing} failed")
    r = subprocess.run([GPULAYER, "--state-dir", str(daemon.state_dir), "run", "--after", failing, "--", "true"],
                       cwd=daemon.work, env=clean_env(), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stderr
    assert daemon.cli_ok("jobs", "--json", "--all").count('"id"') >= 3
    notok = daemon.submit("--after", f"{failing}:notok", "--", "true")
    assert _ended(daemon, notok)["status"] == "succeeded"


def test_a_running_array_is_listed_counted_and_named_as_running(daemon: Daemon, tmp_path: Path) -> None:
    array = daemon.submit("--array", "0-3%2", "--workdir", str(tmp_path), "--", "sleep", "30")
    wait_until(lambda: daemon.show(array)["array"]["counts"].get("running", 0) == 2, 20, "two tasks running")
    running = {j["id"] for j in daemon.cli_json("jobs", "--json", "--state", "running")}
    queued = {j["id"] for j in daemon.cli_json("jobs", "--json", "--state", "queued")}
    assert array in running and array not in queued  # as it shows, not as its row is stored
    assert {f"{array}_0", f"{array}_1"} <= running
    me = [u for u in daemon.cli_json("users", "--json") if u["jobs_running"]]
    assert [(u["jobs_running"], u["jobs_queued"]) for u in me] == [(2, 0)], me  # its tasks, not its row
    after = daemon.submit("--after", array, "--", "true")
    view = daemon.wait_reason(after, lambda j: j.reason.startswith("Dependency: after "))
    assert view.reason == f"Dependency: after {array} (running)", view.reason
    daemon.cli_ok("cancel", array)
    assert _ended(daemon, after)["reason"] == f"DependencyNeverSatisfied: {array} cancelled"


def test_an_arrays_finished_tasks_hide_no_other_finished_job(daemon: Daemon, tmp_path: Path) -> None:
    plain = [daemon.submit("--", "true") for _ in range(3)]
    for job in plain:
        _ended(daemon, job)
    hidden = _hidden(daemon)
    array = daemon.submit("--array", "0-24", "--workdir", str(tmp_path), "--", "true")
    assert _ended(daemon, array)["status"] == "succeeded"
    assert _hidden(daemon) <= hidden + 1  # the array's row may push out one job; its tasks none
    listed = {j["id"] for j in daemon.cli_json("jobs", "--json")}  # the latest 20 finished by default
    assert set(plain) | {array} <= listed
    assert not any(j.startswith(f"{array}_") for j in listed)


def _hidden(d: Daemon) -> int:
    """How many older finished jobs ``gpulayer jobs`` says it hides (0: it says nothing)."""
    r = d.cli("jobs")
    assert r.returncode == 0, r.stderr
    words = [line.split()[0] for line in r.stderr.splitlines() if "older job" in line]
    return int(words[0]) if words else 0


@pytest.mark.parametrize(("args", "field"), [
    (("--array", "9-1"), "array: '9-1': range '9-1' is reversed"),
    (("--array", "0-9:0"), "array: '0-9:0': step 0"),
    (("--array", "0-9%0"), "array: '0-9%0': %MAX must be"),
    (("--array", "0-10000"), "max_array_size = 10000"),
    (("--after", "zzzznosuchjob"), "after: no job 'zzzznosuchjob'"),
    (("--after", "m8:sometimes"), "after: 'm8:sometimes': condition 'sometimes' is not one of ok, any, notok"),
])
def test_bad_input_exits_2_naming_the_field_and_stores_nothing(daemon: Daemon, args: tuple[str, ...],
                                                                field: str) -> None:
    before = len(daemon.all_jobs())
    r = daemon.cli("submit", *args, "--", "true")
    assert r.returncode == 2, r.stderr
    assert field in r.stderr
    assert len(daemon.all_jobs()) == before
