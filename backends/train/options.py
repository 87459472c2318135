"""The trainer's options: one field per CLI flag, checked before anything is read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from backends.eagle3_contract import DEFAULT_DRAFT_VOCAB
from backends.train.data import GROUPED, RANDOM
from backends.train.errors import TrainError


@dataclass
class TrainOptions:
    data: Path
    target: Path
    out: Path
    steps: int | None = None
    epochs: int = 1
    ttt: int = 7
    lr: float = 1e-4
    batch_size: int = 4
    grad_accum: int = 1
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 1000
    resume: bool = False
    warmup_ratio: float = 0.015
    max_grad_norm: float = 0.5
    draft_vocab_size: int = DEFAULT_DRAFT_VOCAB
    val_samples: int | None = None
    max_length: int | None = None
    seed: int = 0
    compile: bool | None = None  # None: on GPU only
    pad_multiple: int | None = None  # None: 128 on GPU, 1 on CPU
    attention: str = "auto"
    fsdp: str = "auto"
    draft_config: Path | None = None
    plateau_evals: int = 5
    threads: int | None = None  # None: on the CPU, the idle CPUs (backends.host.cpus)
    online: bool = False
    layers: list[int] | None = None  # --online: aux ids (None: the default set)
    chat_template: Path | None = None
    limit: int | None = None
    target_placement: str = "auto"
    batch_order: str | None = None  # None: grouped online, random offline

    @property
    def order(self) -> str:
        """How the epoch's samples become batches (backends.train.data)."""
        return self.batch_order or (GROUPED if self.online else RANDOM)

    def validate(self) -> None:
        positive = {
            "--ttt": self.ttt,
            "--batch-size": self.batch_size,
            "--grad-accum": self.grad_accum,
            "--log-every": self.log_every,
            "--epochs": self.epochs,
            "--draft-vocab-size": self.draft_vocab_size,
            "--plateau-evals": self.plateau_evals,
        }
        if self.steps is not None:
            positive["--steps"] = self.steps
        if self.max_length is not None:
            positive["--max-length"] = self.max_length
        if self.pad_multiple is not None:
            positive["--pad-multiple"] = self.pad_multiple
        if self.threads is not None:
            positive["--threads"] = self.threads
        if self.limit is not None:
            positive["--limit"] = self.limit
        for flag, value in positive.items():
            if value < 1:
                raise TrainError(f"{flag} must be at least 1, not {value}")
        for flag, value in {"--eval-every": self.eval_every, "--save-every": self.save_every}.items():
            if value < 0:
                raise TrainError(f"{flag} must be 0 (only at the end) or positive, not {value}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainError(f"--lr must be a positive number, not {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise TrainError(f"--warmup-ratio must be in [0, 1), not {self.warmup_ratio}")
        if self.val_samples is not None and self.val_samples < 0:
            raise TrainError(f"--val-samples must be 0 or more, not {self.val_samples}")
        online_only = {"--layers": self.layers, "--chat-template": self.chat_template, "--limit": self.limit}
        given = [flag for flag, value in online_only.items() if value is not None]
        if given and not self.online:
            raise TrainError(f"{', '.join(given)} go with --online (offline, the extraction chose them)")
        if self.batch_order == GROUPED and not self.online:
            raise TrainError(
                "--batch-order grouped goes with --online (offline, a batch's samples come from the shard being read)"
            )
        if self.out.exists() and not self.out.is_dir():
            raise TrainError(f"--out {self.out} exists and is not a folder")
