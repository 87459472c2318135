"""Metric rows (JSON lines for the run engine) and the human line printed with each."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from backends.runstore import ENV_METRICS_FILE

METRICS_FILE = "metrics.jsonl"
PLATEAU_REL = 0.005


class MetricsWriter:
    """Appends one JSON object per line to $EAGLE3_METRICS_FILE, else to OUT/metrics.jsonl."""

    def __init__(self, out: Path) -> None:
        path = os.environ.get(ENV_METRICS_FILE) or str(out / METRICS_FILE)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", buffering=1)  # noqa: SIM115 - held for the run

    def write(self, row: dict[str, Any]) -> None:
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


def train_line(row: dict[str, Any], total_steps: int, ttt: int) -> str:
    accs = " ".join(f"{row[f'acc_{k}']:.3f}" for k in range(ttt))
    return (
        f"step {row['step']}/{total_steps} epoch {row['epoch']} | loss {row['loss']:.4f} | acc {accs} | "
        f"lr {row['lr']:.3g} | grad_norm {row['grad_norm']:.3f} | {row['tokens_per_s']:,.0f} tokens/s"
    )


def eval_line(row: dict[str, Any], ttt: int) -> str:
    accs = " ".join(f"{row[f'val_acc_{k}']:.3f}" for k in range(ttt))
    flag = " | plateau: val loss has not improved by 0.5%" if row["plateau"] else ""
    return (
        f"eval step {row['step']} | val_loss {row['val_loss']:.4f} | val_acc {accs} | "
        f"simulated accept length {row['val_sim_accept_len']:.3f}{flag}"
    )
