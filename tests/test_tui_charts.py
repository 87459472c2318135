"""The console's charts as a user sees them (Textual's pilot, a real local agent, real runs writing metric rows):
every training point kept across evals, val_loss beside loss, a spike at its height, a NaN marked, the
picker, the log scale, a relaunch drawn over its parent's curve."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.chart import ChartPicker, ChartsPanel, MetricChart
from console.tui.panels import RunsTable
from console.tui.plot import NONFINITE_GLYPH
from tests.conftest import Notes, until

STEPS = 200
SPIKE_STEP, NAN_STEP = 150, 120
# Train rows every step, an eval row every 50 (val_loss and the plateau flag, up at the last one); a NaN
# loss at step 120 and a spike to 40 at step 150, long after the warm-up.
TRAINER = f"""
import json, math, os, sys, time
scale = 2.0 if '--scale=2' in sys.argv else 1.0
with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:
    for step in range(1, {STEPS + 1}):
        loss = scale * 5.0 / step ** 0.5
        if step == {SPIKE_STEP}:
            loss = 40.0
        row = {{'step': step, 'loss': float('nan') if step == {NAN_STEP} else loss, 'lr': 1e-4 * step,
               'acc_0': step / {STEPS}, 'acc_1': step / {2 * STEPS}}}
        m.write(json.dumps(row) + '\\n')
        if step % 50 == 0:
            evaluation = {{'step': step, 'val_loss': scale * 5.5 / step ** 0.5, 'plateau': step == {STEPS}}}
            m.write(json.dumps(evaluation) + '\\n')
    m.flush()
print('trained', flush=True)
time.sleep(120)
"""


async def launch(workdir: Path, argv: list[str]) -> str:
    async with AgentClient(LocalTransport(workdir)) as client:
        result = await client.launch("train", argv, name="trainer")
    return result["run"]


def plot_rows(chart: MetricChart) -> list[str]:
    """The chart's plot rows as drawn (title and legend above, the x axis and its labels below)."""
    return chart.text().plain.split("\n")[2:-2]


def y_labels(chart: MetricChart) -> list[str]:
    return [row.split("┤")[0].strip() for row in plot_rows(chart) if "┤" in row]


def dotted_columns(row: str) -> list[int]:
    """Where a plot row has braille dots, by column after the y axis."""
    plot = row.split("┤" if "┤" in row else "│", 1)[1]
    return [i for i, cell in enumerate(plot) if "\u2800" < cell <= "\u28ff"]


async def test_a_training_keeps_every_point_across_evals_with_its_spike_nan_and_plateau(
    workdir: Path, nvml_state: Path
) -> None:
    run_id = await launch(workdir, [sys.executable, "-c", TRAINER])
    notes = Notes()

    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 48), message_hook=notes) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).selected_run() == run_id, what="the run")
        loss, acc = app.query_one(ChartsPanel).charts
        store = (await until(pilot, lambda: app.run_metrics.get(run_id), what="the run's store")).store
        await until(pilot, lambda: len(store.series("val_loss") or []) == 4, what="the last eval row")
        # Eval rows came between train rows: the loss curve still holds every training step.
        assert [x for x, _ in store.series("loss").points()] == [float(s) for s in range(1, STEPS + 1)]
        legend = loss.text().plain.split("\n")[1]
        assert "loss" in legend and "val_loss" in legend and "plateau" in legend
        assert f"{NONFINITE_GLYPH}1" in legend  # the NaN, counted in the legend...
        axis = loss.text().plain.split("\n")[-2]
        assert NONFINITE_GLYPH in axis and "▲" in axis  # ... and marked at its step, beside the plateau flag
        # The spike keeps its full height: the top row of the plot is reached at its step only.
        assert y_labels(loss)[0] == "40"
        cols = len(plot_rows(loss)[0].split("┤", 1)[1])
        spike_column = round((SPIKE_STEP - 1) / (STEPS - 1) * cols)
        top = dotted_columns(plot_rows(loss)[0])
        assert top and all(abs(c - spike_column) <= 2 for c in top)  # the line up to it and down again
        assert "acc_0" in acc.text().plain and "acc_1" in acc.text().plain
        # The NaN loss is news, once.
        await until(pilot, lambda: any("loss is nan" in n.message for n in notes), what="the NaN notification")
        assert sum("loss is nan" in n.message for n in notes) == 1

        # The log scale changes the y labels to decades and says so in the title line.
        linear = y_labels(loss)
        await pilot.press("L")
        assert loss.log_scale and y_labels(loss) != linear and "10" in y_labels(loss)
        await pilot.press("L")
        assert y_labels(loss) == linear

        # The picker: the current chart shows any series the run has.
        await pilot.press("c")
        picker = await until(pilot, lambda: app.screen if isinstance(app.screen, ChartPicker) else None, what="picker")
        await pilot.press("l", "r", "enter")
        await until(pilot, lambda: not isinstance(app.screen, ChartPicker), what="the picker to close")
        assert picker.shown == [("lr",)] and loss.spec == ("lr",)
        assert loss.text().plain.split("\n")[0].lstrip("▸ ").startswith("lr")
        assert "lr 0.02" in loss.text().plain.split("\n")[1]
        await pilot.press("q")


async def test_a_relaunch_draws_its_parents_curve_under_its_own(workdir: Path, nvml_state: Path) -> None:
    parent = await launch(workdir, [sys.executable, "-c", TRAINER])
    async with AgentClient(LocalTransport(workdir)) as client:
        await until_rows(workdir, parent)
        child = (await client.relaunch(parent, set=["--scale=2"], grace=2.0))["run"]
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 2, what="both runs")
        app.select_run(child)
        loss = app.query_one(ChartsPanel).charts[0]
        await until(pilot, lambda: "loss (parent)" in loss.text().plain, what="the parent's curve")
        own, theirs = app.run_metrics[child].store.series("loss"), app.run_metrics[parent].store.series("loss")
        await until(pilot, lambda: own is not None and len(own) == STEPS, what="the child's rows")
        assert theirs is not None and len(theirs) == STEPS  # read whole, once

        def legend_order() -> list[str]:
            return [
                entry.split(" ")[0] + (" (parent)" if "(parent)" in entry else "")
                for entry in loss.text().plain.split("\n")[1].split("━ ")[1:]
            ]

        # Its own curves are named first: a legend cut at the panel's edge loses the parent's.
        await until(
            pilot,
            lambda: legend_order()[:3] == ["loss", "val_loss", "loss (parent)"],
            what="its own curves named first",
        )
        await pilot.press("q")


async def until_rows(workdir: Path, run_id: str) -> None:
    """Until the run has written its last eval row."""
    import asyncio

    metrics = workdir / "runs" / run_id / "metrics.jsonl"
    for _ in range(200):
        if metrics.exists() and metrics.read_text().count("val_loss") == 4:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the trainer wrote no eval rows")


async def test_a_command_runs_charts_show_what_it_writes_or_say_how_it_could(workdir: Path, nvml_state: Path) -> None:
    writer = (
        "import json, os, time\n"
        "time.sleep(1.5)\n"  # the console is looking by then: the charts name their series as rows arrive
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for step in range(1, 41):\n"
        "        m.write(json.dumps({'step': step, 'reward': step / 40, 'kl': 0.1}) + '\\n')\n"
        "time.sleep(120)\n"
    )
    async with AgentClient(LocalTransport(workdir)) as client:
        silent = (await client.launch("command", [sys.executable, "-c", "import time; time.sleep(120)"]))["run"]
        writing = (await client.launch("command", [sys.executable, "-c", writer], name="rl"))["run"]
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2, what="both runs")
        charts = app.query_one(ChartsPanel).charts
        app.select_run(silent)
        await until(pilot, lambda: "no metric rows" in charts[0].text().plain, what="what the silent one could do")
        assert "loss" not in charts[0].text().plain  # no training's charts for a command
        app.select_run(writing)
        await until(pilot, lambda: [c.spec for c in charts] == [("reward",), ("kl",)], what="its own series")
        await until(pilot, lambda: any(dotted_columns(row) for row in plot_rows(charts[0])), what="reward drawn")
        await pilot.press("q")


async def test_a_relaunch_with_no_rows_yet_reads_its_parents_time_axis_as_time(workdir: Path, nvml_state: Path) -> None:
    """A relaunched server before its first row: the axis under its parent's curve counts time from the start,
    not seconds since 1970 (which read `1.796317305G`)."""
    writer = (
        "import json, os, sys, time\n"
        "if '--again' in sys.argv:\n"
        "    time.sleep(120)\n"
        "with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:\n"
        "    for i in range(30):\n"
        "        m.write(json.dumps({'t': 1.8e9 + 10 * i, 'accept_len': 2 + i / 30}) + '\\n')\n"
        "time.sleep(120)\n"
    )
    async with AgentClient(LocalTransport(workdir)) as client:
        parent = (await client.launch("serve", [sys.executable, "-c", writer], name="srv"))["run"]
        rows = workdir / "runs" / parent / "metrics.jsonl"
        for _ in range(200):
            if rows.exists() and rows.read_text().count("\n") == 30:
                break
            await asyncio.sleep(0.1)
        child = (await client.relaunch(parent, set=["--again"], grace=2.0))["run"]
    app = ConsoleApp(Fleet.one(LocalTransport(workdir)))
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2, what="both runs")
        app.select_run(child)
        chart = app.query_one(ChartsPanel).charts[0]
        await until(pilot, lambda: "accept_len (parent)" in chart.text().plain, what="the parent's curve")
        axis = chart.text().plain.split("\n")[-1]
        assert axis.split()[0] == "time" and "G" not in axis, axis
        assert "4m" in axis, axis  # 290 s of the parent's rows, counted from its first
        await pilot.press("q")
