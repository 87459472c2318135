"""A run's metric history thinned for its charts, so that 100,000 rows of history are on screen in a fraction
of a second instead of streaming whole (4.2 s over the local link, more over SSH); the stream then carries only
what is new. Two views, both of the file's own rows, whole and in order, the newest points / RECENT_FRACTION all
kept as the console's store keeps its newest:

- coarse: the older rows sampled at even steps through the file, read without parsing the rest (milliseconds
  however long the history): the console's first look;
- full: the older rows thinned the way the console's store thins a series once it is full
  (`console/tui/metric_store.py`), which the console swaps in as soon as it comes: for each slice of the older
  rows, its first and last row and, for every series, the rows with its lowest and highest value and its first
  and last NaN/inf, so the curves' shape, their spikes, their y range and a divergence all stay. The slices are
  read in one pass at a fine grain and grouped once the series are known, so the view holds about `points` rows
  whatever the number of series.

Rows whose x is their arrival index (neither a step nor a time, as the first row decides) are never thinned: one
dropped would shift the x of every later one. Nor are rows that fit in `points`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from backends.fileio import last_lines_start, parse_record, shallow
from backends.protocol import METRIC_X_KEYS, MetricsResult, metric_number, metric_x

FINE_SLICES = 2048  # slices of the older rows in the one pass over them, grouped after
RECENT_FRACTION = 4  # the newest points / RECENT_FRACTION rows are kept whole, as the store keeps its newest
VIEW_BYTES = 4 * 1024 * 1024  # of the file's rows in one view: a reply far under protocol.MAX_LINE_BYTES
LONGEST_SAMPLED = 64 * 1024  # a line longer than this is no metric row: the coarse view passes it by
BLOCK = 1024 * 1024
MIN_VIEW_POINTS, MAX_VIEW_POINTS = 16, 65536  # what a client may ask for

Kept = tuple[int, dict[str, Any], int]  # a sampled row: its line's offset, the row, its line's bytes
Line = tuple[int, int]  # a line of the full view: its offset and bytes (newline included), read again at the end
Sized = TypeVar("Sized", bound=tuple[Any, ...])  # a row or a line, its bytes last


class _Slice:
    """What one fine slice of the older rows keeps: its first and last row; per series the lowest and highest
    finite value's rows and the first and last NaN/inf's rows."""

    __slots__ = ("first", "last", "series")

    def __init__(self, line: Line) -> None:
        self.first = self.last = line
        # name -> [lo, lo row, hi, hi row, first nonfinite row, last nonfinite row]
        self.series: dict[str, list[Any]] = {}


def metrics_view(
    path: Path, offset: int, points: int, *, coarse: bool = False, until: int | None = None
) -> MetricsResult | None:
    """The rows of `path` from `offset` to its last complete line (before `until` if given), thinned to about
    `points` rows; None when they need no thinning (at most `points` of them, or x is the arrival index) or the
    file is gone: the caller then reads them as they are, a frame at a time."""
    try:
        with open(path, "rb") as fh:
            lines, end = _count_lines(fh, offset, until)
            if lines <= points:
                return None
            if coarse:
                return _sampled(fh, offset, end, lines, points)
            return _thinned(fh, offset, end, lines, points)
    except FileNotFoundError:
        return None


def _count_lines(fh: IO[bytes], offset: int, until: int | None) -> tuple[int, int]:
    """Complete lines from `offset` (up to `until`) and the offset just past the last of them (a line still being
    written is left for the stream)."""
    fh.seek(offset)
    lines, end, at = 0, offset, offset
    while (until is None or at < until) and (block := fh.read(BLOCK if until is None else min(BLOCK, until - at))):
        count = block.count(b"\n")
        if count:
            lines += count
            end = at + block.rfind(b"\n") + 1
        at += len(block)
    return lines, end


def _lines(fh: IO[bytes], offset: int, end: int) -> Iterator[bytes]:
    fh.seek(offset)
    left, carry = end - offset, b""
    while left > 0 and (block := fh.read(min(BLOCK, left))):
        left -= len(block)
        parts = (carry + block).split(b"\n")  # on \n only: a stray \r inside a line must not make two of it
        carry = parts.pop()
        yield from parts


def _row(line: bytes) -> dict[str, Any] | None:
    """A line's metric row, or None for garbage."""
    try:
        row = parse_record(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and shallow(row) else None


def _sampled(fh: IO[bytes], offset: int, end: int, lines: int, points: int) -> MetricsResult | None:
    recent_start = last_lines_start(fh, end, points // RECENT_FRACTION, offset)
    recent, skipped = _parsed(fh, recent_start, end)
    span = recent_start - offset
    budget = VIEW_BYTES - sum(size for _, _, size in recent)
    count = min(points - len(recent), budget * max(1, lines - len(recent)) // max(1, span))  # lines of average size
    older: dict[int, Kept] = {}
    for j in range(count):
        at = offset + span * j // count
        fh.seek(at)
        if at > offset:
            fh.readline(LONGEST_SAMPLED)  # the rest of the line `at` fell in: the next one starts a row
        start = fh.tell()
        line = fh.readline(LONGEST_SAMPLED)
        if start >= recent_start or start in older:
            continue
        if (row := _row(line)) is None:
            skipped += 1
            continue
        older[start] = (start, row, len(line))
    sampled = list(older.values())
    while len(sampled) > 1 and sum(size for _, _, size in sampled) > budget:  # longer lines than most: fewer
        sampled = sampled[::2]
    rows = [row for _, row, _ in (*sampled, *recent)]
    if not rows or not _has_x(rows[0]):
        return None
    return {"rows": rows, "skipped": skipped, "next_offset": end, "thinned": True}


def _parsed(fh: IO[bytes], start: int, end: int) -> tuple[list[Kept], int]:
    """The rows of [start, end), the newest within VIEW_BYTES / 2, and the garbage lines among them."""
    rows: list[Kept] = []
    skipped, at = 0, start
    for line in _lines(fh, start, end):
        if line.strip():
            if (row := _row(line)) is None:
                skipped += 1
            else:
                rows.append((at, row, len(line) + 1))
        at += len(line) + 1
    return _newest_within(rows, VIEW_BYTES // 2), skipped


def _thinned(fh: IO[bytes], offset: int, end: int, lines: int, points: int) -> MetricsResult | None:
    recent_from = lines - points // RECENT_FRACTION
    slices: list[_Slice | None] = [None] * FINE_SLICES
    recent: list[Line] = []
    skipped, first, at = 0, True, offset
    # Lines, not rows, are kept while reading: 100,000 rows held as dicts took the agent's RSS from 30 to 65 MiB
    for index, text in enumerate(_lines(fh, offset, end)):
        line, at = (at, len(text) + 1), at + len(text) + 1
        if not text.strip():
            continue
        if (row := _row(text)) is None:
            skipped += 1
            continue
        if first and not _has_x(row):
            return None
        first = False
        if index >= recent_from:
            recent.append(line)
        else:
            _add(slices, index * FINE_SLICES // recent_from, line, row)
    recent = _newest_within(recent, VIEW_BYTES // 2)
    older = _fitting(slices, points - len(recent), VIEW_BYTES - sum(size for _, size in recent))
    rows = [row for line in sorted([*older.values(), *recent]) if (row := _read(fh, line)) is not None]
    return {"rows": rows, "skipped": skipped, "next_offset": end, "thinned": True}


def _read(fh: IO[bytes], line: Line) -> dict[str, Any] | None:
    fh.seek(line[0])
    return _row(fh.read(line[1]).rstrip(b"\n"))


def _fitting(slices: list[_Slice | None], rows: int, budget: int) -> dict[int, Line]:
    """The older rows kept with the fine slices in as many groups as fit in `rows` rows and `budget` bytes."""

    def fits(chosen: dict[int, Line]) -> bool:
        return len(chosen) <= rows and sum(size for _, size in chosen.values()) <= budget

    names = {name for s in slices if s is not None for name in s.series}
    groups = max(1, min(FINE_SLICES, rows // (2 + 4 * len(names))))  # each group's most rows: fits but for bytes
    chosen = _select(slices, groups)
    while groups > 1 and not fits(chosen):
        groups //= 2
        chosen = _select(slices, groups)
    while groups < FINE_SLICES and fits(more := _select(slices, min(FINE_SLICES, groups * 2))):
        groups, chosen = min(FINE_SLICES, groups * 2), more
    return chosen


def _has_x(row: dict[str, Any]) -> bool:
    """Whether the row has a step or a time for an x (as the console's store reads it), not just its index."""
    return any(metric_x(row.get(key)) is not None for key in METRIC_X_KEYS)


def _add(slices: list[_Slice | None], at: int, line: Line, row: dict[str, Any]) -> None:
    piece = slices[at]
    if piece is None:
        piece = slices[at] = _Slice(line)
    piece.last = line
    for name, value in row.items():
        if name in METRIC_X_KEYS:
            continue
        y = metric_number(name, value)
        if y is None:
            continue
        marks = piece.series.get(name)
        if marks is None:
            marks = piece.series[name] = [math.inf, None, -math.inf, None, None, None]
        if y - y != 0.0:  # NaN or an infinity
            if marks[4] is None:
                marks[4] = line
            marks[5] = line
            continue
        if y < marks[0]:
            marks[0], marks[1] = y, line
        if y > marks[2]:
            marks[2], marks[3] = y, line


def _select(slices: list[_Slice | None], groups: int) -> dict[int, Line]:
    """The older rows kept with the fine slices grouped into `groups`: each group's first and last row, and per
    series its lowest, highest, first and last NaN/inf rows."""
    chosen: dict[int, Line] = {}
    for g in range(groups):
        members = [s for s in slices[g * FINE_SLICES // groups : (g + 1) * FINE_SLICES // groups] if s is not None]
        if not members:
            continue
        merged: dict[str, list[Any]] = {}
        for piece in members:
            for name, marks in piece.series.items():
                into = merged.get(name)
                if into is None:
                    merged[name] = list(marks)
                    continue
                if marks[1] is not None and marks[0] < into[0]:
                    into[0], into[1] = marks[0], marks[1]
                if marks[3] is not None and marks[2] > into[2]:
                    into[2], into[3] = marks[2], marks[3]
                if into[4] is None:
                    into[4] = marks[4]
                if marks[5] is not None:
                    into[5] = marks[5]
        marked = (kept for marks in merged.values() for kept in (marks[1], marks[3], marks[4], marks[5]))
        for kept in (members[0].first, members[-1].last, *marked):
            if kept is not None:
                chosen[kept[0]] = kept
    return chosen


def _newest_within(rows: list[Sized], budget: int) -> list[Sized]:
    """The newest of `rows` whose lines together fit in `budget` bytes."""
    total = 0
    for i in range(len(rows) - 1, -1, -1):
        total += rows[i][-1]
        if total > budget:
            return rows[i + 1 :]
    return rows
