"""The GPU panel: each GPU's utilisation and memory now (bars and numbers) and over the last minutes
(sparklines), with the selected run's GPUs and processes marked. It keeps what the status polls sent and
renders only that; `gpu_text` is the drawing, a pure function of the samples, the width and the selection."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.events import Resize
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import Static

from backends.protocol import GpuInfo, GpuProcess, InferredHolder, RunInfo, StatusResult
from console.render import inferred_note
from console.visible import printable
from themes import signals

WINDOW_S = 300.0  # what a sparkline spans
# A sample stands for the time until the next one, at most this long (1.5 of the app's 2 s polls): a longer
# silence is a lost poll, drawn as a gap.
SAMPLE_HOLD_S = 3.0
MAX_SAMPLES = 1024  # each GPU's history stays bounded however fast it is fed (5 min at 2 s is 150 samples)
SPARKS = "▁▂▃▄▅▆▇█"
GAP = " "
BAR_CELLS = 12
MIN_BAR = 4
MIN_SPARK = 8  # narrower, and a compact line gives up its optional columns for the sparklines
MARK = "▶"  # the selected run's GPUs and processes: a mark and a style, never colour alone
INDENT = "  "  # a GPU's sparklines line, under its name
HIGH, MID = 90, 60  # % from which a bar or a sparkline cell is drawn as a warning, as an error


@dataclass(frozen=True)
class Sample:
    """One poll of one GPU: utilisation and memory used, in %; None where NVML could not say."""

    at: float
    util: float | None
    mem: float | None


def mem_percent(gpu: GpuInfo) -> float | None:
    total, used = gpu["mem_total_mib"], gpu["mem_used_mib"]
    return 100 * used / total if total and used is not None else None


GpuKey = tuple[str, int]  # a GPU's host ("" for the one host of a console over one) and its index


def gpu_key(gpu: GpuInfo) -> GpuKey:
    return gpu.get("host", ""), gpu["index"]


class GpuHistory:
    """Each GPU's samples (by host and index) of the last WINDOW_S, oldest first."""

    def __init__(self) -> None:
        self.samples: dict[GpuKey, deque[Sample]] = {}

    def add(self, gpus: Sequence[GpuInfo], at: float) -> None:
        for gpu in gpus:
            kept = self.samples.setdefault(gpu_key(gpu), deque(maxlen=MAX_SAMPLES))
            kept.append(Sample(at, gpu["util"], mem_percent(gpu)))
        for kept in self.samples.values():
            while kept and kept[0].at < at - WINDOW_S - SAMPLE_HOLD_S:
                kept.popleft()

    def of(self, gpu: GpuKey) -> Sequence[Sample]:
        return self.samples.get(gpu, ())


def spark_values(
    samples: Sequence[Sample], pick: Callable[[Sample], float | None], now: float, cells: int, window: float = WINDOW_S
) -> list[float | None]:
    """`window` up to `now` in `cells` slices, oldest first: each slice's highest value among the samples that
    stand in it (a burst or a memory peak is not averaged away); None where none does, a gap. Slices are fixed
    in time (multiples of their length), so a sample stays in its cell from one drawing to the next."""
    values: list[float | None] = [None] * cells
    if cells <= 0:
        return values
    size = window / cells
    start = (math.floor(now / size) + 1) * size - window
    for i, sample in enumerate(samples):
        value = pick(sample)
        end = min(sample.at + SAMPLE_HOLD_S, samples[i + 1].at if i + 1 < len(samples) else now)
        if value is None or end <= start:
            continue
        first = min(cells - 1, max(0, math.floor((sample.at - start) / size)))
        last = min(cells - 1, max(first, math.ceil((end - start) / size) - 1))
        for cell in range(first, last + 1):
            held = values[cell]
            values[cell] = value if held is None else max(held, value)
    return values


def gpu_styles(theme: Theme | None) -> dict[str, str]:
    """A level's colour in the theme (low as success, mid as a warning, high as an error) and the selection's
    style (bold in the accent colour)."""
    colours = signals(theme)
    selected = f"bold {colours.accent}" if colours.accent else "bold"
    return {"low": colours.success, "mid": colours.warning, "high": colours.error, "selected": selected}


def level(percent: float, styles: Mapping[str, str]) -> str:
    return styles["high"] if percent >= HIGH else styles["mid"] if percent >= MID else styles["low"]


def bar(percent: float | None, width: int = BAR_CELLS, styles: Mapping[str, str] | None = None) -> Text:
    if percent is None:
        return Text("n/a".center(width + 2), style="dim")
    filled = round(max(0.0, min(percent, 100.0)) / 100 * width)
    style = level(percent, styles or gpu_styles(None))
    return Text("[") + Text("█" * filled, style=style) + Text("·" * (width - filled) + "]")


def sparkline(values: Sequence[float | None], styles: Mapping[str, str]) -> Text:
    """▁ for 0 % to █ for 100 %, a blank for a gap."""
    text = Text()
    top = len(SPARKS) - 1
    for value in values:
        if value is None:
            text.append(GAP)
        else:
            text.append(SPARKS[min(top, max(0, int(value / 100 * top + 0.5)))], style=level(value, styles))
    return text


def span_label(window: float) -> str:
    return f"{window / 60:g}m" if window >= 60 else f"{window:g}s"


@dataclass(frozen=True)
class Selection:
    """The selected run: its id (its processes carry it) and the GPUs it asked for, on its host."""

    run_id: str
    gpus: frozenset[GpuKey] = frozenset()

    @classmethod
    def of(cls, run: RunInfo | None) -> Selection | None:
        if run is None:
            return None
        return cls(run["id"], frozenset((run.get("host", ""), index) for index in run.get("gpus") or ()))


def marked_gpus(gpus: Sequence[GpuInfo], selection: Selection | None) -> set[GpuKey]:
    """The selected run's GPUs: those it asked for and those where NVML lists one of its processes."""
    if selection is None:
        return set()
    mine = selection.run_id
    holding = {gpu_key(gpu) for gpu in gpus if any(p.get("run_id") == mine for p in gpu["processes"])}
    placed = {gpu_key(gpu) for gpu in gpus if any(h["run_id"] == mine for h in gpu.get("inferred") or [])}
    return holding | placed | set(selection.gpus)


@dataclass(frozen=True)
class Look:
    """How one drawing looks: the sparklines' time, the styles and the selection."""

    history: GpuHistory
    now: float
    window: float
    styles: Mapping[str, str]
    selection: Selection | None
    marked: set[GpuKey]

    def sparks(self, gpu: GpuInfo, cells: int) -> tuple[Text, Text]:
        samples = self.history.of(gpu_key(gpu))
        util = spark_values(samples, lambda s: s.util, self.now, cells, self.window)
        mem = spark_values(samples, lambda s: s.mem, self.now, cells, self.window)
        return sparkline(util, self.styles), sparkline(mem, self.styles)


def cells_of(gpu: GpuInfo, look: Look) -> dict[str, Text]:
    """One GPU's fixed-width pieces, by column."""
    total, used = gpu["mem_total_mib"], gpu["mem_used_mib"]
    selected = gpu_key(gpu) in look.marked
    ident = look.styles["selected"] if selected else ""
    procs = len(gpu["processes"])
    return {
        "mark": Text(MARK if selected else " ", style=ident),
        "label": Text(f"GPU{gpu['index']}", style=ident),
        "name": Text(printable((gpu["name"] or "").removeprefix("NVIDIA "))[:6], style=ident),
        "util": Text(f"{gpu['util']}%" if gpu["util"] is not None else "n/a"),
        "mem": Text(f"{used / 1024:.0f}/{total / 1024:.0f}G" if total and used is not None else "n/a"),
        "temp": Text(f"{gpu['temp_c']}°C" if gpu["temp_c"] is not None else "n/a"),
        "power": Text(f"{gpu['power_w']:.0f} W" if gpu["power_w"] is not None else "n/a"),
        "procs": Text(f"{procs} proc{'s' * (procs != 1)}" if procs else "", style="dim"),
    }


RIGHT_ALIGNED = ("util", "mem", "temp", "power")
# The optional columns, given up first to last when a line is short of room.
NUMBERS_DROPPED = ("procs", "name", "power", "temp")
COMPACT_DROPPED = ("procs", "power", "temp", "name")


def widths_of(rows: Sequence[Mapping[str, Text]]) -> dict[str, int]:
    return {name: max(row[name].cell_len for row in rows) for name in rows[0]}


def used(widths: Mapping[str, int], columns: Sequence[str]) -> int:
    """The cells `columns` take, one space apart."""
    return sum(widths[c] for c in columns) + len(columns) - 1


def fit(
    widths: Mapping[str, int], columns: Sequence[str], dropped: Sequence[str], width: int, wanted: int
) -> list[str]:
    """The columns kept (the empty ones never): `dropped` given up in order until the others leave `wanted` of
    `width` cells."""
    kept = [c for c in columns if widths[c]]
    for name in dropped:
        if used(widths, kept) + wanted <= width:
            break
        if name in kept:
            kept.remove(name)
    return kept


def joined(row: Mapping[str, Text], columns: Sequence[str], widths: Mapping[str, int]) -> Text:
    def padded(name: str) -> Text:
        room = Text(" " * (widths[name] - row[name].cell_len))
        return room + row[name] if name in RIGHT_ALIGNED else row[name] + room

    return Text(" ").join(padded(c) for c in columns)


def expanded(columns: Sequence[str], pairs: Mapping[str, tuple[str, str]]) -> list[str]:
    """`columns` with each one of `pairs` replaced by its pair (a bar and its number, a number and its
    sparkline)."""
    return [part for name in columns for part in pairs.get(name, (name,))]


def numbers_lines(gpus: Sequence[GpuInfo], look: Look, width: int, folded: bool) -> list[Text]:
    """Each GPU's line of numbers, each number after its bar; the bars as wide as the room leaves (12 cells at
    most, none narrower than 4)."""
    rows = [cells_of(gpu, look) for gpu in gpus]
    widths = widths_of(rows)
    columns = ["mark", "label", "name", "util", "mem", "temp", "power", *(["procs"] if folded else [])]
    kept = fit(widths, columns, NUMBERS_DROPPED, width, 2 * (MIN_BAR + 3))  # a bar: its brackets and a space
    cells = min(BAR_CELLS, (width - used(widths, kept)) // 2 - 3)
    if cells >= MIN_BAR:
        kept = expanded(kept, {"util": ("bar_util", "util"), "mem": ("bar_mem", "mem")})
        for gpu, row in zip(gpus, rows, strict=True):
            row.update(bar_util=bar(gpu["util"], cells, look.styles), bar_mem=bar(mem_percent(gpu), cells, look.styles))
        widths.update(bar_util=cells + 2, bar_mem=cells + 2)
    return [joined(row, kept, widths) for row in rows]


def spark_line(gpu: GpuInfo, look: Look, width: int) -> Text:
    """`    util ▁▂▅█  mem ▁▁▂▂ 5m`: both sparklines share the width."""
    span = span_label(look.window)
    style = look.styles["selected"] if gpu_key(gpu) in look.marked else ""
    cells = max(1, (width - len(INDENT) - len("util ") - len("  mem ") - 1 - len(span)) // 2)
    util, mem = look.sparks(gpu, cells)
    text = Text(INDENT) + Text("util ", style=style) + util + Text("  mem ", style=style) + mem
    return text + Text(f" {span}", style="dim")


def process_line(proc: GpuProcess, look: Look) -> Text:
    run_id = proc.get("run_id")
    owner = f"run {run_id}" if run_id else (proc.get("user") or "?")
    line = printable(f"pid {proc['pid']} {proc['mem_mib'] or 0} MiB ({owner})")
    if look.selection is not None and run_id == look.selection.run_id:
        return Text(f"{INDENT}{MARK} {line}", style=look.styles["selected"])
    return Text(f"{INDENT}  {line}", style="" if run_id else "dim")


def inferred_line(holder: InferredHolder, look: Look, width: int) -> Text:
    """`run 0a1b (by CUDA_VISIBLE_DEVICES)`: a run none of whose processes NVML lists here (inside a container its
    pids are the host's), placed on this GPU by its launch. Where the line is short of room the run id gives up its
    head (its tail tells runs apart), never the note that says where the placing came from."""
    note = inferred_note(holder)
    run_id = printable(holder["run_id"])
    room = width - len(INDENT) - len(f"{MARK} run  {note}")
    if len(run_id) > room > 1:
        run_id = "…" + run_id[len(run_id) - room + 1 :]
    line = f"run {run_id} {note}"
    if look.selection is not None and holder["run_id"] == look.selection.run_id:
        return Text(f"{INDENT}{MARK} {line}", style=look.styles["selected"])
    return Text(f"{INDENT}  {line}")


def detailed(gpus: Sequence[GpuInfo], look: Look, width: int, folded: bool) -> list[Text]:
    """Per GPU its numbers line, its sparklines line, then its processes (or their count on the numbers line)."""
    lines = []
    for gpu, numbers in zip(gpus, numbers_lines(gpus, look, width, folded), strict=True):
        lines += [numbers, spark_line(gpu, look, width)]
        if not folded:
            lines += [process_line(proc, look) for proc in gpu["processes"]]
            lines += [inferred_line(holder, look, width) for holder in gpu.get("inferred") or []]
    return lines


def compact(gpus: Sequence[GpuInfo], look: Look, width: int) -> list[Text]:
    """One line per GPU, each number followed by its sparkline, under a header that names them and their span."""
    rows = [cells_of(gpu, look) for gpu in gpus]
    widths = widths_of(rows)
    columns = ["mark", "label", "name", "util", "mem", "temp", "power", "procs"]
    kept = fit(widths, columns, COMPACT_DROPPED, width, 2 * (MIN_SPARK + 1))
    cells = max(1, (width - used(widths, kept)) // 2 - 1)
    for gpu, row in zip(gpus, rows, strict=True):
        row["spark_util"], row["spark_mem"] = look.sparks(gpu, cells)
    widths.update(spark_util=cells, spark_mem=cells)
    kept = expanded(kept, {"util": ("util", "spark_util"), "mem": ("mem", "spark_mem")})
    span = span_label(look.window)
    header = Text(style="bold")
    for name, head in (("label", "GPU"), ("util", f"util {span}"), ("mem", f"mem {span}")):
        at = used(widths, kept[: kept.index(name)]) + 1
        header.append(" " * max(1 if header else 0, at - header.cell_len) + head)
    return [header, *(joined(row, kept, widths) for row in rows)]


def by_host(gpus: Sequence[GpuInfo], lines_of: Callable[[Sequence[GpuInfo]], list[Text]]) -> list[Text]:
    """The GPUs' lines; of a console over several hosts, each host's under its name."""
    hosts = list(dict.fromkeys(gpu.get("host", "") for gpu in gpus))
    if hosts == [""]:
        return lines_of(gpus)
    lines: list[Text] = []
    for host in hosts:
        lines += [Text(printable(host), style="bold"), *lines_of([gpu for gpu in gpus if gpu.get("host", "") == host])]
    return lines


def gpu_text(
    gpus: Sequence[GpuInfo],
    history: GpuHistory,
    now: float,
    width: int,
    rows: int | None = None,
    selection: Selection | None = None,
    styles: Mapping[str, str] | None = None,
    window: float = WINDOW_S,
) -> Text:
    """The panel's drawing in `width` cells: the fullest of three layouts that fits in `rows` lines (each GPU
    on two lines with its processes under it; the same with the processes counted; one line per GPU)."""
    look = Look(history, now, window, styles or gpu_styles(None), selection, marked_gpus(gpus, selection))
    lines = by_host(gpus, lambda some: detailed(some, look, width, folded=False))
    if rows is not None and len(lines) > rows:
        lines = by_host(gpus, lambda some: detailed(some, look, width, folded=True))
    if rows is not None and len(lines) > rows:
        lines = by_host(gpus, lambda some: compact(some, look, width))
    for line in lines:
        line.truncate(width, overflow="crop")  # below ~30 cells even the barest layout is cut
    return Text("\n").join(lines)


class GpuPanel(Static):
    """Per-GPU utilisation and memory now and over the last minutes, temperature, power and the processes with
    their runs; the selected run's GPUs marked. `show` takes each status poll, `select` the selected run."""

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = GpuHistory()
        self.status: StatusResult | None = None
        self.selection: Selection | None = None
        self.shown: Text | None = None

    def show(self, status: StatusResult) -> None:
        self.history.add(status.get("gpus") or [], time.monotonic())
        self.status = status
        self.redraw()

    def select(self, run: RunInfo | None) -> None:
        """Mark this run's GPUs and processes (None: none); redraws only when that changes the selection."""
        selection = Selection.of(run)
        if selection != self.selection:
            self.selection = selection
            self.redraw()

    def on_resize(self, event: Resize) -> None:
        self.redraw()

    def rows(self) -> int | None:
        """The lines this panel may take (its max-height, less its border); None before the layout knows."""
        limit, parent = self.styles.max_height, self.parent
        if limit is None or not isinstance(parent, Widget) or not parent.content_size.height:
            return None
        return max(1, int(limit.resolve(parent.content_size, self.app.size)) - self.styles.gutter.height)

    def redraw(self) -> None:
        status = self.status
        if status is None:
            return
        gpus = status.get("gpus") or []
        if gpus:
            width = self.content_region.width or BAR_CELLS * 5
            styles = gpu_styles(self.app.current_theme)
            text = gpu_text(gpus, self.history, time.monotonic(), width, self.rows(), self.selection, styles)
        else:
            # The agent names no source when it found no GPU: the error (if any) says why.
            error = status.get("gpu_error")
            text = Text(printable("GPUs: none found" + (f": {error}" if error else "")), style="dim")
        if text != self.shown:  # an update lays the screen out again (and this panel's resize calls here)
            self.shown = text
            self.update(text)
