"""The console puts what needs a person first (Textual's pilot, a real local agent, real runs): a serve run's startup
timeline and health history, failures sorted first and explained, a relaunch followed to its fate, a stall with
its silence, frames and what to try, a runs table that fits a 100-column terminal, the help and its legend."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from rich.text import Text
from textual.notifications import Notification
from textual.pilot import Pilot

from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.dialogs import ConfirmScreen, HelpScreen, RelaunchScreen
from console.tui.log import TailLog
from console.tui.panels import CELL_PADDING, RunDetail, RunsTable, fit_columns, run_row
from tests.conftest import Notes, free_port, until
from tests.fake_nvml import write_state

SLEEPER = "import time\nprint('serving', flush=True)\ntime.sleep(120)"
FAILING = "import time\ntime.sleep(1)\nraise RuntimeError('the draft head has no lm_head')"


async def launch(workdir: Path, argv: list[str], kind: str = "command", name: str = "job", **how: object) -> str:
    async with AgentClient(LocalTransport(workdir)) as client:
        result = await client.launch(kind, argv, name=name, **how)  # type: ignore[arg-type]
    return result["run"]


@contextlib.asynccontextmanager
async def console(
    workdir: Path, size: tuple[int, int] = (160, 50)
) -> AsyncIterator[tuple[ConsoleApp, Pilot[None], list[Notification]]]:
    notes = Notes()

    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=size, message_hook=notes) as pilot:
        yield app, pilot, notes
        await pilot.press("q")


def state(app: ConsoleApp, run_id: str) -> str | None:
    run = app.runs.get(run_id)
    return run["state"] if run else None


def detail(app: ConsoleApp) -> str:
    return str(app.query_one(RunDetail).render())


async def test_a_servers_detail_shows_its_startup_timeline_and_health_only_while_it_lives(
    workdir: Path, nvml_state: Path
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(port)]
    run_id = await launch(workdir, argv, kind="serve", name="srv", health_url=f"http://127.0.0.1:{port}/health")
    async with console(workdir) as (app, pilot, _):
        await until(pilot, lambda: state(app, run_id) == "ready", timeout=30, what="ready")
        await until(pilot, lambda: "ready in" in detail(app), what="the timeline")
        shown = detail(app)
        assert "launch " in shown and "load-weights " in shown and "cuda-graph " in shown and " → " in shown
        assert "health ok" in shown
        strip = next(line for line in shown.splitlines() if line.startswith("health "))
        assert "█" in strip and ("▒" in strip or "·" in strip)
        async with AgentClient(LocalTransport(workdir)) as client:
            await client.kill(run_id, grace=2)
        await until(pilot, lambda: app.runs[run_id]["state"] == "killed", what="killed")
        await until(pilot, lambda: "ended by signal" in detail(app), what="the end in the detail")
        shown = detail(app)
        assert "health" not in shown  # a killed server answers nothing: neither its last answer nor the strip
        assert "ready in" in shown  # its timeline stays


async def test_a_failed_run_sorts_first_stays_marked_until_seen_and_shows_its_exit(
    workdir: Path, nvml_state: Path
) -> None:
    sleeper = await launch(workdir, [sys.executable, "-c", SLEEPER], name="steady")
    async with console(workdir) as (app, pilot, _):
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.selected_run() == sleeper, what="the run")
        failing = await launch(workdir, [sys.executable, "-c", FAILING], name="doomed")
        await until(pilot, lambda: state(app, failing) == "failed", timeout=30, what="failure")
        await until(pilot, lambda: "1 failed · 1 running" in app.sub_title, what="the counts")
        assert table.selected_run() == sleeper
        assert str(table.get_row_at(0)[0]).endswith(failing[-4:])  # first, though launched last
        assert str(table.get_cell(failing, "STATE")).startswith("● ")  # marked: nobody looked at it yet
        table.move_cursor(row=0)
        # Why it failed, in the host's one line: its exception, then how it ended.
        why = "RuntimeError: the draft head has no lm_head (exit code 1)"
        await until(pilot, lambda: why in detail(app), what="why it failed")
        await until(pilot, lambda: not str(table.get_cell(failing, "STATE")).startswith("●"), what="the mark to go")
        table.move_cursor(row=1)
        await pilot.pause(2.5)  # a poll later, the failure stays seen
        assert str(table.get_cell(failing, "STATE")) == "failed"


async def test_a_relaunch_moves_the_cursor_to_the_new_run_and_tells_its_fate(workdir: Path, nvml_state: Path) -> None:
    # Without the flag it serves; with it, it fails: the relaunch's fate is news.
    script = "import sys, time\ntime.sleep(1 if '--disable-cuda-graph' in sys.argv else 120)\nsys.exit(3)"
    parent = await launch(workdir, [sys.executable, "-c", script, "--model-path", "m"], name="srv")
    async with console(workdir) as (app, pilot, notes):
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.selected_run() == parent, what="the run")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), what="the relaunch dialog")
        await pilot.click("Button.preset")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the preview")
        await pilot.press("y")
        await until(pilot, lambda: len(app.runs) == 2, what="the new run")
        child = next(run_id for run_id in app.runs if run_id != parent)
        await until(pilot, lambda: table.selected_run() == child, what="the cursor on the new run")
        await until(pilot, lambda: f"relaunch of {parent}: added --disable-cuda-graph" in detail(app), what="lineage")
        fate = await until(
            pilot, lambda: next((n for n in notes if "relaunch of" in n.message), None), timeout=30, what="its fate"
        )
        assert (
            fate.severity == "error"
            and child in fate.message
            and "failed: it printed nothing (exit code 3)" in fate.message
        )
        # Told once: the poll's own "running → failed" is not said again for the same run.
        assert not [n for n in notes if child in n.message and "→ failed" in n.message]


async def test_a_silent_run_counts_its_silence_then_shows_its_stall_frames_and_what_to_try(
    workdir: Path, nvml_state: Path
) -> None:
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(free_port()), "--hang-in", "load-weights"]
    run_id = await launch(workdir, argv, kind="serve", name="hung", stall_after=8)
    async with console(workdir) as (app, pilot, _):
        await until(pilot, lambda: "silent for " in detail(app), timeout=20, what="the silence counter")
        await until(pilot, lambda: app.runs[run_id]["state"] == "stalled", timeout=30, what="the stall")
        await until(pilot, lambda: "  at " in detail(app), timeout=20, what="the top frames")
        shown = detail(app)
        assert "stalled in load-weights" in shown and "processes and GPUs idle" in shown
        assert "hang_forever" in shown  # the stand-in's frame that never returns
        assert "  try: " in shown
        assert "1 stalled" in app.sub_title


def test_the_runs_table_drops_and_squeezes_columns_to_fit() -> None:
    run = {
        "id": "20261129-070000-000-a1b2",
        "name": "a-draft-model-with-a-very-long-name",
        "kind": "train",
        "state": "running",
        "phase": None,
        "pid": 123456,
        "exit_code": None,
        "signal": None,
        "error": None,
    }
    rows = [run_row(run, {}, "step 1295/3000 · ETA 4 m 10 s")]
    wide = fit_columns(200, rows)
    assert list(wide) == ["RUN", "NAME", "KIND", "STATE", "PHASE", "PID", "EXIT", "GPUS"]
    narrow = fit_columns(58, rows)
    assert "PID" not in narrow and "RUN" in narrow and "STATE" in narrow
    assert sum(width + 2 * CELL_PADDING for width in narrow.values()) <= 58


async def test_at_100_columns_no_cell_is_wider_than_its_column(workdir: Path, nvml_state: Path) -> None:
    trainer = (
        "import json, os, time\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for step in range(1, 31):\n"
        "        m.write(json.dumps({'step': step, 'loss': 1 / step}) + '\\n'); m.flush(); time.sleep(0.1)\n"
        "time.sleep(120)\n"
    )
    await launch(workdir, [sys.executable, "-c", SLEEPER], name="extract-a-long-wikipedia-dump-into-shards")
    train = await launch(workdir, [sys.executable, "-c", trainer, "--steps", "3000"], kind="train", name="draft-me")
    async with console(workdir, size=(100, 30)) as (app, pilot, _):
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.selected_run() == train, what="the training")
        await until(pilot, lambda: "/3000" in str(table.get_cell(train, "PHASE")), what="its step")
        await until(pilot, lambda: "step 30/3000 · E" in str(table.get_cell(train, "PHASE")), what="its ETA")
        assert "PID" not in table.columns  # given up for the columns that matter
        room = table.scrollable_content_region.width
        widths = [column.width for column in table.columns.values()]
        assert sum(w + 2 * CELL_PADDING for w in widths) <= room
        for row_index in range(table.row_count):
            for cell, width in zip(table.get_row_at(row_index), widths, strict=True):
                assert isinstance(cell, Text) and cell.cell_len <= width, (str(cell), width)


async def test_help_shows_this_consoles_keys_grouped_and_the_legend(workdir: Path, nvml_state: Path) -> None:
    async with console(workdir, size=(120, 40)) as (app, pilot, notes):
        await pilot.press("question_mark")
        screen = await until(pilot, lambda: app.screen if isinstance(app.screen, HelpScreen) else None, what="help")
        await until(pilot, lambda: app.focused is not None, what="the focus")
        assert app.focused is not None and app.focused.id == "cancel"
        text = screen.text.plain
        assert text.index("the selected run") < text.index("k           kill") < text.index("states")
        assert "w           wrap" in text and "^p          find a run by name, id or state" in text
        for legend in ("stalled", "failed", "● a failure not looked at yet", "health history", "█", "·"):
            assert legend in text
        assert "Cursor" not in text  # Textual's generic keys are not this console's
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help to close")
        await pilot.press("t")
        await until(pilot, lambda: any(n.message == f"theme: {app.theme}" for n in notes), what="the theme's name")


async def test_free_gpus_on_a_host_without_gpus_says_so_and_why(workdir: Path, nvml_state: Path) -> None:
    write_state(nvml_state, [])
    async with console(workdir) as (app, pilot, notes):
        await pilot.pause(0.5)
        await pilot.press("f")
        note = await until(pilot, lambda: next((n for n in notes if n.title == "free GPUs"), None), what="the answer")
        assert note.message.startswith("this host shows no GPU (GPU source: nvml)")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_the_log_wraps_on_w_and_follows_its_tail(workdir: Path, nvml_state: Path) -> None:
    script = "import time\nfor i in range(200):\n    print(f'line {i} ' + 'x' * 150, flush=True)\ntime.sleep(120)"
    run_id = await launch(workdir, [sys.executable, "-c", script], name="chatty")
    async with console(workdir, size=(100, 30)) as (app, pilot, _):
        log = app.query_one(TailLog)
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        await until(pilot, lambda: any("line 199" in line.text for line in log.lines), what="the log")
        # the tail is in view, not the oldest lines
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y > 0, what="the tail in view")
        await pilot.press("w")
        await until(pilot, lambda: log.wrap and len(log.lines) > 200, what="wrapped lines")
        await until(pilot, lambda: log.scroll_y == log.max_scroll_y, what="the wrapped tail in view")


async def test_a_training_not_selected_shows_its_step_and_eta_too(workdir: Path, nvml_state: Path) -> None:
    trainer = (
        "import json, os, time\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for step in range(1, 201):\n"
        "        m.write(json.dumps({'step': step, 'loss': 1 / step}) + '\\n'); m.flush(); time.sleep(0.05)\n"
        "time.sleep(120)\n"
    )
    other = await launch(workdir, [sys.executable, "-c", trainer, "--steps", "3000"], kind="train", name="other")
    selected = await launch(workdir, [sys.executable, "-c", SLEEPER], kind="train", name="selected")
    async with console(workdir, size=(160, 40)) as (app, pilot, _):
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.selected_run() == selected, what="the other run selected")
        # Its rows are never read by the console (it follows the selected run only): the status says how far it got.
        await until(pilot, lambda: "/3000 · ETA" in str(table.get_cell(other, "PHASE")), what="its step and ETA")
        assert app.followed == selected and other not in app.run_metrics


async def test_a_training_that_ended_short_of_its_steps_shows_where_it_stopped_and_no_eta(
    workdir: Path, nvml_state: Path
) -> None:
    # It ends once the test has seen it alive (a loaded machine may take seconds to open the console).
    seen_alive = workdir.parent / "seen-alive"
    trainer = (
        "import json, os, time\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for step in range(1, 101):\n"
        "        m.write(json.dumps({'step': step, 'loss': 1 / step}) + '\\n'); m.flush(); time.sleep(0.03)\n"
        f"while not os.path.exists({str(seen_alive)!r}):\n"
        "    time.sleep(0.1)\n"
        "raise SystemExit(3)\n"
    )
    short = await launch(workdir, [sys.executable, "-c", trainer, "--steps", "3000"], kind="train", name="short")
    async with console(workdir, size=(160, 40)) as (app, pilot, _):
        table = app.query_one(RunsTable)

        def phase() -> str:
            return str(table.get_cell(short, "PHASE")) if short in app.runs else ""

        await until(pilot, lambda: "/3000 · ETA" in phase(), what="its ETA while alive")
        seen_alive.touch()
        await until(pilot, lambda: app.runs[short]["state"] == "failed", what="its end", timeout=30)
        await until(pilot, lambda: "ETA" not in phase(), what="no ETA once it ended")
        assert "step 100/3000" in phase()
