"""CLI: `python -m backends.train --data EXTRACT_DIR --target DIR --out DIR [options]`.

Multi-GPU: `torchrun --nproc-per-node N -m backends.train ...` (DDP; FSDP when
the draft is large or with --fsdp on). Exit codes: 0 done, 1 the run failed
(non-finite loss, out of memory), 2 bad arguments or inputs (missing files,
data that disagrees with the target or the draft config). Expected failures
are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from backends.eagle3_contract import DEFAULT_DRAFT_VOCAB, ContractError
from backends.train.errors import TrainError
from backends.train.loop import run_training
from backends.train.options import TrainOptions


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> TrainOptions:
    p = _Parser(
        prog="python -m backends.train",
        description="Train an EAGLE-3 draft on extracted hidden states.",
        epilog="Several GPUs: torchrun --nproc-per-node N -m backends.train ... (DDP; FSDP for large drafts).",
    )
    p.add_argument("--data", type=Path, required=True, help="extraction folder (manifest.json + shards)")
    p.add_argument("--target", type=Path, required=True, help="the target model folder the data came from")
    p.add_argument("--out", type=Path, required=True, help="checkpoints go to OUT/step-N/ and OUT/final/")
    p.add_argument("--steps", type=int, help="optimizer steps (default: --epochs over the training split)")
    p.add_argument("--epochs", type=int, default=1, help="epochs when --steps is not given (default 1)")
    p.add_argument("--ttt", type=int, default=7, help="training-time-test positions to unroll (default 7)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default 1e-4)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per process per step (default 4)")
    p.add_argument("--log-every", type=int, default=10, help="steps between metric rows (default 10)")
    p.add_argument("--eval-every", type=int, default=200, help="steps between evaluations; 0: at the end only")
    p.add_argument("--save-every", type=int, default=1000, help="steps between checkpoints; 0: final only")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT")
    p.add_argument("--warmup-ratio", type=float, default=0.015, help="warmup share of the steps (default 0.015)")
    p.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm (default 0.5)")
    p.add_argument("--draft-vocab-size", type=int, default=DEFAULT_DRAFT_VOCAB, help="default 32000")
    p.add_argument("--val-samples", type=int, help="held-out samples (default 5%%, 1..1000); 0: no evaluation")
    p.add_argument("--max-length", type=int, help="truncate samples to this many tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the draft and the loss (default: on GPU)",
    )
    p.add_argument("--pad-multiple", type=int, help="pad batch lengths to a multiple of this (default: GPU 128)")
    p.add_argument("--attention", choices=("auto", "eager", "flex"), default="auto", help="auto: flex on GPU")
    p.add_argument("--fsdp", choices=("auto", "on", "off"), default="auto", help="auto: FSDP for drafts > 2B params")
    p.add_argument("--draft-config", type=Path, help="a SGLang/SpecForge draft config.json to train")
    p.add_argument("--plateau-evals", type=int, default=5, help="evaluations without a 0.5%% gain that flag a plateau")
    args = p.parse_args(argv)
    return TrainOptions(**vars(args))


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        run_training(options)
    except (TrainError, ContractError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code if isinstance(exc, TrainError) else 2
    except KeyboardInterrupt:
        print("error: interrupted; continue with --resume from the last checkpoint", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
