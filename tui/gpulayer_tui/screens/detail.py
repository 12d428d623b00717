"""One job: the spec, why it waits (worker x requirement table), its timeline and its log, following."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

from gpulayer_tui.api import ApiRequestError, DaemonApi, DaemonUnreachable
from gpulayer_tui.state import TERMINAL, Connection, JobsUpdate, StateSource, cancel_refusal, may_not_manage
from gpulayer_tui.widgets.connection import ConnectionBanner
from gpulayer_tui.widgets.explanation import ExplanationView
from gpulayer_tui.widgets.job_summary import JobSummary
from gpulayer_tui.widgets.log_view import LogView
from gpulayer_tui.widgets.paging import PagedScroll
from gpulayer_tui.widgets.timeline import Timeline
from gpulayerd.models import JobView, LogChunk

__all__ = ["TABS", "JobDetailScreen"]

TABS: tuple[str, ...] = ("why", "timeline", "log")
"""Ids of the detail tabs."""


class JobDetailScreen(Screen[None]):
    """The detail of job :attr:`job_id`; follows its changes and its log while shown."""

    DEFAULT_CSS = """
    JobDetailScreen #detail-tabs {
        height: 1fr;
    }
    JobDetailScreen TabPane {
        padding: 0;
    }
    JobDetailScreen #why-scroll {
        height: 1fr;
    }
    JobDetailScreen #log-view {
        height: 1fr;
    }
    """

    HELP_GROUP: ClassVar[str] = "Job detail"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "back", "Back"),
        Binding("w", "show_tab('why')", "Why"),
        Binding("t", "show_tab('timeline')", "Timeline"),
        Binding("l", "show_tab('log')", "Log"),
        Binding("e", "toggle_stream", "stdout/stderr"),
        Binding("c,f9", "cancel_job", "Cancel"),
    ]

    class CancelRequested(Message):
        """The user asked to cancel the job shown (not yet confirmed)."""

        def __init__(self, job_id: str) -> None:
            super().__init__()
            self.job_id = job_id

    def __init__(self, job_id: str, *, source: StateSource, client: DaemonApi, clock: Callable[[], float],
                 log_poll_s: float, tab: str = "why") -> None:
        """The detail of one job.

        Args:
            job_id: the job.
            source: the app's state and change signals.
            client: the daemon's API.
            clock: wall time now (seconds since the epoch).
            log_poll_s: seconds between log reads while no new output arrives.
            tab: the tab shown first (one of :data:`TABS`).
        """
        super().__init__()
        self.job_id = job_id
        self._source = source
        self._client = client
        self._clock = clock
        self._log_poll_s = log_poll_s
        self._tab = tab if tab in TABS else "why"
        self._stream = "stdout"
        self._attempt: int | None = None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ConnectionBanner(id="connection")
        yield JobSummary(clock=self._clock, id="job-summary")
        with TabbedContent(initial=self._tab, id="detail-tabs"):
            with TabPane("w Why", id="why"), PagedScroll(id="why-scroll"):
                yield ExplanationView(id="explanation")
            with TabPane("t Timeline", id="timeline"):
                yield Timeline(id="timeline-table")
            with TabPane("l Log", id="log"):
                yield LogView(poll_s=self._log_poll_s, id="log-view")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = f"job {self.job_id}"
        known = self._source.state.jobs.get(self.job_id)
        if known is not None:
            self._show_job(known)
        self._show_connection(self._source.state.connection)
        self._source.jobs_updated.subscribe(self, self._jobs_updated, immediate=True)
        self._source.jobs_reset.subscribe(self, self._reread, immediate=True)
        self._source.peers_updated.subscribe(self, self._devices_changed, immediate=True)
        self._source.connection_changed.subscribe(self, self._show_connection, immediate=True)
        self.load_job()
        self.load_explanation()
        self.follow_log()
        self._focus_tab(self._tab)

    # ----------------------------------------------------------------- actions

    def action_back(self) -> None:
        self.dismiss()

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._focus_tab(tab)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id:  # a tab chosen with the mouse: its keys work at once too
            self._focus_tab(event.pane.id)

    def action_toggle_stream(self) -> None:
        self._stream = "stderr" if self._stream == "stdout" else "stdout"
        self.action_show_tab("log")
        self.follow_log()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Cancel is offered only while the job has not finished (hidden otherwise), to its user and
        admins (greyed for others; pressing it says why)."""
        if action == "cancel_job":
            job = self._source.state.jobs.get(self.job_id)
            if job is None:
                return True
            if job.status in TERMINAL or job.cancel_requested:
                return False
            return None if may_not_manage(job, self._source.state.requester) else True
        return True

    def on_key(self, event: events.Key) -> None:
        """c or F9 where cancel is not offered: say why (a greyed key does nothing otherwise)."""
        job = self._source.state.jobs.get(self.job_id)
        if event.key in ("c", "f9") and job is not None:
            why = cancel_refusal(job, self._source.state.requester)
            if why is not None:
                event.stop()
                self.notify(why, severity="warning", markup=False)

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id is not None:
            self._focus_tab(event.pane.id)

    def _focus_tab(self, tab: str) -> None:
        """Give the focus to what the tab shows (its pane or table), so the moving keys work at once."""
        pane = self.query_one(f"#{tab}", TabPane)
        target = next((w for w in pane.query(Widget) if w.focusable), None)
        if target is not None:
            target.focus()

    def action_cancel_job(self) -> None:
        if self.check_action("cancel_job", ()):
            self.post_message(self.CancelRequested(self.job_id))

    # ----------------------------------------------------------------- workers

    @work(exclusive=True, group="detail-job")
    async def load_job(self) -> None:
        """Read the job with its history."""
        try:
            job = await self._client.job(self.job_id)
        except (DaemonUnreachable, ApiRequestError) as e:
            self.query_one(JobSummary).update(Text(f"job {self.job_id}: {e}"))
            return
        self._show_job(job)

    @work(exclusive=True, group="detail-explain")
    async def load_explanation(self) -> None:
        """Ask the daemon why the job runs where it does, or waits."""
        view = self.query_one(ExplanationView)
        try:
            view.explanation = await self._client.explain(self.job_id)
        except (DaemonUnreachable, ApiRequestError) as e:
            view.query_one("#verdict", Static).update(Text(f"cannot explain: {e}"))

    def follow_log(self) -> None:
        """Show the log of the stream chosen, from the end of the latest attempt, following it."""
        client, job_id, stream = self._client, self.job_id, self._stream

        async def read(offset: int, limit: int) -> LogChunk:
            return await client.logs(job_id, stream=stream, offset=offset, limit=limit)

        self.query_one(LogView).show(read, stream)

    # ----------------------------------------------------------------- private

    def _jobs_updated(self, update: JobsUpdate) -> None:
        job = next((j for j in update.jobs if j.id == self.job_id), None)
        if job is None:
            return
        if job.events:
            self._show_job(job)
        else:
            self.load_job()  # a listing's view: read the history too
        self.load_explanation()
        if self._attempt is not None and job.attempt != self._attempt:
            self.follow_log()

    def _reread(self, _: object) -> None:
        """Everything was re-read (a reconnect): read this job and its explanation again."""
        self.load_job()
        self.load_explanation()

    def _devices_changed(self, _: object) -> None:
        self.load_explanation()  # what fits where may have changed

    def _show_job(self, job: JobView) -> None:
        self.query_one(JobSummary).job = job
        if job.events:
            self.query_one(Timeline).events = tuple(job.events)
        self._attempt = job.attempt
        self.refresh_bindings()

    def _show_connection(self, connection: Connection) -> None:
        self.query_one(ConnectionBanner).connection = connection
