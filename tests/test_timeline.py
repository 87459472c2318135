"""A serve run's startup timeline and health history, as the console reads them from the run's events.

The last test reads the events the real watch wrote for the SGLang stand-in (its startup lines are SGLang
0.5.23's, replayed; see tests/sglang_standin.py), launched through the real agent.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from backends.fileio import read_jsonl
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.tui.timeline import (
    compare,
    comparison_steps,
    health_strip,
    seconds,
    steps,
    summary,
    summary_lines,
    timeline,
)
from tests.conftest import free_port, run_state, wait_for

T0 = 1_796_000_000.0


def serve_events(ready: bool = True) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {"t": T0, "type": "launch", "kind": "serve"},
        {"t": T0 + 0.1, "type": "state", "state": "running"},
        {"t": T0 + 2.1, "type": "phase", "phase": "init"},
        {"t": T0 + 3.0, "type": "phase", "phase": "load-weights"},
        {"t": T0 + 4.0, "type": "health", "status": "refused"},
        {"t": T0 + 44.0, "type": "phase", "phase": "draft-load-weights"},
        {"t": T0 + 47.0, "type": "phase", "phase": "cuda-graph"},
        {"t": T0 + 59.0, "type": "phase", "phase": "http"},
        {"t": T0 + 59.5, "type": "health", "status": "http 503"},
    ]
    if ready:
        rows += [
            {"t": T0 + 60.0, "type": "health", "status": "ok"},
            {"t": T0 + 60.0, "type": "state", "state": "ready"},
            {"t": T0 + 60.2, "type": "phase", "phase": "ready"},
        ]
    return rows


def test_each_phase_has_its_duration_and_the_server_its_time_to_ready() -> None:
    line = timeline(serve_events())
    assert [(s.name, round(s.duration(0), 1)) for s in line.phases] == [
        ("launch", 2.1),
        ("init", 0.9),
        ("load-weights", 41.0),
        ("draft-load-weights", 3.0),
        ("cuda-graph", 12.0),
        ("http", 1.0),
    ]
    assert line.time_to_ready == 60.0
    assert summary(line, now=T0 + 100) == (
        "launch 2.1 s → init 0.9 s → load-weights 41 s → draft-load-weights 3.0 s → cuda-graph 12 s → http 1.0 s"
        " → ready in 1 m 00 s"
    )


@given(st.integers(min_value=1, max_value=200), st.integers(min_value=5, max_value=12))
def test_the_summary_breaks_only_between_steps_and_fits_its_width(width: int, events: int) -> None:
    line = timeline(serve_events()[:events])
    lines = summary_lines(line, T0 + 100, width)
    whole = steps(line, T0 + 100)
    # Read together, the lines are the one-line summary: no step is split (never "12" on one line, "s" below).
    assert " ".join(lines) == summary(line, T0 + 100)
    for shown in lines:
        assert len(shown) <= width or shown.removeprefix("→ ") in whole  # only a step longer than a line runs over


def test_a_phase_still_going_counts_up_to_now_and_a_hung_launch_never_says_ready() -> None:
    line = timeline(serve_events()[:5])
    assert line.ready_at is None and line.phases[-1].end is None
    assert summary(line, now=T0 + 123.0).endswith("load-weights 2 m 00 s…")


def test_the_health_strip_shows_refused_then_503_then_200_and_nothing_after_the_end() -> None:
    rows = [*serve_events(), {"t": T0 + 90.0, "type": "state", "state": "killed"}]
    line = timeline(rows)
    strip = health_strip(line, T0, T0 + 100, 10)
    assert strip == ["refused"] * 5 + ["ok"] * 3 + [None] * 2
    assert line.health_at(T0 + 1) is None and line.health_at(T0 + 59.7) == "http 503"


def test_two_attempts_line_up_phase_by_phase() -> None:
    first = timeline(serve_events())
    second_rows = [
        {**row, "t": float(str(row["t"])) + (20.0 if row.get("phase") != "init" and row["t"] != T0 else 0)}
        for row in serve_events()
        if row.get("phase") != "cuda-graph"  # relaunched with --disable-cuda-graph: no capture
    ]
    rows = compare(first, timeline(second_rows), now=T0 + 200)
    by_phase = {name: (a, b) for name, a, b in rows}
    assert by_phase["cuda-graph"][1] is None and by_phase["cuda-graph"][0] == 12.0
    assert by_phase["ready in"] == (60.0, 80.0)
    # As the detail panel says it: this attempt first, the one it replaced in brackets where they differ.
    said = comparison_steps(timeline(second_rows), first, now=T0 + 200)
    assert "cuda-graph — (was 12 s)" in said and said[-1] == "ready in 1 m 20 s (was 1 m 00 s)"
    assert "http 1.0 s" in said  # as long as before: no "(was …)"


@given(st.floats(min_value=0, max_value=10 * 24 * 3600, allow_nan=False))
def test_durations_read_as_a_person_writes_them(value: float) -> None:
    text = seconds(value)
    assert text.split()[-1] in {"s", "m"} and len(text) <= 10


def test_rows_without_a_time_or_with_odd_fields_are_passed_over() -> None:
    line = timeline([{"type": "launch"}, {"t": "soon", "type": "phase", "phase": "init"}, {"t": T0, "type": "phase"}])
    assert line.phases == [] and line.launched_at is None


async def test_the_timeline_of_a_real_watch_over_the_standin(workdir: Path, nvml_state: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tests.sglang_standin", "--port", str(port)]
    async with AgentClient(LocalTransport(workdir)) as client:
        launched = await client.request("launch", kind="serve", argv=argv, health_url=f"http://127.0.0.1:{port}/health")
        run_id = launched["run"]
        wait_for(lambda: run_state(workdir, run_id) == "ready", timeout=60, what="the stand-in to serve")
        await client.request("kill", run=run_id)
    rows, _, _ = read_jsonl(workdir / "runs" / run_id / "events.jsonl")
    line = timeline(rows)
    names = [span.name for span in line.phases]
    assert names[:3] == ["launch", "init", "load-weights"] and "draft-load-weights" in names
    assert line.time_to_ready is not None and 0 < line.time_to_ready < 60
    answers = [mark.status for mark in line.health]
    assert answers[-1] == "ok" and len(answers) >= 2  # refused or 503 before it
