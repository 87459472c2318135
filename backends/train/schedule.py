"""Learning-rate schedule: linear warmup, then cosine decay to zero (SpecForge's and EAGLE's shape)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, warmup: int, total: int) -> float:
    """The multiplier of the base lr for optimizer step `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def warmup_steps(total: int, ratio: float) -> int:
    return max(1, round(total * ratio)) if ratio > 0 else 0


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> LambdaLR:
    # A closure, not a callable object: LambdaLR would save an object's fields in its
    # state and a resumed run with a new --steps would silently keep the old schedule.
    def factor(step: int) -> float:
        return lr_factor(step, warmup, total)

    return LambdaLR(optimizer, factor)
