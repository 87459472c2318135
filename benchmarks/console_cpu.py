"""Console CPU: what the console's own process spends while it follows a training run that writes `--rate` metric
rows a second on top of `--history` rows already written.

    .venv/bin/python -m benchmarks.console_cpu [--history 100000] [--rate 10] [--seconds 30] [--size 160x48]

A real local agent and a real `train` run: a Python writer puts the history in metrics.jsonl (rows like the
trainer's: loss, lr, grad_norm, tokens_per_s, acc_0..6, ploss_0..6, and an eval row every 50 steps), then a row
every 1/rate s, each with its log line as the trainer prints (`--no-log-lines`: none). The console runs under
Textual's headless pilot (it composes and renders every frame as in a terminal, writing nowhere) in this
process: the CPU measured is this process's (time.process_time) over `--seconds` once the history is in the
charts; the agent's, a separate process, is shown beside it. Also: how long the history takes to be on screen
(its last step drawn, from the agent's coarse first look; target 1 s) and whole (the full view, every series'
extremes, swapped in), the longest the UI thread went without running a timer meanwhile (a freeze), how many
chart redraws the window took, and what plotext would cost drawing the same charts (the `bench` extra installs
it). Target: the console at most 5% of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from backends.runs.store import METRICS, RunStore
from benchmarks._common import cpu_seconds, print_table
from benchmarks.chart_redraw import plotext_redraw
from console.fleet.hosts import Fleet
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.chart import ChartsPanel, MetricChart
from console.tui.metric_store import Series

CPU_TARGET_PERCENT = 5.0
WRITER = """
import json, math, os, sys, time
history, rate, logs = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == 'logs'

def row(step):
    r = {'step': step, 'loss': 0.6 + 8 * math.exp(-step / 5000) + 0.01 * math.sin(step), 'lr': 1e-4,
         'grad_norm': 1 + math.cos(step), 'tokens_per_s': 9000.0 + step % 100}
    r.update({f'acc_{k}': 0.8 - 0.05 * k - 0.5 * math.exp(-step / 8000) for k in range(7)})
    r.update({f'ploss_{k}': 0.5 + 0.1 * k + 3 * math.exp(-step / 6000) for k in range(7)})
    return json.dumps(r) + '\\n'

def evaluation(step):
    return json.dumps({'step': step, 'val_loss': 0.7 + 8 * math.exp(-step / 5000), 'plateau': False}) + '\\n'

with open(os.environ['EAGLE3_METRICS_FILE'], 'a') as m:
    m.write(''.join(row(s) + (evaluation(s) if s % 50 == 0 else '') for s in range(1, history + 1)))
    m.flush()
    step = history
    while True:
        step += 1
        m.write(row(step) + (evaluation(step) if step % 50 == 0 else ''))
        m.flush()
        if logs:
            loss = 0.6 + 8 * math.exp(-step / 5000)
            print(f'step {step} | loss {loss:.4f} | acc_0 0.77 acc_1 0.70 acc_2 0.64', flush=True)
        time.sleep(1 / rate)
"""


async def measure(
    workdir: Path, history: int, rate: float, seconds: float, size: tuple[int, int], logs: bool
) -> list[list[str]]:
    async with AgentClient(LocalTransport(workdir)) as client:
        argv = [sys.executable, "-c", WRITER, str(history), str(rate), "logs" if logs else "-"]
        run_id = (await client.launch("train", argv))["run"]
    written = RunStore(workdir).get(run_id).file(METRICS)
    # the history (with its eval rows) is written before the console opens: its load is timed alone
    while file_lines(written) < history + history // 50:
        await asyncio.sleep(0.1)
    redraws = 0
    shown_at: float | None = None
    draw = MetricChart.draw

    def counted(self: MetricChart, width: int, height: int) -> object:
        nonlocal redraws, shown_at
        redraws += 1
        if shown_at is None and reached(app, run_id, history):  # the first drawing with the history's end
            shown_at = time.monotonic()
        return draw(self, width, height)

    MetricChart.draw = counted  # type: ignore[method-assign,assignment]
    transport = LocalTransport(workdir)
    app = ConsoleApp(Fleet.one(transport))
    longest_gap, last_tick = 0.0, time.monotonic()

    def tick() -> None:
        nonlocal longest_gap, last_tick
        now = time.monotonic()
        longest_gap, last_tick = max(longest_gap, now - last_tick), now

    try:
        async with app.run_test(size=size) as pilot:
            start = time.monotonic()
            ticker = app.set_interval(0.01, tick)
            while shown_at is None:  # the coarse first look, or the rows streamed whole, drawn
                await pilot.pause(0.01)
            shown_s = shown_at - start
            while app.run_metrics[run_id].since_coarse is not None:  # the full view swapped in
                await pilot.pause(0.01)
            loaded_s, freeze_ms = time.monotonic() - start, longest_gap * 1000
            ticker.stop()  # its 100 wake-ups a second are the benchmark's, not the console's
            await pilot.pause(2.0)  # the redraws of the load settle
            assert transport._proc is not None
            agent = transport._proc.pid
            cpu0, agent0, wall0, redraws0 = time.process_time(), cpu_seconds(agent), time.monotonic(), redraws
            points0 = app.run_metrics[run_id].store.rows
            await pilot.pause(seconds)
            wall = time.monotonic() - wall0
            cpu = (time.process_time() - cpu0) / wall * 100
            agent_cpu = (cpu_seconds(agent) - agent0) / wall * 100
            arrived = app.run_metrics[run_id].store.rows - points0
            window_redraws = redraws - redraws0
            store = app.run_metrics[run_id].store
            shown = [
                ([s for name in chart.names() if (s := store.series(name)) is not None], chart.size.width)
                for chart in app.query_one(ChartsPanel).charts
            ]
            await pilot.press("q")
    finally:
        MetricChart.draw = draw  # type: ignore[method-assign]
        await client_kill(workdir, run_id)  # a run outlives the console: it goes with the benchmark, however it ends
    plotext = plotext_cost(shown, rate)
    return [
        ["history on screen (its last step drawn), s", f"{shown_s:.2f}", "1", f"{shown_s:.2f}"],
        ["history whole (every series' extremes in), s", f"{loaded_s:.2f}", "-", "-"],
        ["longest UI freeze while loading, ms", f"{freeze_ms:.0f}", "-", "-"],
        ["rows arrived per second", f"{arrived / wall:.1f}", "-", "-"],
        ["chart redraws per second (2 charts)", f"{window_redraws / wall:.1f}", "-", "-"],
        ["console CPU, % of a core", f"{cpu:.1f}", f"{CPU_TARGET_PERCENT:.0f}", f"{cpu / CPU_TARGET_PERCENT:.2f}"],
        ["agent CPU (its own process), % of a core", f"{agent_cpu:.1f}", "-", "-"],
        *plotext,
    ]


def file_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def reached(app: ConsoleApp, run_id: str, step: int) -> bool:
    """Whether the run's store holds its loss at `step`: the history's end is in the charts."""
    metrics = app.run_metrics.get(run_id)
    loss = metrics.store.series("loss") if metrics is not None else None
    last = loss.last if loss is not None else None
    return last is not None and last[0] >= step


def plotext_cost(charts: list[tuple[list[Series], int]], rate: float) -> list[list[str]]:
    """plotext drawing the same charts (the same points, the same widths) once per arriving row, as the console
    did before it coalesced: one redraw's time, and the share of a core that takes at `rate` rows a second."""
    costs = [plotext_redraw(series, width) for series, width in charts]
    if any(cost is None for cost in costs):
        return [["plotext (not installed: pip install -e '.[bench]')", "-", "-", "-"]]
    once = sum(cost for cost in costs if cost is not None)
    return [
        ["plotext: one redraw of the same charts, ms", f"{once * 1000:.0f}", "-", "-"],
        ["plotext redrawing at every row, % of a core", f"{min(once * rate, 1.0) * 100:.0f}", "-", "-"],
    ]


async def client_kill(workdir: Path, run_id: str) -> None:
    async with AgentClient(LocalTransport(workdir)) as client:
        await client.kill(run_id, signal="KILL", grace=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--no-log-lines", action="store_true", help="rows only: the run prints nothing")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(
            measure(Path(tmp), args.history, args.rate, args.seconds, (width, height), not args.no_log_lines)
        )
    lines = "no log lines" if args.no_log_lines else "a log line per row"
    print(
        f"console CPU: following a train run at {args.rate:g} rows/s ({lines}) over {args.history:,} rows of "
        f"history, {args.seconds:g} s at {width}x{height}, on {os.cpu_count()} cores"
    )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
