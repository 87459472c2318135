"""The terminal console as a user drives it (Textual's pilot), against a real local agent and real runs."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from backends.host import procinfo
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.chart import ChartsPanel
from console.tui.dialogs import ConfirmScreen, HelpScreen, RelaunchScreen, TextScreen
from console.tui.gpu_panel import GpuPanel
from console.tui.log import TailLog
from console.tui.panels import RunDetail, RunsTable
from tests.conftest import Notes, free_port, until
from tests.fake_nvml import gpu, write_state

SLEEPER = "import time\nprint('serving', flush=True)\ntime.sleep(120)"
TRAINER = (
    "import json, os, time\n"
    "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
    "    for step in range(1, 41):\n"
    "        m.write(json.dumps({'step': step, 'loss': 10 / step, 'acc_0': step / 40}) + '\\n'); m.flush()\n"
    "print('trained', flush=True)\n"
    "time.sleep(120)\n"
)


async def launch(workdir: Path, argv: list[str], kind: str = "command", name: str = "job") -> str:
    async with AgentClient(LocalTransport(workdir)) as client:
        result = await client.launch(kind, argv, name=name)
    return result["run"]


@contextlib.asynccontextmanager
async def console_on(
    transport: LocalTransport, run_id: str, readonly: bool = False
) -> AsyncIterator[tuple[ConsoleApp, Pilot[None]]]:
    """The console open at 160 x 50 with `run_id` shown and selected; quit with q at the end."""
    app = ConsoleApp(Fleet.one(transport), readonly=readonly)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        yield app, pilot
        await pilot.press("q")


def state_of(workdir: Path, run_id: str) -> str:
    from backends.runs.store import RunStore

    return RunStore(workdir).get(run_id).state()


async def test_runs_gpus_details_log_and_curves_appear(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", TRAINER], kind="train", name="trainer")
    pid = procinfo.ProcIdentity.from_json(json.loads((workdir / "runs" / run_id / "proc.json").read_text())["child"])
    assert pid is not None
    write_state(nvml_state, [gpu(util=87, processes=[(pid.pid, 5000)])])
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 1, what="the run's row")
        assert table.selected_run() == run_id
        gpus = str(app.query_one(GpuPanel).render())
        assert "H200" in gpus and "87%" in gpus and f"run {run_id}" in gpus
        await until(pilot, lambda: str(table.get_row(run_id)[-1]) == "0:87%", what="the run's GPU")
        assert "trainer" in str(app.query_one(RunDetail).render())
        loss, acc = app.query_one(ChartsPanel).charts
        await until(pilot, lambda: "loss 0.25" in loss.text().plain, what="the loss curve to step 40")
        assert (loss.spec, acc.spec) == (("loss", "val_loss"), ("acc_*",))
        assert "acc_0 1" in acc.text().plain
        log = app.query_one(TailLog)
        await until(pilot, lambda: any("trained" in line.text for line in log.lines), what="the log")
        await pilot.press("q")


async def test_a_run_that_changes_state_says_so_wherever_the_cursor_is(workdir: Path, nvml_state: Path) -> None:
    done = await launch(workdir, [sys.executable, "-c", "print('done')"], name="earlier")
    notes = Notes()

    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50), message_hook=notes) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 1 and app.runs[done]["state"] == "exited", what="the runs")
        script = "import sys, time\ntime.sleep(3)\nsys.exit(3)"
        failing = await launch(workdir, [sys.executable, "-c", script], name="doomed")
        await until(pilot, lambda: app.states is not None and app.states.get(failing) == "running", what="running")
        table.move_cursor(row=0)  # looking at another run
        await until(pilot, lambda: bool(notes), what="the flash")
        await pilot.press("q")
    [note] = notes  # the run that had ended before the console opened is not news
    assert note.severity == "error" and "doomed" in note.message and "running → failed" in note.message


async def test_kill_asks_first_with_cancel_focused_and_kills_only_on_yes(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SLEEPER])
    async with console_on(LocalTransport(workdir), run_id) as (app, pilot):
        await pilot.press("k")
        # The dialog takes its focus once mounted, a frame after it is the screen.
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.focused, what="the confirmation")
        assert app.focused is not None and app.focused.id == "cancel"
        await pilot.press("enter")  # Enter on the focused Cancel: nothing happens
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="the dialog to close")
        await pilot.pause(0.5)
        assert state_of(workdir, run_id) == "running"
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: state_of(workdir, run_id) == "killed", what="the run to be killed")


async def test_relaunch_with_a_preset_flag_replaces_the_run(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SLEEPER, "--model-path", "m"], name="srv")
    async with console_on(LocalTransport(workdir), run_id) as (app, pilot):
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen), what="the relaunch dialog")
        await pilot.click("Button.preset")  # the first preset: --disable-cuda-graph
        await pilot.press("enter")
        confirm = await until(
            pilot, lambda: app.screen if isinstance(app.screen, ConfirmScreen) else None, what="the preview"
        )
        assert "--model-path m --disable-cuda-graph" in confirm.details  # the new command line, before anything stops
        assert state_of(workdir, run_id) == "running"
        await pilot.press("y")
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 2, what="the relaunched run")
        child = next(r for r in app.runs.values() if r["id"] != run_id)
        assert child["argv"][-1] == "--disable-cuda-graph" and child["parent"] == run_id
        await until(pilot, lambda: state_of(workdir, run_id) == "killed", what="the parent to be stopped")


async def test_read_only_offers_no_action(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SLEEPER])
    async with console_on(LocalTransport(workdir), run_id, readonly=True) as (app, pilot):
        for key in ("k", "r", "f"):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert not isinstance(app.screen, ConfirmScreen | RelaunchScreen)
        assert state_of(workdir, run_id) == "running"


async def test_a_lost_agent_shows_a_banner_and_the_console_recovers(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SLEEPER])
    transport = LocalTransport(workdir)
    async with console_on(transport, run_id) as (app, pilot):
        assert transport._proc is not None
        transport._proc.kill()  # the agent dies as a dropped link would end it
        banner = app.query_one("#link", Static)

        def text() -> str:
            return str(banner.content) if banner.display else ""

        await until(pilot, lambda: "link restored after" in text() and "it was lost" in text(), what="the banner")
        await until(pilot, lambda: not banner.display, timeout=30, what="the banner to go")
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run again")


@pytest.mark.parametrize("theme", ["eagle3-night", "eagle3-day"])
async def test_each_theme_renders_the_console(workdir: Path, nvml_state: Path, theme: str) -> None:
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await pilot.pause(0.5)
        assert app.current_theme.name == theme
        await pilot.press("t")
        assert app.theme != theme
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.press("question_mark")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help to close")
        await pilot.press("q")


def test_without_a_terminal_the_console_asks_for_a_command(workdir: Path) -> None:
    import subprocess

    from tests.conftest import REPO

    done = subprocess.run(
        [sys.executable, "-m", "console", "--workdir", str(workdir), "local"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.decode() == (
        "eagle3-console: the console needs a terminal; give a COMMAND (e.g. 'status') for scripts\n"
    )


async def test_s_shows_every_process_stack_of_the_selected_run(workdir: Path, nvml_state: Path) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", SLEEPER])
    async with console_on(LocalTransport(workdir), run_id) as (app, pilot):
        await pilot.press("s")
        screen = await until(pilot, lambda: app.screen if isinstance(app.screen, TextScreen) else None, what="stacks")
        # py-spy's view: the one thread idle, in the script's line 3 (the sleep).
        assert "=== pid " in screen.text and "(idle)" in screen.text and "<module> (<string>:3)" in screen.text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, TextScreen), what="the dump to close")


async def test_a_progress_bar_being_redrawn_shows_under_the_log(workdir: Path, nvml_state: Path) -> None:
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", "1", "--hang-in", "load-weights"]
    run_id = await launch(workdir, argv, kind="serve")
    async with console_on(LocalTransport(workdir), run_id) as (app, pilot):
        progress = app.query_one("#progress", Static)
        await until(pilot, lambda: "Completed | 4/8" in str(progress.content), what="the progress bar")
        log = app.query_one(TailLog)
        await until(pilot, lambda: any("Load weight begin" in line.text for line in log.lines), what="the log")


async def test_the_command_palette_finds_a_run_by_name(workdir: Path, nvml_state: Path) -> None:
    first = await launch(workdir, [sys.executable, "-c", SLEEPER], name="extract-wiki")
    await launch(workdir, [sys.executable, "-c", SLEEPER], name="serve-draft")
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 50)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 2, what="both runs")
        assert table.selected_run() != first
        await pilot.press("ctrl+p")
        await pilot.press(*"wiki")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await until(pilot, lambda: table.selected_run() == first, what="the run picked in the palette")
        await pilot.press("q")


async def test_a_servers_curves_are_its_accept_length_and_throughput(workdir: Path, nvml_state: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(port), "--decode-lines", "8"]
    async with AgentClient(LocalTransport(workdir)) as client:
        launched = await client.launch("serve", argv, health_url=f"http://127.0.0.1:{port}/health")
    async with console_on(LocalTransport(workdir), launched["run"]) as (app, pilot):
        accept, throughput = app.query_one(ChartsPanel).charts
        # The run's store is made by its follow, a moment after the run is selected.
        followed = await until(pilot, lambda: app.run_metrics.get(launched["run"]), what="the run's follow")
        store = followed.store
        await until(pilot, lambda: len(store.series("accept_len") or []) == 8, timeout=30, what="eight decode rows")
        assert (accept.spec, throughput.spec) == (("accept_len", "ttft_p50"), ("gen_throughput",))
        await until(pilot, lambda: "accept_len 3.2" in accept.text().plain, what="the last accept length")
        assert "gen_throughput 470" in throughput.text().plain and store.x_label == "time"
        await until(pilot, lambda: app.runs[launched["run"]]["state"] == "ready", what="ready")
