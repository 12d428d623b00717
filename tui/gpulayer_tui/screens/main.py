"""The main screen: Devices, Jobs and Peers, one view each, switched with d/j/p (or 1/2/3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent, TabPane

from gpulayer_tui.state import Connection, StateSource
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.devices_table import DevicesTable
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayer_tui.widgets.peers_table import PeersTable
from gpulayerd import text as fmt
from gpulayerd.models import JobView, PeerView

__all__ = ["VIEWS", "MainScreen"]

VIEWS: tuple[str, ...] = ("devices", "jobs", "peers")
"""Ids of the views (tab panes), in tab order."""


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
    MainScreen .status-line {
        height: 1;
        padding: 0 1;
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "show_view('devices')", "Devices"),
        Binding("j", "show_view('jobs')", "Jobs"),
        Binding("p", "show_view('peers')", "Peers"),
        Binding("1", "show_view('devices')", "Devices", show=False),
        Binding("2", "show_view('jobs')", "Jobs", show=False),
        Binding("3", "show_view('peers')", "Peers", show=False),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, source: StateSource, *, clock: Callable[[], float], age_refresh_s: float) -> None:
        """The main screen.

        Args:
            source: the app's state and change signals.
            clock: wall time now (seconds since the epoch).
            age_refresh_s: seconds between age updates (0: never).
        """
        super().__init__()
        self._source = source
        self._clock = clock
        self._age_refresh_s = age_refresh_s

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ConnectionBanner(id="connection")
        with TabbedContent(initial="jobs", id="views"):
            with TabPane("Devices (d)", id="devices"):
                yield DevicesTable(id="devices-table")
                yield Static("", id="devices-detail", classes="status-line")
            with TabPane("Jobs (j)", id="jobs"):
                yield Input(placeholder="filter: words every job shown contains (enter: keep, esc: clear)",
                            id="jobs-filter")
                yield JobsTable(clock=self._clock, age_refresh_s=self._age_refresh_s, id="jobs-table")
                yield Static("", id="jobs-reason", classes="status-line")
                yield Static("", id="jobs-status", classes="status-line")
            with TabPane("Peers (p)", id="peers"):
                yield PeersTable(clock=self._clock, id="peers-table")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        source = self._source
        jobs = self.query_one(JobsTable)
        jobs.set_jobs(source.state.jobs.values())
        self._show_peers(source.state.peers)
        self._show_connection(source.state.connection)
        source.job_updated.subscribe(self, self._job_updated, immediate=True)
        source.jobs_reset.subscribe(self, self._jobs_reset, immediate=True)
        source.peers_updated.subscribe(self, self._show_peers, immediate=True)
        source.connection_changed.subscribe(self, self._show_connection, immediate=True)
        if self._age_refresh_s > 0:
            self.set_interval(self._age_refresh_s, self.query_one(PeersTable).refresh_ages)
        self.watch(jobs, "sort_by", self._update_status, init=False)
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

    def action_clear_filter(self) -> None:
        box = self.query_one("#jobs-filter", Input)
        if box.has_class("-shown") or box.value:
            box.value = ""
            box.remove_class("-shown")
            self.query_one(JobsTable).focus()

    # ---------------------------------------------------------------- handlers

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id is not None:
            self._focus_view(event.pane.id)

    @on(Input.Changed, "#jobs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(JobsTable).filter_text = event.value
        self._update_status()

    @on(Input.Submitted, "#jobs-filter")
    def _filter_submitted(self) -> None:
        self.query_one(JobsTable).focus()

    @on(JobsTable.JobHighlighted)
    def _job_highlighted(self, event: JobsTable.JobHighlighted) -> None:
        job = event.job
        text = "" if job is None else f"{job.id}: {fmt.one_line(job.reason, 400) or job.status}"
        self.query_one("#jobs-reason", Static).update(text)

    @on(DataTable.RowHighlighted, "#devices-table")
    def _device_highlighted(self, event: DataTable.RowHighlighted) -> None:
        node_id = str(event.row_key.value).rsplit(":", 1)[0]
        peer = next((p for p in self._source.state.peers if p.node_id == node_id), None)
        text = ""
        if peer is not None and peer.capabilities is not None:
            caps = peer.capabilities
            probes = " · ".join(f"{h.source} {h.status.value.replace('_', ' ')}" + (f" ({h.message})" if h.message
                                                                                   else "")
                                for h in caps.health)
            text = (f"{peer.name}: {fmt.text(caps.cpu_count)} CPUs, {fmt.gb(caps.memory_total_bytes)} RAM; "
                    f"probes: {probes or fmt.DASH}")
        self.query_one("#devices-detail", Static).update(text)

    # ----------------------------------------------------------------- private

    def _focus_view(self, view: str) -> None:
        table = {"devices": "#devices-table", "jobs": "#jobs-table", "peers": "#peers-table"}.get(view)
        if table is not None:
            self.query_one(table).focus()

    def _job_updated(self, job: JobView) -> None:
        self.query_one(JobsTable).upsert_job(job)
        self._update_status()

    def _jobs_reset(self, jobs: list[JobView]) -> None:
        self.query_one(JobsTable).set_jobs(jobs)
        self._update_status()

    def _show_peers(self, peers: list[PeerView]) -> None:
        self.query_one(DevicesTable).peers = tuple(peers)
        self.query_one(PeersTable).peers = tuple(peers)
        self._update_status()

    def _show_connection(self, connection: Connection) -> None:
        self.query_one(ConnectionBanner).connection = connection

    def _update_status(self) -> None:
        table = self.query_one(JobsTable)
        total = len(table.jobs)
        shown = table.row_count
        counts = f"{total} jobs" if shown == total else f"{shown} of {total} jobs (filter: {table.filter_text})"
        # Trusted peers that miss heartbeats: whatever they run is not in this list.
        down = fmt.peers_down(sum(1 for p in self._source.state.peers if p.trusted and p.state in ("suspect", "down")))
        self.query_one("#jobs-status", Static).update(f"{counts} · sort: {table.sort_by} (s)"
                                                      + (f" · {down}" if down else ""))
