"""One widget at a time, each in a minimal harness app driven by run_test() and Pilot."""

from __future__ import annotations

from typing import Any

import pytest
from textual.app import App, ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from gpulayer_tui.state import Connection
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.devices_table import DevicesTable
from gpulayer_tui.widgets.explanation import ExplanationView, RequirementTable
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.peers_table import PeersTable
from gpulayerd.models import ArraySummary, ExplanationModel, JobStateModel, JobView
from tests.tui.fake_client import NOW, make_job, make_peer, waiting_explanation


class Harness(App[None]):
    """An app that shows one widget."""

    def __init__(self, widget: Widget) -> None:
        super().__init__()
        self.widget = widget
        self.messages: list[Any] = []

    def compose(self) -> ComposeResult:
        yield self.widget

    def on_jobs_table_open_requested(self, message: JobsTable.OpenRequested) -> None:
        self.messages.append(("open", message.job_id, message.tab))

    def on_jobs_table_cancel_requested(self, message: JobsTable.CancelRequested) -> None:
        self.messages.append(("cancel", message.job_id))


def jobs_table() -> JobsTable:
    return JobsTable(clock=lambda: NOW, age_refresh_s=0, id="jobs-table")


@pytest.mark.asyncio
async def test_jobs_table_repaints_only_the_line_that_changed() -> None:
    table = jobs_table()
    async with Harness(table).run_test(size=(100, 20)) as pilot:
        table.set_jobs([make_job(f"job{i:08d}", age_s=30 + i) for i in range(50)])
        await pilot.pause()
        assert table.row_count == 50
        refreshed: list[Any] = []
        original = table.refresh

        def spy(*regions: Any, **kw: Any) -> Any:
            refreshed.append((regions, kw))
            return original(*regions, **kw)

        table.refresh = spy  # type: ignore[method-assign]
        rebuild = table._rebuild
        table._rebuild = lambda: pytest.fail("an update must not rebuild the table")  # type: ignore[method-assign]
        table.upsert_job(make_job("job00000007", "running", age_s=37, holder_name="lab-ws-02", reason="started"))
        assert (table.cells("job00000007").state, table.cells("job00000007").where) == ("running", "lab-ws-02")
        assert len(refreshed) == 1 and refreshed[0][0][0].height == 1  # one line: row 7 under the header
        assert refreshed[0][0][0].y == 8
        refreshed.clear()
        table.upsert_job(make_job("job00000007", "running", age_s=37, holder_name="lab-ws-02", reason="started"))
        assert refreshed == []  # nothing changed, nothing repainted
        table.upsert_job(make_job("job00000050", age_s=1))  # a new job: one row added at the end
        assert table.row_count == 51 and table.shown_ids[-1] == "job00000050"
        table._rebuild = rebuild  # type: ignore[method-assign]
        await pilot.pause()
        line = table.render_line(8).text
        assert "job00000007" in line and "running" in line and "lab-ws-02" in line


@pytest.mark.asyncio
async def test_jobs_table_filter_sort_and_cursor_follow_the_job() -> None:
    table = jobs_table()
    async with Harness(table).run_test() as pilot:
        table.set_jobs([
            make_job("a0000001", "running", owner="bob", holder_name="lab-ws-02"),
            make_job("a0000002", "queued", owner="alice", reason="fits nowhere we know: no CUDA GPU"),
            make_job("a0000003", "succeeded", owner="carol"),
        ])
        await pilot.pause()
        assert table.select_job("a0000002")
        table.filter_text = "cuda"
        await pilot.pause()
        assert table.shown_ids == ["a0000002"] and table.highlighted_id == "a0000002"
        table.upsert_job(make_job("a0000002", "running", owner="alice", holder_name="lab-ws-02", reason="started"))
        assert table.shown_ids == []  # no longer matches: its row goes, the others stay filtered out
        table.filter_text = ""
        await pilot.pause()
        assert table.shown_ids == ["a0000001", "a0000002", "a0000003"]
        table.select_job("a0000003")
        await pilot.press("s")  # sort by state: running first, succeeded last
        await pilot.pause()
        assert table.sort_by == "state"
        assert table.shown_ids == ["a0000001", "a0000002", "a0000003"]
        table.sort_by = "user"  # by user
        await pilot.pause()
        assert table.shown_ids == ["a0000002", "a0000001", "a0000003"]
        assert table.highlighted_id == "a0000003"  # the cursor stays on the same job


@pytest.mark.asyncio
async def test_jobs_table_puts_a_job_that_matches_again_back_in_its_place() -> None:
    table = jobs_table()
    async with Harness(table).run_test() as pilot:
        table.set_jobs([make_job("e0000001", reason="waiting"), make_job("e0000002", reason="waiting"),
                        make_job("e0000003", reason="waiting")])
        table.filter_text = "waiting"
        await pilot.pause()
        table.upsert_job(make_job("e0000002", "running", reason="started"))
        assert table.shown_ids == ["e0000001", "e0000003"]
        table.upsert_job(make_job("e0000002", "queued", reason="waiting again"))
        assert table.shown_ids == ["e0000001", "e0000003", "e0000002"]  # added at once, at the end ...
        await pilot.pause(0.7)
        assert table.shown_ids == ["e0000001", "e0000002", "e0000003"]  # ... then sorted into its place


@pytest.mark.asyncio
async def test_jobs_table_keys_post_messages_for_the_highlighted_job() -> None:
    table = jobs_table()
    app = Harness(table)
    async with app.run_test() as pilot:
        table.set_jobs([make_job("b0000001"), make_job("b0000002")])
        await pilot.pause()
        table.focus()
        await pilot.press("down", "enter", "c", "l")
        await pilot.pause()
        assert app.messages == [("open", "b0000002", "why"), ("cancel", "b0000002"), ("open", "b0000002", "log")]


def _array(array_id: str, counts: dict[str, int], total: int) -> list[JobView]:
    """An array's own row (its tasks counted as the daemon counts them) and one view per task counted
    (``pending`` ones are not materialized: no row)."""
    words = ", ".join(f"{n} {s}" for s, n in counts.items())
    status = "running" if counts.get("running") else "queued"
    array = make_job(array_id, status, reason=f"Array: {words} of {total}").model_copy(
        update={"array": ArraySummary(expr=f"0-{total - 1}", total=total, counts=counts)})
    states = [s for s, n in counts.items() if s != "pending" for _ in range(n)]
    tasks = [make_job(f"{array_id}_{i}", s, age_s=50 - i * 0.01, reason="started" if s == "running" else "exited 0")
             .model_copy(update={"array_id": array_id}) for i, s in enumerate(states)]
    return [array, *tasks]


@pytest.mark.asyncio
async def test_jobs_table_folds_an_arrays_tasks_into_its_row_and_x_unfolds_them() -> None:
    table = jobs_table()
    array, *tasks = _array("r0000001", {"running": 2, "succeeded": 60, "pending": 38}, 100)
    async with Harness(table).run_test(size=(120, 30)) as pilot:
        table.set_jobs([make_job("q0000000", "succeeded", age_s=90), array,
                        make_job("z0000002", age_s=55), *tasks])
        await pilot.pause()
        # One row for the array, its counts in REASON; its 60 finished tasks hide no other finished job.
        assert table.shown_ids == ["q0000000", "r0000001", "z0000002"] and table.hidden_count == 0
        cells = table.cells("r0000001")
        assert cells.state == "running" and "Array: 2 running, 60 succeeded, 38 pending of 100" in cells.reason
        table.upsert_job(tasks[0].model_copy(update={"status": "succeeded", "reason": "exited 0"}))
        assert table.row_count == 3  # a folded task's change adds no row
        table.focus()
        await pilot.press("down")
        assert table.check_action("toggle_tasks", ()) is True
        await pilot.press("x")  # unfold: the tasks right after their array, the cursor stays on it
        await pilot.pause()
        assert table.shown_ids[:4] == ["q0000000", "r0000001", "r0000001_0", "r0000001_1"]
        assert table.shown_ids[-1] == "z0000002" and table.row_count == 3 + 62  # every task, q0000000 too
        assert table.highlighted_id == "r0000001"
        await pilot.press("down", "down", "x")  # x on a task folds its array
        await pilot.pause()
        assert table.shown_ids == ["q0000000", "r0000001", "z0000002"] and table.highlighted_id == "r0000001"
        await pilot.press("down")
        assert table.check_action("toggle_tasks", ()) is False  # an ordinary job: not offered


@pytest.mark.asyncio
async def test_jobs_table_ages_follow_the_clock() -> None:
    now = [NOW]
    table = JobsTable(clock=lambda: now[0], age_refresh_s=0)
    async with Harness(table).run_test() as pilot:
        table.set_jobs([make_job("c0000001", age_s=30), make_job("c0000002", age_s=4000)])
        await pilot.pause()
        assert [table.cells(k).age for k in table.shown_ids] == ["30s", "66m"]
        now[0] += 60
        table.refresh_ages()
        assert [table.cells(k).age for k in table.shown_ids] == ["90s", "67m"]


@pytest.mark.asyncio
async def test_devices_table_says_unified_memory_never_vram_and_unknown_cc_as_dash() -> None:
    table = DevicesTable(id="devices-table")
    async with Harness(table).run_test(size=(200, 20)) as pilot:
        table.peers = (make_peer("dgx-spark"), make_peer("old-ws-07"), make_peer("lab-ws-02"),
                       make_peer("lab-ws-01"), make_peer("rocm-box"))
        await pilot.pause()
        rows = {(r[0], r[1]): r for r in table.plain_rows()}
        spark = rows[("dgx-spark", "0")]
        assert spark[4] == "130.7 GB unified (RAM)"
        assert rows[("lab-ws-02", "0")][4] == "1.3/25.8 GB dedicated"
        assert all("VRAM" not in cell for row in rows.values() for cell in row)
        assert rows[("old-ws-07", "0")][7] == "—"  # compute capability unknown
        assert rows[("lab-ws-02", "0")][5] == "j-4711"  # a job this TUI does not know: its id
        assert rows[("lab-ws-02", "1")][5] == "free"
        assert rows[("lab-ws-01", "—")][2] == "cpu" and rows[("lab-ws-01", "—")][6] == "CPU only, 16 cores"
        assert rows[("rocm-box", "0")][5] == "detection only"
        # an update of one device changes that row in place (same keys, same order)
        busy = make_peer("lab-ws-02")
        assert busy.capabilities is not None
        busy.capabilities.devices[1].foreign_pids = [3131]
        table.labeller = {"j-4711": "sweep (bob)"}.get  # a known job: by its name and user
        table.peers = (make_peer("dgx-spark"), make_peer("old-ws-07"), busy, make_peer("lab-ws-01"),
                       make_peer("rocm-box"))
        await pilot.pause()
        rows = {(r[0], r[1]): r for r in table.plain_rows()}
        assert rows[("lab-ws-02", "1")][5] == "busy (pid 3131)"
        assert rows[("lab-ws-02", "0")][5] == "sweep (bob)"


@pytest.mark.asyncio
async def test_devices_table_never_shows_a_lost_gpu_a_mig_parent_or_unknown_processes_as_free() -> None:
    from gpulayerd.core.types import DeviceState

    table = DevicesTable(id="devices-table")
    peer = make_peer("lab-ws-02")
    assert peer.capabilities is not None
    gpu0, gpu1 = peer.capabilities.devices[0], peer.capabilities.devices[1]
    gpu0.granted_to, gpu0.state, gpu0.state_reason = None, DeviceState.LOST, "Unknown Error\x1b[2J"
    gpu1.mig_enabled = True
    async with Harness(table).run_test(size=(200, 20)) as pilot:
        table.peers = (peer,)
        await pilot.pause()
        rows = {(r[0], r[1]): r for r in table.plain_rows()}
        assert rows[("lab-ws-02", "0")][5] == "lost: Unknown Error\\x1b[2J"  # the tool's words, the escape never raw
        assert "\x1b" not in "".join(rows[("lab-ws-02", "0")])
        assert rows[("lab-ws-02", "1")][5] == "MIG mode"
        gpu1.mig_enabled, gpu1.processes_known, gpu1.memory_used_bytes = False, False, 8 * 10**9
        table.peers = (peer.model_copy(deep=True),)
        await pilot.pause()
        rows = {(r[0], r[1]): r for r in table.plain_rows()}
        assert rows[("lab-ws-02", "1")][5] == "procs unknown (busy)"


@pytest.mark.asyncio
async def test_peers_table_shows_trust_addresses_version_and_heartbeat() -> None:
    table = PeersTable(clock=lambda: NOW)
    async with Harness(table).run_test(size=(160, 10)) as pilot:
        table.peers = (make_peer("lab-ws-02", state="self"),
                       make_peer("mac-studio", trusted=False, state="foreign", version="0.2.0",
                                 addresses=("10.0.0.9", "fe80::1"), last_heartbeat_at=None))
        await pilot.pause()
        me, other = table.plain_rows()
        assert me[2:5] == ["self", "trusted", "10.0.0.7:7443"]
        assert me[7] == "this machine"  # no heartbeat to itself: an age here would only grow
        assert other[2:8] == ["foreign", "foreign", "10.0.0.9:7443, fe80::1:7443", "0.2.0", "elsewhere", "—"]


@pytest.mark.asyncio
async def test_connection_banner_is_hidden_while_connected() -> None:
    banner = ConnectionBanner(id="connection")
    async with Harness(banner).run_test() as pilot:
        banner.connection = Connection("unreachable", "cannot reach gpulayerd at /x: no socket", NOW)
        await pilot.pause()
        assert banner.display and "daemon not reachable — retrying (since 00:00:00)" in str(banner.render())
        banner.connection = Connection("connected", "lab-ws-02 · gpulayerd 0.1.0", NOW)
        await pilot.pause()
        assert not banner.display


@pytest.mark.asyncio
async def test_explanation_view_shows_every_rejection_word_for_word() -> None:
    view = ExplanationView(id="explanation")
    async with Harness(view).run_test(size=(120, 30)) as pilot:
        e = waiting_explanation("d0000001")
        view.explanation = e
        await pilot.pause()
        for w in e.workers:
            for r in w.rejections:
                assert r.message in view.reasons_text
        marks = [row[1] for row in view.query_one("#checks", RequirementTable).plain_rows()]
        assert marks == ["✓", "✗", "✓", "✓", "✗", "?"]


@pytest.mark.asyncio
async def test_explanation_view_shows_a_failed_jobs_state_instead_of_the_table() -> None:
    view = ExplanationView(id="explanation")
    failed = ExplanationModel(job_id="d0000002", verdict="failed: exited 3", summary="exited 3 on gpu-box GPU 1",
                              state=JobStateModel(status="failed", attempt=2, node="n" * 40, node_name="gpu-box",
                                                  gpus=[1], outcome="exited 3", exit_code=3, reason="exited 3",
                                                  stderr_tail=["Traceback", "boom\x1b[2J"]))
    async with Harness(view).run_test(size=(120, 30)) as pilot:
        view.explanation = failed
        await pilot.pause()
        shown = str(view.query_one("#state", Static).render())
        for words in ("state:     failed", "exit code: 3", "attempt:   2", "ran on", "gpu-box GPU 1", "boom\\x1b[2J"):
            assert words in shown, shown
        assert view.query_one("#state").display and not view.query_one("#checks").display
        assert "verdict: failed: exited 3" in str(view.query_one("#verdict", Static).render())

        view.explanation = waiting_explanation("d0000001")  # a waiting job: the table again, no state
        await pilot.pause()
        assert not view.query_one("#state").display and view.query_one("#checks").display


def test_where_of_a_finished_job_keeps_its_host_and_gpus() -> None:
    from gpulayer_tui.widgets.jobs_table import COLUMNS, job_cells

    where = [k for k, _ in COLUMNS].index("where")
    done = make_job("j1", "failed").model_copy(update={"where_node": "n" * 52, "where_name": "ws-2",
                                                       "where_devices": [0, 1]})
    assert job_cells(done, NOW)[where] == "ws-2 GPU 0,1"
    gang = make_job("j2", "succeeded").model_copy(update={"where_node": "n" * 52, "where_hosts": ["h2", "h3"]})
    assert job_cells(gang, NOW)[where] == "h2+h3"
    assert job_cells(make_job("j3", "running", holder_name="ws-9"), NOW)[where] == "ws-9"
