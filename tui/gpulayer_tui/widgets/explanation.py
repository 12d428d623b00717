"""Why a job runs where it does, or waits: the verdict, the worker x requirement table, the reasons.

A job that is not waiting shows its state instead of the table: where it runs or ran, how
it ended, why and by whom, a failed job's stderr tail (:func:`state_lines`).

The reasons are the daemon's rejection messages word for word (what ``gpulayer explain``
prints).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static

from gpulayer_tui.widgets.keyed_table import Cell, KeyedTable
from gpulayerd import text as fmt
from gpulayerd.models import ExplanationModel

__all__ = ["ExplanationView", "RequirementTable", "check_rows", "hint_lines", "reason_lines", "state_lines",
           "verdict_text"]


def _mark(ok: bool | None) -> Cell:
    style = "" if ok is None else ("green" if ok else "bold red")
    return Text(fmt.mark(ok), style=style)


def check_rows(e: ExplanationModel) -> dict[str, tuple[Cell, ...]]:
    """One row per (worker, requirement), keyed "worker:n"; the worker's name on its first row only."""
    rows: dict[str, tuple[Cell, ...]] = {}
    for w in e.workers:
        label = w.name if w.online else f"{w.name} (offline)"
        for i, c in enumerate(w.checks):
            rows[f"{w.worker}:{i}"] = (label if i == 0 else "", _mark(c.ok), c.requirement, c.wanted, c.found)
    return rows


def verdict_text(e: ExplanationModel) -> str:
    """"verdict: … [-> worker GPU i]" and the summary."""
    verdict = f"verdict: {e.verdict.replace('_', ' ')}"
    if e.placement is not None:
        devs = ",".join(str(i) for i in e.placement.device_indices)
        name = next((w.name for w in e.workers if w.worker == e.placement.worker), e.placement.worker)
        verdict += f" -> {name}" + (f" GPU {devs}" if devs else "")
    return f"{verdict}\n{e.summary}" if e.summary else verdict


def state_lines(e: ExplanationModel) -> list[str]:
    """Where a job that is not waiting runs or ran and how it ended ([] for a waiting job), then its stderr tail."""
    if e.state is None:
        return []
    rows = e.state.rows()
    wide = max(len(label) for label, _ in rows) + 1
    lines = [f"{label + ':':<{wide}} {value}" for label, value in rows]
    tail = e.state.stderr_lines()
    return lines + (["", "stderr (last lines):", *tail] if tail else [])


def reason_lines(e: ExplanationModel) -> list[str]:
    """Every rejection message, word for word (escaped): before matching, then per worker."""
    lines = [f"✗ {r.requirement}: {r.message}" for r in e.rejections]
    for w in e.workers:
        lines += [f"✗ {w.name}: {r.message}" for r in w.rejections]
        if w.placement is not None:
            devs = ", ".join(str(i) for i in w.placement.device_indices) or "none (CPU)"
            lines.append(f"✓ {w.name}: would run with {w.placement.environment} on devices: {devs}")
    return [fmt.escape(line) for line in lines]


def hint_lines(e: ExplanationModel) -> list[str]:
    """The nearest-miss hints of a job that fits nowhere (or only a busy or offline worker), escaped; [] for none."""
    if not e.hints:
        return []
    return ["smallest changes that make it fit:", *(f"→ {h.line()}" for h in e.hints)]


class RequirementTable(KeyedTable):
    """The worker x requirement table: observed vs wanted, ✓/✗."""

    COLUMNS: ClassVar[Sequence[tuple[str, str]]] = (
        ("worker", "WORKER"),
        ("ok", ""),
        ("requirement", "REQUIREMENT"),
        ("wanted", "WANTED"),
        ("found", "FOUND"),
    )


class ExplanationView(Vertical):
    """Shows :attr:`explanation` (None: not read yet)."""

    DEFAULT_CSS = """
    ExplanationView {
        height: auto;
    }
    ExplanationView > #verdict, ExplanationView > #state, ExplanationView > #reasons,
    ExplanationView > #hints {
        height: auto;
        padding: 0 1;
    }
    ExplanationView > RequirementTable {
        height: auto;
        max-height: 20;
    }
    """

    explanation: reactive[ExplanationModel | None] = reactive(None, init=False)
    """The explanation shown."""

    def compose(self) -> ComposeResult:
        yield Static("asking the daemon…", id="verdict")
        state = Static("", id="state")
        state.display = False
        yield state
        yield RequirementTable(id="checks")
        yield Static("", id="reasons")
        hints = Static("", id="hints")
        hints.display = False
        yield hints

    def watch_explanation(self, e: ExplanationModel | None) -> None:
        if e is None:
            return
        self.query_one("#verdict", Static).update(Text(verdict_text(e)))
        state = self.query_one("#state", Static)
        state.update(Text("\n".join(state_lines(e))))
        state.display = e.state is not None
        checks = self.query_one("#checks", RequirementTable)
        checks.sync_rows(check_rows(e))
        checks.display = e.state is None or bool(e.workers)
        self.query_one("#reasons", Static).update(Text("\n".join(reason_lines(e))))
        hints = self.query_one("#hints", Static)
        hints.update(Text("\n".join(hint_lines(e))))
        hints.display = bool(e.hints)

    @property
    def reasons_text(self) -> str:
        """The reasons as shown (plain text)."""
        e = self.explanation
        return "" if e is None else "\n".join(reason_lines(e))
