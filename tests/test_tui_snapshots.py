"""What the console looks like, frozen as SVG snapshots: each scene in each theme, at 100x30 and at 160x48.

The scenes: a training whose loss spiked and went NaN once (its loss and val_loss chart, acc_0..acc_3 beside it);
a server relaunched with --disable-cuda-graph, with its startup timeline and its decode figures; the launch it
replaced, which failed in CUDA graph capture, explained by its diagnosis and its timeline up to the failure.

The agent is real and reads a real run store; the store is written here with fixed run ids, times and contents
(finished runs only, so that no pid or clock moves what is shown), and the GPUs come from the NVML double.
Each snapshot waits for what it should show (the runs, the run's log, timeline and charts), never for a time.
A change that alters what a person sees fails here; look at the report, then accept it with `--snapshot-update`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from textual.pilot import Pilot

from backends.fileio import append_jsonl, atomic_write_json
from backends.protocol import Diagnosis, MetricRow
from backends.runs.store import EVENTS, EXIT, METRICS, OUTPUT, SPEC, WATCH, RunSpec
from backends.runs.watch import Watch
from console.fleet.hosts import Fleet
from console.link.local import LocalTransport
from console.tui import gpu_panel
from console.tui.app import ConsoleApp
from console.tui.chart import ChartsPanel, MetricChart
from console.tui.log import TailLog
from console.tui.panels import RunDetail, RunsTable
from console.tui.plot import NONFINITE_GLYPH
from tests.conftest import until
from themes import PALETTES

SIZES = [(100, 30), (160, 48)]
THEMES = [f"eagle3-{palette.name}" for palette in PALETTES]
T0 = 1795935600.0  # 2026-11-29 07:00:00 UTC
RUN_S = 600.0  # every run ends this long after its launch
EXTRACT, TRAIN = "20261129-070000-000-a1b2", "20261129-071500-000-e5f6"
FAILED, SERVED = "20261129-073000-000-c3d4", "20261129-074500-000-b7a8"
MODEL = ["--model-path", "/models/llama-3.1-8b", "--speculative-algorithm", "EAGLE3", "--port", "30000"]
SERVE = ["python", "-m", "sglang.launch_server", *MODEL]
CUDA_GRAPH = Diagnosis(
    code="cuda-graph-capture",
    meaning="CUDA graph capture failed while the server warmed up",
    hint="relaunch with --disable-cuda-graph, or a smaller --cuda-graph-max-bs",
    line="Exception: Capture cuda graph failed: CUDA error: out of memory",
)
# The training: a loss that falls, spikes long after the warm-up (the robust range keeps it) and is NaN once.
STEPS, SPIKE_STEP, NAN_STEP, SPIKE = 400, 250, 320, 30.0
# The startup phases of each server, in seconds after its launch, as SGLang's output names them.
FAILED_PHASES = [("init", 1.9), ("load-weights", 5.9), ("memory-pool", 45.2), ("cuda-graph", 51.7)]
SERVED_PHASES = [("init", 2.1), ("load-weights", 6.4), ("memory-pool", 47.9), ("http", 55.2), ("ready", 58.3)]
FAILED_AT = 63.5


def write_run(
    workdir: Path,
    run_id: str,
    spec: RunSpec,
    output: str,
    events: list[dict[str, Any]],
    metrics: list[MetricRow] | None = None,
    watch: Watch | None = None,
) -> None:
    """A finished run as its supervisor leaves it; exit.json says what the `exit` event does."""
    run = workdir / "runs" / run_id
    run.mkdir(parents=True)
    atomic_write_json(run / SPEC, spec.to_json())
    (run / OUTPUT).write_text(output)
    for row in events:
        append_jsonl(run / EVENTS, row)
    for metric in metrics or []:
        append_jsonl(run / METRICS, metric)
    atomic_write_json(run / WATCH, (watch or Watch(state="exited")).to_json())
    end = next(row for row in events if row["type"] == "exit")
    atomic_write_json(run / EXIT, {"code": end["code"], "signal": end["signal"], "error": None, "ended_at": end["t"]})


def event(at: float, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": at, "type": kind, **fields}


def ending(at: float, state: str, code: int | None = 0, signal: str | None = None) -> list[dict[str, Any]]:
    return [event(at, "exit", code=code, signal=signal), event(at, "state", state=state)]


def startup(launched: float, phases: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """The launch, the health poll refused until the server listens, and each phase."""
    rows = [event(launched, "launch"), event(launched + 2.0, "health", status="refused")]
    return rows + [event(launched + after, "phase", phase=name, line="") for name, after in phases]


def training_rows() -> list[MetricRow]:
    """A train row every 10 steps (loss, acc_0..acc_3) and an eval row every 100 (val_loss)."""
    rows: list[MetricRow] = []
    for step in range(10, STEPS + 10, 10):
        loss = SPIKE if step == SPIKE_STEP else math.nan if step == NAN_STEP else 9.0 * math.exp(-step / 80) + 1.2
        accs = {f"acc_{k}": 0.8 * (1 - math.exp(-step / 90)) * 0.85**k for k in range(4)}
        rows.append({"step": step, "loss": loss, **accs})
        if step % 100 == 0:
            rows.append({"step": step, "val_loss": 9.5 * math.exp(-step / 80) + 1.35})
    return rows


def write_training(workdir: Path) -> None:
    rows = [row for row in training_rows() if "loss" in row]
    log = "".join(f"step {r['step']}/{STEPS} | loss {r['loss']:.4f} | acc {r['acc_0']:.3f}\n" for r in rows)
    argv = ["python", "-m", "backends.train", "--data", "features", "--target", "/models/llama-3.1-8b"]
    spec = RunSpec(kind="train", argv=[*argv, "--steps", str(STEPS)], name="train", created_at=T0 + 900)
    events = [event(spec.created_at, "launch"), *ending(spec.created_at + RUN_S, "exited")]
    write_run(workdir, TRAIN, spec, log + f"saved out/final (step {STEPS})\n", events, training_rows())


def write_failed_launch(workdir: Path) -> None:
    """A serve launch that ran out of memory capturing CUDA graphs, 63.5 s after its launch."""
    spec = RunSpec(kind="serve", argv=SERVE, name="serve", created_at=T0 + 1800)
    at = spec.created_at + FAILED_AT
    events = [
        *startup(spec.created_at, FAILED_PHASES),
        event(at - 0.1, "diagnosis", **CUDA_GRAPH),
        *ending(at, "failed", code=1),
    ]
    output = (
        "Init torch distributed begin.\nLoad weight begin. avail mem=139.20 GB\n"
        "Load weight end. type=LlamaForCausalLM, avail mem=120.31 GB\nCapture cuda graph begin.\n"
        + CUDA_GRAPH["line"]
        + "\n"
    )
    watch = Watch(state="failed", phase="cuda-graph", health="refused", diagnoses=[CUDA_GRAPH])
    write_run(workdir, FAILED, spec, output, events, watch=watch)


def write_served(workdir: Path) -> None:
    """Its relaunch without CUDA graphs: ready 58.3 s after its launch, decoding, then killed by a person."""
    spec = RunSpec(
        kind="serve", argv=[*SERVE, "--disable-cuda-graph"], name="serve", created_at=T0 + 2700, parent=FAILED
    )
    launched, end = spec.created_at, spec.created_at + RUN_S
    events = [
        *startup(launched, SERVED_PHASES),
        event(launched + 59.0, "health", status="ok"),
        event(launched + 59.0, "state", state="ready"),
        event(end - 0.5, "signal", signal="TERM", pids=[4242], by="kill"),
        *ending(end, "killed", code=None, signal="TERM"),
    ]
    decode = [
        {"t": launched + s, "accept_len": 3.1 + 0.4 * math.sin(s / 40), "gen_throughput": 420.0 + s / 4}
        for s in range(70, int(RUN_S), 10)
    ]
    lines = [
        f"Decode batch, #running-req: 8, accept len: {r['accept_len']:.2f}, gen throughput (token/s): "
        f"{r['gen_throughput']:.2f}, #queue-req: 0\n"
        for r in decode
    ]
    output = "Load weight end. type=LlamaForCausalLM\nThe server is fired up and ready to roll!\n" + "".join(lines)
    write_run(workdir, SERVED, spec, output, events, decode, Watch(state="killed", phase="ready", health="ok"))


def write_store(workdir: Path) -> None:
    """An extraction, the training, the failed launch and its relaunch (newest last: the cursor starts there)."""
    argv = ["python", "-m", "backends.extract", "--data", "chats.jsonl"]
    spec = RunSpec(kind="extract", argv=argv, name="extract", created_at=T0)
    events = [event(T0, "launch"), *ending(T0 + RUN_S, "exited")]
    write_run(workdir, EXTRACT, spec, "done: 4,096 samples, 2,211,840 tokens in 8 shards\n", events)
    write_training(workdir)
    write_failed_launch(workdir)
    write_served(workdir)


def charts(app: ConsoleApp) -> list[MetricChart]:
    return app.query_one(ChartsPanel).charts


def drawn(app: ConsoleApp, first: str, second: str) -> bool:
    """Each chart shown has its legend (`first` in the first chart's, `second` in the second's: a small
    terminal shows the first alone) and no redraw pending, so that the screen shows what the chart holds."""
    shown = [(chart, legend) for chart, legend in zip(charts(app), (first, second), strict=True) if chart.display]
    # A chart redraws at its own pace (`_timer`: a redraw pending); what it holds is on the screen once none is.
    return bool(shown) and all(legend in c.text().plain and c._timer is None for c, legend in shown)


def detail(app: ConsoleApp) -> str:
    return str(app.query_one(RunDetail).render())


async def select(pilot: Pilot[Any], app: ConsoleApp, run_id: str) -> None:
    """The runs listed, then `run_id` selected in one move (the runs between get no follower), its log read."""
    table = app.query_one(RunsTable)
    await until(pilot, lambda: table.row_count == 4, what="the runs")
    table.move_cursor(row=table.get_row_index(run_id))
    log = app.query_one("#log", TailLog)
    # Its whole log, down to the line that tells the run ended (its follower has read everything there is).
    ended = f"— run {run_id} {app.runs[run_id]['state']} —"
    await until(pilot, lambda: app.followed == run_id and log.lines and ended in log.lines[-1].text, what="the end")


async def training(pilot: Pilot[Any], app: ConsoleApp) -> None:
    await select(pilot, app, TRAIN)
    metrics = await until(pilot, lambda: app.run_metrics.get(TRAIN), what="the run's store")
    await until(pilot, lambda: len(metrics.store.series("val_loss") or []) == STEPS // 100, what="the last eval")
    assert len(metrics.store.series("loss") or []) == STEPS // 10
    table = app.query_one(RunsTable)
    await until(pilot, lambda: str(table.get_cell(TRAIN, "PHASE")) != "-", what="its steps in the table")
    await until(pilot, lambda: drawn(app, "val_loss", "acc_0 0."), what="the charts")
    loss = charts(app)[0].text().plain.split("\n")
    assert f"{NONFINITE_GLYPH}1" in loss[1] and NONFINITE_GLYPH in loss[-2]  # the NaN, counted and marked
    assert loss[2].lstrip().startswith(f"{SPIKE:.0f} ┤")  # the spike at its full height


async def served(pilot: Pilot[Any], app: ConsoleApp) -> None:
    await select(pilot, app, SERVED)
    await until(pilot, lambda: "ready in 58 s" in detail(app), what="the startup timeline")
    await until(pilot, lambda: "added --disable-cuda-graph" in detail(app), what="what the relaunch changed")
    await until(pilot, lambda: drawn(app, "accept_len 3.", "gen_throughput 5"), what="the charts")


async def failed_launch(pilot: Pilot[Any], app: ConsoleApp) -> None:
    await select(pilot, app, FAILED)
    await until(pilot, lambda: "ended before ready" in detail(app), what="the startup timeline")
    assert "cuda-graph-capture" in detail(app)
    await until(pilot, lambda: drawn(app, "accept_len", "gen_throughput"), what="the empty charts")


SCENES: dict[str, Callable[[Pilot[Any], ConsoleApp], Awaitable[None]]] = {
    "training": training,
    "served": served,
    "failed_launch": failed_launch,
}


@pytest.fixture
def console_app(workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch) -> ConsoleApp:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    # The GPU panel's history as if every poll came at one instant: its sparklines are one column, however
    # many polls came before the picture was taken.
    monkeypatch.setattr(gpu_panel, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    write_store(workdir)
    return ConsoleApp(Fleet.one(LocalTransport(workdir)))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("scene", SCENES)
def test_the_console(console_app: ConsoleApp, snap_compare: Any, scene: str, theme: str, size: tuple[int, int]) -> None:
    async def shown(pilot: Pilot[Any]) -> None:
        console_app.theme = theme
        await SCENES[scene](pilot, console_app)

    assert snap_compare(console_app, terminal_size=size, run_before=shown)
