"""Modal dialogs: a confirmation whose focus starts on Cancel, the relaunch flags editor, a text to read, and the
help (this console's keys, grouped, with the legend of states and colours)."""

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

from console.render import command_line
from console.tui.panels import NEW_FAILURE, STATE_STYLES
from console.tui.timeline import HEALTH_CELLS
from console.visible import printable, visible


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
            # Text, not markup: a run's name or command line may hold brackets, and escapes (shown, not obeyed).
            yield Static(Text(visible(self.question)), id="question")
            if self.details:
                yield Static(Text(visible(self.details)), id="details")
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

    def __init__(self, run: str, argv: list[str], presets: Sequence[str]) -> None:
        super().__init__()
        self.run = run
        self.argv = argv
        self.presets = presets

    def compose(self) -> ComposeResult:
        with Vertical():
            heading = f"Relaunch run {self.run}: start a copy with these flags changed (a live run is stopped first)"
            yield Static(Text(heading))
            yield Static(Text(command_line(self.argv)), id="argv")
            example = "  ".join(self.presets[:2]) if self.presets else "--lr=1e-4  --batch-size=8"
            yield Input(placeholder=f"{example}  -flag-to-remove", id="flags")
            hint = "Enter shows the new command line first; a flag written -name (one dash) is removed."
            yield Static(hint + (" Presets:" if self.presets else ""), id="hint")
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
            yield Label(Text(printable(self.title_text)), id="title")
            with VerticalScroll():  # a stack dump names the run's argv and files: its escapes shown, not obeyed
                yield Static(Text(visible(self.text)), id="text")

    def action_close(self) -> None:
        self.dismiss(None)


# The console's keys by what they act on (an action not named here is listed under "more"); keys that every
# screen of Textual's has are left out.
KEY_GROUPS = (
    ("the selected run", ("kill", "relaunch", "stacks")),
    ("the host", ("free_gpus",)),
    (
        "the charts",
        ("pick_chart", "next_chart", "chart_toggle('log_scale')", "chart_toggle('robust')", "chart_toggle('smooth')"),
    ),
    ("the log", ("wrap", "find_in_log", "log_match(True)", "log_match(False)", "stop_finding", "copy_log")),
    ("the console", ("command_palette", "next_theme", "help", "quit")),
)
MOVING = (
    ("↑ ↓ / click", "select a run (the detail, curves and log follow it)"),
    ("enter", "on a multi-node job's line: show its nodes' runs under it, or fold them"),
    ("click / tab", "give the log the keys (click the runs to take them back)"),
    ("PgUp PgDn", "in the log: scroll (at its end it follows the tail again)"),
    ("← →", "in the log: scroll cut lines sideways (shift+wheel too)"),
    ("drag ctrl+c", "select text in the log with the mouse, copy it"),
)
HEALTH_MEANINGS = {
    "ok": "200: serving",
    "http": "an HTTP error (503 while warming up)",
    "refused": "connection refused (not listening yet)",
    "error": "no answer (timeout, reset)",
}


def help_text(keys: Sequence[tuple[str, str, str]], health: dict[str, str]) -> Text:
    """`keys`: (key, what it does, its action) for each of the app's keys that works now; `health`: each health
    answer class's style."""
    text = Text()
    groups = [(title, [k for k in keys if k[2] in actions]) for title, actions in KEY_GROUPS]
    named = {action for _, actions in KEY_GROUPS for action in actions}
    groups.append(("more", [k for k in keys if k[2] not in named]))
    for title, members in groups:
        if not members:
            continue
        text.append(f"{title}\n", style="bold")
        for key, description, _ in members:
            text.append(f"  {key:<12}", style="bold")
            text.append(f"{description}\n")
    text.append("moving around\n", style="bold")
    for key, description in MOVING:
        text.append(f"  {key:<12}", style="bold")
        text.append(f"{description}\n")
    text.append("\nstates\n", style="bold")
    for state, style in STATE_STYLES.items():
        text.append("  ")
        text.append(state, style=style)
        text.append("\n")
    text.append("  ")
    text.append(NEW_FAILURE.strip(), style=STATE_STYLES["failed"])
    text.append(" a failure not looked at yet (selecting the run clears it)\n")
    text.append("\nhealth history (serve runs)\n", style="bold")
    for answer, cell in HEALTH_CELLS.items():
        text.append(f"  {cell * 3}", style=health.get(answer, ""))
        text.append(f" {HEALTH_MEANINGS[answer]}\n")
    return text


class HelpScreen(ModalScreen[None]):
    """This console's keys first, grouped, then what the states and colours mean; Close has the focus."""

    DEFAULT_CSS = (
        dialog_css("HelpScreen")
        + """
    HelpScreen > Vertical { width: 80; height: 90%; }
    HelpScreen VerticalScroll { height: 1fr; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "close")]

    def __init__(self, keys: Sequence[tuple[str, str, str]], health: dict[str, str]) -> None:
        super().__init__()
        self.text = help_text(keys, health)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text("eagle3-console: keys and colours", style="bold"))
            with VerticalScroll():
                yield Static(self.text, id="help")
            with Horizontal():
                yield Button("Close (esc)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
