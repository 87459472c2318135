"""A console that remembers you: config.toml's default_host, theme and [keys], `--config` and
$EAGLE3_CONSOLE_CONFIG, the theme chosen with `t` kept for the next start, `hosts -h`, NVML's install hint.

Real: the CLI as a process (a terminal in tmux where the console opens), OpenSSH's sshd on 127.0.0.1 for the
quick way through a multiplexer, the console driven through Textual's pilot against a real local agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from textual.binding import Binding, BindingsMap
from textual.notifications import Notification
from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from backends.host.gpus import NVML_INSTALL_HINT
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import (
    KEY_ACTIONS,
    RESERVED_KEYS,
    ConsoleApp,
    KeysError,
    Preferences,
    key_name,
    keymap,
    state_path,
)
from console.tui.dialogs import ConfirmScreen, HelpScreen
from tests.conftest import REPO, Notes, until

SLEEPER = "import time\nprint('serving', flush=True)\ntime.sleep(120)"


# --- NVML's install hint -------------------------------------------------------------------------------------


def gpu_error(tmp_path: Path, workdir: Path, pythonpath: list[Path]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLE3_NVML_MODULE", "FAKE_NVML_STATE")}
    env.update(PYTHONPATH=os.pathsep.join(str(p) for p in [*pythonpath, REPO]), PATH="/usr/bin:/bin")
    done = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local", "status", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout).get("gpu_error") or "")


def test_a_host_without_nvidia_ml_py_is_told_what_to_install(tmp_path: Path, workdir: Path) -> None:
    without = tmp_path / "without-pynvml"
    without.mkdir()
    # What `import pynvml` raises where nvidia-ml-py is not installed (this environment has it).
    (without / "pynvml.py").write_text("raise ModuleNotFoundError(\"No module named 'pynvml'\", name='pynvml')\n")
    said = gpu_error(tmp_path, workdir, [without])
    assert "NVML (pynvml) unavailable: No module named 'pynvml'; " + NVML_INSTALL_HINT in said
    assert "pip install nvidia-ml-py, or the eagle3-console[agent] extra" in said
    extras = (REPO / "pyproject.toml").read_text()
    assert "\nagent = [\n" in extras and '"nvidia-ml-py' in extras.split("\nagent = [\n")[1].split("]")[0]
    # nvidia-ml-py installed but no driver (or a GPU host): nothing to install
    assert NVML_INSTALL_HINT not in gpu_error(tmp_path, workdir, [])


# --- the console's theme -----------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def console(
    workdir: Path, preferences: Preferences
) -> AsyncIterator[tuple[ConsoleApp, Pilot[None], list[Notification]]]:
    notes = Notes()
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)), preferences=preferences)
    async with app.run_test(size=(160, 50), message_hook=notes) as pilot:
        await pilot.pause(0.2)
        yield app, pilot, notes
        await pilot.press(app.preferences.keymap.get("quit", "q"))


async def test_config_tomls_theme_is_the_first_theme(workdir: Path, nvml_state: Path) -> None:
    for written in ("eagle3-day", "day"):
        async with console(workdir, Preferences(theme=written)) as (app, _, notes):
            assert app.theme == "eagle3-day"
            assert not [n for n in notes if n.severity == "warning"]


async def test_an_unknown_theme_is_one_warning_and_the_default_theme(workdir: Path, nvml_state: Path) -> None:
    async with console(workdir, Preferences(theme="solarized", settings_file="/x/config.toml")) as (app, pilot, notes):
        note = await until(pilot, lambda: next((n for n in notes if n.title == "theme"), None), what="the warning")
        assert app.theme == "eagle3-night"
    assert note.severity == "warning" and "\n" not in note.message
    assert note.message.startswith("/x/config.toml: theme 'solarized' is not one of the console's (eagle3-")
    assert note.message.endswith("; it starts on eagle3-night")


async def test_t_keeps_the_theme_in_a_private_state_file_written_whole_and_used_at_the_next_start(
    workdir: Path, nvml_state: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state" / "eagle3-console" / "state.json"
    chosen = Preferences(theme="eagle3-night", state_file=state)
    async with console(workdir, chosen) as (app, pilot, _):
        assert app.theme == "eagle3-night" and not state.exists()  # nothing chosen yet, nothing written
        await pilot.press("t")
        await until(pilot, state.exists, what="the state file")
    assert json.loads(state.read_text()) == {"theme": "eagle3-day"}
    assert stat.S_IMODE(state.stat().st_mode) == 0o600 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    before = state.open()  # a reader of the state as it was: it is replaced whole, never rewritten in place
    async with console(workdir, chosen) as (app, pilot, _):
        assert app.theme == "eagle3-day"  # the theme chosen with t wins over config.toml's
        await pilot.press("t")
        await until(pilot, lambda: json.loads(state.read_text()) == {"theme": "eagle3-night"}, what="the new state")
    assert json.loads(before.read()) == {"theme": "eagle3-day"}
    before.close()
    assert [p.name for p in state.parent.iterdir()] == ["state.json"]  # no temp file left behind


async def test_a_state_file_that_cannot_be_read_is_said_and_the_console_starts_afresh(
    workdir: Path, nvml_state: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    async with console(workdir, Preferences(theme="day", state_file=state)) as (app, pilot, notes):
        note = await until(pilot, lambda: next((n for n in notes if str(state) in n.message), None), what="a note")
        assert app.theme == "eagle3-day" and note.severity == "warning" and "\n" not in note.message
        await pilot.press("t")
        await until(pilot, lambda: state.read_text() == '{"theme": "eagle3-night"}', what="the state rewritten")


def test_the_state_file_lives_under_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    assert state_path() == tmp_path / "s" / "eagle3-console" / "state.json"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert state_path() == tmp_path / "h" / ".local" / "state" / "eagle3-console" / "state.json"


# --- [keys] ---------------------------------------------------------------------------------------------------


def footer(app: ConsoleApp) -> dict[str, str]:
    """What the footer shows: each action's description and its key, as drawn."""
    return {key.description: key.key_display for key in app.query(FooterKey)}


async def test_keys_from_config_toml_are_in_the_footer_and_the_help_and_they_work(
    workdir: Path, nvml_state: Path
) -> None:
    async with AgentClient(LocalTransport(workdir)) as client:
        run_id = (await client.launch("command", [sys.executable, "-c", SLEEPER], name="sleeper"))["run"]
    chosen = Preferences(keymap=keymap({"kill": "K", "help": "h", "quit": "x"}))
    async with console(workdir, chosen) as (app, pilot, _):
        await until(pilot, lambda: run_id in app.runs, what="the run")
        shown = footer(app)
        assert (shown["kill run"], shown["help"], shown["quit"], shown["relaunch"]) == ("K", "h", "x", "r")
        await pilot.press("k")  # its old key does nothing now
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("K")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the kill's question")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the question to go")
        await pilot.press("h")
        screen = await until(pilot, lambda: app.screen if isinstance(app.screen, HelpScreen) else None, what="help")
        lines = screen.text.plain.splitlines()
        assert any(line.split() == ["K", "kill", "run"] for line in lines)
        assert any(line.split() == ["x", "quit"] for line in lines)
        await pilot.press("escape")


def test_swapped_keys_are_no_clash() -> None:
    assert keymap({"kill": "t", "theme": "k", "help": "?"}) == {"kill": "t", "theme": "k", "help": "question_mark"}


KEY_WORDS = st.one_of(
    st.sampled_from(["k", "K", "t", "T", "x", "?", "/", "n", "q", "ctrl+k", "F5", "space", "enter", "up", "ctlr+k"]),
    st.text(min_size=1, max_size=3),
)


def textual_binds_each_once(chosen: dict[str, str]) -> bool:
    """Textual's own keymap over the console's bindings leaves every binding on a key of its own."""
    bindings = list(Binding.make_bindings(ConsoleApp.BINDINGS))
    applied = BindingsMap(bindings)
    applied.apply_keymap(chosen)
    placed = [b for on_key in applied.key_to_bindings.values() for b in on_key]
    one_each = all(len(on_key) == 1 for on_key in applied.key_to_bindings.values())
    return one_each and len(placed) == len(bindings)


@given(st.dictionaries(st.sampled_from([*KEY_ACTIONS, "kil", "find"]), KEY_WORDS, max_size=5))
def test_a_keys_table_is_taken_whole_exactly_when_textual_binds_each_action_once(keys: dict[str, str]) -> None:
    names = {action: key_name(written) for action, written in keys.items()}
    usable = set(keys) <= set(KEY_ACTIONS) and all(n is not None and n not in RESERVED_KEYS for n in names.values())
    try:
        chosen = keymap(keys)
    except KeysError as exc:
        said = str(exc)
        assert "\n" not in said and any(action in said for action in keys)
        assert not usable or not textual_binds_each_once({a: n for a, n in names.items() if n is not None})
        return
    assert usable and textual_binds_each_once(chosen)
    assert chosen == names
