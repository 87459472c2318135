"""Modal dialogs: a confirmation whose focus starts on Cancel, the relaunch flags editor, a text to read."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from backends.sglang_facts import RELAUNCH_PRESETS
from console.render import command_line


def dialog_css(screen: str) -> str:
    """A dialog box centred over the dimmed console (DEFAULT_CSS is scoped to the class that declares it)."""
    return f"""
    {screen} {{ align: center middle; background: $background 60%; }}
    {screen} > Vertical {{
        width: 96; height: auto; max-height: 80%; border: thick $warning; background: $surface; padding: 1 2;
    }}
    {screen} Horizontal {{ height: auto; margin-top: 1; }}
    {screen} Button {{ margin-right: 2; }}
    """


# The dialog's inside (96 columns less its border and padding), and what a button takes beyond its label.
DIALOG_INSIDE = 90
BUTTON_EXTRA = 4  # its own padding, and the margin to the next


def preset_rows(presets: Sequence[str], width: int = DIALOG_INSIDE) -> list[list[str]]:
    """The presets in rows that fit the dialog (a long one, like 0.5.23's two CUDA-graph flags, takes a row)."""
    rows: list[list[str]] = []
    used = width
    for preset in presets:
        size = len(preset) + BUTTON_EXTRA
        if used + size > width:
            rows.append([])
            used = 0
        rows[-1].append(preset)
        used += size
    return rows


class ConfirmScreen(ModalScreen[bool]):
    """Yes or no to a dangerous action; Cancel has the focus, so Enter alone changes nothing."""

    DEFAULT_CSS = dialog_css("ConfirmScreen")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "yes"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "cancel"),
    ]

    def __init__(self, question: str, details: str = "") -> None:
        super().__init__()
        self.question = question
        self.details = details

    def compose(self) -> ComposeResult:
        with Vertical():
            # Text, not markup: a run's name or command line may hold brackets.
            yield Label(Text(self.question), id="question")
            if self.details:
                yield Static(Text(self.details), id="details")
            with Horizontal():
                yield Button("Cancel (n)", id="cancel", variant="primary")
                yield Button("Yes (y)", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class RelaunchScreen(ModalScreen[tuple[list[str], list[str]] | None]):
    """The flags to set and to remove for a relaunch: `--flag[=value]` to set, `-flag` to remove; `presets` are
    spelled for the run's SGLang (a preset of several flags is one space-separated string)."""

    DEFAULT_CSS = dialog_css("RelaunchScreen")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel")]

    def __init__(self, run: str, argv: list[str], presets: Sequence[str] = RELAUNCH_PRESETS) -> None:
        super().__init__()
        self.run = run
        self.argv = argv
        self.presets = presets

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Relaunch run {self.run}: start a copy with these flags changed (a live run is stopped first)")
            yield Static(Text(command_line(self.argv)), id="argv")
            yield Input(placeholder="--disable-cuda-graph  --mem-fraction-static=0.8  -cuda-graph-max-bs", id="flags")
            yield Static("Enter relaunches; a flag written -name (one dash) is removed. Presets:", id="hint")
            for row in preset_rows(self.presets):
                with Horizontal():
                    for preset in row:
                        yield Button(preset, classes="preset")
            with Horizontal():
                yield Button("Cancel", id="cancel", variant="primary")
                yield Button("Relaunch", id="go", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#flags", Input).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        flags = self.query_one("#flags", Input)
        if event.button.has_class("preset"):
            flags.value = " ".join(filter(None, [flags.value.strip(), str(event.button.label)]))
            flags.focus()
        elif event.button.id == "go":
            self._submit(flags.value)
        else:
            self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._submit(event.value)

    def _submit(self, text: str) -> None:
        try:
            words = shlex.split(text)
        except ValueError as exc:
            self.notify(f"cannot read the flags: {exc}", severity="error")
            return
        sets = [w for w in words if w.startswith("--")]
        unsets = ["-" + w for w in words if w.startswith("-") and not w.startswith("--")]
        if not sets and not unsets:
            self.notify("name at least one flag to set (--flag) or remove (-flag)", severity="warning")
            return
        self.dismiss((sets, unsets))

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen[None]):
    """A long text to read (a stack dump), scrollable; Escape or q closes it."""

    DEFAULT_CSS = (
        dialog_css("TextScreen")
        + """
    TextScreen > Vertical { width: 90%; height: 85%; }
    TextScreen VerticalScroll { height: 1fr; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "close")]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, id="title")
            with VerticalScroll():
                yield Static(Text(self.text), id="text")

    def action_close(self) -> None:
        self.dismiss(None)
