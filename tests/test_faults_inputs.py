"""Hostile and absurd input as a user (or any client of the agent) can give it: refused in one line,
shown escaped, never spinning the host. Real agents, real runs, the real command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.protocol import MIN_INTERVAL_S, ProtocolError, parse_request, request_line
from backends.runs.store import RunSpec, SpecError
from console import render
from console.cli.fleet_commands import watch_lines
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError
from console.tui.app import ConsoleApp
from console.tui.panels import RunDetail, RunsTable, detail_text, run_row
from console.visible import printable
from tests.conftest import CLI, launch, run_info, until, wait_state

TRUE = shutil.which("true") or "/bin/true"
# What a terminal acts on instead of showing: controls, format characters (bidi overrides),
# line and paragraph separators, and lone surrogates (which cannot even be printed).
CONTROL_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def controls(text: str) -> list[str]:
    return [ch for ch in text if unicodedata.category(ch) in CONTROL_CATEGORIES]


# ---- a. what no program can be given is refused at the protocol, and in specs read from disk ----

hostile = st.text(max_size=6) | st.sampled_from(["\x00", "a\x00b", "\ud800", "\udcff", "=", "A=B", "", "\x1b[2J"])


def startable(argv: list[str], env: dict[str, str], cwd: str) -> bool:
    """Whether a supervisor could start this command: exec takes its argv and env, the kernel its cwd."""
    try:
        subprocess.run([TRUE, *argv], env=env, cwd="/", check=True)
        os.stat(cwd)  # the folder need not exist here; the path must be one the kernel can be given
    except FileNotFoundError:
        return True
    except ValueError:  # embedded NUL, '=' in an env name, a character with no bytes
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(argv=st.lists(hostile, min_size=1, max_size=3), env=st.dictionaries(hostile, hostile, max_size=3), cwd=hostile)
def test_a_command_is_refused_exactly_when_no_program_could_be_started_with_it(
    argv: list[str], env: dict[str, str], cwd: str
) -> None:
    args: dict[str, Any] = {"kind": "command", "argv": argv, "env": env, "cwd": cwd}
    try:
        parse_request(request_line(1, "launch", args))
        refused: ProtocolError | None = None
    except ProtocolError as exc:
        refused = exc
    try:
        RunSpec(kind="command", argv=argv, env=env, cwd=cwd).validate()  # a spec.json from disk: the same rule
        on_disk: SpecError | None = None
    except SpecError as exc:
        on_disk = exc
    assert (refused is None) == (on_disk is None), (refused, on_disk)
    if refused is None:
        assert startable(argv, env, cwd)
        return
    assert refused.code == "bad_args"
    for message in (refused.message, str(on_disk)):
        assert message and not controls(message), message  # one line, what it quotes escaped
    # An empty name is refused too, although exec would take it (as "=value").
    assert "" in env or not startable(argv, env, cwd)


def run_folders(workdir: Path) -> list[Path]:
    runs = workdir / "runs"
    return sorted(runs.iterdir()) if runs.is_dir() else []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"argv": ["echo", "a\x00b"]}, "argv[1] contains a NUL byte"),
        ({"argv": ["echo"], "env": {"A=B": "x"}}, "name 'A=B' contains '='"),
        ({"argv": ["echo"], "env": {"": "x"}}, "needs a name"),
        ({"argv": ["echo"], "env": {"A": "x\x00y"}}, "env['A'] contains a NUL byte"),
        ({"argv": ["echo"], "cwd": "/tmp\x00x"}, "cwd contains a NUL byte"),
    ],
)
async def test_a_launch_no_program_can_take_is_refused_before_any_run_exists(
    client: AgentClient, workdir: Path, args: dict[str, Any], said: str
) -> None:
    for op in ("launch", "preflight"):
        with pytest.raises(AgentError) as refused:
            await client.request(op, kind="command", **args)
        assert refused.value.code == "bad_args" and said in refused.value.message
        assert "\n" not in refused.value.message
    assert run_folders(workdir) == []


def test_a_spec_on_disk_that_no_program_can_take_is_refused_in_one_line(cli: CLI, workdir: Path) -> None:
    run_id = launch(cli, "command", "--name", "tampered", "--", sys.executable, "-c", "pass")
    wait_state(cli, run_id, {"exited"})
    spec_file = workdir / "runs" / run_id / "spec.json"
    spec = json.loads(spec_file.read_text())
    spec["argv"].append("a\x00b")
    spec_file.write_text(json.dumps(spec))
    relaunched = cli("relaunch", run_id, "--set=--x")
    assert relaunched.returncode == 1
    assert relaunched.stderr.decode().count("\n") == 1 and "argv[3] contains a NUL byte" in relaunched.stderr.decode()
    assert run_folders(workdir) == [workdir / "runs" / run_id]  # nothing was launched
    assert cli("status").returncode == 0


# ---- b. names and command lines are shown escaped: no cell, line or panel holds a control ----

nasty = st.text(max_size=12) | st.sampled_from(["\x1b[31mred", "a\nb", "\r", "\u202eevil", "\x9b2J", "\x07", "\ud800"])
run_states = st.sampled_from(["starting", "running", "ready", "stalled", "exited", "failed", "killed", "lost"])
diagnoses = st.fixed_dictionaries({"code": nasty, "meaning": nasty, "hint": nasty, "line": nasty})


@st.composite
def hostile_runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 3))
    return [
        {
            "id": f"20261130-000000-000-{i:04x}",
            "name": draw(nasty),
            "kind": draw(st.sampled_from(["extract", "train", "serve", "command"])),
            "state": draw(run_states),
            "phase": draw(st.none() | nasty),
            "pid": draw(st.none() | st.integers(1, 99999)),
            "argv": draw(st.lists(nasty, min_size=1, max_size=3)),
            "env": {},
            "gpus": [],
            "started_at": None,
            "ended_at": None,
            "exit_code": draw(st.none() | st.integers(0, 255)),
            "signal": None,
            "error": draw(st.none() | nasty),
            "parent": None,
            "health": draw(st.none() | nasty),
            "stalled_since": None,
            "stall_kind": None,
            "stack_dumps": draw(st.none() | st.lists(nasty, min_size=1, max_size=2)),
            "diagnoses": draw(st.lists(diagnoses, max_size=2)),
            "corrupt": None,
            "truncated": [],
        }
        for i in range(count)
    ]


@settings(max_examples=200, deadline=None)
@given(runs=hostile_runs(), before=st.dictionaries(st.sampled_from(["x", "20261130-000000-000-0000"]), run_states))
def test_no_rendered_table_cell_line_or_panel_holds_a_control_character(
    runs: list[dict[str, Any]], before: dict[str, str]
) -> None:
    text = render.status_text(
        {"host": "h", "gpu_source": "none", "gpu_error": None, "runs": runs, "gpus": [], "problems": [], "omitted": 0}
    )
    lines = text.split("\n")
    assert not controls(text.replace("\n", ""))
    header = next(i for i, line in enumerate(lines) if line.startswith("RUN "))
    for offset, run in enumerate(runs, 1):  # each run is one row of its own
        assert lines[header + offset].startswith(run["id"])
    assert not lines[header + len(runs) + 1]
    for as_json in (False, True):
        for line in watch_lines(before, runs, as_json) + watch_lines(None, runs, as_json):
            assert "\n" not in line and not controls(line)
    for run in runs:
        assert all(not controls(cell.plain) for cell in run_row(run, {}))
        assert not controls(detail_text(run).plain.replace("\n", ""))
        preview = {"parent": run["id"], "would_stop": True, "argv": run["argv"], "flags": None, "doctor": None}
        assert len(render.relaunch_preview(preview).split("\n")) == 2
        assert not controls(render.relaunch_preview(preview).replace("\n", ""))


def test_controls_are_written_as_their_escapes() -> None:
    assert printable("\x1b[31mred\nline\ttab\r\x07\u202e") == "\\x1b[31mred\\nline\\ttab\\r\\x07\\u202e"
    assert printable("plain text, ünïcode and 🦅") == "plain text, ünïcode and 🦅"


NAME = "\x1b[31mred\nline [bold]x[/bold]"
ESCAPED = "\\x1b[31mred\\nline [bold]x[/bold]"


def test_the_status_table_shows_a_hostile_name_and_command_escaped(cli: CLI) -> None:
    run_id = launch(cli, "command", "--name", NAME, "--", "sh", "-c", "true # \x1b]0;title\x07")
    wait_state(cli, run_id, {"exited"})
    shown = cli("status").stdout.decode()
    assert "\x1b" not in shown and "\x07" not in shown
    row = next(line for line in shown.splitlines() if line.startswith(run_id))
    assert "\\x1b[31mred\\nline" in row and "\\x1b]0;title\\x07" in row
    assert run_info(cli, run_id)["name"] == NAME  # the data itself is untouched


async def test_the_console_shows_a_hostile_name_escaped_and_not_as_markup(workdir: Path, nvml_state: Path) -> None:
    async with AgentClient(LocalTransport(workdir)) as client:
        run_id = (await client.request("launch", kind="command", argv=[sys.executable, "-c", "pass"], name=NAME))["run"]
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 1, what="the run's row")
        cell = str(table.get_row(run_id)[1])  # escaped, and cut to its column (… says so)
        assert cell == ESCAPED or (cell.endswith("…") and ESCAPED.startswith(cell[:-1]) and len(cell) > 8)
        await until(pilot, lambda: ESCAPED in str(app.query_one(RunDetail).render()), what="the detail panel")
        await pilot.press("q")


# ---- c. a stall window that is no number of seconds ----


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("nan", "'nan' is not a number of seconds"),
        ("inf", "'inf' is not a number of seconds"),
        ("1e400", "'1e400' is not a number of seconds"),
        ("-1", "seconds cannot be negative"),
        ("0", "a stall window is more than 0 seconds"),
    ],
)
def test_a_stall_window_that_is_no_number_of_seconds_is_a_usage_error(
    cli: CLI, workdir: Path, value: str, said: str
) -> None:
    done = cli("launch", "command", f"--stall-after={value}", "--", sys.executable, "-c", "pass")
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1 and said in err, err
    assert run_folders(workdir) == []


@pytest.mark.parametrize("number", [float("inf"), float("nan")])
async def test_the_agent_refuses_seconds_that_are_not_finite(client: AgentClient, number: float) -> None:
    with pytest.raises(AgentError) as refused:
        await client.request("launch", kind="command", argv=["true"], stall_after=number)
    assert refused.value.code == "bad_args" and "finite" in refused.value.message


# ---- d. a poll interval with a floor, at the CLI and at the agent ----


@pytest.mark.parametrize("interval", ["0", "0.05", "nan"])
def test_watch_refuses_an_interval_below_the_floor(cli: CLI, interval: str) -> None:
    done = cli("watch", "--interval", interval, timeout=20)
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1 and "--interval" in err, err


async def test_the_agent_answers_status_polls_no_faster_than_the_floor(client: AgentClient) -> None:
    replies, start = 0, time.monotonic()
    while time.monotonic() - start < 1.0:  # a client polling as fast as it can
        await client.request("status", gpus=False)
        replies += 1
    assert replies <= 1.0 / MIN_INTERVAL_S + 2
    with pytest.raises(AgentError) as refused:
        await client.subscribe(gpu_interval=MIN_INTERVAL_S / 2)
    assert refused.value.code == "bad_args" and str(MIN_INTERVAL_S) in refused.value.message


# ---- e. relaunch --dry-run says it would stop only a run with live processes ----


def test_relaunch_dry_run_would_stop_only_a_run_that_is_alive(cli: CLI) -> None:
    ended = launch(cli, "command", "--name", "ended", "--", sys.executable, "-c", "pass")
    alive = launch(cli, "command", "--name", "alive", "--", sys.executable, "-c", "import time; time.sleep(60)")
    wait_state(cli, ended, {"exited"})
    wait_state(cli, alive, {"running"})
    preview = cli("relaunch", ended, "--set=--x", "--dry-run")
    assert preview.returncode == 0
    assert "would stop" not in preview.stdout.decode()
    assert f"run {ended} has no live process to stop; would start:" in preview.stdout.decode()
    preview = cli("relaunch", alive, "--set=--x", "--dry-run")
    assert preview.stdout.decode().startswith(f"would stop run {alive} and start:")
    assert json.loads(cli("relaunch", ended, "--set=--x", "--dry-run", "--json").stdout)["would_stop"] is False
    assert run_info(cli, alive)["state"] == "running"


# ---- f. logs of a run whose output.log is gone ----


def test_logs_of_a_run_whose_output_log_is_gone_says_so(cli: CLI, workdir: Path) -> None:
    run_id = launch(cli, "command", "--name", "gone", "--", sys.executable, "-c", "print('hi')")
    wait_state(cli, run_id, {"exited"})
    (workdir / "runs" / run_id / "output.log").unlink()
    for extra in ([], ["--tail", "3"], ["--follow"]):
        shown = cli("logs", "gone", *extra, timeout=20)
        assert shown.returncode == 1 and shown.stdout == b""
        assert shown.stderr.decode() == f"eagle3-console: run {run_id} has no output.log (removed?)\n"
