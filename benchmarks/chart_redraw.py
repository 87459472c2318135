"""Chart redraw: a run's metric rows into the console's metric store, then one redraw of all its curves.

    .venv/bin/python -m benchmarks.chart_redraw [--series 8] [--points 200000] [--width 160] [--repeat 30]

Feeds `--points` rows of `--series` training-like curves (a warm-up spike, noise, one curve with a
stretch of NaN) through `MetricStore.add_row`, then times a redraw: the steps in REDRAW, run for every
series at `--width` columns over its whole x range. Target: the whole redraw well under 25 ms, so the
UI thread keeps up with a row a frame. For comparison, a naive redraw walks every point in Python,
and plotext 5.3 (the `bench` extra: `.venv/bin/pip install -e '.[bench]'`) draws the same points.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.protocol import MetricRow
from benchmarks._common import percentile, print_table, rss_mib
from console.tui.metric_store import Column, MetricStore, Series
from console.tui.plot import PlotSeries, plot_area, render_plot

REDRAW_TARGET_MS = 25.0
HEIGHT = 24  # the chart's rows: the curves panel at 160x48


@dataclass
class Frame:
    """What one redraw of every curve works on: each step reads it and leaves its result on it."""

    series: list[Series]
    width: int
    smoothed: bool = False
    columns: list[list[Column]] = field(default_factory=list)
    x_range: tuple[float, float] = (0.0, 0.0)
    y_range: tuple[float, float] = (0.0, 1.0)


def columns_step(frame: Frame) -> None:
    ranges = [r for s in frame.series if (r := s.x_range) is not None]
    frame.x_range = (min(r[0] for r in ranges), max(r[1] for r in ranges))
    found = [r for s in frame.series if (r := s.y_range(robust=True)) is not None]
    frame.y_range = (min(r[0] for r in found), max(r[1] for r in found))
    plot_width, _ = plot_area(frame.width, HEIGHT, frame.y_range)
    frame.columns = [s.columns(*frame.x_range, plot_width, smoothed=frame.smoothed) for s in frame.series]


def draw_step(frame: Frame) -> None:
    plotted = [PlotSeries(s.name, columns) for s, columns in zip(frame.series, frame.columns, strict=True)]
    render_plot(plotted, frame.width, HEIGHT, frame.x_range, "step", frame.y_range)


# One redraw, step by step: the columns of every curve, then the chart drawn from them.
REDRAW: list[tuple[str, Callable[[Frame], None]]] = [
    ("columns() of every curve", columns_step),
    ("render_plot of all curves in one chart", draw_step),
]


def plotext_redraw(series: list[Series], width: int) -> float | None:
    """Seconds plotext takes to draw the same points at the same size; None when it is not installed."""
    try:
        import plotext
    except ImportError:
        return None
    points = [list(zip(*s.points(), strict=True)) for s in series]
    start = time.perf_counter()
    plotext.clf()
    plotext.plotsize(width, HEIGHT)
    for xs, ys in points:
        plotext.plot(list(xs), [y if math.isfinite(y) else None for y in ys])
    plotext.build()
    return time.perf_counter() - start


def naive_columns(series: Series, width: int) -> list[tuple[float, float, int]]:
    """What a chart without the store's pyramid does per redraw: one Python pass over every point."""
    x0, x1 = series.x_range or (0.0, 0.0)
    scale = width / ((x1 - x0) or 1.0)
    lo, hi, count = [math.inf] * width, [-math.inf] * width, [0] * width
    for x, y in series.points():
        j = min(int((x - x0) * scale), width - 1)
        count[j] += 1
        if math.isfinite(y):
            lo[j], hi[j] = min(lo[j], y), max(hi[j], y)
    return list(zip(lo, hi, count, strict=True))


def make_rows(n_series: int, points: int, seed: int = 0) -> list[MetricRow]:
    """Training rows every 10 steps: loss-like decays from a warm-up spike, noisy; `s3` goes NaN for a while."""
    rng = random.Random(seed)
    rows: list[MetricRow] = []
    for i in range(points):
        row: MetricRow = {"step": i * 10}
        for k in range(n_series):
            y = 0.6 + 41.2 * math.exp(-i / (50 + 30 * k)) + rng.gauss(0.0, 0.02)
            row[f"s{k}"] = math.nan if k == 3 and points // 3 <= i < points // 3 + 500 else y
        rows.append(row)
    return rows


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """Milliseconds per call, `repeat` calls."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=8)
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    rows = make_rows(args.series, args.points)
    store = MetricStore()
    rss0, start = rss_mib(os.getpid()), time.perf_counter()
    for row in rows:
        store.add_row(row)
    append_s, rss1 = time.perf_counter() - start, rss_mib(os.getpid())
    del rows
    total = args.series * args.points
    series = [s for name in store.names() if (s := store.series(name)) is not None]

    frame = Frame(series, args.width)
    step_ms: dict[str, list[float]] = {name: [] for name, _ in REDRAW}
    redraw_ms = []
    for _ in range(args.repeat):
        for name, step in REDRAW:
            start = time.perf_counter()
            step(frame)
            step_ms[name].append((time.perf_counter() - start) * 1000)
        redraw_ms.append(sum(ms[-1] for ms in step_ms.values()))
    smooth = Frame(series, args.width, smoothed=True)
    smoothed_ms = timed(lambda: columns_step(smooth), args.repeat)
    naive_ms = timed(lambda: [naive_columns(s, args.width) for s in series], 1)[0]
    plotext_s = plotext_redraw(series, args.width)
    p50 = percentile(redraw_ms, 50)

    print(
        f"chart redraw: {args.series} curves x {args.points:,} points, {args.width} columns, "
        f"{args.repeat} redraws, on {os.cpu_count()} cores"
    )
    table = [
        (f"add_row, {args.points:,} rows, s", f"{append_s:.2f}", "-", "-"),
        ("add_row, us per point", f"{append_s / total * 1e6:.2f}", "-", "-"),
        ("store memory, MB per million points (RSS)", f"{(rss1 - rss0) * 1.048576 / total * 1e6:.1f}", "-", "-"),
    ]
    table += [(f"redraw step: {name}, p50 ms", f"{percentile(ms, 50):.2f}", "-", "-") for name, ms in step_ms.items()]
    table += [
        ("redraw, p50 ms", f"{p50:.2f}", f"{REDRAW_TARGET_MS:.0f}", f"{p50 / REDRAW_TARGET_MS:.2f}"),
        ("redraw, p99 ms", f"{percentile(redraw_ms, 99):.2f}", f"{REDRAW_TARGET_MS:.0f}", "-"),
        ("smoothed columns() of every curve, p50 ms", f"{percentile(smoothed_ms, 50):.2f}", "-", "-"),
        ("naive redraw (a Python pass over every point), ms", f"{naive_ms:.0f}", "-", "-"),
        ("naive / columns()", f"{naive_ms / percentile(step_ms[REDRAW[0][0]], 50):.0f}x", "-", "-"),
    ]
    if plotext_s is not None:
        table += [
            ("plotext, the same points at the same size, ms", f"{plotext_s * 1000:.0f}", "-", "-"),
            ("plotext / our redraw", f"{plotext_s * 1000 / p50:.0f}x", "-", "-"),
        ]
    print_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
