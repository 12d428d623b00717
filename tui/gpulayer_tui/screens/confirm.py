"""Asks before cancelling a job."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

__all__ = ["ConfirmCancel"]


class ConfirmCancel(ModalScreen[bool]):
    """"Cancel job X?": dismissed with True (``y`` or the Yes button) or False (``n``, escape, ``q``, No)."""

    DEFAULT_CSS = """
    ConfirmCancel {
        align: center middle;
    }
    ConfirmCancel > #confirm-box {
        width: 64;
        max-width: 100%;
        height: auto;
        padding: 1 2;
    }
    ConfirmCancel #confirm-buttons {
        height: auto;
        margin-top: 1;
    }
    ConfirmCancel #confirm-buttons > Button {
        margin-right: 2;
    }
    """

    HELP_GROUP: ClassVar[str] = "Cancel a job?"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes, cancel it"),
        Binding("n,escape,q", "answer(False)", "No"),
    ]

    def __init__(self, job_id: str, label: str) -> None:
        """A confirmation for ``job_id``.

        Args:
            job_id: the job to cancel.
            label: how to name it ("ID (name), state").
        """
        super().__init__()
        self.job_id = job_id
        self._label = label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(Text(f"Cancel job {self._label}?\n\nA running job gets SIGTERM, then SIGKILL after the "
                              "grace period."), id="confirm-text")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes, cancel it (y)", id="confirm-yes", variant="error")
                yield Button("No (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")
