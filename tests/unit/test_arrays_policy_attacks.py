"""Attacks on arrays, dependencies, time limits and retries (issues 32, 33): bad input is refused
naming its field with a short message, the wire's new fields are bounded, and an array's tasks are
materialized once across a crash in the middle of the transaction. No process, no sleep."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpulayerd.core.protocol.claims import JobStatus
from gpulayerd.models import SpecError, job_spec_from_mapping
from gpulayerd.net.wire import Kill, RunReport
from gpulayerd.store import JobRow, Store, StoreError

T0 = 1_700_000_000.0


@pytest.mark.parametrize(("extra", "field"), [
    ({"policy": {"time_limit": "99999999d"}}, "policy.time_limit"),
    ({"policy": {"time_limit": "1e308"}}, "policy.time_limit"),
    ({"policy": {"time_limit": 1e308}}, "policy.time_limit"),
    ({"after": ["m8" + "a" * 100_000]}, "after"),
    ({"after": ["\x1b]52;c;aGk=\x07"]}, "after"),
    ({"after": ["../x:ok"]}, "after"),
    ({"array": "0-9%\u00b2"}, "array"),  # '²'.isdigit() is True, int('²') raises
    ({"array": "\u0660-\u0669"}, "array"),  # Arabic-Indic digits: int() takes them, the message would not
    ({"policy": {"retry_exit_codes": list(range(256, 10_256))[:256]}}, "policy.retry_exit_codes"),
])
def test_bad_input_is_refused_naming_the_field_in_a_short_message(extra: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as e:
        job_spec_from_mapping({"command": ["true"], **extra}, source="job spec")
    assert field in str(e.value)
    assert len(str(e.value)) < 2000, str(e.value)[:300]  # an input of 100 kB is not echoed back


def test_a_year_is_the_longest_time_limit() -> None:
    spec = job_spec_from_mapping({"command": ["true"], "policy": {"time_limit": "366d"}})
    assert spec.policy.time_limit == 366 * 86_400


def test_a_kill_names_only_a_signal_a_job_may_get_first() -> None:
    """A Kill (from the job's owner) naming KILL, STOP or a name the worker lacks still kills, with SIGTERM."""
    base = {"msg_id": "m", "owner": "o", "job_id": "j", "attempt": 1, "reason": "cancelled"}
    assert Kill.model_validate(base | {"signal": "USR1"}).signal == "USR1"
    for bad in ("STOP", "KILL", "SIGRTMAX+5", "x" * 10_000):
        assert Kill.model_validate(base | {"signal": bad}).signal == ""


@pytest.mark.parametrize("code", [2**63, -(2**63) - 1, 256, -256])
def test_a_report_with_an_exit_code_no_process_has_is_refused(code: int) -> None:
    """An exit code past SQLite's 64 bits failed the owner's write of the attempt (an error, not a refusal)."""
    with pytest.raises(ValidationError, match="exit_code"):
        RunReport.model_validate({"msg_id": "m", "worker": "w", "job_id": "j", "attempt": 1, "kind": "exited",
                                  "exit_code": code, "timed_out": True})


def _array_row(array_id: str) -> JobRow:
    return JobRow(id=array_id, status=JobStatus.QUEUED, spec_json="{}", lease_s=30.0, submitted_at=T0,
                  updated_at=T0)


def _task(array_id: str, index: int) -> JobRow:
    return JobRow(id=f"{array_id}_{index}", status=JobStatus.QUEUED, spec_json="{}", lease_s=30.0,
                  submitted_at=T0, updated_at=T0)


@pytest.mark.asyncio
async def test_a_crash_in_the_middle_of_materializing_writes_no_task_and_none_twice(tmp_path: Path) -> None:
    """kill -9 while tasks are written: the transaction is whole or nothing, the cursor with the rows."""
    path = tmp_path / "gpulayer.db"
    store = await Store.open(path)
    try:
        await _crash_then_window(store)
    finally:
        await store.close()  # (an open store's thread would keep pytest from exiting after a failure)
    store = await Store.open(path)  # the daemon restarted after the commit
    try:
        again = await store.arrays.materialize("m8arr", _window)
        assert again is not None and again.tasks == [] and again.materialized == 4  # %4: 4 active already
        assert sorted(t.id for t in await store.arrays.unfinished("m8arr")) == [f"m8arr_{i}" for i in range(4)]
        assert await store.integrity_check() == "ok"
    finally:
        await store.close()


def _window(array: object, active: int) -> list[JobRow]:
    at = array.materialized  # type: ignore[attr-defined]
    return [_task("m8arr", i) for i in range(at, min(10, at + 4 - active))]


async def _crash_then_window(store: Store) -> None:
    await store.jobs.insert_job(_array_row("m8arr"), "array", also=store.arrays.writer("m8arr", "0-9%4", 10))

    def crashing(array: object, active: int) -> list[JobRow]:
        del array, active
        # The third write fails mid-way (NOT NULL): a duplicate id would not, it is a task cancelled ahead.
        return [_task("m8arr", 0), _task("m8arr", 1), replace(_task("m8arr", 2), spec_json=None)]  # type: ignore[arg-type]

    with pytest.raises(StoreError):
        await store.arrays.materialize("m8arr", crashing)
    assert (await store.arrays.get("m8arr")).materialized == 0  # type: ignore[union-attr]
    assert await store.arrays.unfinished("m8arr") == []

    first = await store.arrays.materialize("m8arr", _window)
    assert first is not None and [t.id for t in first.tasks] == [f"m8arr_{i}" for i in range(4)]


@pytest.mark.asyncio
async def test_a_task_cancelled_before_it_was_written_is_passed_not_written_twice(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "gpulayer.db")
    try:
        await store.jobs.insert_job(_array_row("m8arr"), "array", also=store.arrays.writer("m8arr", "0-4", 5))
        ahead = await store.arrays.write_ahead("m8arr", replace(_task("m8arr", 2), status=JobStatus.CANCELLED))
        assert ahead is not None and ahead.status is JobStatus.CANCELLED
        assert await store.arrays.write_ahead("m8arr", _task("m8arr", 2)) is None  # (it exists: nothing)
        assert await store.arrays.write_ahead("no-such", _task("no-such", 0)) is None

        def every(array: object, active: int) -> list[JobRow]:
            del active
            return [_task("m8arr", i) for i in range(array.materialized, 5)]  # type: ignore[attr-defined]

        done = await store.arrays.materialize("m8arr", every)
        assert done is not None and done.materialized == 5
        assert [t.id for t in done.tasks] == ["m8arr_0", "m8arr_1", "m8arr_3", "m8arr_4"]
        assert (await store.jobs.get_job("m8arr_2")).status is JobStatus.CANCELLED  # type: ignore[union-attr]
    finally:
        await store.close()
