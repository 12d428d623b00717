"""The main screen: Devices, Jobs, Peers and Environments, one view each, switched with 1/2/3/4
(or d/p/e; j/k move the cursor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.validation import ValidationResult, Validator
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent, TabPane

from gpulayer_tui.readonly import READ_ONLY
from gpulayer_tui.state import Connection, JobsUpdate, StateSource
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.devices_table import DevicesTable, device_detail, mig_names, probe_texts
from gpulayer_tui.widgets.environments_table import EnvironmentsTable, probe_lines
from gpulayer_tui.widgets.gpu_metrics import GpuMetricsPanel, MetricsFetch
from gpulayer_tui.widgets.job_rows import JobFilter, reason_cell
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.peers_table import PeersTable
from gpulayerd import text as fmt
from gpulayerd.models import JobView, PeerView
from gpulayerd.text import job_label

__all__ = ["VIEWS", "KnownFilterKeys", "MainScreen"]

VIEWS: tuple[str, ...] = ("devices", "jobs", "peers", "environments")
"""Ids of the views (tab panes), in tab order."""


class KnownFilterKeys(Validator):
    """The filter's check: every ``key:`` typed is one the filter knows (:attr:`JobFilter.problem`)."""

    def validate(self, value: str) -> ValidationResult:
        problem = JobFilter.parse(value).problem
        return self.failure(problem) if problem else self.success()


class MainScreen(Screen[None]):
    """The three views of the daemon's state; the Jobs view opens first."""

    DEFAULT_CSS = """
    MainScreen #views {
        height: 1fr;
    }
    MainScreen TabPane {
        padding: 0;
    }
    MainScreen #jobs-filter {
        display: none;
    }
    MainScreen #jobs-filter.-shown {
        display: block;
    }
    MainScreen #environments-probes {
        height: auto;
        padding: 0 1;
        color: $text-muted;
    }
    MainScreen .status-line {
        height: 1;
        padding: 0 1;
    }
    MainScreen #jobs-reason {
        height: auto;
        max-height: 4;
    }
    MainScreen #devices-detail {
        height: auto;
        max-height: 4;
    }
    """

    HELP_GROUP: ClassVar[str] = "Views"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_view('devices')", "Devices"),
        Binding("2", "show_view('jobs')", "Jobs"),
        Binding("3", "show_view('peers')", "Peers"),
        Binding("d", "show_view('devices')", "Devices", show=False),
        Binding("p", "show_view('peers')", "Peers", show=False),
        Binding("4", "show_view('environments')", "Environments", show=False),
        Binding("e", "show_view('environments')", "Environments", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("a", "toggle_finished", "All finished jobs", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, source: StateSource, *, clock: Callable[[], float], age_refresh_s: float,
                 metrics: MetricsFetch | None = None, metrics_poll_s: float = 1.0, read_only: bool = False) -> None:
        """The main screen.

        Args:
            source: the app's state and change signals.
            clock: wall time now (seconds since the epoch).
            age_refresh_s: seconds between age updates (0: never).
            metrics: reads this machine's live GPU metrics (None: no live metrics).
            metrics_poll_s: seconds between reads while the Devices view is shown (0: never).
            read_only: a read-only board: the Jobs table offers neither cancel nor a job's detail.
        """
        super().__init__()
        self._source = source
        self._clock = clock
        self._age_refresh_s = age_refresh_s
        self._metrics = metrics
        self._metrics_poll_s = metrics_poll_s
        self._read_only = read_only
        self._status = ""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ConnectionBanner(id="connection")
        with TabbedContent(initial="jobs", id="views"):
            with TabPane("1 Devices", id="devices"):
                yield DevicesTable(id="devices-table")
                yield Static("", id="devices-detail", classes="status-line")
                yield GpuMetricsPanel(self._metrics, poll_s=self._metrics_poll_s, id="gpu-metrics")
            with TabPane("2 Jobs", id="jobs"):
                yield Input(placeholder="filter: state:queued acc:cuda user:alice words… (enter: keep, esc: clear)",
                            id="jobs-filter", select_on_focus=False, validators=[KnownFilterKeys()])
                yield JobsTable(clock=self._clock, age_refresh_s=self._age_refresh_s, id="jobs-table")
                yield Static("", id="jobs-reason", classes="status-line")
                yield Static("", id="jobs-status", classes="status-line")
            with TabPane("3 Peers", id="peers"):
                yield PeersTable(clock=self._clock, id="peers-table")
            with TabPane("4 Environments", id="environments"):
                yield EnvironmentsTable(id="environments-table")
                yield Static("", id="environments-probes")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        source = self._source
        jobs = self.query_one(JobsTable)
        jobs.requester = source.state.requester
        jobs.read_only = self._read_only
        jobs.set_jobs(source.state.jobs.values())
        self.query_one(DevicesTable).labeller = self._job_label
        self.query_one(GpuMetricsPanel).labeller = self._job_label
        self._show_peers(source.state.peers)
        self._show_connection(source.state.connection)
        source.jobs_updated.subscribe(self, self._jobs_updated, immediate=True)
        source.jobs_reset.subscribe(self, self._jobs_reset, immediate=True)
        source.peers_updated.subscribe(self, self._show_peers, immediate=True)
        source.connection_changed.subscribe(self, self._show_connection, immediate=True)
        if self._age_refresh_s > 0:
            self.set_interval(self._age_refresh_s, self.query_one(PeersTable).refresh_ages)
        self.watch(jobs, "sort_by", self._update_status, init=False)
        self.watch(jobs, "sort_reverse", self._update_status, init=False)
        self._update_status()
        jobs.focus()

    # ----------------------------------------------------------------- actions

    def action_show_view(self, view: str) -> None:
        self.query_one(TabbedContent).active = view
        self._focus_view(view)

    def action_filter(self) -> None:
        self.action_show_view("jobs")
        box = self.query_one("#jobs-filter", Input)
        box.add_class("-shown")
        box.focus()

    def action_toggle_finished(self) -> None:
        """Show every finished job, or again only the latest ones (as ``gpulayer jobs`` without ``--all``)."""
        self.action_show_view("jobs")
        table = self.query_one(JobsTable)
        table.show_all_finished = not table.show_all_finished
        self._update_status()

    def action_clear_filter(self) -> None:
        box = self.query_one("#jobs-filter", Input)
        if box.has_class("-shown") or box.value:
            box.value = ""
            box.remove_class("-shown")
            self.query_one(JobsTable).focus()

    # ---------------------------------------------------------------- handlers

    def on_key(self, event: events.Key) -> None:
        """On a read-only board, the Jobs table's c, F9, l and enter say what the board does not do."""
        if self._read_only and event.key in ("c", "f9", "l", "enter") and isinstance(self.focused, JobsTable):
            event.stop()
            self.notify(READ_ONLY, severity="warning", markup=False)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id is not None:
            self._focus_view(event.pane.id)
        # live metrics only while the Devices view is shown: the daemon samples only while polled
        self.query_one(GpuMetricsPanel).watching = event.pane.id == "devices"

    @on(GpuMetricsPanel.Updated)
    def _metrics_updated(self, event: GpuMetricsPanel.Updated) -> None:
        self.query_one(DevicesTable).metrics = event.metrics
        self._show_device_detail()

    def _job_label(self, job_id: str) -> str | None:
        job = self._source.state.jobs.get(job_id)
        return None if job is None else job_label(job_id, job.name, job.submitted_by)

    @on(Input.Changed, "#jobs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(JobsTable).filter_text = event.value
        # an unknown key is said in the filter line (marked invalid), never "0 of 40 jobs" alone
        result = event.validation_result
        self.query_one("#jobs-filter", Input).border_subtitle = \
            "" if result is None or result.is_valid else "; ".join(result.failure_descriptions)
        self._update_status()

    @on(Input.Submitted, "#jobs-filter")
    def _filter_submitted(self) -> None:
        self.query_one(JobsTable).focus()

    @on(JobsTable.JobHighlighted)
    def _job_highlighted(self, event: JobsTable.JobHighlighted) -> None:
        job = event.job
        text = "" if job is None else f"{fmt.escape(job.id)}: {reason_cell(job) or job.status}"
        table = self.query_one(JobsTable)
        if job is not None and "where" in table.hidden_columns and job.id in table.shown_ids:
            where = table.cells(job.id).where  # WHERE gave way to REASON: say it here
            text = text if where == fmt.DASH else f"{fmt.escape(job.id)} on {where}: {reason_cell(job) or job.status}"
        self.query_one("#jobs-reason", Static).update(Text(text))  # the whole reason, never markup

    @on(DataTable.RowHighlighted, "#devices-table")
    def _device_highlighted(self) -> None:
        self._show_device_detail()

    # ----------------------------------------------------------------- private

    def _focus_view(self, view: str) -> None:
        table = {"devices": "#devices-table", "jobs": "#jobs-table", "peers": "#peers-table",
                 "environments": "#environments-table"}.get(view)
        if table is not None:
            self.query_one(table).focus()

    def _jobs_updated(self, update: JobsUpdate) -> None:
        self.query_one(JobsTable).apply_jobs(update.jobs, update.gone)
        self._update_status()

    def _jobs_reset(self, jobs: list[JobView]) -> None:
        table = self.query_one(JobsTable)
        table.requester = self._source.state.requester  # read again with the jobs: it may have changed
        table.set_jobs(jobs)
        table.refresh_bindings()
        self._update_status()

    def _show_device_detail(self) -> None:
        """The highlighted device in words, whole (the table may cut or hide columns), and its machine:
        CPUs, CPU slots, RAM and each probe's health."""
        table = self.query_one(DevicesTable)
        key = table.highlighted_key
        lines = []
        if key is not None and key in table.row_keys:
            lines.append(device_detail(table.row_cells(key)))
            node_id = key.rsplit(":", 1)[0]
            peer = next((p for p in self._source.state.peers if p.node_id == node_id), None)
            if peer is not None and peer.capabilities is not None:
                caps = peer.capabilities
                slots = fmt.cpu_slots(caps.cpu_slots_total, caps.cpu_slots_free)
                probes = " · ".join(probe_texts(caps))
                lines.append(fmt.escape(f"{peer.name}: {fmt.text(caps.cpu_count)} CPUs"
                                        + (f", {slots}" if slots else "")
                                        + f", {fmt.gb(caps.memory_total_bytes)} RAM; probes: {probes or fmt.DASH}"))
        self.query_one("#devices-detail", Static).update(Text("\n".join(lines)))  # peers' words: never markup

    def _show_peers(self, peers: list[PeerView]) -> None:
        self.query_one(DevicesTable).peers = tuple(peers)
        me = next((p for p in peers if p.state == "self" and p.capabilities is not None), None)
        self.query_one(GpuMetricsPanel).devices = () if me is None or me.capabilities is None else tuple(
            me.capabilities.devices)
        self.query_one(JobsTable).set_device_names(mig_names(peers))
        self._show_device_detail()
        self.query_one(PeersTable).peers = tuple(peers)
        self.query_one(EnvironmentsTable).peers = tuple(peers)
        self.query_one("#environments-probes", Static).update(probe_lines(peers))
        self._update_status()

    def _show_connection(self, connection: Connection) -> None:
        self.query_one(ConnectionBanner).connection = connection

    def _update_status(self) -> None:
        table = self.query_one(JobsTable)
        total = len(table.jobs)
        shown = table.row_count
        why = [f"filter: {table.filter_text}"] if table.filter_text.strip() else []
        if table.hidden_count:
            why.append(f"{table.hidden_count} older finished hidden, a shows them")
        counts = f"{total} jobs" if shown == total else f"{shown} of {total} jobs"
        if why and shown != total:
            counts += f" ({'; '.join(why)})"
        order = table.sort_label  # what the marked header says
        # Trusted peers that miss heartbeats: whatever they run is not in this list.
        down = fmt.peers_down(sum(1 for p in self._source.state.peers if p.trusted and p.state in ("suspect", "down")))
        status = f"{counts} · sort: {order} (s, S) · ? help" + (f" · {down}" if down else "")
        if status != self._status:  # a batch of changes that leaves the counts alone repaints nothing here
            self._status = status
            self.query_one("#jobs-status", Static).update(Text(status))
