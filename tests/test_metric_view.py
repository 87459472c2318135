"""A long metric history shown at once: the agent's thinned views of a run's metrics.jsonl (`backends.runs.metric_view`)
on real files and through a real local agent (the console's side: tests/test_tui_left_open.py)."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.runs import metric_view
from backends.runs.metric_view import RECENT_FRACTION, metrics_view
from backends.runs.store import METRICS, RunStore
from console.link.client import AgentClient
from console.link.local import LocalTransport
from console.link.transport import AgentError

Row = dict[str, Any]


def write(path: Path, rows: list[Row], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(row).encode() + b"\n" for row in rows) + tail)


def history(n: int, spike: int | None = None, nan: int | None = None) -> list[Row]:
    """A training run's rows: a falling loss (a spike to 50 at `spike`, NaN at `nan`), lr, and an eval row every
    100 steps."""
    rows: list[Row] = []
    for step in range(1, n + 1):
        loss = 50.0 if step == spike else math.nan if step == nan else 5.0 / math.sqrt(step)
        rows.append({"step": step, "loss": loss, "lr": 1e-4})
        if step % 100 == 0:
            rows.append({"step": step, "val_loss": 6.0 / math.sqrt(step)})
    return rows


def in_order_of(view: list[Row], rows: list[Row]) -> bool:
    """Whether `view` is rows of `rows`, whole and in their order."""
    it = iter(rows)
    return all(any(_same(row, other) for other in it) for row in view)


def _same(a: Row, b: Row) -> bool:
    return json.dumps(a) == json.dumps(b)


def test_a_history_that_fits_or_has_no_step_is_not_thinned(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write(path, history(300))
    assert metrics_view(path, 0, 4096) is None and metrics_view(path, 0, 4096, coarse=True) is None
    # x is the arrival index (an extraction's rows): a dropped row would move every later one
    write(path, [{"tokens_per_s": float(i)} for i in range(10_000)])
    assert metrics_view(path, 0, 256) is None and metrics_view(path, 0, 256, coarse=True) is None
    assert metrics_view(tmp_path / "gone.jsonl", 0, 256) is None


def test_the_full_view_keeps_the_extremes_the_newest_rows_and_leaves_a_line_being_written(tmp_path: Path) -> None:
    rows = history(20_000, spike=1_234, nan=4_321)
    path = tmp_path / "metrics.jsonl"
    write(path, [*rows[:50], "garbage", *rows[50:]], tail=b'{"step": 20001, "lo')  # type: ignore[list-item]
    view = metrics_view(path, 0, 1024)
    assert view is not None and view["thinned"] and view["skipped"] == 1
    kept = view["rows"]
    assert len(kept) <= 1024 and in_order_of(kept, rows)
    assert view["next_offset"] == path.stat().st_size - len(b'{"step": 20001, "lo')
    assert {"step": 1_234, "loss": 50.0, "lr": 1e-4} in kept  # the spike, far in the past
    assert any(row.get("step") == 4_321 and math.isnan(row.get("loss", 0.0)) for row in kept)  # the divergence
    assert kept[0] == rows[0] and kept[-1] == rows[-1]
    assert kept[-1024 // RECENT_FRACTION :] == rows[-1024 // RECENT_FRACTION :]  # the newest whole
    assert sum("val_loss" in row for row in kept) > 20  # eval rows too, though 1 in 101


def test_the_coarse_view_samples_the_past_and_keeps_the_newest_whole(tmp_path: Path) -> None:
    rows = history(50_000)
    path = tmp_path / "metrics.jsonl"
    write(path, rows)
    view = metrics_view(path, 0, 512, coarse=True)
    assert view is not None and view["thinned"] and view["next_offset"] == path.stat().st_size
    kept = view["rows"]
    assert len(kept) <= 512 and in_order_of(kept, rows) and kept[0] == rows[0]
    assert kept[-512 // RECENT_FRACTION :] == rows[-512 // RECENT_FRACTION :]
    steps = [row["step"] for row in kept[: -512 // RECENT_FRACTION]]
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    assert max(gaps) < 3 * 50_000 / 384  # even steps through the file, none of it left out


def test_a_view_stops_at_until_and_starts_at_offset(tmp_path: Path) -> None:
    rows = history(10_000)
    path = tmp_path / "metrics.jsonl"
    write(path, rows)
    data = path.read_bytes()
    half = data.index(b"\n", len(data) // 2) + 1
    for coarse in (False, True):
        early = metrics_view(path, 0, 256, coarse=coarse, until=half)
        late = metrics_view(path, half, 256, coarse=coarse)
        assert early is not None and late is not None
        assert early["next_offset"] == half and late["next_offset"] == len(data)
        assert early["rows"][-1] == json.loads(data[data.rindex(b"\n", 0, half - 1) + 1 : half])
        assert late["rows"][0] == json.loads(data[half : data.index(b"\n", half)])


def test_long_rows_keep_a_view_within_its_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metric_view, "VIEW_BYTES", 200_000)
    rows = [{"step": s, **{f"acc_{k}": s / (k + 1) for k in range(40)}} for s in range(1, 5_001)]
    path = tmp_path / "metrics.jsonl"
    write(path, rows)
    for coarse in (False, True):
        view = metrics_view(path, 0, 4096, coarse=coarse)
        assert view is not None and len(json.dumps(view["rows"])) <= 200_000 * 1.05
        assert view["rows"][-1] == rows[-1] and in_order_of(view["rows"], rows)


series_rows = st.lists(
    st.fixed_dictionaries(
        {"loss": st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.just("nan"))},
        optional={"acc_0": st.floats(-1e6, 1e6), "note": st.text(max_size=3), "plateau": st.booleans()},
    ),
    min_size=80,
    max_size=600,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=series_rows, points=st.integers(16, 64))
def test_a_full_view_holds_every_series_extremes_and_first_nonfinite(
    tmp_path: Path, values: list[Row], points: int
) -> None:
    rows = [{"step": i, **row} for i, row in enumerate(values)]
    path = tmp_path / "metrics.jsonl"
    write(path, rows)
    view = metrics_view(path, 0, points)
    assert view is not None and in_order_of(view["rows"], rows)
    kept_steps = {row["step"] for row in view["rows"]}
    for name in ("loss", "acc_0"):
        numbers = [(float(r[name]), r["step"]) for r in rows if isinstance(r.get(name), float | str)]
        finite = [(y, s) for y, s in numbers if math.isfinite(y)]
        if finite:  # the lowest and the highest value are each on a kept row (one of them, if tied)
            lo, hi = min(y for y, _ in finite), max(y for y, _ in finite)
            assert any(y == lo and s in kept_steps for y, s in finite)
            assert any(y == hi and s in kept_steps for y, s in finite)
        if nonfinite := [s for y, s in numbers if not math.isfinite(y)]:
            assert nonfinite[0] in kept_steps  # the first NaN/inf of a series: the news a chart must not lose


async def test_the_agent_serves_a_view_and_refuses_a_bad_size(workdir: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    async with AgentClient(LocalTransport(workdir)) as client:
        run = (await client.launch("train", argv))["run"]
        rows = history(6_000)
        write(RunStore(workdir).get(run).file(METRICS), rows)
        view = await client.metrics(run, points=1024)
        plain = await client.metrics(run)
        assert view["thinned"] and len(view["rows"]) <= 1024 and view["rows"][-1] == rows[-1]
        assert not plain["thinned"] and plain["rows"] == rows[: len(plain["rows"])]
        with pytest.raises(AgentError, match="points must be 16 to 65536"):
            await client.metrics(run, points=3)
        await client.kill(run, signal="KILL", grace=0.0)


def test_a_servers_rows_are_thinned_by_their_time_and_a_resumed_run_keeps_its_order(tmp_path: Path) -> None:
    """Two more shapes of the field: a serve run's rows have `t` and no step; a resumed training writes steps that
    go back (the console's store purges at the step it went back to), which a view must keep in file order."""
    path = tmp_path / "metrics.jsonl"
    served = [{"t": 1.8e9 + i, "gen_throughput": 400.0 + i % 7, "accept_len": 3.0} for i in range(5_000)]
    write(path, served)
    for coarse in (False, True):
        view = metrics_view(path, 0, 256, coarse=coarse)
        assert view is not None and view["thinned"] and in_order_of(view["rows"], served)
    resumed = [*history(3_000), *history(3_000)]  # steps 1..3000, then 1..3000 again
    write(path, resumed)
    view = metrics_view(path, 0, 512)
    assert view is not None and in_order_of(view["rows"], resumed)
    steps = [row["step"] for row in view["rows"]]
    assert steps.index(1) == 0 and 1 in steps[1:]  # both starts kept, the second after the first run's rows
