"""The gpulayer TUI: ``make_app(client).run()``.

The app talks to the local daemon only, through :class:`gpulayerd.api.client.DaemonClient`
(or anything with its methods, see :class:`gpulayer_tui.api.DaemonApi`). It reads everything once,
then follows the daemon's server-sent events. Changes are coalesced: while a read is under way
(and for ``coalesce_s`` after the first change) they are gathered, then every changed job is read
in one request (``GET /v1/jobs?ids=…``, up to ``MAX_IDS`` a request) and the screens update once
for the batch; a ``devices`` or ``peers`` change re-reads the peers, ``resync`` re-reads
everything. When the daemon goes away the screens say so, and the app reconnects every ``retry_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import ClassVar

from textual import on, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.signal import Signal
from textual.widgets import Input

from gpulayer_tui.api import ApiRequestError, ChangeEvent, DaemonApi, DaemonUnreachable, connection_problem
from gpulayer_tui.readonly import READ_ONLY, ReadOnlyApi, ReadOnlyRefused
from gpulayer_tui.screens.confirm import ConfirmCancel
from gpulayer_tui.screens.detail import JobDetailScreen
from gpulayer_tui.screens.help import HelpScreen
from gpulayer_tui.screens.main import MainScreen
from gpulayer_tui.state import ClusterState, Connection, ConnectionState, JobsUpdate, PendingChanges, cancel_refusal
from gpulayer_tui.widgets.jobs_table import JobsTable
from gpulayerd import text as fmt
from gpulayerd.models import JobView, PeerView
from gpulayerd.models.jobs_query import MAX_IDS

__all__ = ["GpulayerApp", "TuiSettings", "make_app"]


@dataclass(frozen=True, slots=True)
class TuiSettings:
    """Timings and looks of the TUI.

    Attributes:
        retry_s: seconds between attempts to reach a daemon that went away.
        log_poll_s: seconds between log reads of a running job shown in detail.
        age_refresh_s: seconds between updates of ages and "… ago" (0: never, for snapshots).
        theme: a Textual theme name; None: the default, or ``ansi-dark`` on a 16-colour terminal and under
            NO_COLOR (where only bold, dim, reverse and underline show).
        metrics_poll_s: seconds between reads of the live GPU metrics while the Devices view is
            shown (0: never; the daemon samples only while they are read).
        coalesce_s: seconds the app gathers changes after the first one before it reads the
            changed jobs (about a frame; 0: at once). Changes that come while a read is under
            way wait for the next read anyway.
    """

    retry_s: float = 1.0
    log_poll_s: float = 0.5
    age_refresh_s: float = 5.0
    theme: str | None = None
    metrics_poll_s: float = 1.0
    coalesce_s: float = 1 / 60


class GpulayerApp(App[None]):
    """The TUI. Build it with :func:`make_app`."""

    CSS_PATH = "app.tcss"
    TITLE = "gpulayer"
    ENABLE_COMMAND_PALETTE = False
    HELP_GROUP: ClassVar[str] = "Everywhere"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("f10", "quit", "Quit", show=False),
        Binding("ctrl+c", "quit_or_copy", "Quit (copy in a text box)", show=False, priority=True),
        Binding("question_mark", "toggle_help", "Help"),
        Binding("f1", "toggle_help", "Help", show=False),
    ]

    def __init__(self, client: DaemonApi, *, clock: Callable[[], float], settings: TuiSettings,
                 read_only: bool = False) -> None:
        """The app; see :func:`make_app`."""
        # NO_COLOR: no colour at all, only bold/dim/reverse/underline (Textual's NoColor filter). Without
        # ansi_color Textual would grey every colour by its luminance instead (Monochrome): red text
        # became grey 237 on a grey 235 background.
        super().__init__(ansi_color=True if "NO_COLOR" in os.environ else None)
        self.read_only = read_only
        """A read-only board (:mod:`gpulayer_tui.readonly`): no cancel, no job detail, no logs."""
        self.client: DaemonApi = ReadOnlyApi(client) if read_only and not isinstance(client, ReadOnlyApi) else client
        self.clock = clock
        self.settings = settings
        self.state = ClusterState()
        self.jobs_updated: Signal[JobsUpdate] = Signal(self, "jobs-updated")
        self.jobs_reset: Signal[list[JobView]] = Signal(self, "jobs-reset")
        self.peers_updated: Signal[list[PeerView]] = Signal(self, "peers-updated")
        self.connection_changed: Signal[Connection] = Signal(self, "connection-changed")
        self.changes_applied = 0
        """How many changes from the daemon have been applied (for tests and the benchmark)."""
        self.job_reads = 0
        """How many requests read changed jobs (each one reads a batch; for tests and the benchmark)."""

    # --------------------------------------------------------------- lifecycle

    def on_mount(self) -> None:
        if self.settings.theme is not None:
            self.theme = self.settings.theme
        elif self.no_color or self.console.color_system in ("standard", "windows"):
            self.theme = "ansi-dark"
        if self.read_only:
            self.title = "gpulayer board (read-only)"
        self.push_screen(MainScreen(self, clock=self.clock, age_refresh_s=self.settings.age_refresh_s,
                                    metrics=getattr(self.client, "metrics", None),
                                    metrics_poll_s=self.settings.metrics_poll_s, read_only=self.read_only))
        self.follow_daemon()

    async def on_unmount(self) -> None:
        await self.client.close()

    # ----------------------------------------------------------------- actions

    def action_quit_or_copy(self) -> None:
        """ctrl+c: quit, except in a text box, where it copies the selection (Textual's own binding)."""
        if isinstance(self.focused, Input):
            self.focused.action_copy()
        else:
            self.exit()

    def action_toggle_help(self) -> None:
        """Show (or close again) the help: every gpulayer key of the screen shown, hidden ones too."""
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss()
        else:
            self.push_screen(HelpScreen(self.screen))

    # ---------------------------------------------------------------- handlers

    @on(JobsTable.OpenRequested)
    def _open_job(self, event: JobsTable.OpenRequested) -> None:
        if self.read_only:
            self.notify(READ_ONLY, severity="warning", markup=False)
            return
        self.push_screen(JobDetailScreen(event.job_id, source=self, client=self.client, clock=self.clock,
                                         log_poll_s=self.settings.log_poll_s, tab=event.tab))

    @on(JobsTable.CancelRequested)
    @on(JobDetailScreen.CancelRequested)
    def _confirm_cancel(self, event: JobsTable.CancelRequested | JobDetailScreen.CancelRequested) -> None:
        job_id = event.job_id
        job = self.state.jobs.get(job_id)
        why = READ_ONLY if self.read_only else None if job is None else cancel_refusal(job, self.state.requester)
        if why is not None:  # the keys are not offered then; a message from elsewhere is told why
            self.notify(why, severity="warning", markup=False)
            return
        label = job_id if job is None else (f"{job_id}" + (f" ({fmt.escape(job.name)})" if job.name else "")
                                            + f", {job.status}")

        def answered(yes: bool | None) -> None:
            if yes:
                self.cancel_job(job_id)

        self.push_screen(ConfirmCancel(job_id, label), answered)

    # ----------------------------------------------------------------- workers

    @work(group="cancel")
    async def cancel_job(self, job_id: str) -> None:
        """Ask the daemon to cancel ``job_id`` and show the answer (never on a read-only board)."""
        try:
            if self.read_only:
                raise ReadOnlyRefused(f"cancel {job_id}")
            job = await self.client.cancel(job_id)
        except (DaemonUnreachable, ApiRequestError) as e:
            self.notify(fmt.escape(f"cannot cancel {job_id}: {e}"), severity="error", markup=False)
            return
        self._put_job(job)
        more = " (stopping)" if job.cancel_requested and job.status == "running" else ""
        self.notify(fmt.escape(f"job {job.id}: {job.status}{more}"), markup=False)

    @work(exclusive=True, group="daemon-feed")
    async def follow_daemon(self) -> None:
        """Follow the daemon's changes for as long as the app runs, reconnecting when it goes away."""
        while True:
            problem = await self._follow_stream()
            self._set_connection("unreachable", problem)
            await asyncio.sleep(self.settings.retry_s)

    async def apply_change(self, change: ChangeEvent) -> None:
        """Read what ``change`` says changed and show it, now (one change on its own).

        Raises:
            DaemonUnreachable: the daemon went away meanwhile.
        """
        pending = PendingChanges()
        pending.add(change.kind, change.key)
        await self.apply_changes(pending)

    async def apply_changes(self, pending: PendingChanges) -> None:
        """Read what the ``pending`` changes say changed and show it, until none is pending.

        Changes added to ``pending`` meanwhile (the feed goes on while a read is under way) are
        applied too: changed jobs are read ``MAX_IDS`` at a time, each batch in one request.

        Raises:
            DaemonUnreachable: the daemon went away meanwhile.
            ApiRequestError: the daemon answered with an error.
        """
        while pending:
            if pending.resync:
                pending.resync = False
                await self._resync()
            elif pending.peers:
                pending.peers = False
                peers = await self.client.peers()
                self.state.peers = peers
                self.peers_updated.publish(peers)
            else:
                await self._read_jobs(pending.take_job_ids(MAX_IDS))
            self.changes_applied += pending.settled()

    # ----------------------------------------------------------------- private

    async def _follow_stream(self) -> str:
        """Apply the changes of one event stream until it ends; returns why it ended, in words."""
        stream = self.client.events()
        pending = PendingChanges()
        arrived = asyncio.Event()

        async def read() -> None:
            async for change in stream:
                pending.add(change.kind, change.key)
                arrived.set()

        reader = asyncio.ensure_future(read())
        try:
            while True:
                waiter = asyncio.ensure_future(arrived.wait())
                await asyncio.wait((reader, waiter), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not arrived.is_set():
                    reader.result()  # the stream ended: its error, if any
                    return "the daemon closed the connection"
                if self.settings.coalesce_s > 0 and not pending.resync:
                    await asyncio.sleep(self.settings.coalesce_s)  # gather the rest of a burst
                arrived.clear()
                await self.apply_changes(pending)
        except DaemonUnreachable as e:
            return str(e)
        except ApiRequestError as e:
            return f"the daemon answered {e.status} ({e.code}): {e}"
        except Exception as e:  # whatever broke, say so in words and try again
            return connection_problem(e)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()

    async def _read_jobs(self, job_ids: list[str]) -> None:
        """Read ``job_ids`` in one request and show them; ids the daemon no longer lists are removed."""
        if not job_ids:
            return
        self.job_reads += 1
        jobs = await self.client.jobs(ids=job_ids)
        listed = {j.id for j in jobs}
        update = JobsUpdate(tuple(jobs), tuple(i for i in job_ids if i not in listed and i in self.state.jobs))
        self.state.put_jobs(update)
        self.jobs_updated.publish(update)

    async def _resync(self) -> None:
        health = await self.client.health()
        peers = await self.client.peers()
        jobs = await self.client.jobs()
        self.state.daemon = f"{health.hostname} · gpulayerd {health.version}"
        self.state.requester = health.requester
        self.sub_title = self.state.daemon
        self.state.peers = peers
        self.state.reset_jobs(jobs)
        self.peers_updated.publish(peers)
        self.jobs_reset.publish(jobs)
        self._set_connection("connected", self.state.daemon)

    def _put_job(self, job: JobView) -> None:
        update = JobsUpdate((job,))
        self.state.put_jobs(update)
        self.jobs_updated.publish(update)

    def _set_connection(self, state: ConnectionState, message: str) -> None:
        old = self.state.connection
        since = old.since if old.state == state else self.clock()
        new = Connection(state, message, since)
        if new == old:
            return
        self.state.connection = new
        self.connection_changed.publish(new)
        if old.state == "unreachable" and state == "connected":
            self.notify(fmt.escape(f"connected again to {message}"), markup=False)  # a host name: never markup


def make_app(client: DaemonApi, *, clock: Callable[[], float] = time.time,
             settings: TuiSettings | None = None, read_only: bool = False) -> GpulayerApp:
    """The TUI bound to ``client`` (a :class:`gpulayerd.api.client.DaemonClient` or a fake).

    Args:
        client: the local daemon's API; the app closes it when it exits.
        clock: wall time now (seconds since the epoch), for ages; tests pass a fixed one.
        settings: timings and theme (default :class:`TuiSettings`).
        read_only: a read-only board (:mod:`gpulayer_tui.readonly`): ``client`` is wrapped in
            :class:`~gpulayer_tui.readonly.ReadOnlyApi`; no cancel, no job detail, no logs.
    """
    return GpulayerApp(client, clock=clock, settings=settings or TuiSettings(), read_only=read_only)
