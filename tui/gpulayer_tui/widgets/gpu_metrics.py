"""This machine's GPUs live, like nvitop: utilisation with a sparkline, memory bar, temperature, power, processes.

:class:`GpuMetricsPanel` polls the daemon's ``GET /v1/metrics`` every ``poll_s`` seconds
while :attr:`GpuMetricsPanel.watching` is True (the Devices view is shown); each poll keeps
the daemon's sampler running, and when the polls stop the daemon stops sampling. Each poll's
answer is also posted as :class:`GpuMetricsPanel.Updated` (the devices table uses it).
Process lines name a gpulayer job by name and user, anything else as "foreign pid N (user)".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static

from gpulayer_tui.api import ApiRequestError, DaemonUnreachable
from gpulayer_tui.widgets.devices_table import job_label
from gpulayerd import text as fmt
from gpulayerd.models.metrics import GpuMetricsView, GpuProcessView, MetricsView

__all__ = ["GpuCard", "GpuMetricsPanel", "gpu_head", "memory_bar", "process_line", "sparkline"]

GB = 1e9
BAR_CELLS = 10
SPARK_CELLS = 20
HEAD_CELLS = 54
_BLOCKS = "▁▂▃▄▅▆▇█"

MetricsFetch = Callable[[], Awaitable[MetricsView]]
"""Reads the daemon's metrics once (``DaemonClient.metrics``)."""


def memory_bar(used: int | None, total: int | None, cells: int = BAR_CELLS) -> Text:
    """A bar of ``cells`` cells, filled by used / total (dim and empty when unknown)."""
    if used is None or not total:
        return Text("░" * cells, style="dim")
    full = max(0, min(cells, round(cells * used / total)))
    style = "red" if used / total >= 0.9 else ("yellow" if used / total >= 0.6 else "green")
    return Text.assemble(("█" * full, style), ("░" * (cells - full), "dim"))


def _num(value: float | None, unit: str, digits: int = 0) -> str:
    return fmt.DASH if value is None else f"{value:.{digits}f}{unit}"


def gpu_head(gpu: GpuMetricsView) -> Text:
    """The GPU's one-line summary: "GPU 0  87%  ██████░░░░ 12.3/24.0 GB  71°C  250/350 W"."""
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    mem = f"{fmt.DASH if used is None else f'{used / GB:.1f}'}/{fmt.DASH if total is None else f'{total / GB:.1f}'} GB"
    power = f"{_num(gpu.power_draw_w, '')}/{_num(gpu.power_limit_w, '')} W"
    return Text.assemble(
        (f"GPU {gpu.index} ", "bold"),
        f"{_num(gpu.utilization_pct, '%'):>4}  ",
        memory_bar(used, total), f" {mem}  ",
        f"{_num(gpu.temperature_c, '°C')}  {power}",
    )


def process_line(p: GpuProcessView) -> Text:
    """One process on a GPU: "pid 4242 job sweep-lr (alice) 8.1 GB" or "foreign pid 999 (bob) 2.0 GB"."""
    mem = "" if p.used_memory_bytes is None else f"  {p.used_memory_bytes / GB:.1f} GB"
    if p.job_id is not None:
        return Text.assemble("  pid ", str(p.pid), " job ", (job_label(p.job_id, p.job_name, p.job_user), "yellow"),
                             mem)
    user = fmt.escape(p.user) if p.user else "user unknown"
    return Text.assemble("  ", (f"foreign pid {p.pid} ({user})", "red"), mem)


def sparkline(history: list[float | None], cells: int = SPARK_CELLS) -> Text:
    """The last ``cells`` utilisation samples (0-100 %) as block characters, oldest left; unknown: blank."""
    recent = history[-cells:]
    chars = [" " if v is None else _BLOCKS[max(0, min(len(_BLOCKS) - 1, round(v / 100 * (len(_BLOCKS) - 1))))]
             for v in recent]
    return Text("".join(chars).rjust(cells), style="cyan")


class GpuCard(Static):
    """One GPU: its summary with a utilisation sparkline, then its processes (one line each)."""

    DEFAULT_CSS = """
    GpuCard {
        height: auto;
    }
    """

    def show(self, gpu: GpuMetricsView) -> None:
        """Show ``gpu``'s latest sample, history and processes."""
        head = gpu_head(gpu)
        head.pad_right(max(0, HEAD_CELLS - head.cell_len))
        lines = [Text.assemble(head, "  ", sparkline(gpu.utilization_history))]
        if gpu.granted_to and not any(p.job_id == gpu.granted_to for p in gpu.processes):
            lines.append(Text.assemble("  granted to ", (job_label(gpu.granted_to, gpu.granted_name,
                                                                   gpu.granted_user), "yellow")))
        lines += [process_line(p) for p in gpu.processes]
        self.update(Text("\n").join(lines))


class GpuMetricsPanel(Vertical):
    """This machine's GPUs live, polled while :attr:`watching`."""

    DEFAULT_CSS = """
    GpuMetricsPanel {
        height: auto;
        max-height: 50%;
        padding: 0 1;
        overflow-y: auto;
    }
    GpuMetricsPanel > #gpu-note {
        color: $text-muted;
    }
    """

    class Updated(Message):
        """A poll answered: ``metrics`` is this machine's latest."""

        def __init__(self, metrics: MetricsView) -> None:
            super().__init__()
            self.metrics = metrics

    watching: reactive[bool] = reactive(False, init=False)
    """Poll the daemon now (the view is shown)."""

    metrics: reactive[MetricsView | None] = reactive(None, init=False, always_update=True)
    """The latest answer."""

    def __init__(self, fetch: MetricsFetch | None, *, poll_s: float = 1.0, id: str | None = None) -> None:
        """A panel that polls ``fetch`` every ``poll_s`` seconds while watching (None or 0: never polls)."""
        super().__init__(id=id)
        self._fetch = fetch
        self._poll_s = poll_s
        self.polls = 0
        """How many polls answered (tests, benchmark)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="gpu-note")

    def watch_watching(self, watching: bool) -> None:
        if watching and self._fetch is not None and self._poll_s > 0:
            self._poll()
        else:
            self.workers.cancel_group(self, "gpu-metrics")

    @work(exclusive=True, group="gpu-metrics")
    async def _poll(self) -> None:
        assert self._fetch is not None
        while self.watching:
            try:
                metrics = await self._fetch()
            except ApiRequestError as e:
                metrics = MetricsView(available=False, message=f"the daemon answered {e.status}: {e}")
            except DaemonUnreachable:
                metrics = None
            if metrics is not None:
                self.polls += 1
                self.metrics = metrics
                self.post_message(self.Updated(metrics))
            await asyncio.sleep(self._poll_s)

    async def watch_metrics(self, metrics: MetricsView | None) -> None:
        if metrics is not None:
            await self.show(metrics)

    async def on_mount(self) -> None:
        if self.metrics is not None:  # set before the panel was composed: show it now
            await self.show(self.metrics)

    async def show(self, metrics: MetricsView) -> None:
        """Show ``metrics``: a card per GPU (cards are re-made only when the number of GPUs changes)."""
        try:
            note = self.query_one("#gpu-note", Static)
        except NoMatches:  # not composed yet (on_mount shows it) or already taken down
            return
        gpus = metrics.gpus
        if not metrics.available:
            note.update(Text(f"no live GPU metrics here: {fmt.escape(metrics.message)}"))
        elif not gpus:
            note.update("sampling GPU metrics…")
        else:
            note.update("")
        note.display = bool(not metrics.available or not gpus)
        cards = list(self.query(GpuCard))
        if len(cards) != len(gpus):
            await self.remove_children(GpuCard)
            cards = [GpuCard() for _ in gpus]
            if cards:
                await self.mount_all(cards)
        for card, gpu in zip(cards, gpus, strict=True):
            card.show(gpu)
