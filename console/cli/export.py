"""A run's metric rows taken elsewhere: as CSV (`metrics RUN --csv`) and as TensorBoard event files
(`export RUN --tensorboard DIR`), written on the console's machine.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.protocol import Metric, MetricRow, nonfinite_spelled

# Our names as SpecForge names them where both have the series (its TensorboardTracker writes add_scalar(key)
# with the keys of specforge/training/tracking.py's training_metric_names, `train/` before a training key, and of
# specforge/eval/evaluator.py, `eval/...`; read in SpecForge a6b6b02, 2026-08), so that an export sits beside a
# SpecForge run's own curves. Names SpecForge has no series for keep ours. backends.runs.metrics_sources reads
# these tags back to our names.
SPECFORGE_TAGS: dict[str, str] = {
    Metric.LOSS: "train/loss",
    Metric.LR: "train/lr",
    Metric.GRAD_NORM: "train/grad_norm",
    Metric.VAL_LOSS: "eval/avg_loss",
    Metric.VAL_ACC: "eval/avg_acc",
    Metric.VAL_SIM_ACCEPT_LEN: "eval/simulated_acc_len",
}
SPECFORGE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(acc|ploss)_(\d+)"), r"train/\1_\2"),
    (re.compile(r"epoch_(acc|ploss)_(\d+)"), r"train/epoch_\1_\2"),
    # SpecForge v0.2.0's per-position evaluation tags (its 2026 evaluator adds eval/acceptance_rate_i).
    (re.compile(r"val_(acc|ploss|acceptance_rate)_(\d+)"), r"eval/\1_\2"),
)
# What places a row rather than being one of its series: the x axis (step) and the wall time (t).
NOT_SERIES = frozenset({Metric.STEP, Metric.TIME})

STEP_LIMIT = 2**63  # a TensorBoard step is a signed 64-bit integer
EVENT_FILES = "events.out.tfevents.*"
TENSORBOARD_MISSING = (
    "TensorBoard is not installed where the console runs: pip install tensorboard "
    "(pipx: pipx inject eagle3-console tensorboard), then export again"
)


class ExportError(Exception):
    """An export that cannot be done; the message is one line saying what to do."""


def csv_text(rows: Sequence[MetricRow]) -> str:
    """Every row, one column per name seen (in the order first seen), the header first, an empty cell where a row
    lacks the name. Numbers read as JSON wrote them (json.dumps: the shortest text that reads back the same)."""
    columns = csv_columns(rows)
    return csv_lines([columns]) + csv_lines(csv_row(row, columns) for row in rows)


def csv_columns(rows: Sequence[MetricRow]) -> list[str]:
    """The names the rows hold, in the order first seen: a CSV's header."""
    return list(dict.fromkeys(name for row in rows for name in row))


def csv_row(row: MetricRow, columns: Sequence[str]) -> list[str]:
    """A row's cells under `columns`, an empty one where the row lacks the name (names beyond them left out)."""
    return [csv_cell(row[name]) if name in row else "" for name in columns]


def csv_lines(lines: Iterable[Sequence[str]]) -> str:
    """Lines of cells as CSV text. RFC 4180's line ends (csv's own): with "\n" alone a text cell holding a lone "\r"
    would go unquoted and end its row early for every reader."""
    out = io.StringIO()
    csv.writer(out).writerows(lines)
    return out.getvalue()


def csv_cell(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def tensorboard_tag(name: str) -> str:
    """The tag a metric gets: SpecForge's where it has the series, else our own name."""
    if name in SPECFORGE_TAGS:
        return SPECFORGE_TAGS[name]
    for pattern, replacement in SPECFORGE_PATTERNS:
        if pattern.fullmatch(name):
            return pattern.sub(replacement, name)
    return name


def scalar_value(value: object) -> float | None:
    """A series' value as a scalar: a number, NaN and the infinities too (as numbers, or as the protocol spells
    them), an int beyond a double as an infinity, true/false as 1/0; None for what is not a number (text,
    lists)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    return nonfinite_spelled(value)


def axis_value(value: object) -> float | None:
    """A step or a time: a finite number, not true/false."""
    number = None if isinstance(value, bool) else scalar_value(value)
    return number if number is not None and math.isfinite(number) else None


def tensorboard_step(row: MetricRow, number: int) -> int | None:
    """Where a row stands on TensorBoard's step axis: its step, else (as a server's rows) its place among the
    rows, counted from 0; None when its step is beyond what a TensorBoard step holds (a 64-bit integer)."""
    step = axis_value(row.get(Metric.STEP))
    at = number if step is None else int(step)
    return at if -STEP_LIMIT <= at < STEP_LIMIT else None


@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    wall_time: float
    value: float


def points(rows: Sequence[MetricRow]) -> Iterator[Point]:
    """Each number of each row as a point of its tag, at the row's `tensorboard_step` (a row that has none is left
    out) and the row's time (`t`, else now)."""
    now = time.time()
    for number, row in enumerate(rows):
        at, when = tensorboard_step(row, number), axis_value(row.get(Metric.TIME))
        if at is None:
            continue
        wall_time = now if when is None else when
        for name, value in row.items():
            scalar = None if name in NOT_SERIES else scalar_value(value)
            if scalar is not None:
                yield Point(tensorboard_tag(name), at, wall_time, scalar)


def unplaced(rows: Sequence[MetricRow]) -> int:
    """How many rows have a step TensorBoard cannot hold, and so no place in an export."""
    return sum(tensorboard_step(row, number) is None for number, row in enumerate(rows))


def write_tensorboard(rows: Sequence[MetricRow], folder: Path, run_id: str) -> tuple[Path, int]:
    """Write the rows' points into a new event file in `folder` (made if missing) with TensorBoard's own writer, one
    scalar tag per metric; the file and the number of points. ExportError when TensorBoard is not installed."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise ExportError(TENSORBOARD_MISSING) from None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        before = set(folder.glob(f"{EVENT_FILES}.{run_id}"))
        writer = EventFileWriter(str(folder), filename_suffix=f".{run_id}")
    except OSError as exc:
        said = exc.strerror or str(exc)
        raise ExportError(f"cannot write event files into {folder}: {said}; choose another DIR") from None
    count = 0
    try:
        for point in points(rows):
            summary = Summary(value=[Summary.Value(tag=point.tag, simple_value=point.value)])
            writer.add_event(Event(wall_time=point.wall_time, step=point.step, summary=summary))
            count += 1
    finally:
        writer.close()
    # The writer does not say its file's name; its name starts with the time it was made.
    return max(set(folder.glob(f"{EVENT_FILES}.{run_id}")) - before), count
