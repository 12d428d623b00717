"""Job arrays and dependencies, decided (gpulayerd.core.arrays, gpulayerd.core.dependencies): pure; and
what arrays change around them: the latest finished jobs listed without tasks, the feed naming a task's
array."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayerd.core.arrays import (
    LOW_WATER,
    WINDOW,
    ArrayError,
    ArraySpec,
    parse_array,
    shown_state,
    split_task_id,
    task_command,
    task_id,
    to_materialize,
)
from gpulayerd.core.dependencies import (
    After,
    Condition,
    DependencyError,
    Never,
    Satisfied,
    Waiting,
    cycle_through,
    judge,
    parse_after,
)


@pytest.mark.parametrize(("text", "indices", "most"), [
    ("0-4", (0, 1, 2, 3, 4), None),
    ("0-9:3", (0, 3, 6, 9), None),
    ("1,5,9", (1, 5, 9), None),
    ("7", (7,), None),
    ("0-99%8", tuple(range(100)), 8),
    ("0-2,10-12%2", (0, 1, 2, 10, 11, 12), 2),
])
def test_array_expressions_parse(text: str, indices: tuple[int, ...], most: int | None) -> None:
    assert parse_array(text) == ArraySpec(indices, most)


@pytest.mark.parametrize(("text", "words"), [
    ("5-1", "reversed"), ("0-9:0", "step 0"), ("0-9%0", "%MAX"), ("0-9%", "%MAX"), ("", "no indices"),
    ("a-b", "not an index"), ("0-10001", "max_array_size = 10000"), ("1,1", "twice"), ("0-99999999", "above"),
])
def test_bad_array_expressions_say_what_is_wrong_and_what_is_allowed(text: str, words: str) -> None:
    with pytest.raises(ArrayError, match=words) as e:
        parse_array(text)
    assert "allowed:" in str(e.value)


def test_task_ids_and_commands() -> None:
    assert task_id("m8abc", 7) == "m8abc_7"
    assert split_task_id("m8abc_7") == ("m8abc", 7)
    assert split_task_id("m8abc") is None
    assert split_task_id("m8abc_\u0667") is None and split_task_id("m8abc_\uff17") is None  # (Arabic-Indic, fullwidth 7)
    assert split_task_id("m8abc_" + "9" * 10) is None  # (longer than any index: MAX_INDEX has 8 digits)
    assert task_command(["python", "train.py", "--seed={task}", "{task}"], 3) == ["python", "train.py", "--seed=3", "3"]


@given(n=st.integers(1, 300), most=st.one_of(st.none(), st.integers(1, 20)),
       ends=st.lists(st.integers(0, 5), max_size=400))
def test_materialization_never_exceeds_max_and_materializes_every_index_exactly_once(
        n: int, most: int | None, ends: list[int]) -> None:
    spec = ArraySpec(tuple(range(n)), most)
    bound = most if most is not None else WINDOW
    cursor, active, made = 0, 0, []
    for k in [*ends, *([bound] * (n + 1))]:  # some tasks end between rounds; then all of them, until done
        active -= min(k, active)
        more = to_materialize(spec, cursor, active)
        made += [spec.index_at(p) for p in range(cursor, cursor + more)]
        cursor, active = cursor + more, active + more
        assert active <= bound
    assert made == list(range(n))


def test_dependencies_parse() -> None:
    assert parse_after("m8a") == After("m8a", Condition.OK)
    assert parse_after("m8a:notok") == After("m8a", Condition.NOTOK)
    assert str(parse_after("m8a:any")) == "m8a:any"
    with pytest.raises(DependencyError, match="not one of ok, any, notok"):
        parse_after("m8a:maybe")
    with pytest.raises(DependencyError, match="no job id"):
        parse_after(":ok")


@pytest.mark.parametrize(("cond", "status", "verdict"), [
    ("ok", "succeeded", Satisfied), ("ok", "failed", Never), ("ok", "cancelled", Never),
    ("any", "failed", Satisfied), ("any", "succeeded", Satisfied),
    ("notok", "failed", Satisfied), ("notok", "succeeded", Never), ("notok", "lost", Satisfied),
    ("ok", "running", Waiting), ("any", None, Waiting),
])
def test_a_dependency_is_judged_by_the_state_of_the_job_it_names(cond: str, status: str | None,
                                                                 verdict: type) -> None:
    assert isinstance(judge([After("a", Condition(cond))], {"a": status}), verdict)


def test_never_wins_over_waiting_and_waiting_names_the_first_unmet() -> None:
    deps = [After("a"), After("b"), After("c")]
    assert judge(deps, {"a": "running", "b": "succeeded", "c": "queued"}) == Waiting(After("a"))
    assert judge(deps, {"a": "running", "b": "failed"}) == Never(After("b"), "failed")


def test_cycles_are_found() -> None:
    assert cycle_through("x", {"x": ["a"], "a": ["b"], "b": ["x"]}) == ["x", "a", "b"]
    assert cycle_through("x", {"x": ["a"], "a": ["b"], "b": []}) is None
    assert cycle_through("x", {"x": ["x"]}) == ["x"]
    assert cycle_through("x", {"x": ["a", "b"], "a": ["c"], "c": [], "b": ["c", "d"], "d": ["x"]}) == ["x", "b", "d"]


def test_a_chain_of_thousands_of_waiting_jobs_is_walked_without_recursion() -> None:
    chain = {f"j{i}": [f"j{i + 1}"] for i in range(20_000)}  # (a recursive walk failed at ~1,000 links)
    assert cycle_through("x", {"x": ["j0"], **chain}) is None
    found = cycle_through("x", {"x": ["j0"], **chain, "j20000": ["x"]})
    assert found is not None and len(found) == 20_002 and found[:2] == ["x", "j0"] and found[-1] == "j20000"


@pytest.mark.parametrize(("stored", "counts", "shown"), [
    ("queued", {"pending": 8}, "queued"),
    ("queued", {"queued": 2, "succeeded": 3, "pending": 5}, "queued"),
    ("queued", {"claimed": 1, "queued": 1}, "running"),
    ("queued", {"running": 2, "failed": 1}, "running"),
    ("succeeded", {"succeeded": 4}, "succeeded"),
    ("cancelled", {"running": 1}, "cancelled"),  # cancelling: its row has ended, its tasks follow
])
def test_an_array_shows_running_while_a_task_runs(stored: str, counts: dict[str, int], shown: str) -> None:
    assert shown_state(stored, counts) == shown


def test_the_latest_finished_leave_an_arrays_finished_tasks_out() -> None:
    from gpulayerd.models.jobs_query import JobsQuery, select

    jobs = [("a", "succeeded"), ("b", "failed"), ("r", "running"), *((f"r_{i}", "succeeded") for i in range(30)),
            ("r_30", "running"), ("c", "succeeded")]
    query = JobsQuery(finished=2)
    kept = select(jobs, query, lambda _j: "alice", lambda j: j[1], is_task=lambda j: "_" in j[0])
    assert [j[0] for j in kept] == ["b", "r", "r_30", "c"] and query.left_out == 1  # "a"; no task counted
    everything = select(jobs, JobsQuery(), lambda _j: "alice", lambda j: j[1], is_task=lambda j: "_" in j[0])
    assert len(everything) == len(jobs)


@pytest.mark.asyncio
async def test_a_tasks_change_is_its_arrays_too_in_the_change_feed() -> None:
    from gpulayerd.app.common.feed import Change
    from gpulayerd.app.common.signals import Signals

    signals = Signals()
    async with signals.feed.subscribe() as sub:
        signals.job_changed("m8abc_7")
        signals.job_changed("m8plain")
        signals.job_changed("m8abc_8")
        assert await sub.take() == [Change("job", "m8abc_7"), Change("job", "m8abc"), Change("job", "m8plain"),
                                    Change("job", "m8abc_8")]



def test_an_array_without_max_materializes_in_batches_below_its_low_water_mark() -> None:
    spec = ArraySpec(tuple(range(10_000)), None)
    assert to_materialize(spec, 0, 0) == WINDOW
    assert to_materialize(spec, WINDOW, WINDOW - 1) == 0  # one task ended: no write of one row
    assert to_materialize(spec, WINDOW, LOW_WATER + 1) == 0
    assert to_materialize(spec, WINDOW, LOW_WATER) == WINDOW - LOW_WATER
    assert to_materialize(spec, 9_990, 0) == 10  # never past the last position
    with_max = ArraySpec(tuple(range(100)), 3)
    assert to_materialize(with_max, 3, 2) == 1  # %MAX: one in as soon as one ends
