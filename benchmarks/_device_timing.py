"""Timing torch work: a clock reading covers the device's queued work only once the device is waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timed:
    warmup_s: float  # the untimed calls together (compilation, allocator warm-up)
    call_s: float  # mean seconds per timed call
    last: Any  # the last call's result

    def rates(self, tokens: int) -> dict[str, float]:
        """The figures a benchmark reports for calls of `tokens` tokens each."""
        return {"warmup_s": self.warmup_s, "step_s": self.call_s, "tokens_per_s": tokens / self.call_s}


def timed_calls(call: Callable[[], Any], warmup: int, calls: int, device: torch.device | str) -> Timed:
    """`warmup` untimed calls, then `calls` timed ones, each group ended by waiting for the device. A call's
    result is dropped before the next call (it may be a batch of states), the last one returned."""

    def run(count: int) -> tuple[float, Any]:
        last = None
        started = time.perf_counter()
        for _ in range(count):
            last = None
            last = call()
        synchronize(device)
        return time.perf_counter() - started, last

    warm = run(warmup)[0]
    elapsed, last = run(calls)
    return Timed(warm, elapsed / calls, last)
