"""What the console looks like, frozen as SVG snapshots: each theme at a fixed size.

The agent is real and reads a real run store; the store is written here with
fixed run ids, times and contents (finished runs, so no pid or clock moves),
and the GPUs come from the NVML double. A change that alters what a person sees
fails here; look at the report, then accept it with `--snapshot-update`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import RichLog

from backends.protocol import Diagnosis
from backends.runstore import EXIT, METRICS, OUTPUT, SPEC, WATCH, RunSpec, append_jsonl, atomic_write_json
from backends.watch import Watch
from console.transport import LocalTransport
from console.tui.app import ConsoleApp
from console.tui.chart import LineChart
from console.tui.panels import RunsTable
from tests.conftest import until

SIZE = (150, 44)
T0 = 1795935600.0  # 2026-11-29 07:00:00 UTC
EXTRACT, SERVE, TRAIN = "20261129-070000-000-a1b2", "20261129-071500-000-c3d4", "20261129-073000-000-e5f6"
CUDA_GRAPH = Diagnosis(
    code="cuda-graph-capture",
    meaning="CUDA graph capture failed while the server warmed up",
    hint="relaunch with --disable-cuda-graph, or a smaller --cuda-graph-max-bs",
    line="Exception: Capture cuda graph failed: CUDA error: out of memory",
)


def write_run(
    workdir: Path,
    run_id: str,
    spec: RunSpec,
    exit_code: int,
    output: str,
    metrics: list[dict[str, Any]] | None = None,
    watch: Watch | None = None,
) -> None:
    run = workdir / "runs" / run_id
    run.mkdir(parents=True)
    atomic_write_json(run / SPEC, spec.to_json())
    atomic_write_json(run / EXIT, {"code": exit_code, "signal": None, "error": None, "ended_at": spec.created_at + 600})
    (run / OUTPUT).write_text(output)
    for row in metrics or []:
        append_jsonl(run / METRICS, row)
    atomic_write_json(run / WATCH, (watch or Watch(state="running")).to_json())


def write_store(workdir: Path) -> None:
    """An extraction, a serve launch that failed in CUDA graph capture, and a training that converged."""
    write_run(
        workdir,
        EXTRACT,
        RunSpec(kind="extract", argv=["python", "-m", "backends.extract", "--data", "chats.jsonl"], name="extract"),
        0,
        "done: 4,096 samples, 2,211,840 tokens in 8 shards\n",
    )
    serve = ["python", "-m", "sglang.launch_server", "--model-path", "/models/llama-3.1-8b", "--port", "30000"]
    write_run(
        workdir,
        SERVE,
        RunSpec(kind="serve", argv=serve, name="serve", created_at=T0 + 900),
        1,
        "Load weight end. type=LlamaForCausalLM, avail mem=120.31 GB\nCapture cuda graph begin.\n"
        + CUDA_GRAPH["line"]
        + "\n",
        watch=Watch(state="running", phase="cuda-graph", health="refused", diagnoses=[CUDA_GRAPH]),
    )
    rows = [
        {"step": s, "loss": 9.0 * math.exp(-s / 120) + 1.2, "acc_0": 0.75 * (1 - math.exp(-s / 90))}
        for s in range(10, 410, 10)
    ]
    log = "".join(f"step {r['step']}/400 | loss {r['loss']:.4f} | acc {r['acc_0']:.3f}\n" for r in rows)
    train = ["python", "-m", "backends.train", "--data", "features", "--target", "/models/llama-3.1-8b"]
    write_run(
        workdir,
        TRAIN,
        RunSpec(kind="train", argv=train, name="train", created_at=T0 + 1800),
        0,
        log + "saved out/final (step 400)\n",
        metrics=rows,
    )


def settled(app: ConsoleApp, run_id: str, curves: bool) -> Callable[[Pilot[Any]], Any]:
    """Before the snapshot: the runs listed, `run_id` selected, its log (and curves) drawn."""

    async def wait(pilot: Pilot[Any]) -> None:
        table = app.query_one(RunsTable)
        await until(pilot, lambda: table.row_count == 3, what="the runs")
        while table.selected_run() != run_id:
            await pilot.press("up")
        log = app.query_one(RichLog)
        await until(pilot, lambda: app.followed == run_id and len(log.lines) > 0, what="the log")
        if curves:
            charts = [app.query_one("#curve-a", LineChart), app.query_one("#curve-b", LineChart)]
            await until(pilot, lambda: all(len(c.values) == 40 for c in charts), what="the curves")
        await pilot.pause()

    return wait


@pytest.fixture
def console_app(workdir: Path, nvml_state: Path, monkeypatch: pytest.MonkeyPatch) -> ConsoleApp:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    write_store(workdir)
    return ConsoleApp(LocalTransport(workdir))


def test_night_theme_a_converged_training_with_its_curves(console_app: ConsoleApp, snap_compare: Any) -> None:
    assert snap_compare(console_app, terminal_size=SIZE, run_before=settled(console_app, TRAIN, curves=True))


def test_day_theme_a_failed_launch_explained(console_app: ConsoleApp, snap_compare: Any) -> None:
    wait = settled(console_app, SERVE, curves=False)

    async def day(pilot: Pilot[Any]) -> None:
        console_app.theme = "eagle3-day"
        await wait(pilot)

    assert snap_compare(console_app, terminal_size=SIZE, run_before=day)
