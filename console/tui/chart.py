"""A metric curve drawn with braille dots: downsampled to the widget's width first, so a redraw costs
the same for ten points or a million (plotting libraries redraw every point on the UI thread)."""

from __future__ import annotations

import math
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

# Braille dot bits by (column, row) inside a 2 x 4 cell.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
MAX_POINTS = 100_000  # older points are dropped beyond this


def downsample(values: list[float], width: int) -> list[float]:
    """At most `width` values: the mean of each equal slice (a curve's shape, not its noise)."""
    if len(values) <= width:
        return values
    step = len(values) / width
    return [
        sum(chunk) / len(chunk)
        for i in range(width)
        if (chunk := values[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)])
    ]


def braille_rows(values: list[float], width: int, height: int) -> tuple[list[str], float, float]:
    """The curve as `height` rows of `width` braille cells, and its (low, high) range."""
    finite = [v for v in values if math.isfinite(v)]
    grid = [[0] * width for _ in range(height)]
    if not finite:
        return ["\u2800" * width for _ in range(height)], math.nan, math.nan
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    points = downsample(finite, width * 2)
    for x, value in enumerate(points):
        dot_row = round((high - value) / span * (height * 4 - 1))
        grid[dot_row // 4][x // 2] |= _DOTS[x % 2][dot_row % 4]
    return ["".join(chr(0x2800 + cell) for cell in row) for row in grid], low, high


class LineChart(Widget):
    """One named series (`loss`, `acc_0`, ...), its last value and range."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"linechart--curve", "linechart--axis"}
    DEFAULT_CSS = """
    LineChart { height: 8; }
    LineChart > .linechart--curve { color: $accent; }
    LineChart > .linechart--axis { color: $text-muted; }
    """

    def __init__(self, title: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = title
        self.values: list[float] = []

    def extend(self, values: list[float]) -> None:
        self.values.extend(values)
        del self.values[:-MAX_POINTS]
        self.refresh()

    def clear(self, title: str | None = None) -> None:
        self.values.clear()
        self.title = title or self.title
        self.refresh()

    def render(self) -> Text:
        if not self.values:
            return Text(f"{self.title}: no metric rows yet", style="bold")
        width = max(self.size.width - 10, 4)
        height = max(self.size.height - 1, 1)
        rows, low, high = braille_rows(self.values, width, height)
        last = f"{self.values[-1]:.4g}"
        curve = self.get_component_rich_style("linechart--curve")
        axis = self.get_component_rich_style("linechart--axis")
        text = Text(f"{self.title}: {last}  ({len(self.values)} points)\n", style="bold")
        for i, row in enumerate(rows):
            label = f"{high:.3g}" if i == 0 else f"{low:.3g}" if i == len(rows) - 1 else ""
            text.append(f"{label:>9} ", style=axis)
            text.append(row + ("\n" if i < len(rows) - 1 else ""), style=curve)
        return text
