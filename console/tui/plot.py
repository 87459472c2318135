"""Metric charts as text: several series on one braille plot, with a y axis, an x axis (step, time or
row), a one-line legend, and marks for NaN/inf points, values a log scale cannot show, and plateaus.

Pure and cheap: the metric store hands one min/max column per screen column (a spike keeps its full
height), and a render costs O(width x height) whatever the number of points behind it.

Layout, top to bottom: the legend, the plot rows (y labels on the left), the x axis line (ticks and
marks), the x labels. Rows go first to the plot as the height shrinks: the x labels go below 6 rows,
the axis line below 4, the legend below 3; the y labels go when the plot would be narrower than 10.

Drawing: each column is a vertical run of braille dots from its lo to its hi in the left half of its
cell; the right half joins its last value to the next column's range, so a line reads as a line.
Columns with no points are bridged by a straight line (the series was only sampled more sparsely);
a column holding only NaN/inf breaks the line. Where two series share a cell, the cell shows the dots
of both in the colour of the later one in the list (so each keeps its shape). Faint raw curves are
drawn first and give way: a cell a series reaches shows only series dots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rich.text import Span, Text

XKind = Literal["step", "time", "row"]


class ColumnLike(Protocol):
    """One screen column of one series, as the metric store's `Column` holds it."""

    @property
    def lo(self) -> float: ...  # min of the finite values in it (nan if none)
    @property
    def hi(self) -> float: ...  # max of the finite values in it (nan if none)
    @property
    def last(self) -> float: ...  # last finite value (nan if none)
    @property
    def count(self) -> int: ...  # points in it, NaN/inf included
    @property
    def nonfinite(self) -> int: ...  # NaN/inf points in it


@dataclass(frozen=True)
class PlotSeries:
    """One curve. `columns` has one entry per plot column (see `plot_area`); `raw`, when the curve is
    smoothed, holds the unsmoothed columns, drawn faint behind it. An empty `style` takes the next
    colour of the default palette. A `background` curve (another run's, for comparison) is drawn under the
    others, as any curve listed before them, but named after them in the legend: a cut legend loses it first."""

    name: str
    columns: Sequence[ColumnLike]
    style: str = ""
    raw: Sequence[ColumnLike] | None = None
    background: bool = False


@dataclass(frozen=True)
class Mark:
    """An event at one x (a `plateau` flag raised at a step): a `▲` on the x axis, a dotted vertical
    line through the empty cells above it, and its label in the legend."""

    x: float
    label: str = "plateau"
    style: str = "yellow"


@dataclass(frozen=True)
class PlotStyles:
    """Rich styles for the parts that are not series (the app maps its theme variables to these)."""

    axis: str = "bright_black"
    nonfinite: str = "bold red"
    note: str = "dim"
    palette: tuple[str, ...] = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


NONFINITE_GLYPH = "\u00d7"  # a multiplication sign, on the x axis where a series has NaN/inf points
NONPOSITIVE_GLYPH = "↓"  # on the x axis where a log scale met values <= 0
MARK_GLYPH = "▲"
_MARK_LINE = "┊"
_MIN_PLOT_WIDTH = 10  # narrower than this with y labels: the labels go
_MAX_Y_LABELS = 5
_HUGE = 1e300  # ranges are clamped to this, so spans and tick steps stay finite
_SUFFIXES = ("", "k", "M", "G", "T")
_NICE = (1.0, 2.0, 2.5, 5.0)
_TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
_DAY_S = 86400

# Braille dot bits by (half, dot row) in a 2 x 4 cell, and the mask of the dots of one half from dot
# row `top` to `bottom` inclusive: _RUN_MASK[half][top][bottom].
_DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_RUN_MASK = tuple(
    tuple(tuple(sum(bits[top : bottom + 1]) for bottom in range(4)) for top in range(4)) for bits in _DOT_BITS
)
_CELL_CHARS = (" ", *(chr(0x2800 + bits) for bits in range(1, 256)))


def format_number(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits (more where the integer part needs them), compactly:
    0.61, 41.8, 1.2e-4, 3.1k, 2.5M."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    digits = max(1, digits)
    if not 1e-3 <= abs(value) < 1e15:
        mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
        return f"{_strip_zeros(mantissa)}e{int(exponent)}"
    for power, suffix in enumerate(_SUFFIXES):
        scaled = value / 1000**power
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(scaled))))
        text = _strip_zeros(f"{scaled:.{decimals}f}")
        if abs(float(text)) < 1000 or power == len(_SUFFIXES) - 1:
            return text + suffix
    raise AssertionError("unreachable: the last suffix returns")


def _strip_zeros(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_elapsed(seconds: float, unit: Literal["s", "m", "h", "d"]) -> str:
    """A time offset for the x axis: `45s`, `12m`, `1:30` (h:mm) or `2d6h`, by the axis's unit."""
    sign = "-" if seconds < 0 else ""
    total = round(abs(seconds))
    minutes, secs = divmod(total, 60)
    hours, mins = divmod(minutes, 60)
    days, hrs = divmod(hours, 24)
    if unit == "s":
        text = f"{total}s" if total < 60 else f"{minutes}m{secs:02d}s"
    elif unit == "m":
        text = f"{minutes}m"
    elif unit == "h":
        text = f"{hours}:{mins:02d}"
    else:
        text = f"{days}d{hrs}h" if days and hrs else f"{hrs}h" if hrs else f"{days}d"
    return sign + text


# ---- the y scale -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _YFrame:
    """The y range in plotted units (log10 of the values on a log scale) over `dots` dot rows."""

    lo: float
    hi: float
    log: bool
    dots: int

    def rows(self, values: list[float]) -> list[int]:
        """The dot row of each value (0 at the top), clamped into the plot; <= 0 on a log scale: the
        bottom; NaN: -1. One pass over a list, as this is the render's hot path."""
        if self.log:
            values = [math.log10(v) if v > 0 else -math.inf if v == v else v for v in values]
        scale, bottom = (self.dots - 1) / (self.hi - self.lo), self.dots - 1
        top = self.hi + 0.5 / scale  # so that int() rounds to the nearest row
        return [
            int(y) if 0 <= y < bottom + 0.5 else -1 if y != y else 0 if y < 0 else bottom
            for y in [(top - v) * scale for v in values]
        ]


def _y_frame(
    y_range: tuple[float, float] | None, log: bool, layers: Sequence[Sequence[ColumnLike]], dots: int
) -> _YFrame | None:
    """The range to draw: the caller's, else the data's; on a log scale a floor <= 0 is raised to the
    smallest positive value; a range too narrow to label is widened around its middle."""
    lo = hi = math.nan
    if y_range is not None and math.isfinite(y_range[0]) and math.isfinite(y_range[1]):
        lo, hi = min(y_range), max(y_range)
    if math.isnan(lo) or (log and lo <= 0):
        data_lo, data_hi = _data_range(layers, positive=log)
        if math.isnan(lo) or hi <= 0:
            lo, hi = data_lo, data_hi
        else:
            lo = data_lo if data_lo < hi else hi
    if math.isnan(lo):
        return None
    lo, hi = min(max(lo, -_HUGE), _HUGE), min(max(hi, -_HUGE), _HUGE)
    if log:
        lo, hi = max(lo, 1e-300), max(hi, 1e-300)
        flat = hi <= lo * (1 + 1e-6)
        lo, hi = math.log10(lo), math.log10(hi)
    else:
        flat = hi - lo <= max(abs(lo), abs(hi)) * 1e-6 or hi - lo < 1e-300
    if flat:
        middle = (lo + hi) / 2
        pad = 0.1 if log else abs(middle) * 0.1 if abs(middle) > 1e-290 else 1.0
        # A flat line sits on a dot row, not between two, so values a hair apart draw as one line.
        lo, hi = middle - pad, middle + pad * dots / (dots - 2)
    return _YFrame(lo, hi, log, dots)


def _data_range(layers: Sequence[Sequence[ColumnLike]], positive: bool) -> tuple[float, float]:
    lo, hi = math.inf, -math.inf
    for columns in layers:
        for column in columns:
            for value in (column.lo, column.hi):
                if math.isfinite(value) and (value > 0 or not positive):
                    lo, hi = min(lo, value), max(hi, value)
    return (lo, hi) if lo <= hi else (math.nan, math.nan)


def _nice_steps(span: float, min_step: float) -> list[tuple[float, int]]:
    """Candidate tick steps (1, 2, 2.5, 5 x 10^e) around `span`, ascending, with the decimal position
    of each step's last significant digit."""
    top = math.floor(math.log10(span))
    steps = []
    for exponent in range(top - 3, top + 2):
        for nice in _NICE:
            step = nice * 10.0**exponent
            if step >= min_step:
                steps.append((step, exponent - 1 if nice == 2.5 else exponent))
    return steps


def _multiples(lo: float, hi: float, step: float) -> range:
    return range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)


def _tick_label(value: float, last_digit: int) -> str:
    if value == 0:
        return "0"
    return format_number(value, math.floor(math.log10(abs(value))) - last_digit + 1)


def y_ticks(lo: float, hi: float, rows: int, log: bool = False) -> list[tuple[int, str]]:
    """Labels for a y axis over `rows` text rows, top row = `hi`: (row, label), top to bottom, at
    most 5 and at most one a row. A log scale labels decades, or 1-2-5 steps over fewer than three."""
    frame = _y_frame((lo, hi), log, (), rows * 4)
    return [] if frame is None else _frame_ticks(frame, rows)


def _frame_ticks(frame: _YFrame, rows: int) -> list[tuple[int, str]]:
    most = min(_MAX_Y_LABELS, rows)
    ticks = _log_ticks(frame.lo, frame.hi, most) if frame.log else []
    if not ticks:
        lo, hi = (10**frame.lo, 10**frame.hi) if frame.log else (frame.lo, frame.hi)
        ticks = _linear_ticks(lo, hi, most, target=min(most, max(3, rows // 4)))
    placed: list[tuple[int, str]] = []
    for value, label in reversed(ticks):
        row = frame.rows([value])[0] // 4
        if not placed or row > placed[-1][0]:
            placed.append((row, label))
    return placed


def _linear_ticks(lo: float, hi: float, most: int, target: int) -> list[tuple[float, str]]:
    """Multiples of the nice step whose count is nearest `target` (at least 3 where `most` allows)."""
    best: tuple[int, float, int] | None = None
    for step, last_digit in _nice_steps(hi - lo, 0.0):
        count = len(_multiples(lo, hi, step))
        if 1 <= count <= most:
            score = abs(count - target) + (0 if count >= min(3, most) else 10)
            if best is None or score <= best[0]:
                best = (score, step, last_digit)
    if best is None:
        return []
    _, step, last_digit = best
    return [(k * step + 0.0, _tick_label(k * step, last_digit)) for k in _multiples(lo, hi, step)]


def _log_ticks(lo: float, hi: float, most: int) -> list[tuple[float, str]]:
    """Over log10 values [lo, hi]: the decades (every few when there are many), else 1-2-5 or 1-3
    steps; none when fewer than 3 of those fit."""
    decades = _multiples(lo, hi, 1.0)
    if len(decades) >= 3:
        every = math.ceil(len(decades) / most)
        return [(10.0**k, format_number(10.0**k, 1)) for k in decades if k % every == 0]
    for mantissas in ((1, 2, 5), (1, 3)):
        values = [
            m * 10.0**k
            for k in range(math.floor(lo), math.ceil(hi) + 1)
            for m in mantissas
            if lo - 1e-9 <= math.log10(m) + k <= hi + 1e-9
        ]
        if min(3, most) <= len(values) <= most:
            return [(v, format_number(v, 1)) for v in values]
    return []


# ---- the x scale -------------------------------------------------------------------------------


def _column_of(x: float, x0: float, x1: float, cols: int) -> int:
    """The column of `x` among `cols` equal slices of [x0, x1] (the metric store's slicing)."""
    position = (x - x0) / (x1 - x0) * cols if x1 > x0 else 0.0
    return int(position) if 0 <= position < cols else cols - 1 if position >= cols else 0


def x_ticks(
    x0: float, x1: float, cols: int, kind: XKind = "step", origin: float | None = None
) -> list[tuple[int, str]]:
    """Labels for an x axis of `cols` columns over [x0, x1]: (column, label), left to right, at least
    ~12 columns apart. Steps and rows are whole numbers (1k, 2.5k); times are offsets from `origin`
    (default x0) in seconds, minutes, h:mm or days by the span."""
    if cols < 1 or not math.isfinite(x1 - x0):
        return []
    base = x0 if origin is None else origin
    if x1 <= x0:
        label = format_elapsed(x0 - base, "s") if kind == "time" else format_number(x0, 6)
        return [(0, label)] if len(label) <= cols else []
    if kind == "time":
        reach = max(abs(x0 - base), abs(x1 - base))
        unit: Literal["s", "m", "h", "d"] = (
            "s" if reach < 120 else "m" if reach < 3600 else "h" if reach < 2 * _DAY_S else "d"
        )
        floor_s = {"s": 1, "m": 60, "h": 60, "d": 3600}[unit]
        candidates = [(float(s), 0) for s in _TIME_STEPS_S if s >= floor_s]
        candidates += [(step * _DAY_S, 0) for step, _ in _nice_steps((x1 - x0) / _DAY_S, 1.0)]
    else:
        candidates = [(step, last_digit) for step, last_digit in _nice_steps(x1 - x0, 1.0) if step.is_integer()]
    for step, last_digit in candidates:
        if (x1 - x0) / step > cols / 4:
            continue
        if kind == "time":
            ticks = [(base + k * step, format_elapsed(k * step, unit)) for k in _multiples(x0 - base, x1 - base, step)]
        else:
            ticks = [(k * step, _tick_label(k * step, last_digit)) for k in _multiples(x0, x1, step)]
        width = max((len(label) for _, label in ticks), default=0)
        if len(ticks) * max(width + 3, min(12, cols // 2)) <= cols or step == candidates[-1][0]:
            return _place_x_labels(ticks, x0, x1, cols)
    return []


def _label_start(column: int, label: str, cols: int) -> int:
    """Where a label centred under `column` starts, kept inside the axis (negative: it cannot fit)."""
    return min(max(column - len(label) // 2, 0), cols - len(label))


def _place_x_labels(ticks: list[tuple[float, str]], x0: float, x1: float, cols: int) -> list[tuple[int, str]]:
    """Each label centred under its tick, kept inside the axis; a label that would touch the previous
    one is dropped."""
    placed: list[tuple[int, str]] = []
    end = -2
    for value, label in ticks:
        column = _column_of(value, x0, x1, cols)
        start = _label_start(column, label, cols)
        if start >= 0 and start > end + 1:
            placed.append((column, label))
            end = start + len(label) - 1
    return placed


# ---- drawing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Merged:
    """Neighbouring columns merged into one by `_fit`."""

    lo: float
    hi: float
    last: float
    count: int
    nonfinite: int


def _fit(columns: Sequence[ColumnLike], cols: int) -> Sequence[ColumnLike]:
    """`columns` resliced to `cols` (when the caller's width differs from the plot's): neighbours are
    merged min/max, so a spike keeps its height, or repeated."""
    have = len(columns)
    if have == cols or have == 0:
        return columns
    fitted: list[ColumnLike] = []
    for i in range(cols):
        start = i * have // cols
        group = columns[start : max((i + 1) * have // cols, start + 1)]
        if len(group) == 1:
            fitted.append(group[0])
            continue
        finite = [c for c in group if math.isfinite(c.lo)]
        fitted.append(
            _Merged(
                min((c.lo for c in finite), default=math.nan),
                max((c.hi for c in finite), default=math.nan),
                finite[-1].last if finite else math.nan,
                sum(c.count for c in group),
                sum(c.nonfinite for c in group),
            )
        )
    return fitted


def _runs(columns: Sequence[ColumnLike], frame: _YFrame) -> tuple[list[int], list[int]]:
    """The dot-row run (top, bottom) of each half-column, top -1 where nothing is drawn."""
    n = len(columns)
    # On a log scale a column whose values are all <= 0 has nothing to draw (NaN), one with some: down to the bottom.
    top_rows = frame.rows([c.hi if c.hi > 0 or not frame.log else math.nan for c in columns])
    bottom_rows = frame.rows([c.lo for c in columns])
    exit_rows = frame.rows([c.last for c in columns])
    tops, bottoms = [-1] * (2 * n), [0] * (2 * n)
    exit_row = 0
    previous = -1  # the last drawn column, whose join to the next is still to draw
    for i, (top, bottom, last) in enumerate(zip(top_rows, bottom_rows, exit_rows, strict=True)):
        if top < 0 or bottom < 0:
            if previous >= 0 and columns[i].count:  # points, none drawable: the line breaks
                tops[2 * previous + 1] = bottoms[2 * previous + 1] = exit_row
                previous = -1
            continue
        tops[2 * i], bottoms[2 * i] = top, bottom
        if previous >= 0:
            # The right half of the previous column, and the empty columns between, join its last
            # value to the nearest point of this column, one dot row short of it (drawn here).
            entry = exit_row if top <= exit_row <= bottom else top if exit_row < top else bottom
            first = 2 * previous + 1
            span = 2 * i - first
            if span == 1:  # neighbours, the common case
                tops[first], bottoms[first] = (
                    (entry + 1, exit_row)
                    if entry < exit_row
                    else (exit_row, entry - 1)
                    if entry > exit_row
                    else (entry, entry)
                )
            for offset in range(span if span > 1 else 0):
                here = exit_row + round((entry - exit_row) * offset / span)
                there = exit_row + round((entry - exit_row) * (offset + 1) / span)
                tops[first + offset], bottoms[first + offset] = (
                    (there + 1, here) if there < here else (here, there - 1) if there > here else (here, here)
                )
        exit_row = last if last >= 0 else bottom
        previous = i
    if previous >= 0:
        tops[2 * previous + 1] = bottoms[2 * previous + 1] = exit_row
    return tops, bottoms


def _rasterize(
    tops: list[int], bottoms: list[int], layer: int, replaces: int, cols: int, cells: list[int], owner: list[int]
) -> None:
    """Adds the layer's dots and colours its cells; a cell owned by a layer below `replaces` (a raw
    curve, when drawing a series) is cleared first. Written out cell by cell: the render's hot path."""
    for x, (top, bottom) in enumerate(zip(tops, bottoms, strict=True)):
        if top < 0:
            continue
        masks = _RUN_MASK[x & 1]
        column, first_row, last_row = x >> 1, top >> 2, bottom >> 2
        index = first_row * cols + column
        if first_row == last_row:
            mask = masks[top & 3][bottom & 3]
            cells[index] = mask if owner[index] < replaces else cells[index] | mask
            owner[index] = layer
            continue
        mask = masks[top & 3][3]
        cells[index] = mask if owner[index] < replaces else cells[index] | mask
        owner[index] = layer
        mask = masks[0][3]
        for middle in range(index + cols, last_row * cols + column, cols):
            cells[middle] = mask if owner[middle] < replaces else cells[middle] | mask
            owner[middle] = layer
        index = last_row * cols + column
        mask = masks[0][bottom & 3]
        cells[index] = mask if owner[index] < replaces else cells[index] | mask
        owner[index] = layer


def plot_area(width: int, height: int, y_range: tuple[float, float] | None, log: bool = False) -> tuple[int, int]:
    """(columns, rows) of the plot inside a `width` x `height` chart: the length the series' columns
    should have. Pass the same `y_range` as to `render_plot` (the y labels' width depends on it)."""
    frame = _y_frame(y_range, log, (), 4 * max(1, height - _overhead(height)))
    return _layout(width, height, frame)[:2]


def _overhead(height: int) -> int:
    return (height >= 3) + (height >= 4) + (height >= 6)


def _layout(width: int, height: int, frame: _YFrame | None) -> tuple[int, int, int, list[tuple[int, str]]]:
    """(plot columns, plot rows, y-label width, y labels)."""
    rows = max(1, height - _overhead(height))
    labels = _frame_ticks(frame, rows) if frame is not None else []
    label_width = max((len(label) for _, label in labels), default=0)
    if labels and width - label_width - 2 >= _MIN_PLOT_WIDTH:
        return width - label_width - 2, rows, label_width, labels
    axis = 1 if width >= 2 else 0
    return max(1, width - axis), rows, 0, []


def render_plot(
    series: Sequence[PlotSeries],
    width: int,
    height: int,
    x_range: tuple[float, float] | None,
    x_kind: XKind = "step",
    y_range: tuple[float, float] | None = None,
    *,
    log: bool = False,
    marks: Sequence[Mark] = (),
    time_origin: float | None = None,
    styles: PlotStyles = PlotStyles(),
    no_data: str = "no data",
) -> Text:
    """The chart as `height` lines of `width` cells (nothing for a size below 1); `no_data`: what it says when
    there is no point at all.

    `x_range` is the x span the columns slice (None: no data yet); `x_kind` names the x axis and
    picks its labels (`time`: seconds, labelled from `time_origin`, default the range's start);
    `y_range` is the caller's (robust or not; values beyond it are drawn at the edge), None: the
    data's. NaN/inf points show as NONFINITE_GLYPH on the x axis at their column (a column of
    nothing else breaks the line); on a log scale, values <= 0 show as NONPOSITIVE_GLYPH and their
    column is drawn down to the bottom."""
    if width < 1 or height < 1:
        return Text()
    palette = styles.palette or ("",)
    named = [(s, s.style or palette[i % len(palette)]) for i, s in enumerate(series)]
    layers = [(s.raw, f"dim {style}") for s, style in named if s.raw is not None]
    raw_count = len(layers)
    layers += [(s.columns, style) for s, style in named]
    layer_columns = [columns for columns, _ in layers]
    layer_styles = [style for _, style in layers]
    rows = max(1, height - _overhead(height))
    frame = _y_frame(y_range, log, layer_columns, rows * 4)
    cols, rows, label_width, y_labels = _layout(width, height, frame)
    gutter = width - cols

    cells = [0] * (rows * cols)
    owner = [-1] * (rows * cols)
    nonfinite = [False] * cols
    nonpositive = [False] * cols
    for layer, columns in enumerate(layer_columns):
        fitted = _fit(columns, cols)
        if fitted:
            nonfinite = [seen or c.nonfinite > 0 for seen, c in zip(nonfinite, fitted, strict=True)]
            if log:
                nonpositive = [seen or c.lo <= 0 for seen, c in zip(nonpositive, fitted, strict=True)]
        if frame is not None and fitted:
            tops, bottoms = _runs(fitted, frame)
            _rasterize(tops, bottoms, layer, raw_count if layer >= raw_count else 0, cols, cells, owner)

    x_ok = x_range is not None and math.isfinite(x_range[0]) and math.isfinite(x_range[1])
    x0, x1 = x_range if x_range is not None and x_ok else (0.0, 0.0)
    mark_columns = {_column_of(m.x, x0, x1, cols): m for m in marks if x_ok and min(x0, x1) <= m.x <= max(x0, x1)}

    out = _Canvas()
    if height >= 3:
        out.line(_legend(named, styles, any(nonfinite), any(nonpositive), list(mark_columns.values())), width)
    label_at = dict(y_labels)
    note = "" if max(owner, default=-1) >= 0 else _empty_note(layer_columns, log, any(nonfinite), no_data)
    for row in range(rows):
        if gutter:
            label = label_at.get(row, "")
            out.add(" " * (label_width - len(label)) + label + " " * (gutter - 1 - label_width), styles.axis)
            out.add("┤" if row in label_at else "│", styles.axis)
        if note and row == rows // 2 and len(note) <= cols:
            start = (cols - len(note)) // 2
            out.add(" " * start, "")
            out.add(note, styles.note)
            out.add(" " * (cols - start - len(note)), "")
        else:
            _plot_row(
                out,
                cells[row * cols : (row + 1) * cols],
                owner[row * cols : (row + 1) * cols],
                layer_styles,
                mark_columns,
            )
        out.end_line()
    x_labels = x_ticks(x0, x1, cols, x_kind, time_origin) if x_ok and height >= 4 else []
    if height >= 4:
        _axis_line(out, gutter, cols, x_labels, nonfinite, nonpositive, mark_columns, styles)
    if height >= 6:
        _x_label_line(out, gutter, cols, x_labels, x_kind, styles)
    return out.text()


def _plot_row(
    out: _Canvas, cells: list[int], owner: list[int], layer_styles: list[str], marks: dict[int, Mark]
) -> None:
    """One row of the plot: runs of cells of one layer share a span; an empty cell under a mark shows
    the mark's dotted line."""
    cols = len(cells)
    column = 0
    while column < cols:
        layer = owner[column]
        if column in marks and layer < 0:
            out.add(_MARK_LINE, f"dim {marks[column].style}")
            column += 1
            continue
        if layer < 0:
            end = column + 1
            while end < cols and owner[end] < 0 and end not in marks:
                end += 1
            out.add(" " * (end - column), "")
            column = end
            continue
        end = column
        while end < cols and owner[end] == layer:
            end += 1
        out.add("".join([_CELL_CHARS[bits] for bits in cells[column:end]]), layer_styles[layer])
        column = end


def _empty_note(layers: Sequence[Sequence[ColumnLike]], log: bool, nonfinite: bool, no_data: str) -> str:
    """What an empty plot says about its data."""
    if nonfinite and math.isnan(_data_range(layers, positive=False)[0]):
        return "no finite values"
    if log and not math.isnan(_data_range(layers, positive=False)[0]):
        return "no values > 0 for a log scale"
    return no_data


def _legend(
    named: Sequence[tuple[PlotSeries, str]],
    styles: PlotStyles,
    nonfinite: bool,
    nonpositive: bool,
    marks: Sequence[Mark],
) -> Text:
    """Name and last value of each series (`(raw x)` beside a smoothed one, NONFINITE_GLYPH and the
    count of its NaN/inf points), then what the chart's glyphs mean."""
    legend = Text()
    for s, style in sorted(named, key=lambda entry: entry[0].background):
        if legend:
            legend.append("  ")
        legend.append("━ ", style=style)
        legend.append(f"{s.name} {_legend_value(s.columns)}")
        if s.raw is not None:
            legend.append(f" (raw {_legend_value(s.raw)})", style=styles.note)
        bad = sum(c.nonfinite for c in (s.raw if s.raw is not None else s.columns))
        if bad:
            legend.append(f" {NONFINITE_GLYPH}{bad}", style=styles.nonfinite)
    notes: list[tuple[str, str]] = []
    if nonfinite:
        notes.append((f"{NONFINITE_GLYPH} nan/inf", styles.nonfinite))
    if nonpositive:
        notes.append((f"{NONPOSITIVE_GLYPH} <=0", styles.nonfinite))
    for label in dict.fromkeys(m.label for m in marks):
        notes.append((f"{MARK_GLYPH} {label}", next(m.style for m in marks if m.label == label)))
    for note, style in notes:
        legend.append("  ")
        legend.append(note, style=style)
    return legend


def _legend_value(columns: Sequence[ColumnLike]) -> str:
    """The last finite value, or a dash when there is none."""
    for column in reversed(columns):
        if math.isfinite(column.last):
            return format_number(column.last, 4)
    return "-"


def _axis_line(
    out: _Canvas,
    gutter: int,
    cols: int,
    x_labels: list[tuple[int, str]],
    nonfinite: list[bool],
    nonpositive: list[bool],
    mark_columns: dict[int, Mark],
    styles: PlotStyles,
) -> None:
    """The x axis: ticks, then marks over them: a plateau over a tick, NaN/inf over everything."""
    glyphs = ["─"] * cols
    glyph_styles = [styles.axis] * cols
    for column, _ in x_labels:
        glyphs[column] = "┬"
    for column in range(cols):
        if nonpositive[column]:
            glyphs[column], glyph_styles[column] = NONPOSITIVE_GLYPH, styles.nonfinite
    for column, mark in mark_columns.items():
        glyphs[column], glyph_styles[column] = MARK_GLYPH, mark.style
    for column in range(cols):
        if nonfinite[column]:
            glyphs[column], glyph_styles[column] = NONFINITE_GLYPH, styles.nonfinite
    if gutter:
        out.add(" " * (gutter - 1) + "└", styles.axis)
    column = 0
    while column < cols:
        end = column
        while end < cols and glyph_styles[end] == glyph_styles[column]:
            end += 1
        out.add("".join(glyphs[column:end]), glyph_styles[column])
        column = end
    out.end_line()


def _x_label_line(
    out: _Canvas,
    gutter: int,
    cols: int,
    x_labels: list[tuple[int, str]],
    x_kind: XKind,
    styles: PlotStyles,
) -> None:
    """The x labels under their ticks, and the axis's name in the gutter when it fits."""
    name = x_kind if len(x_kind) <= gutter - 1 else ""
    out.add(" " * (gutter - 1 - len(name)) + name + " " if gutter else "", styles.axis)
    line = [" "] * cols
    for column, label in x_labels:
        start = _label_start(column, label, cols)
        line[start : start + len(label)] = label
    out.add("".join(line), styles.axis)
    out.end_line()


class _Canvas:
    """The chart's lines as one plain string and its style spans (cheaper than a Text per cell)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._spans: list[Span] = []
        self._length = 0

    def add(self, text: str, style: str) -> None:
        if style and text:
            self._spans.append(Span(self._length, self._length + len(text), style))
        self._parts.append(text)
        self._length += len(text)

    def line(self, text: Text, width: int) -> None:
        """A whole line from a Text, cut to `width` with an ellipsis and padded to it."""
        text = text.copy()
        text.truncate(width, overflow="ellipsis", pad=True)
        for span in text.spans:
            self._spans.append(Span(self._length + span.start, self._length + span.end, span.style))
        self.add(text.plain, "")
        self.end_line()

    def end_line(self) -> None:
        self._parts.append("\n")
        self._length += 1

    def text(self) -> Text:
        plain = "".join(self._parts)
        return Text(plain[:-1] if plain.endswith("\n") else plain, spans=self._spans)
