"""The console's keys: its bindings, and config.toml's [keys] over them (Textual's keymap: a binding's id is its
action's name there), refused in one line when an action is not the console's, a word is no key, a key is kept for
moving, or one key would do two things."""

from __future__ import annotations

import string
from collections.abc import Mapping

from textual.binding import Binding, BindingType
from textual.keys import Keys, _character_to_key, format_key

# An id is the action's name in config.toml's [keys] (Textual's keymap puts the key chosen there). The footer's
# labels are short: at 100 columns every shown key, quit included, and ctrl+p fit on its one line (a tooltip is
# what the help says instead).
BINDINGS: list[BindingType] = [
    Binding("k", "kill", "kill", id="kill"),
    Binding("r", "relaunch", "relaunch", id="relaunch"),
    Binding("f", "free_gpus", "free GPUs", id="free_gpus"),
    Binding("s", "stacks", "stacks", id="stacks"),
    Binding("t", "next_theme", "theme", id="theme"),
    Binding("w", "wrap", "wrap", id="wrap", tooltip="wrap long lines, or cut them (scroll sideways)"),
    Binding("slash", "find_in_log", "find text in the log (any case)", key_display="/", show=False),
    Binding("n", "log_match(True)", "next match (older)", show=False),
    Binding("N", "log_match(False)", "previous match (newer)", show=False),
    Binding("escape", "stop_finding", "stop finding: follow the tail", show=False),
    Binding("y", "copy_log", "copy the match's line, or the lines in view", show=False),
    Binding("c", "pick_chart", "chart", id="chart"),
    Binding("v", "next_chart", "the other chart", show=False),
    Binding("L", "chart_toggle('log_scale')", "log scale", show=False),
    Binding("R", "chart_toggle('robust')", "robust range", show=False),
    Binding("S", "chart_toggle('smooth')", "smoothing", show=False),
    Binding("question_mark", "help", "help", id="help"),
    Binding("q", "quit", "quit", id="quit"),
    # Textual's own would say "palette": here it finds runs (console.tui.commands.RunCommands).
    Binding(
        "ctrl+p", "command_palette", "find run", show=False, priority=True, tooltip="find a run by name, id or state"
    ),
]


# The keys Textual and the console's widgets take before the app's bindings see them, and what for.
RESERVED_KEYS = {
    **dict.fromkeys(("up", "down", "left", "right", "pageup", "pagedown", "home", "end"), "moving"),
    **dict.fromkeys(("tab", "shift+tab"), "moving the focus"),
    "enter": "showing a job's nodes",
    "ctrl+p": "finding a run",
    "ctrl+c": "copying the log's selection",
    "ctrl+q": "quitting",
}


# Every key config.toml may name: Textual's named keys, and each character's name (`question_mark` for `?`).
KEY_NAMES = frozenset(
    [key.value for key in Keys if not key.value.startswith("<")]
    + [_character_to_key(c) for c in string.ascii_letters + string.digits + string.punctuation]
)


# The actions config.toml's [keys] may give a key: the console's bindings that have an id.
KEY_ACTIONS = tuple(b.id for b in Binding.make_bindings(BINDINGS) if b.id is not None)


class KeysError(ValueError):
    """config.toml's [keys] cannot be used; the message names the action or the key, and what to do."""


def key_name(written: str) -> str | None:
    """Textual's name of a key written as a character (`K`, `?`) or by its name (`ctrl+k`, `F5`); None: no key."""
    if len(written) == 1:
        return _character_to_key(written)  # Textual's own reading of a one-character binding (`?` is question_mark)
    return written.lower() if written.lower() in KEY_NAMES else None


def keymap(keys: Mapping[str, str]) -> dict[str, str]:
    """config.toml's [keys] (action -> key as written) as Textual's keymap (binding id -> key name); KeysError
    when an action is not the console's, a key is none, or a key would do two things."""
    chosen: dict[str, str] = {}
    for action, written in keys.items():
        if action not in KEY_ACTIONS:
            raise KeysError(f"{action!r} is not an action of the console; it knows {', '.join(KEY_ACTIONS)}")
        name = key_name(written)
        if name is None:
            raise KeysError(
                f'{action} = {written!r} is not a key; write a character ("K", "?") or a key\'s name '
                '("ctrl+k", "f5", "space")'
            )
        if name in RESERVED_KEYS:
            raise KeysError(f"{action} = {written!r}: that key is for {RESERVED_KEYS[name]}; choose another")
        chosen[action] = name
    check_one_action_per_key(chosen)
    return chosen


def check_one_action_per_key(chosen: Mapping[str, str]) -> None:
    """KeysError when, with `chosen` in place, one key would do two of the console's things."""
    doing: dict[str, str] = {}  # key -> what it does
    for binding in Binding.make_bindings(BINDINGS):
        what = binding.id or binding.description
        for key in rebound(binding, chosen).key.split(","):
            if key in doing:
                raise KeysError(
                    f"{format_key(key)!r} would do two things, {doing[key]} and {what}; give each its own key"
                )
            doing[key] = what


def rebound(binding: Binding, keys: Mapping[str, str]) -> Binding:
    """The binding on the key `keys` (binding id -> key name) gives its id, if any."""
    key = keys.get(binding.id or "")
    return binding if key is None else binding.with_key(key)
