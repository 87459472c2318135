"""How far a training or an extraction has got, from its metric rows: the step (of the total its command line
asks for, when it says), the shard, and the time left (the extractor's own estimate, else the step rate seen live).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.protocol import Metric, MetricRow
from console.render import flag_values, progress_head
from console.tui.timeline import seconds

TOTAL_FLAGS = ("--steps", "--max-steps", "--num-steps", "--total-steps")


def total_steps(argv: Sequence[str]) -> int | None:
    """The steps a training's command line asks for (`--steps 3000`), when it names them."""
    flags = flag_values(argv)
    for name in TOTAL_FLAGS:
        value = flags.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


def number(row: MetricRow, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Progress:
    total: int | None = None
    step: int | None = None
    shard: int | None = None
    eta_s: float | None = None  # as the run's rows said it, at `eta_at`
    eta_at: float = 0.0
    live: list[tuple[float, int]] = field(default_factory=list)  # (when seen, step): the first and the latest
    ended: bool = False  # the run is over: nothing is left to wait for, whatever step it stopped at

    def add(self, rows: Sequence[MetricRow], at: float, live: bool) -> None:
        """Rows that arrived at `at`; `live` rows were written just now (not history read on opening the run)."""
        for row in rows:
            if (step := number(row, Metric.STEP)) is not None:
                self.step = int(step)
            if (shard := number(row, Metric.SHARD)) is not None:
                self.shard = int(shard)
            if (eta := number(row, Metric.ETA_S)) is not None:
                self.eta_s, self.eta_at = eta, at
        if live and self.step is not None:
            self.live = [self.live[0], (at, self.step)] if self.live else [(at, self.step)]

    def remaining(self, now: float) -> float | None:
        if self.ended:
            return None
        if self.eta_s is not None:
            return max(self.eta_s - (now - self.eta_at), 0.0)
        if self.total is None or self.step is None or len(self.live) < 2:
            return None
        (t0, s0), (t1, s1) = self.live
        if s1 <= s0 or t1 <= t0:
            return None
        return (self.total - self.step) * (t1 - t0) / (s1 - s0)

    def text(self, now: float) -> str | None:
        """`step 1295/3000 · ETA 4 m 10 s`, `shard 3 · ETA 20 s`; None while the rows say nothing of it."""
        head = progress_head(self.step, self.shard, self.total)
        if head is None:
            return None
        left = self.remaining(now)
        return head + (f" · ETA {seconds(left)}" if left is not None else "")
