"""A run's metric series as the charts read them: every point kept, and what each screen column of a curve
covers (min, max, last value, point count, NaN/inf count) answered from a min/max pyramid in O(width * log n),
so a redraw costs the same for a hundred points or ten million.

Memory: a point costs 24 bytes (its x, its y and its smoothed y, as C doubles) plus about 3 bytes of pyramid
and smoothing checkpoints, so a million points of one series take about 27 MB, 28 MB as measured by
benchmarks/chart_redraw.py (`array` over-allocates while growing). A console left open for days would hold
every point of every run it followed, so a run's series keep at most MAX_POINTS each: past that, the older
points are thinned (`Series.thin`) to their lowest and highest (and first and last NaN/inf) in each of
MAX_POINTS / 8 slices of their x range (and thinned again after MAX_POINTS / 2 more), so the curve's shape,
its spikes and its y range stay while old history coarsens with age, as a chart a few hundred columns wide
shows it anyway.
Pure Python on purpose: the console installs without numpy.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

from backends.protocol import METRIC_X_KEYS, Metric, MetricRow, NonfiniteValue, metric_number, metric_x
from console.visible import printable

DEFAULT_SMOOTHING = 0.6  # TensorBoard's default weight
WARMUP_FRACTION = 0.05  # the robust y range leaves out this much of the start of a curve
MAX_POINTS = 4096  # of a series in a run's store: ~110 kB, for a chart a few hundred columns wide
RECENT_FRACTION = 4  # a thinned series keeps its last 1/4 of MAX_POINTS whole, its older points 2 in each of 1/8

_SHIFT = 4
_FAN = 1 << _SHIFT  # values per block of the pyramid's first level, blocks per block of the next ones
_MASK = _FAN - 1
_INF = math.inf
_NAN = math.nan


@dataclass(frozen=True, slots=True)
class Column:
    """What one screen column covers of one series."""

    lo: float  # min of the finite y values in it (nan if none)
    hi: float  # max of the finite y values (nan if none)
    last: float  # the last finite y value in it (nan if none)
    count: int  # points in it
    nonfinite: int  # NaN/inf points in it (drawn as gap markers)


_EMPTY = Column(_NAN, _NAN, _NAN, 0, 0)


def column_edges(x0: float, x1: float, width: int) -> list[float]:
    """The `width + 1` edges of `width` equal slices of [x0, x1]: column j holds the points with
    edges[j] <= x < edges[j + 1], the last column also those at x1. With x0 == x1 every edge is x0, so
    the points at x0 fall in the last column."""
    return list(_edges(x0, x1, width))


@lru_cache(maxsize=8)
def _edges(x0: float, x1: float, width: int) -> tuple[float, ...]:
    """`column_edges`, once per chart redraw rather than once per curve (a chart of 9 curves asked 18 times)."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    if not (math.isfinite(x0) and math.isfinite(x1) and x0 <= x1):
        raise ValueError(f"x range must be finite with x0 <= x1, got [{x0}, {x1}]")
    span = x1 - x0
    return (*(min(x0 + span * j / width, x1) for j in range(width)), x1)


class _Pyramid:
    """The min and max of the finite values of a sequence by blocks of 16, 256, 4096... values.

    Level k holds the complete blocks of 16**(k+1) values only, as (+inf, -inf) where a block has no finite
    value; a range's incomplete ends are read one level down, down to the values themselves.
    """

    __slots__ = ("maxs", "mins", "values")

    def __init__(self) -> None:
        self.values: array[float] = array("d")
        self.mins: list[array[float]] = []
        self.maxs: list[array[float]] = []

    def close_block(self, has_nonfinite: bool) -> None:
        """The last 16 values just made a block: it goes up a level, and every block it completes above too."""
        block = self.values[-_FAN:]
        if has_nonfinite:
            finite = [v for v in block if v - v == 0.0]  # false for NaN and inf
            lo, hi = (min(finite), max(finite)) if finite else (_INF, -_INF)
        else:
            lo, hi = min(block), max(block)
        level = 0
        while True:
            if level == len(self.mins):
                self.mins.append(array("d"))
                self.maxs.append(array("d"))
            mins, maxs = self.mins[level], self.maxs[level]
            mins.append(lo)
            maxs.append(hi)
            if len(mins) & _MASK:
                return
            lo, hi = min(mins[-_FAN:]), max(maxs[-_FAN:])
            level += 1

    def rebuild(self, values: array[float], dirty: list[int]) -> None:
        """Every level again over `values`; `dirty`: the blocks of 16 that hold a NaN/inf (ascending)."""
        self.values = values
        self.mins, self.maxs = [], []
        whole = len(values) >> _SHIFT << _SHIFT
        mins = array("d", map(min, *[iter(values[:whole])] * _FAN))  # C loops: a rebuild is a few ms
        maxs = array("d", map(max, *[iter(values[:whole])] * _FAN))
        for block in dirty:
            if block < len(mins):
                finite = [v for v in values[block << _SHIFT : (block + 1) << _SHIFT] if v - v == 0.0]
                mins[block], maxs[block] = (min(finite), max(finite)) if finite else (_INF, -_INF)
        while mins:
            self.mins.append(mins)
            self.maxs.append(maxs)
            whole = len(mins) >> _SHIFT << _SHIFT
            mins = array("d", map(min, *[iter(mins[:whole])] * _FAN))
            maxs = array("d", map(max, *[iter(maxs[:whole])] * _FAN))

    def truncate(self, n: int) -> None:
        del self.values[n:]
        for level, (mins, maxs) in enumerate(zip(self.mins, self.maxs, strict=True)):
            keep = n >> (_SHIFT * (level + 1))
            del mins[keep:]
            del maxs[keep:]
        while self.mins and not self.mins[-1]:
            self.mins.pop()
            self.maxs.pop()

    def extent(self, a: int, b: int, clean: bool) -> tuple[float, float]:
        """Min and max of the finite values in [a, b) (+inf, -inf if none); `clean`: none there is NaN/inf.

        Per level at most two runs of fewer than 16 entries each are read (by C loops over slices), so a
        range costs O(log n) whatever its length.
        """
        values = self.values
        up, down = (a + _MASK) >> _SHIFT, b >> _SHIFT
        if up >= down:  # no whole block inside: read it all here
            left, right = values[a:b], values[:0]
        else:
            left, right = values[a : up << _SHIFT], values[down << _SHIFT : b]
        if clean:
            lo, hi = min((_INF, *left, *right)), max((-_INF, *left, *right))
        else:
            finite = [v for v in (*left, *right) if v - v == 0.0]
            lo, hi = min(finite, default=_INF), max(finite, default=-_INF)
        if up >= down:
            return lo, hi
        level = 0
        while True:
            a, b = up, down
            mins, maxs = self.mins[level], self.maxs[level]
            up, down = (a + _MASK) >> _SHIFT, b >> _SHIFT
            if up >= down:  # always so on the top level, which holds fewer than 16 blocks
                return min((lo, *mins[a:b])), max((hi, *maxs[a:b]))
            cut_up, cut_down = up << _SHIFT, down << _SHIFT
            lo = min((lo, *mins[a:cut_up], *mins[cut_down:b]))
            hi = max((hi, *maxs[a:cut_up], *maxs[cut_down:b]))
            level += 1


class Series:
    """One named curve: its points in append order (x non-decreasing), their TensorBoard-style smoothed
    values, and a min/max pyramid over each, so `columns()` never reads every point.

    Smoothing is TensorBoard's debiased exponential moving average: finite values only, each smoothed value
    is ema / (1 - weight ** finite_count), and a NaN/inf point stays itself. It is kept at append time.
    """

    __slots__ = (
        "_cap",
        "_ckpt_ema",
        "_ckpt_finite",
        "_ema",
        "_finite",
        "_keep",
        "_nf_before",
        "_nf_end",
        "_nf_start",
        "_raw",
        "_slice",
        "_smooth",
        "_thinned",
        "_xs",
        "name",
        "smoothing",
    )

    def __init__(self, name: str, smoothing: float = DEFAULT_SMOOTHING, cap: int | None = None) -> None:
        """`cap`: the most points it keeps, the older ones thinned past it (see `thin`); None: every point."""
        self.name = name
        self._cap = cap
        self._slice: float | None = None  # the x width of the slices its thinned points stand for
        self._thinned = 0  # how many points lead it thinned (see `thin`)
        self.smoothing = _weight(smoothing)
        self._keep = 1.0 - smoothing
        self._xs: array[float] = array("d")
        self._raw = _Pyramid()
        self._smooth = _Pyramid()
        # The NaN/inf points as maximal runs [start, end) of indices, and how many came before each run:
        # a column's count and its last finite value come from a binary search here, and a curve with
        # no such point pays nothing.
        self._nf_start: array[int] = array("q")
        self._nf_end: array[int] = array("q")
        self._nf_before: array[int] = array("q")
        # The moving average (TensorBoard's `last`) and its count of finite values; a copy at every 16th
        # point, so that truncating replays at most 15 points.
        self._ema = 0.0
        self._finite = 0
        self._ckpt_ema: array[float] = array("d")
        self._ckpt_finite: array[int] = array("q")

    def __len__(self) -> int:
        return len(self._xs)

    def __repr__(self) -> str:
        return f"Series({self.name!r}, {len(self._xs)} points)"

    @property
    def x_range(self) -> tuple[float, float] | None:
        return (self._xs[0], self._xs[-1]) if self._xs else None

    @property
    def last(self) -> tuple[float, float] | None:
        """The last point, (x, y), its y as given (NaN/inf included)."""
        return (self._xs[-1], self._raw.values[-1]) if self._xs else None

    @property
    def nonfinite(self) -> int:
        """How many of the points are NaN/inf."""
        return self._nonfinite_before(len(self._xs))

    def points(self) -> Iterator[tuple[float, float]]:
        """Every point, (x, y), in order: O(n), for export and checks, never for a redraw."""
        return zip(self._xs, self._raw.values, strict=True)

    def append(self, x: float, y: float) -> None:
        """Add a point; an x lower than the last one first drops every point at or after x (a resumed run
        repeats its steps: TensorBoard's purge on restart). O(1) amortised, O(log n) when it truncates."""
        if x - x != 0.0:
            raise ValueError(f"{self.name}: x must be finite, got {x}")
        xs = self._xs
        if xs and x < xs[-1]:
            self._truncate(bisect_left(xs, x))
        i = len(xs)
        xs.append(x)
        self._raw.values.append(y)
        if y - y == 0.0:
            self._ema = self._ema * self.smoothing + self._keep * y
            self._finite += 1
            self._smooth.values.append(self._ema / (1.0 - self.smoothing**self._finite))
        else:
            self._smooth.values.append(y)
            self._mark_nonfinite(i)
        if not (i + 1) & _MASK:
            dirty = bool(self._nf_end) and self._nf_end[-1] > i + 1 - _FAN
            self._raw.close_block(dirty)
            self._smooth.close_block(dirty)
            self._ckpt_ema.append(self._ema)
            self._ckpt_finite.append(self._finite)
        if self._cap is not None and i + 1 >= self._cap:
            self.thin(len(xs) - self._cap // RECENT_FRACTION, self._cap // (2 * RECENT_FRACTION))

    def columns(self, x0: float, x1: float, width: int, *, smoothed: bool = False) -> list[Column]:
        """`width` equal x-slices of [x0, x1] (see `column_edges`), each with exactly the min/max/last of the
        finite y values whose x falls in it, its point count and its NaN/inf count. O(width * log n)."""
        edges = _edges(x0, x1, width)
        xs = self._xs
        cuts = [bisect_left(xs, edge) for edge in edges[:-1]]
        cuts.append(bisect_right(xs, x1))
        pyramid = self._smooth if smoothed else self._raw
        values = pyramid.values
        extent = pyramid.extent
        out: list[Column] = []
        if not self._nf_start:  # the common case: no NaN/inf anywhere
            for a, b in pairwise(cuts):
                if a == b:
                    out.append(_EMPTY)
                else:
                    lo, hi = extent(a, b, True)
                    out.append(Column(lo, hi, values[b - 1], b - a, 0))
            return out
        before = [self._nonfinite_before(cut) for cut in cuts]
        for j in range(width):
            a, b = cuts[j], cuts[j + 1]
            nonfinite = before[j + 1] - before[j]
            if a == b:
                out.append(_EMPTY)
            elif nonfinite == b - a:
                out.append(Column(_NAN, _NAN, _NAN, b - a, nonfinite))
            else:
                lo, hi = extent(a, b, not nonfinite)
                out.append(Column(lo, hi, values[self._last_finite(b)], b - a, nonfinite))
        return out

    def y_range(self, robust: bool = False, *, smoothed: bool = False) -> tuple[float, float] | None:
        """(min, max) of the finite y values; None if there is none. O(log n).

        robust=True leaves out the first 5% of the points (at least one, when there are two or more): the
        warm-up, whose spike would flatten the rest of a curve. Later spikes stay in: they are news. If
        nothing finite is left after the warm-up, the whole curve's range is given.
        """
        n = len(self._xs)
        start = max(1, int(n * WARMUP_FRACTION)) if robust and n > 1 else 0
        pyramid = self._smooth if smoothed else self._raw
        for a in (start, 0) if start else (0,):
            nonfinite = self._nonfinite_before(n) - self._nonfinite_before(a)
            if nonfinite < n - a:
                return pyramid.extent(a, n, not nonfinite)
        return None

    def _nonfinite_before(self, i: int) -> int:
        """How many NaN/inf points have an index below i."""
        run = bisect_left(self._nf_start, i) - 1
        if run < 0:
            return 0
        return self._nf_before[run] + min(self._nf_end[run], i) - self._nf_start[run]

    def _last_finite(self, b: int) -> int:
        """The index of the last finite point below b (-1 if none)."""
        i = b - 1
        run = bisect_right(self._nf_start, i) - 1
        if run >= 0 and self._nf_end[run] > i:
            return self._nf_start[run] - 1  # runs are maximal: the point before one is finite
        return i

    def thin(self, old: int, buckets: int) -> None:
        """The first `old` points thinned to slices of their x range, at most `buckets` of them: of each slice, its
        lowest and highest finite points and its first and last NaN/inf, in order (and the very first point, where
        the curve starts); the rest kept whole. Slices of x rather than runs of points, so a curve thinned again
        and again keeps the same density over all its history. Only the points aged since the last thinning are
        read, at the same slice width, until the history outgrows `buckets` slices of it (or slices split between
        thinnings add up): then every old point again, at twice the width. Every smoothed value kept is the one
        it had. A column of old history counts the points kept; its extent is exact wherever slices do not
        straddle its edges. O(n) with C loops, the loop in Python over the newly aged slices only."""
        xs, raw, smooth = self._xs, self._raw.values, self._smooth.values
        x0 = xs[0]
        span = xs[old - 1] - x0
        width, start = self._slice, self._thinned
        if width is None or span > width * buckets or start > 3 * buckets:
            width = max(width or 0.0, span / buckets) or 1.0
            if self._slice is not None and span > self._slice * buckets:
                width = max(width, 2 * self._slice)  # doubling: a wider slice each time, not one a step wider
            start = 0
        kept: list[int] = [] if start else [0]
        at = start
        while at < old:
            slot = int((xs[at] - x0) / width)
            end = bisect_left(xs, x0 + (slot + 1) * width, at + 1, old)
            block = raw[at:end]
            if self._nonfinite_before(end) == self._nonfinite_before(at):
                picks = {block.index(min(block)), block.index(max(block))}
            else:
                finite = [j for j, v in enumerate(block) if v - v == 0.0]
                bad = [j for j, v in enumerate(block) if v - v != 0.0]
                picks = {bad[0], bad[-1]}
                if finite:
                    picks |= {min(finite, key=block.__getitem__), max(finite, key=block.__getitem__)}
            kept += [at + j for j in sorted(picks) if at + j]
            at = end
        self._slice, self._thinned = width, start + len(kept)
        kept = [*range(start), *kept, *range(old, len(xs))]
        new_xs = array("d", map(xs.__getitem__, kept))
        new_raw = array("d", map(raw.__getitem__, kept))
        new_smooth = array("d", map(smooth.__getitem__, kept))
        self._xs = new_xs
        # The checkpoints as the moving average stood at each new block's end: smoothed = ema / (1 - w**n).
        if not self._nf_start:  # no NaN/inf anywhere (the common case): every point is finite, no loop per point
            ends = range(_FAN, len(new_raw) + 1, _FAN)
            self._ckpt_finite = array("q", ends)
            self._ckpt_ema = array("d", (new_smooth[n - 1] * (1.0 - self.smoothing**n) for n in ends))
            self._raw.rebuild(new_raw, [])
            self._smooth.rebuild(new_smooth, [])
            return
        self._nf_start, self._nf_end, self._nf_before = array("q"), array("q"), array("q")
        self._ckpt_ema, self._ckpt_finite = array("d"), array("q")
        dirty: list[int] = []
        seen, last = 0, 0.0
        for i, y in enumerate(new_raw):
            if y - y == 0.0:
                seen += 1
                last = new_smooth[i]
            else:
                self._mark_nonfinite(i)
                if not dirty or dirty[-1] != i >> _SHIFT:
                    dirty.append(i >> _SHIFT)
            if not (i + 1) & _MASK:
                self._ckpt_ema.append(last * (1.0 - self.smoothing**seen) if seen else 0.0)
                self._ckpt_finite.append(seen)
        self._raw.rebuild(new_raw, dirty)
        self._smooth.rebuild(new_smooth, dirty)

    def _mark_nonfinite(self, i: int) -> None:
        """Point i, the newest, is NaN/inf: it extends the last run of such points or starts one."""
        if self._nf_end and self._nf_end[-1] == i:
            self._nf_end[-1] = i + 1
        else:
            self._nf_before.append(self._nonfinite_before(i))
            self._nf_start.append(i)
            self._nf_end.append(i + 1)

    def _truncate(self, n: int) -> None:
        """Keep the first n points only."""
        self._thinned = min(self._thinned, n)
        del self._xs[n:]
        self._raw.truncate(n)
        self._smooth.truncate(n)
        runs = bisect_left(self._nf_start, n)
        del self._nf_start[runs:]
        del self._nf_end[runs:]
        del self._nf_before[runs:]
        if runs and self._nf_end[-1] > n:
            self._nf_end[-1] = n
        blocks = n >> _SHIFT
        del self._ckpt_ema[blocks:]
        del self._ckpt_finite[blocks:]
        self._ema, self._finite = (self._ckpt_ema[-1], self._ckpt_finite[-1]) if blocks else (0.0, 0)
        for y in self._raw.values[blocks << _SHIFT :]:  # the same arithmetic as `append`: the same values
            if y - y == 0.0:
                self._ema = self._ema * self.smoothing + self._keep * y
                self._finite += 1


def _weight(smoothing: float) -> float:
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    return smoothing


class MetricStore:
    """All the series of one run, fed its metric rows in arrival order.

    The x of a row is its `step`, else its time `t` (serve runs), else its arrival index (extraction): which
    one is fixed by the first row (`x_label`), and a later row without it takes the x of the row before.
    `step` and `t` are x axes, never series. Each series purges on its own when its x goes back (a resumed
    run), so an eval row never removes a training point, even one logged late with an older step.
    A series is named as it is shown (`printable`): a run's metric name reaches every title, legend and picker
    that names it already made safe for the terminal.
    """

    def __init__(self, smoothing: float = DEFAULT_SMOOTHING, cap: int | None = MAX_POINTS) -> None:
        """`cap`: the most points each series keeps (see `Series.thin`); None: every point."""
        self.smoothing = _weight(smoothing)  # refused now, not at the first row
        self.cap = cap
        self.x_label = "step"
        self._x_key: str | None = None  # "" when x is the arrival index
        self._x = 0.0
        self._rows = 0
        self._series: dict[str, Series] = {}
        # The first NaN or infinite value fed, with its row's step: news, said once (found here, in the one pass
        # over the values that feeds the series, rather than in a second one over every row)
        self.first_nonfinite: NonfiniteValue | None = None

    def add_row(self, row: MetricRow) -> set[str]:
        """Add a row's numbers to their series; the names that got a point."""
        arrival = self._rows
        self._rows += 1
        if self._x_key is None:
            self._x_key = next((key for key in METRIC_X_KEYS if metric_x(row.get(key)) is not None), "")
            self.x_label = {Metric.STEP: "step", Metric.TIME: "time", "": "row"}[self._x_key]
        if not self._x_key:
            self._x = float(arrival)
        elif (x := metric_x(row.get(self._x_key))) is not None:
            self._x = x
        got: set[str] = set()
        for written, value in row.items():
            if written in METRIC_X_KEYS:
                continue
            name = printable(written)
            y = metric_number(name, value)
            if y is None:
                continue
            series = self._series.get(name)
            if series is None:
                series = self._series[name] = Series(name, self.smoothing, self.cap)
            series.append(self._x, y)
            got.add(name)
            if y - y != 0.0 and self.first_nonfinite is None:
                step = row.get(Metric.STEP)
                self.first_nonfinite = {
                    "metric": written,
                    "step": step if isinstance(step, int) else None,
                    "value": str(y),
                }
        return got

    @property
    def rows(self) -> int:
        """How many rows it was fed."""
        return self._rows

    def names(self) -> list[str]:
        """The series' names in first-seen order."""
        return list(self._series)

    def series(self, name: str) -> Series | None:
        return self._series.get(name)
