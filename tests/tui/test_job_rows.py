"""The jobs table's rows, filter and widths without an app; the cursor and USER column in a harness."""

from __future__ import annotations

import pytest
from rich.cells import cell_len

from gpulayer_tui.widgets.devices_table import probe_text
from gpulayer_tui.widgets.job_rows import COLUMNS, JobFilter, column_widths, job_cells, reason_cell, sort_label
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd.core.types import ProbeStatus
from gpulayerd.models import ProbeHealthModel
from tests.tui.fake_client import NOW, make_job
from tests.tui.test_widgets import Harness

KEYS = [k for k, _ in COLUMNS]


NEEDS = {"state": 9, "reason": 120, "name": 57, "user": 5, "where": 23}
"""Widest cells of a busy queue: a 57-cell name, long reasons, a MIG instance's WHERE."""


def widths(width: int, *, show_user: bool = True, **needs: int) -> dict[str, int]:
    return dict(zip(KEYS, column_widths(width, show_user=show_user, needs={**NEEDS, **needs}), strict=True))


def test_columns_take_their_content_and_the_reason_its_deciding_words() -> None:
    for width in (80, 120, 200):
        w = widths(width)
        line = sum(n + 1 for n in w.values() if n) + 1
        assert line == width, (width, w)  # exactly the terminal: nothing cut off, nothing wasted
    assert widths(200)["reason"] >= 64 and widths(200)["name"] <= 32  # a long name gives way to the reason
    assert widths(200, reason=40)["name"] == 57  # ... unless the reasons are short
    assert widths(200, name=10)["name"] == 10  # short names leave the room to REASON
    w80 = widths(80)
    assert w80["reason"] >= 40 and w80["id"] == 0 and w80["where"] == 0  # at 80 the reason comes first
    assert w80["name"] >= 8 and w80["user"] == 5 and w80["state"] == 9
    assert widths(80, state=7)["reason"] >= len("Memory: GPU 0 has 51.5 GB < 200 GB required")  # the comparison
    assert widths(80, where=10)["where"] == 0  # WHERE gives way before REASON goes below 56
    assert widths(120)["id"] == 12 and widths(120)["reason"] >= 48 and widths(120)["where"] >= 12
    assert widths(120, where=8, user=4)["where"] == 12  # a host with a GPU always fits: no relayout
    assert widths(80, show_user=False)["user"] == 0 and widths(80, show_user=False)["reason"] > w80["reason"]


def test_a_row_leads_with_the_code_and_escapes_user_text() -> None:
    queued = make_job("j1", "queued", reason="waiting for the scheduler")
    assert reason_cell(queued) == "Pending: waiting for the scheduler"
    assert reason_cell(make_job("j2", "queued", reason="Resources: GPU 0 held")) == "Resources: GPU 0 held"
    assert reason_cell(make_job("j3", "succeeded", reason="exited 0")) == "exited 0"
    evil = make_job("j4", "queued", name="a\nb\x1b[31m", owner="eve\x07",
                    reason="Workdir: no such dir\n/x").model_copy(update={"holder_name": "h\x1b"})
    row = job_cells(evil, NOW)
    assert (row.name, row.user, row.reason) == ("a\\nb\\x1b[31m", "eve\\x07", "Workdir: no such dir\\n/x")
    assert cell_len(job_cells(make_job("j5", name="评估模型"), NOW).name) == 8  # display cells, not characters


def test_filter_terms_match_fields_and_words_match_the_row() -> None:
    cuda = make_job("j1", "queued", owner="alice", reason="Resources: GPU 0", requirements={"accelerator": "cuda"})
    mps = make_job("j2", "running", owner="bob", reason="mentions cuda", requirements={"accelerator": "mps"})

    def shown(text: str) -> list[str]:
        f = JobFilter.parse(text)
        return [j.id for j in (cuda, mps) if f.matches(j, job_cells(j, NOW))]

    assert shown("acc:cuda") == ["j1"] and shown("cuda") == ["j2"]  # a word matches the text, acc: the field
    assert shown("state:queued") == ["j1"] and shown("state:run") == ["j2"]
    assert shown("state:queued,running user:bob") == ["j2"]
    assert shown("code:resources") == ["j1"] and shown("USER:Alice gpu") == ["j1"]
    assert shown("nosuch:thing") == [] and JobFilter.parse("").empty
    # an unknown key is a word (no job has it) and is named, once, with the keys there are
    typo = JobFilter.parse("stat:queued Stat:running nosuch:x 12:30 Resources:")
    assert typo.unknown == ("stat", "nosuch")  # not a time, not a reason code typed as a word
    assert typo.problem == ("unknown keys stat:, nosuch: · keys: state: acc: user: name: id: where: code: "
                            "reason:")
    assert shown("status:queued") == ["j1"] and not JobFilter.parse("status:queued").problem  # state's other name


@pytest.mark.asyncio
async def test_cursor_follows_new_rows_at_the_bottom_and_user_hides_when_all_share_it() -> None:
    table = JobsTable(clock=lambda: NOW, age_refresh_s=0)
    async with Harness(table).run_test(size=(120, 10)) as pilot:
        table.set_jobs([make_job(f"f{i:07d}") for i in range(3)])
        await pilot.pause()
        assert "USER" not in table.render_line(0).text  # every job is alice's
        table.action_last()
        table.upsert_job(make_job("f0000003"))
        assert table.highlighted_id == "f0000003"  # at the bottom: follows
        table.action_first()
        table.upsert_job(make_job("f0000004", owner="bob"))
        assert table.highlighted_id == "f0000000"  # elsewhere: stays
        await pilot.pause()
        assert "USER" in table.render_line(0).text and "bob" in table.render_line(5).text


def test_the_status_line_names_the_sort_as_the_header_marks_it() -> None:
    assert sort_label("submitted", False) == "AGE▼ oldest first"
    assert sort_label("submitted", True) == "AGE▲ newest first"
    assert sort_label("state", False) == "STATE▲" and sort_label("name", True) == "NAME▼ reversed"


def test_a_probes_message_that_only_repeats_its_status_is_not_shown_twice() -> None:
    def probe(status: ProbeStatus, message: str) -> str:
        return probe_text(ProbeHealthModel(source="nvidia-smi", status=status, message=message))

    assert probe(ProbeStatus.NOT_FOUND, "nvidia-smi not found") == "nvidia-smi not found"
    assert probe(ProbeStatus.OK, "") == "nvidia-smi ok"
    assert probe(ProbeStatus.ERROR, "exit 9: no driver") == "nvidia-smi error (exit 9: no driver)"
