"""The charts panel: the selected run's curves drawn from its metric store (`metric_store.MetricStore`) by
`plot.render_plot`, a picker for any series the run has, and `RunMetrics`, what the app keeps of each run's rows.

A chart shows a spec: series names, where `acc_*` stands for every `acc_<k>` the run has. It redraws only when
a series it shows got a point or its spec, toggles, runs or size changed, at most once per MIN_REDRAW_S (once per
STREAM_REDRAW_S for points streaming in) and less often when a redraw costs more than DRAW_BUDGET of a core at
that pace (many curves over a long history);
the lines drawn are kept for the same inputs, so Textual's other repaints cost nothing.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rich.segment import Segment
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from backends.protocol import Metric, MetricRow
from console.tui.metric_store import MetricStore
from console.tui.pacing import until_beat
from console.tui.plot import Mark, PlotSeries, PlotStyles, XKind, plot_area, render_plot

ChartSpec = tuple[str, ...]
MIN_REDRAW_S = 0.1  # at most 10 redraws a second
# Points arriving: a curve moves by a hair a row, and a redraw of both charts was a fifth of the console's work
# while it followed a run; every other beat keeps them live to the eye (the log, under them, moves at each beat)
STREAM_REDRAW_S = 2.0
DRAW_BUDGET = 0.005  # the share of a core one chart's redraws may take while rows stream in
MIN_ROWS = 9  # a chart shorter than this is hard to read: the panel stacks its charts only above twice this
MIN_COLUMNS = 36  # ... and puts them side by side only above twice this; else it shows the current one alone
_PER_POSITION = re.compile(r"(.+_)\d+$")
_PALETTE = PlotStyles().palette


def every(per_position: Callable[[int], str]) -> str:
    """The spec entry standing for every position of a per-position series: `acc_*` for Metric.acc."""
    return per_position(0).removesuffix("0") + "*"


TRAINING_CHARTS: tuple[ChartSpec, ChartSpec] = ((Metric.LOSS, Metric.VAL_LOSS), (every(Metric.acc),))
DEFAULT_CHARTS: dict[str, tuple[ChartSpec, ChartSpec]] = {
    # Latency (seconds) beside the accept length: both small numbers; it comes from the server's /metrics only.
    "serve": ((Metric.ACCEPT_LEN, Metric.TTFT_P50), (Metric.GEN_THROUGHPUT,)),
    "extract": ((Metric.TOKENS_PER_S,), (Metric.SAMPLES,)),
    "command": ((), ()),  # a command of the user's names nothing: its charts take its first series (`fill`)
}
SERVER_SERIES = frozenset(name for spec in DEFAULT_CHARTS["serve"] for name in spec)  # from decode lines or /metrics
MARKED = frozenset({Metric.LOSS, Metric.VAL_LOSS})  # a chart showing one of these marks the plateau flags


def default_charts(kind: str) -> tuple[ChartSpec, ChartSpec]:
    """What a run of this kind shows first (a training's for kinds that name nothing else)."""
    return DEFAULT_CHARTS.get(kind, TRAINING_CHARTS)


def expand(spec: ChartSpec, names: Iterable[str]) -> list[str]:
    """The series of `names` that `spec` shows, in the spec's order (a family by position)."""
    names = list(names)
    out: list[str] = []
    for entry in spec:
        if entry.endswith("*"):
            prefix = entry[:-1]
            family = [n for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit()]
            out += sorted(family, key=lambda n: int(n[len(prefix) :]))
        elif entry in names:
            out.append(entry)
    return list(dict.fromkeys(out))


def spec_label(spec: ChartSpec) -> str:
    return ", ".join(spec)


def choices(names: Sequence[str], defaults: Sequence[ChartSpec]) -> list[ChartSpec]:
    """What the picker offers: the kind's defaults, each per-position family whole, then every series."""
    families = [(m.group(1) + "*",) for n in names if (m := _PER_POSITION.match(n))]
    return list(dict.fromkeys([*(d for d in defaults if d), *families, *((n,) for n in names)]))


@dataclass
class RunMetrics:
    """What the console holds of one run's metrics: its store, how far into its metrics.jsonl the rows
    received reach, and the rows received but not yet added (the store is fed a slice at a time)."""

    store: MetricStore = field(default_factory=MetricStore)
    offset: int = 0
    backlog: deque[MetricRow] = field(default_factory=deque)
    fetched: bool = False  # its history was read whole once (a parent's, for the overlay)
    # The rows plotted since a coarse first look at its history, until the full view replaces that look: they are
    # added again after it (a second or so of rows, only then)
    since_coarse: list[MetricRow] | None = None

    def receive(self, rows: Iterable[object], next_offset: int) -> None:
        self.backlog.extend(row for row in rows if isinstance(row, dict))
        self.offset = next_offset

    def take(self, n: int) -> list[MetricRow]:
        return [self.backlog.popleft() for _ in range(min(n, len(self.backlog)))]


class MetricChart(Widget, can_focus=True):
    """Some series of the selected run (and, dimmer, its parent's same series), with a title line naming
    them and the toggles: log scale, robust y range (the warm-up left out), smoothing."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"metricchart--title", "metricchart--on", "metricchart--off"}
    DEFAULT_CSS = """
    MetricChart { width: 1fr; height: 1fr; }
    MetricChart > .metricchart--title { text-style: bold; }
    MetricChart:focus > .metricchart--title { color: $accent; }
    MetricChart > .metricchart--on { color: $accent; text-style: bold reverse; }
    MetricChart > .metricchart--off { color: $text-muted; }
    """
    TOGGLES: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("log_scale", "L", "log"),
        ("robust", "R", "robust"),
        ("smooth", "S", "smooth"),
    )

    def __init__(self, spec: ChartSpec, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.spec = spec
        self.log_scale = False
        self.robust = True
        self.smooth = False
        self.current = False
        self.run_store: MetricStore | None = None
        self.lineage_store: MetricStore | None = None  # the parent run's, drawn dimmer
        self._version = 0
        self._drawn: tuple[object, ...] = ()
        self._text = Text()
        self._lines: list[Strip] = []
        self._draw_s = 0.0  # what the last redraw cost
        self._timer: Timer | None = None
        self._last_redraw = 0.0
        self._plateaus: tuple[int, list[float]] = (0, [])

    # --- what it shows ---------------------------------------------------------------------

    def show(self, run_store: MetricStore | None, lineage_store: MetricStore | None = None) -> None:
        self.run_store, self.lineage_store = run_store, lineage_store
        self._plateaus = (0, [])
        self.changed()

    def pick(self, spec: ChartSpec) -> None:
        self.spec = spec
        self.changed()

    def toggle(self, flag: str) -> None:
        setattr(self, flag, not getattr(self, flag))
        self.changed()

    def names(self) -> list[str]:
        """The series it shows: those of its spec that the run or its parent has."""
        stores = [s for s in (self.run_store, self.lineage_store) if s is not None]
        return expand(self.spec, dict.fromkeys(n for s in stores for n in s.names()))

    def touch(self, names: set[str]) -> None:
        """Series that got points: a redraw if it shows one of them."""
        if any(expand(self.spec, names)):
            self.changed(STREAM_REDRAW_S)

    def changed(self, gap: float = MIN_REDRAW_S) -> None:
        """What it shows changed: redraw, at most once per `gap` (or per DRAW_BUDGET of its cost); a change of the
        person's (a toggle, a pick) does not wait behind a redraw planned for streaming points."""
        self._version += 1
        if self._timer is not None and gap < STREAM_REDRAW_S:
            self._timer.stop()
            self._timer = None
        if self._timer is None and self.is_mounted:
            delay = until_beat(self._last_redraw + max(gap, self._draw_s / DRAW_BUDGET))
            if delay > 0:
                self._timer = self.set_timer(delay, self._redraw)
            else:
                self._redraw()

    def changed_now(self) -> None:
        """What it shows changed and is awaited (a run's history came in): redrawn on the next frame, whatever the
        last redraws cost."""
        self._version += 1
        if self._timer is not None:
            self._timer.stop()
        self._redraw()

    def _redraw(self) -> None:
        self._timer = None
        self._last_redraw = time.monotonic()
        self.refresh()

    # --- drawing ----------------------------------------------------------------------------

    def text(self) -> Text:
        """What it shows now, drawn again only if that changed."""
        width, height = self.size.width, self.size.height
        key = (width, height, self._version, self.current, self.has_focus, self.app.theme)
        if key != self._drawn:
            start = time.perf_counter()
            self._drawn, self._text = key, self.draw(width, height)
            # Its lines as strips straight from Rich's segments: cheaper than Textual's path for a Text.
            lines = Segment.split_and_crop_lines(
                self._text.render(self.app.console), width, pad=True, include_new_lines=False
            )
            style = self.rich_style  # once: it walks the widget's ancestors
            self._lines = [Strip(Segment.apply_style(line, style), width) for line in lines]
            self._draw_s = time.perf_counter() - start
        return self._text

    def render_line(self, y: int) -> Strip:
        self.text()
        return self._lines[y] if y < len(self._lines) else Strip.blank(self.size.width, self.rich_style)

    def draw(self, width: int, height: int) -> Text:
        text = self._title(width)
        if height < 2 or self.run_store is None:
            return text
        store, parent, names = self.run_store, self.lineage_store, self.names()
        own = [s for n in names if (s := store.series(n)) is not None]
        theirs = [s for n in names if parent is not None and (s := parent.series(n)) is not None]
        # Until this run's first row fixes its x, the parent's curves say what x is (a serve run's: the time).
        x_label = store.x_label if own or not theirs or parent is None else parent.x_label
        shift = 0.0  # a serve run's x is the time: the parent's curve starts where this run's starts
        if x_label == "time" and own and theirs and (mine := own[0].x_range) and (its := theirs[0].x_range):
            shift = mine[0] - its[0]
        ranges = [r for s in own if (r := s.x_range)]
        ranges += [(r[0] + shift, r[1] + shift) for s in theirs if (r := s.x_range)]
        x_range = (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None
        y_ranges = [r for s in (*own, *theirs) if (r := s.y_range(self.robust))]
        y_range = (min(r[0] for r in y_ranges), max(r[1] for r in y_ranges)) if y_ranges else None
        plotted: list[PlotSeries] = []
        if x_range is not None:
            cols, _ = plot_area(width, height - 1, y_range, self.log_scale)
            x0, x1 = x_range
            colour = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(names)}
            for s in theirs:
                columns = s.columns(x0 - shift, x1 - shift, cols, smoothed=self.smooth)
                plotted.append(PlotSeries(f"{s.name} (parent)", columns, f"dim {colour[s.name]}", background=True))
            for s in own:
                raw = s.columns(x0, x1, cols)
                if self.smooth:
                    plotted.append(PlotSeries(s.name, s.columns(x0, x1, cols, smoothed=True), colour[s.name], raw))
                else:
                    plotted.append(PlotSeries(s.name, raw, colour[s.name]))
        marks = [Mark(x) for x in self._plateau_steps()] if MARKED & set(names) else []
        kind: XKind = "time" if x_label == "time" else "row" if x_label == "row" else "step"
        plot = render_plot(
            plotted, width, height - 1, x_range, kind, y_range, log=self.log_scale, marks=marks, no_data=self.no_data()
        )
        return text.append("\n").append_text(plot)

    def no_data(self) -> str:
        """What the chart says before its first point: where its points would come from."""
        if not self.spec:
            return "no metric rows from this command"  # JSON lines it appends to $EAGLE3_METRICS_FILE would be
        label = spec_label(self.spec)
        if set(self.spec) & SERVER_SERIES:
            return f"no {label} until the server decodes"
        return f"no {label} rows yet"

    def _plateau_steps(self) -> list[float]:
        """The x of every row whose plateau flag is up (eval rows: few; read again only when one comes)."""
        series = self.run_store.series(Metric.PLATEAU) if self.run_store else None
        if series is None:
            return []
        if self._plateaus[0] != len(series):
            self._plateaus = (len(series), [x for x, flag in series.points() if flag == 1.0])
        return self._plateaus[1]

    def _title(self, width: int) -> Text:
        title = Text("▸ " if self.current else "  ", style=self.get_component_rich_style("metricchart--title"))
        title.append(spec_label(self.spec))
        toggles = Text()
        for flag, key, name in self.TOGGLES:
            style = "metricchart--on" if getattr(self, flag) else "metricchart--off"
            toggles.append(" ")
            toggles.append(f"{key} {name}", style=self.get_component_rich_style(style))
        room = width - len(toggles)
        if room < len(title) + 1:
            title.truncate(max(room - 1, 0), overflow="ellipsis")
        title.pad_right(max(width - len(title) - len(toggles), 0))
        title.append_text(toggles)
        title.truncate(width, overflow="ellipsis")
        return title


class ChartsPanel(Widget):
    """The selected run's two charts: stacked where there is height for both, side by side where there is
    width, else the current one alone. The current chart is the one focused last; `c`, `L`, `R`, `S` act on it."""

    DEFAULT_CSS = "ChartsPanel { layout: vertical; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.kind: str | None = None

    def compose(self) -> ComposeResult:
        yield MetricChart(TRAINING_CHARTS[0], id="curve-a")
        yield MetricChart(TRAINING_CHARTS[1], id="curve-b")

    def on_mount(self) -> None:
        self.select(self.charts[0])

    @property
    def charts(self) -> list[MetricChart]:
        return list(self.query(MetricChart))

    @property
    def current(self) -> MetricChart:
        return next((c for c in self.charts if c.current), self.charts[0])

    def select(self, chart: MetricChart) -> None:
        for each in self.charts:
            if each.current != (each is chart):
                each.current = each is chart
                each.changed()
        self._arrange()

    def next_chart(self) -> None:
        charts = self.charts
        self.select(charts[(charts.index(self.current) + 1) % len(charts)])

    def show(self, kind: str, run_store: MetricStore, lineage_store: MetricStore | None = None) -> None:
        """A run's charts; a run of another kind starts from that kind's defaults."""
        if kind != self.kind or (kind == "command" and run_store is not self.charts[0].run_store):
            self.kind = kind
            for chart, spec in zip(self.charts, default_charts(kind), strict=True):
                chart.spec = spec
        for chart in self.charts:
            chart.show(run_store, lineage_store)
        self.fill()

    def touch(self, names: set[str]) -> None:
        self.fill()
        for chart in self.charts:
            chart.touch(names)

    def arrived(self) -> None:
        """A run's history came in: drawn at once, not on the beat of streaming points."""
        self.fill()
        for chart in self.charts:
            chart.changed_now()

    def fill(self) -> None:
        """A chart with nothing to show (a command's) takes the run's next series, in the order it wrote them,
        that no chart shows."""
        store = self.charts[0].run_store
        shown = {name for chart in self.charts for name in chart.spec}
        names = store.names() if store is not None else []
        free = [name for name in names if name not in shown and name not in (Metric.STEP, Metric.TIME)]
        for chart in self.charts:
            if not chart.spec and free:
                chart.pick((free.pop(0),))

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if isinstance(event.widget, MetricChart):
            self.select(event.widget)

    def on_resize(self, event: events.Resize) -> None:
        self._arrange()

    def _arrange(self) -> None:
        width, height = self.size.width, self.size.height
        stacked = height >= 2 * MIN_ROWS
        side_by_side = not stacked and width >= 2 * MIN_COLUMNS
        self.styles.layout = "horizontal" if side_by_side else "vertical"
        for chart in self.charts:
            chart.display = stacked or side_by_side or chart.current


class ChartPicker(ModalScreen[ChartSpec | None]):
    """What the current chart shows: type to narrow the list, up/down to move, Enter picks, Escape keeps it."""

    DEFAULT_CSS = """
    ChartPicker { align: center middle; background: $background 60%; }
    ChartPicker > Vertical {
        width: 60; height: auto; max-height: 80%; border: thick $accent; background: $surface; padding: 0 1;
    }
    ChartPicker OptionList { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss(None)", "cancel"),
        Binding("down", "move(1)", "next", show=False),
        Binding("up", "move(-1)", "previous", show=False),
    ]

    def __init__(self, title: str, offered: list[ChartSpec], current: ChartSpec) -> None:
        super().__init__()
        self.title_text = title
        self.offered = offered
        self.shown = offered
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.title_text))
            yield Input(placeholder="type to narrow: lr, acc, ploss…")
            yield OptionList(*self._options())

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        options = self.query_one(OptionList)
        options.highlighted = self.shown.index(self.current) if self.current in self.shown else 0

    def _options(self) -> list[Option]:
        return [Option(Text(spec_label(spec))) for spec in self.shown]

    @on(Input.Changed)
    def narrow(self, event: Input.Changed) -> None:
        words = event.value.lower().split()
        self.shown = [s for s in self.offered if all(w in spec_label(s).lower() for w in words)]
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options(self._options())
        options.highlighted = 0 if self.shown else None

    def action_move(self, by: int) -> None:
        options = self.query_one(OptionList)
        if self.shown:
            options.highlighted = min(max((options.highlighted or 0) + by, 0), len(self.shown) - 1)

    @on(Input.Submitted)
    def submitted(self) -> None:
        highlighted = self.query_one(OptionList).highlighted
        if highlighted is not None and self.shown:
            self.dismiss(self.shown[highlighted])

    @on(OptionList.OptionSelected)
    def selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.shown[event.option_index])
