"""A console that remembers you: config.toml's default_host, theme and [keys], `--config` and
$EAGLE3_CONSOLE_CONFIG, the theme chosen with `t` kept for the next start, `hosts -h`, NVML's install hint.

Real: the CLI as a process (a terminal in tmux where the console opens), OpenSSH's sshd on 127.0.0.1 for the
quick way through a multiplexer, the console driven through Textual's pilot against a real local agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
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
from console.tui.app import ConsoleApp
from console.tui.dialogs import ConfirmScreen, HelpScreen
from console.tui.keys import KEY_ACTIONS, RESERVED_KEYS, KeysError, key_name, keymap
from console.tui.preferences import Preferences, state_path
from tests.conftest import REPO, Notes, until, wait_for
from tests.sshd import ALIAS, Sshd
from tests.test_cli_config import eagle3
from tests.test_ssh_reuse import Place
from tests.tmux import Tmux

SLEEPER = "import time\nprint('serving', flush=True)\ntime.sleep(120)"
NO_DEFAULT = (
    "no HOST given and no default_host in {path}; give HOST (e.g. `eagle3-console local status`) or set default_host\n"
)


def user_env(tmp_path: Path, toml: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """A user's environment in tmp_path (HOME unless `base` has one, XDG_CONFIG_HOME, XDG_STATE_HOME), with
    config.toml at its default place saying `toml` (None: no file) and no $EAGLE3_CONSOLE_CONFIG."""
    env = dict(base) if base is not None else {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("EAGLE3_CONSOLE_CONFIG", None)
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), XDG_STATE_HOME=str(tmp_path / "state"))
    if toml is not None:
        default_config(tmp_path).parent.mkdir(parents=True, exist_ok=True)
        default_config(tmp_path).write_text(toml)
    return env


def default_config(tmp_path: Path) -> Path:
    return tmp_path / "xdg" / "eagle3-console" / "config.toml"


def launched(env: dict[str, str], *args: str) -> str:
    done = eagle3(*args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def run_ids(status: subprocess.CompletedProcess[str]) -> list[str]:
    assert status.returncode == 0, status.stderr
    return [run["id"] for run in json.loads(status.stdout)["runs"]]


# --- default_host --------------------------------------------------------------------------------------------


def test_a_command_given_without_host_runs_on_the_default_host(tmp_path: Path, workdir: Path) -> None:
    env = user_env(tmp_path, f'[defaults]\ndefault_host = "local"\nworkdir = "{workdir}"\n')
    run_id = launched(env, "launch", "command", "--name", "sleeper", "--", sys.executable, "-c", SLEEPER)
    assert (workdir / "runs" / run_id).is_dir()  # the default host's store (local, its workdir)
    assert run_ids(eagle3("status", "--json", env=env)) == [run_id]
    killed = eagle3("kill", "sleeper", "--grace", "1", env=env)  # a command with its own words after it
    assert killed.returncode == 0, killed.stderr
    assert json.loads(eagle3("status", run_id, "--json", env=env).stdout)["state"] == "killed"


def test_without_a_default_host_a_command_without_host_says_so_in_one_line(tmp_path: Path) -> None:
    env = user_env(tmp_path, "[defaults]\nstall_after = 60\n")
    for words in (["status"], ["kill", "some-run"], ["--readonly"], []):
        done = eagle3(*words, env=env)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == "eagle3-console: " + NO_DEFAULT.format(path=default_config(tmp_path))
    helped = eagle3("kill", "--help", env=env)  # a command's help needs no host
    assert helped.returncode == 0 and "usage: eagle3-console HOST kill" in helped.stdout


def test_a_host_named_like_a_command_is_the_host_when_a_command_follows_it(tmp_path: Path, workdir: Path) -> None:
    """kubectl's way round: a command word alone at the head is the command (on the default host); followed by a
    command, it names the host, as `eagle3-console gpu1 status` does."""
    named = tmp_path / "named-store"
    toml = (
        f'[defaults]\ndefault_host = "home"\n\n[hosts.home]\naddress = "local"\nworkdir = "{workdir}"\n\n'
        f'[hosts.status]\naddress = "local"\nworkdir = "{named}"\n'
    )
    env = user_env(tmp_path, toml)
    on_named = launched(env, "status", "launch", "command", "--name", "there", "--", "true")
    assert (named / "runs" / on_named).is_dir()
    assert run_ids(eagle3("status", "status", "--json", env=env)) == [on_named]
    assert run_ids(eagle3("status", "--json", env=env)) == []  # the default host's store: nothing there


def test_the_console_opens_on_the_default_host_with_config_tomls_theme_and_keys_and_remembers_t(
    tmp_path: Path, workdir: Path
) -> None:
    toml = (
        f'[defaults]\ndefault_host = "local"\nworkdir = "{workdir}"\ntheme = "day"\n\n[keys]\nkill = "K"\ntheme = "T"\n'
    )
    env = user_env(tmp_path, toml)
    env.update(TERM="xterm-256color", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    launched(env, "launch", "command", "--name", "remembered", "--", sys.executable, "-c", SLEEPER)
    written = default_config(tmp_path).read_bytes()
    state = tmp_path / "state" / "eagle3-console" / "state.json"

    def theme_after_T() -> str:
        """The theme the console shows once T is pressed: the one after the theme it started on."""
        with Tmux(["eagle3-console"], width=160, height=45, env=env, cwd=tmp_path) as term:
            term.wait_text("remembered", timeout=60)  # the default host's run
            # The footer says config.toml's keys (drawn a frame after the table on a loaded machine).
            term.wait_for(lambda s: "K kill" in s and "T theme" in s, 20, "the footer with config.toml's keys")
            term.send("T")
            told = term.wait_for(lambda s: "".join(re.findall(r"theme: (eagle3-\w+)", s)[:1]), 20, "the theme")
            term.send("q")
            term.wait_for(lambda s: "remembered" not in s, timeout=20, what="the console to close")
        return told

    assert theme_after_T() == "eagle3-night"  # it started on config.toml's day
    assert json.loads(state.read_text()) == {"theme": "eagle3-night"}
    assert stat.S_IMODE(state.stat().st_mode) == 0o600 and stat.S_IMODE(state.parent.stat().st_mode) == 0o700
    assert theme_after_T() == "eagle3-day"  # it started on night, chosen with T, over config.toml's day
    assert default_config(tmp_path).read_bytes() == written  # the person's file, never rewritten


# --- the quick way ---------------------------------------------------------------------------------------------


@pytest.fixture
def place(sshd: Sshd, tmp_path: Path) -> Iterator[Place]:
    """A laptop whose runtime folder holds its multiplexers (short: a socket path fits in 108 bytes)."""
    runtime = Path(tempfile.mkdtemp(prefix="e3r", dir="/tmp"))
    here = Place(sshd, runtime, tmp_path / "work")
    yield here
    for pid in here.multiplexers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not here.multiplexers(), what="the multiplexers to exit")
    subprocess.run(["rm", "-rf", str(runtime)], check=True)


def test_the_quick_way_answers_a_command_without_host_on_the_default_host(place: Place, tmp_path: Path) -> None:
    env = user_env(tmp_path, f'[defaults]\ndefault_host = "{ALIAS}"\nworkdir = "{place.workdir}"\n', place.env())
    assert eagle3("status", env=env).returncode == 0  # direct: it leaves a multiplexer for the default host
    place.serving()
    no_event_loop = "import sys\nsys.modules['asyncio'] = None\nfrom console.__main__ import main\nsys.exit(main())"
    quick = subprocess.run(
        [sys.executable, "-c", no_event_loop, "status", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert quick.returncode == 0, quick.stderr  # answered without asyncio: through the multiplexer
    assert json.loads(quick.stdout)["runs"] == []


# --- which config.toml -------------------------------------------------------------------------------------------


def host_names(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [host["name"] for host in json.loads(done.stdout)]


def test_config_flag_wins_over_the_environment_which_wins_over_the_default_place(tmp_path: Path) -> None:
    env = user_env(tmp_path, "[hosts.from-default-place]\n")
    (tmp_path / "env.toml").write_text("[hosts.from-env]\n")
    (tmp_path / "flag.toml").write_text("[hosts.from-flag]\n")
    assert host_names(eagle3("hosts", "--json", env=env)) == ["from-default-place"]
    env["EAGLE3_CONSOLE_CONFIG"] = str(tmp_path / "env.toml")
    assert host_names(eagle3("hosts", "--json", env=env)) == ["from-env"]
    assert host_names(eagle3("--config", str(tmp_path / "flag.toml"), "hosts", "--json", env=env)) == ["from-flag"]
    assert host_names(eagle3(f"--config={tmp_path / 'flag.toml'}", "hosts", "--json", env=env)) == ["from-flag"]


def test_the_named_config_gives_the_default_host_and_settings(tmp_path: Path, workdir: Path) -> None:
    env = user_env(tmp_path, None)
    (tmp_path / "lab.toml").write_text(f'[defaults]\ndefault_host = "local"\nworkdir = "{workdir}"\n')
    run_id = launched(env, "--config", str(tmp_path / "lab.toml"), "launch", "command", "--", "true")
    assert (workdir / "runs" / run_id).is_dir()


@pytest.mark.parametrize("how", ["--config", "EAGLE3_CONSOLE_CONFIG"])
def test_a_missing_config_named_is_one_line_exit_2_and_the_default_one_missing_is_no_settings(
    tmp_path: Path, how: str
) -> None:
    env = user_env(tmp_path, None)
    assert eagle3("hosts", env=env).returncode == 0  # nothing at the default place: no settings, no error
    missing = tmp_path / "nowhere.toml"
    if how == "--config":
        done = eagle3("--config", str(missing), "local", "status", env=env)
    else:
        done = eagle3("local", "status", env={**env, how: str(missing)})
    named = "--config" if how == "--config" else "$EAGLE3_CONSOLE_CONFIG"
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == f"eagle3-console: {missing}: no such settings file (named by {named}); create it, or name another\n"
    )


# --- hosts -h ----------------------------------------------------------------------------------------------------


def test_hosts_is_in_the_command_list_and_has_its_own_help(tmp_path: Path) -> None:
    env = user_env(tmp_path, None)
    top = eagle3("--help", env=env)
    commands = top.stdout[top.stdout.index("COMMAND\n") : top.stdout.index("options:")]
    assert "    hosts " in commands
    own = eagle3("hosts", "-h", env=env)
    assert own.returncode == 0
    assert own.stdout.startswith("usage: eagle3-console hosts [-h] [--json]") and "--json" in own.stdout
    assert "--workdir" not in own.stdout  # not the top-level help
    wrong = eagle3("hosts", "--jsn", env=env)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "eagle3-console hosts --help" in wrong.stderr


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
        # The footer is drawn a frame after the table on a busy machine.
        shown = await until(pilot, lambda: footer(app) if "kill" in footer(app) else None, what="the footer")
        assert (shown["kill"], shown["help"], shown["quit"], shown["relaunch"]) == ("K", "h", "x", "r")
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
        assert any(line.split() == ["K", "kill"] for line in lines)
        assert any(line.split() == ["x", "quit"] for line in lines)
        await pilot.press("escape")


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('kil = "K"', "[keys] 'kil' is not an action of the console; it knows kill, relaunch, free_gpus, "),
        ('kill = "t"', "[keys] 't' would do two things, kill and theme; give each its own key"),
        ('kill = "x"\nwrap = "x"', "[keys] 'x' would do two things, kill and wrap; give each its own key"),
        ('help = "/"', "[keys] '/' would do two things, find text in the log (any case) and help; give each"),
        ('kill = "ctlr+k"', "[keys] kill = 'ctlr+k' is not a key; write a character"),
        ('quit = "enter"', "[keys] quit = 'enter': that key is for showing a job's nodes; choose another"),
        ('kill = ""', "[keys] kill must be a key, e.g. kill = \"K\", not ''"),
        ("keys = 3", "[keys] must be a table of actions and keys"),
    ],
)
def test_a_keys_table_the_console_cannot_use_is_one_line_naming_the_file_exit_2(
    tmp_path: Path, workdir: Path, table: str, said: str
) -> None:
    defaults = f'[defaults]\ndefault_host = "local"\nworkdir = "{workdir}"\n'
    toml = f"{table}\n{defaults}" if table.startswith("keys =") else f"{defaults}[keys]\n{table}\n"
    env = user_env(tmp_path, toml)
    done = eagle3(env=env)  # the console (it checks its keys before it asks for a terminal)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"eagle3-console: {default_config(tmp_path)}: ") and said in done.stderr
    assert done.stderr.count("\n") == 1


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
