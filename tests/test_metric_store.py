"""The charts' metric store: every column of a curve is exactly what a pass over its raw points gives, eval
rows never wipe the training curves, a warm-up spike doesn't flatten the view, and a resumed run replaces
the steps it repeats."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.protocol import Metric, MetricRow
from console.tui.metric_store import DEFAULT_SMOOTHING, MAX_POINTS, Column, MetricStore, Series, column_edges

Point = tuple[float, float]


# ---- brute force: what the columns must be, from the raw points ----


def add(points: list[Point], x: float, y: float) -> None:
    """The points a chart shows after (x, y) arrives: a lower x drops every point at or after it."""
    if points and x < points[-1][0]:
        points[:] = [p for p in points if p[0] < x]
    points.append((x, y))


def smoothed(ys: list[float], weight: float = DEFAULT_SMOOTHING) -> list[float]:
    """TensorBoard's debiased EMA over the finite values; NaN/inf stay themselves."""
    last, count, out = 0.0, 0, []
    for y in ys:
        if math.isfinite(y):
            last = last * weight + (1.0 - weight) * y
            count += 1
            out.append(last / (1.0 - weight**count))
        else:
            out.append(y)
    return out


def brute_columns(points: list[Point], x0: float, x1: float, width: int) -> list[Column]:
    edges = column_edges(x0, x1, width)
    slots: list[list[float]] = [[] for _ in range(width)]
    for x, y in points:
        if x0 <= x <= x1:
            slots[min(bisect_right(edges, x) - 1, width - 1)].append(y)
    out = []
    for ys in slots:
        finite = [y for y in ys if math.isfinite(y)]
        out.append(
            Column(
                min(finite, default=math.nan),
                max(finite, default=math.nan),
                finite[-1] if finite else math.nan,
                len(ys),
                len(ys) - len(finite),
            )
        )
    return out


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_columns(got: list[Column], want: list[Column]) -> None:
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.count == w.count and g.nonfinite == w.nonfinite, (j, g, w)
        assert same(g.lo, w.lo) and same(g.hi, w.hi) and same(g.last, w.last), (j, g, w)


def finite_range(ys: list[float]) -> tuple[float, float] | None:
    finite = [y for y in ys if math.isfinite(y)]
    return (min(finite), max(finite)) if finite else None


# ---- property: every column equals the brute-force pass ----


@dataclass(frozen=True)
class Burst:
    """`length` points from x = last x + `jump` (negative: a resume), x growing by `dx` (0: repeated x)."""

    jump: float
    length: int
    dx: float
    seed: int
    nonfinite: float  # the share of NaN/inf points


bursts = st.builds(
    Burst,
    jump=st.sampled_from([0.0, 1.0, 7.5, -3.0, -40.0, -1e9]),
    # around the pyramid's block sizes (16, 256, 4096 points) as well as short
    length=st.integers(0, 40) | st.sampled_from([255, 256, 257, 1000, 4095, 4096, 4097]),
    dx=st.sampled_from([0.0, 1.0, 0.25, 3.0]),
    seed=st.integers(0, 2**32),
    nonfinite=st.sampled_from([0.0, 0.0, 0.02, 0.5, 1.0]),
)


def burst_points(burst: Burst, start: float) -> list[Point]:
    rng = random.Random(burst.seed)
    points = []
    x = start + burst.jump
    for _ in range(burst.length):
        if rng.random() < burst.nonfinite:
            y = rng.choice([math.nan, math.inf, -math.inf])
        else:
            y = rng.gauss(0.0, 1.0) * rng.choice([1.0, 1e-3, 1e6])
        points.append((x, y))
        x += burst.dx if rng.random() < 0.9 else 0.0
    return points


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(bursts, min_size=1, max_size=4),
    queries=st.lists(
        st.tuples(st.floats(-0.2, 1.2), st.floats(0.0, 1.2), st.integers(1, 200), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_every_column_is_exactly_what_the_raw_points_in_it_give(
    plan: list[Burst], queries: list[tuple[float, float, int, bool]]
) -> None:
    series = Series("loss")
    points: list[Point] = []
    for burst in plan:
        for x, y in burst_points(burst, points[-1][0] if points else 0.0):
            series.append(x, y)
            add(points, x, y)
    assert len(series) == len(points)
    if not points:
        assert series.x_range is None and series.y_range() is None and series.y_range(robust=True) is None
        return
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    assert series.x_range == (xs[0], xs[-1])
    assert series.nonfinite == sum(not math.isfinite(y) for y in ys)
    for at, span, width, smooth in queries:
        # windows anywhere around the data: all of it, a zoom, past either end, a single x
        x0 = xs[0] + at * (xs[-1] - xs[0]) - 1.0
        x1 = x0 + span * (xs[-1] - xs[0] + 2.0)
        curve = list(zip(xs, smoothed(ys), strict=True)) if smooth else points
        assert_columns(series.columns(x0, x1, width, smoothed=smooth), brute_columns(curve, x0, x1, width))
    assert series.columns(xs[0], xs[-1], 1)[0].count == len(points)
    assert series.y_range() == finite_range(ys)
    assert series.y_range(smoothed=True) == finite_range(smoothed(ys))
    skip = max(1, len(ys) // 20) if len(ys) > 1 else 0
    assert series.y_range(robust=True) == (finite_range(ys[skip:]) or finite_range(ys))


def test_a_long_curve_with_gaps_and_a_resume_is_exact_at_every_zoom() -> None:
    rng = random.Random(7)
    series = Series("loss")
    points: list[Point] = []
    for step in [*range(70_000), *range(60_000, 75_000)]:
        y = math.nan if 20_000 <= step < 20_500 or rng.random() < 0.001 else math.exp(-step / 1e4) + rng.random()
        series.append(float(step), y)
        add(points, float(step), y)
    assert len(series) == 75_000
    smooth = list(zip([p[0] for p in points], smoothed([p[1] for p in points]), strict=True))
    for x0, x1, width in [(0.0, 74_999.0, 160), (-10.0, 80_000.0, 97), (19_990.0, 20_600.0, 40), (5.0, 70_000.0, 1)]:
        assert_columns(series.columns(x0, x1, width), brute_columns(points, x0, x1, width))
        assert_columns(series.columns(x0, x1, width, smoothed=True), brute_columns(smooth, x0, x1, width))


@settings(max_examples=30, deadline=None)
@given(x0=st.floats(-1e12, 1e12), span=st.floats(0.0, 1e12), width=st.integers(1, 500))
def test_column_edges_split_the_range_into_equal_ordered_slices(x0: float, span: float, width: int) -> None:
    x1 = x0 + span
    edges = column_edges(x0, x1, width)
    assert len(edges) == width + 1 and edges[0] == x0 and edges[-1] == x1
    assert edges == sorted(edges)
    for j in range(width):
        assert edges[j + 1] - edges[j] == pytest.approx(span / width, rel=1e-9, abs=1e-3)


# ---- what a user sees ----


def training_rows(steps: range, eval_every: int, eval_lag: int) -> list[MetricRow]:
    """A trainer's rows: one per logged step, and an eval row every `eval_every` steps that arrives after
    `eval_lag` more training rows (the evaluation finished while training went on)."""
    rows: list[MetricRow] = []
    evals: list[MetricRow] = []
    for step in steps:
        rows.append({"step": step, "epoch": 0, "loss": 5.0 / (1 + step), Metric.acc(0): step / 1e4, "lr": 3e-3})
        if evals and evals[0]["step"] <= step - eval_lag * steps.step:
            rows.append(evals.pop(0))
        if step and step % eval_every == 0:
            evals.append({"step": step, "val_loss": 6.0 / (1 + step), Metric.val_acc(0): 0.5, "plateau": False})
    return rows + evals


def test_eval_rows_between_training_rows_never_remove_a_training_point() -> None:
    store = MetricStore()
    rows = training_rows(range(0, 2000, 10), eval_every=100, eval_lag=3)
    assert rows[14] == {"step": 100, "val_loss": 6.0 / 101, Metric.val_acc(0): 0.5, "plateau": False}
    for row in rows:
        store.add_row(row)
    loss = store.series("loss")
    assert loss is not None and len(loss) == 200  # every logged step is on the loss chart
    assert loss.x_range == (0.0, 1990.0)
    assert loss.y_range() == (5.0 / 1991, 5.0)
    assert sum(c.count for c in loss.columns(0.0, 1990.0, 160)) == 200
    val = store.series("val_loss")
    assert val is not None and len(val) == 19 and val.x_range == (100.0, 1900.0)
    assert store.names() == ["epoch", "loss", "acc_0", "lr", "val_loss", "val_acc_0", "plateau"]
    assert store.x_label == "step"


def test_each_row_names_the_series_it_added_to() -> None:
    store = MetricStore()
    assert store.add_row({"step": 0, "loss": 1.0, "acc_0": 0.5}) == {"loss", "acc_0"}
    assert store.add_row({"step": 100, "val_loss": 2.0, "plateau": True}) == {"val_loss", "plateau"}
    assert store.add_row({"step": 110, "note": "warm", "flag": True, "none": None, "loss": 0.5}) == {"loss"}
    plateau = store.series("plateau")
    assert plateau is not None and plateau.last == (100.0, 1.0)
    assert store.series("note") is None and store.series("flag") is None and store.series("step") is None


def test_serve_runs_plot_against_time_and_extraction_against_arrival() -> None:
    serve = MetricStore()
    for t in (1796081341.7, 1796081342.7, 1796081344.2):
        assert serve.add_row({"t": t, "accept_len": 2.3, "gen_throughput": 512.0}) == {"accept_len", "gen_throughput"}
    accept = serve.series("accept_len")
    assert serve.x_label == "time" and accept is not None and accept.x_range == (1796081341.7, 1796081344.2)
    extract = MetricStore()
    for samples in (100, 200, 300):
        extract.add_row({"stage": "extract", "samples": samples, "tokens_per_s": 9000.0, "shard": samples // 100})
    got = extract.series("samples")
    assert extract.x_label == "row" and got is not None and got.x_range == (0.0, 2.0)
    assert extract.names() == ["samples", "tokens_per_s", "shard"]


def test_a_row_without_the_x_belongs_where_the_row_before_was() -> None:
    store = MetricStore()
    for step in range(0, 100, 10):
        store.add_row({"step": step, "loss": 1.0})
    store.add_row({"loss": 0.5})  # not a resume: nothing is dropped
    loss = store.series("loss")
    assert loss is not None and len(loss) == 11 and loss.last == (90.0, 0.5)


def test_a_warmup_spike_does_not_flatten_the_robust_range() -> None:
    rng = random.Random(0)
    loss = Series("loss")
    loss.append(0.0, 41.8)
    for step in range(1, 400):
        loss.append(float(step), 0.6 + rng.uniform(-0.05, 0.05))
    plain = loss.y_range()
    assert plain is not None and plain[0] < 0.6 and plain[1] == 41.8  # the baseline is a flat line under it
    lo, hi = loss.y_range(robust=True) or (math.nan, math.nan)
    assert 0.55 <= lo < hi <= 0.65  # the baseline's own wiggle fills the chart
    loss.append(400.0, 41.8)  # a spike late in training is news: it stays in view
    assert loss.y_range(robust=True) == (lo, 41.8)


def test_a_resumed_run_replaces_the_steps_it_repeats() -> None:
    store = MetricStore()
    for step in range(0, 1000, 10):
        store.add_row({"step": step, "loss": 2.0})
    for step in range(500, 800, 10):  # restarted from its step-500 checkpoint
        store.add_row({"step": step, "loss": 1.0})
    loss = store.series("loss")
    assert loss is not None and len(loss) == 80 and loss.x_range == (0.0, 790.0)
    columns = loss.columns(0.0, 1000.0, 10)
    assert [c.count for c in columns] == [10] * 8 + [0, 0]
    assert [c.hi for c in columns[:8]] == [2.0] * 5 + [1.0] * 3
    # the smoothed curve is the one a run that never reached step 990 would have
    fresh = Series("loss")
    for step in range(0, 800, 10):
        fresh.append(float(step), 2.0 if step < 500 else 1.0)
    assert loss.columns(0.0, 790.0, 79, smoothed=True) == fresh.columns(0.0, 790.0, 79, smoothed=True)


def test_a_loss_gone_nan_shows_as_gaps_with_its_last_real_value() -> None:
    loss = Series("loss")
    for step in range(100):
        loss.append(float(step), 1.0 - step / 200)
    for step in range(100, 300):
        loss.append(float(step), math.nan)
    left, right = loss.columns(0.0, 299.0, 2)
    lowest = 1.0 - 99 / 200
    assert (left.count, left.nonfinite, left.lo, left.hi, left.last) == (150, 50, lowest, 1.0, lowest)
    assert (right.count, right.nonfinite) == (150, 150) and math.isnan(right.lo) and math.isnan(right.last)
    assert loss.y_range(robust=True) == (lowest, 1.0 - 15 / 200)  # after the first 5% of the 300 points
    loss.append(300.0, 0.4)  # it recovered
    assert loss.columns(0.0, 300.0, 1)[0].last == 0.4


def test_a_run_followed_for_days_keeps_a_bounded_store_with_its_curve_whole() -> None:
    """A week at 10 rows a second would hold 6 M points a series: the store keeps MAX_POINTS, the older ones
    thinned, and the chart still shows where the curve starts and ends, its spike, its NaN and its y range."""
    store = MetricStore()
    full = Series("loss")
    rows = 20 * MAX_POINTS
    for step in range(rows):
        loss = 5.0 * math.exp(-step / 40_000) + 0.01 * math.sin(step) + (30.0 if step == 12_345 else 0.0)
        value = math.nan if step == 50_000 else loss
        store.add_row({"step": step, "loss": value, "lr": 1e-4})
        full.append(float(step), value)
        if step % 997 == 0:
            kept = store.series("loss")
            assert kept is not None and len(kept) <= MAX_POINTS
    kept = store.series("loss")
    assert kept is not None and MAX_POINTS // 4 <= len(kept) <= MAX_POINTS
    assert kept.x_range == (0.0, rows - 1.0) and kept.last == full.last
    assert kept.y_range() == full.y_range()  # the spike at step 12,345 is still the top
    assert kept.nonfinite == 1
    width = 160
    for shown, exact in zip(kept.columns(0.0, rows - 1.0, width), full.columns(0.0, rows - 1.0, width), strict=True):
        # a thinning slice straddling a column's edge may lend its extreme to the next column: a hair
        assert abs(shown.lo - exact.lo) <= 0.05 and abs(shown.hi - exact.hi) <= 0.05
    recent = full.columns(rows - MAX_POINTS // 8, rows - 1.0, 40)
    assert kept.columns(rows - MAX_POINTS // 8, rows - 1.0, 40) == recent  # the newest points are all kept


def test_bad_queries_are_refused() -> None:
    loss = Series("loss")
    loss.append(0.0, 1.0)
    with pytest.raises(ValueError, match="width"):
        loss.columns(0.0, 1.0, 0)
    with pytest.raises(ValueError, match="x0 <= x1"):
        loss.columns(1.0, 0.0, 10)
    with pytest.raises(ValueError, match="finite"):
        loss.append(math.nan, 1.0)
    with pytest.raises(ValueError, match="smoothing"):
        MetricStore(smoothing=1.0)
    assert loss.columns(0.0, 0.0, 3)[-1].count == 1  # a single x: its points are in the last column


def test_a_small_cap_thinned_for_ages_stays_within_it_and_keeps_its_extremes() -> None:
    """A cap of 64 over 100,000 points: slices grow far wider than what ages between two thinnings, so a slice is
    thinned in several goes; the series still keeps at most its cap, its first and last points and its extremes."""
    rng = random.Random(3)
    series = Series("loss", cap=64)
    ys = [math.exp(-i / 30_000) + rng.random() * 0.01 for i in range(100_000)]
    ys[777], ys[55_555] = 9.0, -9.0
    for i, y in enumerate(ys):
        series.append(float(i), y)
        assert len(series) <= 64
    assert series.x_range == (0.0, 99_999.0) and series.y_range() == (-9.0, 9.0)


def test_an_integer_beyond_a_double_is_a_point_at_infinity_not_an_error() -> None:
    """JSON gives Python such an int whole; float() of it overflows, and so did the sign copied onto infinity."""
    store = MetricStore()
    assert store.add_row({"step": 1, "loss": 10**400, "lr": -(10**400)}) == {"loss", "lr"}
    loss, lr = store.series("loss"), store.series("lr")
    assert loss is not None and lr is not None and loss.last == (1.0, math.inf) and lr.last == (1.0, -math.inf)
