"""Metric rows (JSON lines for the run engine) and the human line printed with each."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from backends.protocol import ENV_METRICS_FILE, Metric, MetricRow

METRICS_FILE = "metrics.jsonl"
PLATEAU_REL = 0.005


class MetricsWriter:
    """Appends one JSON object per line to $EAGLE3_METRICS_FILE, else to OUT/metrics.jsonl."""

    def __init__(self, out: Path) -> None:
        path = os.environ.get(ENV_METRICS_FILE) or str(out / METRICS_FILE)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", buffering=1)  # noqa: SIM115 - held for the run

    def write(self, row: MetricRow) -> None:
        self._file.write(json.dumps({k: _plain(v) for k, v in row.items()}) + "\n")

    def close(self) -> None:
        self._file.close()


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return value


def plateaued(history: list[float], window: int, rel: float = PLATEAU_REL) -> bool:
    """True when none of the last `window` val losses beat the best before them by `rel` (0.5%)."""
    if window < 1 or len(history) <= window:
        return False
    best_before = min(history[:-window])
    return min(history[-window:]) > best_before * (1 - rel)


def train_line(row: MetricRow, total_steps: int, ttt: int) -> str:
    accs = " ".join(f"{row[Metric.acc(k)]:.3f}" for k in range(ttt))
    return (
        f"step {row[Metric.STEP]}/{total_steps} epoch {row[Metric.EPOCH]} | loss {row[Metric.LOSS]:.4f} | "
        f"acc {accs} | lr {row[Metric.LR]:.3g} | grad_norm {row[Metric.GRAD_NORM]:.3f} | "
        f"{row[Metric.TOKENS_PER_S]:,.0f} tokens/s"
    )


def eval_line(row: MetricRow, ttt: int) -> str:
    accs = " ".join(f"{row[Metric.val_acc(k)]:.3f}" for k in range(ttt))
    flag = " | plateau: val loss has not improved by 0.5%" if row[Metric.PLATEAU] else ""
    return (
        f"eval step {row[Metric.STEP]} | val_loss {row[Metric.VAL_LOSS]:.4f} | val_acc {accs} | "
        f"simulated accept length {row[Metric.VAL_SIM_ACCEPT_LEN]:.3f}{flag}"
    )
