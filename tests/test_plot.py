"""The chart renderer, read as a user reads a chart: a spike reaches the top, a NaN is marked at its
step and moves nothing, the axes say sensible numbers, a log scale orders decades, the legend names
each series with its last value, and any size or data renders without error."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from console.tui.plot import (
    MARK_GLYPH,
    NONFINITE_GLYPH,
    NONPOSITIVE_GLYPH,
    Mark,
    PlotSeries,
    XKind,
    format_elapsed,
    format_number,
    plot_area,
    render_plot,
    x_ticks,
    y_ticks,
)

NAN = math.nan
Points = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Col:
    """The metric store's column, as the renderer reads it."""

    lo: float
    hi: float
    last: float
    count: int
    nonfinite: int


def decimate(points: Points, x0: float, x1: float, width: int) -> list[Col]:
    """Min/max per equal x-slice of [x0, x1], as the metric store hands them over."""
    slices: list[list[float]] = [[] for _ in range(width)]
    for x, value in points:
        slices[column_of(x, x0, x1, width)].append(value)
    decimated = []
    for values in slices:
        finite = [v for v in values if math.isfinite(v)]
        decimated.append(
            Col(
                min(finite, default=NAN),
                max(finite, default=NAN),
                finite[-1] if finite else NAN,
                len(values),
                len(values) - len(finite),
            )
        )
    return decimated


def column_of(x: float, x0: float, x1: float, width: int) -> int:
    return min(int((x - x0) / (x1 - x0) * width), width - 1) if x1 > x0 else 0


@dataclass(frozen=True)
class Chart:
    """A rendered chart cut into the parts a user looks at."""

    text: Text
    legend: str
    y_labels: list[str]  # per plot row, "" where none
    plot: list[str]  # the plot rows, right of the y axis
    axis: str  # the x axis line, right of its corner
    x_names: str  # the x label line, left of the plot
    x_labels: str  # the x label line, under the plot
    left: int  # where the plot starts in a line

    def dotted(self, row: int, column: int) -> bool:
        return ord(self.plot[row][column]) > 0x2800


def draw(
    curves: dict[str, Points],
    x_range: tuple[float, float],
    y_range: tuple[float, float] | None = None,
    width: int = 80,
    height: int = 16,
    log: bool = False,
    x_kind: XKind = "step",
    marks: Sequence[Mark] = (),
) -> Chart:
    cols, _ = plot_area(width, height, y_range, log)
    series = [PlotSeries(name, decimate(points, *x_range, cols)) for name, points in curves.items()]
    return parse(render_plot(series, width, height, x_range, x_kind, y_range, log=log, marks=marks), width, height)


def parse(text: Text, width: int, height: int) -> Chart:
    lines = text.plain.split("\n")
    assert len(lines) == height
    assert all(len(line) == width for line in lines)
    left = lines[-2].index("└") + 1
    return Chart(
        text,
        lines[0],
        [line[: left - 1].strip() for line in lines[1:-2]],
        [line[left:] for line in lines[1:-2]],
        lines[-2][left:],
        lines[-1][:left],
        lines[-1][left:],
        left,
    )


def number(label: str) -> float:
    """A label back to its value (0.61, 1.2e-4, 3.1k, 2.5M)."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(label[-1:], 1.0)
    return float(label[:-1] if scale != 1.0 else label) * scale


def style_at(text: Text, offset: int) -> str:
    """The style Rich paints at `offset`: the last span covering it."""
    styles = [str(span.style) for span in text.spans if span.start <= offset < span.end]
    return styles[-1] if styles else ""


# ---- what a user sees ---------------------------------------------------------------------------


def test_a_spike_keeps_its_full_height_among_many_points() -> None:
    loss = [(step, 15.0 if step == 400 else 0.6) for step in range(1000)]
    chart = draw({"loss": loss}, (0, 999))
    spike = column_of(400, 0, 999, len(chart.plot[0]))
    assert [c for c in range(len(chart.plot[0])) if chart.dotted(0, c)] == [spike]
    assert chart.y_labels[0] == "15"
    assert all(chart.dotted(len(chart.plot) - 1, c) for c in range(len(chart.plot[0])))  # the 0.6 baseline

    robust = draw({"loss": loss}, (0, 999), y_range=(0.5, 1.0))  # the spike beyond the range: drawn at the top
    assert [c for c in range(len(robust.plot[0])) if robust.dotted(0, c)] == [column_of(400, 0, 999, len(robust.axis))]


def test_a_nan_is_marked_at_its_step_and_moves_no_other_point() -> None:
    clean = [(step, 1.0 if step < 600 else 2.0) for step in range(1000)]
    broken = [(step, NAN if step == 500 else value) for step, value in clean]
    with_nan = draw({"loss": broken}, (0, 999), y_range=(0, 3))
    without = draw({"loss": clean}, (0, 999), y_range=(0, 3))
    cols = len(with_nan.axis)
    assert [c for c, glyph in enumerate(with_nan.axis) if glyph == NONFINITE_GLYPH] == [column_of(500, 0, 999, cols)]
    assert NONFINITE_GLYPH not in without.axis
    assert with_nan.plot == without.plot
    assert f"loss 2 {NONFINITE_GLYPH}1" in with_nan.legend and f"{NONFINITE_GLYPH} nan/inf" in with_nan.legend


def test_a_column_of_only_nan_breaks_the_line_there() -> None:
    cols, _ = plot_area(60, 12, (-1, 1))
    values = [(i, NAN if i == 20 else math.sin(i / 5)) for i in range(cols)]
    chart = parse(
        render_plot([PlotSeries("acc_0", decimate(values, 0, cols, cols))], 60, 12, (0, cols), y_range=(-1, 1)), 60, 12
    )
    empty = [c for c in range(cols) if not any(chart.dotted(r, c) for r in range(len(chart.plot)))]
    assert empty == [20]
    assert chart.axis[20] == NONFINITE_GLYPH


def test_a_sparse_series_reads_as_a_line() -> None:
    chart = draw({"val_loss": [(s, 3.0 - s / 1000) for s in range(0, 3001, 500)]}, (0, 3000), y_range=(0, 3))
    assert all(any(chart.dotted(r, c) for r in range(len(chart.plot))) for c in range(len(chart.axis)))


def test_the_axes_label_values_and_steps() -> None:
    chart = draw({"acc_0": [(s, s / 2500) for s in range(0, 2501, 5)]}, (0, 2500), y_range=(0, 1), width=90)
    labels = [label for label in chart.y_labels if label]
    assert 3 <= len(labels) <= 5
    assert chart.y_labels[0] == "1" and chart.y_labels[-1] == "0"
    assert [number(label) for label in labels] == sorted((number(label) for label in labels), reverse=True)
    assert chart.x_labels.split() == ["0", "500", "1k", "1.5k", "2k", "2.5k"]
    for label in chart.x_labels.split():  # each label sits under its tick, at its step's column
        start = chart.x_labels.index(label)
        tick = column_of(number(label), 0, 2500, len(chart.axis))
        assert chart.axis[tick] == "┬" and start <= tick < start + len(label)
    assert chart.x_names.strip() == "step"


def test_a_time_axis_counts_from_the_start() -> None:
    start = 1.7e9
    minutes = draw({"loss": [(start + s, 1.0) for s in range(0, 1801, 10)]}, (start, start + 1800), x_kind="time")
    assert minutes.x_labels.split() == ["0m", "10m", "20m", "30m"]
    assert minutes.x_names.strip() == "time"
    hours = x_ticks(start, start + 3 * 3600, 80, "time")
    assert [label for _, label in hours] == ["0:00", "1:00", "2:00", "3:00"]
    days = x_ticks(start, start + 3 * 86400, 80, "time")
    assert [label for _, label in days] == ["0d", "1d", "2d", "3d"]


def test_a_log_scale_orders_decades() -> None:
    steps = [(s, 100.0 if s < 300 else 1.0 if s < 600 else 0.01) for s in range(900)]
    chart = draw({"loss": steps}, (0, 899), log=True, height=20)
    labels = [label for label in chart.y_labels if label]
    assert [number(label) for label in labels] == [100, 10, 1, 0.1, 0.01]

    def row_of(chart: Chart, step: int) -> int:
        column = column_of(step, 0, 899, len(chart.plot[0]))
        return next(r for r in range(len(chart.plot)) if chart.dotted(r, column))

    high, middle, low = row_of(chart, 150), row_of(chart, 450), row_of(chart, 750)
    assert high < middle < low and abs((middle - high) - (low - middle)) <= 1
    assert chart.y_labels[high] == "100" and chart.y_labels[middle] == "1" and chart.y_labels[low] == "0.01"

    linear = draw({"loss": steps}, (0, 899), height=20)  # what the log scale is for: 1 and 0.01 apart
    assert row_of(linear, 450) == row_of(linear, 750)


def test_values_a_log_scale_cannot_show_are_marked() -> None:
    loss = [(s, 0.0 if s == 450 else 1 + s / 100) for s in range(900)]
    chart = draw({"loss": loss}, (0, 899), log=True)
    cols = len(chart.axis)
    assert [c for c, glyph in enumerate(chart.axis) if glyph == NONPOSITIVE_GLYPH] == [column_of(450, 0, 899, cols)]
    assert f"{NONPOSITIVE_GLYPH} <=0" in chart.legend
    assert chart.dotted(len(chart.plot) - 1, column_of(450, 0, 899, cols))  # it plunges to the bottom


def test_the_legend_names_each_series_with_its_last_value() -> None:
    chart = draw({"loss": [(0, 2.0), (5, NAN), (9, NAN), (10, 0.6123)], "val_loss": [(0, 2.1), (10, 0.7)]}, (0, 10))
    assert f"━ loss 0.6123 {NONFINITE_GLYPH}2" in chart.legend and "━ val_loss 0.7" in chart.legend

    cols, _ = plot_area(60, 10, (0, 3))
    raw = decimate([(s, 1.0 + (s % 2) * 0.5) for s in range(100)], 0, 99, cols)
    smooth = decimate([(s, 1.25) for s in range(100)], 0, 99, cols)
    text = render_plot([PlotSeries("loss", smooth, raw=raw)], 60, 10, (0, 99), y_range=(0, 3))
    assert "loss 1.25 (raw 1.5)" in text.plain.split("\n")[0]

    crowded = [PlotSeries(f"acc_{k}", decimate([(0, 0.5)], 0, 1, 30)) for k in range(8)]
    legend = render_plot(crowded, 30, 8, (0, 1)).plain.split("\n")[0]
    assert len(legend) == 30 and legend.startswith("━ acc_0 0.5") and legend.endswith("…")


def test_a_plateau_is_marked_on_the_axis_and_in_the_legend() -> None:
    chart = draw({"loss": [(s, 1.0) for s in range(3000)]}, (0, 2999), marks=[Mark(1500)])
    column = column_of(1500, 0, 2999, len(chart.axis))
    assert [c for c, glyph in enumerate(chart.axis) if glyph == MARK_GLYPH] == [column]
    assert chart.plot[0][column] == "┊"
    assert f"{MARK_GLYPH} plateau" in chart.legend
    assert MARK_GLYPH not in draw({"loss": [(s, 1.0) for s in range(3000)]}, (0, 2999), marks=[Mark(5000)]).axis


def test_the_later_series_colours_a_shared_cell_and_any_series_covers_a_raw_curve() -> None:
    cols, rows = plot_area(40, 8, (0, 1))
    line = decimate([(s, 0.5) for s in range(100)], 0, 99, cols)
    text = render_plot([PlotSeries("a", line, "red"), PlotSeries("b", line, "blue")], 40, 8, (0, 99), y_range=(0, 1))
    chart = parse(text, 40, 8)
    offsets = [(r + 1) * 41 + chart.left + c for r in range(rows) for c in range(cols) if chart.dotted(r, c)]
    assert offsets and {style_at(text, o) for o in offsets} == {"blue"}
    # Two lines in one cell row, a dot row apart: the cells show both (dot rows 2 and 3 of 4).
    upper = decimate([(s, 0.55) for s in range(100)], 0, 99, cols)
    text = render_plot([PlotSeries("a", line, "red"), PlotSeries("b", upper, "blue")], 40, 8, (0, 99), y_range=(0, 1))
    assert set(parse(text, 40, 8).plot[2]) == {"\u2836"}

    noisy = decimate([(s, 0.5 + 0.3 * (-1) ** s) for s in range(100)], 0, 99, cols)
    text = render_plot([PlotSeries("loss", line, "green", raw=noisy)], 40, 8, (0, 99), y_range=(0, 1))
    chart = parse(text, 40, 8)
    styles = {(r, c): style_at(text, (r + 1) * 41 + chart.left + c) for r in range(rows) for c in range(cols)}
    green = {r for (r, _), style in styles.items() if style == "green"}
    assert len(green) == 1
    (middle,) = green
    assert all(styles[middle, c] == "green" for c in range(cols))
    assert set(chart.plot[middle]) == {"\u2824"}  # the smoothed line's dots alone, no raw dots mixed in
    assert "dim green" in styles.values()


# ---- degenerate input --------------------------------------------------------------------------

DEGENERATE: dict[str, list[tuple[float, float]]] = {
    "no points": [],
    "one point": [(5, 0.5)],
    "all equal": [(s, 0.5) for s in range(100)],
    "all nan": [(s, NAN) for s in range(100)],
    "inf": [(s, math.inf if s % 7 == 0 else 1.0) for s in range(100)],
    "a range of 1e-12": [(s, 0.5 + s * 1e-14) for s in range(100)],
    "huge": [(s, (s % 3 - 1) * 1e300) for s in range(100)],
    "near the float limit": [(s, 1.7e308 if s % 2 else -1.7e308) for s in range(100)],
    "subnormal": [(s, 5e-324 * (s % 2)) for s in range(100)],
    "negative": [(s, -s - 1.0) for s in range(100)],
}


@pytest.mark.parametrize("case", DEGENERATE)
@pytest.mark.parametrize("size", [(1, 1), (2, 2), (5, 3), (8, 5), (20, 5), (12, 6), (240, 40)])
@pytest.mark.parametrize("log", [False, True])
def test_degenerate_input_renders_at_any_size(case: str, size: tuple[int, int], log: bool) -> None:
    width, height = size
    points = DEGENERATE[case]
    x0, x1 = (min(x for x, _ in points), max(x for x, _ in points)) if points else (0, 0)
    for y_range in (None, (0.0, 1.0)):
        cols, _ = plot_area(width, height, y_range, log)
        series = [PlotSeries("loss", decimate(points, x0, x1, cols))]
        text = render_plot(series, width, height, (x0, x1) if points else None, y_range=y_range, log=log)
        lines = text.plain.split("\n")
        assert len(lines) == height and all(len(line) == width for line in lines)


def test_degenerate_input_says_what_it_is() -> None:
    assert "no data" in render_plot([], 40, 8, None).plain
    assert "no data" in render_plot([PlotSeries("loss", [])], 40, 8, None).plain
    all_nan = draw({"loss": DEGENERATE["all nan"]}, (0, 99), width=40, height=8)
    assert "no finite values" in "".join(all_nan.plot) and set(all_nan.axis) == {NONFINITE_GLYPH}
    assert "no values > 0" in "".join(draw({"loss": DEGENERATE["negative"]}, (0, 99), log=True).plot)

    for case in ("all equal", "a range of 1e-12"):  # a flat line, on one row, labelled with its value
        chart = draw({"loss": DEGENERATE[case]}, (0, 99), width=40, height=8)
        rows = {r for r in range(len(chart.plot)) for c in range(len(chart.plot[0])) if chart.dotted(r, c)}
        assert len(rows) == 1 and chart.y_labels[rows.pop()] == "0.5"

    one = draw({"loss": DEGENERATE["one point"]}, (5, 5), width=40, height=8)
    assert one.dotted(one.y_labels.index("0.5"), 0) and one.x_labels.split() == ["5"]


def test_a_chart_too_narrow_for_labels_drops_them_and_still_draws() -> None:
    chart = draw({"loss": [(s, s % 10) for s in range(100)]}, (0, 99), width=9, height=6)
    assert chart.left == 1 and not any(chart.y_labels)
    assert any(chart.dotted(r, c) for r in range(len(chart.plot)) for c in range(len(chart.plot[0])))


def test_columns_of_another_width_are_refitted_keeping_spikes() -> None:
    cols, _ = plot_area(60, 10, (0, 20))
    many = decimate([(s, 20.0 if s == 333 else 1.0) for s in range(1000)], 0, 999, cols * 3)
    chart = parse(render_plot([PlotSeries("loss", many)], 60, 10, (0, 999), y_range=(0, 20)), 60, 10)
    assert [c for c in range(cols) if chart.dotted(0, c)] == [column_of(333, 0, 999, cols)]


# ---- properties ---------------------------------------------------------------------------------


@given(st.floats(-1e300, 1e300), st.integers(1, 8))
def test_numbers_are_short_and_read_back_to_their_value(value: float, digits: int) -> None:
    text = format_number(value, digits)
    assert "e+" not in text and not text.endswith(".") and len(text) <= digits + 7
    assert "." not in text.split("e")[0] or not text.split("e")[0].rstrip("kMGT").endswith("0")
    assert math.isclose(number(text), value, rel_tol=0.5 * 10 ** (1 - digits) * 1.0001, abs_tol=1e-300)


ranges = st.tuples(st.floats(-15, 15), st.floats(-1, 1), st.floats(-5, 2)).map(
    lambda t: (t[1] * 10 ** t[0], t[1] * 10 ** t[0] + 10 ** (t[0] + t[2]))
)


@given(ranges, st.integers(5, 40), st.booleans())
def test_y_labels_are_three_to_five_distinct_numbers_from_top_to_bottom(
    span: tuple[float, float], rows: int, log: bool
) -> None:
    lo, hi = (abs(span[0]) + 1e-200, abs(span[0]) + 1e-200 + span[1] - span[0]) if log else span
    ticks = y_ticks(lo, hi, rows, log)
    values = [number(label) for _, label in ticks]
    assert 3 <= len(ticks) <= 5
    assert [row for row, _ in ticks] == sorted({row for row, _ in ticks}) and all(0 <= r < rows for r, _ in ticks)
    assert values == sorted(set(values), reverse=True)
    slack = (hi - lo) * 0.01
    assert all(lo - slack <= v <= hi + slack for v in values)


@given(
    st.floats(-1e9, 1e9),
    st.floats(1e-3, 1e9),
    st.integers(20, 240),
    st.sampled_from(["step", "row", "time"]),
)
def test_x_labels_fit_in_order_without_touching(x0: float, span: float, cols: int, kind: XKind) -> None:
    ticks = x_ticks(x0, x0 + span, cols, kind)
    starts = [min(max(c - len(label) // 2, 0), cols - len(label)) for c, label in ticks]
    assert [c for c, _ in ticks] == sorted({c for c, _ in ticks})
    assert all(s >= 0 and s + len(label) <= cols for s, (_, label) in zip(starts, ticks, strict=True))
    assert all(b > a + len(label) for a, b, (_, label) in zip(starts, starts[1:], ticks, strict=False))
    assert len({label for _, label in ticks}) == len(ticks)
    if kind != "time":
        assert [number(label) for _, label in ticks] == sorted(number(label) for _, label in ticks)
        assert all(math.isclose(number(label), round(number(label))) for _, label in ticks)  # whole steps and rows


ELAPSED = re.compile(r"(-?)(?:(\d+)d)?(?:(\d+)h)?(?:(\d+):(\d\d))?(?:(\d+)m)?(?:(\d+)s)?")


@given(st.floats(-1e7, 1e7), st.sampled_from([("s", 1), ("m", 60), ("h", 60), ("d", 3600)]))
def test_elapsed_times_read_back_to_the_unit(seconds: float, unit_and_resolution: tuple[str, int]) -> None:
    unit, resolution = unit_and_resolution
    text = format_elapsed(seconds, unit)  # type: ignore[arg-type]
    match = ELAPSED.fullmatch(text)
    assert match and text.lstrip("-")
    days, hours, clock_h, clock_m, minutes, secs = (int(g or 0) for g in match.groups()[1:])
    total = days * 86400 + (hours + clock_h) * 3600 + (clock_m + minutes) * 60 + secs
    assert 0 <= round(abs(seconds)) - total < resolution
    assert (match.group(1) == "-") == (seconds < 0)


column = st.one_of(
    st.just(Col(NAN, NAN, NAN, 0, 0)),
    st.just(Col(NAN, NAN, NAN, 2, 2)),
    st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)).map(
        lambda t: Col(min(t[:2]), max(t[:2]), min(max(t[2], min(t[:2])), max(t[:2])), 3, 0)
    ),
)


@given(st.integers(20, 120), st.integers(6, 30), st.integers(1, 3), st.data())
def test_every_column_with_values_has_a_dot_between_its_lo_and_hi(
    width: int, height: int, n_series: int, data: st.DataObject
) -> None:
    cols, rows = plot_area(width, height, (0.0, 1.0))
    series = [PlotSeries(f"s{k}", data.draw(st.lists(column, min_size=cols, max_size=cols))) for k in range(n_series)]
    chart = parse(render_plot(series, width, height, (0, cols), y_range=(0.0, 1.0)), width, height)
    dots = 4 * rows - 1
    for s in series:
        for c, col in enumerate(s.columns):
            if math.isnan(col.lo):
                continue
            top, bottom = max(0, math.floor((1 - col.hi) * dots - 1)), min(dots, math.ceil((1 - col.lo) * dots + 1))
            assert any(chart.dotted(r, c) for r in range(top // 4, bottom // 4 + 1)), (c, col)


finite_or_nan = st.one_of(st.just(NAN), st.floats(allow_nan=False, allow_infinity=False))


@given(
    st.lists(
        st.tuples(finite_or_nan, finite_or_nan, st.integers(0, 3)).map(
            lambda t: (
                Col(NAN, NAN, NAN, t[2], t[2])
                if math.isnan(t[0]) or math.isnan(t[1])
                else Col(min(t[:2]), max(t[:2]), t[1], t[2] + 1, 0)
            )
        ),
        max_size=50,
    ),
    st.integers(0, 250),
    st.integers(0, 45),
    st.one_of(st.none(), st.tuples(finite_or_nan, finite_or_nan)),
    st.one_of(st.none(), st.tuples(st.floats(-1e12, 1e12), st.floats(-1e12, 1e12))),
    st.booleans(),
)
def test_any_columns_render_at_their_exact_size(
    columns: list[Col],
    width: int,
    height: int,
    y_range: tuple[float, float] | None,
    x_range: tuple[float, float] | None,
    log: bool,
) -> None:
    text = render_plot(
        [PlotSeries("loss", columns, raw=columns[::-1])],
        width,
        height,
        x_range,
        "time",
        y_range,
        log=log,
        marks=[Mark(0.0)],
    )
    lines = text.plain.split("\n") if width and height else []
    assert len(lines) == (height if width else 0) and all(len(line) == width for line in lines)
