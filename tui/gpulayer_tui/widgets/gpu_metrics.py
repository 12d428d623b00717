"""This machine's GPUs live, like nvitop: utilisation with a sparkline, memory bar, temperature, power, processes.

:class:`GpuMetricsPanel` polls the daemon's ``GET /v1/metrics`` every ``poll_s`` seconds
while :attr:`GpuMetricsPanel.watching` is True (the Devices view is shown); each poll keeps
the daemon's sampler running, and when the polls stop the daemon stops sampling. Each poll's
answer is also posted as :class:`GpuMetricsPanel.Updated` (the devices table uses it).
Process lines name a gpulayer job by name and user, anything else as "foreign pid N (user)".

With this machine's devices (:attr:`GpuMetricsPanel.devices`, from its capabilities) there is a
card per GPU the probe found: a GPU in MIG mode lists its instances under it (profile, memory,
holder), and a lost or unusable GPU is greyed with nvidia-smi's words instead of numbers (the
sampler keeps a GPU's last sample after it is lost: those numbers are stale).
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
from gpulayer_tui.widgets.devices_table import JobLabeller, device_order
from gpulayerd import text as fmt
from gpulayerd.models import DeviceModel
from gpulayerd.models.metrics import GpuMetricsView, GpuProcessView, MetricsView
from gpulayerd.text import job_label

__all__ = ["GpuCard", "GpuMetricsPanel", "card_text", "gpu_head", "instance_line", "memory_bar", "process_line",
           "sparkline"]

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


def instance_line(d: DeviceModel, labeller: JobLabeller | None = None) -> Text:
    """A MIG instance under its GPU: "  MIG 3g.40gb  ░░░░░░░░░░ 0.0/42.1 GB  free" (memory as last
    probed; the holder by name and user when ``labeller`` knows the job)."""
    used, total = d.memory_used_bytes, d.memory_total_bytes
    mem = f"{fmt.DASH if used is None else f'{used / GB:.1f}'}/{fmt.DASH if total is None else f'{total / GB:.1f}'} GB"
    fault = fmt.fault(d.state.value, d.state_reason)
    if fault is not None:
        state = Text(fmt.escape(fault), style="bold red")
    elif d.granted_to:
        state = Text(f"granted to {fmt.holder(d.granted_to, labeller)}", style="yellow")
    else:
        state = Text(fmt.device_state(None, d.foreign_pids), style="red" if d.foreign_pids else "green")
    return Text.assemble("  ", (f"{fmt.mig_name(d.mig_profile, None):<12}", "bold"), " ",
                         memory_bar(used, total), f" {mem}  ", state)


def card_text(gpu: GpuMetricsView | None, device: DeviceModel | None = None,
              instances: list[DeviceModel] | None = None, labeller: JobLabeller | None = None) -> Text:
    """One GPU's card: its summary with a utilisation sparkline, its holder, its MIG instances, its
    processes (one line each). A lost or unusable ``device`` is one greyed line in the tool's words
    ("GPU 3 lost: Unable to determine the device handle …"), whatever ``gpu`` (a stale sample) says;
    ``gpu`` None (no sample yet): the summary reads "no live sample"."""
    fault = None if device is None else fmt.fault(device.state.value, device.state_reason)
    if device is not None and device.state.value in ("lost", "unusable") and fault is not None:
        where = f" at {device.pci_bus_id}" if device.pci_bus_id else ""
        return Text(f"GPU {device.index}{fmt.escape(where)} {fmt.escape(fault)} — no live readings",
                    style="dim")
    if gpu is None:
        assert device is not None
        lines = [Text.assemble((f"GPU {device.index} ", "bold"), ("no live sample", "dim"))]
    else:
        head = gpu_head(gpu)
        head.pad_right(max(0, HEAD_CELLS - head.cell_len))
        lines = [Text.assemble(head, "  ", sparkline(gpu.utilization_history))]
        if gpu.granted_to and not any(p.job_id == gpu.granted_to for p in gpu.processes):
            lines.append(Text.assemble("  granted to ", (job_label(gpu.granted_to, gpu.granted_name,
                                                                   gpu.granted_user), "yellow")))
    lines += [instance_line(d, labeller) for d in instances or ()]
    if gpu is not None:
        lines += [process_line(p) for p in gpu.processes]
    return Text("\n").join(lines)


class GpuCard(Static):
    """One GPU: its :func:`card_text`."""

    DEFAULT_CSS = """
    GpuCard {
        height: auto;
    }
    """

    def show(self, gpu: GpuMetricsView | None, device: DeviceModel | None = None,
             instances: list[DeviceModel] | None = None, labeller: JobLabeller | None = None) -> None:
        """Show ``gpu``'s latest sample, history and processes, as :func:`card_text` says."""
        self.update(card_text(gpu, device, instances, labeller))


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

    devices: tuple[DeviceModel, ...] = ()
    """This machine's devices as last probed (set by the screen; empty: one card per sampled GPU)."""

    labeller: JobLabeller | None = None
    """Names the job holding a MIG instance (set by the screen: the jobs it knows)."""

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
        """Show ``metrics``: a card per GPU (cards are re-made only when the number of GPUs changes).

        With :attr:`devices`, a card per GPU they list (MIG instances on their GPU's card, a lost
        or unusable GPU greyed), matched to its sample by uuid, then any sampled GPU they do not list.
        """
        try:
            note = self.query_one("#gpu-note", Static)
        except NoMatches:  # not composed yet (on_mount shows it) or already taken down
            return
        cards_data = self._cards(metrics)
        if not metrics.available:
            note.update(Text(f"no live GPU metrics here: {fmt.escape(metrics.message)}"))
        elif not metrics.gpus:
            note.update("sampling GPU metrics…")
        else:
            note.update("")
        note.display = bool(not metrics.available or not metrics.gpus)
        if not metrics.available:
            cards_data = [c for c in cards_data if c[1] is not None and c[1].state.value in ("lost", "unusable")]
        cards = list(self.query(GpuCard))
        if len(cards) != len(cards_data):
            await self.remove_children(GpuCard)
            cards = [GpuCard() for _ in cards_data]
            if cards:
                await self.mount_all(cards)
        for card, (gpu, device, instances) in zip(cards, cards_data, strict=True):
            card.show(gpu, device, instances, self.labeller)

    def _cards(self, metrics: MetricsView) -> list[tuple[GpuMetricsView | None, DeviceModel | None,
                                                         list[DeviceModel]]]:
        """(sample, device, its MIG instances) per card, in device order. A sample is matched by uuid,
        by index for a device without one (a lost GPU); a sample of an index that a listed device
        has is never shown on its own (the sampler keeps a lost GPU's last, stale sample)."""
        by_uuid = {g.uuid: g for g in metrics.gpus if g.uuid}
        by_index = {g.index: g for g in metrics.gpus}
        gpus = [d for d in device_order(self.devices) if d.kind.value != "mig" and d.accelerator.value == "cuda"]
        out: list[tuple[GpuMetricsView | None, DeviceModel | None, list[DeviceModel]]] = []
        for d in gpus:
            sample = by_uuid.get(d.uuid) if d.uuid else by_index.get(d.index)
            if sample is None and not metrics.gpus and d.state.value not in ("lost", "unusable"):
                continue  # nothing sampled yet: the note says so
            instances = [m for m in self.devices if m.kind.value == "mig" and d.uuid and m.parent_uuid == d.uuid]
            out.append((sample, d, device_order(instances)))
        uuids, indices = {d.uuid for d in gpus if d.uuid}, {d.index for d in gpus}
        out += [(g, None, []) for g in metrics.gpus if g.uuid not in uuids and g.index not in indices]
        return out
